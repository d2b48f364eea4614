// Ring placement (dataplane/placement.h) without DPDK: which worker takes a
// ring, which rings are refused and why, what the published link table says,
// and how retirement keeps links until their time. The cases the pcap test
// drives through the binary (two rings on two workers, a ring sharing links
// with both, the stripes of one job, a ring installed again while it
// retires) run here on the class itself, with every outcome derived from
// the rules in placement.h, never read back from the code.
#include "dataplane/placement.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <string>
#include <vector>

using namespace netreduce;
using namespace netreduce::dataplane;

namespace {

using Clock = Placement::Clock;

uint32_t ip(unsigned host) { return 0x0A000000u | host; }  // 10.0.0.host

engine::RingSpec ring(uint32_t id, std::vector<unsigned> hosts, std::vector<uint32_t> qpns = {}) {
  engine::RingSpec s;
  s.ring_id = id;
  for (unsigned h : hosts) s.members.push_back(ip(h));
  s.msg_len = 4;
  s.window = 2;
  s.payload_bytes = 256;
  s.qpns = std::move(qpns);
  return s;
}

// Places and adds: the worker it went to (the test fails on a refusal).
unsigned install(Placement& pl, const engine::RingSpec& spec,
                 const std::optional<engine::TreeSpec>& tree = std::nullopt) {
  unsigned owner = 99;
  const Status s = pl.place(spec, tree, owner);
  INFO(s.message());
  REQUIRE(s.ok());
  pl.add({spec, tree, owner});
  return owner;
}

Status refusal(const Placement& pl, const engine::RingSpec& spec,
               const std::optional<engine::TreeSpec>& tree = std::nullopt) {
  unsigned owner = 99;
  const Status s = pl.place(spec, tree, owner);
  CHECK(owner == 99);  // a refusal names no worker
  return s;
}

uint16_t owner_of_link(const LinkTable& t, unsigned src, unsigned dst) {
  const auto it = t.owner.find(LinkTable::key(ip(src), ip(dst)));
  REQUIRE(it != t.owner.end());
  return it->second;
}

// A tree node over ranks `local` of `spec` with one child box, self address
// `self`.
engine::TreeSpec tree_node(std::vector<uint16_t> local, uint32_t self) {
  engine::TreeSpec t;
  t.self.ip = self;
  for (uint16_t r : local) t.children.push_back(engine::TreeSpec::rank(r));
  t.children.push_back(engine::TreeSpec::box(0));
  t.boxes.push_back({0x0B000001u, {}, 0});
  return t;
}

}  // namespace

TEST_CASE("a ring goes to the worker owning its links, or the least loaded") {
  Placement pl(2);
  const unsigned w1 = install(pl, ring(1, {1, 2, 3}));
  const unsigned w2 = install(pl, ring(2, {4, 5}));
  CHECK(w1 == 0);  // both idle: the lowest index
  CHECK(w2 == 1);  // worker 0 has a ring
  // Ring 4 shares 1->2 with ring 1 only: ring 1's worker, whatever the load.
  CHECK(install(pl, ring(4, {1, 2, 9})) == w1);
  // Ring 5 shares nothing: the least loaded worker (1 ring against 2).
  CHECK(install(pl, ring(5, {6, 7})) == w2);
  const auto t = pl.link_table();
  CHECK(owner_of_link(*t, 1, 2) == w1);
  CHECK(owner_of_link(*t, 3, 1) == w1);
  CHECK(owner_of_link(*t, 5, 4) == w2);
  CHECK(t->owner.size() == 3 + 2 + 2 /* 1->2 is shared */ + 2);
  CHECK(t->conn_owner.empty());
  CHECK(pl.in_use() == "installed: 1, 2, 4, 5");
}

