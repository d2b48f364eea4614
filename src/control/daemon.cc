#include "control/daemon.h"

#include <spdlog/spdlog.h>
#include <sys/random.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <set>
#include <vector>

#include "common/ring_json.h"
#include "control/daemon_shared.h"
#include "control/fabric.h"
#include "engine/engine_json.h"

#ifndef NETREDUCE_VERSION
#define NETREDUCE_VERSION "unknown"
#endif

namespace netreduce::control {

using nlohmann::json;

namespace {

// 128 bits from the kernel's CSPRNG as 32 lowercase hex digits; empty if
// getrandom fails (the caller answers 500 rather than issue a weak secret).
std::string new_credential() {
  unsigned char raw[16];
  if (!random_bytes(raw, sizeof raw)) return {};
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned char b : raw) {
    out += hex[b >> 4];
    out += hex[b & 15];
  }
  return out;
}

}  // namespace

bool same_spec(const engine::RingSpec& a, const engine::RingSpec& b) {
  return a == b || ring_to_json(a) == ring_to_json(b);
}

std::string id_text(uint32_t id) { return "ring " + std::to_string(id); }

json install_cmd(const RingRecord& rec) {
  return {{"cmd", dpcmd::kInstallRing},
          {"ring", ring_tree_to_json(rec.spec, rec.tree, KeyShown::included)}};
}

void set_installed(json& j, bool here, const RingRecord& rec) {
  bool all = rec.local ? here : true;
  for (const PeerEntry& p : rec.peers) all = all && rec.etcd_lease && p.installed;
  j["installed"] = all;
  if (!rec.entry.empty() && j.contains("fabric")) j["fabric"]["installed_here"] = rec.local && here;
}

bool installed_as(const json& r, const RingRecord& rec) {
  if (!rec.local || !r.is_object() || !r.contains("spec") || !r["spec"].is_object()) return false;
  json spec = r["spec"];
  const json tree = spec.contains("tree") ? spec["tree"] : json();
  spec.erase("tree");
  engine::RingSpec have;
  return ring_from_json(spec, have).ok() && same_spec(rec.spec, have) &&
         tree == (rec.tree ? tree_to_json(*rec.tree) : json());
}

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
    case StatusCode::permission_denied:
      http = 403;
      code = "forbidden";
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
      dp_(cfg_.dataplane_socket, std::chrono::milliseconds(cfg_.dataplane_timeout_ms)) {
  if (cfg_.fabric)
    etcd_ = std::make_unique<Etcd>(
        EtcdConfig{cfg_.fabric->etcd_endpoints, static_cast<int>(cfg_.fabric->etcd_timeout_ms)});
}

Daemon::~Daemon() { stop(); }

Status Daemon::start() {
  if (Status s = state_.lock(); !s) return s;
  {
    std::lock_guard lock(mu_);
    if (Status s = state_.load(rings_); !s) return s;
    // Deadlines are not persisted: every lease starts a fresh full period.
    const auto now = SteadyClock::now();
    for (auto& [id, rec] : rings_)
      if (rec.lease_ms) rec.expires = now + std::chrono::milliseconds(rec.lease_ms);
  }
  spdlog::info("state {}: {} ring(s)", state_.path(), rings_.size());
  reconciler_ = std::thread([this] { reconciler_main(); });
  metrics_thread_ = std::thread([this] { metrics_main(); });
  leases_ = std::thread([this] { lease_main(); });
  if (etcd_) start_fabric();
  return {};
}

void Daemon::stop() {
  cancel_dataplane_calls();
  {
    std::lock_guard lock(stop_mu_);
    stopping_ = true;
  }
  stop_cv_.notify_all();
  if (reconciler_.joinable()) reconciler_.join();
  if (metrics_thread_.joinable()) metrics_thread_.join();
  if (leases_.joinable()) leases_.join();
  for (std::thread* t : {&fabric_upkeep_, &entries_watch_, &acks_watch_})
    if (t->joinable()) t->join();
}

