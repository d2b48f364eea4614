// The aggregation engine: plain C++ over packet buffers, no EAL; the data
// plane runs one per worker lcore. Design: docs/design.md#tables,
// docs/design.md#cells-and-the-window-rule, docs/design.md#icrc-fix-up.
//
// Example: ring 7 of P = 3 ranks A -> B -> C -> A, msg_len 2, window N = 2,
// so S = 4 message slots. Rank 0 (A) writes message 5, two packets, to B:
//  1. The WRITE FIRST carries the INA header (ring 7, rank 0, msg 5). The
//     CLT (clt.h) binds (A, B, dst QPN) to (ring 7, rank 0); rank 0's
//     history (history.h) records msg 5 and its first PSN in slot 5 mod 4.
//  2. It is held in cell(5, 0) = cells[1 * 2 + 0] (cells.h): tag 5, rank
//     bit 0. The WRITE LAST has no INA header: the history gives its offset
//     k = 1, so it goes to cells[3].
//  3. Ranks 1 and 2 arrive the same way; each cell's third packet
//     completes it: the payloads are reduced in rank order, the sum written
//     into all three packets, their ICRC fixed (icrc_fixup.h), and they
//     leave through Sink::tx to B, C and A. (Accumulate mode reduces each
//     packet on arrival and keeps only its headers.)
//  4. A resend into the complete cell gets the stored result (`emit`);
//     message 9 (9 mod 4 = 1) resets the cell.
// Other traffic (non-RoCE, ACK/NAK, SEND, non-INA WRITEs, anything off ring
// links) is `forward`ed untouched. A later packet of a message whose first
// packet was lost is dropped; RC retransmission resends both.
// Ring lifecycle: remove_ring frees a ring at once; its connections and
// links stay a tombstone until `now + retire_grace`, their WRITEs dropped
// (ring_retired): the job fails, never sums wrong (docs/design.md#failure-semantics).
//
// Threads:
// - The engine's thread (one data plane worker) calls every non-static
//   method. process_burst / process are the hot path: no allocation, lock,
//   logging or exception. install_ring, remove_ring and expire_retired run
//   on it between bursts; set_box_addresses before a burst.
// - Any thread runs the static prepare_ring (allocation, zero-fill: the data
//   plane's control thread) and frees a ring remove_ring detached.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "common/status.h"
#include "engine/reasons.h"
#include "engine/ring.h"
#include "engine/tree.h"
#include "reduce/reduce.h"
#include "wire/parse.h"

