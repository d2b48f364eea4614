// The aggregation engine: plain C++ over packet buffers, no EAL. The DPDK
// data plane runs one Engine per lcore; tests and benchmarks run it directly.
//
// Theory of operation (DESIGN.md sections 3-5):
//
// Classification. process() parses the frame. Non-RoCE traffic, RoCE it does
// not aggregate (ACK/NAK/CNP/SEND/READ, UC/UD, malformed) and RDMA WRITEs
// that are not INA messages are returned as `forward`: untouched. Corrupted
// INA packets (ICRC, when verification is on) are dropped before they reach
// a sum.
//
// CLT. The first packet of a message (WRITE FIRST/ONLY with the INA magic)
// names ring, rank and message id. The source address must be the rank's
// registered address. The connection (src IP, dst IP, dst QPN) is bound to
// (ring, rank) and the message's (msg_id, psn0, packets) is recorded in the
// rank's history of S messages, indexed by msg_id mod S and never overwritten
// by an older message. A later packet finds the recorded message whose PSN
// range contains it, newest first, and so its offset k. Go-back-N resends of
// message m-1 after m's first packet still find m-1. No such message means
// its first packet was lost: drop, and the receiver NAKs.
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
// computes the CRC of the result payload once per cell and per packet only
// the CRC of its headers, combined through CRC linearity (wire/icrc.h):
// O(header) per packet instead of O(payload).
//
// Threading: an Engine is owned by exactly one thread. process() is the hot
// path: no allocation, no locks, no logging, no exceptions. install_ring /
// remove_ring run on that same thread (the data plane applies control
// commands between bursts).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "common/status.h"
#include "engine/reasons.h"
#include "engine/ring.h"
#include "reduce/reduce.h"

namespace netreduce::engine {

// A packet buffer. `handle` is the caller's (an rte_mbuf*, a test buffer).
struct Pkt {
  uint8_t* data = nullptr;
  uint16_t len = 0;
  void* handle = nullptr;
  uint16_t meta = 0;  // the caller's tag (the data plane: RX port); carried onto rebuilt packets
};

// Packets handed back by one process() call, besides the verdict on the
// input packet itself.
struct Sink {
  static constexpr unsigned kCapacity = kMaxRanks;
  Pkt tx[kCapacity];    // transmit: released (rewritten) packets
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

struct EngineConfig {
  ReduceMode mode = ReduceMode::deterministic;
  IcrcFixup icrc_fixup = IcrcFixup::linear;
  bool verify_icrc = true;
  unsigned max_rings = 64;
  unsigned clt_capacity = 4096;       // connections; rounded up to a power of two
  uint64_t memory_budget = 1ull << 30;  // bytes over all rings
  reduce::Isa isa = reduce::best_isa();
  Allocator allocator{};  // required in accumulate mode
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
};

struct RingCounters {
  uint64_t packets_aggregated = 0;  // packets taken into a cell (held or accumulated)
  uint64_t bytes_aggregated = 0;    // data bytes of those packets
  uint64_t cells_completed = 0;
  uint64_t messages_completed = 0;
  uint64_t retransmissions_served = 0;  // emitted from a completed cell
  uint64_t connections_rebound = 0;     // a rank's connection replaced by a new QP
  ReasonCounters drops{};               // drops attributed to this ring, by reason
};

struct RingInfo {
  RingSpec spec;
  RingCounters counters;
  uint32_t slots = 0;          // S
  uint64_t memory_bytes = 0;   // reserved for the ring (its quota accounting)
  uint32_t held_packets = 0;   // packets currently held (deterministic mode)
  uint64_t held_bytes = 0;     // their frame bytes
  uint32_t open_cells = 0;     // cells collecting (some but not all ranks arrived)
  uint32_t stalled_cells = 0;  // of those, collecting for longer than the asked timeout
};

class Engine {
 public:
  explicit Engine(const EngineConfig& config);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Installs a ring. The same spec again is a no-op (ok); a different spec
  // under an installed id is a conflict. Refused, with the field named, when
  // invalid, over its quota, or over the engine's memory budget.
  Status install_ring(const RingSpec& spec);
  // Removes a ring and returns its held packets for the caller to free
  // (counted as ring_removed). not_found if no such ring.
  Status remove_ring(uint32_t ring_id, std::vector<Pkt>& released);

  // The hot path. `now_ns` is any monotonic clock (stall accounting).
  Outcome process(Pkt pkt, uint64_t now_ns, Sink& out) noexcept;

  std::vector<uint32_t> ring_ids() const;
  size_t ring_count() const noexcept;
  std::optional<RingInfo> ring_info(uint32_t ring_id, uint64_t now_ns = 0, uint64_t stall_ns = 0) const;
  const ReasonCounters& counters() const noexcept;
  uint64_t memory_in_use() const noexcept;
  const EngineConfig& config() const noexcept;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace netreduce::engine