void Daemon::run_until_stopped(std::chrono::milliseconds period,
                               const std::function<void()>& work) {
  std::unique_lock stop_lock(stop_mu_);
  while (!stopping_) {
    stop_lock.unlock();
    work();
    stop_lock.lock();
    stop_cv_.wait_for(stop_lock, period, [this] { return stopping_; });
  }
}

Status Daemon::change_call(const json& request, json& reply) {
  Status s = dp_.call(request, reply);
  if (!s && s.code() == StatusCode::unavailable) resync_ = true;
  return s;
}

bool Daemon::stopping() {
  std::lock_guard lock(stop_mu_);
  return stopping_;
}

uint64_t Daemon::memory_locked() const {
  uint64_t sum = 0;
  for (const auto& [id, rec] : rings_)
    if (rec.local) sum += engine::ring_memory_bytes(rec.spec, engine::ReduceMode::deterministic);
  return sum;
}

std::optional<Reply> Daemon::check_owner(uint32_t id, const RingRecord& rec, const RingAuth& auth,
                                         const char* what) const {
  if (auth.credential) {
    if (same_secret(*auth.credential, rec.credential)) return std::nullopt;
    return error_reply({StatusCode::permission_denied, kCredentialHeader,
                        "does not match the credential of " + id_text(id) + "; only the job " +
                            "that registered it (or the operator token, without a " +
                            "credential) may " + what + " it"});
  }
  if (auth.caller == Caller::operator_token) return std::nullopt;
  return error_reply({StatusCode::permission_denied, kCredentialHeader,
                      std::string("a job token may ") + what +
                          " only rings whose credential it presents in " + kCredentialHeader});
}

json Daemon::ring_reply_locked(const RingRecord& rec) const {
  json j = ring_to_json(rec.spec);
  if (rec.lease_ms) {
    j["lease_ms"] = rec.lease_ms;
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(rec.expires - SteadyClock::now())
            .count();
    j["lease_remaining_ms"] = left > 0 ? left : 0;
  }
  if (!rec.entry.empty()) j["fabric"] = fabric_view_locked(rec);
  return j;
}

