// JSON forms of the engine's counters and ring reports (reasons by name,
// a ring's spec, counters and state), and of a ring's tree node, for the
// data plane's control socket, its --rings file and telemetry. Above both
// the engine and common/ring_json.h: neither of them includes this.
//
// A tree node (engine/tree.h) rides in the ring spec as an optional "tree"
// object (install_ring's "ring", a --rings file entry):
//   "tree": {"self": {"ip": "10.9.0.1", "mac": "02:00:00:00:09:01"},
//            "children": [{"rank": 0}, {"rank": 1}, {"box": 0}],   reduction order
//            "boxes": [{"ip": "10.9.0.2", "mac": "...", "port": "a"}],  child boxes
//            "parent": {"ip": "10.9.0.9", "mac": "...", "port": "b"},   absent at the root
//            "index_at_parent": 0,                                 0 if absent
//            "epoch": 3054, "key": "64 hex digits"}            the installation's
// "port" is the box's port ("a" or "b", or 0 / 1: the configuration's
// ports[0] / ports[1]) through which that neighbour is reached: its frames
// leave there, with the neighbour's "mac" as destination and self's "mac"
// as source. It becomes TreeBox::meta = the other slot, since the data
// plane's transmit sends a packet out of the port opposite its meta (the
// RX slot of a forwarded packet). Every error names its field
// ("tree.boxes[1].port"); validate_tree's fields get the "tree." prefix.
// "epoch" and "key" are required (wire/b2b.h: every box of the tree holds
// the same); the key is written out only with KeyShown::included (a push
// to a box, the daemon's state file), never in a report, which shows its
// "key_id" instead (wire::B2bMac::key_id, 16 hex digits) and cannot be
// installed as it is.
// Only the data plane takes a tree: ring_from_json (daemon, host library)
// still refuses the field as unknown.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "common/status.h"
#include "engine/engine.h"

namespace netreduce {

nlohmann::json reasons_to_json(
    const engine::ReasonCounters& c);  // {"bad_icrc": 3, ...}, every reason
// spec (+ "tree") + counters (+ "tree" counters of a tree node) + state
nlohmann::json ring_info_to_json(const engine::RingInfo& info);

// A TreeBox's "port" from its meta, and back (see the top).
inline unsigned tree_port_of_meta(uint16_t meta) { return (meta & 1u) ^ 1u; }
inline uint16_t tree_meta_of_port(unsigned port) { return static_cast<uint16_t>(port ^ 1u); }

// A tree key as 2 * kB2bKeyBytes hex digits (lowercase out, either case in).
std::string key_to_hex(const wire::B2bKey& k);
bool key_from_hex(const std::string& s, wire::B2bKey& out);

enum class KeyShown : bool { omitted, included };
nlohmann::json tree_to_json(const engine::TreeSpec& tree, KeyShown key = KeyShown::omitted);
// Shape and addresses of "tree", then validate_tree against `ring`.
Status tree_from_json(const nlohmann::json& j, const engine::RingSpec& ring, engine::TreeSpec& out);
// A ring spec with an optional "tree" (ring_from_json for the rest):
// `tree` is empty without one.
Status ring_tree_from_json(const nlohmann::json& j, engine::RingSpec& spec,
                           std::optional<engine::TreeSpec>& tree);
// The ring spec JSON with the tree inside ("tree" only when there is one).
nlohmann::json ring_tree_to_json(const engine::RingSpec& spec,
                                 const std::optional<engine::TreeSpec>& tree,
                                 KeyShown key = KeyShown::omitted);

}  // namespace netreduce
