// The path each call takes while the box is up (Options::path_choice):
// forced to either path, or the cost model's choice (cost_model.h), which
// flips where the model says; calls of both paths interleaved on one
// communicator keep every result exact and fail nothing over; each call is
// counted on the path it took. Expected results come from the definitions
// (all-gather: the ranks' bytes side by side; sums of small integers, exact
// in any order), the expected paths from the model's own estimate of each
// call (the model itself is tested against the papers in
// cost_model_test.cc).
#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>

#include "fixture.h"
#include "host-lib/comm_impl.h"
#include "host-lib/cost_model.h"
#include "host-lib/link_figures.h"

using namespace netreduce;
using namespace netreduce::host;
using namespace netreduce::host::testing;

namespace {

constexpr uint16_t kMsgLen = 2, kPmtu = 256, kWindow = 2;

Options with_choice(PathChoice c) {
  Options o;
  o.path_choice = c;
  o.window = kWindow;
  o.ring_buffer_bytes = 4096;  // several ring segments for the larger calls
  return o;
}

cost::Params params_of(const Communicator& c) { return model_params(c, kMsgLen, kPmtu); }

std::vector<std::vector<uint8_t>> inputs(std::mt19937_64& rng, unsigned P, DataType t,
                                         size_t count) {
  std::vector<std::vector<uint8_t>> in;
  for (unsigned r = 0; r < P; ++r) in.push_back(make_input(rng, t, count, /*exact=*/true));
  return in;
}

// One all-gather of `count` int32 per rank on every rank; checks the bytes.
void all_gather_checked(Job& job, std::mt19937_64& rng, size_t count) {
  const unsigned P = static_cast<unsigned>(job.comms.size());
  auto in = inputs(rng, P, DataType::int32, count);
  std::vector<std::vector<uint8_t>> out(P, std::vector<uint8_t>(P * count * 4, 0xEE));
  const auto errs = job.run_all([&](unsigned r, Communicator& c, AllreduceHandle& h) {
    return c.all_gather_async(in[r].data(), out[r].data(), count, DataType::int32, h);
  });
  for (unsigned r = 0; r < P; ++r) {
    INFO("rank " << r << ": " << errs[r].message);
    REQUIRE(errs[r].ok());
    for (unsigned q = 0; q < P; ++q)
      REQUIRE(std::memcmp(out[r].data() + q * count * 4, in[q].data(), count * 4) == 0);
  }
}

// One sum of `count` int32 on every rank; checks it against rank order.
void all_reduce_checked(Job& job, std::mt19937_64& rng, size_t count) {
  const unsigned P = static_cast<unsigned>(job.comms.size());
  auto in = inputs(rng, P, DataType::int32, count);
  std::vector<std::vector<uint8_t>> out;
  const auto errs = job.run(in, out, count, DataType::int32, Op::sum);
  const auto want = rank_order_reference(in, DataType::int32, Op::sum);
  for (unsigned r = 0; r < P; ++r) {
    INFO("rank " << r << ": " << errs[r].message);
    REQUIRE(errs[r].ok());
    REQUIRE(out[r] == want);
  }
}

// One reduce-scatter of `shard` int32 per rank; checks each rank's shard.
void reduce_scatter_checked(Job& job, std::mt19937_64& rng, size_t shard) {
  const unsigned P = static_cast<unsigned>(job.comms.size());
  auto in = inputs(rng, P, DataType::int32, P * shard);
  std::vector<std::vector<uint8_t>> out(P, std::vector<uint8_t>(shard * 4, 0xEE));
  const auto errs = job.run_all([&](unsigned r, Communicator& c, AllreduceHandle& h) {
    return c.reduce_scatter_async(in[r].data(), out[r].data(), shard, DataType::int32, Op::sum, h);
  });
  const auto want = rank_order_reference(in, DataType::int32, Op::sum);
  for (unsigned r = 0; r < P; ++r) {
    INFO("rank " << r << ": " << errs[r].message);
    REQUIRE(errs[r].ok());
    REQUIRE(std::memcmp(out[r].data(), want.data() + r * shard * 4, shard * 4) == 0);
  }
}

Path last_path(Job& job) {
  const Path p = job.comms[0]->last_call().path;
  for (auto& c : job.comms) REQUIRE(c->last_call().path == p);  // every rank alike
  return p;
}

}  // namespace

