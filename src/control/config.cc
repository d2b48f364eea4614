// netreduced configuration loader: the schema walk over the YAML tree. The
// field readers (strict integers, sizes, paths, unknown-key detection) are
// the shared ones in common/yaml_fields.h.
#include "control/config.h"

#include <algorithm>
#include <string_view>

#include "common/ring_json.h"
#include "common/yaml_fields.h"

namespace netreduce::control {
namespace {

using namespace yaml_fields;

std::string absolute_path(const YAML::Node& v, const std::string& f) {
  std::string s = non_empty(v, f, "an absolute path");
  if (s[0] != '/') fail(f, "must be an absolute path, got " + show(s));
  return s;
}

void parse_top(const YAML::Node& root, DaemonConfig& cfg) {
  for_each_key(
      root, "", {"listen", "auth", "state", "dataplane", "quotas", "metrics"},
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

Status parse_daemon_config(const std::string& yaml_text, const std::string& origin,
                           DaemonConfig& out) {
  return yaml_fields::parse_document(
      yaml_text, origin,
      [&](const YAML::Node& root) {
        DaemonConfig cfg;
        cfg.dataplane_concurrency = 0;  // not given: derived from threads below
        parse_top(root, cfg);
        // Default: 2, but always one thread less than listen.threads, so a
        // config written before this key existed (threads: 2) still starts.
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
