// Rina mode (rina.h) over loopback fabrics: a real engine as each rack's
// box, a ring fabric per lane. Expected results come from the stated order
// rule written out with the fixture's references (rank order inside a
// rack, the ring's order across the groups per lane), never from the code
// under test; the plans' facts from Rina's definition of groups.
#include "host-lib/rina.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <string>
#include <thread>

#include "fixture.h"
#include "host-lib/comm_impl.h"

using namespace netreduce;
using namespace netreduce::host;
using namespace netreduce::host::testing;

namespace {

constexpr uint16_t kMsgLen = 2, kWindow = 2, kPmtu = 256;

std::vector<RinaRack> racks_of(std::vector<std::pair<unsigned, bool>> spec) {
  std::vector<RinaRack> racks;
  unsigned next = 0;
  for (auto [m, box] : spec) {
    RinaRack r;
    r.box = box;
    for (unsigned i = 0; i < m; ++i) r.ranks.push_back(next++);
    racks.push_back(r);
  }
  return racks;
}

// Every rank's Rina over its communicators; bypass[g] sends group g's INA
// writes past its box (a bypassed box: its rack fails over).
struct RinaParts {
  RinaPlan plan;
  std::vector<std::unique_ptr<std::atomic<bool>>> bypass;
  std::vector<std::unique_ptr<LoopbackFabric>> fabrics;
  std::vector<std::unique_ptr<Communicator>> comms;
  std::vector<std::unique_ptr<Rina>> rina;
  std::vector<Communicator*> rack_comm;           // per rank, null for a rank alone
  std::vector<std::vector<Communicator*>> lanes;  // [rank][lane], null where it carries none
  Communicator* lane_comm(unsigned rank, unsigned lane) { return lanes[rank][lane]; }

