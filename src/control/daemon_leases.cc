// The daemon's lease thread: removes leased rings not renewed in time, from
// the table first, then from the data plane (docs/design.md#ownership-and-leases;
// threads and locks: control/daemon.h).
#include <spdlog/spdlog.h>

#include <vector>

#include "control/daemon.h"
#include "control/daemon_shared.h"

namespace netreduce::control {

using nlohmann::json;

// Wakes every 100 ms (a lease is at least kMinLeaseMs, so a ring outlives its
// lease by at most a tenth of the shortest one, plus the data plane changes
// ahead of it).
void Daemon::lease_main() {
  run_until_stopped(std::chrono::milliseconds(100), [this] {
    if (any_lease_expired()) expire_leases();
  });
}

bool Daemon::any_lease_expired() {
  std::lock_guard lock(mu_);
  const auto now = SteadyClock::now();
  for (const auto& [id, rec] : rings_)
    if (rec.lease_ms && rec.expires <= now) return true;
  return false;
}

void Daemon::expire_leases() {
  std::lock_guard change(change_mu_);
  std::vector<uint32_t> removed;  // from the table: now from the data plane
  {
    std::lock_guard lock(mu_);
    const auto now = SteadyClock::now();  // a renewal that came first still counts
    std::vector<uint32_t> expired;
    for (const auto& [id, rec] : rings_)
      if (rec.lease_ms && rec.expires <= now) expired.push_back(id);
    for (uint32_t id : expired) {
      RingRecord old = rings_.at(id);
      rings_.erase(id);
      if (Status s = save_locked(); !s) {  // keep it; try again on the next tick
        rings_.emplace(id, std::move(old));
        spdlog::error("ring {}: lease expired but the state cannot be saved: {}", id,
                      s.to_string());
        break;
      }
      queue_revoke_locked(old.etcd_lease, old);  // the peers' entries go
      if (old.local) removed.push_back(id);
      ++counters_.rings_expired;
      spdlog::warn("ring {} removed: its lease of {} ms was not renewed in time", id, old.lease_ms);
    }
  }
  for (uint32_t id : removed) {
    // A data plane that is down, or lost the ring, is fixed by the
    // reconciler; so are the rest after a stop (the next start prunes them).
    if (stopping()) break;
    json ignored;
    (void)change_call(dpcmd::remove_ring(id), ignored);
  }
}

}  // namespace netreduce::control