TEST_CASE("path choice: ina and ring force every call, each counted on its path",
          "[hostlib][path]") {
  std::mt19937_64 rng(11);
  for (PathChoice choice : {PathChoice::ina, PathChoice::ring}) {
    const Path want = choice == PathChoice::ina ? Path::ina : Path::ring;
    INFO("path_choice " << to_string(choice));
    Job job(box_fabric(3, kMsgLen, kWindow, kPmtu), with_choice(choice), true);
    all_reduce_checked(job, rng, 1000);
    REQUIRE(last_path(job) == want);
    all_gather_checked(job, rng, 700);
    REQUIRE(last_path(job) == want);
    reduce_scatter_checked(job, rng, 300);
    REQUIRE(last_path(job) == want);
    const auto errs = job.run_all(
        [](unsigned, Communicator& c, AllreduceHandle& h) { return c.barrier_async(h); });
    for (const Error& e : errs) REQUIRE(e.ok());
    REQUIRE(last_path(job) == want);
    const CallRecord rec = job.comms[1]->last_call();
    REQUIRE(rec.steps == (want == Path::ina ? 1u : 4u));  // 2(P - 1) for the ring's barrier
    const Path other = want == Path::ina ? Path::ring : Path::ina;
    for (auto& c : job.comms) {
      for (CallKind k : {CallKind::all_reduce, CallKind::all_gather, CallKind::reduce_scatter,
                         CallKind::barrier}) {
        REQUIRE(c->calls(k, want) == 1);
        REQUIRE(c->calls(k, other) == 0);
      }
      REQUIRE(c->calls(CallKind::broadcast, want) == 0);
      REQUIRE(c->failovers() == 0);
      REQUIRE(c->path() == Path::ina);  // the box stays the communicator's path
    }
  }
}

TEST_CASE("path choice: the model's choice flips at its crossover", "[hostlib][path]") {
  std::mt19937_64 rng(12);
  const unsigned P = 4;
  Job job(box_fabric(P, kMsgLen, kWindow, kPmtu), with_choice(PathChoice::model), true);
  const cost::Params p = params_of(*job.comms[0]);
  REQUIRE(!cost::check(p, P));
  // All-gather: the box's pass wins small calls (one step against P - 1),
  // the ring large ones (P - 1 parts sent against P).
  const auto flip = cost::crossover(p, cost::Kind::all_gather, P);
  REQUIRE(flip.has_value());
  const size_t below = (*flip - 1) / 4;  // int32 elements per rank
  size_t above = (*flip + 3) / 4;
  const Path small = cost::estimate(p, cost::Kind::all_gather, P, below * 4).choice;
  while (cost::estimate(p, cost::Kind::all_gather, P, above * 4).choice == small) ++above;
  REQUIRE(small == Path::ina);
  all_gather_checked(job, rng, below);
  REQUIRE(last_path(job) == Path::ina);
  all_gather_checked(job, rng, above);
  REQUIRE(last_path(job) == Path::ring);
  REQUIRE(job.comms[2]->last_call().steps == P - 1);
  // All-reduce: the box's pass for a small call; a large one the model
  // gives the ring here (a window of 2 messages stalls on every pair).
  all_reduce_checked(job, rng, 1);
  REQUIRE(last_path(job) == Path::ina);
  REQUIRE(cost::estimate(p, cost::Kind::all_reduce, P, 20000).choice == Path::ring);
  all_reduce_checked(job, rng, 5000);
  REQUIRE(last_path(job) == Path::ring);
  REQUIRE(job.comms[0]->last_call().steps == 2 * (P - 1));
}

