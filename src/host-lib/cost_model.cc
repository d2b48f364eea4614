#include "host-lib/cost_model.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <string>

#include "host-lib/plan.h"

namespace netreduce::host::cost {
namespace {

constexpr double kHeader = static_cast<double>(kInaHeaderBytes);
// crossover() looks no further than this (16 TiB per rank).
constexpr double kMaxBytes = 17592186044416.0;

// What a call of `n` bytes per rank moves on each path (table in cost_model.h).
struct Shape {
  uint64_t ina_bytes = 0;     // x: data bytes a rank sends into the box
  uint64_t ring_steps = 0;    // dependent steps of the ring
  double step_bytes = 0;      // bytes a rank sends in each step
  uint64_t reduce_steps = 0;  // of those, the steps that reduce on the host
};

Shape shape(Kind k, unsigned world, uint64_t n) {
  const uint64_t p = world;
  const uint64_t half = p - 1;
  switch (k) {
    case Kind::reduce_scatter:
      return {p * n, half, static_cast<double>(n), half};
    case Kind::all_gather:
      return {p * n, half, static_cast<double>(n), 0};
    case Kind::barrier:
      return {4, 2 * half, 4.0 / static_cast<double>(p), half};
    case Kind::all_reduce:
    case Kind::broadcast:
    case Kind::reduce:
      break;
  }
  return {n, 2 * half, static_cast<double>(n) / static_cast<double>(p), half};
}

uint64_t message_data_bytes(const Params& p) {
  return uint64_t{p.msg_len} * p.payload_bytes - kInaHeaderBytes;
}

// One pass: m messages, the first N back to back, then one stall per burst
// of N if the window is shorter than a message's round trip.
PathCost ina_pass(const Params& p, uint64_t x) {
  if (x == 0) return {};
  const uint64_t d = message_data_bytes(p);
  const uint64_t m = (x + d - 1) / d;
  const double latency = p.alpha_s + p.box_s;
  const double message_s = static_cast<double>(d + kInaHeaderBytes) / p.bandwidth_Bps;
  const double stall = std::max(0.0, latency - (p.window - 1.0) * message_s);
  const uint64_t bursts = stall > 0 ? (m - 1) / p.window : 0;
  const double wire = static_cast<double>(x) + kHeader * static_cast<double>(m);
  PathCost c;
  c.seconds = latency + wire / p.bandwidth_Bps + static_cast<double>(bursts) * stall +
              p.copy_s_per_byte * static_cast<double>(x);
  c.steps = 1 + bursts;
  c.bytes_per_rank = static_cast<double>(x);
  return c;
}

PathCost ring_steps(const Params& p, const Shape& w) {
  const double steps = static_cast<double>(w.ring_steps);
  PathCost c;
  c.steps = w.ring_steps;
  c.bytes_per_rank = steps * w.step_bytes;
  c.seconds = steps * (p.alpha_s + w.step_bytes / p.bandwidth_Bps) +
              p.copy_s_per_byte * c.bytes_per_rank +
              p.reduce_s_per_byte * static_cast<double>(w.reduce_steps) * w.step_bytes;
  return c;
}

std::string field_error(const char* field, const char* rule, double got) {
  std::ostringstream s;
  s << "cost model: " << field << " must be " << rule << " (got " << got << ")";
  return s.str();
}

}  // namespace

Error check(const Params& p, unsigned world) {
  const auto bad = [](const char* field, const char* rule, double got) {
    return Error::make(ErrorCode::invalid_argument, field_error(field, rule, got));
  };
  if (world < 1) return bad("world", ">= 1", world);
  if (!(p.alpha_s >= 0) || !std::isfinite(p.alpha_s)) return bad("alpha_s", ">= 0", p.alpha_s);
  if (!(p.bandwidth_Bps > 0) || !std::isfinite(p.bandwidth_Bps))
    return bad("bandwidth_Bps", "> 0", p.bandwidth_Bps);
  if (!(p.box_s >= 0) || !std::isfinite(p.box_s)) return bad("box_s", ">= 0", p.box_s);
  if (uint64_t{p.msg_len} * p.payload_bytes <= kInaHeaderBytes)
    return bad("msg_len x payload_bytes", "> 24 (the INA header)",
               static_cast<double>(uint64_t{p.msg_len} * p.payload_bytes));
  if (p.window < 1) return bad("window", ">= 1", p.window);
  if (!(p.copy_s_per_byte >= 0)) return bad("copy_s_per_byte", ">= 0", p.copy_s_per_byte);
  if (!(p.reduce_s_per_byte >= 0)) return bad("reduce_s_per_byte", ">= 0", p.reduce_s_per_byte);
  return {};
}

Estimate estimate(const Params& p, Kind k, unsigned world, uint64_t bytes) {
  Estimate e;
  if (bytes == 0 && k != Kind::barrier) return e;
  const Shape w = shape(k, world, bytes);
  e.ina = ina_pass(p, w.ina_bytes);
  e.ring = ring_steps(p, w);
  e.choice = e.ina.seconds <= e.ring.seconds ? Path::ina : Path::ring;
  return e;
}

// How crossover() finds the first flip. Let d(n) = T_ina(n) - T_ring(n).
// Within one message interval (the sizes n of one message count m) d is
// linear in n, so the sizes that flip the choice are a prefix or a suffix
// of the interval: its ends tell, bisection finds the first. Adding N
// messages (a period: N D / c bytes, c the INA bytes per call byte) adds
// the same `drift` to d everywhere. So: scan the first two periods; if the
// drift moves d away from a flip, there is none; else skip the periods in
// which d cannot yet reach the flip and scan from there.
std::optional<uint64_t> crossover(const Params& p, Kind k, unsigned world) {
  if (k == Kind::barrier) return std::nullopt;
  const Path base = estimate(p, k, world, 1).choice;
  // toward(n) > 0 (>= 0 from the ring) where the choice at n is not base's.
  const auto toward = [&](uint64_t n) {
    const Estimate e = estimate(p, k, world, n);
    return (base == Path::ina ? 1.0 : -1.0) * (e.ina.seconds - e.ring.seconds);
  };
  const auto flips = [&](uint64_t n) { return estimate(p, k, world, n).choice != base; };
  const Shape unit = shape(k, world, 1);
  const double c = static_cast<double>(unit.ina_bytes);
  const uint64_t d = message_data_bytes(p);
  const uint64_t n_msgs = p.window;
  // Interval m: the sizes n with ceil(c n / d) = m.
  const auto first = [&](uint64_t m) { return (m - 1) * d / unit.ina_bytes + 1; };
  const auto last = [&](uint64_t m) { return m * d / unit.ina_bytes; };
  const auto first_flip_in = [&](uint64_t m) -> std::optional<uint64_t> {
    uint64_t a = std::max<uint64_t>(first(m), 2), b = last(m);
    if (a > b) return std::nullopt;
    if (flips(a)) return a;
    if (!flips(b)) return std::nullopt;
    while (b - a > 1) {  // invariant: a keeps the choice, b flips
      const uint64_t mid = a + (b - a) / 2;
      (flips(mid) ? b : a) = mid;
    }
    return b;
  };
  for (uint64_t m = 1; m <= 2 * n_msgs; ++m)
    if (auto f = first_flip_in(m)) return f;

  // d's slope per call byte within an interval, and its drift per period.
  const double latency = p.alpha_s + p.box_s;
  const double message_s = static_cast<double>(d + kInaHeaderBytes) / p.bandwidth_Bps;
  const double stall = std::max(0.0, latency - (p.window - 1.0) * message_s);
  const PathCost ring_unit = ring_steps(p, unit);
  const double slope = c * (1 / p.bandwidth_Bps + p.copy_s_per_byte) - ring_unit.seconds +
                       static_cast<double>(unit.ring_steps) * p.alpha_s;
  const double drift_d = static_cast<double>(n_msgs) * kHeader / p.bandwidth_Bps + stall +
                         slope * static_cast<double>(n_msgs * d) / c;
  const double drift = base == Path::ina ? drift_d : -drift_d;
  if (!(drift > 0)) return std::nullopt;

  // toward() in period q is at most ref + q drift + 2 |slope| (the ends of
  // an interval move by a fraction of a byte from period to period).
  double ref = -HUGE_VAL;
  for (uint64_t m = 1; m <= 2 * n_msgs; ++m) {
    const double q = static_cast<double>((m - 1) / n_msgs);
    for (uint64_t n : {first(m), last(m)})
      if (n >= 1 && first(m) <= last(m)) ref = std::max(ref, toward(n) - q * drift);
  }
  const double skip = std::floor((-ref - 2 * std::abs(slope)) / drift) - 1;
  const double q0 = std::max(2.0, skip);
  if (q0 * static_cast<double>(n_msgs * d) / c > kMaxBytes) return std::nullopt;
  for (uint64_t m = static_cast<uint64_t>(q0) * n_msgs + 1;; ++m) {
    if (static_cast<double>(first(m)) > kMaxBytes) return std::nullopt;
    if (auto f = first_flip_in(m)) return f;
  }
}

}  // namespace netreduce::host::cost
