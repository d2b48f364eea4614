// Tree entries: a ring whose members sit in several racks (DESIGN.md section
// 8, issue #15). A box's part of the tree is a TreeSpec installed with the
// ring (Engine::install_ring(spec, tree)); without one a ring is a
// single-box ring exactly as before.
//
// Theory of operation ("hold at the source leaf")
//
// Children. A box's node in the tree has children in a fixed order: local
// ranks (ring members whose packets pass this box on their way out: the box
// holds them) and child boxes (which send partials up). The box reduces its
// children in that order: a leaf's partial is its local ranks in rank order
// (the control plane lists them so), the root's result its child boxes in
// child order. A box with a parent sends its reduction up as a partial; the
// root's reduction is the result. Results are deterministic and the same at
// every worker, but equal the flat rank-order reduction only for integers
// and min/max (each level rounds floats once; fp16/bf16 partials are
// narrowed per level).
//
// Ownership. Only the links of local senders (rank r -> r + 1, r local) are
// installed in the box's link table: a worker packet whose source sits in
// another rack (a released result crossing the spine or coming down to a
// local receiver) meets no ring link and is forwarded untouched, as any
// traffic the box does not own; a box with no local rank claims no worker
// traffic at all.
//
// Cells. The ring's cells as in section 4, with one bit per local rank in
// Cell::arrived and one per child box in Cell::boxes, and one more state:
// `awaiting` (every child arrived, partial sent up, result not yet back).
// Local packets are held (their mbufs); a child box's partial data is copied
// into the ring's box_data and the frame freed (`consumed`). The reduction
// goes into the cell's result buffer, which holds the partial while the
// cell awaits and the result once complete.
//   worker packet      the five cases; the last child to arrive completes
//                      the cell: reduce, then partial up (awaiting) or, at
//                      the root, deliver
//   partial from box c the same five cases on bit c: take (copy); a partial
//                      for a complete cell is answered with the result sent
//                      to c again (the child's workers are retrying: the
//                      result was lost)
//   duplicate while awaiting (a worker resend, or a child box's partial
//                      again): the partial is sent up again; the duplicate
//                      is dropped (the held original will be released)
//   result from parent for a cell awaiting it: copy into the result, deliver
//                      (write it into the held local packets, fix their
//                      ICRCs, release them; send it to every child box),
//                      complete; any other result is dropped (a late copy)
// Reliability stays end to end: boxes keep no per-link sequence state; a
// lost partial or result is recovered by the workers' RC retransmissions,
// which reach the leaf cell awaiting the result and make it send its
// partial again, which makes the parent answer from its complete cell.
// Every message is aggregated exactly once at every box.
//   A parent that lost its cells (a restarted box given its entry back) may
// have children on both sides of a cell: one already got the result and is
// done with it, another still waits and resends its partial. Only the
// waiting side resends, so the fresh cell would wait forever. Hence:
//   partial again while the cell collects: a query (no data) goes to every
//                      child box missing from the cell (duplicate_queried)
//   query from parent  awaiting: the partial again; complete: the result it
//                      holds goes up as a final; otherwise nothing (its own
//                      children have not all arrived: they will resend)
//   final from a child taken by a cell of that message awaiting, or
//                      collecting with every local packet held: delivered
//                      as a result is. A complete cell of message m holds the
//                      tree's one result for (m, k), so the final is exact.
// In a fabric that lost nothing a query finds its child collecting or
// awaiting (a lost partial then goes up again, sooner than a worker's
// timeout would send it). The sim ('engine sim tree') restarts boxes and
// requires every such job to finish.
//
// Limits. Deterministic mode only (accumulate mode would rebuild held
// packets and keep partials; not done yet). At most kMaxChildBoxes child
// boxes, at most kMaxRanks children in all (one input releases at most
// kMaxRanks packets, the Sink's contract).
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"
#include "engine/ring.h"
#include "wire/headers.h"

namespace netreduce::engine {

inline constexpr unsigned kMaxChildBoxes = 16;  // Cell::boxes is 16 bits

// A box of the fabric as a neighbour sees it: the address its box-to-box
// frames come from and go to, and the next-hop MAC toward it.
struct TreeBox {
  uint32_t ip = 0;  // host order
  wire::MacAddr mac{};
  // Pkt::meta of the frames sent to this box: the caller's routing tag (the
  // data plane's transmit leaves by the port opposite the slot in meta).
  uint16_t meta = 0;
  bool operator==(const TreeBox&) const = default;
};

struct TreeChild {
  enum class Kind : uint8_t { rank, box };
  Kind kind = Kind::rank;
  uint16_t index = 0;  // rank: the ring rank; box: index into TreeSpec::boxes
  bool operator==(const TreeChild&) const = default;
};

// This box's part of a ring's tree.
struct TreeSpec {
  TreeBox self;                     // this box (source of its frames, their destination)
  std::vector<TreeChild> children;  // reduction order
  std::vector<TreeBox> boxes;       // child boxes; the wire's child index is the position
  bool has_parent = false;          // false: this box is the root
  TreeBox parent;                   // has_parent only
  uint16_t index_at_parent = 0;     // this box's child index at its parent
  bool operator==(const TreeSpec&) const = default;

  static TreeChild rank(uint16_t r) { return {TreeChild::Kind::rank, r}; }
  static TreeChild box(uint16_t b) { return {TreeChild::Kind::box, b}; }
};

// Every field against the ring it belongs to; the Status names the first bad
// one: a self address; children not empty, at most kMaxRanks; every rank
// below P and listed once; every child box listed exactly once, at most
// kMaxChildBoxes, with an address other than self's; a parent with an
// address when has_parent; and something to do (a child box or a parent).
Status validate_tree(const RingSpec& ring, const TreeSpec& tree);

// Box-to-box traffic of one ring's tree node (RingCounters::tree).
struct TreeCounters {
  uint64_t partials_sent = 0;      // first partial of a cell sent up
  uint64_t partials_resent = 0;    // sent up again (a duplicate reached the awaiting cell)
  uint64_t partials_received = 0;  // taken from child boxes into cells
  uint64_t results_received = 0;   // from the parent, delivered
  uint64_t results_sent = 0;       // to child boxes on delivery
  uint64_t results_resent = 0;     // to a child box whose partial reached a complete cell
  uint64_t queries_sent = 0;       // to child boxes missing from a cell a partial came to again
  uint64_t finals_sent = 0;        // the result sent up from a complete cell (a query's answer)
  uint64_t finals_received = 0;    // from a child box, delivered
};

// Bytes a tree node adds to its ring's memory (ring_memory_bytes): the
// child boxes' partials, one payload per child box per cell.
uint64_t tree_memory_bytes(const RingSpec& ring, const TreeSpec& tree) noexcept;

}  // namespace netreduce::engine
