// /metrics: the data plane's counters in the Prometheus text format, built
// with prometheus-cpp's core (Registry + TextSerializer) from the replies of
// the data plane's `status`, `stats` and `list_rings` commands, taken at
// scrape time. A fresh registry per scrape mirrors the data plane's own
// counters (which only grow while it runs and restart from 0 with it, which
// Prometheus' rate() handles as a counter reset). The full list of series is
// in README.md ("Metrics").
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace netreduce::control {

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
  uint64_t rings_pushed = 0;
  uint64_t rings_pruned = 0;
  uint64_t restarts_seen = 0;
  uint64_t leased_rings = 0;   // configured rings with a lease
  uint64_t rings_expired = 0;  // leased rings removed for want of renewal
};

std::string render_metrics(const MetricsInput& in);

}  // namespace netreduce::control