namespace netreduce::engine {

// A packet buffer. `handle` is the caller's (an rte_mbuf*, a test buffer).
struct Pkt {
  uint8_t* data = nullptr;
  uint16_t len = 0;
  void* handle = nullptr;
  uint16_t meta = 0;  // the caller's tag (the data plane: the RX port's slot, 0 or 1); carried onto
                      // rebuilt packets
};

// One frame of a burst, classified once by the caller (the data plane's
// classify stage; Engine::classify for tests): the engine never parses it
// again.
struct Frame {
  Pkt pkt;
  wire::ParsedFrame parsed;
  wire::ParseStatus status = wire::ParseStatus::ok;
};

// Packets handed back by process() / process_burst(), besides the verdict on
// each input packet. One input packet releases at most kMaxRanks packets and
// drops at most kMaxRanks held ones: process_burst stops early when fewer
// than that are free (see there).
struct Sink {
  static constexpr unsigned kCapacity = 4 * kMaxRanks;
  Pkt tx[kCapacity];  // transmit: released (rewritten) packets
  uint16_t ntx = 0;
  Pkt drop[kCapacity];  // free: previously held packets dropped now (reason counted)
  uint16_t ndrop = 0;
  void clear() noexcept { ntx = ndrop = 0; }
};

// Buffer source for accumulate mode (released packets are rebuilt). Returns
// a Pkt with data/len set, or data == nullptr when none is available.
struct Allocator {
  Pkt (*alloc)(void* ctx, uint16_t len) = nullptr;
  void* ctx = nullptr;
};

// retire_grace value (and RetiredRing::expires) meaning "until the ring's
// links and connections are used again by an installed ring, or forever".
inline constexpr uint64_t kRetireNever = UINT64_MAX;

struct EngineConfig {
  ReduceMode mode = ReduceMode::deterministic;
  IcrcFixup icrc_fixup = IcrcFixup::linear;
  bool verify_icrc = true;
  unsigned max_rings = 64;
  unsigned clt_capacity = 4096;  // INA connections (bound or retired); rounded up to a power of two
  unsigned pass_capacity = 4096;  // ordinary connections tracked on ring links (LRU-evicted)
  // Ring links (src, dst) of installed rings and tombstones; install_ring
  // refuses a ring whose new links do not fit (at least 2 * kMaxRanks).
  unsigned link_capacity = 4096;
  uint64_t memory_budget = 1ull << 30;  // bytes over all rings
  reduce::Isa isa = reduce::best_isa();
  Allocator allocator{};  // required in accumulate mode
  // How long a removed ring's connections and links stay retired, in the
  // units of the `now` the caller passes to process() / remove_ring() /
  // expire_retired() (the data plane: TSC cycles). kRetireNever (default):
  // retired until the engine is destroyed; the caller that wants tombstones
  // to go sets a grace longer than any message of the job can stay in
  // flight (e.g. the host's retransmission timeout times its retry count).
  uint64_t retire_grace = kRetireNever;
  // A later packet (MIDDLE, LAST) of no recorded message is dropped as
  // first_packet_lost; met again at least this long after (a resend) it is
  // forwarded as fwd_unmatched, and so is the packet after it (engine.cc,
  // Impl::unmatched). Longer than packets are reordered before the box,
  // shorter than a sender's retries last. Units of `now`; kRetireNever
  // (default): never forwarded.
  uint64_t forward_unmatched_after = kRetireNever;
  // A resend the box cannot answer (a duplicate of a held packet, a last
  // packet of a message incomplete here) is forwarded untouched as
  // fwd_stalled once its message has waited this long since its first
  // packet (engine.cc, Impl::stalled): its other ranks' packets passed a
  // bypassed or restarted box. Longer than ranks enter a call apart,
  // shorter than a sender's retries last. Units of `now`; kRetireNever
  // (default): never.
  uint64_t forward_stalled_after = kRetireNever;
  // The burst loop's software prefetches (engine.cc top): the CLT home slot,
  // history entry, cell, held records and result of later packets
  // (`prefetch_tables`), and the frame bytes two packets ahead
  // (`prefetch_frames`). engine-bench's BM_ColdTables measures them
  // (bench/README.md#engine-bench-per-packet-cost-of-the-aggregation-engine):
  // the table prefetch cost 10% with warm
  // tables and 20% with cold ones, so it is off; the frame prefetch halved
  // the loopback's cost per packet at 1 KB (frames arrive cold), so it is on.
  bool prefetch_tables = false;
  bool prefetch_frames = true;
};

// What the caller does with the input packet.
enum class Verdict : uint8_t {
  forward,   // transmit it unchanged
  emit,      // transmit it (payload and ICRC rewritten)
  held,      // the engine owns it now (it may already be in Sink::tx)
  consumed,  // accumulate mode: the engine kept what it needs; free it
  drop,      // free it; the reason was counted
};

struct Outcome {
  Verdict verdict;
  Reason reason;
  // process_burst: how many packets this frame released into Sink::tx (they
  // follow the previous frames' there), so the caller can keep the order the
  // packets would have had one by one: this frame, then what it released.
  uint8_t released = 0;
};

struct RingCounters {
  uint64_t packets_aggregated = 0;  // packets taken into a cell (held or accumulated)
  uint64_t bytes_aggregated = 0;    // data bytes of those packets
  uint64_t cells_completed = 0;
  uint64_t messages_completed = 0;
  // Message results sealed with their digest (digest.h): last cells
  // released and last packets served.
  uint64_t messages_sealed = 0;
  uint64_t retransmissions_served = 0;  // emitted from a completed cell
  uint64_t connections_rebound = 0;     // a rank's connection replaced by a new QP
  ReasonCounters drops{};               // drops attributed to this ring, by reason
  TreeCounters tree{};                  // box-to-box traffic (a tree node only)
};

// Table occupancy and lookup cost (cheap accessor; single-threaded like the engine).
struct TableStats {
  uint64_t clt_entries = 0;         // INA and retired connections
  uint64_t pass_evictions = 0;      // ordinary connections pushed out of the pass table
  uint64_t history_lookups = 0;     // later packets looked up in a rank's history
  uint64_t history_probes = 0;      // history slots read by those lookups
  uint32_t history_probes_max = 0;  // most read for one packet (bounded: never O(S))
};

// A ring's figures: fixed size, no allocation (Engine::ring_figures copies
// every ring's into a caller's array: what the data plane publishes for its
// control thread without a command).
struct RingFigures {
  uint32_t ring_id = 0;
  RingCounters counters;
  uint32_t slots = 0;          // S
  uint64_t memory_bytes = 0;   // reserved for the ring (its quota accounting)
  uint32_t held_packets = 0;   // packets currently held (deterministic mode)
  uint64_t held_bytes = 0;     // their frame bytes
  uint32_t open_cells = 0;     // cells collecting (or awaiting a tree parent's result)
  uint32_t stalled_cells = 0;  // of those, collecting for longer than the asked timeout
};

struct RingInfo : RingFigures {
  RingSpec spec;
  // This box's part of the ring's tree, if any.
  std::optional<TreeSpec> tree;
};

// A removed ring in its grace period (Engine::retired_rings()).
struct RetiredRing {
  uint32_t ring_id = 0;
  uint64_t expires = kRetireNever;  // the `now` from which expire_retired() forgets it
  uint32_t connections = 0;         // its connections still retired (not re-bound since)
};

namespace detail {
struct Ring;
struct RingDeleter {
  void operator()(Ring* r) const noexcept;
};
}  // namespace detail

// One ring's whole state (cells, histories, held records, results), built
// off the packet path by Engine::prepare_ring and attached by install_ring:
// the thread that prepares it (the data plane's control thread) allocates
// and zero-fills, the engine's thread only moves the pointer in. A ring
// detached by remove_ring comes back the same way, to be freed off the
// packet path too.
using PreparedRing = std::unique_ptr<detail::Ring, detail::RingDeleter>;

class Engine {
 public:
  explicit Engine(const EngineConfig& config);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Installs a ring. The same spec again is a no-op (ok); a different spec
  // under an installed id is a conflict. Refused, with the field named, when
  // invalid, over its quota, or over the engine's memory budget.
  // Both steps on the calling thread: prepare_ring, then install_ring(ring).
  Status install_ring(const RingSpec& spec);
  // The same with this box's part of the ring's tree (tree.h): refused,
  // with the field named, when the tree does not fit the ring, and in
  // accumulate mode. The same ring and tree again is a no-op; the same id
  // with another tree a conflict.
  Status install_ring(const RingSpec& spec, const TreeSpec& tree);
  // Builds a ring's state for `cfg` (validated, within its quota; accumulate
  // mode needs cfg.allocator). Any thread: touches no engine.
  static Status prepare_ring(const EngineConfig& cfg, const RingSpec& spec, PreparedRing& out);
  // The same with a tree node (tree == nullptr: none); needs cfg.allocator.
  static Status prepare_ring(const EngineConfig& cfg, const RingSpec& spec, const TreeSpec* tree,
                             PreparedRing& out);
  // Attaches a prepared ring (O(P): its links and id): taken from `ring` on
  // success; left there for the caller to free on any refusal and when the
  // same spec is installed already (ok). Refused, with the field named, for
  // a different spec under the same id, over the memory budget, with every
  // ring slot or the link table full. Engine's thread, no zero-filling.
  Status install_ring(PreparedRing& ring);
  // Removes a ring: its held packets handed back for the caller to free
  // (counted ring_removed) and its slot freed at once. Its state is freed
  // here, or moved into `*detached` when given (to free off the packet
  // path). Its bound connections and its links stay known as a tombstone
  // until `now + retire_grace`: see "Ring lifecycle" above. not_found if no
  // such ring. Control work (allocates its tombstone).
  Status remove_ring(uint32_t ring_id, uint64_t now, std::vector<Pkt>& released,
                     PreparedRing* detached = nullptr);
  // Forgets the tombstones whose expiry is at or before `now`: erases their
  // CLT entries still retired and their links no installed ring uses.
  // Returns how many. One compare when none is due, so the data plane may
  // call it every loop iteration; no allocation.
  unsigned expire_retired(uint64_t now) noexcept;
  size_t retired_count() const noexcept;
  // Tombstones by expiry, earliest first (control path: allocates).
  std::vector<RetiredRing> retired_rings() const;

