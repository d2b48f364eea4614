// The order of the ring (ring_order.h): racks together, a pinned order,
// rank 0 first; and a communicator whose ring is out of rank order keeps
// every rank's semantics (its rank, a broadcast's root, each rank's part of
// an all-gather and its shard of a reduce-scatter) while the box and the
// ring reduce in ring order. Expected rings come from counting rack
// crossings and from the definitions; expected data from the fixture's
// references over the inputs put in ring order.
#include "host-lib/ring_order.h"

#include <cstring>
#include <string>

#include "fixture.h"
#include "host-lib/cost_model.h"
#include "host-lib/job.h"

using namespace netreduce;
using namespace netreduce::host;
using namespace netreduce::host::testing;

namespace {

std::vector<LocalityClaim> one_per_host(const std::vector<std::string>& racks,
                                        const std::string& pin = "") {
  std::vector<LocalityClaim> all;
  for (size_t r = 0; r < racks.size(); ++r)
    all.push_back({"host" + std::to_string(r), -1, 1, racks[r], r == 0 ? pin : "ignored"});
  return all;
}

std::vector<unsigned> ring_of(const std::vector<LocalityClaim>& all) {
  Locality loc;
  const Error e = resolve_locality(all, 0, loc);
  INFO(e.message);
  REQUIRE(e.ok());
  return loc.ring;
}

// Rack boundaries the ring crosses (the way back from the last to the first included).
unsigned crossings(const std::vector<unsigned>& ring, const std::vector<std::string>& racks) {
  unsigned n = 0;
  for (size_t i = 0; i < ring.size(); ++i)
    n += racks[ring[i]] != racks[ring[(i + 1) % ring.size()]] ? 1 : 0;
  return n;
}

}  // namespace

TEST_CASE("ring order: each rack's ranks together, racks by their lowest rank",
          "[hostlib][ring-order]") {
  const std::vector<std::string> racks = {"a", "b", "a", "b", "c", "a", "c"};
  const auto ring = ring_of(one_per_host(racks));
  REQUIRE(ring == std::vector<unsigned>{0, 2, 5, 1, 3, 4, 6});
  REQUIRE(crossings(ring, racks) == 3);  // the fewest for 3 racks
  REQUIRE(crossings({0, 1, 2, 3, 4, 5, 6}, racks) == 7);
  // Every rank's place is its host index; rank order is off.
  for (unsigned r = 0; r < racks.size(); ++r) {
    Locality loc;
    REQUIRE(resolve_locality(one_per_host(racks), r, loc).ok());
    REQUIRE(loc.ring[loc.host] == r);
    REQUIRE_FALSE(loc.rank_order);
  }
  // No racks, or one: rank order, the plain communicator.
  Locality loc;
  REQUIRE(resolve_locality(one_per_host({"", "", ""}), 1, loc).ok());
  REQUIRE((loc.rank_order && loc.ring == std::vector<unsigned>{0, 1, 2}));
  REQUIRE(resolve_locality(one_per_host({"x", "x", "x"}), 1, loc).ok());
  REQUIRE(loc.rank_order);
  // Local ranks: hosts a, b, c (ranks 0+3, 1+4, 2+5) in racks x, y, x.
  std::vector<LocalityClaim> local;
  for (unsigned r = 0; r < 6; ++r)
    local.push_back({std::string(1, "abc"[r % 3]), -1, -1, r % 3 == 1 ? "y" : "x", ""});
  REQUIRE(resolve_locality(local, 4, loc).ok());
  REQUIRE(loc.rings == std::vector<std::vector<unsigned>>{{0, 2, 1}, {3, 5, 4}});
  REQUIRE((loc.host == 2 && loc.local_rank == 1));
}

