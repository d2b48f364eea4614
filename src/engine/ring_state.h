// The rings an engine holds and their lifecycle (docs/design.md#tables and
// docs/design.md#cells-and-the-window-rule; "Ring lifecycle" in engine.h).
//
// Ring: one installed ring's state: its cells and message slots (cells.h),
// its ranks' connections and histories (history.h), held packets or stored
// headers, accumulators and results, all sized at installation: the packet path never allocates.
//
// RingTable: the fixed array of max_rings ring slots, the ring id index and
// the link table (every ring link of an installed ring or a tombstone, with
// how many of each use it), and the tombstones of removed rings.
// prepare builds a Ring on any thread (allocation and zero-fill); install
// (attach: O(P)), remove, expire, purge and info are control work run on the
// engine's thread between bursts (remove allocates its tombstone, and hands
// the detached Ring back to be freed elsewhere when asked); the packet path
// only reads find(), link() and at(), and unbind()s a rank that re-binds.
// A tombstone is written by remove and expire only; the packet path sees it
// only through the CLT entries (state retired) and the link counts.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "common/status.h"
#include "engine/cells.h"
#include "engine/clt.h"
#include "engine/engine.h"
#include "engine/history.h"
#include "engine/line_vector.h"
#include "engine/tree.h"
#include "wire/b2b_mac.h"

namespace netreduce::engine::detail {

// A ring's tree node (tree.h), built with the ring on the control thread;
// read and written (box_data) by the engine thread only.
struct TreeNode {
  TreeSpec spec;
  unsigned nboxes = 0;
  uint16_t udp_src_port = 0;  // of the frames it sends: one per tree, so RSS spreads trees
  uint16_t payload_bytes = 0;
  LineVector<uint8_t> box_data;       // S * msg_len * nboxes * payload_bytes: child boxes' partials
  std::unique_ptr<wire::B2bMac> mac;  // the installation's key, ready (seal, verify)

  uint8_t* box_data_of(size_t ci, unsigned box) noexcept {
    return box_data.data() + (ci * nboxes + box) * payload_bytes;
  }
};

// Line-aligned: built by operator new on the control thread, its per-packet
// counters share no line with another ring (maybe another worker's).
struct alignas(64) Ring {
  RingSpec spec;
  unsigned ranks = 0;  // P, spec.ranks()
  // Cell::arrived when every rank this box holds has arrived: every rank,
  // or a tree node's local ranks. Ring links are installed for these
  // ranks only (tree.h, example step 1).
  uint64_t all_ranks = 0;
  uint16_t all_boxes = 0;  // Cell::boxes when every child box has (0: no tree)
  uint32_t slots = 0;      // S
  uint32_t msg_len = 0;
  uint64_t memory = 0;
  LineVector<Cell> cells;      // S * msg_len
  LineVector<MsgSlot> msgs;    // S
  LineVector<HistEntry> hist;  // P rows of S
  LineVector<RankConn> conns;  // P
  LineVector<Held> held;       // deterministic: S * msg_len * P
  LineVector<StoredHdr> hdrs;  // accumulate: S * msg_len * P
  LineVector<uint8_t> acc;     // accumulate: S * msg_len * 2 * payload_bytes
  LineVector<uint8_t> result;  // S * msg_len * payload_bytes
  RingCounters counters;
  uint32_t held_packets = 0;
  uint64_t held_bytes = 0;
  // Cells collecting, kept by the cell state machine (engine.cc: +1 when a
  // cell starts collecting, -1 when it completes or is reset while
  // collecting), so a report finds them without looking at idle cells.
  // A tree node's awaiting cells are open too.
  uint32_t open_cells = 0;
  std::unique_ptr<TreeNode> tree;  // null: a single-box ring

