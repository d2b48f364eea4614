// netreduce-dataplane configuration loader: YAML text -> DataplaneConfig.
//
// yaml-cpp builds the node tree; everything after that is done by hand on
// scalar text, never through yaml-cpp's as<T>(), so that every value is
// checked the same strict way (decimal integers only, no silent wrap-around)
// and every message names the dotted key at fault. The walk follows the
// schema and never recurses into arbitrary nodes, so aliases that make the
// tree cyclic (`a: &x [*x]`) cannot make it loop.
//
// The strict field readers live in common/yaml_fields.h. Errors inside the
// walk are thrown as ConfigError and turned into a Status at the top; nothing (yaml-cpp's
// exceptions, bad_alloc, ...) escapes parse_config or load_config.
#include "dataplane/config.h"

#include <yaml-cpp/yaml.h>

#include <string_view>
#include <utility>

#include "common/yaml_fields.h"

namespace netreduce::dataplane {
namespace {

using namespace yaml_fields;

void parse_eal(const YAML::Node& n, const std::string& field, DataplaneConfig& cfg) {
  if (n.IsNull()) return;
  if (!n.IsSequence()) {
    fail(field, "must be a list of EAL arguments (e.g. [\"-l\", \"0-1\"]), got " + describe(n));
  }
  for (size_t i = 0; i < n.size(); ++i) {
    cfg.eal_args.push_back(text(n[i], indexed(field, i), "a string (one EAL argument)"));
  }
}

void parse_ports(const YAML::Node& n, const std::string& field, DataplaneConfig& cfg) {
  if (!n.IsSequence()) {
    fail(field, "must be a list of exactly 2 ports (- name: <device>), got " + describe(n));
  }
  if (n.size() != 2) {
    fail(field, "must list exactly 2 ports (the box is a bump in the wire between A and B), got " +
                    std::to_string(n.size()));
  }
  for (size_t i = 0; i < n.size(); ++i) {
    const std::string port_field = indexed(field, i);
    const YAML::Node port = n[i];
    if (!port.IsMap()) {
      fail(port_field,
           "must be a mapping with 'name' (e.g. '- name: net_ring0'), got " + describe(port));
    }
    PortConfig pc;
    bool has_name = false;
    for_each_key(port, port_field, {"name"},
                 [&](std::string_view, const YAML::Node& v, const std::string& f) {
                   pc.name = non_empty(v, f, "a DPDK device name (PCI address or vdev name)");
                   has_name = true;
                 });
    if (!has_name) fail(child(port_field, "name"), "required key missing");
    for (size_t j = 0; j < cfg.ports.size(); ++j) {
      if (cfg.ports[j].name == pc.name) {
        fail(child(port_field, "name"),
             "same device as " + indexed(field, j) + ": " + show(pc.name));
      }
    }
    cfg.ports.push_back(std::move(pc));
  }
}

void parse_workers(const YAML::Node& n, const std::string& field, DataplaneConfig& cfg) {
  if (n.IsNull()) return;
  if (!n.IsSequence()) fail(field, "must be a list of lcore ids (e.g. [1, 2]), got " + describe(n));
  for (size_t i = 0; i < n.size(); ++i) {
    const std::string f = indexed(field, i);
    const auto lcore = static_cast<unsigned>(integer(n[i], f, 0, 1023));
    for (size_t j = 0; j < cfg.workers.size(); ++j) {
      if (cfg.workers[j] == lcore) {
        fail(f, "duplicate lcore " + std::to_string(lcore) + " (also " + indexed(field, j) + ")");
      }
    }
    cfg.workers.push_back(lcore);
  }
}

void parse_memory(const YAML::Node& n, const std::string& path, DataplaneConfig& cfg) {
  for_each_key(n, path, {"mbufs", "mbuf_cache", "engine"},
               [&](std::string_view key, const YAML::Node& v, const std::string& f) {
                 if (key == "mbufs") {
                   cfg.mbufs = static_cast<uint32_t>(integer(v, f, 1024, UINT32_MAX));
                 } else if (key == "mbuf_cache") {
                   cfg.mbuf_cache = static_cast<uint32_t>(integer(v, f, 0, 512));
                 } else {
                   cfg.engine_memory = size_bytes(v, f);
                 }
               });
  // Only a given cache can break this: the default (256) fits the smallest
  // pool (1024).
  if (cfg.mbuf_cache > cfg.mbufs / 4) {
    fail(child(path, "mbuf_cache"), "must be at most memory.mbufs / 4 (" +
                                        std::to_string(cfg.mbufs / 4) + "), got " +
                                        std::to_string(cfg.mbuf_cache));
  }
}

void parse_engine(const YAML::Node& n, const std::string& path, DataplaneConfig& cfg) {
  for_each_key(
      n, path,
      {"reduce_mode", "icrc_fixup", "verify_icrc", "max_rings", "clt_capacity", "stall_timeout_ms"},
      [&](std::string_view key, const YAML::Node& v, const std::string& f) {
        if (key == "reduce_mode") {
          const std::string& s = scalar(v, f, "deterministic or accumulate");
          if (s == "deterministic") {
            cfg.reduce_mode = engine::ReduceMode::deterministic;
          } else if (s == "accumulate") {
            cfg.reduce_mode = engine::ReduceMode::accumulate;
          } else {
            fail(f, "must be deterministic or accumulate, got " + show(s));
          }
        } else if (key == "icrc_fixup") {
          const std::string& s = scalar(v, f, "linear or full");
          if (s == "linear") {
            cfg.icrc_fixup = engine::IcrcFixup::linear;
          } else if (s == "full") {
            cfg.icrc_fixup = engine::IcrcFixup::full;
          } else {
            fail(f, "must be linear or full, got " + show(s));
          }
        } else if (key == "verify_icrc") {
          cfg.verify_icrc = boolean(v, f);
        } else if (key == "max_rings") {
          cfg.max_rings = static_cast<unsigned>(integer(v, f, 1, 1024));
        } else if (key == "clt_capacity") {
          cfg.clt_capacity = static_cast<unsigned>(integer(v, f, 16, 1048576));
        } else {
          cfg.stall_timeout_ms = static_cast<uint32_t>(integer(v, f, 1, 3600000));
        }
      });
}

void parse_control(const YAML::Node& n, const std::string& path, DataplaneConfig& cfg) {
  for_each_key(n, path, {"socket", "max_clients", "group", "command_timeout_ms"},
               [&](std::string_view key, const YAML::Node& v, const std::string& f) {
                 if (key == "socket") {
                   cfg.control_socket = socket_path(v, f);
                 } else if (key == "max_clients") {
                   cfg.control_max_clients = static_cast<unsigned>(integer(v, f, 1, 4096));
                 } else if (key == "command_timeout_ms") {
                   cfg.command_timeout_ms = static_cast<uint32_t>(integer(v, f, 10, 600000));
                 } else {
                   std::string g = non_empty(v, f, "a group name or a numeric gid");
                   if (g.size() > 64 || g.find_first_of(" \t\n\r:/") != std::string::npos)
                     fail(f, "must be a group name or a numeric gid, got " + show(g));
                   if (g.find_first_not_of("0123456789") == std::string::npos && g.size() > 9)
                     fail(f, "numeric gid out of range, got " + show(g));
                   cfg.control_group = std::move(g);
                 }
               });
}

void parse_rings(const YAML::Node& n, const std::string& path, DataplaneConfig& cfg) {
  for_each_key(n, path, {"retire_grace_ms", "stalled_forward_ms"},
               [&](std::string_view key, const YAML::Node& v, const std::string& f) {
                 if (key == "retire_grace_ms")
                   cfg.retire_grace_ms =
                       static_cast<uint32_t>(integer(v, f, kMinRetireGraceMs, 86400000));
                 else
                   cfg.stalled_forward_ms = static_cast<uint32_t>(integer(v, f, 1, 86400000));
               });
}

void parse_faults(const YAML::Node& n, const std::string& path, DataplaneConfig& cfg) {
  for_each_key(n, path, {"enabled", "max_duration_ms", "seed"},
               [&](std::string_view key, const YAML::Node& v, const std::string& f) {
                 if (key == "enabled") {
                   cfg.faults_enabled = boolean(v, f);
                 } else if (key == "max_duration_ms") {
                   cfg.faults_max_duration_ms = static_cast<uint32_t>(integer(v, f, 1, 86400000));
                 } else {
                   cfg.faults_seed = integer(v, f, 0, INT64_MAX);
                 }
               });
}

void parse_top(const YAML::Node& root, DataplaneConfig& cfg) {
  bool has_ports = false;
  for_each_key(
      root, "",
      {"eal", "ports", "mtu", "rx_desc", "tx_desc", "burst", "idle_sleep_max_us", "idle_after_us",
       "mode", "workers", "memory", "engine", "rings", "control", "faults"},
      [&](std::string_view key, const YAML::Node& v, const std::string& f) {
        if (key == "eal") {
          parse_eal(v, f, cfg);
        } else if (key == "ports") {
          parse_ports(v, f, cfg);
          has_ports = true;
        } else if (key == "mtu") {
          cfg.mtu = static_cast<uint16_t>(integer(v, f, 1500, 9600));
        } else if (key == "rx_desc") {
          cfg.rx_desc = power_of_two(v, f, 64, 16384);
        } else if (key == "tx_desc") {
          cfg.tx_desc = power_of_two(v, f, 64, 16384);
        } else if (key == "burst") {
          cfg.burst = static_cast<uint16_t>(integer(v, f, 1, 256));
        } else if (key == "idle_sleep_max_us") {
          cfg.idle_sleep_max_us = static_cast<uint32_t>(integer(v, f, 0, 100000));
        } else if (key == "idle_after_us") {
          cfg.idle_after_us = static_cast<uint32_t>(integer(v, f, 0, 10000000));
        } else if (key == "mode") {
          const std::string& s = scalar(v, f, "aggregate or forward");
          if (s == "aggregate") {
            cfg.mode = Mode::aggregate;
          } else if (s == "forward") {
            cfg.mode = Mode::forward;
          } else {
            fail(f, "must be aggregate or forward, got " + show(s));
          }
        } else if (key == "workers") {
          parse_workers(v, f, cfg);
        } else if (key == "memory") {
          parse_memory(v, f, cfg);
        } else if (key == "engine") {
          parse_engine(v, f, cfg);
        } else if (key == "rings") {
          parse_rings(v, f, cfg);
        } else if (key == "faults") {
          parse_faults(v, f, cfg);
        } else {
          parse_control(v, f, cfg);
        }
      });
  if (!has_ports) fail("ports", "required key missing (list the 2 ports: - name: <device>)");
}

}  // namespace

Status parse_config(const std::string& yaml_text, const std::string& origin, DataplaneConfig& out) {
  return yaml_fields::parse_document(
      yaml_text, origin,
      [&](const YAML::Node& root) {
        DataplaneConfig cfg;
        parse_top(root, cfg);
        out = std::move(cfg);
      },
      "it needs at least 'ports' (see config/dataplane.yaml)");
}

Status load_config(const std::string& path, DataplaneConfig& out) {
  std::string text;
  if (Status s = yaml_fields::read_file(path, text); !s) return s;
  return parse_config(text, path, out);
}

}  // namespace netreduce::dataplane
