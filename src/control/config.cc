// netreduced configuration loader: the schema walk over the YAML tree. The
// field readers (strict integers, sizes, paths, unknown-key detection) are
// the shared ones in common/yaml_fields.h.
#include "control/config.h"

#include <algorithm>
#include <cctype>
#include <string_view>

#include "common/ring_json.h"
#include "common/yaml_fields.h"
#include "control/etcd.h"

namespace netreduce::control {
namespace {

using namespace yaml_fields;

std::string absolute_path(const YAML::Node& v, const std::string& f) {
  std::string s = non_empty(v, f, "an absolute path");
  if (s[0] != '/') fail(f, "must be an absolute path, got " + show(s));
  return s;
}

bool mac_text_ok(const std::string& s) {
  if (s.size() != 17) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (i % 3 == 2) {
      if (c != ':') return false;
    } else if (!std::isxdigit(static_cast<unsigned char>(c))) {
      return false;
    }
  }
  return true;
}

std::string ipv4_text(const YAML::Node& v, const std::string& f) {
  std::string a = non_empty(v, f, "an IPv4 address");
  uint32_t tmp = 0;
  if (!ipv4_from_string(a, tmp))
    fail(f, "must be an IPv4 address such as 10.9.0.1, got " + show(a));
  return a;
}

std::string port_side(const YAML::Node& v, const std::string& f) {
  std::string p = non_empty(v, f, "a port, a or b");
  if (p != "a" && p != "b")
    fail(f, "must be a or b (the box's ports[0] / ports[1]), got " + show(p));
  return p;
}

template <typename Fn>
void for_each_item(const YAML::Node& n, const std::string& f, Fn&& fn) {
  if (!n.IsSequence()) fail(f, "must be a list, got " + describe(n));
  for (size_t i = 0; i < n.size(); ++i) fn(n[i], indexed(f, i));
}

FabricBox parse_box(const YAML::Node& n, const std::string& path) {
  FabricBox b;
  bool have_parent = false;
  for_each_key(
      n, path, {"name", "daemon", "b2b_ip", "b2b_mac", "parent", "port_to_parent", "ports"},
      [&](std::string_view k, const YAML::Node& v, const std::string& f) {
        if (k == "name") {
          b.name = non_empty(v, f, "a box name");
          if (b.name == "none") fail(f, "'none' is reserved (a root's parent)");
          // A name is part of etcd keys (docs/multi-rack.md#etcd).
          if (b.name.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                       "0123456789._-") != std::string::npos)
            fail(f, "may hold only letters, digits, '.', '_' and '-', got " + show(b.name));
        } else if (k == "daemon") {
          b.daemon = non_empty(v, f, "http://host:port");
          if (b.daemon.rfind("http://", 0) != 0)
            fail(f, "must be http://<host>:<port> (that box's netreduced), got " + show(b.daemon));
        } else if (k == "b2b_ip") {
          b.b2b_ip = ipv4_text(v, f);
        } else if (k == "b2b_mac") {
          b.b2b_mac = non_empty(v, f, "a MAC address");
          if (!mac_text_ok(b.b2b_mac))
            fail(f, "must be a MAC address such as 02:00:00:00:09:01, got " + show(b.b2b_mac));
        } else if (k == "parent") {
          have_parent = true;
          b.parent = non_empty(v, f, "a box name or none");
          if (b.parent == "none") b.parent.clear();
        } else if (k == "port_to_parent") {
          b.port_to_parent = port_side(v, f);
        } else {
          if (v.IsNull()) return;
          if (!v.IsMap()) fail(f, "must be a mapping <child box name>: a|b, got " + describe(v));
          for (auto it = v.begin(); it != v.end(); ++it) {
            if (!it->first.IsScalar()) fail(f, "keys must be box names");
            const std::string child_name = it->first.Scalar();
            const std::string cf = child(f, clean(child_name));
            for (const auto& [c, side] : b.ports)
              if (c == child_name) fail(cf, "key given twice");
            b.ports.emplace_back(child_name, port_side(it->second, cf));
          }
        }
      });
  for (const char* key : {"name", "b2b_ip", "b2b_mac"}) {
    const bool missing = (std::string_view(key) == "name" && b.name.empty()) ||
                         (std::string_view(key) == "b2b_ip" && b.b2b_ip.empty()) ||
                         (std::string_view(key) == "b2b_mac" && b.b2b_mac.empty());
    if (missing) fail(child(path, key), "missing (every box needs name, b2b_ip, b2b_mac, parent)");
  }
  if (!have_parent)
    fail(child(path, "parent"), "missing: name the parent box, or none at the root");
  if (!b.parent.empty() && b.port_to_parent.empty())
    fail(child(path, "port_to_parent"),
         "missing: the port (a or b) toward parent " + show(b.parent));
  if (b.parent.empty() && !b.port_to_parent.empty())
    fail(child(path, "port_to_parent"), "given for a root (parent: none)");
  return b;
}

