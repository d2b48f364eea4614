// Engine::Impl, the engine's state and the steps of its packet path, for
// the two files that define them: engine.cc (the burst loop, first and later
// packets, the cell state machine) and tree_path.cc (a tree node's
// box-to-box frames). Private to src/engine: nothing else includes it.
//
// The packet path is templated on ReduceMode and IcrcFixup (engine.cc's top
// says why); tree_path.cc instantiates the two steps engine.cc calls into it
// (box_frame, tree_full) for both fix-ups, declared `extern` below.
#pragma once

#include <cstddef>
#include <cstdint>

#include "engine/cells.h"
#include "engine/clt.h"
#include "engine/engine.h"
#include "engine/history.h"
#include "engine/icrc_fixup.h"
#include "engine/pass_table.h"
#include "engine/ring_state.h"
#include "wire/b2b.h"
#include "wire/ina.h"
#include "wire/parse.h"

namespace netreduce::engine {

using wire::ParsedFrame;
using namespace detail;  // the engine's own tables (ring_state.h, cells.h, history.h, ...)

// Line-aligned (and so a whole number of lines): the counters and table
// headers written per packet share no line with another worker's engine.
struct alignas(64) Engine::Impl {
  using BurstFn = unsigned (Impl::*)(const Frame*, unsigned, uint64_t, Outcome*, Sink&) noexcept;
  using FrameFn = Outcome (Impl::*)(const Frame&, uint64_t, Sink&) noexcept;

  EngineConfig cfg;
  Clt clt;
  PassTable pass;
  RingTable rings;
  ShiftCache shifts;  // linear fix-up only
  ReasonCounters counters{};
  TableStats stats{};
  BurstFn burst_fn = nullptr;
  FrameFn frame_fn = nullptr;
  // Per connection (a set of ways by hash), its first later packet of no
  // recorded message: when it comes again forward_unmatched_after after its
  // first drop, it is forwarded (Impl::unmatched).
  struct Unmatched {
    ConnKey key{};
    uint32_t psn = 0;    // the packet judged next
    uint32_t from = 0;   // the first of the run (forwarded from here on, once forwarding)
    uint64_t since = 0;  // the first drop of `from`
    uint64_t last = 0;   // the last arrival of a packet of the run
    bool used = false;
    bool forwarding = false;
  };
  static constexpr unsigned kUnmatchedSets = 256, kUnmatchedWays = 4;  // 40 KiB
  Unmatched unmatched_[kUnmatchedSets * kUnmatchedWays];
  // The box's addresses beyond this engine's trees (set_box_addresses).
  const uint32_t* box_ips = nullptr;
  size_t box_ips_n = 0;

  explicit Impl(const EngineConfig& c)
      : cfg(c), clt(c.clt_capacity), pass(c.pass_capacity), rings(cfg) {
    shifts.entries.resize(ShiftCache::kEntries);  // the fix-up's (linear) and the digests'
    select();
  }

  template <ReduceMode M, IcrcFixup F>
  void select_kernels() noexcept {
    burst_fn = &Impl::process_burst<M, F>;
    frame_fn = &Impl::process_frame<M, F>;
  }
  void select() noexcept {
    const bool lin = cfg.icrc_fixup == IcrcFixup::linear;
    if (cfg.mode == ReduceMode::deterministic)
      lin ? select_kernels<ReduceMode::deterministic, IcrcFixup::linear>()
          : select_kernels<ReduceMode::deterministic, IcrcFixup::full>();
    else
      lin ? select_kernels<ReduceMode::accumulate, IcrcFixup::linear>()
          : select_kernels<ReduceMode::accumulate, IcrcFixup::full>();
  }

  Outcome count(Reason r, Ring* ring = nullptr) noexcept {
    ++counters[static_cast<size_t>(r)];
    if (ring && fate_of(r) == Fate::drop) ++ring->counters.drops[static_cast<size_t>(r)];
    switch (fate_of(r)) {
      case Fate::forward:
        return {Verdict::forward, r};
      case Fate::drop:
        return {Verdict::drop, r};
      case Fate::aggregate:
        break;
    }
    return {Verdict::held, r};
  }

  void prefetch_conn(const Frame& f) const noexcept;
  static void prefetch_frame(const Frame& f) noexcept;
  void prefetch_cell(const Frame& f) noexcept;

