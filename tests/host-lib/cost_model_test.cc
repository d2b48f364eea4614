// The cost model (src/host-lib/cost_model.h) against the papers' equations
// and printed numbers. Expected values are the papers' own or formulas
// written out here from the papers, never the model's output:
// - NetReduce: In-Network Aggregation with Transport Transparency for
//   Distributed Training (ASPLOS '23), appendix A, equations (1)-(6), and
//   the traffic-volume table of its extended version's appendix (Table 8);
// - In-Network Reductions and Multicast in an Accelerator-Centric
//   Shared-Memory Network (ISCA '20), section VI-A and Fig. 7b.
#include "host-lib/cost_model.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <vector>

using namespace netreduce;
using namespace netreduce::host::cost;

namespace {

constexpr double kAlpha = 5e-6, kB = 12.5e9, kBox = 2e-6;
constexpr double kD = 4 * 1024 - 24;  // data bytes per message at msg_len 4, payload 1024

Params params(uint32_t window = 64, double box = kBox) {
  Params p;
  p.alpha_s = kAlpha;
  p.bandwidth_Bps = kB;
  p.box_s = box;
  p.msg_len = 4;
  p.payload_bytes = 1024;
  p.window = window;
  return p;
}

double messages(double x) { return std::ceil(x / kD); }

// Equation (1) of NetReduce appendix A: the flat ring all-reduce.
double paper_ring(unsigned P, double M) {
  return 2 * (P - 1) * kAlpha + 2.0 * (P - 1) / P * M / kB;
}

// T_inet = alpha + M / B (appendix A, eq. (3) at n = 1), with this
// library's 24-byte INA header per message and the box's latency.
double paper_ina(double M, double box = kBox) { return kAlpha + box + (M + 24 * messages(M)) / kB; }

}  // namespace

TEST_CASE("cost model: the header's worked example", "[cost]") {
  // P = 8, all-reduce of 65536 bytes, window 8: by hand, step by step.
  const Estimate e = estimate(params(8), Kind::all_reduce, 8, 65536);
  CHECK(e.ring.seconds == Approx(79.17504e-6).epsilon(1e-12));
  CHECK(e.ring.steps == 14);
  CHECK(e.ina.seconds == Approx(21.688e-6).epsilon(1e-12));
  CHECK(e.ina.steps == 3);  // the first round trip and 2 stalled bursts
  CHECK(e.choice == Path::ina);
  const Estimate wide = estimate(params(32), Kind::all_reduce, 8, 65536);
  CHECK(wide.ina.seconds == Approx(12.27552e-6).epsilon(1e-12));
  CHECK(wide.ina.steps == 1);
}

TEST_CASE("cost model: NetReduce appendix A, equations (1) and T_inet", "[cost]") {
  for (unsigned P : {2u, 3u, 8u, 32u, 1024u})
    for (double M : {4.0, 4072.0, 4073.0, 1e6, 236e6}) {
      INFO("P " << P << " M " << M);
      const Estimate e = estimate(params(), Kind::all_reduce, P, static_cast<uint64_t>(M));
      CHECK(e.ring.seconds == Approx(paper_ring(P, M)).epsilon(1e-12));
      CHECK(e.ina.seconds == Approx(paper_ina(M)).epsilon(1e-12));
      CHECK(e.ina.steps == 1);
    }
}

TEST_CASE("cost model: traffic volume (extended appendix, Table 8)", "[cost]") {
  // Worker: RAR sends 2 (P-1)/P M, INA sends M.
  const double M = 1 << 20;
  for (unsigned P : {2u, 3u, 16u, 32u}) {
    const Estimate e = estimate(params(), Kind::all_reduce, P, static_cast<uint64_t>(M));
    CHECK(e.ring.bytes_per_rank == Approx(2.0 * (P - 1) / P * M).epsilon(1e-12));
    CHECK(e.ina.bytes_per_rank == M);
  }
  // docs/design.md#what-the-box-does: at P = 3 INA sends 0.75x the ring's bytes, toward 0.5x.
  const Estimate three = estimate(params(), Kind::all_reduce, 3, 3 << 20);
  CHECK(three.ina.bytes_per_rank / three.ring.bytes_per_rank == Approx(0.75));
}