FabricRack parse_rack(const YAML::Node& n, const std::string& path) {
  FabricRack r;
  bool have_workers = false;
  for_each_key(n, path, {"leaf", "workers"},
               [&](std::string_view k, const YAML::Node& v, const std::string& f) {
                 if (k == "leaf") {
                   r.leaf = non_empty(v, f, "a box name");
                   return;
                 }
                 have_workers = true;
                 for_each_item(v, f, [&](const YAML::Node& c, const std::string& cf) {
                   const std::string t = non_empty(c, cf, "a CIDR such as 10.1.0.0/24");
                   const size_t slash = t.find('/');
                   uint32_t addr = 0;
                   const std::string len = slash == std::string::npos ? "" : t.substr(slash + 1);
                   const bool ok = slash != std::string::npos &&
                                   ipv4_from_string(t.substr(0, slash), addr) && !len.empty() &&
                                   len.size() <= 2 &&
                                   len.find_first_not_of("0123456789") == std::string::npos &&
                                   (len == "0" || len[0] != '0') && std::stoul(len) <= 32;
                   if (!ok) fail(cf, "must be a CIDR such as 10.1.0.0/24, got " + show(t));
                   const unsigned plen = static_cast<unsigned>(std::stoul(len));
                   const uint32_t mask = plen == 0 ? 0 : ~uint32_t{0} << (32 - plen);
                   if ((addr & ~mask) != 0)
                     fail(cf, "has host bits set (" + show(t) + "); write the network address");
                   r.workers.emplace_back(addr, plen);
                 });
               });
  if (r.leaf.empty()) fail(child(path, "leaf"), "missing: the box the rack's workers sit behind");
  if (!have_workers || r.workers.empty())
    fail(child(path, "workers"), "missing or empty: the rack's worker CIDRs");
  return r;
}

uint32_t cidr_mask(unsigned len) { return len == 0 ? 0 : ~uint32_t{0} << (32 - len); }

