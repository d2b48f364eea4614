// Ring installation, removal, tombstones and their expiry, at the RingTable
// level (the engine's tests drive the same through packets).
#include "engine/ring_state.h"

#include <catch2/catch.hpp>
#include <vector>

#include "engine/box_harness.h"

using namespace netreduce;
using namespace netreduce::engine;
using namespace netreduce::engine::detail;
using netreduce::testing::rank_ip;
using netreduce::testing::ring_spec;

namespace {

// Binds rank r of the ring in slot `at` to connection key k, as a first packet does.
void bind(RingTable& t, Clt& clt, int at, unsigned r, const ConnKey& k) {
  Clt::Slot* s = clt.insert(k);
  REQUIRE(s);
  s->owner = static_cast<uint32_t>(at);
  s->rank = static_cast<uint8_t>(r);
  t.at(static_cast<uint32_t>(at)).conns[r].key = k;
  t.at(static_cast<uint32_t>(at)).conns[r].bound = true;
}

}  // namespace

TEST_CASE("a tombstone keeps connections and links retired until it expires", "[ring_state]") {
  EngineConfig cfg;
  cfg.retire_grace = 100;
  RingTable t(cfg);
  Clt clt(64);
  ReasonCounters counters{};
  REQUIRE(t.install(ring_spec(1, 3)).ok());
  const int at = t.find(1);
  REQUIRE(at >= 0);
  CHECK(t.link(rank_ip(0), rank_ip(1))->live == 1);
  CHECK(t.link(rank_ip(2), rank_ip(0))->live == 1);
  CHECK(t.link(rank_ip(1), rank_ip(0)) == nullptr);  // not a ring direction
  for (unsigned r = 0; r < 3; ++r) bind(t, clt, at, r, {rank_ip(r), rank_ip((r + 1) % 3), 7 + r});

  std::vector<Pkt> released;
  REQUIRE(t.remove(1, 1000, clt, released, counters).ok());
  CHECK(t.find(1) < 0);
  CHECK(t.count() == 0);
  CHECK(t.memory() == 0);
  CHECK(t.retired_count() == 1);
  CHECK(clt.find({rank_ip(0), rank_ip(1), 7})->retired());
  CHECK(t.link(rank_ip(0), rank_ip(1))->live == 0);
  CHECK(t.link(rank_ip(0), rank_ip(1))->retired == 1);
  const auto rr = t.retired_rings(clt);
  REQUIRE(rr.size() == 1);
  CHECK(rr[0].expires == 1100);
  CHECK(rr[0].connections == 3);

  // A live ring re-binds one of the keys: the tombstone must not purge it.
  REQUIRE(t.install(ring_spec(2, 3)).ok());
  const int at2 = t.find(2);
  clt.erase({rank_ip(1), rank_ip(2), 8});
  bind(t, clt, at2, 1, {rank_ip(1), rank_ip(2), 8});

  CHECK(t.expire(1099, clt) == 0);  // not yet
  CHECK(clt.find({rank_ip(0), rank_ip(1), 7}) != nullptr);
  CHECK(t.expire(1100, clt) == 1);
  CHECK(t.retired_count() == 0);
  CHECK(clt.find({rank_ip(0), rank_ip(1), 7}) == nullptr);
  CHECK(clt.find({rank_ip(2), rank_ip(0), 9}) == nullptr);
  CHECK(clt.find({rank_ip(1), rank_ip(2), 8})->ina());  // ring 2's
  // Ring 2 uses the same links: they stay, live.
  CHECK(t.link(rank_ip(0), rank_ip(1))->live == 1);
  CHECK(t.link(rank_ip(0), rank_ip(1))->retired == 0);
  REQUIRE(t.remove(2, 2000, clt, released, counters).ok());
  CHECK(t.expire(2100, clt) == 1);
  CHECK(t.link(rank_ip(0), rank_ip(1)) == nullptr);  // no ring uses it: forgotten
  CHECK(clt.size() == 0);
}

TEST_CASE("kRetireNever tombstones never expire; ids, memory and the link table bound",
          "[ring_state]") {
  EngineConfig cfg;
  cfg.link_capacity = 2 * kMaxRanks;
  RingTable t(cfg);
  Clt clt(16);
  ReasonCounters counters{};
  REQUIRE(t.install(ring_spec(5, 2)).ok());
  REQUIRE(t.install(ring_spec(3, 2, 4, 2, 256, 10)).ok());
  CHECK(t.ids() == std::vector<uint32_t>{3, 5});
  CHECK(t.memory() == 2 * ring_memory_bytes(ring_spec(5, 2), cfg.mode));
  std::vector<Pkt> released;
  REQUIRE(t.remove(5, 10, clt, released, counters).ok());
  CHECK(t.expire(UINT64_MAX - 1, clt) == 0);
  CHECK(t.retired_count() == 1);
  CHECK(t.link(rank_ip(0), rank_ip(1))->retired == 1);
  // 4 links in use of 128: a ring of 64 ranks on new addresses needs 64 more, two do not fit.
  REQUIRE(t.install(ring_spec(6, kMaxRanks, 4, 2, 256, 100)).ok());
  const Status s = t.install(ring_spec(7, kMaxRanks, 4, 2, 256, 200));
  CHECK(s.code() == StatusCode::resource_exhausted);
  CHECK(s.field() == "members");
  CHECK(t.find(7) < 0);
}
