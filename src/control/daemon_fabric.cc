// The daemon's fabric part (docs/design.md#fabric-state-in-etcd): a
// multi-rack ring's entries for the other boxes live in etcd, not in calls
// between daemons.
//
//   origin leafA, POST ring 7 (leaves A and B, spine S; lease 30 s):
//     grant lease L (30 s); one transaction, if none of the keys exists:
//       boxes/S/rings/7     = {"origin": "leafA", "entry", "etcd_lease": L, "ring": S's node}
//       boxes/leafB/rings/7 = {... leafB's node}
//     S and leafB watch boxes/<self>/rings/: each checks its node against its
//     own fabric section, installs it, and puts origins/leafA/acks/7/<self>
//     = {"entry", "installed", "error"} with lease L; leafA's acks watcher
//     records them, and the POST answers once both are in (or after 1 s).
//   The job renews at leafA only; leafA keeps L alive while ring 7 is in its
//   table. DELETE (or the job's lease running out) revokes L: etcd deletes
//   every key of it at once, and the watchers remove the entries. leafA
//   dead: L runs out by itself.
//
// Revisions order everything: a box applies its prefix's events in the
// store's order, so an older registration can never replace a newer one;
// after a restart or a compaction a box reads its prefix whole and makes its
// table equal to it.
//
// The files, by job: daemon_fabric_origin.cc publishes an origin's entries,
// keeps their lease alive and records the peers' acks; daemon_fabric_peer.cc
// takes the entries etcd holds for this box into its table and data plane
// and acks them. This file names the keys, starts the fabric's threads and
// runs the loop they share. Threads and locks: control/daemon.h.
//
// - Upkeep (`fabric_upkeep_`, every 100 ms): fabric_upkeep(), one step per
//   job, then the count of peer entries not yet published or installed.
// - Entries and acks watchers (`entries_watch_`, `acks_watch_`): watch_main()
//   on their prefix, applying what etcd holds in its revisions' order; a
//   value that throws is counted and logged, and the watch goes on.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "control/daemon.h"
#include "control/daemon_fabric_shared.h"
#include "control/daemon_shared.h"
#include "engine/engine_json.h"