// The checks across boxes and racks (each field is checked as it is read).
void check_fabric(const FabricConfig& fc) {
  const std::string bf = "fabric.boxes";
  for (size_t i = 0; i < fc.boxes.size(); ++i)
    for (size_t j = 0; j < i; ++j) {
      if (fc.boxes[i].name == fc.boxes[j].name)
        fail(indexed(bf, i) + ".name",
             show(fc.boxes[i].name) + " is also fabric.boxes[" + std::to_string(j) + "].name");
      if (fc.boxes[i].b2b_ip == fc.boxes[j].b2b_ip)
        fail(indexed(bf, i) + ".b2b_ip",
             show(fc.boxes[i].b2b_ip) + " is also fabric.boxes[" + std::to_string(j) + "].b2b_ip");
    }
  int roots = 0;
  for (size_t i = 0; i < fc.boxes.size(); ++i) {
    const FabricBox& b = fc.boxes[i];
    if (b.parent.empty()) {
      if (++roots > 1)
        fail(indexed(bf, i) + ".parent",
             "a second root (parent: none); a fabric has exactly one root");
      continue;
    }
    const int p = fc.find(b.parent);
    if (p < 0) fail(indexed(bf, i) + ".parent", "names no box: " + show(b.parent));
    if (static_cast<size_t>(p) == i)
      fail(indexed(bf, i) + ".parent", "a box cannot be its own parent");
    // Walk up: a cycle never reaches a root.
    int at = p;
    for (size_t steps = 0; at >= 0 && !fc.boxes[at].parent.empty(); ++steps) {
      if (steps > fc.boxes.size())
        fail(indexed(bf, i) + ".parent", "the parents form a cycle through " + show(b.name));
      at = fc.find(fc.boxes[at].parent);
    }
    // The parent names a port toward each child.
    bool named = false;
    for (const auto& [c, side] : fc.boxes[p].ports) named = named || c == b.name;
    if (!named)
      fail(indexed(bf, p) + ".ports", "names no port (a or b) toward child box " + show(b.name));
  }
  if (roots == 0) fail(bf, "no root: exactly one box needs parent: none");
  for (size_t i = 0; i < fc.boxes.size(); ++i)
    for (const auto& [c, side] : fc.boxes[i].ports) {
      const int ci = fc.find(c);
      if (ci < 0 || fc.boxes[ci].parent != fc.boxes[i].name)
        fail(indexed(bf, i) + ".ports." + clean(c),
             ci < 0 ? "names no box"
                    : "is not a child of this box (its parent is " +
                          show(fc.boxes[ci].parent.empty() ? "none" : fc.boxes[ci].parent) + ")");
    }
  const std::string rf = "fabric.racks";
  for (size_t i = 0; i < fc.racks.size(); ++i) {
    if (fc.find(fc.racks[i].leaf) < 0)
      fail(indexed(rf, i) + ".leaf", "names no box: " + show(fc.racks[i].leaf));
    for (size_t j = 0; j < i; ++j)
      if (fc.racks[j].leaf == fc.racks[i].leaf)
        fail(indexed(rf, i) + ".leaf", "box " + show(fc.racks[i].leaf) +
                                           " already has a rack (fabric.racks[" +
                                           std::to_string(j) + "]): list all its CIDRs there");
  }
  // Disjoint CIDRs: two prefixes overlap iff they agree on the shorter one.
  for (size_t i = 0; i < fc.racks.size(); ++i)
    for (size_t a = 0; a < fc.racks[i].workers.size(); ++a)
      for (size_t j = 0; j <= i; ++j)
        for (size_t b = 0; b < fc.racks[j].workers.size(); ++b) {
          if (j == i && b >= a) break;
          const auto [x, xl] = fc.racks[i].workers[a];
          const auto [y, yl] = fc.racks[j].workers[b];
          const uint32_t m = cidr_mask(std::min(xl, yl));
          if ((x & m) == (y & m))
            fail(indexed(indexed(rf, i) + ".workers", a),
                 "overlaps fabric.racks[" + std::to_string(j) + "].workers[" + std::to_string(b) +
                     "]: a worker address must name one rack");
        }
  if (fc.find(fc.self) < 0) fail("fabric.self", "names no box of fabric.boxes: " + show(fc.self));
}

void parse_etcd(const YAML::Node& n, const std::string& path, FabricConfig& fc) {
  for_each_key(n, path, {"endpoints", "prefix", "timeout_ms"},
               [&](std::string_view k, const YAML::Node& v, const std::string& f) {
                 if (k == "endpoints") {
                   for_each_item(v, f, [&](const YAML::Node& e, const std::string& ef) {
                     std::string url = non_empty(e, ef, "http://host:port");
                     if (!etcd_endpoint_ok(url))
                       fail(ef,
                            "must be http://<host>:<port> (an etcd member's client URL), "
                            "got " +
                                show(url));
                     fc.etcd_endpoints.push_back(std::move(url));
                   });
                 } else if (k == "prefix") {
                   fc.etcd_prefix = non_empty(v, f, "a key prefix such as /netreduce/");
                   if (fc.etcd_prefix.front() != '/' || fc.etcd_prefix.back() != '/')
                     fail(f, "must start and end with '/', got " + show(fc.etcd_prefix));
                 } else {
                   fc.etcd_timeout_ms = static_cast<uint32_t>(integer(v, f, 50, 60000));
                 }
               });
  if (fc.etcd_endpoints.empty())
    fail(child(path, "endpoints"), "missing or empty: the etcd members' client URLs");
}

