// The time of one collective call on each path, in the alpha-beta model of
// NetReduce's appendix A (T_inet = alpha + M/B, T_fr = 2(P-1) alpha +
// 2(P-1)/P M/B), and which path wins. The equations and their sources:
// docs/cost-model.md#the-ina-path-one-pass and the sections after it.
//
// INA: one pass host -> box -> host. A call of x data bytes is m = ceil(x /
// D) messages, D = msg_len x payload_bytes - 24 (the INA header). Each
// message waits L = alpha + box_s for its result and takes s = msg_len x
// payload_bytes / B on the link; the window N lets N messages fly, so when
// N s < s + L every burst of N messages after the first stalls L - (N-1) s:
//   T_ina = L + (x + 24 m) / B + floor((m-1) / N) max(0, L - (N-1) s) + copy x
// Ring: `steps` dependent steps of `step` bytes each, reducing on the host
// in the reduce-scatter half:
//   T_ring = steps (alpha + step / B) + copy steps step + reduce rs_steps step
// | kind           | INA bytes x | ring steps | step bytes | (bytes = the call's per-rank n)
// | all-reduce     | n           | 2(P-1)     | n / P      |
// | reduce-scatter | P n (shard) | P-1        | n          |
// | all-gather     | P n (count) | P-1        | n          |
// | broadcast, reduce | n        | 2(P-1)     | n / P      | (the ring path runs an all-reduce)
// | barrier        | 4           | 2(P-1)     | 4 / P      |
// The cheaper path is chosen; a tie goes to INA.
//
// Example: alpha 5 us, B 12.5 GB/s (100 Gb/s), box 2 us, msg_len 4,
// payload 1024 (D = 4072), window 8; an all-reduce of 65536 bytes on P = 8.
//   ring: 14 x (5 us + 8192 B / B) = 14 x 5.65536 us = 79.175 us.
//   INA: m = 17 messages, 65944 wire bytes = 5.27552 us; L = 7 us,
//   s = 0.32768 us, 8 s < s + L: 2 stalled bursts of 4.70624 us;
//   T = 7 + 5.27552 + 9.41248 = 21.688 us: INA, 3.65x faster.
// With window 32 nothing stalls: T = L + wire bytes / B = 12.27552 us, the
// paper's alpha + M/B.
#pragma once

#include <cstdint>
#include <optional>

#include "netreduce/netreduce.hpp"

namespace netreduce::host::cost {

// The collective a call is (netreduce.hpp's CallKind).
using Kind = CallKind;

// The link and the box, measured at communicator creation or configured.
struct Params {
  double alpha_s = 5e-6;          // per dependent step: one hop's latency, host software included
  double bandwidth_Bps = 12.5e9;  // B, the link's data rate in bytes per second
  double box_s = 0;               // what one pass through the box adds to a hop
  uint32_t msg_len = 4;           // packets per INA message
  uint32_t payload_bytes = 1024;  // bytes per packet
  uint32_t window = 2;            // N, INA messages in flight
  double copy_s_per_byte = 0;     // host time per byte received (copied out)
  double reduce_s_per_byte = 0;   // host time per byte reduced (the ring's reduce-scatter)
};

// Checks what the equations need (a rank, a bandwidth, a message larger
// than its header, a window); the error names the field.
Error check(const Params& p, unsigned world);

struct PathCost {
  double seconds = 0;
  uint64_t steps = 0;         // dependent steps: the ring's; INA's round trips (1 + stalled bursts)
  double bytes_per_rank = 0;  // data bytes each rank sends (INA headers excluded)
};

struct Estimate {
  PathCost ina;
  PathCost ring;
  Path choice = Path::ina;  // the cheaper; ina on a tie
};

// One call of `bytes` per rank (count x element size: a reduce-scatter's
// shard, an all-gather's own part; a barrier ignores it) on `world` ranks.
// Params must pass check(). 0 bytes: both 0.
Estimate estimate(const Params& p, Kind k, unsigned world, uint64_t bytes);

// The smallest size (bytes, >= 2) whose choice differs from the choice at 1
// byte, or nullopt if there is none up to 16 TiB (a barrier has one size).
// Just past it the choice can alternate (a message boundary adds a header,
// a burst boundary a stall) before the trend settles it.
std::optional<uint64_t> crossover(const Params& p, Kind k, unsigned world);

}  // namespace netreduce::host::cost
