// Fabric trees: which box of a multi-rack fabric holds which part of a ring.
// A pure function of the ring's members and the fabric configuration
// (control/config.h), so every daemon computes the same trees.
//
//   - Each member's rack: the rack whose worker CIDRs hold its address (a
//     member in no rack is a 400 naming members[i]).
//   - One rack: a plain ring on its leaf (no tree, no spine), even when that
//     leaf has a parent.
//   - Several racks: the boxes on the paths from the involved leaves up to
//     their lowest common ancestor (the tree's root). Each box's children
//     are its own local ranks in rank order (a box may be a leaf and a
//     parent), then its involved child boxes in fabric order
//     (fabric.boxes); its parent is its fabric parent, except at the root.
//     self = the box's b2b_ip/b2b_mac; a neighbour's "port" is this box's
//     port toward it (port_to_parent, ports.<child>).
//   - Every node carries the installation's TreeSecret (drawn by the
//     daemon that creates the ring; the same on every box).
//   - Every node is built as the data plane's tree JSON and read back with
//     engine_json's tree_from_json, so engine::validate_tree checks it.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "control/config.h"
#include "engine/tree.h"

namespace netreduce::control {

struct FabricEntry {
  std::string box;                       // fabric box name
  std::optional<engine::TreeSpec> tree;  // none: a plain ring (the one-rack case)
};

// A tree installation's epoch and key (engine::TreeSpec).
struct TreeSecret {
  uint32_t epoch = 0;
  wire::B2bKey key{};
};

// Every involved box's entry, in fabric order (fabric.boxes).
Status compute_fabric_entries(const engine::RingSpec& spec, const FabricConfig& fabric,
                              const TreeSecret& secret, std::vector<FabricEntry>& out);

// What GET /v1/status says of the fabric: {"self": name, "racks": [{"leaf":
// name, "workers": ["10.0.1.0/24", ...]}, ...]}, racks in fabric.racks
// order. Host libraries order their rings by it
// (docs/host-library.md#the-order-of-the-ring).
nlohmann::json fabric_outline(const FabricConfig& fabric);

// The ring JSON a box's data plane installs: the spec with "tree" when there is one.
nlohmann::json fabric_entry_json(const engine::RingSpec& spec, const FabricEntry& e);

}  // namespace netreduce::control
