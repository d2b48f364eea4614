// netreduced configuration: the YAML file (config/netreduced.yaml is the
// commented example), read with the strict field readers of
// common/yaml_fields.h, so every error names its dotted key. Checks that need
// the system (can the token file be read, can the port be bound) are made at
// start-up by the daemon, which exits with status 2 and names the key.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace netreduce::control {

// The shortest lease a ring may ask for (POST "lease_ms"), and the lower
// bound of quotas.max_lease_ms: a renewal every lease/3 stays far from a
// busy-loop against the daemon.
inline constexpr uint32_t kMinLeaseMs = 1000;

// The fabric (optional section `fabric:`): the same file on every box of a
// multi-rack fabric, with `self` naming the box this daemon runs on. Checked
// at load: one root, no cycles, every parent / leaf / port named exists, the
// racks' worker CIDRs disjoint, self one of the boxes (control/fabric.h turns
// it into tree entries).
struct FabricBox {
  std::string name;            // fabric.boxes[i].name: letters, digits, '.', '_', '-'
  std::string daemon;          // fabric.boxes[i].daemon (optional): its netreduced, for people
  std::string b2b_ip;          // fabric.boxes[i].b2b_ip: box-to-box address (dotted quad)
  std::string b2b_mac;         // fabric.boxes[i].b2b_mac: "02:00:00:00:09:01"
  std::string parent;          // fabric.boxes[i].parent: empty = none (the root)
  std::string port_to_parent;  // "a" | "b"; empty at the root
  // fabric.boxes[i].ports: child box name -> "a" | "b", one per child box.
  std::vector<std::pair<std::string, std::string>> ports;
};

struct FabricRack {
  std::string leaf;  // fabric.racks[i].leaf: a box name
  // fabric.racks[i].workers: CIDRs (address host order, prefix length).
  std::vector<std::pair<uint32_t, unsigned>> workers;
};

struct FabricConfig {
  std::string self;               // fabric.self
  std::vector<FabricBox> boxes;   // fabric.boxes, in fabric order (the child order)
  std::vector<FabricRack> racks;  // fabric.racks
  // fabric.etcd: where the fabric's rings live (control/etcd.h,
  // docs/multi-rack.md#etcd).
  std::vector<std::string> etcd_endpoints;  // fabric.etcd.endpoints: http://host:port, >= 1
  std::string etcd_prefix = "/netreduce/";  // fabric.etcd.prefix: the keys' common start
  uint32_t etcd_timeout_ms = 1000;          // fabric.etcd.timeout_ms: one call at one member

  // Index into boxes, or -1.
  int find(const std::string& name) const;
};

struct DaemonConfig {
  std::string bind_address = "127.0.0.1";  // listen.address
  uint16_t port = 7470;                    // listen.port
  unsigned threads = 8;                    // listen.threads: HTTP worker threads
  // The HTTP front end's limits (control/http_server.h says how each is enforced).
  unsigned max_connections = 256;      // listen.max_connections: open at once, all states
  uint32_t header_timeout_ms = 5000;   // listen.header_timeout_ms: a whole request head
  uint32_t body_timeout_ms = 10000;    // listen.body_timeout_ms: a whole request body
  uint32_t write_timeout_ms = 10000;   // listen.write_timeout_ms: a whole response
  uint32_t keepalive_requests = 100;   // listen.keepalive_requests: per connection
  uint64_t max_body = 1u << 20;        // listen.max_body: bytes, chunked bodies included
  unsigned dataplane_concurrency = 2;  // listen.dataplane_concurrency: < threads
  uint32_t metrics_refresh_ms = 1000;  // metrics.refresh_interval_ms: /metrics cache
  std::string token_file = "/etc/netreduce/token";  // auth.token_file: operator token
  std::string job_token_file;  // auth.job_token_file: jobs' token; empty = only the operator token
  std::string state_file = "/var/lib/netreduce/state.json";        // state.file
  std::string dataplane_socket = "/run/netreduce/dataplane.sock";  // dataplane.socket
  uint32_t dataplane_timeout_ms = 5000;   // dataplane.timeout_ms: every request's deadline
  uint32_t reconcile_interval_ms = 1000;  // dataplane.reconcile_interval_ms
  bool require_dataplane = false;         // dataplane.require: refuse rings (503) while it is down
  unsigned max_rings = 64;                // quotas.max_rings
  uint64_t max_memory = 1ull << 30;       // quotas.max_memory: bytes all rings may reserve
  uint32_t max_lease_ms = 3600000;        // quotas.max_lease_ms: longest lease a POST may ask
  std::optional<FabricConfig> fabric;     // fabric: none = a single box, as always
};

Status parse_daemon_config(const std::string& yaml_text, const std::string& origin,
                           DaemonConfig& out);
Status load_daemon_config(const std::string& path, DaemonConfig& out);

}  // namespace netreduce::control
