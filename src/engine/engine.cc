// The engine's orchestration (engine.h): the burst loop, classification of
// each frame, first and later packets, the cell state machine's actions and
// completion. The pieces it drives live beside it: clt.h / pass_table.h
// (connection tables), history (message lookup), cells (cell records and
// cases), icrc_fixup (released packets' ICRC), ring_state (rings, links,
// tombstones), tree (a tree node's spec) and tree_path.cc (a tree node's
// packet path). Engine::Impl, shared with tree_path.cc, is engine_impl.h.
//
// Specialisation. The packet path is a template on ReduceMode and IcrcFixup
// instantiated four times; the constructor picks one instantiation through
// member function pointers (Impl::burst_fn, Impl::frame_fn), so the only
// configuration branch per packet left is ICRC verification on/off, and
// Engine::process_burst crosses the pimpl once per burst.
//
// Prefetch. While packet i is processed, the CLT slot of packet i + kAhead
// is prefetched, and for packet i + 1 (a later packet of a bound
// connection) the history entry of its rank's newest message and then, if
// it holds the PSN, the packet's cell, held-packet records and result.
// The frame bytes of packet i + kFrameAhead are prefetched too (the ICRC
// check reads every line): close enough that a burst of 4 KB frames does not
// push them out of L1 before use (the classify stage before the engine
// prefetches only headers).
// Prefetches are hints computed from the tables as they are: processing
// packet i may change them, which costs a wasted prefetch, never a wrong
// lookup.
// EngineConfig::prefetch_tables / prefetch_frames switch the two kinds; the
// table prefetch is off by default (it did not pay in engine-bench's
// BM_ColdTables, warm or cold:
// bench/README.md#engine-bench-per-packet-cost-of-the-aggregation-engine).
#include "engine/engine.h"

#include <algorithm>
#include <bit>
#include <cstring>

#include "engine/cells.h"
#include "engine/clt.h"
#include "engine/digest.h"
#include "engine/engine_impl.h"
#include "engine/history.h"
#include "engine/icrc_fixup.h"
#include "engine/pass_table.h"
#include "engine/ring_state.h"
#include "wire/b2b.h"
#include "wire/icrc.h"
#include "wire/opcode.h"
#include "wire/parse.h"
#include "wire/psn.h"