// A barrier's own path choice in place of the communicator's: the box's
// single pass or the ring's 2(P - 1) steps, counted on that path; the calls
// around it keep the communicator's choice. A ring barrier waits for a rank
// that enters it late, where one through the box would hold the others'
// writes unanswered (the lab shows that side on real queue pairs).
TEST_CASE("path choice: a barrier's own choice, the late rank waited for", "[hostlib][path]") {
  std::mt19937_64 rng(12);
  constexpr unsigned P = 4;
  for (PathChoice comm_choice : {PathChoice::ina, PathChoice::ring}) {
    const PathChoice own = comm_choice == PathChoice::ina ? PathChoice::ring : PathChoice::ina;
    const Path want = own == PathChoice::ina ? Path::ina : Path::ring;
    INFO("communicator " << to_string(comm_choice) << ", barrier " << to_string(own));
    Job job(box_fabric(P, kMsgLen, kWindow, kPmtu), with_choice(comm_choice), true);
    all_reduce_checked(job, rng, 300);
    const Path comm_path = last_path(job);
    REQUIRE(comm_path != want);
    std::vector<AllreduceHandle> h(P);
    for (unsigned r = 0; r + 1 < P; ++r) REQUIRE(job.comms[r]->barrier_async(own, h[r]).ok());
    if (own == PathChoice::ring) {  // the last rank 200 ms late
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      for (unsigned r = 0; r + 1 < P; ++r) REQUIRE_FALSE(h[r].test());
    }
    REQUIRE(job.comms[P - 1]->barrier_async(own, h[P - 1]).ok());
    for (unsigned r = 0; r < P; ++r) {
      const Error e = h[r].wait();
      INFO("rank " << r << ": " << e.message);
      REQUIRE(e.ok());
      REQUIRE(h[r].record().path == want);
      REQUIRE(h[r].record().steps == (want == Path::ina ? 1u : 2 * (P - 1)));
    }
    all_reduce_checked(job, rng, 300);
    REQUIRE(last_path(job) == comm_path);
    for (auto& c : job.comms) {
      REQUIRE(c->calls(CallKind::barrier, want) == 1);
      REQUIRE(c->calls(CallKind::barrier, comm_path) == 0);
      REQUIRE(c->calls(CallKind::all_reduce, comm_path) == 2);
      REQUIRE(c->failovers() == 0);
    }
    // A choice that is none of the three: refused at the call, nothing queued.
    AllreduceHandle bad;
    const Error e = job.comms[0]->barrier_async(static_cast<PathChoice>(7), bad);
    REQUIRE(e.code == ErrorCode::invalid_argument);
    REQUIRE(e.message == "barrier: path_choice: 7 is not model (0), ina (1) or ring (2)");
  }
}

TEST_CASE("path choice: calls of both paths interleaved stay exact, nothing fails over",
          "[hostlib][path]") {
  std::mt19937_64 rng(13);
  for (unsigned P : {3u, 5u}) {
    INFO("P " << P);
    Job job(box_fabric(P, kMsgLen, kWindow, kPmtu), with_choice(PathChoice::model), true);
    const cost::Params p = params_of(*job.comms[0]);
    const auto flip = cost::crossover(p, cost::Kind::all_gather, P);
    REQUIRE(flip.has_value());
    size_t big = *flip / 4 + 64;
    while (cost::estimate(p, cost::Kind::all_gather, P, big * 4).choice != Path::ring) ++big;
    const size_t shard = big;
    REQUIRE(cost::estimate(p, cost::Kind::reduce_scatter, P, shard * 4).choice == Path::ring);
    constexpr int kRounds = 20;
    for (int i = 0; i < kRounds; ++i) {
      all_reduce_checked(job, rng, 1 + rng() % 600);  // the box
      all_gather_checked(job, rng, big);              // the ring, right after the box
      reduce_scatter_checked(job, rng, shard);        // the ring
      all_gather_checked(job, rng, 3);                // the box, right after the ring
    }
    for (auto& c : job.comms) {
      REQUIRE(c->failovers() == 0);
      REQUIRE(c->calls(CallKind::all_reduce, Path::ina) == kRounds);
      REQUIRE(c->calls(CallKind::all_gather, Path::ring) == kRounds);
      REQUIRE(c->calls(CallKind::all_gather, Path::ina) == kRounds);
      REQUIRE(c->calls(CallKind::reduce_scatter, Path::ring) == kRounds);
    }
  }
}

TEST_CASE("path choice: without a box every call takes the ring", "[hostlib][path]") {
  std::mt19937_64 rng(14);
  Job job(ring_fabric(3, 1u << 16), with_choice(PathChoice::ina), true);
  all_gather_checked(job, rng, 5);
  REQUIRE(last_path(job) == Path::ring);
  all_reduce_checked(job, rng, 5);
  REQUIRE(last_path(job) == Path::ring);
  REQUIRE(job.comms[0]->calls(CallKind::all_reduce, Path::ina) == 0);
  REQUIRE(job.comms[0]->calls(CallKind::all_reduce, Path::ring) == 1);
}

