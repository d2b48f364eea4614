#include "engine/engine.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <unordered_map>

#include "engine/tables.h"
#include "wire/icrc.h"
#include "wire/opcode.h"
#include "wire/parse.h"
#include "wire/psn.h"

namespace netreduce::engine {

namespace {

using wire::ParsedFrame;
constexpr uint8_t kWriteFirst = static_cast<uint8_t>(wire::Opcode::kWriteFirst);

using detail::Clt;
using detail::ConnKey;
using detail::ConnState;
using detail::PassTable;

// ---- per-ring state --------------------------------------------------------
struct HistEntry {
  uint32_t msg_id = 0;
  uint32_t psn0 = 0;
  uint16_t len = 0;  // packets
  uint8_t dtype = 0;
  uint8_t op = 0;
  bool valid = false;
};

struct RankConn {
  ConnKey key;
  bool bound = false;
  bool has_newest = false;
  uint32_t newest = 0;  // newest recorded msg_id
  uint32_t hint = 0;    // msg_id the last later packet found (history lookup step 2)
};

// History reads a later packet may cost at most (find_message): newest +
// hint + a binary search over S <= 2048 slots (11) leaves room for skipping
// a few unrecorded slots.
constexpr unsigned kHistoryProbeBudget = 24;

enum class CellState : uint8_t { empty, collecting, complete };

struct Cell {
  uint64_t arrived = 0;   // bitmap over ranks
  uint64_t first_ns = 0;  // first arrival, for stall reporting
  uint32_t tag = 0;       // msg_id
  uint16_t data_len = 0;  // data bytes per packet (excludes the INA header)
  uint8_t dtype = 0;
  uint8_t op = 0;
  CellState state = CellState::empty;
};

struct MsgSlot {
  uint32_t tag = 0;
  uint16_t len = 0;
  uint16_t cells_done = 0;
  bool valid = false;
};

struct Held {
  Pkt pkt;
  ParsedFrame p;
  uint16_t data_off = 0;
};

// Accumulate mode: what it takes to rebuild a released packet. The bytes
// before the data are at most Ethernet + 2 VLAN tags + IPv4 + UDP + BTH +
// RETH + ImmDt + INA header (the parser refuses IP options).
constexpr size_t kMaxDataOffset = 14 + 8 + 20 + 8 + 12 + 16 + 4 + kInaHeaderBytes;
constexpr size_t kHdrStore = 128;
static_assert(kMaxDataOffset <= kHdrStore);
struct StoredHdr {
  ParsedFrame p;
  uint16_t meta = 0;
  uint16_t frame_len = 0;
  uint16_t data_off = 0;
  uint8_t pad_bytes[4] = {};
  uint8_t bytes[kHdrStore];
};

// Shift operators for the linear ICRC fix-up, by data length. A ring sees
// few lengths (full first packets, full middle packets, each message's last
// packet), so four entries replaced round-robin almost never miss; a miss
// rebuilds one table (about 2 us).
struct ShiftCache {
  static constexpr unsigned kEntries = 4;
  std::vector<wire::Crc32Shift> entries;  // sized at ring installation
  unsigned next = 0;
  const wire::Crc32Shift& get(uint32_t len) noexcept {
    for (const auto& e : entries)
      if (e.len() == len) return e;
    wire::Crc32Shift& e = entries[next++ % kEntries];
    e.set(len);
    return e;
  }
};

struct Ring {
  RingSpec spec;
  unsigned p = 0;
  uint32_t slots = 0;  // S
  uint32_t msg_len = 0;
  uint64_t memory = 0;
  std::vector<Cell> cells;      // S * msg_len
  std::vector<MsgSlot> msgs;    // S
  std::vector<HistEntry> hist;  // P * S
  std::vector<RankConn> conns;  // P
  std::vector<Held> held;       // deterministic: S * msg_len * P
  std::vector<StoredHdr> hdrs;  // accumulate: S * msg_len * P
  std::vector<uint8_t> acc;     // accumulate: S * msg_len * 2 * payload_bytes
  std::vector<uint8_t> result;  // S * msg_len * payload_bytes
  RingCounters counters;
  uint32_t held_packets = 0;
  uint64_t held_bytes = 0;
  ShiftCache shifts;
  bool active = false;