  size_t cell_index(uint32_t msg_id, uint32_t k) const noexcept {
    return size_t{msg_id & (slots - 1)} * msg_len + k;
  }
  HistEntry* hist_row(unsigned rank) noexcept { return hist.data() + size_t{rank} * slots; }
  uint8_t* result_of(size_t ci) noexcept { return result.data() + ci * spec.payload_bytes; }
  uint8_t* acc_of(size_t ci) noexcept { return acc.data() + ci * 2 * spec.payload_bytes; }
};

// A removed ring during its grace period: the connections that were bound
// to it (their CLT entries are `retired`, owner = this tombstone's index
// unless a live ring has re-bound them since) and its links.
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
using LinkTable = OpenTable<uint64_t, LinkUse>;

struct RingRef {
  uint16_t index = 0;  // into RingTable's ring slots
};
using RingIndex = OpenTable<uint64_t, RingRef>;  // ring id -> slot

inline uint64_t link_key(uint32_t src, uint32_t dst) noexcept { return uint64_t{src} << 32 | dst; }

class RingTable {
 public:
  explicit RingTable(const EngineConfig& cfg);

  // Engine::prepare_ring / install_ring / remove_ring / expire_retired (engine.h).
  static Status prepare(const EngineConfig& cfg, const RingSpec& spec, const TreeSpec* tree,
                        PreparedRing& out);
  static Status prepare(const EngineConfig& cfg, const RingSpec& spec, PreparedRing& out) {
    return prepare(cfg, spec, nullptr, out);
  }
  Status install(PreparedRing& ring);
  Status remove(uint32_t ring_id, uint64_t now, Clt& clt, std::vector<Pkt>& released,
                ReasonCounters& counters, PreparedRing* detached);
  unsigned expire(uint64_t now, Clt& clt) noexcept;

  // Forgets rank's connection (its CLT entry) and history.
  void unbind(Ring& ring, unsigned rank, Clt& clt) noexcept;

  // The packet path's reads.
  int find(uint32_t ring_id) const noexcept {
    const RingIndex::Slot* s = by_id_.find(ring_id);
    return s ? s->index : -1;
  }
  Ring& at(uint32_t slot) noexcept { return *rings_[slot]; }
  const LinkUse* link(uint32_t src, uint32_t dst) const noexcept {
    return links_.find(link_key(src, dst));
  }
  // Tree nodes installed, and whether `ip` is the address of one of them
  // (box-to-box frames to other addresses are not this box's).
  size_t trees() const noexcept { return trees_; }
  bool is_box_ip(uint32_t ip) const noexcept {
    for (const BoxIp& b : box_ips_)
      if (b.ip == ip) return true;
    return false;
  }

  std::optional<RingInfo> info(uint32_t ring_id, uint64_t now, uint64_t stall) const;
  unsigned figures(RingFigures* out, unsigned cap, uint64_t now, uint64_t stall) const noexcept;
  std::vector<RetiredRing> retired_rings(const Clt& clt) const;
  std::vector<uint32_t> ids() const;
  size_t count() const noexcept { return by_id_.size(); }
  size_t retired_count() const noexcept { return retired_; }
  uint64_t memory() const noexcept { return memory_; }

 private:
  void release_all(Ring& ring, std::vector<Pkt>& released, ReasonCounters& counters) noexcept;
  void purge(uint32_t tomb, Clt& clt) noexcept;
  void add_box_ip(uint32_t ip);
  void drop_box_ip(uint32_t ip) noexcept;

  struct BoxIp {
    uint32_t ip = 0;
    uint32_t trees = 0;  // installed tree nodes with this self address
  };

  const EngineConfig& cfg_;
  LineVector<PreparedRing> rings_;  // max_rings slots; null: free
  RingIndex by_id_;
  LinkTable links_;
  std::vector<Tombstone> tombs_;         // grows in remove; entries reused after expiry
  size_t retired_ = 0;                   // tombstones in use
  uint64_t next_expiry_ = kRetireNever;  // earliest expiry over tombstones
  uint64_t memory_ = 0;
  size_t trees_ = 0;
  std::vector<BoxIp> box_ips_;  // written by install/remove, read per box-to-box frame
};

}  // namespace netreduce::engine::detail