  explicit RinaParts(const std::vector<RinaRack>& racks) {
    REQUIRE(make_rina_plan(racks, plan).ok());
    const unsigned P = plan.world, G = static_cast<unsigned>(plan.groups.size());
    rack_comm.assign(P, nullptr);
    lanes.assign(P, std::vector<Communicator*>(plan.lanes));
    Options o;
    o.path_choice = PathChoice::ina;
    o.window = kWindow;
    o.failback_calls = 2;
    for (unsigned g = 0; g < G; ++g) {
      bypass.push_back(std::make_unique<std::atomic<bool>>(false));
      const auto& members = plan.groups[g];
      if (members.size() < 2) continue;
      LoopbackConfig cfg =
          box_fabric(static_cast<unsigned>(members.size()), kMsgLen, kWindow, kPmtu);
      cfg.ring.ring_id = 100 + g;
      cfg.recv_bytes += 1u << 20;  // the rack's ring after a failover: one segment per call
      std::atomic<bool>* flag = bypass.back().get();
      cfg.bypass = [flag](unsigned, unsigned, uint32_t, uint32_t) { return flag->load(); };
      fabrics.push_back(std::make_unique<LoopbackFabric>(cfg));
      for (unsigned i = 0; i < members.size(); ++i) {
        comms.emplace_back();
        REQUIRE(make_loopback_communicator(*fabrics.back(), i, o, comms.back()).ok());
        rack_comm[members[i]] = comms.back().get();
      }
    }
    for (unsigned j = 0; j < plan.lanes && G > 1; ++j) {
      fabrics.push_back(std::make_unique<LoopbackFabric>(ring_fabric(G, 1u << 20)));
      for (unsigned g = 0; g < G; ++g) {
        comms.emplace_back();
        REQUIRE(make_loopback_communicator(*fabrics.back(), g, o, comms.back()).ok());
        lanes[plan.carrier(g, j)][j] = comms.back().get();
      }
    }
    rina.resize(P);
    for (unsigned r = 0; r < P; ++r) {
      INFO("rank " << r);
      const Error e = Rina::create(plan, r, rack_comm[r], lanes[r], rina[r]);
      INFO(e.message);
      REQUIRE(e.ok());
    }
  }
  ~RinaParts() {
    rina.clear();
    std::vector<std::thread> th;
    for (auto& c : comms) th.emplace_back([&c] { c.reset(); });
    for (auto& x : th) x.join();
  }
  // Every rank at once, each in its own thread.
  std::vector<Error> run(const std::vector<std::vector<uint8_t>>& in,
                         std::vector<std::vector<uint8_t>>& out, size_t count, DataType t, Op op) {
    const unsigned P = plan.world;
    out.assign(P, {});
    std::vector<Error> errs(P);
    std::vector<std::thread> th;
    for (unsigned r = 0; r < P; ++r) {
      out[r].assign(in[r].size(), 0xEE);
      th.emplace_back([&, r] {
        errs[r] = rina[r]->allreduce(in[r].data(), out[r].data(), count, t, op, 20000);
      });
    }
    for (auto& x : th) x.join();
    return errs;
  }
};

// The order rule written out: each group's value (its rack's sum in rank
// order, or in the ring's order for the groups in `ring_racks`; a rank
// alone: its input), then per lane the ring's order over the groups.
// A lane's two members make it unusable: a call of different counts (10
// elements against 20) fails on both.
void break_lane(Communicator* x, Communicator* y) {
  REQUIRE((x && y));
  std::vector<int32_t> a(20), b(20);
  AllreduceHandle hx, hy;
  REQUIRE(x->allreduce_async(a.data(), a.data(), 10, DataType::int32, Op::sum, hx, 2000).ok());
  REQUIRE(y->allreduce_async(b.data(), b.data(), 20, DataType::int32, Op::sum, hy, 2000).ok());
  REQUIRE_FALSE(hx.wait().ok());
  REQUIRE_FALSE(hy.wait().ok());
}

std::vector<uint8_t> reference(const RinaPlan& plan, const std::vector<std::vector<uint8_t>>& in,
                               DataType t, Op op, const std::vector<unsigned>& ring_racks = {}) {
  const size_t es = element_size(t), count = in[0].size() / es;
  std::vector<std::vector<uint8_t>> value;
  for (unsigned g = 0; g < plan.groups.size(); ++g) {
    std::vector<std::vector<uint8_t>> members;
    for (unsigned r : plan.groups[g]) members.push_back(in[r]);
    const bool ring = std::count(ring_racks.begin(), ring_racks.end(), g) > 0;
    value.push_back(members.size() == 1 ? members[0]
                    : ring              ? ring_order_reference(members, t, op, SIZE_MAX)
                                        : rank_order_reference(members, t, op));
  }
  std::vector<uint8_t> out(in[0].size());
  const size_t K = plan.lanes;
  for (size_t j = 0; j < K; ++j) {  // lane j: [j n/K + min(j, n%K), + n/K + (j < n%K))
    const size_t first = j * (count / K) + std::min(j, count % K);
    const size_t n = count / K + (j < count % K ? 1 : 0);
    if (n == 0) continue;
    std::vector<std::vector<uint8_t>> lane;
    for (const auto& v : value)
      lane.emplace_back(v.begin() + first * es, v.begin() + (first + n) * es);
    const auto r = ring_order_reference(lane, t, op, SIZE_MAX);
    std::memcpy(out.data() + first * es, r.data(), n * es);
  }
  return out;
}

std::vector<std::vector<uint8_t>> inputs(std::mt19937_64& rng, unsigned P, DataType t, size_t n,
                                         bool exact) {
  std::vector<std::vector<uint8_t>> in;
  for (unsigned r = 0; r < P; ++r) in.push_back(make_input(rng, t, n, exact));
  return in;
}

void require_equal(const std::vector<Error>& errs, const std::vector<std::vector<uint8_t>>& out,
                   const std::vector<uint8_t>& want) {
  require_ok(errs);
  for (size_t r = 0; r < out.size(); ++r) {
    INFO("rank " << r);
    REQUIRE(out[r] == want);
  }
}

}  // namespace

