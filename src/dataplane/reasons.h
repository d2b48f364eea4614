// The data plane's own packet fates, declared once (the same X-macro style as
// the engine's reasons in engine/reasons.h): packets the workers drop or pass
// on untouched before the engine sees them, and those an injected fault
// (dataplane/faults.h) dropped, copied, reordered or passed around it. Each
// has a counter per worker and port (WorkerStats::reasons, written only by
// its worker), and every surface is generated from this list: the control
// socket's `stats` (per worker, per port, summed as "dataplane_reasons"),
// DPDK telemetry /netreduce/stats, and the daemon's
// `netreduce_dataplane_packets_total{fate, reason}`. DPDK-free: the daemon
// includes it.
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
    "(counted under the port it came in on)")                                              \
  X(fault_drop, drop,                                                                      \
    "injected fault (faults.enabled): a ring's packet dropped on purpose (counted under "  \
    "the port it came in on)")                                                             \
  X(fault_duplicate, forward,                                                              \
    "injected fault: a copy of a ring's packet sent on after it, to the engine or the "    \
    "dispatched worker (counted under the port the original came in on)")                  \
  X(fault_reorder, forward,                                                                \
    "injected fault: a ring's packet held back and sent on after the ring's next one "     \
    "(counted under the port it came in on)")                                              \
  X(fault_bypass, forward,                                                                 \
    "injected fault: a ring's packet forwarded raw, untouched, as if the box were not on " \
    "the path; the engine never sees it (counted under the port it came in on)")

NETREDUCE_DEFINE_REASONS(NETREDUCE_DATAPLANE_REASONS)

}  // namespace netreduce::dataplane
