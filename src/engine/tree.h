// Tree entries: a ring whose members sit in several racks
// (docs/design.md#hierarchy). A box's part of the tree is a TreeSpec
// installed with the ring (Engine::install_ring(spec, tree)); without one a
// ring is a single-box ring. The frames between boxes: wire/b2b.h.
//
// Example: ring 0 -> 1 -> 2 -> 0, ranks 0 and 1 in rack 1 (leaf box L1),
// rank 2 in rack 2 (leaf L2), the spine box S the root, children L1, L2.
//  1. A box holds only its local senders' packets: L1 owns the links 0->1
//     and 1->2, L2 owns 2->0. A worker packet from another rack (a released
//     result on its way to its receiver) meets no ring link and passes.
//  2. L1's cell(m, k) takes ranks 0 and 1 (Cell::arrived), reduces them in
//     rank order and sends the partial up: the cell is `awaiting`. L2 does
//     the same with rank 2 alone.
//  3. S copies each child's partial into box_data (Cell::boxes; the frame
//     is `consumed`); the second completes the cell: L1 then L2, in child
//     order, is the result, sent down to L1 and L2.
//  4. Each leaf writes the result into its held packets, fixes their ICRC,
//     releases them and marks the cell complete.
// Loss: boxes keep no per-link sequence state. If S's result to L1 is lost,
// ranks 0 and 1 resend; the resend meets L1's awaiting cell, which sends
// its partial again, and S answers from its complete cell. A restarted S
// (fresh cells) gets L2's partial again while L1 is missing: it queries
// L1, whose complete cell answers with its result as a `final`, which S
// delivers to L2. Every message is aggregated once at every box.
// Floats: each level rounds once, so only integers and min/max equal the
// flat rank-order reduction; every worker gets the same result.
// Trust: every frame carries the installation's epoch and a MAC under its
// key (wire/b2b.h); a frame with another epoch or a MAC that does not
// match is dropped before it is looked at further.
// Limits: deterministic mode only; at most kMaxChildBoxes child boxes and
// kMaxRanks children in all (one input releases at most kMaxRanks packets).
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"
#include "engine/ring.h"
#include "wire/b2b.h"
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
  // The installation's epoch and key, the same on every box of the tree
  // (drawn where the ring is created): in every frame's header and MAC.
  uint32_t epoch = 0;
  wire::B2bKey key{};
  bool operator==(const TreeSpec&) const = default;

  static TreeChild rank(uint16_t r) { return {TreeChild::Kind::rank, r}; }
  static TreeChild box(uint16_t b) { return {TreeChild::Kind::box, b}; }
};

// Every field against the ring it belongs to; the Status names the first bad
// one: a key that is not all zeros; a self address; children not empty, at most kMaxRanks; every
// rank below P and listed once; every child box listed exactly once, at most kMaxChildBoxes, with
// an address other than self's; a parent with an address when has_parent; and something to do (a
// child box or a parent).
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