TEST_CASE("rina: plans follow the racks", "[hostlib][rina]") {
  RinaPlan p;
  REQUIRE(make_rina_plan(racks_of({{3, true}, {2, true}, {1, false}}), p).ok());
  REQUIRE(p.groups == std::vector<std::vector<unsigned>>{{0, 1, 2}, {3, 4}, {5}});
  REQUIRE((p.lanes == 3 && p.world == 6));
  // Lane j in group g: member j mod m_g.
  REQUIRE((p.carrier(1, 0) == 3 && p.carrier(1, 1) == 4 && p.carrier(1, 2) == 3));
  REQUIRE((p.carrier(2, 0) == 5 && p.carrier(2, 2) == 5 && p.carrier(0, 2) == 2));
  // A rack without a box, or with one rank, is that many groups of one.
  REQUIRE(make_rina_plan(racks_of({{2, false}, {1, true}}), p).ok());
  REQUIRE((p.groups.size() == 3 && p.lanes == 1));
  for (auto [racks, why] :
       {std::pair{std::vector<RinaRack>{}, "rina: no racks"},
        std::pair{std::vector<RinaRack>{{{0, 1}, true}, {{}, false}}, "rina: rack 1 has no ranks"},
        std::pair{std::vector<RinaRack>{{{0, 1}, true}, {{1}, false}},
                  "rina: rack 1: rank 1 is outside 0..2 or in two racks"},
        std::pair{std::vector<RinaRack>{{{0, 5}, true}},
                  "rina: rack 0: rank 5 is outside 0..1 or "
                  "in two racks"}}) {
    const Error e = make_rina_plan(racks, p);
    REQUIRE(e.code == ErrorCode::invalid_argument);
    REQUIRE(e.message == why);
  }
}

TEST_CASE("rina: every dtype x op, exact in the stated order", "[hostlib][rina]") {
  std::mt19937_64 rng(41);
  RinaParts job(racks_of({{3, true}, {2, true}, {1, false}}));
  for (DataType t : kTypes)
    for (Op op : kOps)
      for (size_t count :
           {size_t{0}, size_t{1}, size_t{2}, size_t{3}, size_t{7}, size_t{1000}, size_t{1537}}) {
        INFO(to_string(t) << " " << to_string(op) << " count " << count);
        const auto in = inputs(rng, job.plan.world, t, count, /*exact=*/false);
        std::vector<std::vector<uint8_t>> out;
        const auto errs = job.run(in, out, count, t, op);
        require_equal(errs, out, reference(job.plan, in, t, op));
      }
  for (unsigned r = 0; r < job.plan.world; ++r) REQUIRE(job.rina[r]->rack_path() == Path::ina);
}

TEST_CASE("rina: avg, in place, and layouts without a box or with one", "[hostlib][rina]") {
  std::mt19937_64 rng(42);
  for (auto spec : {std::vector<std::pair<unsigned, bool>>{{3, true}, {2, true}, {1, false}},
                    {{2, false}, {1, false}},
                    {{4, true}},
                    {{1, true}, {2, true}}}) {
    RinaParts job(racks_of(spec));
    const unsigned P = job.plan.world;
    INFO("ranks " << P << ", groups " << job.plan.groups.size());
    const size_t count = 301;
    auto in = inputs(rng, P, DataType::int32, count, /*exact=*/false);
    for (auto& v : in)  // keep sums of P values in range
      for (size_t i = 0; i < count; ++i) {
        int32_t x;
        std::memcpy(&x, v.data() + i * 4, 4);
        x /= 64;
        std::memcpy(v.data() + i * 4, &x, 4);
      }
    std::vector<std::vector<uint8_t>> out;
    require_equal(job.run(in, out, count, DataType::int32, Op::sum), out,
                  rank_order_reference(in, DataType::int32, Op::sum));
    // avg: the sum, each element divided by the world, truncated.
    const auto sum = rank_order_reference(in, DataType::int32, Op::sum);
    std::vector<uint8_t> want(sum.size());
    for (size_t i = 0; i < count; ++i) {
      int32_t s;
      std::memcpy(&s, sum.data() + i * 4, 4);
      s /= static_cast<int32_t>(P);
      std::memcpy(want.data() + i * 4, &s, 4);
    }
    require_equal(job.run(in, out, count, DataType::int32, Op::avg), out, want);
    // In place.
    auto buf = in;
    std::vector<Error> errs(P);
    std::vector<std::thread> th;
    for (unsigned r = 0; r < P; ++r)
      th.emplace_back([&, r] {
        errs[r] = job.rina[r]->allreduce(buf[r].data(), buf[r].data(), count, DataType::int32,
                                         Op::max, 20000);
      });
    for (auto& x : th) x.join();
    require_equal(errs, buf, rank_order_reference(in, DataType::int32, Op::max));
  }
}