TEST_CASE("ring order: rank 0's pinned order, rotated to start at rank 0",
          "[hostlib][ring-order]") {
  REQUIRE(ring_of(one_per_host({"a", "b", "a", "b"}, "3,1,0,2")) ==
          std::vector<unsigned>{0, 2, 3, 1});
  REQUIRE(ring_of(one_per_host({"", "", "", ""}, "0,1,2,3")) == std::vector<unsigned>{0, 1, 2, 3});
  for (const char* bad :
       {"0,1,2", "0,1,1,2", "0,1,2,x", "0,1,2,3,", "0,1,2,4", " 0,1,2,3", "0,,1,2,3", "-1,0,1,2"}) {
    INFO(bad);
    Locality loc;
    const Error e = resolve_locality(one_per_host({"", "", "", ""}, bad), 0, loc);
    REQUIRE(e.code == ErrorCode::invalid_argument);
    REQUIRE(e.message ==
            std::string("ring_order: '") + bad + "' is not every rank 0..3 once, comma-separated");
  }
  // The claims carry both labels through the bootstrap, spaces and all.
  LocalityClaim c{"boot id/host", 1, 2, "rack 7", "0,1"}, back;
  REQUIRE(decode_claim(encode_claim(c), 3, back).ok());
  REQUIRE((back.host_id == c.host_id && back.rack == c.rack && back.ring_order == c.ring_order &&
           back.local_rank == 1 && back.local_size == 2));
}

TEST_CASE("ring order: a communicator out of rank order keeps each rank's semantics",
          "[hostlib][ring-order]") {
  std::mt19937_64 rng(71);
  constexpr unsigned P = 4;
  const std::vector<unsigned> ring = {0, 2, 1, 3};  // place -> rank
  Options o;
  o.ring_order = "0,2,1,3";
  o.window = 2;
  for (bool box : {true, false}) {
    INFO((box ? "box" : "ring path"));
    Job job(box ? box_fabric(P, 2, 2, 256) : ring_fabric(P, 1u << 20), o);
    for (unsigned p = 0; p < P; ++p) {
      REQUIRE(job.comms[ring[p]]->rank() == static_cast<int>(ring[p]));
      REQUIRE(job.comms[ring[p]]->host() == static_cast<int>(p));
      REQUIRE(job.comms[ring[p]]->world() == static_cast<int>(P));
    }
    // All-reduce: the box's order, or the ring's, over the ring's places.
    for (DataType t : {DataType::fp32, DataType::bf16}) {
      const size_t count = 777;
      std::vector<std::vector<uint8_t>> in, placed, out;
      for (unsigned r = 0; r < P; ++r) in.push_back(make_input(rng, t, count, false));
      for (unsigned p = 0; p < P; ++p) placed.push_back(in[ring[p]]);
      const auto want = box ? rank_order_reference(placed, t, Op::sum)
                            : ring_order_reference(placed, t, Op::sum, SIZE_MAX);
      require_ok(job.run(in, out, count, t, Op::sum));
      for (unsigned r = 0; r < P; ++r) REQUIRE(out[r] == want);
    }
    // Broadcast from rank 2, all-gather by rank, reduce-scatter shards by rank.
    const size_t n = 301;
    std::vector<std::vector<uint8_t>> buf(P), mine(P), all(P, std::vector<uint8_t>(P * n * 4)),
        send(P), shard(P, std::vector<uint8_t>(n * 4));
    for (unsigned r = 0; r < P; ++r) {
      buf[r] = r == 2 ? make_input(rng, DataType::fp32, n, false) : std::vector<uint8_t>(n * 4);
      mine[r] = make_input(rng, DataType::int32, n, false);
      send[r] = make_input(rng, DataType::int32, P * n, true);
    }
    const auto root = buf[2];
    require_ok(job.run_all([&](unsigned r, Communicator& c, AllreduceHandle& h) {
      return c.broadcast_async(buf[r].data(), n, DataType::fp32, 2, h);
    }));
    require_ok(job.run_all([&](unsigned r, Communicator& c, AllreduceHandle& h) {
      return c.all_gather_async(mine[r].data(), all[r].data(), n, DataType::int32, h);
    }));
    require_ok(job.run_all([&](unsigned r, Communicator& c, AllreduceHandle& h) {
      return c.reduce_scatter_async(send[r].data(), shard[r].data(), n, DataType::int32, Op::sum,
                                    h);
    }));
    const auto sum = rank_order_reference(send, DataType::int32, Op::sum);
    for (unsigned r = 0; r < P; ++r) {
      INFO("rank " << r);
      REQUIRE(buf[r] == root);
      for (unsigned q = 0; q < P; ++q)
        REQUIRE(std::memcmp(all[r].data() + q * n * 4, mine[q].data(), n * 4) == 0);
      REQUIRE(std::memcmp(shard[r].data(), sum.data() + r * n * 4, n * 4) == 0);
    }
    // Out of rank order the classic ring forms are off: one all-reduce.
    if (!box) REQUIRE(job.comms[1]->last_call().steps == 2 * (P - 1));
  }
}