TEST_CASE("cost model: every collective's steps and bytes", "[cost]") {
  const unsigned P = 8;
  const uint64_t n = 1000;
  struct Row {
    Kind kind;
    double ina_bytes;
    uint64_t ring_steps;
    double ring_bytes;
  };
  const std::vector<Row> rows = {
      {Kind::all_reduce, 1000, 14, 14 * 125.0}, {Kind::reduce_scatter, 8000, 7, 7000},
      {Kind::all_gather, 8000, 7, 7000},        {Kind::broadcast, 1000, 14, 14 * 125.0},
      {Kind::reduce, 1000, 14, 14 * 125.0},     {Kind::barrier, 4, 14, 14 * 0.5},
  };
  for (const Row& r : rows) {
    INFO("kind " << static_cast<int>(r.kind));
    const Estimate e = estimate(params(), r.kind, P, n);
    CHECK(e.ina.bytes_per_rank == r.ina_bytes);
    CHECK(e.ring.steps == r.ring_steps);
    CHECK(e.ring.bytes_per_rank == Approx(r.ring_bytes));
    CHECK(e.ring.seconds == Approx(r.ring_steps * kAlpha + r.ring_bytes / kB).epsilon(1e-12));
    CHECK(e.ina.seconds == Approx(paper_ina(r.ina_bytes)).epsilon(1e-12));
  }
  // A barrier ignores the size; 0 bytes of anything else costs nothing.
  CHECK(estimate(params(), Kind::barrier, P, 0).ina.seconds == Approx(paper_ina(4)));
  const Estimate none = estimate(params(), Kind::all_gather, P, 0);
  CHECK(none.ina.seconds == 0);
  CHECK(none.ring.seconds == 0);
  CHECK(none.choice == Path::ina);
}

TEST_CASE("cost model: host costs per byte", "[cost]") {
  Params p = params();
  p.copy_s_per_byte = 1e-10;
  p.reduce_s_per_byte = 3e-10;
  const unsigned P = 4;
  const double n = 40000;
  const Estimate e = estimate(p, Kind::all_reduce, P, static_cast<uint64_t>(n));
  // INA copies n out; the ring copies every step's n/P and reduces P-1 of them.
  CHECK(e.ina.seconds == Approx(paper_ina(n) + 1e-10 * n).epsilon(1e-12));
  CHECK(e.ring.seconds ==
        Approx(paper_ring(P, n) + 1e-10 * 6 * n / P + 3e-10 * 3 * n / P).epsilon(1e-12));
}

TEST_CASE("cost model: the window (NetReduce section 3.2's N >= RTT x rate / message)", "[cost]") {
  // A message of 4096 wire bytes takes s = 0.32768 us; L = 7 us. With
  // window N, once N s < s + L each burst of N messages after the first
  // waits L - (N-1) s for the result of the burst before it.
  const double s = 4096 / kB, L = kAlpha + kBox;
  for (uint32_t N : {1u, 2u, 8u, 22u, 23u, 64u})
    for (uint64_t m : {1u, 2u, 8u, 9u, 100u}) {
      const double x = m * kD;
      INFO("N " << N << " messages " << m);
      const double stall = std::max(0.0, L - (N - 1) * s);
      const double bursts = stall > 0 ? std::floor((m - 1.0) / N) : 0;
      const Estimate e = estimate(params(N), Kind::all_reduce, 4, static_cast<uint64_t>(x));
      CHECK(e.ina.seconds == Approx(L + m * 4096 / kB + bursts * stall).epsilon(1e-12));
      CHECK(e.ina.steps == 1 + bursts);
    }
  // Stop-and-wait (N = 1): every message its own round trip.
  const Estimate one = estimate(params(1), Kind::all_reduce, 4, static_cast<uint64_t>(10 * kD));
  CHECK(one.ina.seconds == Approx(10 * (L + s)).epsilon(1e-12));
}