TEST_CASE("rina: a rack's box lost: only that rack falls back, then rejoins", "[hostlib][rina]") {
  std::mt19937_64 rng(43);
  RinaParts job(racks_of({{3, true}, {2, true}, {1, false}}));
  const unsigned P = job.plan.world;
  std::vector<std::vector<uint8_t>> out;
  auto in = inputs(rng, P, DataType::fp32, 900, /*exact=*/false);
  INFO("call 1");
  require_equal(job.run(in, out, 900, DataType::fp32, Op::sum), out,
                reference(job.plan, in, DataType::fp32, Op::sum));
  // Rack 0's box bypassed: the call that meets it is finished on the rack's
  // ring (small integers: exact whichever messages the box had summed).
  job.bypass[0]->store(true);
  in = inputs(rng, P, DataType::fp32, 900, /*exact=*/true);
  INFO("call 2");
  require_equal(job.run(in, out, 900, DataType::fp32, Op::sum), out,
                rank_order_reference(in, DataType::fp32, Op::sum));
  for (unsigned r : job.plan.groups[0]) {
    REQUIRE(job.rina[r]->rack_path() == Path::ring);
    REQUIRE(job.rack_comm[r]->failovers() == 1);
  }
  for (unsigned r : job.plan.groups[1]) REQUIRE(job.rina[r]->rack_path() == Path::ina);
  // Then rack 0 sums in the ring's order, the others as before.
  in = inputs(rng, P, DataType::fp32, 900, /*exact=*/false);
  INFO("call 3");
  require_equal(job.run(in, out, 900, DataType::fp32, Op::sum), out,
                reference(job.plan, in, DataType::fp32, Op::sum, {0}));
  // The box back: after failback_calls calls of the rack, its box again.
  job.bypass[0]->store(false);
  for (int i = 0; i < 3; ++i) {
    in = inputs(rng, P, DataType::fp32, 900, /*exact=*/true);
    INFO("call 4");
    require_equal(job.run(in, out, 900, DataType::fp32, Op::sum), out,
                  rank_order_reference(in, DataType::fp32, Op::sum));
  }
  for (unsigned r : job.plan.groups[0]) REQUIRE(job.rina[r]->rack_path() == Path::ina);
  in = inputs(rng, P, DataType::fp32, 900, /*exact=*/false);
  INFO("call 5");
  require_equal(job.run(in, out, 900, DataType::fp32, Op::sum), out,
                reference(job.plan, in, DataType::fp32, Op::sum));
}

// A lane that fails on some members: every member of their racks returns
// an error at once (the spread counts the members whose lanes succeeded),
// none waits for the deadline. Lane 1 of racks [3+, 3+] is ranks 1 and 4;
// their lane communicators are made unusable first (a call of different
// counts). The default deadline is each stage's op_timeout_ms.
TEST_CASE("rina: a failed lane reaches its whole rack; the default deadline", "[hostlib][rina]") {
  std::mt19937_64 rng(44);
  RinaParts job(racks_of({{3, true}, {3, true}}));
  const unsigned P = job.plan.world;
  std::vector<std::vector<uint8_t>> out;
  auto in = inputs(rng, P, DataType::int32, 600, true);
  // timeout -1, one rank 100 ms late: waited for.
  std::vector<Error> errs(P);
  std::vector<std::thread> th;
  for (unsigned r = 0; r < P; ++r)
    th.emplace_back([&, r] {
      if (r == 3) std::this_thread::sleep_for(std::chrono::milliseconds(100));
      std::vector<uint8_t> o(in[r].size());
      errs[r] = job.rina[r]->allreduce(in[r].data(), o.data(), 600, DataType::int32, Op::sum);
    });
  for (auto& x : th) x.join();
  require_ok(errs);
  // Ranks 1 and 4 break their lane 1.
  break_lane(job.lane_comm(1, 1), job.lane_comm(4, 1));
  errs = job.run(in, out, 600, DataType::int32, Op::sum);
  for (unsigned r = 0; r < P; ++r) {
    INFO("rank " << r << ": " << errs[r].message);
    if (r == 1 || r == 4) {
      REQUIRE(errs[r].message.rfind("rina: lane 1 (a ring across 2 groups, its ranks the groups): ",
                                    0) == 0);
    } else {
      REQUIRE(errs[r].code == ErrorCode::transport);
      REQUIRE(errs[r].message ==
              "rina: spread: 1 of the rack's 3 members failed a lane (their errors name it)");
    }
  }
}

