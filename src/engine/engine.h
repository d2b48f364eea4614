// The aggregation engine: plain C++ over packet buffers, no EAL. The DPDK
// data plane runs one Engine per lcore; tests and benchmarks run it directly.
//
// Theory of operation (DESIGN.md sections 3-5):
//
// Entry. The data plane classifies an RX burst once (Engine::classify:
// parse every frame into a Frame) and hands it to process_burst, one call
// across the pimpl per burst. The packet path behind it is a template on
// ReduceMode and IcrcFixup, instantiated four times and chosen once at
// construction, so no per-packet branch on configuration remains but ICRC
// verification on/off. While packet i is processed, the frame bytes of
// packet i + 2 are prefetched (and, if EngineConfig::prefetch_tables, the
// CLT slot of packet i + 4 and the history entry and cell of packet i + 1).
// process() (one packet, parsed here) runs the same template. The pieces
// live in their own files: clt.h and pass_table.h (tables), history (message
// lookup), cells (cell records and the five cases), icrc_fixup (released
// packets' ICRC), ring_state (rings, links, tombstones); engine.cc is the
// orchestration.
//
// Classification. Non-RoCE traffic, RoCE it does
// not aggregate (ACK/NAK/CNP/SEND/READ, UC/UD, malformed) and RDMA WRITEs
// that are not INA messages are returned as `forward`: untouched. The box
// only claims traffic on ring links (rank r -> r+1 of an installed or
// retired ring): a WRITE FIRST/ONLY elsewhere is forwarded as
// fwd_not_ring_link even if its data begins with the INA magic, before ICRC
// verification or ring lookup. Corrupted INA packets on ring links (ICRC,
// when verification is on) are dropped before they reach a sum.
//
// CLT. The first packet of a message (WRITE FIRST/ONLY with the INA magic)
// names ring, rank and message id. The source address must be the rank's
// registered address. The connection (src IP, dst IP, dst QPN) is bound to
// (ring, rank) and the message's (msg_id, psn0, packets) is recorded in the
// rank's history of S messages, indexed by msg_id mod S and never overwritten
// by an older message. A later packet finds the recorded message whose PSN
// range contains it, and so its offset k, in a bounded number of history
// reads (newest, the rank's last hit, then a binary search over the
// PSN-monotone history; at most 24 reads whatever S is, see find_message).
// Go-back-N resends of message m-1 after m's first packet still find m-1.
// No such message means its first packet was lost: drop, and the receiver
// NAKs.
//
// Table bounds. Every table is a fixed-size array sized at construction
// (clt.h): the CLT, the link table (link_capacity links; install_ring refuses
// a ring whose links do not fit) and the ring index. The CLT (clt_capacity connections) holds only
// INA connections that passed every check, and retired ones: ordinary traffic never takes a slot.
// Ordinary (non-INA) WRITE messages on ring links are remembered in a separate pass table
// (pass_capacity connections, 8-way sets, LRU eviction) so their later packets are forwarded; a
// flood of new ordinary connections evicts only ordinary entries, and an evicted entry only turns
// forwards into drops, never into a wrong result (pass_table.h).
//
// Cells. A ring has S = 2N (rounded up to a power of two) message slots of
// msg_len cells; cell(m, k) = cells[(m mod S) * msg_len + k]. The five
// cases: a retransmission into a complete cell gets the stored result
// (`emit`); a duplicate of a held rank is dropped; a new rank is held and the
// P-th completes the cell (reduce, write the result into every packet, fix
// the ICRC, release all P); an older tag resets the cell; a newer tag means a
// stale retransmission: dropped and counted (never happens under rule W).
//
// Modes. deterministic (default): every rank's packet is held (its mbuf, no
// copy) and the result is reduced in rank order at completion, so it is
// bit-identical whatever the arrival order. accumulate: each arrival is
// reduced into a per-cell accumulator and only its headers are kept (the
// packet is `consumed`), and released packets are rebuilt from the stored
// headers in buffers from the Allocator. Memory is about P times smaller and
// float rounding depends on arrival order.
//
// ICRC fix-up. `full` recomputes each released packet's ICRC. `linear`
// computes the CRC of the result payload once per cell and combines it with
// the CRC of the packet's headers through CRC linearity (wire/icrc.h):
// O(header) per packet instead of O(payload). The header CRC is a
// by-product of the packet's ICRC verification on arrival, kept with the
// held packet (or stored headers) until release: the headers' CRC is not
// computed twice.
//
// Ring lifecycle. Removing a ring makes its running job fail loudly, never
// return wrong data. remove_ring frees the ring's cells, memory and slot at
// once and hands back its held packets (ring_removed). Its bound connections
// and its links stay known as a tombstone until `now + retire_grace`:
// - every WRITE on a retired connection is dropped (ring_retired), so the
//   in-flight message's later packets and the go-back-N resends of packets
//   the ring held never reach a receiver raw; receivers time out and the host
//   library reports the error;
// - on a link only removed rings use, INA first packets and later packets
//   that match no tracked non-INA message are dropped (ring_retired);
// - a retired connection never binds again while its tombstone lasts, even
//   when its first packet names an installed ring (the same id re-installed,
//   or another ring on those links): late packets of an old run cannot enter
//   a new run's cells, whichever arrives first. A new run uses new QPs. Tombstones live outside the
//   ring slots: a re-used ring slot is never pointed at by a retired entry.
// expire_retired(now) forgets due tombstones (their CLT entries still
// retired, their links no installed ring uses). After that the old
// connections are unknown: on links no ring uses their WRITEs are forwarded
// again, which is safe only once nothing of the old job is in flight; hence
// the grace must outlast the job's retransmissions (kRetireNever, the
// default, keeps tombstones for the engine's life).
//
// Trees. A ring may come with this box's part of a multi-rack tree
// (tree.h, install_ring(spec, tree)): the box then holds only its local
// ranks' packets, sends partials to its parent and results to its child
// boxes as box-to-box frames (wire/b2b.h) built in buffers from
// EngineConfig::allocator and appended to Sink::tx, and takes the frames
// addressed to it (UDP kB2bPort, classified not_roce_port) from the burst.
// With no tree installed a frame on that port is ordinary traffic
// (fwd_not_roce) as before.
//
// Threading: an Engine is owned by exactly one thread. process_burst() and
// process() are the hot path: no allocation, no locks, no logging, no
// exceptions. install_ring /
// remove_ring / expire_retired run on that same thread (the data plane applies control
// commands between bursts).
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
  wire::ParsedFrame p;
  wire::ParseStatus st = wire::ParseStatus::ok;
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
  // Until this time (process()'s clock), an INA first packet off every ring
  // link is dropped as ring_retired instead of forwarded: a box that has just
  // (re)started cannot know which rings it held, so it treats them all as
  // retired for one grace period (the data plane sets start + retire_grace).
  // 0: no such period (tests, the in-process loopback).
  uint64_t claim_all_until = 0;
  // The burst loop's software prefetches (engine.cc top): the CLT home slot,
  // history entry, cell, held records and result of later packets
  // (`prefetch_tables`), and the frame bytes two packets ahead
  // (`prefetch_frames`). engine-bench's BM_ColdTables measures them
  // (bench/README.md, issue #13): the table prefetch cost 10% with warm
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