Reply Daemon::create_ring_here(const json& body, const RingAuth& auth) {
  if (!body.is_object()) return error_reply(Status::invalid("", "a ring must be a JSON object"));
  uint32_t lease_ms = 0;
  json ring_body = body;
  if (auto it = ring_body.find("lease_ms"); it != ring_body.end()) {
    const json& v = *it;
    const bool integer = v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0);
    const uint64_t x = integer ? v.get<uint64_t>() : 0;
    if (!integer || (x != 0 && (x < kMinLeaseMs || x > cfg_.max_lease_ms)))
      return error_reply(Status::invalid(
          "lease_ms", "must be 0 (no lease) or an integer number of milliseconds in " +
                          std::to_string(kMinLeaseMs) + ".." + std::to_string(cfg_.max_lease_ms) +
                          " (quotas.max_lease_ms)"));
    lease_ms = static_cast<uint32_t>(x);
    ring_body.erase(it);
  }
  engine::RingSpec spec;
  if (Status s = ring_from_json(ring_body, spec); !s) return error_reply(s);
  // The memory quota against what the ring needs: the engine's sizes.
  if (Status s = engine::validate(spec); !s) return error_reply(s);
  std::vector<FabricEntry> entries;
  if (cfg_.fabric) {
    // One epoch and key for every box of this installation (wire/b2b.h).
    TreeSecret secret;
    if (!random_bytes(&secret.epoch, sizeof secret.epoch) ||
        !random_bytes(secret.key.data(), secret.key.size()))
      return error_reply(
          {StatusCode::internal, "", std::string("getrandom failed: ") + std::strerror(errno)});
    if (Status s = compute_fabric_entries(spec, *cfg_.fabric, secret, entries); !s)
      return error_reply(s);
  }
  std::unique_lock change(change_mu_, std::defer_lock);
  if (auto busy = lock_change(change)) return *busy;
  std::unique_lock lock(mu_);
  const auto now = SteadyClock::now();
  if (auto it = rings_.find(spec.ring_id); it != rings_.end()) {
    RingRecord& have = it->second;
    // Only the owner's retry is idempotent: without its credential the same
    // spec is another job's ring that happens to have the same id.
    if (!auth.credential || !same_secret(*auth.credential, have.credential))
      return error_reply({StatusCode::conflict, "id",
                          id_text(spec.ring_id) +
                              " is registered by another job; choose another id (or present "
                              "the ring's credential in " +
                              kCredentialHeader + " to re-register it)"});
    if (!same_spec(have.spec, spec))
      return error_reply(
          {StatusCode::conflict, "id",
           id_text(spec.ring_id) + " exists with a different spec; delete it first"});
    if (have.lease_ms != lease_ms)
      return error_reply({StatusCode::conflict, "lease_ms",
                          id_text(spec.ring_id) + " exists with lease_ms " +
                              std::to_string(have.lease_ms) + "; delete it first"});
    if (have.lease_ms) have.expires = now + std::chrono::milliseconds(have.lease_ms);  // renewed
    json j = ring_reply_locked(have);
    j["credential"] = have.credential;
    return {200, {{"ring", j}}};
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

  RingRecord rec;
  rec.spec = spec;
  rec.credential = new_credential();
  if (rec.credential.empty())
    return error_reply(
        {StatusCode::internal, "", std::string("getrandom failed: ") + std::strerror(errno)});
  rec.lease_ms = lease_ms;
  if (lease_ms) rec.expires = now + std::chrono::milliseconds(lease_ms);
  if (cfg_.fabric) {
    rec.entry = new_credential();
    if (rec.entry.empty())
      return error_reply(
          {StatusCode::internal, "", std::string("getrandom failed: ") + std::strerror(errno)});
    rec.local = false;
    rec.etcd_failed = SteadyClock::time_point::max();  // its POST publishes it first
    for (const FabricEntry& e : entries) {
      if (e.box == cfg_.fabric->self) {
        rec.local = true;
        rec.tree = e.tree;
      } else {
        PeerEntry p;
        p.box = e.box;
        p.ring = fabric_entry_json(spec, e);
        rec.peers.push_back(std::move(p));
      }
    }
  }
  rings_.emplace(spec.ring_id, rec);
  if (Status s = save_locked(); !s) {
    rings_.erase(spec.ring_id);
    spdlog::error("cannot persist: {}", s.to_string());
    return error_reply({StatusCode::internal, "", "cannot persist the state: " + s.message()});
  }
  lock.unlock();  // renewals and reads go on while the data plane answers
  json reply;
  const Status s = rec.local ? change_call(install_cmd(rec), reply) : Status{};
  lock.lock();
  bool installed = rec.local && s.ok();
  // Undo if the data plane refused the ring, or is down and required. The
  // upkeep thread may have published the ring's entries meanwhile: they go too.
  if (!s && (s.code() != StatusCode::unavailable || cfg_.require_dataplane)) {
    if (auto it = rings_.find(spec.ring_id); it != rings_.end())
      queue_revoke_locked(it->second.etcd_lease, it->second);
    rings_.erase(spec.ring_id);
    (void)save_locked();
    return error_reply(s);
  }
  json j = ring_reply_locked(rec);
  set_installed(j, installed, rec);
  if (!installed && rec.local)
    j["dataplane_error"] = s.message();  // pushed when the data plane connects
  j["credential"] = rec.credential;      // the only time the daemon tells it
  spdlog::info("ring {} created ({} member(s), {})", spec.ring_id, spec.members.size(),
               lease_ms ? "lease " + std::to_string(lease_ms) + " ms" : std::string("no lease"));
  return {201, {{"ring", j}}};
}