  template <ReduceMode M, IcrcFixup F>
  unsigned process_burst(const Frame* frames, unsigned n, uint64_t now, Outcome* outcomes,
                         Sink& out) noexcept;
  template <ReduceMode M, IcrcFixup F>
  Outcome process_frame(const Frame& f, uint64_t now, Sink& out) noexcept;
  template <ReduceMode M, IcrcFixup F>
  Outcome first_packet(Pkt pkt, const ParsedFrame& p, const ConnKey& key, uint64_t now,
                       Sink& out) noexcept;
  Outcome ordinary_write(const uint8_t* f, const ParsedFrame& p, const ConnKey& key,
                         const LinkUse* link, uint32_t psn) noexcept;
  bool check_header(const Ring& ring, const wire::InaInfo& ina, const ParsedFrame& p,
                    const ConnKey& key, Reason& why) const noexcept;
  bool bind_conn(Ring& ring, uint32_t at, unsigned rank, const ConnKey& key, Clt::Slot* slot,
                 Reason& why) noexcept;
  bool record_first(Ring& ring, const wire::InaInfo& ina, uint32_t psn, Reason& why) noexcept;
  Outcome unmatched(const ConnKey& key, uint32_t psn, uint64_t now, Ring* ring) noexcept;
  bool stalled(const Ring& ring, size_t ci, uint64_t now) const noexcept;
  template <ReduceMode M, IcrcFixup F>
  Outcome later_packet(Pkt pkt, const ParsedFrame& p, const ConnKey& key, uint64_t now,
                       Sink& out) noexcept;
  template <ReduceMode M, IcrcFixup F>
  Outcome aggregate(Ring& ring, unsigned rank, const HistEntry& msg, uint32_t k, Pkt pkt,
                    const ParsedFrame& p, uint32_t head, uint64_t now, Sink& out) noexcept;
  template <ReduceMode M, IcrcFixup F>
  bool complete(Ring& ring, size_t ci, Cell& cell, Pkt in, unsigned in_rank,
                const ParsedFrame& in_p, uint16_t in_off, uint32_t in_head, Sink& out) noexcept;
  void reset_cell(Ring& ring, size_t ci, Cell& cell, uint32_t tag, Sink& out) noexcept;
  void open_cell(Ring& ring, Cell& cell, uint32_t msg_id, uint16_t msg_len, uint16_t data_len,
                 uint8_t dtype, uint8_t op, uint64_t now) noexcept;
  void finish_cell(Ring& ring, Cell& cell) noexcept;
  bool digest_imm(Ring& ring, size_t ci, uint32_t& imm) noexcept;
  void drop_held(Ring& ring, size_t ci, uint64_t ranks, Reason why, Sink& out) noexcept;

  // Tree nodes (tree.h).
  bool is_box_ip(uint32_t ip) const noexcept {
    if (rings.is_box_ip(ip)) return true;
    for (size_t i = 0; i < box_ips_n; ++i)
      if (box_ips[i] == ip) return true;
    return false;
  }
  template <IcrcFixup F>
  Outcome box_frame(const Frame& f, Reason ordinary, uint64_t now, Sink& out) noexcept;
  template <IcrcFixup F>
  Outcome partial_in(Ring& ring, TreeNode& t, const wire::B2bFrame& b, const uint8_t* frame,
                     uint64_t now, Sink& out) noexcept;
  template <IcrcFixup F>
  Outcome result_in(Ring& ring, const wire::B2bFrame& b, const uint8_t* frame, Sink& out) noexcept;
  Outcome query_in(Ring& ring, const wire::B2bInfo& in, Sink& out) noexcept;
  template <IcrcFixup F>
  void tree_full(Ring& ring, size_t ci, Cell& cell, Sink& out) noexcept;
  template <IcrcFixup F>
  void deliver(Ring& ring, size_t ci, Cell& cell, Sink& out) noexcept;
  Outcome resend_partial(Ring& ring, size_t ci, const Cell& cell, Sink& out) noexcept;
  bool send_b2b(Ring& ring, size_t ci, const Cell& cell, wire::B2bKind kind, const TreeBox& to,
                uint16_t child, Sink& out) noexcept;
};

extern template Outcome Engine::Impl::box_frame<IcrcFixup::linear>(const Frame&, Reason, uint64_t,
                                                                   Sink&) noexcept;
extern template Outcome Engine::Impl::box_frame<IcrcFixup::full>(const Frame&, Reason, uint64_t,
                                                                 Sink&) noexcept;
extern template void Engine::Impl::tree_full<IcrcFixup::linear>(Ring&, size_t, Cell&,
                                                                Sink&) noexcept;
extern template void Engine::Impl::tree_full<IcrcFixup::full>(Ring&, size_t, Cell&, Sink&) noexcept;

}  // namespace netreduce::engine
