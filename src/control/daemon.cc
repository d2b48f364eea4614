#include "control/daemon.h"

#include <spdlog/spdlog.h>

#include <set>

#include "common/ring_json.h"

#ifndef NETREDUCE_VERSION
#define NETREDUCE_VERSION "unknown"
#endif

namespace netreduce::control {

using nlohmann::json;

namespace {

// Two specs describe the same ring. Compared in their JSON form, where an
// omitted dtype/op list (mask 0, "all") and the full list are the same thing.
bool same_spec(const engine::RingSpec& a, const engine::RingSpec& b) {
  return a == b || ring_to_json(a) == ring_to_json(b);
}

}  // namespace

Reply error_reply(const Status& s) {
  int http = 500;
  std::string code = to_string(s.code());
  switch (s.code()) {
    case StatusCode::invalid_argument:
      http = 400;
      break;
    case StatusCode::not_found:
      http = 404;
      break;
    case StatusCode::already_exists:
    case StatusCode::conflict:
      http = 409;
      code = "conflict";
      break;
    case StatusCode::resource_exhausted:
      http = 422;
      code = "quota";
      break;
    case StatusCode::unavailable:
      http = 503;
      code = "dataplane_unavailable";
      break;
    case StatusCode::unimplemented:
      http = 501;
      break;
    default:
      break;
  }
  json e = status_to_json(s);
  e["code"] = code;
  return {http, {{"error", e}}};
}

Daemon::Daemon(DaemonConfig cfg)
    : cfg_(std::move(cfg)),
      state_(cfg_.state_file),
      dp_(cfg_.dataplane_socket, std::chrono::milliseconds(cfg_.dataplane_timeout_ms)) {}

Daemon::~Daemon() { stop(); }

Status Daemon::start() {
  if (Status s = state_.lock(); !s) return s;
  {
    std::lock_guard lock(mu_);
    if (Status s = state_.load(rings_); !s) return s;
  }
  spdlog::info("state {}: {} ring(s)", state_.path(), rings_.size());
  reconciler_ = std::thread([this] { reconciler_main(); });
  metrics_thread_ = std::thread([this] { metrics_main(); });
  return {};
}

void Daemon::stop() {
  {
    std::lock_guard lock(stop_mu_);
    stopping_ = true;
  }
  stop_cv_.notify_all();
  if (reconciler_.joinable()) reconciler_.join();
  if (metrics_thread_.joinable()) metrics_thread_.join();
}

uint64_t Daemon::memory_locked() const {
  uint64_t sum = 0;
  for (const auto& [id, spec] : rings_)
    sum += engine::ring_memory_bytes(spec, engine::ReduceMode::deterministic);
  return sum;
}

// ---- reconciler -----------------------------------------------------------

void Daemon::reconciler_main() {
  uint64_t seen_connects = 0;
  std::string seen_instance;
  bool pending = true;
  std::unique_lock stop_lock(stop_mu_);
  while (!stopping_) {
    stop_lock.unlock();
    json st;
    const Status s = dp_.call({{"cmd", "status"}}, st);
    if (!s && s.field() == "dataplane.timeout_ms") {  // other calls held the connection: no news
      stop_lock.lock();
      stop_cv_.wait_for(stop_lock, std::chrono::milliseconds(cfg_.reconcile_interval_ms),
                        [this] { return stopping_; });
      continue;
    }
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
      seen_connects = dp_.connects();
      seen_instance = instance;
      if (pending) {
        std::lock_guard lock(mu_);
        const Status r = reconcile_locked();
        if (r) {
          pending = false;
          ++counters_.reconciles;
        } else {
          spdlog::warn("reconcile: {}", r.to_string());
        }
      }
    }
    stop_lock.lock();
    stop_cv_.wait_for(stop_lock, std::chrono::milliseconds(cfg_.reconcile_interval_ms),
                      [this] { return stopping_; });
  }
}