FabricConfig parse_fabric(const YAML::Node& n, const std::string& path) {
  FabricConfig fc;
  bool have_etcd = false;
  for_each_key(n, path, {"self", "boxes", "racks", "etcd", "token_file"},
               [&](std::string_view k, const YAML::Node& v, const std::string& f) {
                 if (k == "self") {
                   fc.self = non_empty(v, f, "this box's name");
                 } else if (k == "token_file") {
                   fail(f,
                        "is no longer used: the daemons of a fabric share their rings "
                        "through etcd (fabric.etcd), not by calling each other");
                 } else if (k == "etcd") {
                   have_etcd = true;
                   parse_etcd(v, f, fc);
                 } else if (k == "boxes") {
                   for_each_item(v, f, [&](const YAML::Node& b, const std::string& bf) {
                     fc.boxes.push_back(parse_box(b, bf));
                   });
                 } else {
                   for_each_item(v, f, [&](const YAML::Node& r, const std::string& rf) {
                     fc.racks.push_back(parse_rack(r, rf));
                   });
                 }
               });
  if (fc.self.empty()) fail(child(path, "self"), "missing: the name of this box");
  if (!have_etcd)
    fail(child(path, "etcd"),
         "missing: the etcd cluster the fabric's daemons share "
         "(etcd.endpoints)");
  if (fc.boxes.empty()) fail(child(path, "boxes"), "missing or empty");
  check_fabric(fc);
  return fc;
}