Reply Daemon::delete_ring(uint32_t id, const RingAuth& auth) {
  std::unique_lock change(change_mu_, std::defer_lock);
  if (auto busy = lock_change(change)) return *busy;
  std::unique_lock lock(mu_);
  auto it = rings_.find(id);
  if (it == rings_.end()) return error_reply({StatusCode::not_found, "id", "no " + id_text(id)});
  if (auto refused = check_owner(id, it->second, auth, "delete")) return *refused;
  if (!it->second.origin.empty())
    return error_reply({StatusCode::conflict, "id",
                        id_text(id) + " is box " + it->second.origin +
                            "'s fabric entry here; delete it at its origin (etcd removes it "
                            "from every box)"});
  RingRecord old = it->second;
  rings_.erase(it);
  if (Status s = save_locked(); !s) {
    rings_.emplace(id, std::move(old));
    return error_reply({StatusCode::internal, "", "cannot persist the state: " + s.message()});
  }
  if (old.origin.empty()) queue_revoke_locked(old.etcd_lease, old);
  lock.unlock();
  json reply;
  // A data plane that is down, or lost the ring, is fixed by the reconciler.
  if (old.local) (void)change_call(dpcmd::remove_ring(id), reply);
  spdlog::info("ring {} deleted ({})", id,
               auth.credential ? "by its owner"
                               : (auth.caller == Caller::operator_token ? "by the operator token"
                                                                        : "by a job token"));
  return {204, nullptr};
}

Reply Daemon::renew_lease(uint32_t id, const RingAuth& auth) {
  std::lock_guard lock(mu_);
  auto it = rings_.find(id);
  if (it == rings_.end()) return error_reply({StatusCode::not_found, "id", "no " + id_text(id)});
  if (auto refused = check_owner(id, it->second, auth, "renew")) return *refused;
  RingRecord& rec = it->second;
  if (!rec.lease_ms)
    return error_reply(
        {StatusCode::conflict, "lease_ms", id_text(id) + " has no lease (it never expires)"});
  rec.expires = SteadyClock::now() + std::chrono::milliseconds(rec.lease_ms);
  return {200, {{"id", id}, {"lease_ms", rec.lease_ms}, {"lease_remaining_ms", rec.lease_ms}}};
}

Reply Daemon::list_rings() {
  RingMap rings;
  std::map<uint32_t, json> replies;
  {
    std::lock_guard lock(mu_);
    for (const auto& [id, rec] : rings_) {
      rings.emplace(id, rec);
      replies.emplace(id, ring_reply_locked(rec));
    }
  }
  std::set<uint32_t> installed;
  json reply;
  if (dp_.call(dpcmd::list_rings(), reply).ok())
    for (const json& r : reply.value("rings", json::array())) {
      const uint32_t rid = r.contains("spec") ? r["spec"].value("id", 0u) : 0u;
      if (auto it = rings.find(rid); it != rings.end() && installed_as(r, it->second))
        installed.insert(rid);
    }
  json arr = json::array();
  for (const auto& [id, rec] : rings) {
    json j = replies[id];
    set_installed(j, installed.count(id) > 0, rec);
    arr.push_back(j);
  }
  return {200, {{"rings", arr}}};
}

Reply Daemon::get_ring(uint32_t id) {
  RingRecord rec;
  json j;
  {
    std::lock_guard lock(mu_);
    auto it = rings_.find(id);
    if (it == rings_.end())
      return error_reply({StatusCode::not_found, "id", "no ring " + std::to_string(id)});
    rec = it->second;
    j = ring_reply_locked(it->second);
  }
  bool here = false;
  json reply;
  if (rec.local && dp_.call(dpcmd::get_ring(id), reply).ok() && reply.contains("ring")) {
    json live = reply["ring"];
    if (installed_as(live, rec)) {
      here = true;
      for (auto& [k, v] : live.items())
        if (k != "spec") j[k] = v;
    }
  }
  set_installed(j, here, rec);
  return {200, j};
}