Status Daemon::reconcile_locked() {
  json reply;
  if (Status s = dp_.call({{"cmd", "list_rings"}}, reply); !s) return s;
  std::set<uint32_t> good;
  for (const json& r : reply.value("rings", json::array())) {
    engine::RingSpec have;
    const bool parsed = r.contains("spec") && ring_from_json(r["spec"], have).ok();
    if (!parsed) continue;
    auto it = rings_.find(have.ring_id);
    if (it != rings_.end() && same_spec(it->second, have)) {
      good.insert(have.ring_id);
      continue;
    }
    json ignored;
    if (Status s = dp_.call({{"cmd", "remove_ring"}, {"id", have.ring_id}}, ignored);
        !s && s.code() != StatusCode::not_found)
      return s;
    ++counters_.rings_pruned;
    spdlog::info("reconcile: removed ring {} from the data plane ({})", have.ring_id,
                 it == rings_.end() ? "not in the state" : "spec differs from the state");
  }
  Status first_error;
  for (const auto& [id, spec] : rings_) {
    if (good.count(id)) continue;
    json ignored;
    Status s = dp_.call({{"cmd", "install_ring"}, {"ring", ring_to_json(spec)}}, ignored);
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

// ---- API ------------------------------------------------------------------

Reply Daemon::create_ring(const json& body) {
  engine::RingSpec spec;
  if (Status s = ring_from_json(body, spec); !s) return error_reply(s);
  std::lock_guard lock(mu_);
  if (auto it = rings_.find(spec.ring_id); it != rings_.end()) {
    if (same_spec(it->second, spec)) return {200, {{"ring", ring_to_json(it->second)}}};
    return error_reply({StatusCode::conflict, "id",
                        "ring " + std::to_string(spec.ring_id) +
                            " exists with a different spec; delete it first"});
  }
  if (rings_.size() >= cfg_.max_rings)
    return error_reply(
        {StatusCode::resource_exhausted, "quotas.max_rings",
         "the daemon holds its maximum of " + std::to_string(cfg_.max_rings) + " rings"});
  const uint64_t need = engine::ring_memory_bytes(spec, engine::ReduceMode::deterministic);
  const uint64_t used = memory_locked();
  if (need > cfg_.max_memory || used + need > cfg_.max_memory)
    return error_reply({StatusCode::resource_exhausted, "quotas.max_memory",
                        "the ring needs " + std::to_string(need) + " bytes; " +
                            std::to_string(used) + " of " + std::to_string(cfg_.max_memory) +
                            " are taken"});
  if (cfg_.require_dataplane && !dp_up_.load())
    return error_reply(
        {StatusCode::unavailable, "", "the data plane is down and dataplane.require is set"});

  rings_.emplace(spec.ring_id, spec);
  auto rollback = [&] {
    rings_.erase(spec.ring_id);
    (void)state_.save(rings_);
  };
  if (Status s = state_.save(rings_); !s) {
    rings_.erase(spec.ring_id);
    spdlog::error("cannot persist: {}", s.to_string());
    return error_reply({StatusCode::internal, "", "cannot persist the state: " + s.message()});
  }
  json reply;
  const Status s = dp_.call({{"cmd", "install_ring"}, {"ring", ring_to_json(spec)}}, reply);
  bool installed = s.ok();
  if (!s && s.code() != StatusCode::unavailable) {  // the data plane refused it: undo
    rollback();
    return error_reply(s);
  }
  if (!s && cfg_.require_dataplane) {
    rollback();
    return error_reply(s);
  }
  json j = ring_to_json(spec);
  j["installed"] = installed;
  if (!installed) j["dataplane_error"] = s.message();  // pushed when the data plane connects
  return {201, {{"ring", j}}};
}

Reply Daemon::delete_ring(uint32_t id) {
  std::lock_guard lock(mu_);
  auto it = rings_.find(id);
  if (it == rings_.end())
    return error_reply({StatusCode::not_found, "id", "no ring " + std::to_string(id)});
  const engine::RingSpec old = it->second;
  rings_.erase(it);
  if (Status s = state_.save(rings_); !s) {
    rings_.emplace(id, old);
    return error_reply({StatusCode::internal, "", "cannot persist the state: " + s.message()});
  }
  json reply;
  // A data plane that is down, or lost the ring, is fixed by the reconciler.
  (void)dp_.call({{"cmd", "remove_ring"}, {"id", id}}, reply);
  return {204, nullptr};
}

Reply Daemon::list_rings() {
  RingMap rings;
  {
    std::lock_guard lock(mu_);
    rings = rings_;
  }
  std::set<uint32_t> installed;
  json reply;
  if (dp_.call({{"cmd", "list_rings"}}, reply).ok())
    for (const json& r : reply.value("rings", json::array())) {
      engine::RingSpec have;
      if (r.contains("spec") && ring_from_json(r["spec"], have).ok() && rings.count(have.ring_id) &&
          same_spec(rings[have.ring_id], have))
        installed.insert(have.ring_id);
    }
  json arr = json::array();
  for (const auto& [id, spec] : rings) {
    json j = ring_to_json(spec);
    j["installed"] = installed.count(id) > 0;
    arr.push_back(j);
  }
  return {200, {{"rings", arr}}};
}

Reply Daemon::get_ring(uint32_t id) {
  engine::RingSpec spec;
  {
    std::lock_guard lock(mu_);
    auto it = rings_.find(id);
    if (it == rings_.end())
      return error_reply({StatusCode::not_found, "id", "no ring " + std::to_string(id)});
    spec = it->second;
  }
  json j = ring_to_json(spec);
  j["installed"] = false;
  json reply;
  if (dp_.call({{"cmd", "get_ring"}, {"id", id}}, reply).ok() && reply.contains("ring")) {
    json live = reply["ring"];
    engine::RingSpec have;
    if (live.contains("spec") && ring_from_json(live["spec"], have).ok() && same_spec(have, spec)) {
      j["installed"] = true;
      for (auto& [k, v] : live.items())
        if (k != "spec") j[k] = v;
    }
  }
  return {200, j};
}

Reply Daemon::status() {
  json dp = {{"connected", false}, {"socket", cfg_.dataplane_socket}};
  json st;
  if (Status s = dp_.call({{"cmd", "status"}}, st); s) {
    dp["connected"] = true;
    for (auto& [k, v] : st.items())
      if (k != "ok") dp[k] = v;
    if (st.contains("memory")) {
      const uint64_t used = st["memory"].value("engine_reserved_bytes", uint64_t{0});
      const uint64_t budget = st["memory"].value("engine_budget_bytes", uint64_t{0});
      dp["memory"]["in_use_bytes"] = used;
      dp["memory"]["free_bytes"] = budget > used ? budget - used : 0;
    }
  } else {
    dp["error"] = s.message();
  }
  std::lock_guard lock(mu_);
  return {200,
          {{"dataplane", dp},
           {"rings", rings_.size()},
           {"version", NETREDUCE_VERSION},
           {"state_file", state_.path()},
           {"quotas",
            {{"max_rings", cfg_.max_rings},
             {"max_memory_bytes", cfg_.max_memory},
             {"memory_in_use_bytes", memory_locked()}}}}};
}

Reply Daemon::stats() {
  json st, rings;
  if (Status s = dp_.call({{"cmd", "stats"}}, st); !s) return error_reply(s);
  if (Status s = dp_.call({{"cmd", "list_rings"}}, rings); !s) return error_reply(s);
  st.erase("ok");
  st["rings"] = rings.value("rings", json::array());
  return {200, st};
}

Reply Daemon::health() { return {200, {{"status", "ok"}, {"dataplane_connected", dp_up_.load()}}}; }

// ---- metrics ----------------------------------------------------------------

void Daemon::metrics_main() {
  std::unique_lock stop_lock(stop_mu_);
  while (!stopping_) {
    stop_lock.unlock();
    refresh_metrics();
    stop_lock.lock();
    stop_cv_.wait_for(stop_lock, std::chrono::milliseconds(cfg_.metrics_refresh_ms),
                      [this] { return stopping_; });
  }
}

void Daemon::refresh_metrics() {
  auto c = std::make_shared<MetricsCache>();
  json st, stats, rings;
  c->dataplane_up = dp_.call({{"cmd", "status"}}, st).ok() &&
                    dp_.call({{"cmd", "stats"}}, stats).ok() &&
                    dp_.call({{"cmd", "list_rings"}}, rings).ok();
  if (c->dataplane_up) {
    c->status = std::move(st);
    c->stats = std::move(stats);
    c->rings = rings.value("rings", json::array());
  }
  {
    std::lock_guard lock(mu_);  // this thread may wait; scrapes do not
    c->configured_rings = rings_.size();
    c->configured_memory = memory_locked();
  }
  c->taken = std::chrono::steady_clock::now();
  std::lock_guard lock(cache_mu_);
  cache_ = std::move(c);
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
  }
  // Live ring counts when nobody holds the lock (a write may hold it for a
  // whole data plane call): never wait for it.
  if (std::unique_lock lock(mu_, std::try_to_lock); lock.owns_lock()) {
    in.configured_rings = rings_.size();
    in.configured_memory = memory_locked();
  }
  in.max_rings = cfg_.max_rings;
  in.max_memory = cfg_.max_memory;
  in.connects = dp_.connects();
  in.reconciles = counters_.reconciles.load();
  in.rings_pushed = counters_.rings_pushed.load();
  in.rings_pruned = counters_.rings_pruned.load();
  in.restarts_seen = counters_.restarts_seen.load();
  in.http = http;
  return render_metrics(in);
}

}  // namespace netreduce::control