void parse_top(const YAML::Node& root, DaemonConfig& cfg) {
  for_each_key(
      root, "", {"listen", "auth", "state", "dataplane", "quotas", "metrics", "fabric"},
      [&](std::string_view key, const YAML::Node& n, const std::string& path) {
        if (key == "listen") {
          for_each_key(
              n, path,
              {"address", "port", "threads", "max_connections", "header_timeout_ms",
               "body_timeout_ms", "write_timeout_ms", "keepalive_requests", "max_body",
               "dataplane_concurrency"},
              [&](std::string_view k, const YAML::Node& v, const std::string& f) {
                if (k == "address") {
                  std::string a = non_empty(v, f, "an IPv4 address");
                  uint32_t tmp = 0;
                  if (!ipv4_from_string(a, tmp))
                    fail(f, "must be an IPv4 address such as 127.0.0.1 or 0.0.0.0, got " + show(a));
                  cfg.bind_address = a;
                } else if (k == "port") {
                  cfg.port = static_cast<uint16_t>(integer(v, f, 1, 65535));
                } else if (k == "threads") {
                  cfg.threads = static_cast<unsigned>(integer(v, f, 2, 256));
                } else if (k == "max_connections") {
                  // Accepted sockets must stay below FD_SETSIZE (cpp-httplib uses select).
                  cfg.max_connections = static_cast<unsigned>(integer(v, f, 4, 900));
                } else if (k == "header_timeout_ms") {
                  cfg.header_timeout_ms = static_cast<uint32_t>(integer(v, f, 100, 300000));
                } else if (k == "body_timeout_ms") {
                  cfg.body_timeout_ms = static_cast<uint32_t>(integer(v, f, 100, 300000));
                } else if (k == "write_timeout_ms") {
                  cfg.write_timeout_ms = static_cast<uint32_t>(integer(v, f, 100, 300000));
                } else if (k == "keepalive_requests") {
                  cfg.keepalive_requests = static_cast<uint32_t>(integer(v, f, 1, 100000));
                } else if (k == "max_body") {
                  cfg.max_body = size_bytes(v, f);
                  if (cfg.max_body < 1024 || cfg.max_body > (64u << 20))
                    fail(f,
                         "must be in 1KiB..64MiB, got " + std::to_string(cfg.max_body) + " bytes");
                } else {
                  cfg.dataplane_concurrency = static_cast<unsigned>(integer(v, f, 1, 255));
                }
              });
        } else if (key == "auth") {
          for_each_key(n, path, {"token_file", "job_token_file"},
                       [&](std::string_view k, const YAML::Node& v, const std::string& f) {
                         (k == "token_file" ? cfg.token_file : cfg.job_token_file) =
                             absolute_path(v, f);
                       });
        } else if (key == "state") {
          for_each_key(n, path, {"file"},
                       [&](std::string_view, const YAML::Node& v, const std::string& f) {
                         cfg.state_file = absolute_path(v, f);
                       });
        } else if (key == "dataplane") {
          for_each_key(
              n, path, {"socket", "timeout_ms", "reconcile_interval_ms", "require"},
              [&](std::string_view k, const YAML::Node& v, const std::string& f) {
                if (k == "socket") {
                  cfg.dataplane_socket = socket_path(v, f);
                } else if (k == "timeout_ms") {
                  cfg.dataplane_timeout_ms = static_cast<uint32_t>(integer(v, f, 10, 60000));
                } else if (k == "reconcile_interval_ms") {
                  cfg.reconcile_interval_ms = static_cast<uint32_t>(integer(v, f, 50, 60000));
                } else {
                  cfg.require_dataplane = boolean(v, f);
                }
              });
        } else if (key == "fabric") {
          if (!n.IsNull()) cfg.fabric = parse_fabric(n, path);
        } else if (key == "metrics") {
          for_each_key(n, path, {"refresh_interval_ms"},
                       [&](std::string_view, const YAML::Node& v, const std::string& f) {
                         cfg.metrics_refresh_ms = static_cast<uint32_t>(integer(v, f, 100, 60000));
                       });
        } else {
          for_each_key(n, path, {"max_rings", "max_memory", "max_lease_ms"},
                       [&](std::string_view k, const YAML::Node& v, const std::string& f) {
                         if (k == "max_rings") {
                           cfg.max_rings = static_cast<unsigned>(integer(v, f, 1, 1000000));
                         } else if (k == "max_lease_ms") {
                           cfg.max_lease_ms =
                               static_cast<uint32_t>(integer(v, f, kMinLeaseMs, 86400000));
                         } else {
                           cfg.max_memory = size_bytes(v, f);
                         }
                       });
        }
      });
}

}  // namespace

int FabricConfig::find(const std::string& name) const {
  for (size_t i = 0; i < boxes.size(); ++i)
    if (boxes[i].name == name) return static_cast<int>(i);
  return -1;
}

Status parse_daemon_config(const std::string& yaml_text, const std::string& origin,
                           DaemonConfig& out) {
  return yaml_fields::parse_document(
      yaml_text, origin,
      [&](const YAML::Node& root) {
        DaemonConfig cfg;
        cfg.dataplane_concurrency = 0;  // not given: derived from threads below
        parse_top(root, cfg);
        // Default: 2, but always one thread less than listen.threads, so a
        // config without this key and with threads: 2 starts.
        if (cfg.dataplane_concurrency == 0)
          cfg.dataplane_concurrency = std::min(2u, cfg.threads - 1);
        if (cfg.dataplane_concurrency >= cfg.threads)
          fail("listen.dataplane_concurrency",
               "must be less than listen.threads (" + std::to_string(cfg.threads) +
                   "), so that health and metrics always find a free thread; got " +
                   std::to_string(cfg.dataplane_concurrency));
        out = std::move(cfg);
      },
      "write at least 'auth: {token_file: ...}' (see config/netreduced.yaml)");
}

Status load_daemon_config(const std::string& path, DaemonConfig& out) {
  std::string text;
  if (Status s = yaml_fields::read_file(path, text); !s) return s;
  return parse_daemon_config(text, path, out);
}

}  // namespace netreduce::control
