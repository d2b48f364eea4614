// The daemon's reconciler: makes the data plane's rings those of the table
// after a (re)connect, a data plane restart or a failed pass
// (docs/design.md#reconciler; threads and locks: control/daemon.h).
#include <spdlog/spdlog.h>

#include <set>

#include "control/daemon.h"
#include "control/daemon_shared.h"

namespace netreduce::control {

using nlohmann::json;

void Daemon::reconciler_main() {
  uint64_t seen_connects = 0;
  std::string seen_instance;
  bool pending = true;
  run_until_stopped(std::chrono::milliseconds(cfg_.reconcile_interval_ms), [&] {
    json st;
    const Status s = dp_.call(dpcmd::status(), st);
    if (!s && s.field() == "dataplane.timeout_ms") return;  // others held the connection: no news
    const bool was_up = dp_up_.exchange(s.ok());
    if (!s) {
      if (was_up) spdlog::warn("data plane lost: {}", s.to_string());
      pending = true;
    } else {
      const std::string instance = st.value("instance", std::string());
      if (!was_up) spdlog::info("data plane connected at {} (instance {})", dp_.path(), instance);
      if (!seen_instance.empty() && instance != seen_instance) {
        ++counters_.restarts_seen;
        spdlog::info("data plane restarted (instance {} -> {})", seen_instance, instance);
      }
      if (dp_.connects() != seen_connects || instance != seen_instance) pending = true;
      if (resync_.exchange(false)) pending = true;
      seen_connects = dp_.connects();
      seen_instance = instance;
      if (pending) {
        std::lock_guard change(change_mu_);
        RingMap table;
        {
          std::lock_guard lock(mu_);
          table = rings_;
        }
        const Status r = reconcile(table);
        if (r) {
          pending = false;
          ++counters_.reconciles;
        } else {
          ++counters_.reconcile_failures;
          spdlog::warn("reconcile: {}", r.to_string());
        }
      }
    }
  });
}

Status Daemon::reconcile(const RingMap& table) {
  json reply;
  if (Status s = dp_.call(dpcmd::list_rings(), reply); !s) return s;
  std::set<uint32_t> good;
  for (const json& r : reply.value("rings", json::array())) {
    const json* id_field = r.is_object() && r.contains("spec") && r["spec"].is_object() &&
                                   r["spec"].contains("id") && r["spec"]["id"].is_number_unsigned()
                               ? &r["spec"]["id"]
                               : nullptr;
    if (!id_field || id_field->get<uint64_t>() > UINT32_MAX) continue;
    const auto id = id_field->get<uint32_t>();
    auto it = table.find(id);
    if (it != table.end() && installed_as(r, it->second)) {
      good.insert(id);
      continue;
    }
    json ignored;
    if (Status s = dp_.call(dpcmd::remove_ring(id), ignored);
        !s && s.code() != StatusCode::not_found)
      return s;
    ++counters_.rings_pruned;
    spdlog::info("reconcile: removed ring {} from the data plane ({})", id,
                 it == table.end() ? "not in the state" : "spec differs from the state");
  }
  Status first_error;
  for (const auto& [id, rec] : table) {
    if (good.count(id) || !rec.local) continue;
    json ignored;
    Status s = dp_.call(install_cmd(rec), ignored);
    if (!s) {
      spdlog::warn("reconcile: data plane refused ring {}: {}", id, s.to_string());
      if (s.code() == StatusCode::unavailable) return s;
      if (first_error.ok()) first_error = s;
      continue;
    }
    ++counters_.rings_pushed;
    spdlog::info("reconcile: installed ring {}", id);
  }
  return first_error;
}

}  // namespace netreduce::control