TEST_CASE("ring order: a bypassed box out of rank order fails over exactly",
          "[hostlib][ring-order]") {
  std::mt19937_64 rng(72);
  constexpr unsigned P = 4;
  std::atomic<bool> bypass{false};
  LoopbackConfig cfg = box_fabric(P, 2, 2, 256);
  cfg.recv_bytes += 1u << 20;
  cfg.bypass = [&](unsigned, unsigned, uint32_t, uint32_t) { return bypass.load(); };
  Options o;
  o.ring_order = "0,3,1,2";
  o.window = 2;
  Job job(cfg, o);
  std::vector<std::vector<uint8_t>> in, out;
  for (unsigned r = 0; r < P; ++r) in.push_back(make_input(rng, DataType::int64, 2000, true));
  require_ok(job.run(in, out, 2000, DataType::int64, Op::sum));
  bypass = true;
  require_ok(job.run(in, out, 2000, DataType::int64, Op::sum));
  const auto want = rank_order_reference(in, DataType::int64, Op::sum);
  for (unsigned r = 0; r < P; ++r) {
    REQUIRE(out[r] == want);
    REQUIRE(job.comms[r]->failovers() == 1);
    REQUIRE(job.comms[r]->path() == Path::ring);
    // Errors name the job's ranks: rank 0's predecessor on 0, 3, 1, 2 is 2.
    INFO(job.comms[r]->path_reason());
    REQUIRE(job.comms[r]->path_reason().find("the ranks' first error: rank 0: ") !=
            std::string::npos);
    REQUIRE(job.comms[r]->path_reason().find("from predecessor rank 2 ") != std::string::npos);
  }
}

// Out of rank order an all-gather on the ring is one all-reduce of world x
// its bytes (the classic form is off): the model prices that, so just past
// the classic form's crossover it keeps the box.
TEST_CASE("ring order: the model prices the all-gather it will run", "[hostlib][ring-order]") {
  std::mt19937_64 rng(73);
  constexpr unsigned P = 3;
  Options o;
  o.ring_order = "0,2,1";
  o.window = 2;
  o.path_choice = PathChoice::model;
  Job job(box_fabric(P, 2, 2, 256), o, true);
  const cost::Params p = model_params(*job.comms[0], 2, 256);
  const auto flip = cost::crossover(p, cost::Kind::all_gather, P);
  REQUIRE(flip.has_value());
  size_t n = *flip / 4 + 1;  // int32 elements per rank
  while (cost::estimate(p, cost::Kind::all_gather, P, n * 4).choice != Path::ring) ++n;
  REQUIRE(cost::estimate(p, cost::Kind::all_reduce, P, P * n * 4).choice == Path::ina);
  std::vector<std::vector<uint8_t>> mine(P), all(P, std::vector<uint8_t>(P * n * 4));
  for (auto& m : mine) m = make_input(rng, DataType::int32, n, false);
  require_ok(job.run_all([&](unsigned r, Communicator& c, AllreduceHandle& h) {
    return c.all_gather_async(mine[r].data(), all[r].data(), n, DataType::int32, h);
  }));
  for (unsigned r = 0; r < P; ++r) {
    REQUIRE(job.comms[r]->last_call().path == Path::ina);
    for (unsigned q = 0; q < P; ++q)
      REQUIRE(std::memcmp(all[r].data() + q * n * 4, mine[q].data(), n * 4) == 0);
  }
}