namespace netreduce::engine {

namespace {

constexpr uint8_t kWriteFirst = static_cast<uint8_t>(wire::Opcode::kWriteFirst);

// How far ahead of the packet being processed its CLT slot is prefetched.
constexpr unsigned kAhead = 4;
// How far ahead the frame bytes are prefetched (see the top).
constexpr unsigned kFrameAhead = 2;

ConnKey conn_key(const uint8_t* f, const ParsedFrame& p) noexcept {
  const auto* ip = reinterpret_cast<const wire::Ipv4Hdr*>(f + p.l3);
  const auto* bth = reinterpret_cast<const wire::Bth*>(f + p.bth);
  return {ip->src.host(), ip->dst.host(), bth->dest_qp.host()};
}

uint32_t psn_of(const uint8_t* f, const ParsedFrame& p) noexcept {
  return reinterpret_cast<const wire::Bth*>(f + p.bth)->psn.host();
}

bool aggregable(const Frame& f) noexcept {
  return f.status == wire::ParseStatus::ok && wire::is_rdma_write(f.parsed.opcode);
}

// The parse statuses a box-to-box frame can end in: UDP to another port
// than RoCE's, and the IPv4 defects parse_frame finds before it reads any
// port (a frame cut short of its IPv4 total length, a fragment).
bool may_be_box_frame(wire::ParseStatus st) noexcept {
  return st == wire::ParseStatus::not_roce_port || st == wire::ParseStatus::ip_total_length ||
         st == wire::ParseStatus::ip_fragment;
}

// ICRC verification of an arriving packet; the linear fix-up keeps the head
// CRC up to its data (icrc_fixup.h).
template <IcrcFixup F>
bool verify(const uint8_t* f, const ParsedFrame& p, uint16_t data_off, uint32_t& head) noexcept {
  if constexpr (F == IcrcFixup::linear) return wire::icrc_verify_head(f, p, data_off, head);
  return wire::icrc_verify(f, p);
}

}  // namespace

// ---- the burst loop ---------------------------------------------------------

void Engine::Impl::prefetch_frame(const Frame& f) noexcept {
  for (unsigned off = 0; off < f.pkt.len; off += 64) __builtin_prefetch(f.pkt.data + off);
}

void Engine::Impl::prefetch_conn(const Frame& f) const noexcept {
  if (!aggregable(f)) return;
  __builtin_prefetch(clt.home(conn_key(f.pkt.data, f.parsed)));
}

void Engine::Impl::prefetch_cell(const Frame& f) noexcept {
  if (!aggregable(f) || wire::is_write_first(f.parsed.opcode)) return;
  // The home slot only (prefetched kAhead packets ago): most keys sit there
  // at load 1/2, and a hint need not chase the rest of a cluster.
  const ConnKey key = conn_key(f.pkt.data, f.parsed);
  const Clt::Slot* s = clt.home(key);
  if (!s->used || !(s->key == key) || !s->ina()) return;
  Ring& ring = rings.at(s->owner);
  const RankConn& rc = ring.conns[s->rank];
  if (!rc.has_newest) return;
  const HistEntry& h = ring.hist_row(s->rank)[rc.newest & (ring.slots - 1)];
  const uint32_t psn = psn_of(f.pkt.data, f.parsed);
  if (!h.valid || h.msg_id != rc.newest || !wire::psn_in_range(psn, h.psn0, h.len)) return;
  const size_t ci = ring.cell_index(h.msg_id, wire::psn_distance(h.psn0, psn));
  __builtin_prefetch(&ring.cells[ci], 1);
  if (!ring.held.empty()) __builtin_prefetch(&ring.held[ci * ring.ranks], 1);
  __builtin_prefetch(ring.result_of(ci), 1);
}

template <ReduceMode M, IcrcFixup F>
unsigned Engine::Impl::process_burst(const Frame* frames, unsigned n, uint64_t now,
                                     Outcome* outcomes, Sink& out) noexcept {
  // Prefetch windows: 0 when the configuration turns a prefetch off, so the
  // loop keeps one shape (a compare per packet, no branch on the mode).
  const unsigned ahead = cfg.prefetch_tables ? kAhead : 0;
  const unsigned frame_ahead = cfg.prefetch_frames ? kFrameAhead : 0;
  const unsigned cell_ahead = cfg.prefetch_tables ? 1 : 0;
  for (unsigned j = 0; j < std::min(n, ahead); ++j) prefetch_conn(frames[j]);
  for (unsigned j = 0; j < std::min(n, frame_ahead); ++j) prefetch_frame(frames[j]);
  unsigned i = 0;
  for (; i < n; ++i) {
    if (Sink::kCapacity - out.ntx < kMaxRanks || Sink::kCapacity - out.ndrop < kMaxRanks) break;
    if (ahead && i + ahead < n) prefetch_conn(frames[i + ahead]);
    if (frame_ahead && i + frame_ahead < n) prefetch_frame(frames[i + frame_ahead]);
    if (cell_ahead && i + 1 < n) prefetch_cell(frames[i + 1]);
    const uint16_t before = out.ntx;
    outcomes[i] = process_frame<M, F>(frames[i], now, out);
    outcomes[i].released = static_cast<uint8_t>(out.ntx - before);
  }
  return i;
}

template <ReduceMode M, IcrcFixup F>
Outcome Engine::Impl::process_frame(const Frame& f, uint64_t now, Sink& out) noexcept {
  if (f.status != wire::ParseStatus::ok) {
    const Reason ordinary =
        wire::is_not_roce(f.status) ? Reason::fwd_not_roce : Reason::fwd_unparsed;
    // Box-to-box frames are UDP to another port: looked at only while the
    // box has a tree node, here or on another engine (then only trees exist
    // in deterministic mode). A cut-short or fragmented one fails parsing
    // before its port is read: it is looked at too.
    if (may_be_box_frame(f.status) && (rings.trees() != 0 || box_ips_n != 0))
      return box_frame<F>(f, ordinary, now, out);
    return count(ordinary);
  }
  if (!wire::is_rdma_write(f.parsed.opcode)) return count(Reason::fwd_not_write);
  const ConnKey key = conn_key(f.pkt.data, f.parsed);
  if (wire::is_write_first(f.parsed.opcode))
    return first_packet<M, F>(f.pkt, f.parsed, key, now, out);
  return later_packet<M, F>(f.pkt, f.parsed, key, now, out);
}

// ---- lookup -------------------------------------------------------------------

// An RDMA WRITE without an INA header. On a ring link, its PSN range is
// remembered so its later packets are forwarded too (elsewhere nothing needs
// tracking).
Outcome Engine::Impl::ordinary_write(const uint8_t* f, const ParsedFrame& p, const ConnKey& key,
                                     const LinkUse* link, uint32_t psn) noexcept {
  if (link) {
    if (const Clt::Slot* s = clt.find(key); s && s->retired()) return count(Reason::ring_retired);
    const uint32_t dma = reinterpret_cast<const wire::Reth*>(f + p.reth)->dma_length.host();
    const uint32_t per = std::max<uint32_t>(p.payload_len, 1);
    pass.add(key, psn, p.opcode == kWriteFirst ? std::max<uint32_t>(1, (dma + per - 1) / per) : 1);
  }
  return count(Reason::fwd_no_ina);
}

// A message's first packet: forwarded if it is not the box's (no INA
// header, or off every ring link), otherwise checked (ICRC, ring, header),
// its connection bound to (ring, rank), its message recorded, aggregated.
template <ReduceMode M, IcrcFixup F>
Outcome Engine::Impl::first_packet(Pkt pkt, const ParsedFrame& p, const ConnKey& key, uint64_t now,
                                   Sink& out) noexcept {
  const uint8_t* f = pkt.data;
  const uint32_t psn = psn_of(f, p);
  const std::optional<wire::InaInfo> ina = wire::ina_decode(f + p.payload, p.payload_len);
  const LinkUse* link = rings.link(key.src, key.dst);
  if (!ina) return ordinary_write(f, p, key, link, psn);
  // The box only claims traffic on ring links: elsewhere a payload that
  // happens to begin with the magic is somebody's data, passed untouched
  // before anything else looks at it, from the box's first packet on. A
  // restarted box does the same with a job of its previous instance: that
  // job's receivers reject the raw data, which lacks the box's seal
  // (docs/design.md#result-digests).
  if (!link) return count(Reason::fwd_not_ring_link);
  uint32_t head = 0;
  if (cfg.verify_icrc && !verify<F>(f, p, static_cast<uint16_t>(p.payload + kInaHeaderBytes), head))
    return count(Reason::bad_icrc);

  Clt::Slot* slot = clt.find(key);
  const int at = rings.find(ina->ring_id);
  if (at < 0) {
    // Nothing may bind on a removed ring's connection or on a link that only
    // removed rings use: its job is failing on purpose.
    if ((slot && slot->retired()) || link->live == 0) return count(Reason::ring_retired);
    return count(Reason::unknown_ring);
  }
  Ring& ring = rings.at(static_cast<uint32_t>(at));
  Reason why{};
  if (!check_header(ring, *ina, p, key, why) ||
      !bind_conn(ring, static_cast<uint32_t>(at), ina->rank, key, slot, why) ||
      !record_first(ring, *ina, psn, why))
    return count(why, &ring);
  const HistEntry& msg = ring.hist_row(ina->rank)[ina->msg_id & (ring.slots - 1)];
  return aggregate<M, F>(ring, ina->rank, msg, 0, pkt, p, head, now, out);
}

// The INA header of a first packet against its ring and connection; false
// with the reason if it does not fit.
bool Engine::Impl::check_header(const Ring& ring, const wire::InaInfo& ina, const ParsedFrame& p,
                                const ConnKey& key, Reason& why) const noexcept {
  if (ina.version != wire::kInaVersion || ina.rank >= ring.ranks || ina.msg_len == 0 ||
      ina.msg_len > ring.msg_len || (p.opcode != kWriteFirst && ina.msg_len != 1) ||
      (p.opcode == kWriteFirst && ina.msg_len < 2) || !wire::is_valid_dtype(ina.dtype) ||
      !wire::is_valid_op(ina.op))
    return (why = Reason::bad_ina_header, false);
  if (key.src != ring.spec.members[ina.rank] ||
      key.dst != ring.spec.members[(ina.rank + 1) % ring.ranks])
    return (why = Reason::rank_address_mismatch, false);
  // A ring that gave its QP numbers is dispatched by them (the data plane
  // splits its links over workers): a first packet on another QP binds
  // nowhere, or a worker could hold connections dispatch never sends it.
  if (!ring.spec.qpns.empty() && key.qpn != ring.spec.qpns[(ina.rank + 1) % ring.ranks])
    return (why = Reason::qpn_mismatch, false);
  if (!ring.spec.allows_dtype(ina.dtype) || !ring.spec.allows_op(ina.op))
    return (why = Reason::dtype_mismatch, false);
  // A tree node holds its local ranks only (their links are the only ones
  // installed; this catches a rank that shares a local rank's address).
  if (!((ring.all_ranks >> ina.rank) & 1)) return (why = Reason::rank_address_mismatch, false);
  return true;
}

// Binds the connection (`slot`: its CLT slot, if any) to (ring `at`,
// `rank`); a rank whose QP changed is rebound. False with the reason if it
// may not bind.
bool Engine::Impl::bind_conn(Ring& ring, uint32_t at, unsigned rank, const ConnKey& key,
                             Clt::Slot* slot, Reason& why) noexcept {
  RankConn& rc = ring.conns[rank];
  // A removed ring's connection never binds again while its tombstone lasts,
  // whatever ring it names: the same id re-installed cannot tell the old
  // run's go-back-N resends from the new run's packets, and letting the old
  // run bind a rank first would put its stale data into the new run's cells.
  // A new run uses new QPs; a QP number the host reuses within the grace
  // fails that run loudly (its probe all-reduce falls back to the ring).
  if (slot && slot->retired()) return (why = Reason::ring_retired, false);
  if (slot && slot->ina() && (slot->owner != at || slot->rank != rank)) {
    rings.unbind(rings.at(slot->owner), slot->rank,
                 clt);  // the key now belongs to another ring/rank
    slot = nullptr;
  }
  if (slot) return true;
  if (rc.bound) {
    rings.unbind(ring, rank, clt);
    ++ring.counters.connections_rebound;
  }
  slot = clt.insert(key);
  if (!slot) return (why = Reason::clt_full, false);
  slot->state = ConnState::ina;
  slot->owner = at;
  slot->rank = static_cast<uint8_t>(rank);
  rc.key = key;
  rc.bound = true;
  return true;
}

// Records the first packet's message in its rank's history; never lets an
// older message replace newer history. False with the reason if refused.
bool Engine::Impl::record_first(Ring& ring, const wire::InaInfo& ina, uint32_t psn,
                                Reason& why) noexcept {
  switch (record_message(ring.hist_row(ina.rank), ring.slots, ring.conns[ina.rank],
                         HistEntry{ina.msg_id, psn, ina.msg_len, ina.dtype, ina.op, true})) {
    case Recorded::changed:
      return (why = Reason::malformed, false);  // same message, different shape
    case Recorded::stale:
      return (why = Reason::stale_message, false);
    case Recorded::added:
    case Recorded::same:
      break;
  }
  return true;
}

// A later packet that no recorded message holds: its message's first
// packet is behind it (lost or reordered), or passed while the box was
// bypassed or before it started. Dropped: the sender resends from the
// first missing packet, which repairs the first case. In the others the
// first packet never comes again and only this one is resent, for as long
// as the sender retries; so once a connection's stuck packet comes again
// forward_unmatched_after after its first drop, it is forwarded, and so is
// the rest of that run. Raw data of an INA message then fails its seal at
// the receiver (its host fails over); an ordinary write arrives as sent.
Outcome Engine::Impl::unmatched(const ConnKey& key, uint32_t psn, uint64_t now,
                                Ring* ring) noexcept {
  const uint64_t after = cfg.forward_unmatched_after;
  if (after == kRetireNever || (ring && ring->tree)) return count(Reason::first_packet_lost, ring);
  // The connection's record: its first unmatched packet, the one its sender
  // resends first. A new connection takes a free way of its set, else one
  // whose packets stopped coming twice the wait ago, so stuck connections
  // that share a set do not push each other out (each resend would start
  // the wait again).
  const auto quiet = [&](const Unmatched& x) { return now < x.last || now - x.last >= 2 * after; };
  const uint64_t set_no = uint64_t{hash_key(key)} * kUnmatchedSets >> 32;  // the hash's high bits
  Unmatched* set = &unmatched_[set_no * kUnmatchedWays];
  Unmatched *u = nullptr, *spare = nullptr;
  for (unsigned w = 0; w < kUnmatchedWays; ++w) {
    Unmatched& x = set[w];
    if (x.used && x.key == key) {
      u = &x;
      continue;
    }
    const bool takeable = !x.used || quiet(x);
    const bool better = !spare || (spare->used && (!x.used || x.last < spare->last));
    if (takeable && better) spare = &x;
  }
  if (!u) {
    if (spare) *spare = {key, psn, psn, now, now, true, false};
    return count(Reason::first_packet_lost, ring);
  }
  // Once the record's packet has waited, it and every later packet of the
  // run go (a sender that moved past it resends from further on), and so do
  // resends of those already forwarded. An earlier packet, or a later one
  // after a quiet spell, starts a new record.
  const bool waited = now >= u->since && now - u->since >= after;
  if (u->forwarding && wire::psn_in_range(psn, u->from, wire::psn_distance(u->from, u->psn))) {
    u->last = now;
    return count(Reason::fwd_unmatched);
  }
  const bool later = wire::psn_before(u->psn, psn);
  if (psn == u->psn || (later && waited && !quiet(*u))) {
    u->last = now;
    if (waited) {
      u->forwarding = true;
      u->psn = wire::psn_add(psn, 1);
      return count(Reason::fwd_unmatched);
    }
  } else if (!later || quiet(*u)) {
    *u = {key, psn, psn, now, now, true, false};
  }
  return count(Reason::first_packet_lost, ring);
}

// A resend the box cannot answer (a duplicate of a held packet, or a last
// packet whose message is incomplete here) for a message that has waited
// forward_stalled_after since its first packet came: the other ranks'
// packets passed while the box was bypassed or before it started, or a rank
// is that late. Forwarded untouched, it fails its seal at the receiver and
// the hosts fail over; held, it would be resent until its queue pair errs.
// Only the rank's own resends go: what the cell holds stays, and a packet
// that completes it later still releases the sum.
bool Engine::Impl::stalled(const Ring& ring, size_t ci, uint64_t now) const noexcept {
  const uint64_t after = cfg.forward_stalled_after;
  const uint64_t since = ring.cells[ci].first_at;
  return after != kRetireNever && !ring.tree && now >= since && now - since >= after;
}

template <ReduceMode M, IcrcFixup F>
Outcome Engine::Impl::later_packet(Pkt pkt, const ParsedFrame& p, const ConnKey& key, uint64_t now,
                                   Sink& out) noexcept {
  Clt::Slot* s = clt.find(key);
  const uint32_t psn = psn_of(pkt.data, p);
  if (!s || !s->ina()) {
    // Not an INA connection (yet). On a ring link the packet may belong to
    // an INA message whose first packet has not passed: forwarding it would
    // let the receiver take unreduced data. Only known non-INA messages and
    // links no ring (installed or retired) uses are forwarded.
    if (s) return count(Reason::ring_retired);
    const LinkUse* link = rings.link(key.src, key.dst);
    if (!link || pass.contains(key, psn)) return count(Reason::fwd_no_ina);
    return link->live ? unmatched(key, psn, now, nullptr) : count(Reason::ring_retired);
  }
  Ring& ring = rings.at(s->owner);
  const unsigned rank = s->rank;
  const HistEntry* found =
      find_message(ring.hist_row(rank), ring.slots, ring.conns[rank], psn, stats);
  if (!found) {
    if (pass.contains(key, psn)) return count(Reason::fwd_no_ina);
    return unmatched(key, psn, now, &ring);
  }
  uint32_t head = 0;
  if (cfg.verify_icrc && !verify<F>(pkt.data, p, p.payload, head))
    return count(Reason::bad_icrc, &ring);
  const uint32_t k = wire::psn_distance(found->psn0, psn);
  return aggregate<M, F>(ring, rank, *found, k, pkt, p, head, now, out);
}

// ---- aggregate (the cases of cells.h) ---------------------------------------

template <ReduceMode M, IcrcFixup F>
Outcome Engine::Impl::aggregate(Ring& ring, unsigned rank, const HistEntry& msg, uint32_t k,
                                Pkt pkt, const ParsedFrame& p, uint32_t head, uint64_t now,
                                Sink& out) noexcept {
  // Opcode must fit the position: FIRST/ONLY at 0, LAST/ONLY at len-1, MIDDLE between.
  const bool first = wire::is_write_first(p.opcode);
  const bool last = wire::is_write_last(p.opcode);
  if (first != (k == 0) || last != (k + 1 == msg.len)) return count(Reason::malformed, &ring);
  if (p.payload_len > ring.spec.payload_bytes) return count(Reason::length_mismatch, &ring);
  const uint16_t hdr = first ? kInaHeaderBytes : 0;
  const uint16_t data_off = static_cast<uint16_t>(p.payload + hdr);
  const uint16_t data_len = static_cast<uint16_t>(p.payload_len - hdr);
  const size_t esize = wire::dtype_size(msg.dtype);
  if (data_len % esize != 0) return count(Reason::malformed, &ring);

  const size_t ci = ring.cell_index(msg.msg_id, k);
  Cell& cell = ring.cells[ci];
  const uint64_t bit = uint64_t{1} << rank;

  const CellCase c = cell_case(cell, msg.msg_id, bit);
  if (c == CellCase::stale) return count(Reason::stale_message, &ring);   // case 5
  if (c == CellCase::reset) reset_cell(ring, ci, cell, msg.msg_id, out);  // case 4
  if (cell.state == CellState::empty)
    open_cell(ring, cell, msg.msg_id, msg.len, data_len, msg.dtype, msg.op, now);
  if (cell.data_len != data_len) return count(Reason::length_mismatch, &ring);
  if (cell.dtype != msg.dtype || cell.op != msg.op) return count(Reason::dtype_mismatch, &ring);
  if (!cfg.verify_icrc) head = head_crc<F>(pkt.data, p, data_off);

  if (c == CellCase::serve) {  // case 1: the stored result
    // A message's last packet leaves sealed or not at all (digest.h).
    uint32_t imm = 0;
    if (last && !digest_imm(ring, ci, imm))
      return stalled(ring, ci, now) ? count(Reason::fwd_stalled)
                                    : count(Reason::message_incomplete, &ring);
    std::memcpy(pkt.data + data_off, ring.result_of(ci), data_len);
    if (p.immdt) seal<F>(pkt.data, p, data_off, imm, head);
    fix_icrc<F>(shifts, pkt.data, p, data_off, data_len, cell.crc, head);
    ++ring.counters.retransmissions_served;
    ++counters[static_cast<size_t>(Reason::served_from_cell)];
    return {Verdict::emit, Reason::served_from_cell};
  }
  if (c == CellCase::duplicate) {  // case 2
    // A tree node's cell awaiting its result: the workers are resending.
    if (cell.state == CellState::awaiting) return resend_partial(ring, ci, cell, out);
    return stalled(ring, ci, now) ? count(Reason::fwd_stalled) : count(Reason::duplicate, &ring);
  }

  // Case 3: take it.
  ++ring.counters.packets_aggregated;
  ring.counters.bytes_aggregated += data_len;
  cell.arrived |= bit;
  const bool completes = cell.arrived == ring.all_ranks && cell.boxes == ring.all_boxes;
  const size_t hi = ci * ring.ranks + rank;
  if constexpr (M == ReduceMode::accumulate) {
    const auto& kern = reduce::kernels(cfg.isa, static_cast<wire::Dtype>(cell.dtype),
                                       static_cast<wire::ReduceOp>(cell.op));
    void* acc = ring.acc_of(ci);
    const size_t elems = data_len / esize;
    if (cell.arrived == bit)
      kern.init(acc, pkt.data + data_off, elems);
    else
      kern.add(acc, pkt.data + data_off, elems);
    if (!completes) {
      store_header(ring.hdrs[hi], pkt, p, data_off, data_len, head);
      ++counters[static_cast<size_t>(Reason::held)];
      return {Verdict::consumed, Reason::held};
    }
  } else if (!completes || ring.tree) {
    ring.held[hi] = Held{pkt, p, data_off, head};
    ++ring.held_packets;
    ring.held_bytes += pkt.len;
    ++counters[static_cast<size_t>(Reason::held)];
    if (completes) tree_full<F>(ring, ci, cell, out);  // a tree node: held like the others
    return {Verdict::held, Reason::held};
  }
  if (!complete<M, F>(ring, ci, cell, pkt, rank, p, data_off, head, out))
    return count(Reason::message_incomplete, &ring);
  ++counters[static_cast<size_t>(Reason::held)];
  return {Verdict::held, Reason::held};
}

// Reduces a cell's P packets and releases them with the result. A message's
// last cell whose message is not complete here releases nothing (digest.h):
// its held packets are dropped and false returned (the caller drops `in`).
template <ReduceMode M, IcrcFixup F>
bool Engine::Impl::complete(Ring& ring, size_t ci, Cell& cell, Pkt in, unsigned in_rank,
                            const ParsedFrame& in_p, uint16_t in_off, uint32_t in_head,
                            Sink& out) noexcept {
  const size_t elems = cell.data_len / wire::dtype_size(cell.dtype);
  uint8_t* result = ring.result_of(ci);
  const auto& kern = reduce::kernels(cfg.isa, static_cast<wire::Dtype>(cell.dtype),
                                     static_cast<wire::ReduceOp>(cell.op));
  Held* held = M == ReduceMode::deterministic ? ring.held.data() + ci * ring.ranks : nullptr;
  if constexpr (M == ReduceMode::deterministic) {
    const uint8_t* srcs[kMaxRanks];
    for (unsigned r = 0; r < ring.ranks; ++r)
      srcs[r] = r == in_rank ? in.data + in_off : held[r].pkt.data + held[r].data_off;
    kern.reduce(srcs, ring.ranks, result, elems);
  } else {
    kern.finish(ring.acc_of(ci), result, elems);
  }
  cell.crc = wire::crc32(0, result, cell.data_len);
  finish_cell(ring, cell);
  uint32_t imm = 0;
  if (wire::is_write_last(in_p.opcode) && !digest_imm(ring, ci, imm)) {
    drop_held(ring, ci, cell.arrived & ~(uint64_t{1} << in_rank), Reason::message_incomplete, out);
    return false;
  }

  for (unsigned r = 0; r < ring.ranks; ++r) {
    Pkt& pk = out.tx[out.ntx];  // filled in place: no Pkt staged on the stack
    const ParsedFrame* pf;
    uint16_t off;
    uint32_t head;
    if (r == in_rank) {
      pk = in;
      pf = &in_p;
      off = in_off;
      head = in_head;
    } else if constexpr (M == ReduceMode::deterministic) {
      Held& h = held[r];
      pk = h.pkt;
      pf = &h.parsed;
      off = h.data_off;
      head = h.head_crc;
      h.pkt.data = nullptr;  // the slot is free (release_all skips it)
      --ring.held_packets;
      ring.held_bytes -= pk.len;
    } else {
      const StoredHdr& sh = ring.hdrs[ci * ring.ranks + r];
      pk = cfg.allocator.alloc(cfg.allocator.ctx, sh.frame_len);
      if (!pk.data) {
        ++counters[static_cast<size_t>(Reason::alloc_failed)];
        ++ring.counters.drops[static_cast<size_t>(Reason::alloc_failed)];
        continue;  // the worker will retransmit and be served from the cell
      }
      pk.len = sh.frame_len;
      pk.meta = sh.meta;
      rebuild_header(sh, cell.data_len, pk.data);
      pf = &sh.parsed;
      off = sh.data_off;
      head = sh.head_crc;
    }
    std::memcpy(pk.data + off, result, cell.data_len);
    if (pf->immdt) seal<F>(pk.data, *pf, off, imm, head);
    fix_icrc<F>(shifts, pk.data, *pf, off, cell.data_len, cell.crc, head);
    ++out.ntx;
  }
  return true;
}

void Engine::Impl::open_cell(Ring& ring, Cell& cell, uint32_t msg_id, uint16_t msg_len,
                             uint16_t data_len, uint8_t dtype, uint8_t op, uint64_t now) noexcept {
  cell.tag = msg_id;
  cell.arrived = 0;
  cell.boxes = 0;
  cell.data_len = data_len;
  cell.dtype = dtype;
  cell.op = op;
  cell.first_at = now;
  cell.state = CellState::collecting;
  ++ring.open_cells;
  MsgSlot& ms = ring.msgs[msg_id & (ring.slots - 1)];
  if (!ms.valid || ms.tag != msg_id) ms = MsgSlot{msg_id, msg_len, 0, true};
}

void Engine::Impl::finish_cell(Ring& ring, Cell& cell) noexcept {
  cell.state = CellState::complete;
  --ring.open_cells;
  ++ring.counters.cells_completed;
  MsgSlot& ms = ring.msgs[cell.tag & (ring.slots - 1)];
  if (ms.valid && ms.tag == cell.tag && ++ms.cells_done == ms.len)
    ++ring.counters.messages_completed;
}

// The ImmDt that seals the message whose last cell is ci (digest.h); false
// while an earlier cell of the message is not complete here.
bool Engine::Impl::digest_imm(Ring& ring, size_t ci, uint32_t& imm) noexcept {
  uint32_t crc = 0;
  if (!message_crc(ring, ci, shifts, crc)) return false;
  ++ring.counters.messages_sealed;
  imm = ring.cells[ci].tag ^ crc;
  return true;
}

// Counts the packets of `ranks` (a bitmap of ranks that arrived in cell ci)
// as dropped for `why`, and hands back those the cell holds (deterministic
// mode; accumulate mode consumed them on arrival).
void Engine::Impl::drop_held(Ring& ring, size_t ci, uint64_t ranks, Reason why,
                             Sink& out) noexcept {
  const auto r_why = static_cast<size_t>(why);
  for (unsigned r = 0; r < ring.ranks; ++r) {
    if (!(ranks >> r & 1)) continue;
    ++counters[r_why];
    ++ring.counters.drops[r_why];
    if (ring.held.empty()) continue;
    Held& h = ring.held[ci * ring.ranks + r];
    out.drop[out.ndrop++] = h.pkt;
    --ring.held_packets;
    ring.held_bytes -= h.pkt.len;
    h = Held{};
  }
}

void Engine::Impl::reset_cell(Ring& ring, size_t ci, Cell& cell, uint32_t tag, Sink& out) noexcept {
  if (cell.state == CellState::collecting || cell.state == CellState::awaiting) {
    --ring.open_cells;
    // Only a worker that broke rule W reuses a cell others still wait on.
    drop_held(ring, ci, cell.arrived, Reason::evicted_incomplete, out);
  }
  cell = Cell{};
  cell.tag = tag;
}

// ---------------------------------------------------------------------------

Engine::Engine(const EngineConfig& config) : impl_(std::make_unique<Impl>(config)) {}
Engine::~Engine() = default;

Status Engine::install_ring(const RingSpec& spec) {
  PreparedRing r;
  if (Status s = prepare_ring(impl_->cfg, spec, r); !s) return s;
  return install_ring(r);
}

Status Engine::install_ring(const RingSpec& spec, const TreeSpec& tree) {
  PreparedRing r;
  if (Status s = prepare_ring(impl_->cfg, spec, &tree, r); !s) return s;
  return install_ring(r);
}

Status Engine::prepare_ring(const EngineConfig& cfg, const RingSpec& spec, PreparedRing& out) {
  return detail::RingTable::prepare(cfg, spec, nullptr, out);
}

Status Engine::prepare_ring(const EngineConfig& cfg, const RingSpec& spec, const TreeSpec* tree,
                            PreparedRing& out) {
  return detail::RingTable::prepare(cfg, spec, tree, out);
}

Status Engine::install_ring(PreparedRing& ring) { return impl_->rings.install(ring); }

Status Engine::remove_ring(uint32_t ring_id, uint64_t now, std::vector<Pkt>& released,
                           PreparedRing* detached) {
  return impl_->rings.remove(ring_id, now, impl_->clt, released, impl_->counters, detached);
}

unsigned Engine::expire_retired(uint64_t now) noexcept {
  return impl_->rings.expire(now, impl_->clt);
}

size_t Engine::retired_count() const noexcept { return impl_->rings.retired_count(); }

std::vector<RetiredRing> Engine::retired_rings() const {
  return impl_->rings.retired_rings(impl_->clt);
}

Outcome Engine::process(Pkt pkt, uint64_t now, Sink& out) noexcept {
  Frame f;
  classify(pkt, f);
  return (impl_.get()->*impl_->frame_fn)(f, now, out);
}

void Engine::classify(Pkt pkt, Frame& f) noexcept {
  f.pkt = pkt;
  f.status = wire::parse_frame(pkt.data, pkt.len, f.parsed);
}

unsigned Engine::process_burst(const Frame* frames, unsigned n, uint64_t now, Outcome* outcomes,
                               Sink& out) noexcept {
  return (impl_.get()->*impl_->burst_fn)(frames, n, now, outcomes, out);
}

void Engine::set_box_addresses(const uint32_t* ips, size_t n) noexcept {
  impl_->box_ips = n ? ips : nullptr;
  impl_->box_ips_n = n;
}

std::vector<uint32_t> Engine::ring_ids() const { return impl_->rings.ids(); }
size_t Engine::ring_count() const noexcept { return impl_->rings.count(); }
std::optional<RingInfo> Engine::ring_info(uint32_t ring_id, uint64_t now, uint64_t stall) const {
  return impl_->rings.info(ring_id, now, stall);
}
unsigned Engine::ring_figures(RingFigures* out, unsigned cap, uint64_t now,
                              uint64_t stall) const noexcept {
  return impl_->rings.figures(out, cap, now, stall);
}
const ReasonCounters& Engine::counters() const noexcept { return impl_->counters; }
TableStats Engine::table_stats() const noexcept {
  TableStats t = impl_->stats;
  t.clt_entries = impl_->clt.size();
  t.pass_evictions = impl_->pass.evictions();
  return t;
}
uint64_t Engine::memory_in_use() const noexcept { return impl_->rings.memory(); }
const EngineConfig& Engine::config() const noexcept { return impl_->cfg; }

}  // namespace netreduce::engine
