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
  uint64_t reconciles = 0;
  uint64_t reconcile_failures = 0;
  uint64_t rings_pushed = 0;
  uint64_t rings_pruned = 0;
  uint64_t restarts_seen = 0;
  double cache_age_seconds = 0;  // since the data plane replies above were taken
  bool cache_fresh = false;      // the last refresh reached the data plane
  HttpStats http;
  uint64_t leased_rings = 0;   // configured rings with a lease
  uint64_t rings_expired = 0;  // leased rings removed for want of renewal
  // Fabric (the daemon's fabric section; all 0 without one).
  uint64_t fabric_pushes = 0;         // entries a peer daemon accepted
  uint64_t fabric_push_failures = 0;  // pushes and removals that failed (retried)
  uint64_t fabric_removals = 0;       // removals a peer daemon confirmed
  uint64_t fabric_pending = 0;        // entries and removals not yet delivered
};

std::string render_metrics(const MetricsInput& in);

}  // namespace netreduce::control
