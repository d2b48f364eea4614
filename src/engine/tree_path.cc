// A tree node's packet path (tree.h; docs/design.md#cells-in-a-tree): the
// box-to-box frames a box receives, judged and taken (box_frame: a child's
// partial or final, the parent's result or query), a cell whose children
// are all in reduced and sent up or delivered (tree_full, deliver), and the
// frames a node builds (send_b2b). engine.cc's burst loop calls box_frame
// for a frame that may be box-to-box, and tree_full when a tree cell's last
// local rank arrives; everything else here is called from here.
//
// Example: leaf L (ranks 0 and 2; parent S) completes cell (5, 0) from its
// ranks: tree_full reduces them in child order and sends a `partial` up;
// the cell waits (`awaiting`). S takes L's partial (partial_in), and when
// its other child's is in, it reduces and delivers: a `result` to each
// child box. L takes it (result_in), writes it into its held packets
// (ICRC fixed) and releases them.
#include <bit>
#include <cstring>

#include "engine/digest.h"
#include "engine/engine_impl.h"
#include "wire/icrc.h"
#include "wire/opcode.h"

namespace netreduce::engine {

// `ordinary`: the reason of a frame that turns out not to be box-to-box.
// Every box-to-box frame to a box address is judged here, whichever engine
// of the box holds its tree (set_box_addresses): malformed in any way (cut
// short, fragmented, IPv4 options, a short header), for a tree this engine
// lacks, from another installation of it (epoch) or with a MAC its key does
// not give, it is dropped under its b2b_* reason, never forwarded.
template <IcrcFixup F>
Outcome Engine::Impl::box_frame(const Frame& f, Reason ordinary, uint64_t now, Sink& out) noexcept {
  wire::B2bFrame b;
  const wire::B2bStatus st = wire::parse_b2b(f.pkt.data, f.pkt.len, b);
  if (st == wire::B2bStatus::not_b2b) return count(ordinary);
  // A later fragment has no port: a UDP fragment to a box address is taken
  // for part of a box-to-box datagram (a box address receives nothing
  // else); elsewhere it is ordinary traffic, not known to be box-to-box.
  if (st == wire::B2bStatus::later_fragment)
    return count(is_box_ip(b.dst_ip) ? Reason::b2b_malformed : ordinary);
  // Frames for other boxes pass, whatever their state: they are not ours to judge.
  if (!is_box_ip(b.dst_ip)) return count(Reason::fwd_b2b_transit);
  if (st != wire::B2bStatus::ok) return count(Reason::b2b_malformed);
  const wire::B2bInfo& in = b.info;
  const int at = rings.find(in.tree_id);
  if (at < 0) return count(Reason::b2b_unknown_tree);
  Ring& ring = rings.at(static_cast<uint32_t>(at));
  if (!ring.tree || ring.tree->spec.self.ip != b.dst_ip)
    return count(Reason::b2b_unknown_tree, &ring);
  TreeNode& t = *ring.tree;
  if (in.epoch != t.spec.epoch) return count(Reason::b2b_stale_epoch, &ring);
  if (!t.mac->verify(f.pkt.data + b.hdr, b.data_len)) return count(Reason::b2b_bad_mac, &ring);
  // partial and final come up from child box `child`, result and query down
  // from the parent to this box's index there.
  const bool up = in.kind == wire::B2bKind::partial || in.kind == wire::B2bKind::final;
  if (up ? in.child >= t.nboxes || t.spec.boxes[in.child].ip != b.src_ip
         : !t.spec.has_parent || t.spec.parent.ip != b.src_ip || in.child != t.spec.index_at_parent)
    return count(Reason::b2b_unknown_box, &ring);
  if (!ring.spec.allows_dtype(in.dtype) || !ring.spec.allows_op(in.op))
    return count(Reason::dtype_mismatch, &ring);
  if (b.data_len > ring.spec.payload_bytes) return count(Reason::length_mismatch, &ring);
  if (in.msg_len > ring.msg_len) return count(Reason::malformed, &ring);
  switch (in.kind) {
    case wire::B2bKind::partial:
      return partial_in<F>(ring, t, b, f.pkt.data, now, out);
    case wire::B2bKind::query:
      return query_in(ring, in, out);
    case wire::B2bKind::result:
    case wire::B2bKind::final:
      break;
  }
  return result_in<F>(ring, b, f.pkt.data, out);
}

// A child box's partial: the five cases on its bit (cells.h), the data
// copied (the frame is freed: `consumed`).
template <IcrcFixup F>
Outcome Engine::Impl::partial_in(Ring& ring, TreeNode& t, const wire::B2bFrame& b,
                                 const uint8_t* frame, uint64_t now, Sink& out) noexcept {
  const wire::B2bInfo& in = b.info;
  const size_t ci = ring.cell_index(in.msg_id, in.k);
  Cell& cell = ring.cells[ci];
  const auto bit = static_cast<uint16_t>(1u << in.child);
  const CellCase c = cell_case_box(cell, in.msg_id, bit);
  if (c == CellCase::stale) return count(Reason::stale_message, &ring);
  if (c == CellCase::reset) reset_cell(ring, ci, cell, in.msg_id, out);
  if (cell.state == CellState::empty)
    open_cell(ring, cell, in.msg_id, in.msg_len, b.data_len, in.dtype, in.op, now);
  if (cell.data_len != b.data_len) return count(Reason::length_mismatch, &ring);
  if (cell.dtype != in.dtype || cell.op != in.op) return count(Reason::dtype_mismatch, &ring);
  if (c == CellCase::serve) {  // the child's workers are retrying: its result was lost
    if (send_b2b(ring, ci, cell, wire::B2bKind::result, t.spec.boxes[in.child], in.child, out))
      ++ring.counters.tree.results_resent;
    ++counters[static_cast<size_t>(Reason::partial_answered)];
    return {Verdict::consumed, Reason::partial_answered};
  }
  if (c == CellCase::duplicate) {
    if (cell.state == CellState::awaiting) return resend_partial(ring, ci, cell, out);
    // The child resends: its workers are waiting. The cell still lacks other
    // children; a child box that already has the result (this box lost its
    // cells in a restart) would never send again unless asked. Only local
    // ranks missing: they resend on their own.
    if ((cell.boxes | bit) == ring.all_boxes) return count(Reason::duplicate, &ring);
    for (unsigned x = 0; x < t.nboxes; ++x)
      if (!(cell.boxes & (1u << x)) && send_b2b(ring, ci, cell, wire::B2bKind::query,
                                                t.spec.boxes[x], static_cast<uint16_t>(x), out))
        ++ring.counters.tree.queries_sent;
    return count(Reason::duplicate_queried, &ring);
  }
  std::memcpy(t.box_data_of(ci, in.child), frame + b.data, b.data_len);
  cell.boxes |= bit;
  ++ring.counters.tree.partials_received;
  ++counters[static_cast<size_t>(Reason::partial_taken)];
  if (cell.arrived == ring.all_ranks && cell.boxes == ring.all_boxes)
    tree_full<F>(ring, ci, cell, out);
  return {Verdict::consumed, Reason::partial_taken};
}

// The parent's result: only a cell awaiting it takes it. A child's final
// (the answer to a query): a cell of that message still collecting (with
// every local packet held, so each can be released) or awaiting takes it.
// Either is the tree's result for (m, k), the one value every box delivers.
template <IcrcFixup F>
Outcome Engine::Impl::result_in(Ring& ring, const wire::B2bFrame& b, const uint8_t* frame,
                                Sink& out) noexcept {
  const wire::B2bInfo& in = b.info;
  const size_t ci = ring.cell_index(in.msg_id, in.k);
  Cell& cell = ring.cells[ci];
  const bool final = in.kind == wire::B2bKind::final;
  const bool takes =
      cell.tag == in.msg_id &&
      (cell.state == CellState::awaiting ||
       (final && cell.state == CellState::collecting && cell.arrived == ring.all_ranks));
  if (!takes) return count(Reason::b2b_result_unexpected, &ring);
  if (cell.data_len != b.data_len) return count(Reason::length_mismatch, &ring);
  if (cell.dtype != in.dtype || cell.op != in.op) return count(Reason::dtype_mismatch, &ring);
  std::memcpy(ring.result_of(ci), frame + b.data, b.data_len);
  ++(final ? ring.counters.tree.finals_received : ring.counters.tree.results_received);
  deliver<F>(ring, ci, cell, out);
  const Reason r = final ? Reason::final_taken : Reason::result_taken;
  ++counters[static_cast<size_t>(r)];
  return {Verdict::consumed, r};
}

// The parent asks for cell (m, k): it lost its cells (a restart) and
// another child resends. Awaiting: the partial again. Complete: the result
// it holds, as a final. Anything else (children missing here, or the cell
// already reused) has nothing to give; this box's own children resend.
Outcome Engine::Impl::query_in(Ring& ring, const wire::B2bInfo& in, Sink& out) noexcept {
  const size_t ci = ring.cell_index(in.msg_id, in.k);
  const Cell& cell = ring.cells[ci];
  const TreeNode& t = *ring.tree;
  if (cell.tag != in.msg_id ||
      (cell.state != CellState::awaiting && cell.state != CellState::complete))
    return count(Reason::query_unanswerable, &ring);
  if (cell.state == CellState::awaiting) {
    if (send_b2b(ring, ci, cell, wire::B2bKind::partial, t.spec.parent, t.spec.index_at_parent,
                 out))
      ++ring.counters.tree.partials_resent;
  } else if (send_b2b(ring, ci, cell, wire::B2bKind::final, t.spec.parent, t.spec.index_at_parent,
                      out)) {
    ++ring.counters.tree.finals_sent;
  }
  ++counters[static_cast<size_t>(Reason::query_answered)];
  return {Verdict::consumed, Reason::query_answered};
}

// Every child arrived: reduce in child order into the cell's result
// buffer; then the partial goes up, or (the root) the result is delivered.
template <IcrcFixup F>
void Engine::Impl::tree_full(Ring& ring, size_t ci, Cell& cell, Sink& out) noexcept {
  TreeNode& t = *ring.tree;
  const Held* held = ring.held.data() + ci * ring.ranks;
  const uint8_t* srcs[kMaxRanks];
  unsigned n = 0;
  for (const TreeChild& c : t.spec.children)
    srcs[n++] = c.kind == TreeChild::Kind::rank ? held[c.index].pkt.data + held[c.index].data_off
                                                : t.box_data_of(ci, c.index);
  const auto& kern = reduce::kernels(cfg.isa, static_cast<wire::Dtype>(cell.dtype),
                                     static_cast<wire::ReduceOp>(cell.op));
  kern.reduce(srcs, n, ring.result_of(ci), cell.data_len / wire::dtype_size(cell.dtype));
  if (t.spec.has_parent) {
    cell.state = CellState::awaiting;
    if (send_b2b(ring, ci, cell, wire::B2bKind::partial, t.spec.parent, t.spec.index_at_parent,
                 out))
      ++ring.counters.tree.partials_sent;
    return;  // a lost (or unbuilt) partial is sent again on the workers' resend
  }
  deliver<F>(ring, ci, cell, out);
}

// The result is in the cell: into every held local packet (ICRC fixed,
// released in child order), to every child box; the cell is complete.
template <IcrcFixup F>
void Engine::Impl::deliver(Ring& ring, size_t ci, Cell& cell, Sink& out) noexcept {
  TreeNode& t = *ring.tree;
  const uint8_t* result = ring.result_of(ci);
  cell.crc = wire::crc32(0, result, cell.data_len);
  finish_cell(ring, cell);
  Held* held = ring.held.data() + ci * ring.ranks;
  // The local ranks' packets of a message's last cell leave sealed or not
  // at all (digest.h); the child boxes get the result either way.
  uint32_t imm = 0;
  const auto first_rank = static_cast<unsigned>(std::countr_zero(ring.all_ranks));
  const bool unsealed = first_rank < ring.ranks &&
                        wire::is_write_last(held[first_rank].parsed.opcode) &&
                        !digest_imm(ring, ci, imm);
  if (unsealed) drop_held(ring, ci, ring.all_ranks, Reason::message_incomplete, out);
  for (const TreeChild& c : t.spec.children) {
    if (unsealed || c.kind != TreeChild::Kind::rank) continue;
    Held& h = held[c.index];
    Pkt& pk = out.tx[out.ntx];
    pk = h.pkt;
    std::memcpy(pk.data + h.data_off, result, cell.data_len);
    if (h.parsed.immdt) seal<F>(pk.data, h.parsed, h.data_off, imm, h.head_crc);
    fix_icrc<F>(shifts, pk.data, h.parsed, h.data_off, cell.data_len, cell.crc, h.head_crc);
    ++out.ntx;
    h.pkt.data = nullptr;
    --ring.held_packets;
    ring.held_bytes -= pk.len;
  }
  for (unsigned b = 0; b < t.nboxes; ++b)
    if (send_b2b(ring, ci, cell, wire::B2bKind::result, t.spec.boxes[b], static_cast<uint16_t>(b),
                 out))
      ++ring.counters.tree.results_sent;
}

Outcome Engine::Impl::resend_partial(Ring& ring, size_t ci, const Cell& cell, Sink& out) noexcept {
  const TreeNode& t = *ring.tree;
  if (send_b2b(ring, ci, cell, wire::B2bKind::partial, t.spec.parent, t.spec.index_at_parent, out))
    ++ring.counters.tree.partials_resent;
  return count(Reason::duplicate_resent_partial, &ring);
}

// Builds the cell's result buffer (partial, result or final; a query
// carries no data) as a box-to-box frame to `to` in a buffer from the allocator, appended to
// out.tx. False (and alloc_failed counted) without a buffer, or (b2b_seal_failed) when
// the MAC cannot be computed: the end-to-end retry covers it.
bool Engine::Impl::send_b2b(Ring& ring, size_t ci, const Cell& cell, wire::B2bKind kind,
                            const TreeBox& to, uint16_t child, Sink& out) noexcept {
  const TreeNode& t = *ring.tree;
  const uint16_t data_len = wire::b2b_kind_has_data(kind) ? cell.data_len : 0;
  const size_t len = wire::b2b_frame_size(data_len);
  Pkt pk = cfg.allocator.alloc(cfg.allocator.ctx, static_cast<uint16_t>(len));
  if (!pk.data) {
    ++counters[static_cast<size_t>(Reason::alloc_failed)];
    ++ring.counters.drops[static_cast<size_t>(Reason::alloc_failed)];
    return false;
  }
  const MsgSlot& ms = ring.msgs[cell.tag & (ring.slots - 1)];
  wire::B2bFrameSpec s;
  s.src_mac = t.spec.self.mac;
  s.dst_mac = to.mac;
  s.src_ip = t.spec.self.ip;
  s.dst_ip = to.ip;
  s.udp_src_port = t.udp_src_port;
  s.info.kind = kind;
  s.info.tree_id = ring.spec.ring_id;
  s.info.msg_id = cell.tag;
  s.info.k = static_cast<uint16_t>(ci % ring.msg_len);
  s.info.msg_len = ms.valid && ms.tag == cell.tag ? ms.len : static_cast<uint16_t>(ring.msg_len);
  s.info.child = child;
  s.info.dtype = cell.dtype;
  s.info.op = cell.op;
  s.info.epoch = t.spec.epoch;
  s.data = ring.result_of(ci);
  s.data_len = data_len;
  s.mac = t.mac.get();
  pk.len = static_cast<uint16_t>(wire::build_b2b(s, pk.data, len));
  if (pk.len == 0) {  // the MAC failed (OpenSSL): never send an unsealed frame
    out.drop[out.ndrop++] = pk;
    ++counters[static_cast<size_t>(Reason::b2b_seal_failed)];
    ++ring.counters.drops[static_cast<size_t>(Reason::b2b_seal_failed)];
    return false;
  }
  pk.meta = to.meta;
  out.tx[out.ntx++] = pk;
  return true;
}

template Outcome Engine::Impl::box_frame<IcrcFixup::linear>(const Frame&, Reason, uint64_t,
                                                            Sink&) noexcept;
template Outcome Engine::Impl::box_frame<IcrcFixup::full>(const Frame&, Reason, uint64_t,
                                                          Sink&) noexcept;
template void Engine::Impl::tree_full<IcrcFixup::linear>(Ring&, size_t, Cell&, Sink&) noexcept;
template void Engine::Impl::tree_full<IcrcFixup::full>(Ring&, size_t, Cell&, Sink&) noexcept;

}  // namespace netreduce::engine
