// netreduced configuration loader: the schema walk over the YAML tree. The
// field readers (strict integers, sizes, paths, unknown-key detection) are
// the shared ones in common/yaml_fields.h.
#include "control/config.h"

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
      root, "", {"listen", "auth", "state", "dataplane", "quotas"},
      [&](std::string_view key, const YAML::Node& n, const std::string& path) {
        if (key == "listen") {
          for_each_key(
              n, path, {"address", "port", "threads"},
              [&](std::string_view k, const YAML::Node& v, const std::string& f) {
                if (k == "address") {
                  std::string a = non_empty(v, f, "an IPv4 address");
                  uint32_t tmp = 0;
                  if (!ipv4_from_string(a, tmp))
                    fail(f, "must be an IPv4 address such as 127.0.0.1 or 0.0.0.0, got " + show(a));
                  cfg.bind_address = a;
                } else if (k == "port") {
                  cfg.port = static_cast<uint16_t>(integer(v, f, 1, 65535));
                } else {
                  cfg.threads = static_cast<unsigned>(integer(v, f, 1, 256));
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
        parse_top(root, cfg);
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
