// /metrics: the data plane's counters in the Prometheus text format, built
// with prometheus-cpp's core (Registry + TextSerializer) from the replies of
// the data plane's `status`, `stats` and `list_rings` commands, taken by the
// daemon's metrics thread every metrics.refresh_interval_ms (a scrape never
// waits for the data plane; netreduce_metrics_cache_age_seconds says how old
// they are). A fresh registry per scrape mirrors the data plane's own
// counters (which only grow while it runs and restart from 0 with it, which
// Prometheus' rate() handles as a counter reset). The full list of series is
// in docs/operations.md#prometheus-metrics.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace netreduce::control {

// The HTTP front end's counters (control/http_server.h).
struct HttpStats {
  uint64_t open_connections = 0;
  uint64_t accepted = 0;
  std::vector<std::pair<std::string, uint64_t>> refused;  // reason -> count
};

// The daemon's own counters, declared once: the field in DaemonCounters
// (control/daemon.h) and DaemonCounterValues, the Prometheus series, its help.
#define NETREDUCE_DAEMON_COUNTERS(X)                                               \
  X(reconciles, "netreduce_reconciles_total",                                      \
    "completed passes making the data plane's rings equal to the daemon's state")  \
  X(reconcile_failures, "netreduce_reconcile_failures_total",                      \
    "reconcile passes that failed (a ring refused, the data plane lost; retried)") \
  X(rings_pushed, "netreduce_reconcile_ring_installs_total",                       \
    "rings the reconciler (re)installed on the data plane")                        \
  X(rings_pruned, "netreduce_reconcile_ring_removals_total",                       \
    "rings the reconciler removed from the data plane (not in the state)")         \
  X(restarts_seen, "netreduce_dataplane_restarts_total",                           \
    "data plane restarts the daemon observed (instance changes)")                  \
  X(rings_expired, "netreduce_rings_expired_total",                                \
    "leased rings the daemon removed because their lease was not renewed in time") \
  X(fabric_publishes, "netreduce_fabric_publishes_total",                          \
    "fabric rings whose peers' entries this daemon (their origin) wrote to etcd")  \
  X(fabric_entries_applied, "netreduce_fabric_entries_applied_total",              \
    "fabric entries for this box read from etcd and taken into its table")         \
  X(fabric_entries_refused, "netreduce_fabric_entries_refused_total",              \
    "fabric entries for this box refused (its ack tells the origin why)")          \
  X(fabric_entries_removed, "netreduce_fabric_entries_removed_total",              \
    "fabric entries removed because etcd no longer holds them")                    \
  X(fabric_etcd_errors, "netreduce_fabric_etcd_errors_total",                      \
    "etcd calls that failed (no member answered in time, or etcd refused)")

// One reading of every daemon counter.
struct DaemonCounterValues {
#define NETREDUCE_X(name, series, help) uint64_t name = 0;
  NETREDUCE_DAEMON_COUNTERS(NETREDUCE_X)
#undef NETREDUCE_X
};

struct MetricsInput {
  bool dataplane_up = false;
  nlohmann::json status;  // data plane replies (null while it is down)
  nlohmann::json stats;
  nlohmann::json rings;  // array of ring_info_to_json + "worker"
  uint64_t configured_rings = 0;
  uint64_t configured_memory = 0;
  uint64_t max_rings = 0;
  uint64_t max_memory = 0;
  uint64_t connects = 0;
  DaemonCounterValues counters;
  double cache_age_seconds = 0;  // since the data plane replies above were taken
  bool cache_fresh = false;      // the last refresh reached the data plane
  HttpStats http;
  uint64_t leased_rings = 0;    // configured rings with a lease
  uint64_t fabric_pending = 0;  // origin: peer entries not published or not installed
};

std::string render_metrics(const MetricsInput& in);

}  // namespace netreduce::control
