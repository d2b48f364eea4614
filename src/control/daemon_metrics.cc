// The daemon's metrics thread and /metrics: the data plane's figures cached
// every metrics.refresh_interval_ms, so that a scrape never waits for the
// data plane (control/metrics.h renders them).
#include <algorithm>
#include <memory>

#include "control/daemon.h"
#include "control/daemon_shared.h"

namespace netreduce::control {

using nlohmann::json;

void Daemon::metrics_main() {
  run_until_stopped(std::chrono::milliseconds(cfg_.metrics_refresh_ms),
                    [this] { refresh_metrics(); });
}

void Daemon::refresh_metrics() {
  auto c = std::make_shared<MetricsCache>();
  c->asked = std::chrono::steady_clock::now();
  json st, stats, rings;
  c->dataplane_up = dp_.call(dpcmd::status(), st).ok() && dp_.call(dpcmd::stats(), stats).ok() &&
                    dp_.call(dpcmd::list_rings(), rings).ok();
  if (c->dataplane_up) {
    c->status = std::move(st);
    c->stats = std::move(stats);
    c->rings = rings.value("rings", json::array());
  }
  {
    std::lock_guard lock(mu_);  // this thread may wait; scrapes do not
    c->configured_rings = rings_.size();
    c->configured_memory = memory_locked();
    for (const auto& [id, rec] : rings_) c->leased_rings += rec.lease_ms ? 1 : 0;
  }
  c->taken = std::chrono::steady_clock::now();
  std::lock_guard lock(cache_mu_);
  cache_ = std::move(c);
}

std::optional<bool> Daemon::installed_per_cache(const RingRecord& rec,
                                                std::chrono::steady_clock::time_point since) {
  std::shared_ptr<const MetricsCache> c;
  {
    std::lock_guard lock(cache_mu_);
    c = cache_;
  }
  if (!c || c->asked < since) return std::nullopt;
  if (!c->dataplane_up) return false;
  return std::any_of(c->rings.begin(), c->rings.end(),
                     [&](const json& r) { return installed_as(r, rec); });
}

std::string Daemon::metrics(const HttpStats& http) {
  std::shared_ptr<const MetricsCache> c;
  {
    std::lock_guard lock(cache_mu_);
    c = cache_;
  }
  MetricsInput in;
  const auto now = std::chrono::steady_clock::now();
  in.cache_age_seconds = std::chrono::duration<double>(now - (c ? c->taken : started_)).count();
  if (c) {
    in.dataplane_up = in.cache_fresh = c->dataplane_up;
    if (c->dataplane_up) {
      in.status = c->status;
      in.stats = c->stats;
      in.rings = c->rings;
    }
    in.configured_rings = c->configured_rings;
    in.configured_memory = c->configured_memory;
    in.leased_rings = c->leased_rings;
  }
  // Live ring counts when nobody holds the lock (a write holds it across
  // the state file's fsync): never wait for it.
  if (std::unique_lock lock(mu_, std::try_to_lock); lock.owns_lock()) {
    in.configured_rings = rings_.size();
    in.configured_memory = memory_locked();
    in.leased_rings = 0;
    for (const auto& [id, rec] : rings_) in.leased_rings += rec.lease_ms ? 1 : 0;
  }
  in.max_rings = cfg_.max_rings;
  in.max_memory = cfg_.max_memory;
  in.connects = dp_.connects();
  in.counters = counters_.read();
  in.http = http;
  in.fabric_pending = fabric_pending_.load();
  return render_metrics(in);
}

}  // namespace netreduce::control