// A ring-path call right after an INA call, with rank 1 slow in two ways
// (the loopback fabric's hooks): its last INA write's ACK comes only after
// rank 0's first ring-path write reached it (its INA call meets that write
// while waiting), or its last INA result reaches its completion queue only
// after that write landed (the ring write must not land over the result).
TEST_CASE("path choice: a ring call right after an INA call, its first write early",
          "[hostlib][path]") {
  std::mt19937_64 rng(15);
  for (const char* slow : {"late ack", "late read"}) {
    INFO(slow);
    std::atomic<bool> armed{false}, hit{false};
    LoopbackConfig cfg = box_fabric(3, kMsgLen, kWindow, kPmtu);
    const auto once = [&](unsigned rank) {
      if (!armed || rank != 1) return false;
      armed = false;
      hit = true;
      return true;
    };
    if (std::string(slow) == "late ack")
      cfg.late_ack = [&](unsigned sender, unsigned, uint64_t) { return once(sender); };
    else
      cfg.late_read = [&](unsigned receiver, unsigned, uint32_t) { return once(receiver); };
    Job job(cfg, with_choice(PathChoice::model), true);
    const cost::Params p = params_of(*job.comms[0]);
    size_t shard = *cost::crossover(p, cost::Kind::reduce_scatter, 3) / 4 + 64;
    while (cost::estimate(p, cost::Kind::reduce_scatter, 3, shard * 4).choice != Path::ring)
      ++shard;
    for (int i = 0; i < 3; ++i) {
      // Both calls queued on every rank before any is waited for. The ring
      // reduce-scatter's first step writes where the INA result lies when
      // the two regions overlap.
      auto sums = inputs(rng, 3, DataType::int32, 1),
           all = inputs(rng, 3, DataType::int32, 3 * shard);
      std::vector<std::vector<uint8_t>> sum(3, std::vector<uint8_t>(4)),
          mine(3, std::vector<uint8_t>(shard * 4));
      std::vector<AllreduceHandle> h1(3), h2(3);
      armed = true;
      for (unsigned r = 0; r < 3; ++r) {
        Communicator& c = *job.comms[r];
        REQUIRE(c.allreduce_async(sums[r].data(), sum[r].data(), 1, DataType::int32, Op::sum, h1[r],
                                  20000)
                    .ok());
        REQUIRE(c.reduce_scatter_async(all[r].data(), mine[r].data(), shard, DataType::int32,
                                       Op::sum, h2[r], 20000)
                    .ok());
      }
      const auto want_sum = rank_order_reference(sums, DataType::int32, Op::sum);
      const auto want_all = rank_order_reference(all, DataType::int32, Op::sum);
      for (unsigned r = 0; r < 3; ++r) {
        const Error e1 = h1[r].wait(), e2 = h2[r].wait();
        INFO("rank " << r << ": " << e1.message << " / " << e2.message);
        REQUIRE((e1.ok() && e2.ok()));
        REQUIRE(sum[r] == want_sum);
        REQUIRE(h1[r].record().path == Path::ina);
        REQUIRE(h2[r].record().path == Path::ring);
        REQUIRE(std::memcmp(mine[r].data(), want_all.data() + r * shard * 4, shard * 4) == 0);
      }
      REQUIRE(hit);
      hit = false;
    }
    for (auto& c : job.comms) REQUIRE(c->failovers() == 0);
  }
}

TEST_CASE("link figures: measured on the ring, shared as text", "[hostlib][path]") {
  Job job(box_fabric(3, kMsgLen, kWindow, kPmtu), with_choice(PathChoice::model), true);
  std::vector<LinkFigures> got(3, configured_links(Options{}));
  std::vector<Error> errs(3);
  std::vector<std::thread> th;
  for (unsigned r = 0; r < 3; ++r)
    th.emplace_back([&, r] {
      errs[r] = measure_links(*job.comms[r]->impl().collective, 3, /*probe_us=*/1e6,
                              Clock::now() + std::chrono::seconds(20), got[r]);
    });
  for (auto& t : th) t.join();
  for (unsigned r = 0; r < 3; ++r) {
    INFO("rank " << r << ": " << errs[r].message);
    REQUIRE(errs[r].ok());
    REQUIRE(got[r].measured);
    REQUIRE(got[r].alpha_us > 0);
    REQUIRE(got[r].gbps > 0);
    REQUIRE(got[r].box_us == Approx(1e6 - got[r].alpha_us));  // the probe less one hop
  }
  // Ring calls only: the box saw none of them.
  for (auto& c : job.comms) REQUIRE(c->failovers() == 0);
  // The text rank 0 sends, read back exactly; malformed text refused.
  PathChoice c{};
  LinkFigures f;
  REQUIRE(decode_links(encode_links(PathChoice::ring, got[0]), c, f));
  REQUIRE(c == PathChoice::ring);
  REQUIRE((f.alpha_us == got[0].alpha_us && f.gbps == got[0].gbps && f.box_us == got[0].box_us &&
           f.measured));
  for (const char* bad : {"", "0 0x1p+0", "3 0x1p+0 0x1p+0 0x1p+0 1", "0 0x1p+0 0x1p+0 0x1p+0 1 x"})
    REQUIRE_FALSE(decode_links(bad, c, f));
}