  size_t cell_index(uint32_t msg_id, uint32_t k) const noexcept {
    return size_t{msg_id & (slots - 1)} * msg_len + k;
  }
  uint8_t* result_of(size_t ci) noexcept { return result.data() + ci * spec.payload_bytes; }
  uint8_t* acc_of(size_t ci) noexcept { return acc.data() + ci * 2 * spec.payload_bytes; }
};

// A removed ring during its grace period: the connections that were bound
// to it (their CLT entries are `retired`, owner = this tombstone's index
// unless a live ring has re-bound them since) and its links. Written by
// remove_ring and expire_retired only (control work on the engine's thread);
// the packet path reads only the CLT state and the link counts.
struct Tombstone {
  uint32_t ring_id = 0;
  uint64_t expires = kRetireNever;
  std::vector<ConnKey> conns;
  std::vector<uint64_t> links;
  bool used = false;
};

// How many installed rings and tombstones use a link (rank r -> rank r+1).
struct LinkUse {
  uint32_t live = 0;
  uint32_t retired = 0;
};

}  // namespace

struct Engine::Impl {
  EngineConfig cfg;
  Clt clt;
  PassTable pass;
  std::vector<Ring> rings;  // fixed array of max_rings slots
  std::unordered_map<uint32_t, uint16_t> by_id;
  // Ring links of all installed rings and tombstones: a WRITE on such a link
  // may be INA. Changed by install_ring / remove_ring / expire_retired only.
  std::unordered_map<uint64_t, LinkUse> links;
  std::vector<Tombstone> tombs;         // grows in remove_ring; entries reused after expiry
  size_t retired = 0;                   // tombstones in use
  uint64_t next_expiry = kRetireNever;  // earliest expiry over tombstones
  ReasonCounters counters{};
  TableStats stats{};
  uint64_t memory = 0;

  explicit Impl(const EngineConfig& c)
      : cfg(c), clt(c.clt_capacity), pass(c.pass_capacity), rings(c.max_rings) {}

  static uint64_t link_key(uint32_t src, uint32_t dst) noexcept {
    return uint64_t{src} << 32 | dst;
  }
  const LinkUse* find_link(const ConnKey& k) const noexcept {
    const auto it = links.find(link_key(k.src, k.dst));
    return it == links.end() ? nullptr : &it->second;
  }
  bool is_link(const ConnKey& k) const noexcept { return find_link(k) != nullptr; }

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