namespace netreduce::control {

using nlohmann::json;

namespace {

// One watch stream's length; the next resumes at the next revision.
constexpr int kWatchWindowMs = 5000;
// How often a watcher reads its prefix whole anyway.
constexpr auto kReadWholeEvery = std::chrono::seconds(60);

}  // namespace

json parse_object(const std::string& text) {
  try {
    json j = json::parse(text);
    if (j.is_object()) return j;
  } catch (const std::exception&) {
  }
  return json::object();
}

std::string text_field(const json& j, const char* key) {
  const auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

bool true_field(const json& j, const char* key) {
  const auto it = j.find(key);
  return it != j.end() && it->is_boolean() && it->get<bool>();
}

bool id_from_key(const std::string& key, const std::string& prefix, uint32_t& id) {
  if (key.rfind(prefix, 0) != 0) return false;
  const std::string rest = key.substr(prefix.size());
  if (rest.empty() || rest.size() > 10 || rest.find_first_not_of("0123456789") != std::string::npos)
    return false;
  const uint64_t v = std::stoull(rest);
  if (v > 0xFFFFFFFFu) return false;
  id = static_cast<uint32_t>(v);
  return true;
}

std::string Daemon::entries_prefix(const std::string& box) const {
  return cfg_.fabric->etcd_prefix + "boxes/" + box + "/rings/";
}

std::string Daemon::acks_prefix(const std::string& origin) const {
  return cfg_.fabric->etcd_prefix + "origins/" + origin + "/acks/";
}

json Daemon::fabric_view_locked(const RingRecord& rec) const {
  // A state file written with a fabric section may be read by a daemon
  // started without one: it keeps the rings but publishes nothing.
  const json self = cfg_.fabric ? json(cfg_.fabric->self) : json();
  json f = {{"entry", rec.entry},
            {"origin", rec.origin.empty() ? self : json(rec.origin)},
            {"box", self},
            {"local", rec.local},
            {"tree", rec.tree ? tree_to_json(*rec.tree) : json()}};
  if (rec.origin.empty()) {
    f["published"] = rec.etcd_lease != 0;
    json boxes = json::array();
    for (const PeerEntry& p : rec.peers) {
      // The peer's node as reports show it: key_id, never the key.
      engine::RingSpec spec;
      std::optional<engine::TreeSpec> tree;
      const bool parsed = ring_tree_from_json(p.ring, spec, tree).ok();
      json b = {{"box", p.box},
                {"installed", p.installed},
                {"tree", parsed && tree ? tree_to_json(*tree) : json()}};
      if (!p.error.empty()) b["error"] = p.error;
      boxes.push_back(std::move(b));
    }
    f["peers"] = std::move(boxes);
  }
  return f;
}

// --- The threads ------------------------------------------------------------

void Daemon::start_fabric() {
  fabric_upkeep_ = std::thread(
      [this] { run_until_stopped(std::chrono::milliseconds(100), [this] { fabric_upkeep(); }); });
  entries_watch_ = std::thread([this] {
    watch_main(
        entries_prefix(cfg_.fabric->self), [this](const auto& kvs) { sync_entries(kvs); },
        [this](const EtcdEvent& e) { on_entry_event(e); });
  });
  acks_watch_ = std::thread([this] {
    watch_main(
        acks_prefix(cfg_.fabric->self), [this](const auto& kvs) { sync_acks(kvs); },
        [this](const EtcdEvent& e) { apply_ack(e.kv, e.deleted); });
  });
}

void Daemon::fabric_upkeep() {
  revoke_removed();
  keep_leases_alive();
  publish_unpublished();
  refresh_acks();
  std::lock_guard lock(mu_);
  uint64_t pending = 0;
  for (const auto& [id, rec] : rings_)
    for (const PeerEntry& p : rec.peers) pending += rec.etcd_lease && p.installed ? 0 : 1;
  fabric_pending_ = pending;
}

void Daemon::watch_main(const std::string& prefix,
                        const std::function<void(const std::vector<EtcdKv>&)>& sync,
                        const std::function<void(const EtcdEvent&)>& apply) {
  int64_t next = 0;  // 0: read the prefix whole first
  SteadyClock::time_point read_whole{};
  std::string last_error;
  // Whatever etcd holds is input: a fault in applying one value is counted
  // and logged, and the watch goes on.
  auto guarded = [this](const std::string& what, const auto& fn) {
    try {
      fn();
    } catch (const std::exception& e) {
      ++counters_.fabric_entries_refused;
      spdlog::error("fabric: {}: {}", what, e.what());
    }
  };
  while (!stopping()) {
    Status s;
    // Whole again now and then: what a refusal left out (a quota since
    // freed, a data plane that refused) gets another chance.
    if (SteadyClock::now() - read_whole >= kReadWholeEvery) next = 0;
    if (next == 0) {
      std::vector<EtcdKv> kvs;
      int64_t revision = 0;
      s = etcd_->range(prefix, kvs, revision);
      if (s) {
        guarded("reading " + prefix + " whole", [&] { sync(kvs); });
        next = revision + 1;
        read_whole = SteadyClock::now();
      }
    } else {
      s = etcd_->watch(prefix, next, kWatchWindowMs,
                       [&](const std::vector<EtcdEvent>& events, int64_t) {
                         for (const EtcdEvent& e : events) {
                           guarded(e.kv.key, [&] { apply(e); });
                           next = std::max(next, e.kv.mod_revision + 1);
                         }
                       });
      if (s.code() == StatusCode::not_found) {
        spdlog::warn("fabric: {}; reading {} whole", s.message(), prefix);
        next = 0;  // compacted past `next`, or a store behind it: read it whole
        continue;
      }
    }
    if (s) {
      if (!last_error.empty()) spdlog::info("fabric: watching {} again", prefix);
      last_error.clear();
      continue;
    }
    ++counters_.fabric_etcd_errors;
    if (s.message() != last_error) spdlog::warn("fabric: watching {}: {}", prefix, s.to_string());
    last_error = s.message();
    std::unique_lock stop_lock(stop_mu_);
    stop_cv_.wait_for(stop_lock, kRetry, [this] { return stopping_; });
  }
}

}  // namespace netreduce::control