Reply Daemon::set_fault(const json& body) {
  if (!body.is_object()) return error_reply(Status::invalid("", "must be a JSON object"));
  for (const auto& [k, v] : body.items())
    if (k != "ring" && k != "kind" && k != "fraction" && k != "duration_ms")
      return error_reply(Status::invalid(k,
                                         "unknown field (known: ring, kind, fraction, "
                                         "duration_ms)"));
  // Shapes here; values (kind, ranges, the ring, the gate) are the data
  // plane's to check: its errors name the same fields.
  std::optional<uint32_t> ring;
  const json r = body.value("ring", json());
  if (r.is_number_unsigned() && r.get<uint64_t>() <= 0xFFFFFFFFu) {
    ring = r.get<uint32_t>();
  } else if (r != "all") {
    return error_reply(
        Status::invalid("ring", "a ring id (unsigned 32-bit integer) or \"all\" is required"));
  }
  const json kind = body.value("kind", json());
  if (!kind.is_string())
    return error_reply(
        Status::invalid("kind", "is required: \"drop\", \"duplicate\", \"reorder\" or \"bypass\""));
  const json fraction = body.value("fraction", json(1.0));
  if (!fraction.is_number())
    return error_reply(Status::invalid("fraction", "must be a number from 0 to 1"));
  const json duration = body.value("duration_ms", json());
  if (!duration.is_number_unsigned() || duration.get<uint64_t>() > 0xFFFFFFFFu)
    return error_reply(
        Status::invalid("duration_ms", "is required: how long the fault lasts, in milliseconds"));
  json reply;
  if (Status s = dp_.call(dpcmd::set_fault(ring, kind.get<std::string>(), fraction.get<double>(),
                                           duration.get<uint32_t>()),
                          reply);
      !s)
    return error_reply(s);
  spdlog::warn("fault injected by the operator: {} {} of {} for {} ms", kind.get<std::string>(),
               fraction.get<double>(), ring ? "ring " + std::to_string(*ring) : "every ring",
               duration.get<uint32_t>());
  return {200, {{"faults", reply.value("faults", json::array())}}};
}

Reply Daemon::clear_faults(std::optional<uint32_t> ring) {
  json reply;
  if (Status s = dp_.call(dpcmd::clear_faults(ring), reply); !s) return error_reply(s);
  reply.erase("ok");
  return {200, reply};
}

Reply Daemon::list_faults() {
  json reply;
  if (Status s = dp_.call(dpcmd::list_faults(), reply); !s) return error_reply(s);
  reply.erase("ok");
  return {200, reply};
}

Reply Daemon::status() {
  json dp = {{"connected", false}, {"socket", cfg_.dataplane_socket}};
  json st;
  if (Status s = dp_.call(dpcmd::status(), st); s) {
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
  json reply = {{"dataplane", dp},
                {"rings", rings_.size()},
                {"version", NETREDUCE_VERSION},
                {"state_file", state_.path()},
                {"quotas",
                 {{"max_rings", cfg_.max_rings},
                  {"max_memory_bytes", cfg_.max_memory},
                  {"memory_in_use_bytes", memory_locked()}}}};
  if (cfg_.fabric) reply["fabric"] = fabric_outline(*cfg_.fabric);
  return {200, reply};
}

Reply Daemon::stats() {
  json st, rings;
  if (Status s = dp_.call(dpcmd::stats(), st); !s) return error_reply(s);
  if (Status s = dp_.call(dpcmd::list_rings(), rings); !s) return error_reply(s);
  st.erase("ok");
  st["rings"] = rings.value("rings", json::array());
  return {200, st};
}

Reply Daemon::health() { return {200, {{"status", "ok"}, {"dataplane_connected", dp_up_.load()}}}; }

std::optional<Reply> Daemon::lock_change(std::unique_lock<std::timed_mutex>& change) {
  const std::chrono::milliseconds wait(cfg_.dataplane_timeout_ms);
  if (change.try_lock_for(wait)) return std::nullopt;
  return error_reply({StatusCode::unavailable, "dataplane.timeout_ms",
                      "other changes of the data plane held it for " +
                          std::to_string(wait.count()) +
                          " ms (dataplane.timeout_ms); the data plane is slow: retry"});
}

}  // namespace netreduce::control