TEST_CASE("a ring sharing links with rings on two workers is refused, naming them") {
  Placement pl(2);
  install(pl, ring(1, {1, 2, 3}));
  install(pl, ring(2, {4, 5}));
  const Status s = refusal(pl, ring(3, {1, 2, 4, 5}));
  CHECK(s.code() == StatusCode::conflict);
  CHECK(s.field() == "members");
  CHECK_THAT(s.message(), Catch::Contains("ring 1 on worker 0") &&
                              Catch::Contains("ring 2 on worker 1") && Catch::Contains("\"qpns\""));
  // Both rings keep their links.
  const auto t = pl.link_table();
  CHECK(owner_of_link(*t, 1, 2) == 0);
  CHECK(owner_of_link(*t, 4, 5) == 1);
}

TEST_CASE("a retiring ring keeps its links until its time, then lets them go") {
  Placement pl(2);
  const auto t0 = Clock::now();
  install(pl, ring(1, {1, 2, 3}));
  install(pl, ring(2, {4, 5}));
  CHECK(install(pl, ring(4, {1, 2, 9})) == 0);
  pl.retire(4, t0 + std::chrono::seconds(10));
  CHECK(pl.installed(4) == nullptr);
  REQUIRE(pl.retiring().size() == 1);
  CHECK(pl.in_use() == "installed: 1, 2; retiring: 4");
  // Still counted: 2->9 and 9->1 point at worker 0 for its late packets,
  // and a ring over 4, 5, 2, 9 would join two workers' links.
  CHECK(owner_of_link(*pl.link_table(), 2, 9) == 0);
  CHECK(refusal(pl, ring(6, {4, 5, 2, 9})).code() == StatusCode::conflict);
  CHECK(pl.expire(t0 + std::chrono::seconds(9)).empty());
  const auto gone = pl.expire(t0 + std::chrono::seconds(10));
  REQUIRE(gone.size() == 1);
  CHECK(gone[0].spec.ring_id == 4);
  CHECK(pl.retiring().empty());
  const auto t = pl.link_table();
  CHECK(t->owner.count(LinkTable::key(ip(2), ip(9))) == 0);
  CHECK(owner_of_link(*t, 1, 2) == 0);  // ring 1's link stays where it was
  CHECK(pl.in_use() == "installed: 1, 2");
}

TEST_CASE("retiring rings count in the load") {
  Placement pl(2);
  install(pl, ring(1, {1, 2}));
  pl.retire(1, Clock::now() + std::chrono::hours(1));
  CHECK(install(pl, ring(2, {3, 4})) == 1);
  CHECK(pl.empty() == false);
}

TEST_CASE("the stripes of one job spread over workers and split their links") {
  Placement pl(2);
  const unsigned a = install(pl, ring(41, {1, 2, 3}, {0x100, 0x101, 0x102}));
  const unsigned b = install(pl, ring(42, {1, 2, 3}, {0x200, 0x201, 0x202}));
  CHECK(a == 0);
  CHECK(b == 1);
  const auto t = pl.link_table();
  // Split: flagged, with the lowest worker as home.
  CHECK(owner_of_link(*t, 1, 2) == (LinkTable::kSplitBit | 0));
  // Each receiving connection (the successor's address and QP) names its ring's worker.
  CHECK(t->conn_owner.at(LinkTable::conn_key(ip(2), 0x101)) == 0);
  CHECK(t->conn_owner.at(LinkTable::conn_key(ip(1), 0x200)) == 1);
  CHECK(t->conn_owner.size() == 6);

  SECTION("a ring over those members without qpns is refused") {
    const Status s = refusal(pl, ring(43, {1, 2, 3}));
    CHECK(s.code() == StatusCode::conflict);
    CHECK(s.field() == "members");
    CHECK_THAT(s.message(), Catch::Contains("\"qpns\""));
  }
  SECTION("a ring reusing an installed ring's connection is refused on qpns") {
    const Status s = refusal(pl, ring(43, {1, 2, 3}, {0x300, 0x101, 0x302}));
    CHECK(s.code() == StatusCode::conflict);
    CHECK(s.field() == "qpns");
    CHECK_THAT(s.message(), Catch::Contains("ring 41 uses"));
  }
  SECTION("on equal load, a stripe prefers a worker without rings sharing its links") {
    Placement two(2);
    CHECK(install(two, ring(41, {1, 2, 3}, {0x100, 0x101, 0x102})) == 0);
    CHECK(install(two, ring(9, {7, 8})) == 1);  // 1 : 1
    CHECK(install(two, ring(42, {1, 2, 3}, {0x200, 0x201, 0x202})) == 1);
  }
}

