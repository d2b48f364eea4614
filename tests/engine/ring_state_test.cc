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

// Engine::install_ring(spec) at the table level: prepare, then attach.
Status install(RingTable& t, const EngineConfig& cfg, const RingSpec& spec) {
  PreparedRing r;
  if (Status s = RingTable::prepare(cfg, spec, r); !s) return s;
  return t.install(r);
}

}  // namespace

TEST_CASE("a tombstone keeps connections and links retired until it expires", "[ring_state]") {
  EngineConfig cfg;
  cfg.retire_grace = 100;
  RingTable t(cfg);
  Clt clt(64);
  ReasonCounters counters{};
  REQUIRE(install(t, cfg, ring_spec(1, 3)).ok());
  const int at = t.find(1);
  REQUIRE(at >= 0);
  CHECK(t.link(rank_ip(0), rank_ip(1))->live == 1);
  CHECK(t.link(rank_ip(2), rank_ip(0))->live == 1);
  CHECK(t.link(rank_ip(1), rank_ip(0)) == nullptr);  // not a ring direction
  for (unsigned r = 0; r < 3; ++r) bind(t, clt, at, r, {rank_ip(r), rank_ip((r + 1) % 3), 7 + r});

  std::vector<Pkt> released;
  REQUIRE(t.remove(1, 1000, clt, released, counters, nullptr).ok());
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
  REQUIRE(install(t, cfg, ring_spec(2, 3)).ok());
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
  REQUIRE(t.remove(2, 2000, clt, released, counters, nullptr).ok());
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
  REQUIRE(install(t, cfg, ring_spec(5, 2)).ok());
  REQUIRE(install(t, cfg, ring_spec(3, 2, 4, 2, 256, 10)).ok());
  CHECK(t.ids() == std::vector<uint32_t>{3, 5});
  CHECK(t.memory() == 2 * ring_memory_bytes(ring_spec(5, 2), cfg.mode));
  std::vector<Pkt> released;
  REQUIRE(t.remove(5, 10, clt, released, counters, nullptr).ok());
  CHECK(t.expire(UINT64_MAX - 1, clt) == 0);
  CHECK(t.retired_count() == 1);
  CHECK(t.link(rank_ip(0), rank_ip(1))->retired == 1);
  // 4 links in use of 128: a ring of 64 ranks on new addresses needs 64 more, two do not fit.
  REQUIRE(install(t, cfg, ring_spec(6, kMaxRanks, 4, 2, 256, 100)).ok());
  const Status s = install(t, cfg, ring_spec(7, kMaxRanks, 4, 2, 256, 200));
  CHECK(s.code() == StatusCode::resource_exhausted);
  CHECK(s.field() == "members");
  CHECK(t.find(7) < 0);
}

TEST_CASE("a ring is built by prepare and only attached by install; remove detaches it whole",
          "[ring_state]") {
  EngineConfig cfg;
  cfg.retire_grace = 0;
  cfg.memory_budget = 3 * ring_memory_bytes(ring_spec(1, 4), cfg.mode) / 2;  // room for one
  RingTable t(cfg);
  Clt clt(64);
  ReasonCounters counters{};
  std::vector<Pkt> released;

  PreparedRing a;
  REQUIRE(RingTable::prepare(cfg, ring_spec(1, 4), a).ok());
  REQUIRE(a);
  const Cell* cells = a->cells.data();
  const uint8_t* result = a->result.data();
  CHECK(t.count() == 0);  // preparing touches no table
  CHECK(t.memory() == 0);
  REQUIRE(t.install(a).ok());
  CHECK_FALSE(a);  // taken
  const int at = t.find(1);
  REQUIRE(at >= 0);
  CHECK(t.at(static_cast<uint32_t>(at)).cells.data() == cells);  // the same memory, attached
  CHECK(t.at(static_cast<uint32_t>(at)).result.data() == result);
  CHECK(t.memory() == ring_memory_bytes(ring_spec(1, 4), cfg.mode));

  // The same spec again: ok, and the copy stays with the caller (freed there).
  PreparedRing again;
  REQUIRE(RingTable::prepare(cfg, ring_spec(1, 4), again).ok());
  CHECK(t.install(again).ok());
  CHECK(again);
  CHECK(t.count() == 1);

  // Refused (over the memory budget): left with the caller, nothing changed.
  PreparedRing b;
  REQUIRE(RingTable::prepare(cfg, ring_spec(2, 4), b).ok());
  const Status s = t.install(b);
  CHECK(s.code() == StatusCode::resource_exhausted);
  CHECK(s.field() == "memory");
  CHECK(b);
  CHECK(t.find(2) < 0);
  CHECK(t.link(b->spec.members[0], b->spec.members[1])->live == 1);  // ring 1 only

  // Invalid specs are refused by prepare, before any memory is built.
  PreparedRing bad;
  RingSpec one = ring_spec(3, 4);
  one.members.resize(1);
  CHECK(RingTable::prepare(cfg, one, bad).field() == "members");
  CHECK_FALSE(bad);

  // Remove hands the whole state back when asked.
  PreparedRing detached;
  REQUIRE(t.remove(1, 0, clt, released, counters, &detached).ok());
  REQUIRE(detached);
  CHECK(detached->cells.data() == cells);
  CHECK(detached->spec == ring_spec(1, 4));
  CHECK(t.find(1) < 0);
  CHECK(t.memory() == 0);
  // Its slot and memory are free: the refused ring fits now.
  CHECK(t.install(b).ok());
  CHECK(t.find(2) >= 0);
}

TEST_CASE("a ring's memory quota holds in the engine's own mode", "[ring_state]") {
  // At P = 2 accumulate mode needs more than deterministic (three payloads per
  // cell against one held packet): a quota that covers the deterministic need
  // passes the field checks but not an accumulate engine.
  RingSpec s = ring_spec(1, 2, 4, 4, 4096);
  const uint64_t det = ring_memory_bytes(s, ReduceMode::deterministic);
  const uint64_t acc = ring_memory_bytes(s, ReduceMode::accumulate);
  REQUIRE(acc > det);
  s.memory_quota = det;
  REQUIRE(validate(s).ok());
  EngineConfig cfg;
  cfg.mode = ReduceMode::accumulate;
  cfg.allocator.alloc = [](void*, uint16_t) { return Pkt{}; };
  PreparedRing r;
  const Status st = RingTable::prepare(cfg, s, r);
  CHECK(st.code() == StatusCode::resource_exhausted);
  CHECK(st.field() == "memory_quota");
  CHECK_FALSE(r);
  s.memory_quota = acc;
  CHECK(RingTable::prepare(cfg, s, r).ok());
  cfg.mode = ReduceMode::deterministic;
  s.memory_quota = det;
  CHECK(RingTable::prepare(cfg, s, r).ok());
}