TEST_CASE("cost model: NetReduce condition (6) at P = 32, n = 8", "[cost]") {
  // Equation (5) = (1) - (3). Its M coefficient, over n P B_intra B_inter:
  // (P - 2) n B_intra - 2 (n - 1) P B_inter, zero at B_intra / B_inter =
  // 2 (n - 1) P / ((P - 2) n) = 28/15. The relaxed bound (6), 2P/(P - 2),
  // is 32/15 = 2.13 at P = 32: the paper prints 2.3 (appendix D and
  // section 5.4), docs/cost-model.md#errors-in-the-papers.
  const unsigned P = 32, n = 8;
  const double B_inter = 12.5e9, M = 1e9;
  // The ring's bandwidth term from the model (eq. (1) with alpha = 0).
  Params p = params();
  p.alpha_s = 0;
  p.bandwidth_Bps = B_inter;
  const double fr = estimate(p, Kind::all_reduce, P, static_cast<uint64_t>(M)).ring.seconds;
  // Equation (3)'s bandwidth term, written out from its three stages.
  const auto pn = [&](double B_intra) { return 2 * (n - 1) * M / (n * B_intra) + M / B_inter; };
  const double exact = 2.0 * (n - 1) * P / ((P - 2.0) * n);
  CHECK(exact == Approx(28.0 / 15));
  CHECK(fr - pn(exact * B_inter) == Approx(0).margin(1e-12));
  CHECK(fr - pn(0.99 * exact * B_inter) < 0);
  const double relaxed = 2.0 * P / (P - 2);
  CHECK(relaxed == Approx(2.1333).epsilon(1e-4));
  CHECK(relaxed != Approx(2.3).epsilon(0.01));
  CHECK(fr - pn(relaxed * B_inter) > 0);
  // The prototype's 150 GB/s NVLink over 100 GbE: the printed 12.
  CHECK(150e9 / B_inter == Approx(12));
}

TEST_CASE("cost model: NetReduce equation (2)'s closed form and its brackets", "[cost]") {
  // The three stages of Tencent all-reduce as printed, summed, against the
  // printed closed form: the alpha terms agree, the intra-machine M term
  // does not (docs/cost-model.md#errors-in-the-papers).
  for (double n : {2.0, 4.0, 8.0, 16.0})
    for (double P : {32.0, 64.0}) {
      const double lg = std::log2(n);
      const double alpha_sum = 2 * lg + 2 * (P / n - 1) + (lg + n - 1);
      CHECK(alpha_sum == Approx((n * n + 3 * n * lg - 3 * n + 2 * P) / n));
      const double intra_sum = 2 * (n - 1) / n / n + 2 * (n - 1) / n;  // x M / B_intra
      const double inter_sum = 2 * (P / n - 1) / (P / n);              // x M / B_inter
      const double printed_intra = 4 * (n - 1) / n, printed_inter = 2 * (P - n) / P;
      CHECK(inter_sum == Approx(printed_inter));
      CHECK(intra_sum == Approx(2 * (n * n - 1) / (n * n)));
      CHECK(intra_sum < printed_intra);
    }
}

TEST_CASE("cost model: the shape of ISCA '20 Fig. 7b", "[cost]") {
  // Speed-up of one pass over the ring: largest at small sizes (18x at 16
  // GPUs there), growing with P; for large sizes it tends to the bandwidth
  // ratio, 2 (P - 1) / P of the ring's bytes ("converges to 2x").
  const Params p = params(64, 0);
  std::vector<double> previous_row;
  for (unsigned P : {4u, 8u, 16u}) {
    std::vector<double> row;
    for (uint64_t size = 4; size <= (uint64_t{1} << 34); size *= 4) {
      const Estimate e = estimate(p, Kind::all_reduce, P, size);
      row.push_back(e.ring.seconds / e.ina.seconds);
    }
    INFO("P " << P);
    CHECK(row.front() == Approx(2.0 * (P - 1)).epsilon(1e-3));  // 2(P-1) alpha over alpha
    for (size_t i = 1; i < row.size(); ++i) CHECK(row[i] <= row[i - 1] * (1 + 1e-9));
    const double bandwidth_ratio = 2.0 * (P - 1) / P / (1 + 24 / kD);
    CHECK(row.back() == Approx(bandwidth_ratio).epsilon(1e-3));
    for (size_t i = 0; i < previous_row.size(); ++i) CHECK(row[i] > previous_row[i]);
    previous_row = row;
  }
}

