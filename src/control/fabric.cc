// Fabric trees (control/fabric.h has the rules).
#include "control/fabric.h"

#include <algorithm>
#include <map>

#include "common/ring_json.h"
#include "engine/engine_json.h"

namespace netreduce::control {

using nlohmann::json;

namespace {

// The rack (index into fabric.racks) whose CIDRs hold addr, or -1.
int rack_of(const FabricConfig& fc, uint32_t addr) {
  for (size_t r = 0; r < fc.racks.size(); ++r)
    for (const auto& [net, len] : fc.racks[r].workers) {
      const uint32_t mask = len == 0 ? 0 : ~uint32_t{0} << (32 - len);
      if ((addr & mask) == net) return static_cast<int>(r);
    }
  return -1;
}

std::string port_toward(const FabricBox& b, const std::string& child) {
  for (const auto& [c, side] : b.ports)
    if (c == child) return side;
  return "";  // config validation makes this unreachable
}

}  // namespace

json fabric_outline(const FabricConfig& fc) {
  json racks = json::array();
  for (const FabricRack& r : fc.racks) {
    json workers = json::array();
    for (const auto& [net, len] : r.workers)
      workers.push_back(ipv4_to_string(net) + "/" + std::to_string(len));
    racks.push_back({{"leaf", r.leaf}, {"workers", workers}});
  }
  return {{"self", fc.self}, {"racks", racks}};
}

Status compute_fabric_entries(const engine::RingSpec& spec, const FabricConfig& fc,
                              const TreeSecret& secret, std::vector<FabricEntry>& out) {
  const size_t nb = fc.boxes.size();
  // Local ranks per box, in rank order.
  std::vector<std::vector<uint16_t>> ranks(nb);
  for (size_t r = 0; r < spec.members.size(); ++r) {
    const int rack = rack_of(fc, spec.members[r]);
    if (rack < 0)
      return Status::invalid("members[" + std::to_string(r) + "]",
                             ipv4_to_string(spec.members[r]) +
                                 " is in no rack of the fabric (fabric.racks[].workers); "
                                 "every member must sit behind a leaf");
    ranks[static_cast<size_t>(fc.find(fc.racks[rack].leaf))].push_back(static_cast<uint16_t>(r));
  }
  std::vector<int> parent(nb, -1), depth(nb, 0);
  for (size_t b = 0; b < nb; ++b)
    parent[b] = fc.boxes[b].parent.empty() ? -1 : fc.find(fc.boxes[b].parent);
  for (size_t b = 0; b < nb; ++b)
    for (int at = parent[b]; at >= 0; at = parent[at]) ++depth[b];

  std::vector<size_t> leaves;
  for (size_t b = 0; b < nb; ++b)
    if (!ranks[b].empty()) leaves.push_back(b);
  out.clear();
  if (leaves.size() == 1) {
    out.push_back({fc.boxes[leaves[0]].name, std::nullopt});
    return {};
  }
  // The lowest common ancestor: lift the deeper of the two until they meet.
  int lca = static_cast<int>(leaves[0]);
  for (size_t i = 1; i < leaves.size(); ++i) {
    int a = lca, b = static_cast<int>(leaves[i]);
    while (a != b) {
      if (depth[a] >= depth[b])
        a = parent[a];
      else
        b = parent[b];
    }
    lca = a;
  }
  std::vector<bool> involved(nb, false);
  for (size_t leaf : leaves)
    for (int at = static_cast<int>(leaf);; at = parent[at]) {
      involved[at] = true;
      if (at == lca) break;
    }
  // Child boxes of each involved box, in fabric order.
  std::vector<std::vector<size_t>> kids(nb);
  for (size_t b = 0; b < nb; ++b)
    if (involved[b] && static_cast<int>(b) != lca) kids[parent[b]].push_back(b);

  for (size_t b = 0; b < nb; ++b) {
    if (!involved[b]) continue;
    const FabricBox& box = fc.boxes[b];
    json children = json::array(), boxes = json::array();
    for (uint16_t r : ranks[b]) children.push_back({{"rank", r}});
    for (size_t k = 0; k < kids[b].size(); ++k) {
      const FabricBox& c = fc.boxes[kids[b][k]];
      children.push_back({{"box", k}});
      boxes.push_back({{"ip", c.b2b_ip}, {"mac", c.b2b_mac}, {"port", port_toward(box, c.name)}});
    }
    json tree = {{"self", {{"ip", box.b2b_ip}, {"mac", box.b2b_mac}}},
                 {"children", children},
                 {"epoch", secret.epoch},
                 {"key", key_to_hex(secret.key)}};
    if (!boxes.empty()) tree["boxes"] = boxes;
    if (static_cast<int>(b) != lca) {
      const FabricBox& p = fc.boxes[parent[b]];
      const auto& sib = kids[parent[b]];
      tree["parent"] = {{"ip", p.b2b_ip}, {"mac", p.b2b_mac}, {"port", box.port_to_parent}};
      tree["index_at_parent"] = std::find(sib.begin(), sib.end(), b) - sib.begin();
    }
    engine::TreeSpec t;
    if (Status s = tree_from_json(tree, spec, t); !s)
      return Status::invalid("fabric", "box " + box.name + ": " + s.to_string());
    out.push_back({box.name, std::move(t)});
  }
  return {};
}

json fabric_entry_json(const engine::RingSpec& spec, const FabricEntry& e) {
  return ring_tree_to_json(spec, e.tree, KeyShown::included);
}

}  // namespace netreduce::control