TEST_CASE("a ring installed again while it retires joins its tombstone's worker") {
  Placement pl(2);
  const auto until = Clock::now() + std::chrono::hours(1);
  install(pl, ring(41, {1, 2, 3}, {0x100, 0x101, 0x102}));
  const unsigned b = install(pl, ring(42, {1, 2, 3}, {0x200, 0x201, 0x202}));
  REQUIRE(b == 1);
  pl.retire(42, until);
  // By load and sharing alone it is a tie, which worker 0 would win.
  CHECK(install(pl, ring(42, {1, 2, 3}, {0x200, 0x201, 0x202})) == b);

  // A new id reusing a retiring ring's connection joins that ring's worker,
  // although the load says worker 1.
  pl.retire(41, until);
  CHECK(install(pl, ring(50, {60, 61})) == 0);  // 1 : 2 rings
  CHECK(install(pl, ring(51, {62, 63})) == 0);  // 2 : 2, the tie to worker 0
  CHECK(install(pl, ring(44, {1, 2, 3}, {0x100, 0x401, 0x402})) == 0);  // 3 : 2
}

TEST_CASE("a connection still counted on another worker is refused") {
  Placement pl(2);
  // Ring 7 gives qpns; its connection (10.0.0.1, QP 0x10) stays counted on
  // worker 0 while it retires.
  CHECK(install(pl, ring(7, {1, 2}, {0x10, 0x11})) == 0);
  CHECK(install(pl, ring(8, {5, 6})) == 1);
  pl.retire(7, Clock::now() + std::chrono::hours(1));
  // Ring 9 shares 5->6 with ring 8, which gives no qpns: no spreading, so
  // ring 8's worker; but it reuses ring 7's connection, counted on worker 0.
  const Status s = refusal(pl, ring(9, {5, 6, 1}, {0x50, 0x60, 0x10}));
  CHECK(s.code() == StatusCode::conflict);
  CHECK(s.field() == "qpns");
  CHECK_THAT(s.message(), Catch::Contains("still in use by a ring on worker 0"));
}

TEST_CASE("tree nodes own their local ranks' links and steer their tree id") {
  Placement pl(2);
  install(pl, ring(1, {30, 31}));  // worker 0
  const engine::RingSpec spec = ring(7, {1, 2, 3, 4});
  const engine::TreeSpec node = tree_node({0, 1}, 0x0B000002u);
  const unsigned w = install(pl, spec, node);
  CHECK(w == 1);
  const auto t = pl.link_table();
  CHECK(owner_of_link(*t, 1, 2) == 1);
  CHECK(owner_of_link(*t, 2, 3) == 1);
  CHECK(t->owner.count(LinkTable::key(ip(3), ip(4))) == 0);  // not a local rank's
  CHECK(t->tree_owner.at(7) == 1);
  CHECK(t->box_ips == std::vector<uint32_t>{0x0B000002u});

  SECTION("a tree without local ranks goes where its retiring namesake is") {
    pl.retire(7, Clock::now() + std::chrono::hours(1));
    CHECK(install(pl, ring(2, {32, 33})) == 0);  // 1 : 1, the tie to worker 0
    CHECK(install(pl, ring(3, {34, 35})) == 1);  // 2 : 1
    // Now 2 : 2, a tie the load would give worker 0.
    engine::TreeSpec spine;
    spine.self.ip = 0x0B000003u;
    spine.children = {engine::TreeSpec::box(0), engine::TreeSpec::box(1)};
    spine.boxes = {{0x0B000001u, {}, 0}, {0x0B000002u, {}, 0}};
    CHECK(install(pl, spec, spine) == 1);
    const auto t2 = pl.link_table();
    CHECK(t2->box_ips == std::vector<uint32_t>{0x0B000002u, 0x0B000003u});
  }
}