TEST_CASE("rina: communicators that do not fit the plan are refused", "[hostlib][rina]") {
  RinaParts job(racks_of({{2, true}, {1, false}}));
  std::unique_ptr<Rina> r;
  // Rank 2 is alone: no rack communicator; it carries lanes 0 and 1.
  Error e = Rina::create(job.plan, 2, job.rack_comm[0], {nullptr, nullptr}, r);
  REQUIRE(e.message ==
          "rina: rank 2: a rack communicator is given where none belongs (its group "
          "has 1 ranks)");
  e = Rina::create(job.plan, 0, nullptr, {nullptr, nullptr}, r);
  REQUIRE(e.message == "rina: rank 0: a rack communicator is missing (its group has 2 ranks)");
  e = Rina::create(job.plan, 1, job.rack_comm[0], {nullptr, nullptr}, r);
  REQUIRE(e.message == "rina: rank 1: the rack communicator is rank 0 of 2, expected 1 of 2");
  e = Rina::create(job.plan, 0, job.rack_comm[0], {nullptr}, r);
  REQUIRE(e.message == "rina: 1 lane communicators for 2 lanes");
  e = Rina::create(job.plan, 0, job.rack_comm[0], {nullptr, nullptr}, r);
  REQUIRE(e.message == "rina: rank 0: lane 0's communicator is missing");
  e = Rina::create(job.plan, 7, nullptr, {}, r);
  REQUIRE(e.message == "rina: rank 7 is outside 0..2");
  REQUIRE(e.code == ErrorCode::invalid_argument);
  // A bad call: its argument error, named.
  std::vector<uint8_t> b(8);
  e = job.rina[0]->allreduce(b.data(), b.data(), 2, static_cast<DataType>(9), Op::sum, 1000);
  REQUIRE(e.code == ErrorCode::invalid_argument);
  REQUIRE(e.message.rfind("rina: all-reduce: ", 0) == 0);
}

// A job's communicator in Rina mode records each call by what it ran: after
// a Rina all-reduce that failed, an all-gather in rank order is the classic
// ring form on the job's ring, recorded as such (not as the rack stage's
// path). The job ring is a loopback ring; the Rina is the fixture's.
TEST_CASE("rina: a call after a failed Rina call is recorded as what it ran", "[hostlib][rina]") {
  RinaParts parts(racks_of({{2, true}, {1, false}}));
  const unsigned P = parts.plan.world;
  Job job(ring_fabric(P, 1 << 16), Options{});
  for (unsigned r = 0; r < P; ++r) {
    auto rina = std::make_unique<host::RinaJob>();
    rina->plan = parts.plan;
    rina->rina = std::move(parts.rina[r]);
    job.comms[r]->impl().rina = std::move(rina);
  }
  // Lane 0's two carriers break it: the next Rina call fails on every rank.
  break_lane(parts.lane_comm(parts.plan.carrier(0, 0), 0),
             parts.lane_comm(parts.plan.carrier(1, 0), 0));
  std::vector<std::vector<uint8_t>> in(P, std::vector<uint8_t>(64, 1)), out;
  for (const Error& e : job.run(in, out, 16, DataType::int32, Op::sum)) REQUIRE_FALSE(e.ok());

  std::vector<std::vector<int32_t>> mine(P, std::vector<int32_t>(4)), all(P);
  for (unsigned r = 0; r < P; ++r) {
    std::fill(mine[r].begin(), mine[r].end(), static_cast<int32_t>(r + 1));
    all[r].assign(4 * P, -1);
  }
  require_ok(job.run_all([&](unsigned r, Communicator& c, AllreduceHandle& h) {
    return c.all_gather_async(mine[r].data(), all[r].data(), 4, DataType::int32, h);
  }));
  for (unsigned r = 0; r < P; ++r) {
    INFO("rank " << r);
    for (unsigned k = 0; k < 4 * P; ++k) CHECK(all[r][k] == static_cast<int32_t>(k / 4 + 1));
    const CallRecord rec = job.comms[r]->last_call();
    CHECK(rec.path == Path::ring);
    CHECK(rec.steps == P - 1);
    CHECK(job.comms[r]->calls(CallKind::all_gather, Path::ring) == 1);
  }
}