namespace {

// First size whose choice differs from the one at 1 byte, with the model
// written out independently (equations in cost_model.h), found by scanning.
uint64_t scan_first_flip(const Params& p, Kind k, unsigned P, uint64_t limit) {
  const double L = p.alpha_s + p.box_s, B = p.bandwidth_Bps;
  const double msg = double(p.msg_len) * p.payload_bytes, d = msg - 24, s = msg / B;
  const double stall = std::max(0.0, L - (p.window - 1.0) * s);
  const auto ina_wins = [&](uint64_t n) {
    const bool gather = k == Kind::all_gather || k == Kind::reduce_scatter;
    const double x = gather ? double(P) * n : double(n);
    const double m = std::ceil(x / d);
    const double ina =
        L + (x + 24 * m) / B + (stall > 0 ? std::floor((m - 1) / p.window) : 0) * stall;
    const double ring =
        gather ? (P - 1) * (p.alpha_s + n / B) : 2 * (P - 1) * (p.alpha_s + double(n) / P / B);
    return ina <= ring;
  };
  const bool base = ina_wins(1);
  for (uint64_t n = 2; n <= limit; ++n)
    if (ina_wins(n) != base) return n;
  return 0;
}

}  // namespace

TEST_CASE("cost model: the choice flips exactly at the crossover", "[cost]") {
  struct Case {
    const char* what;
    Params p;
    Kind kind;
    unsigned P;
  };
  // A slow box: the ring's steps beat its latency at small sizes; the
  // window covers its round trip (256 s > s + L).
  Params slow_box = params(256, 60e-6);
  Params short_window = params(1, 0);  // stop-and-wait loses to the ring at large sizes
  short_window.alpha_s = 20e-6;
  const std::vector<Case> cases = {
      {"all-gather, INA then ring", params(), Kind::all_gather, 8},
      {"reduce-scatter, P = 3", params(), Kind::reduce_scatter, 3},
      {"all-gather, P = 32", params(8), Kind::all_gather, 32},
      {"all-reduce, slow box: ring then INA", slow_box, Kind::all_reduce, 4},
      {"all-reduce, stop-and-wait: INA then ring", short_window, Kind::all_reduce, 2},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    const auto x = crossover(c.p, c.kind, c.P);
    REQUIRE(x.has_value());
    const Path small = estimate(c.p, c.kind, c.P, 1).choice;
    CHECK(estimate(c.p, c.kind, c.P, *x - 1).choice == small);
    CHECK(estimate(c.p, c.kind, c.P, *x).choice != small);
    CHECK(*x == scan_first_flip(c.p, c.kind, c.P, *x + 1));
  }
}

TEST_CASE("cost model: crossovers far out, and none", "[cost]") {
  // P = 2 all-reduce: both paths send n, so the ring's two steps lose to
  // one pass until the INA headers (24 per 4072 data bytes) outweigh one
  // alpha less box: n = (2 alpha - L) B D / 24 = 6.36 MB.
  const Params p = params(64, 2e-6);
  const auto far = crossover(p, Kind::all_reduce, 2);
  REQUIRE(far.has_value());
  const double expected = (2 * kAlpha - kAlpha - 2e-6) * kB * kD / 24;
  CHECK(static_cast<double>(*far) == Approx(expected).epsilon(1e-3));
  CHECK(estimate(p, Kind::all_reduce, 2, *far - 1).choice == Path::ina);
  CHECK(estimate(p, Kind::all_reduce, 2, *far).choice == Path::ring);
  // P >= 3 all-reduce with a fast box: one pass wins at every size.
  CHECK_FALSE(crossover(p, Kind::all_reduce, 8).has_value());
  // One rank: the ring has no steps and wins at every size; a barrier has one size.
  CHECK_FALSE(crossover(p, Kind::all_gather, 1).has_value());
  CHECK_FALSE(crossover(p, Kind::barrier, 8).has_value());
}

TEST_CASE("cost model: bad parameters are named", "[cost]") {
  Params p = params();
  CHECK(check(p, 8).ok());
  CHECK(check(p, 0).message.find("world") != std::string::npos);
  p.bandwidth_Bps = 0;
  const Error e = check(p, 8);
  CHECK(e.code == ErrorCode::invalid_argument);
  CHECK(e.message == "cost model: bandwidth_Bps must be > 0 (got 0)");
  p = params();
  p.msg_len = 1;
  p.payload_bytes = 16;
  CHECK(check(p, 8).message.find("msg_len x payload_bytes") != std::string::npos);
  p = params(0);
  CHECK(check(p, 8).message.find("window") != std::string::npos);
}
