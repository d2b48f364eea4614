// Tree entries: validation (tree.h). The packet path is tree_path.cc's.
#include "engine/tree.h"

#include <string>

namespace netreduce::engine {

Status validate_tree(const RingSpec& ring, const TreeSpec& t) {
  if (t.key == wire::B2bKey{})
    return Status::invalid("key", "the tree needs its installation's key (not all zeros)");
  if (t.self.ip == 0) return Status::invalid("self", "the box needs its box-to-box address");
  if (t.children.empty()) return Status::invalid("children", "a tree node needs children");
  if (t.children.size() > kMaxRanks)
    return Status::invalid("children", "at most " + std::to_string(kMaxRanks) +
                                           " children (ranks and boxes together)");
  if (t.boxes.size() > kMaxChildBoxes)
    return Status::invalid("boxes", "at most " + std::to_string(kMaxChildBoxes) + " child boxes");
  uint64_t ranks = 0;
  uint32_t boxes = 0;
  for (const TreeChild& c : t.children) {
    if (c.kind == TreeChild::Kind::rank) {
      if (c.index >= ring.ranks())
        return Status::invalid("children", "rank " + std::to_string(c.index) +
                                               " is not a rank of the ring (P = " +
                                               std::to_string(ring.ranks()) + ")");
      if ((ranks >> c.index) & 1)
        return Status::invalid("children", "rank " + std::to_string(c.index) + " listed twice");
      ranks |= uint64_t{1} << c.index;
    } else {
      if (c.index >= t.boxes.size())
        return Status::invalid("children", "child box " + std::to_string(c.index) +
                                               " is not in boxes (" +
                                               std::to_string(t.boxes.size()) + ")");
      if ((boxes >> c.index) & 1)
        return Status::invalid("children",
                               "child box " + std::to_string(c.index) + " listed twice");
      boxes |= uint32_t{1} << c.index;
    }
  }
  if (boxes != (uint32_t{1} << t.boxes.size()) - 1)
    return Status::invalid("children", "every child box must be a child");
  for (size_t b = 0; b < t.boxes.size(); ++b)
    if (t.boxes[b].ip == 0 || t.boxes[b].ip == t.self.ip)
      return Status::invalid(
          "boxes", "child box " + std::to_string(b) + " needs an address other than the box's own");
  if (t.has_parent) {
    if (t.parent.ip == 0 || t.parent.ip == t.self.ip)
      return Status::invalid("parent", "the parent needs an address other than the box's own");
    if (t.index_at_parent >= kMaxChildBoxes)
      return Status::invalid("index_at_parent",
                             "below " + std::to_string(kMaxChildBoxes) + " (a parent's child box)");
  } else if (t.boxes.empty()) {
    return Status::invalid("parent",
                           "a root without child boxes is a single-box ring: install it without "
                           "a tree");
  }
  return {};
}

uint64_t tree_memory_bytes(const RingSpec& ring, const TreeSpec& tree) noexcept {
  return uint64_t{slots_for_window(ring.window)} * ring.msg_len * tree.boxes.size() *
         ring.payload_bytes;
}

}  // namespace netreduce::engine
