#include "engine/engine_json.h"

#include <cstdio>
#include <set>
#include <string>

#include "common/ring_json.h"
#include "wire/b2b_mac.h"

namespace netreduce {

using nlohmann::json;

json reasons_to_json(const engine::ReasonCounters& c) {
  json j = json::object();
  for (size_t i = 0; i < c.size(); ++i)
    j[std::string(engine::to_string(static_cast<engine::Reason>(i)))] = c[i];
  return j;
}

json ring_info_to_json(const engine::RingInfo& i) {
  json drops = json::object();
  for (size_t r = 0; r < i.counters.drops.size(); ++r)
    if (engine::fate_of(static_cast<engine::Reason>(r)) == engine::Fate::drop)
      drops[std::string(engine::to_string(static_cast<engine::Reason>(r)))] = i.counters.drops[r];
  json counters = {{"packets_aggregated", i.counters.packets_aggregated},
                   {"bytes_aggregated", i.counters.bytes_aggregated},
                   {"cells_completed", i.counters.cells_completed},
                   {"messages_completed", i.counters.messages_completed},
                   {"messages_sealed", i.counters.messages_sealed},
                   {"retransmissions_served", i.counters.retransmissions_served},
                   {"connections_rebound", i.counters.connections_rebound},
                   {"drops", drops}};
  if (i.tree) {
    const engine::TreeCounters& t = i.counters.tree;
    counters["tree"] = {
        {"partials_sent", t.partials_sent},         {"partials_resent", t.partials_resent},
        {"partials_received", t.partials_received}, {"results_received", t.results_received},
        {"results_sent", t.results_sent},           {"results_resent", t.results_resent},
        {"queries_sent", t.queries_sent},           {"finals_sent", t.finals_sent},
        {"finals_received", t.finals_received}};
  }
  return {{"spec", ring_tree_to_json(i.spec, i.tree)},
          {"counters", counters},
          {"slots", i.slots},
          {"memory_bytes", i.memory_bytes},
          {"held_packets", i.held_packets},
          {"held_bytes", i.held_bytes},
          {"open_cells", i.open_cells},
          {"stalled_cells", i.stalled_cells}};
}

namespace {

std::string mac_to_string(const wire::MacAddr& m) {
  char b[18];
  std::snprintf(b, sizeof(b), "%02x:%02x:%02x:%02x:%02x:%02x", m[0], m[1], m[2], m[3], m[4], m[5]);
  return b;
}

// Exactly six two-digit hex bytes separated by colons.
bool mac_from_string(const std::string& s, wire::MacAddr& out) {
  if (s.size() != 17) return false;
  const auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  wire::MacAddr m{};
  for (size_t i = 0; i < 6; ++i) {
    const int hi = hex(s[3 * i]), lo = hex(s[3 * i + 1]);
    if (hi < 0 || lo < 0 || (i < 5 && s[3 * i + 2] != ':')) return false;
    m[i] = static_cast<uint8_t>(hi << 4 | lo);
  }
  out = m;
  return true;
}

// A JSON integer in [0, max] (nlohmann types a literal 0 as signed).
bool small_uint(const json& v, uint64_t max) {
  if (v.is_number_unsigned()) return v.get<uint64_t>() <= max;
  return v.is_number_integer() && v.get<int64_t>() >= 0 && uint64_t(v.get<int64_t>()) <= max;
}

json box_to_json(const engine::TreeBox& b, bool with_port) {
  json j = {{"ip", ipv4_to_string(b.ip)}, {"mac", mac_to_string(b.mac)}};
  if (with_port) j["port"] = tree_port_of_meta(b.meta) == 0 ? "a" : "b";
  return j;
}

Status only_keys(const json& j, const std::string& field, std::initializer_list<const char*> keys) {
  for (const auto& [k, v] : j.items()) {
    bool known = false;
    for (const char* key : keys) known = known || k == key;
    if (!known) return Status::invalid(field + "." + k, "unknown field");
  }
  return {};
}

// {"ip", "mac"[, "port"]} at `field`.
Status box_from_json(const json& j, const std::string& field, bool with_port,
                     engine::TreeBox& out) {
  if (!j.is_object())
    return Status::invalid(field, with_port ? "must be an object {\"ip\", \"mac\", \"port\"}"
                                            : "must be an object {\"ip\", \"mac\"}");
  if (Status s = with_port ? only_keys(j, field, {"ip", "mac", "port"})
                           : only_keys(j, field, {"ip", "mac"});
      !s)
    return s;
  engine::TreeBox b;
  if (!j.contains("ip")) return Status::invalid(field + ".ip", "is required");
  if (!j["ip"].is_string() || !ipv4_from_string(j["ip"].get<std::string>(), b.ip) || b.ip == 0)
    return Status::invalid(field + ".ip", "must be an IPv4 address string such as \"10.0.0.1\"");
  if (!j.contains("mac")) return Status::invalid(field + ".mac", "is required");
  if (!j["mac"].is_string() || !mac_from_string(j["mac"].get<std::string>(), b.mac))
    return Status::invalid(field + ".mac",
                           "must be a MAC address string such as \"02:00:00:00:00:01\"");
  if (with_port) {
    if (!j.contains("port")) return Status::invalid(field + ".port", "is required");
    const json& p = j["port"];
    unsigned port = 2;
    if (p.is_string() && (p == "a" || p == "A")) port = 0;
    if (p.is_string() && (p == "b" || p == "B")) port = 1;
    if (small_uint(p, 1)) port = p.get<unsigned>();
    if (port > 1)
      return Status::invalid(field + ".port",
                             "must be \"a\" or \"b\" (or 0 / 1): the port toward that box");
    b.meta = tree_meta_of_port(port);
  }
  out = b;
  return {};
}

}  // namespace

bool key_from_hex(const std::string& s, wire::B2bKey& out) {
  if (s.size() != 2 * out.size()) return false;
  auto nibble = [](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  for (size_t i = 0; i < out.size(); ++i) {
    const int hi = nibble(s[2 * i]), lo = nibble(s[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    out[i] = static_cast<uint8_t>(hi << 4 | lo);
  }
  return true;
}

std::string key_to_hex(const wire::B2bKey& k) { return wire::to_hex(k.data(), k.size()); }

json tree_to_json(const engine::TreeSpec& t, KeyShown key) {
  json children = json::array(), boxes = json::array();
  for (const engine::TreeChild& c : t.children)
    children.push_back({{c.kind == engine::TreeChild::Kind::rank ? "rank" : "box", c.index}});
  for (const engine::TreeBox& b : t.boxes) boxes.push_back(box_to_json(b, true));
  json j = {{"self", box_to_json(t.self, false)},
            {"children", children},
            {"boxes", boxes},
            {"index_at_parent", t.index_at_parent},
            {"epoch", t.epoch}};
  if (t.has_parent) j["parent"] = box_to_json(t.parent, true);
  if (key == KeyShown::included) {
    j["key"] = key_to_hex(t.key);
  } else {
    j["key_id"] = wire::B2bMac::key_id(t.key);
  }
  return j;
}

Status tree_from_json(const json& j, const engine::RingSpec& ring, engine::TreeSpec& out) {
  if (!j.is_object()) return Status::invalid("tree", "must be an object");
  if (Status s = only_keys(
          j, "tree", {"self", "children", "boxes", "parent", "index_at_parent", "epoch", "key"});
      !s)
    return s;
  engine::TreeSpec t;
  if (!j.contains("epoch")) return Status::invalid("tree.epoch", "is required");
  if (!small_uint(j["epoch"], 0xFFFFFFFF))
    return Status::invalid("tree.epoch", "must be an integer in 0..4294967295");
  t.epoch = j["epoch"].get<uint32_t>();
  if (!j.contains("key")) return Status::invalid("tree.key", "is required");
  if (!j["key"].is_string() || !key_from_hex(j["key"].get<std::string>(), t.key))
    return Status::invalid("tree.key", "must be a string of " +
                                           std::to_string(2 * wire::kB2bKeyBytes) + " hex digits");
  if (!j.contains("self")) return Status::invalid("tree.self", "is required");
  if (Status s = box_from_json(j["self"], "tree.self", false, t.self); !s) return s;
  if (!j.contains("children")) return Status::invalid("tree.children", "is required");
  const json& ch = j["children"];
  if (!ch.is_array()) return Status::invalid("tree.children", "must be an array");
  for (size_t i = 0; i < ch.size(); ++i) {
    const std::string field = "tree.children[" + std::to_string(i) + "]";
    const json& c = ch[i];
    const bool rank = c.is_object() && c.size() == 1 && c.contains("rank");
    const bool box = c.is_object() && c.size() == 1 && c.contains("box");
    const json* v = rank ? &c["rank"] : box ? &c["box"] : nullptr;
    if (!v || !small_uint(*v, 0xFFFF))
      return Status::invalid(field, "must be {\"rank\": r} or {\"box\": i} (i into boxes)");
    const auto index = v->get<uint16_t>();
    t.children.push_back(rank ? engine::TreeSpec::rank(index) : engine::TreeSpec::box(index));
  }
  if (j.contains("boxes")) {
    const json& bs = j["boxes"];
    if (!bs.is_array()) return Status::invalid("tree.boxes", "must be an array");
    t.boxes.resize(bs.size());
    for (size_t i = 0; i < bs.size(); ++i)
      if (Status s =
              box_from_json(bs[i], "tree.boxes[" + std::to_string(i) + "]", true, t.boxes[i]);
          !s)
        return s;
  }
  if (j.contains("parent")) {
    t.has_parent = true;
    if (Status s = box_from_json(j["parent"], "tree.parent", true, t.parent); !s) return s;
  }
  if (j.contains("index_at_parent")) {
    const json& v = j["index_at_parent"];
    if (!small_uint(v, 0xFFFF))
      return Status::invalid("tree.index_at_parent", "must be a non-negative integer");
    if (!t.has_parent && v.get<uint64_t>() != 0)
      return Status::invalid("tree.index_at_parent", "only with a parent");
    t.index_at_parent = v.get<uint16_t>();
  }
  if (Status s = engine::validate_tree(ring, t); !s)
    return Status(s.code(), "tree." + s.field(), s.message());
  out = std::move(t);
  return {};
}

Status ring_tree_from_json(const json& j, engine::RingSpec& spec,
                           std::optional<engine::TreeSpec>& tree) {
  if (!j.is_object() || !j.contains("tree")) {
    if (Status s = ring_from_json(j, spec); !s) return s;
    tree.reset();
    return {};
  }
  json rest = j;
  rest.erase("tree");
  engine::RingSpec s;
  if (Status st = ring_from_json(rest, s); !st) return st;
  engine::TreeSpec t;
  if (Status st = tree_from_json(j["tree"], s, t); !st) return st;
  spec = std::move(s);
  tree = std::move(t);
  return {};
}

json ring_tree_to_json(const engine::RingSpec& spec, const std::optional<engine::TreeSpec>& tree,
                       KeyShown key) {
  json j = ring_to_json(spec);
  if (tree) j["tree"] = tree_to_json(*tree, key);
  return j;
}

}  // namespace netreduce
