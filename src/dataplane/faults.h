// Fault injection: the box misbehaves on purpose, for a bounded time, so that
// operators can rehearse what their jobs and alerts do when it really does.
//
// Theory of operation
// -------------------
// An operator (control socket `set_fault`, the daemon's POST /v1/faults,
// `netreducectl fault set`) asks for one fault on one ring, or on every
// installed ring, for duration_ms (required, at most faults.max_duration_ms):
//   drop       drop `fraction` of the ring's packets;
//   duplicate  send `fraction` of them twice (the second a copy, made with
//              rte_pktmbuf_copy: the engine writes into the buffers it
//              holds, so the two must not share one);
//   reorder    hold `fraction` of them back and let each go right after the
//              ring's next packet (at most one held per worker and burst; a
//              packet still held when the burst ends goes last in it, not
//              counted: nothing is held across bursts, so nothing leaks);
//   bypass     forward `fraction` of them raw, untouched, to the opposite
//              port, as if the box were not on the path: the engine never
//              sees them.
// "The ring's packets" are the RDMA WRITEs on its links (every rank's, or a
// tree node's local ranks'; dataplane/placement.h), matched by receiving
// connection (dst, BTH dest QP) when the ring gave its QP numbers, else by
// link (src, dst): rings over the same members without QP numbers cannot be
// told apart on the wire, so a fault on one hits their shared links. ACKs
// and box-to-box frames are never faulted. A ring has at most one fault; a
// new one replaces it. The whole feature is refused unless faults.enabled.
//
// Threads (the contract of dataplane.h, as for the LinkTable):
// - Control thread: keeps the active faults (Dataplane::faults_), builds an
//   immutable FaultTable from them and the rings' links, publishes it
//   (release store; nullptr when no fault is active) and frees the old one
//   after an RCU grace period. It republishes on every change, when a fault
//   ends (housekeeping) and when a faulted ring is removed.
// - Worker: loads the table once per burst (acquire). No fault: one
//   predictable branch per burst and nothing else. Otherwise inject_faults
//   runs between classify and dispatch, on the packets this worker received
//   from its ports (not on those other workers dispatched to it: each packet
//   meets the faults once). Per packet it costs a hash lookup and, for a
//   matched one, a draw from the worker's PRNG; no allocation (except the
//   duplicate's mbuf, from the pool), no lock, no log. A rule's end is
//   checked against the burst's TSC, so a fault stops on time even before
//   the control thread republishes.
// - Randomness: xorshift64* per worker, reseeded from faults.seed, the
//   table's generation and the worker's index whenever a new table appears:
//   the same requests over the same traffic fault the same packets.
// - Counting: every faulted packet is counted per worker and port under its
//   data plane reason (fault_drop, fault_duplicate, fault_reorder,
//   fault_bypass; dataplane/reasons.h), and per rule in the table's hit
//   counters, one cache line per worker (written by that worker only,
//   relaxed; summed by the control thread for list_faults, and carried over
//   when the table is replaced).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "engine/engine.h"

namespace netreduce::dataplane {

struct Lcore;

enum class FaultKind : uint8_t { drop, duplicate, reorder, bypass };
std::string_view to_string(FaultKind k) noexcept;
std::optional<FaultKind> fault_kind_from(std::string_view s) noexcept;

struct FaultRule {
  uint32_t ring_id = 0;
  FaultKind kind = FaultKind::drop;
  // A matched packet is faulted when the top 32 bits of a draw are below
  // this: fraction x 2^32, so 0 never and 2^32 (fraction 1) always.
  uint64_t threshold = 0;
  uint64_t until_tsc = 0;  // the rule is inert from this TSC on
};

// Immutable once published, except the hit counters.
struct FaultTable {
  uint64_t generation = 0;  // one per table built: the workers reseed on a new one
  uint64_t seed = 0;        // faults.seed
  std::vector<FaultRule> rules;
  std::unordered_map<uint64_t, uint16_t> by_conn;  // LinkTable::conn_key -> rule
  std::unordered_map<uint64_t, uint16_t> by_link;  // LinkTable::key -> rule

  // Hits per worker and rule: worker w's counters start line w * lines.
  struct alignas(64) Line {
    std::atomic<uint64_t> n[8];
  };
  unsigned lines = 0;  // per worker: rules rounded up to 8
  std::unique_ptr<Line[]> hits;
  void size_hits(unsigned workers);
  // Only worker `worker` adds to its counters (relaxed), on a published table.
  std::atomic<uint64_t>& hit(unsigned worker, unsigned rule) const noexcept {
    return hits[worker * lines + rule / 8].n[rule % 8];
  }
  uint64_t hits_of(unsigned rule, unsigned workers) const noexcept;
};

// Stage (worker): applies the table to the `n` classified frames this
// worker received, in place; returns how many frames go on to dispatch
// (fewer after drop and bypass, more after duplicate, never over kMaxBurst).
unsigned inject_faults(Lcore& lc, const FaultTable& t, engine::Frame* frames, unsigned n,
                       uint64_t now);

}  // namespace netreduce::dataplane
