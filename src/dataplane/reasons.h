// The data plane's own packet fates, declared once (the same X-macro style as
// the engine's reasons in engine/reasons.h): packets the workers drop or pass
// on untouched before the engine sees them. Each has a counter per worker and
// port (WorkerStats::reasons, written only by its worker), and every surface
// is generated from this list: the control socket's `stats` (per worker, per
// port, summed as "dataplane_reasons"), DPDK telemetry /netreduce/stats, and
// the daemon's `netreduce_dataplane_packets_total{fate, reason}`. DPDK-free:
// the daemon includes it.
#pragma once

#include <cstddef>
#include <string_view>

#include "engine/reasons.h"  // engine::Fate

namespace netreduce::dataplane {

// X(name, fate, description). The port a packet is counted under is in the
// description: where it was to leave (tx_full) or where it came in (the rest).
#define NETREDUCE_DATAPLANE_REASONS(X)                                                     \
  X(tx_full, drop,                                                                         \
    "TX queue or the TX queue owner's handoff ring full: dropped (counted under the port " \
    "it was to leave by)")                                                                 \
  X(inbox_full, drop,                                                                      \
    "the owning worker's inbox was full: dropped by dispatch (counted under the port it "  \
    "came in on)")                                                                         \
  X(multi_segment, forward,                                                                \
    "multi-segment mbuf: not contiguous, forwarded untouched without classification "      \
    "(counted under the port it came in on)")

enum class Reason : unsigned char {
#define NETREDUCE_X(name, fate, desc) name,
  NETREDUCE_DATAPLANE_REASONS(NETREDUCE_X)
#undef NETREDUCE_X
};

inline constexpr size_t kReasonCount = 0
#define NETREDUCE_X(name, fate, desc) +1
    NETREDUCE_DATAPLANE_REASONS(NETREDUCE_X)
#undef NETREDUCE_X
    ;

constexpr size_t index(Reason r) noexcept { return static_cast<size_t>(r); }

constexpr std::string_view to_string(Reason r) noexcept {
  switch (r) {
#define NETREDUCE_X(name, fate, desc) \
  case Reason::name:                  \
    return #name;
    NETREDUCE_DATAPLANE_REASONS(NETREDUCE_X)
#undef NETREDUCE_X
  }
  return "invalid";
}

constexpr std::string_view describe(Reason r) noexcept {
  switch (r) {
#define NETREDUCE_X(name, fate, desc) \
  case Reason::name:                  \
    return desc;
    NETREDUCE_DATAPLANE_REASONS(NETREDUCE_X)
#undef NETREDUCE_X
  }
  return "invalid";
}

constexpr engine::Fate fate_of(Reason r) noexcept {
  switch (r) {
#define NETREDUCE_X(name, fate, desc) \
  case Reason::name:                  \
    return engine::Fate::fate;
    NETREDUCE_DATAPLANE_REASONS(NETREDUCE_X)
#undef NETREDUCE_X
  }
  return engine::Fate::drop;
}

}  // namespace netreduce::dataplane