  // The hot path. `now` is the caller's monotonic clock, in the units of
  // EngineConfig::retire_grace (the data plane: TSC cycles); it stamps cells
  // for stall reporting and dates removals.
  Outcome process(Pkt pkt, uint64_t now, Sink& out) noexcept;
  // Parses the frame into f (what the classify stage does for a burst).
  static void classify(Pkt pkt, Frame& f) noexcept;
  // The burst entry: frames[0..n) in order, each frame's verdict in
  // outcomes[i], released / dropped-held packets appended to `out` (not
  // cleared). Stops before a frame when `out` has fewer than kMaxRanks free
  // tx or drop entries and returns how many frames it processed; the caller
  // drains `out` and calls again with the rest.
  unsigned process_burst(const Frame* frames, unsigned n, uint64_t now, Outcome* outcomes,
                         Sink& out) noexcept;
  // The box's box-to-box addresses (every tree node's TreeSpec::self.ip,
  // host order) beyond this engine's own trees: where several engines share
  // one box (the data plane's workers), a box-to-box frame for the box may
  // reach an engine that holds no tree of it, and it must still be judged
  // as the box's (dropped when malformed or for an unknown tree), never
  // forwarded as transit or ordinary traffic. ips[0..n) is the caller's and
  // is read by process / process_burst until the next call, so it must stay
  // valid until then; n = 0: this engine's trees only. No allocation: a
  // pointer flip, made per burst.
  void set_box_addresses(const uint32_t* ips, size_t n) noexcept;

  std::vector<uint32_t> ring_ids() const;
  size_t ring_count() const noexcept;
  // A ring's report; a cell open for longer than `stall` at `now` (both in
  // the clock of process()) counts as stalled; stall 0: none counted.
  std::optional<RingInfo> ring_info(uint32_t ring_id, uint64_t now = 0, uint64_t stall = 0) const;
  // Every installed ring's figures into out[0..cap) (ring slot order);
  // returns how many. `now`/`stall` as for ring_info. No allocation: the
  // engine's thread may call it between bursts.
  unsigned ring_figures(RingFigures* out, unsigned cap, uint64_t now = 0,
                        uint64_t stall = 0) const noexcept;
  const ReasonCounters& counters() const noexcept;
  TableStats table_stats() const noexcept;
  uint64_t memory_in_use() const noexcept;
  const EngineConfig& config() const noexcept;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace netreduce::engine