  Outcome process(Pkt pkt, const ParsedFrame& p, wire::ParseStatus st, uint64_t now,
                  Sink& out) noexcept;
  Outcome first_packet(Pkt pkt, const ParsedFrame& p, const ConnKey& key, uint64_t now,
                       Sink& out) noexcept;
  Outcome later_packet(Pkt pkt, const ParsedFrame& p, const ConnKey& key, uint64_t now,
                       Sink& out) noexcept;
  Outcome aggregate(Ring& ring, unsigned rank, const HistEntry& msg, uint32_t k, Pkt pkt,
                    const ParsedFrame& p, uint64_t now, Sink& out) noexcept;
  void complete(Ring& ring, size_t ci, Cell& cell, Pkt in, unsigned in_rank,
                const ParsedFrame& in_p, uint16_t in_off, Sink& out) noexcept;
  // CRC of a cell's result, which only the linear fix-up uses.
  uint32_t result_crc(const uint8_t* result, uint16_t len) const noexcept {
    return cfg.icrc_fixup == IcrcFixup::linear ? wire::crc32(0, result, len) : 0;
  }
  void fix_icrc(Ring& ring, uint8_t* frame, const ParsedFrame& p, uint16_t data_off,
                uint16_t data_len, uint32_t crc_data) noexcept;
  void reset_cell(Ring& ring, size_t ci, Cell& cell, uint32_t tag, Sink& out) noexcept;
  void unbind(Ring& ring, unsigned rank) noexcept;
  void release_all(Ring& ring, std::vector<Pkt>& released) noexcept;
  void purge(uint32_t tomb) noexcept;
  const HistEntry* find_message(Ring& ring, unsigned rank, uint32_t psn) noexcept;
};

// ---------------------------------------------------------------------------

Outcome Engine::Impl::process(Pkt pkt, const ParsedFrame& p, wire::ParseStatus st, uint64_t now,
                              Sink& out) noexcept {
  if (st != wire::ParseStatus::ok)
    return count(wire::is_not_roce(st) ? Reason::fwd_not_roce : Reason::fwd_unparsed);
  if (!wire::is_rdma_write(p.opcode)) return count(Reason::fwd_not_write);

  const auto* ip = reinterpret_cast<const wire::Ipv4Hdr*>(pkt.data + p.l3);
  const auto* bth = reinterpret_cast<const wire::Bth*>(pkt.data + p.bth);
  const ConnKey key{ip->src.host(), ip->dst.host(), bth->dest_qp.host()};
  if (wire::is_write_first(p.opcode)) return first_packet(pkt, p, key, now, out);
  return later_packet(pkt, p, key, now, out);
}

Outcome Engine::Impl::first_packet(Pkt pkt, const ParsedFrame& p, const ConnKey& key, uint64_t now,
                                   Sink& out) noexcept {
  const uint8_t* f = pkt.data;
  const uint32_t psn = reinterpret_cast<const wire::Bth*>(f + p.bth)->psn.host();
  const std::optional<wire::InaInfo> ina = wire::ina_decode(f + p.payload, p.payload_len);
  if (!ina) {
    // Ordinary RDMA WRITE. On a ring link, remember its PSN range so its
    // later packets are forwarded too (elsewhere nothing needs tracking).
    if (is_link(key)) {
      if (const Clt::Slot* s = clt.find(key); s && s->retired()) return count(Reason::ring_retired);
      const uint32_t dma = reinterpret_cast<const wire::Reth*>(f + p.reth)->dma_length.host();
      const uint32_t per = std::max<uint32_t>(p.payload_len, 1);
      pass.add(key, psn,
               p.opcode == kWriteFirst ? std::max<uint32_t>(1, (dma + per - 1) / per) : 1);
    }
    return count(Reason::fwd_no_ina);
  }
  // The box only claims traffic on ring links: elsewhere a payload that
  // happens to begin with the magic is somebody's data, passed untouched
  // before anything else looks at it.
  const LinkUse* link = find_link(key);
  if (!link)
    return count(now < cfg.claim_all_until ? Reason::ring_retired : Reason::fwd_not_ring_link);
  if (cfg.verify_icrc && !wire::icrc_verify(f, p)) return count(Reason::bad_icrc);

  Clt::Slot* slot = clt.find(key);
  const auto it = by_id.find(ina->ring_id);
  if (it == by_id.end()) {
    // Nothing may bind on a removed ring's connection or on a link that only
    // removed rings use: its job is failing on purpose.
    if ((slot && slot->retired()) || link->live == 0) return count(Reason::ring_retired);
    return count(Reason::unknown_ring);
  }
  Ring& ring = rings[it->second];
  if (ina->version != wire::kInaVersion || ina->rank >= ring.p || ina->msg_len == 0 ||
      ina->msg_len > ring.msg_len || (p.opcode != kWriteFirst && ina->msg_len != 1) ||
      (p.opcode == kWriteFirst && ina->msg_len < 2) || !wire::is_valid_dtype(ina->dtype) ||
      !wire::is_valid_op(ina->op))
    return count(Reason::bad_ina_header, &ring);
  if (key.src != ring.spec.members[ina->rank] ||
      key.dst != ring.spec.members[(ina->rank + 1) % ring.p])
    return count(Reason::rank_address_mismatch, &ring);
  if (!ring.spec.allows_dtype(ina->dtype) || !ring.spec.allows_op(ina->op))
    return count(Reason::dtype_mismatch, &ring);

  // Bind the connection to (ring, rank); a rank whose QP changed is rebound.
  RankConn& rc = ring.conns[ina->rank];
  // A removed ring's connection never binds again while its tombstone lasts,
  // whatever ring it names: the same id re-installed cannot tell the old
  // run's go-back-N resends from the new run's packets, and letting the old
  // run bind a rank first would put its stale data into the new run's cells.
  // A new run uses new QPs; a QP number the host reuses within the grace
  // fails that run loudly (its probe all-reduce falls back to the ring).
  if (slot && slot->retired()) return count(Reason::ring_retired, &ring);
  if (slot && slot->ina() && (slot->owner != it->second || slot->rank != ina->rank)) {
    unbind(rings[slot->owner], slot->rank);  // the key now belongs to another ring/rank
    slot = nullptr;
  }
  if (!slot || !slot->ina()) {
    if (rc.bound) {
      unbind(ring, ina->rank);
      ++ring.counters.connections_rebound;
    }
    slot = clt.insert(key);
    if (!slot) return count(Reason::clt_full, &ring);
    slot->state = ConnState::ina;
    slot->owner = it->second;
    slot->rank = static_cast<uint8_t>(ina->rank);
    rc.key = key;
    rc.bound = true;
  }

  // Record the message; never let an older message replace newer history.
  HistEntry& h = ring.hist[size_t{ina->rank} * ring.slots + (ina->msg_id & (ring.slots - 1))];
  if (h.valid && h.msg_id == ina->msg_id) {
    if (h.psn0 != psn || h.len != ina->msg_len || h.dtype != ina->dtype || h.op != ina->op)
      return count(Reason::malformed, &ring);  // same message, different shape
  } else if (h.valid && wire::msg_before(ina->msg_id, h.msg_id)) {
    return count(Reason::stale_message, &ring);
  } else {
    h = HistEntry{ina->msg_id, psn, ina->msg_len, ina->dtype, ina->op, true};
    if (!rc.has_newest || wire::msg_before(rc.newest, ina->msg_id)) {
      rc.newest = ina->msg_id;
      rc.has_newest = true;
    }
  }
  return aggregate(ring, ina->rank, h, 0, pkt, p, now, out);
}

Outcome Engine::Impl::later_packet(Pkt pkt, const ParsedFrame& p, const ConnKey& key, uint64_t now,
                                   Sink& out) noexcept {
  Clt::Slot* s = clt.find(key);
  const uint32_t psn = reinterpret_cast<const wire::Bth*>(pkt.data + p.bth)->psn.host();
  if (!s || !s->ina()) {
    // Not an INA connection (yet). On a ring link the packet may belong to
    // an INA message whose first packet has not passed: forwarding it would
    // let the receiver take unreduced data. Only known non-INA messages and
    // links no ring (installed or retired) uses are forwarded.
    if (s) return count(Reason::ring_retired);
    const LinkUse* link = find_link(key);
    if (!link || pass.contains(key, psn)) return count(Reason::fwd_no_ina);
    return count(link->live ? Reason::first_packet_lost : Reason::ring_retired);
  }
  Ring& ring = rings[s->owner];
  const unsigned rank = s->rank;
  const HistEntry* found = find_message(ring, rank, psn);
  if (!found) {
    if (pass.contains(key, psn)) return count(Reason::fwd_no_ina);
    return count(Reason::first_packet_lost, &ring);
  }
  if (cfg.verify_icrc && !wire::icrc_verify(pkt.data, p)) return count(Reason::bad_icrc, &ring);
  const uint32_t k = wire::psn_distance(found->psn0, psn);
  return aggregate(ring, rank, *found, k, pkt, p, now, out);
}

// The rank's recorded message whose PSN range contains `psn`, in at most
// kHistoryProbeBudget history reads whatever S is:
// 1. the newest message (almost every packet), and a PSN after its range
//    belongs to no message at all (one read rejects half of random PSNs);
// 2. the message the rank's last later packet found (a go-back-N resend
//    walks one message packet by packet);
// 3. a binary search over the older messages: one QP's messages are
//    PSN-monotone in msg_id, so the search halves the msg_id range at each
//    recorded message; a slot that does not hold its message (first packet
//    not seen yet, or a newer message there) is skipped towards older ones.
// When the budget runs out the packet is dropped as first_packet_lost. That
// is always safe: a drop never reaches a receiver or a cell, and the
// sender's retransmission is found by step 2 or 1 once the first of it
// is (legitimate packets lie in the last N messages under rule W, where
// first packets have passed).
const HistEntry* Engine::Impl::find_message(Ring& ring, unsigned rank, uint32_t psn) noexcept {
  RankConn& rc = ring.conns[rank];
  if (!rc.has_newest) return nullptr;
  const uint32_t mask = ring.slots - 1;
  const HistEntry* base = &ring.hist[size_t{rank} * ring.slots];
  unsigned probes = 0;
  auto at = [&](uint32_t m) -> const HistEntry* {
    ++probes;
    const HistEntry& h = base[m & mask];
    return h.valid && h.msg_id == m ? &h : nullptr;
  };
  auto done = [&](const HistEntry* h) {
    ++stats.history_lookups;
    stats.history_probes += probes;
    stats.history_probes_max = std::max(stats.history_probes_max, probes);
    if (h) rc.hint = h->msg_id;
    return h;
  };
  const HistEntry* newest = at(rc.newest);
  if (newest) {
    if (wire::psn_in_range(psn, newest->psn0, newest->len)) return done(newest);
    if (!wire::psn_before(psn, newest->psn0)) return done(nullptr);  // after every message
  }
  if (rc.hint != rc.newest) {
    const HistEntry* h = at(rc.hint);
    if (h && wire::psn_in_range(psn, h->psn0, h->len)) return done(h);
  }
  // Offsets back from the newest message: [lo, hi], PSNs decrease as the offset grows.
  uint32_t lo = 1, hi = ring.slots - 1;
  while (lo <= hi && probes < kHistoryProbeBudget) {
    const uint32_t mid = lo + (hi - lo) / 2;
    uint32_t j = mid;
    const HistEntry* h = at(rc.newest - j);
    while (!h && j < hi && probes < kHistoryProbeBudget) h = at(rc.newest - ++j);
    if (!h) {
      hi = mid - 1;  // [mid, hi] holds no recorded message
      continue;
    }
    if (wire::psn_in_range(psn, h->psn0, h->len)) return done(h);
    if (wire::psn_before(psn, h->psn0))
      lo = j + 1;  // an older message
    else
      hi = mid - 1;  // newer than j; (mid, j) are not recorded
  }
  return done(nullptr);
}

Outcome Engine::Impl::aggregate(Ring& ring, unsigned rank, const HistEntry& msg, uint32_t k,
                                Pkt pkt, const ParsedFrame& p, uint64_t now, Sink& out) noexcept {
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

  if (cell.state != CellState::empty && cell.tag != msg.msg_id) {
    if (wire::msg_before(msg.msg_id, cell.tag))
      return count(Reason::stale_message, &ring);  // case 5
    reset_cell(ring, ci, cell, msg.msg_id, out);   // case 4
  }
  if (cell.state == CellState::empty) {
    cell.tag = msg.msg_id;
    cell.arrived = 0;
    cell.data_len = data_len;
    cell.dtype = msg.dtype;
    cell.op = msg.op;
    cell.first_ns = now;
    cell.state = CellState::collecting;
    MsgSlot& ms = ring.msgs[msg.msg_id & (ring.slots - 1)];
    if (!ms.valid || ms.tag != msg.msg_id) ms = MsgSlot{msg.msg_id, msg.len, 0, true};
  }
  if (cell.data_len != data_len) return count(Reason::length_mismatch, &ring);
  if (cell.dtype != msg.dtype || cell.op != msg.op) return count(Reason::dtype_mismatch, &ring);

  if (cell.state == CellState::complete) {  // case 1: serve the stored result
    std::memcpy(pkt.data + data_off, ring.result_of(ci), data_len);
    fix_icrc(ring, pkt.data, p, data_off, data_len, result_crc(ring.result_of(ci), data_len));
    ++ring.counters.retransmissions_served;
    ++counters[static_cast<size_t>(Reason::served_from_cell)];
    return {Verdict::emit, Reason::served_from_cell};
  }
  if (cell.arrived & bit) return count(Reason::duplicate, &ring);  // case 2

  // Case 3: take it.
  ++ring.counters.packets_aggregated;
  ring.counters.bytes_aggregated += data_len;
  cell.arrived |= bit;
  const bool completes = std::popcount(cell.arrived) == static_cast<int>(ring.p);
  const size_t hi = ci * ring.p + rank;
  if (cfg.mode == ReduceMode::accumulate) {
    const auto& kern = reduce::kernels(cfg.isa, static_cast<wire::Dtype>(cell.dtype),
                                       static_cast<wire::ReduceOp>(cell.op));
    void* acc = ring.acc_of(ci);
    const size_t elems = data_len / esize;
    if (cell.arrived == bit)
      kern.init(acc, pkt.data + data_off, elems);
    else
      kern.add(acc, pkt.data + data_off, elems);
    if (!completes) {
      StoredHdr& sh = ring.hdrs[hi];
      sh.p = p;
      sh.frame_len = p.end;
      sh.meta = pkt.meta;
      sh.data_off = data_off;
      std::memcpy(sh.bytes, pkt.data, data_off);
      std::memcpy(sh.pad_bytes, pkt.data + data_off + data_len, p.pad);
      ++counters[static_cast<size_t>(Reason::held)];
      return {Verdict::consumed, Reason::held};
    }
  } else if (!completes) {
    ring.held[hi] = Held{pkt, p, data_off};
    ++ring.held_packets;
    ring.held_bytes += pkt.len;
    ++counters[static_cast<size_t>(Reason::held)];
    return {Verdict::held, Reason::held};
  }
  complete(ring, ci, cell, pkt, rank, p, data_off, out);
  ++counters[static_cast<size_t>(Reason::held)];
  return {Verdict::held, Reason::held};
}

void Engine::Impl::complete(Ring& ring, size_t ci, Cell& cell, Pkt in, unsigned in_rank,
                            const ParsedFrame& in_p, uint16_t in_off, Sink& out) noexcept {
  const size_t esize = wire::dtype_size(cell.dtype);
  const size_t elems = cell.data_len / esize;
  uint8_t* result = ring.result_of(ci);
  const auto& kern = reduce::kernels(cfg.isa, static_cast<wire::Dtype>(cell.dtype),
                                     static_cast<wire::ReduceOp>(cell.op));
  const uint8_t* srcs[kMaxRanks];
  if (cfg.mode == ReduceMode::deterministic) {
    for (unsigned r = 0; r < ring.p; ++r)
      srcs[r] = r == in_rank
                    ? in.data + in_off
                    : ring.held[ci * ring.p + r].pkt.data + ring.held[ci * ring.p + r].data_off;
    kern.reduce(srcs, ring.p, result, elems);
  } else {
    kern.finish(ring.acc_of(ci), result, elems);
  }
  const uint32_t crc_data = result_crc(result, cell.data_len);

  for (unsigned r = 0; r < ring.p; ++r) {
    Pkt pk;
    ParsedFrame pf;
    uint16_t off;
    if (r == in_rank) {
      pk = in;
      pf = in_p;
      off = in_off;
    } else if (cfg.mode == ReduceMode::deterministic) {
      Held& h = ring.held[ci * ring.p + r];
      pk = h.pkt;
      pf = h.p;
      off = h.data_off;
      h = Held{};
      --ring.held_packets;
      ring.held_bytes -= pk.len;
    } else {
      const StoredHdr& sh = ring.hdrs[ci * ring.p + r];
      pk = cfg.allocator.alloc ? cfg.allocator.alloc(cfg.allocator.ctx, sh.frame_len) : Pkt{};
      if (!pk.data) {
        ++counters[static_cast<size_t>(Reason::alloc_failed)];
        ++ring.counters.drops[static_cast<size_t>(Reason::alloc_failed)];
        continue;  // the worker will retransmit and be served from the cell
      }
      pk.len = sh.frame_len;
      pk.meta = sh.meta;
      std::memcpy(pk.data, sh.bytes, sh.data_off);
      std::memcpy(pk.data + sh.data_off + cell.data_len, sh.pad_bytes, sh.p.pad);
      pf = sh.p;
      off = sh.data_off;
    }
    std::memcpy(pk.data + off, result, cell.data_len);
    fix_icrc(ring, pk.data, pf, off, cell.data_len, crc_data);
    out.tx[out.ntx++] = pk;
  }
  cell.state = CellState::complete;
  ++ring.counters.cells_completed;
  MsgSlot& ms = ring.msgs[cell.tag & (ring.slots - 1)];
  if (ms.valid && ms.tag == cell.tag && ++ms.cells_done == ms.len)
    ++ring.counters.messages_completed;
}

void Engine::Impl::fix_icrc(Ring& ring, uint8_t* frame, const ParsedFrame& p, uint16_t data_off,
                            uint16_t data_len, uint32_t crc_data) noexcept {
  if (cfg.icrc_fixup == IcrcFixup::full) {
    wire::icrc_update(frame, p);
    return;
  }
  // ICRC = crc(head || data || pad): head per packet, data once per cell.
  const uint32_t head = wire::icrc_head(frame, p, data_off);
  const uint32_t tail = wire::crc32(crc_data, frame + data_off + data_len, p.pad);
  wire::icrc_store(frame, p, ring.shifts.get(data_len + p.pad).combine(head, tail));
}

void Engine::Impl::reset_cell(Ring& ring, size_t ci, Cell& cell, uint32_t tag, Sink& out) noexcept {
  if (cell.state == CellState::collecting) {
    // Only a worker that broke rule W reuses a cell others still wait on.
    for (unsigned r = 0; r < ring.p; ++r) {
      if (!(cell.arrived >> r & 1)) continue;
      ++counters[static_cast<size_t>(Reason::evicted_incomplete)];
      ++ring.counters.drops[static_cast<size_t>(Reason::evicted_incomplete)];
      if (cfg.mode == ReduceMode::deterministic) {
        Held& h = ring.held[ci * ring.p + r];
        out.drop[out.ndrop++] = h.pkt;
        --ring.held_packets;
        ring.held_bytes -= h.pkt.len;
        h = Held{};
      }
    }
  }
  cell = Cell{};
  cell.tag = tag;
}

void Engine::Impl::unbind(Ring& ring, unsigned rank) noexcept {
  RankConn& rc = ring.conns[rank];
  if (rc.bound) clt.erase(rc.key);
  rc = RankConn{};
  std::fill_n(ring.hist.begin() + static_cast<long>(size_t{rank} * ring.slots), ring.slots,
              HistEntry{});
}

void Engine::Impl::release_all(Ring& ring, std::vector<Pkt>& released) noexcept {
  for (Held& h : ring.held) {
    if (!h.pkt.data) continue;
    released.push_back(h.pkt);
    ++counters[static_cast<size_t>(Reason::ring_removed)];
    h = Held{};
  }
  ring.held_packets = 0;
  ring.held_bytes = 0;
}

// ---------------------------------------------------------------------------

Engine::Engine(const EngineConfig& config) : impl_(std::make_unique<Impl>(config)) {}
Engine::~Engine() = default;

Status Engine::install_ring(const RingSpec& spec) {
  Impl& e = *impl_;
  if (Status s = validate(spec); !s) return s;
  if (auto it = e.by_id.find(spec.ring_id); it != e.by_id.end()) {
    if (e.rings[it->second].spec == spec) return {};
    return {StatusCode::conflict, "ring_id",
            "ring " + std::to_string(spec.ring_id) + " is installed with a different spec"};
  }
  const uint64_t need = ring_memory_bytes(spec, e.cfg.mode);
  if (spec.memory_quota && need > spec.memory_quota)
    return {StatusCode::resource_exhausted, "memory_quota",
            "ring needs " + std::to_string(need) + " bytes, quota is " +
                std::to_string(spec.memory_quota)};
  if (e.memory + need > e.cfg.memory_budget)
    return {StatusCode::resource_exhausted, "memory",
            "ring needs " + std::to_string(need) + " bytes, " +
                std::to_string(e.cfg.memory_budget - e.memory) + " of " +
                std::to_string(e.cfg.memory_budget) + " free"};
  if (e.cfg.mode == ReduceMode::accumulate && !e.cfg.allocator.alloc)
    return {StatusCode::internal, "allocator", "accumulate mode needs a packet allocator"};
  auto free_slot =
      std::find_if(e.rings.begin(), e.rings.end(), [](const Ring& r) { return !r.active; });
  if (free_slot == e.rings.end())
    return {StatusCode::resource_exhausted, "ring_id",
            "all " + std::to_string(e.cfg.max_rings) + " ring slots are in use"};

  Ring& r = *free_slot;
  r = Ring{};
  r.spec = spec;
  r.p = spec.ranks();
  r.slots = slots_for_window(spec.window);
  r.msg_len = spec.msg_len;
  r.memory = need;
  const size_t cells = size_t{r.slots} * r.msg_len;
  r.cells.assign(cells, Cell{});
  r.msgs.assign(r.slots, MsgSlot{});
  r.hist.assign(size_t{r.p} * r.slots, HistEntry{});
  r.conns.assign(r.p, RankConn{});
  r.result.assign(cells * spec.payload_bytes, 0);
  if (e.cfg.icrc_fixup == IcrcFixup::linear) r.shifts.entries.resize(ShiftCache::kEntries);
  if (e.cfg.mode == ReduceMode::deterministic)
    r.held.assign(cells * r.p, Held{});
  else {
    r.hdrs.resize(cells * r.p);
    r.acc.assign(cells * 2 * spec.payload_bytes, 0);
  }
  r.active = true;
  for (unsigned k = 0; k < r.p; ++k)
    ++e.links[Impl::link_key(spec.members[k], spec.members[(k + 1) % r.p])].live;
  e.by_id[spec.ring_id] = static_cast<uint16_t>(free_slot - e.rings.begin());
  e.memory += need;
  return {};
}

Status Engine::remove_ring(uint32_t ring_id, uint64_t now, std::vector<Pkt>& released) {
  Impl& e = *impl_;
  auto it = e.by_id.find(ring_id);
  if (it == e.by_id.end())
    return {StatusCode::not_found, "ring_id", "no ring " + std::to_string(ring_id)};
  Ring& r = e.rings[it->second];
  // The tombstone first (the only allocation): a removal never half happens.
  auto tomb_it =
      std::find_if(e.tombs.begin(), e.tombs.end(), [](const Tombstone& t) { return !t.used; });
  if (tomb_it == e.tombs.end()) tomb_it = e.tombs.emplace(e.tombs.end());
  const auto tomb = static_cast<uint32_t>(tomb_it - e.tombs.begin());
  Tombstone& t = *tomb_it;
  t.used = true;
  t.ring_id = ring_id;
  t.conns.clear();
  t.links.clear();
  t.conns.reserve(r.p);
  t.links.reserve(r.p);
  const uint64_t grace = e.cfg.retire_grace;
  t.expires = grace == kRetireNever || now >= kRetireNever - grace ? kRetireNever : now + grace;
  ++e.retired;
  e.next_expiry = std::min(e.next_expiry, t.expires);

  // Bound connections become the tombstone's: their CLT entries stay, so no
  // later packet or go-back-N resend of the running message is forwarded raw.
  for (unsigned rank = 0; rank < r.p; ++rank) {
    RankConn& rc = r.conns[rank];
    if (!rc.bound) continue;
    if (Clt::Slot* slot = e.clt.find(rc.key); slot && slot->ina()) {
      slot->state = ConnState::retired;
      slot->owner = tomb;
      t.conns.push_back(rc.key);
    }
    rc = RankConn{};
  }
  for (unsigned k = 0; k < r.p; ++k) {
    const uint64_t key = Impl::link_key(r.spec.members[k], r.spec.members[(k + 1) % r.p]);
    LinkUse& l = e.links[key];
    --l.live;
    ++l.retired;
    t.links.push_back(key);
  }
  e.release_all(r, released);
  e.memory -= r.memory;
  r = Ring{};  // the ring slot is free now: no CLT entry points into it
  e.by_id.erase(it);
  return {};
}

unsigned Engine::expire_retired(uint64_t now) noexcept {
  Impl& e = *impl_;
  if (now < e.next_expiry) return 0;  // the common case: one compare
  unsigned purged = 0;
  e.next_expiry = kRetireNever;
  for (uint32_t i = 0; i < e.tombs.size(); ++i) {
    Tombstone& t = e.tombs[i];
    if (!t.used) continue;
    if (t.expires == kRetireNever || t.expires > now) {
      e.next_expiry = std::min(e.next_expiry, t.expires);
      continue;
    }
    e.purge(i);
    ++purged;
  }
  return purged;
}

void Engine::Impl::purge(uint32_t tomb) noexcept {
  Tombstone& t = tombs[tomb];
  for (const ConnKey& k : t.conns) {
    const Clt::Slot* s = clt.find(k);
    // Only if still this tombstone's: a live ring may have re-bound the key,
    // or a later tombstone may own it now.
    if (s && s->retired() && s->owner == tomb) clt.erase(k);
  }
  for (const uint64_t key : t.links) {
    auto l = links.find(key);
    if (l == links.end()) continue;
    if (l->second.retired) --l->second.retired;
    if (l->second.live == 0 && l->second.retired == 0) links.erase(l);
  }
  t.conns.clear();
  t.links.clear();
  t.used = false;
  t.expires = kRetireNever;
  --retired;
}

size_t Engine::retired_count() const noexcept { return impl_->retired; }

std::vector<RetiredRing> Engine::retired_rings() const {
  std::vector<RetiredRing> out;
  for (uint32_t i = 0; i < impl_->tombs.size(); ++i) {
    const Tombstone& t = impl_->tombs[i];
    if (!t.used) continue;
    RetiredRing rr{t.ring_id, t.expires, 0};
    for (const ConnKey& k : t.conns) {
      const Clt::Slot* s = impl_->clt.find(k);
      if (s && s->retired() && s->owner == i) ++rr.connections;
    }
    out.push_back(rr);
  }
  std::sort(out.begin(), out.end(),
            [](const RetiredRing& a, const RetiredRing& b) { return a.expires < b.expires; });
  return out;
}

Outcome Engine::process(Pkt pkt, uint64_t now_ns, Sink& out) noexcept {
  Frame f;
  classify(pkt, f);
  return impl_->process(pkt, f.p, f.st, now_ns, out);
}

void Engine::classify(Pkt pkt, Frame& f) noexcept {
  f.pkt = pkt;
  f.st = wire::parse_frame(pkt.data, pkt.len, f.p);
}

unsigned Engine::process_burst(const Frame* frames, unsigned n, uint64_t now_ns,
                               Outcome* outcomes, Sink& out) noexcept {
  unsigned i = 0;
  for (; i < n; ++i) {
    if (Sink::kCapacity - out.ntx < kMaxRanks || Sink::kCapacity - out.ndrop < kMaxRanks) break;
    const uint16_t before = out.ntx;
    outcomes[i] = impl_->process(frames[i].pkt, frames[i].p, frames[i].st, now_ns, out);
    outcomes[i].released = static_cast<uint8_t>(out.ntx - before);
  }
  return i;
}

std::vector<uint32_t> Engine::ring_ids() const {
  std::vector<uint32_t> ids;
  for (const auto& [id, slot] : impl_->by_id) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  return ids;
}

size_t Engine::ring_count() const noexcept { return impl_->by_id.size(); }

std::optional<RingInfo> Engine::ring_info(uint32_t ring_id, uint64_t now_ns,
                                          uint64_t stall_ns) const {
  auto it = impl_->by_id.find(ring_id);
  if (it == impl_->by_id.end()) return std::nullopt;
  const Ring& r = impl_->rings[it->second];
  RingInfo info;
  info.spec = r.spec;
  info.counters = r.counters;
  info.slots = r.slots;
  info.memory_bytes = r.memory;
  info.held_packets = r.held_packets;
  info.held_bytes = r.held_bytes;
  for (const Cell& c : r.cells) {
    if (c.state != CellState::collecting) continue;
    ++info.open_cells;
    if (stall_ns && now_ns > c.first_ns && now_ns - c.first_ns > stall_ns) ++info.stalled_cells;
  }
  return info;
}

const ReasonCounters& Engine::counters() const noexcept { return impl_->counters; }
TableStats Engine::table_stats() const noexcept {
  TableStats t = impl_->stats;
  t.clt_entries = impl_->clt.size();
  t.pass_evictions = impl_->pass.evictions();
  return t;
}
uint64_t Engine::memory_in_use() const noexcept { return impl_->memory; }
const EngineConfig& Engine::config() const noexcept { return impl_->cfg; }

}  // namespace netreduce::engine
