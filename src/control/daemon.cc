#include "control/daemon.h"

#include <spdlog/spdlog.h>
#include <sys/random.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <set>
#include <vector>

#include "common/http_client.h"
#include "common/ring_json.h"
#include "control/fabric.h"
#include "engine/engine_json.h"

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

using SteadyClock = std::chrono::steady_clock;

// A push to or removal at a peer daemon, connect to last byte.
constexpr int kPushTimeoutMs = 5000;
// How long a POST waits for a peer's lane to push its entries itself.
constexpr int kLaneWaitMs = 200;

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

std::string id_text(uint32_t id) { return "ring " + std::to_string(id); }

// The data plane's install_ring for a record: its tree node inside the spec.
json install_cmd(const RingRecord& rec) {
  return {{"cmd", dpcmd::kInstallRing},
          {"ring", ring_tree_to_json(rec.spec, rec.tree, KeyShown::included)}};
}

// A ring reply's "installed": this box's part (true at an origin that holds
// none) and, at a fabric ring's origin, every peer's entry accepted and
// installed there, so the host library's wait for "installed" covers the
// whole tree. "fabric.installed_here" keeps this box's own part.
void set_installed(json& j, bool here, const RingRecord& rec) {
  bool all = rec.local ? here : true;
  for (const PeerPush& p : rec.peers) all = all && p.pushed && p.installed;
  j["installed"] = all;
  if (!rec.entry.empty() && j.contains("fabric")) j["fabric"]["installed_here"] = rec.local && here;
}

// A data plane ring report ({"spec": ring JSON + "tree", ...}) is this
// record, installed. The report's tree names its key by key_id only: the
// tree is compared as the report writes it.
bool installed_as(const json& r, const RingRecord& rec) {
  if (!rec.local || !r.is_object() || !r.contains("spec") || !r["spec"].is_object()) return false;
  json spec = r["spec"];
  const json tree = spec.contains("tree") ? spec["tree"] : json();
  spec.erase("tree");
  engine::RingSpec have;
  return ring_from_json(spec, have).ok() && same_spec(rec.spec, have) &&
         tree == (rec.tree ? tree_to_json(*rec.tree) : json());
}

}  // namespace

bool same_secret(const std::string& given, const std::string& want) noexcept {
  if (want.empty()) return false;
  unsigned char diff = given.size() == want.size() ? 0 : 1;
  for (size_t i = 0; i < given.size(); ++i)
    diff |= static_cast<unsigned char>(given[i] ^ want[i % want.size()]);
  return diff == 0;
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
      dp_(cfg_.dataplane_socket, std::chrono::milliseconds(cfg_.dataplane_timeout_ms)) {}

Daemon::~Daemon() { stop(); }

Status Daemon::start() {
  if (Status s = state_.lock(); !s) return s;
  {
    std::lock_guard lock(mu_);
    if (Status s = state_.load(rings_, &deletes_); !s) return s;
    // Deadlines are not persisted: every lease starts a fresh full period.
    const auto now = SteadyClock::now();
    for (auto& [id, rec] : rings_)
      if (rec.lease_ms) rec.expires = now + std::chrono::milliseconds(rec.lease_ms);
  }
  spdlog::info("state {}: {} ring(s)", state_.path(), rings_.size());
  reconciler_ = std::thread([this] { reconciler_main(); });
  metrics_thread_ = std::thread([this] { metrics_main(); });
  leases_ = std::thread([this] { lease_main(); });
  if (cfg_.fabric) start_lanes();
  return {};
}

void Daemon::stop() {
  dp_.cancel();
  {
    std::lock_guard lock(stop_mu_);
    stopping_ = true;
  }
  stop_cv_.notify_all();
  if (reconciler_.joinable()) reconciler_.join();
  if (metrics_thread_.joinable()) metrics_thread_.join();
  if (leases_.joinable()) leases_.join();
  for (auto& l : lanes_)
    if (l->thread.joinable()) l->thread.join();
}

void Daemon::start_lanes() {
  for (const FabricBox& b : cfg_.fabric->boxes)
    if (b.name != cfg_.fabric->self) lanes_.push_back(std::make_unique<Lane>(b.name));
  {
    // Entries and removals of boxes no longer configured have no lane.
    std::lock_guard lock(mu_);
    for (auto& [id, rec] : rings_)
      for (PeerPush& p : rec.peers)
        if (!lane(p.box)) p.error = "box " + p.box + " is no longer in the fabric configuration";
    const size_t before = deletes_.size();
    std::erase_if(deletes_, [&](const FabricDelete& d) {
      if (lane(d.box)) return false;
      spdlog::warn(
          "fabric: removal of ring {} from box {} given up: the box is no longer in the "
          "fabric configuration",
          d.id, d.box);
      return true;
    });
    if (deletes_.size() != before) (void)save_locked();
  }
  for (auto& l : lanes_) l->thread = std::thread([this, lp = l.get()] { lane_main(*lp); });
}

uint64_t Daemon::memory_locked() const {
  uint64_t sum = 0;
  for (const auto& [id, rec] : rings_)
    if (rec.local) sum += engine::ring_memory_bytes(rec.spec, engine::ReduceMode::deterministic);
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
    const Status s = dp_.call(dpcmd::status(), st);
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
    stop_lock.lock();
    stop_cv_.wait_for(stop_lock, std::chrono::milliseconds(cfg_.reconcile_interval_ms),
                      [this] { return stopping_; });
  }
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

// ---- leases ---------------------------------------------------------------

// Wakes every 100 ms (a lease is at least kMinLeaseMs, so a ring outlives its
// lease by at most a tenth of the shortest one, plus the data plane changes
// ahead of it).
void Daemon::lease_main() {
  std::unique_lock stop_lock(stop_mu_);
  while (!stopping_) {
    stop_lock.unlock();
    if (any_lease_expired()) expire_leases();
    stop_lock.lock();
    stop_cv_.wait_for(stop_lock, std::chrono::milliseconds(100), [this] { return stopping_; });
  }
}

bool Daemon::stopping() {
  std::lock_guard lock(stop_mu_);
  return stopping_;
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
      const auto deletes_before = deletes_;
      queue_removals_locked(id, old);
      if (Status s = save_locked(); !s) {  // keep it; try again on the next tick
        rings_.emplace(id, std::move(old));
        deletes_ = deletes_before;
        spdlog::error("ring {}: lease expired but the state cannot be saved: {}", id,
                      s.to_string());
        break;
      }
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
    (void)dp_.call(dpcmd::remove_ring(id), ignored);
  }
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

json Daemon::fabric_view_locked(const RingRecord& rec) const {
  // A state file written with a fabric section may be read by a daemon
  // started without one: it keeps the rings but pushes nothing.
  const json self = cfg_.fabric ? json(cfg_.fabric->self) : json();
  json f = {{"entry", rec.entry},
            {"origin", rec.origin.empty() ? self : json(rec.origin)},
            {"box", self},
            {"local", rec.local},
            {"tree", rec.tree ? tree_to_json(*rec.tree) : json()}};
  if (rec.origin.empty()) {
    json boxes = json::array();
    for (const PeerPush& p : rec.peers) {
      // The peer's node as reports show it: key_id, never the key.
      engine::RingSpec spec;
      std::optional<engine::TreeSpec> tree;
      const bool parsed = ring_tree_from_json(p.ring, spec, tree).ok();
      json b = {{"box", p.box},
                {"pushed", p.pushed},
                {"installed", p.installed},
                {"tree", parsed && tree ? tree_to_json(*tree) : json()}};
      if (!p.error.empty()) b["error"] = p.error;
      boxes.push_back(std::move(b));
    }
    f["peers"] = std::move(boxes);
  }
  return f;
}

void Daemon::queue_removals_locked(uint32_t id, const RingRecord& rec) {
  for (const PeerPush& p : rec.peers) deletes_.push_back({p.box, id, rec.entry});
}

// ---- fabric -----------------------------------------------------------------

void Daemon::lane_main(Lane& lane) {
  std::unique_lock stop_lock(stop_mu_);
  while (!stopping_) {
    stop_lock.unlock();
    {
      std::lock_guard lane_lock(lane.mu);
      push_lane_locked(lane);
    }
    stop_lock.lock();
    stop_cv_.wait_for(stop_lock, std::chrono::milliseconds(100), [this] { return stopping_; });
  }
}

Daemon::Lane* Daemon::lane(const std::string& box) {
  for (auto& l : lanes_)
    if (l->box == box) return l.get();
  return nullptr;
}

void Daemon::push_lane_locked(Lane& lane, std::optional<uint32_t> only) {
  struct Task {
    bool remove = false;
    uint32_t id = 0;
    std::string entry;
    json body;
  };
  std::vector<Task> tasks;
  const auto now = SteadyClock::now();
  {
    std::lock_guard lock(mu_);
    for (const FabricDelete& d : deletes_)
      if (!only && d.box == lane.box && now - d.last_try >= std::chrono::seconds(1))
        tasks.push_back({true, d.id, d.entry, {}});
    for (const auto& [id, rec] : rings_)
      for (const PeerPush& p : rec.peers) {
        if (p.box != lane.box || (only && id != *only)) continue;
        const bool retry =
            !(p.pushed && p.installed) && now - p.last_push >= std::chrono::seconds(1);
        const bool renew = p.pushed && rec.lease_ms &&
                           now - p.last_push >= std::chrono::milliseconds(rec.lease_ms / 3);
        if (!retry && !renew) continue;
        tasks.push_back({false,
                         id,
                         rec.entry,
                         {{"origin", cfg_.fabric->self},
                          {"entry", rec.entry},
                          {"lease_ms", rec.lease_ms},
                          {"ring", p.ring}}});
      }
  }
  const FabricBox& b = cfg_.fabric->boxes[static_cast<size_t>(cfg_.fabric->find(lane.box))];
  for (const Task& t : tasks) {
    std::string error;
    bool peer_installed = false;
    bool unreachable = false;
    // One total deadline per push: a peer that drips its answer costs this
    // lane at most kPushTimeoutMs, not a wait per byte.
    auto cli =
        HttpClient::make("http://" + b.daemon_host + ":" + std::to_string(b.daemon_port), error);
    HttpReply res;
    if (cli) {
      cli->set_bearer(fabric_token_);
      const std::string path = "/v1/fabric/rings";
      res = t.remove ? cli->call("DELETE", path + "/" + std::to_string(t.id) + "?entry=" + t.entry,
                                 "", kPushTimeoutMs)
                     : cli->call("POST", path, t.body.dump(), kPushTimeoutMs);
    }
    if (!cli) {
      error = b.daemon + ": " + error;
    } else if (!res.ok()) {
      error = b.daemon + ": " + res.error;
      unreachable = true;
    } else if (t.remove ? (res.status != 204 && res.status != 404)
                        : (res.status != 200 && res.status != 201)) {
      std::string msg = res.body;
      try {
        msg = json::parse(res.body).at("error").at("message").get<std::string>();
      } catch (const std::exception&) {
      }
      error = b.daemon + ": HTTP " + std::to_string(res.status) + ": " + msg;
    } else if (!t.remove) {
      try {
        peer_installed = json::parse(res.body).at("ring").at("installed").get<bool>();
      } catch (const std::exception&) {
      }
    }
    // A failure is retried a second after it ended; a renewal is due a
    // third of the lease after the pass began.
    const auto done = SteadyClock::now();
    std::lock_guard lock(mu_);
    if (t.remove) {
      record_removal_locked(lane.box, t.id, t.entry, error, done);
    } else if (auto it = rings_.find(t.id); it != rings_.end() && it->second.entry == t.entry) {
      for (PeerPush& p : it->second.peers) {
        if (p.box != lane.box) continue;
        if (error.empty()) {
          if (!p.pushed) spdlog::info("fabric: ring {} entry accepted by box {}", t.id, p.box);
          p.last_push = now;
          p.pushed = true;
          p.installed = peer_installed;
          p.error.clear();
          ++counters_.fabric_pushes;
        } else {
          if (p.error != error)
            spdlog::warn("fabric: ring {} push to box {}: {}", t.id, p.box, error);
          p.last_push = done;
          p.pushed = p.installed = false;  // a renewal is the same call
          p.error = error;
          ++counters_.fabric_push_failures;
        }
      }
    }                        // else deleted meanwhile
    if (unreachable) break;  // the rest next pass: each try may wait out the deadline
  }
  std::lock_guard lock(mu_);
  uint64_t pending = deletes_.size();
  for (const auto& [id, rec] : rings_)
    for (const PeerPush& p : rec.peers) pending += p.pushed && p.installed ? 0 : 1;
  fabric_pending_ = pending;
}

void Daemon::record_removal_locked(const std::string& box, uint32_t id, const std::string& entry,
                                   const std::string& error, SteadyClock::time_point done) {
  const FabricDelete want{box, id, entry, {}};
  auto it = std::find_if(deletes_.begin(), deletes_.end(),
                         [&](const FabricDelete& d) { return d.same(want); });
  if (it == deletes_.end()) return;
  if (!error.empty()) {
    it->last_try = done;
    ++counters_.fabric_push_failures;
    return;
  }
  const auto before = deletes_;
  deletes_.erase(it);
  if (Status s = save_locked(); !s) {
    deletes_ = before;
    return;
  }
  ++counters_.fabric_removals;
  spdlog::info("fabric: ring {} removed from box {}", id, box);
}

// ---- API ------------------------------------------------------------------

Reply Daemon::create_ring(const json& body, const RingAuth& auth) {
  Reply r = create_ring_here(body, auth);
  if (r.http != 201 || !cfg_.fabric || !r.body["ring"].contains("fabric") ||
      r.body["ring"]["fabric"].value("peers", json::array()).empty())
    return r;
  // Push the other boxes' entries now, so the reply tells how it went.
  // A lane busy for longer than kLaneWaitMs (a slow box) delivers it
  // later, as it retries whatever failed.
  const uint32_t id = r.body["ring"]["id"].get<uint32_t>();
  for (const json& p : r.body["ring"]["fabric"]["peers"]) {
    Lane* l = lane(p.value("box", std::string()));
    if (!l) continue;
    std::unique_lock lane_lock(l->mu, std::defer_lock);
    if (lane_lock.try_lock_for(std::chrono::milliseconds(kLaneWaitMs))) push_lane_locked(*l, id);
  }
  std::lock_guard lock(mu_);
  json& ring = r.body["ring"];
  if (auto it = rings_.find(id);
      it != rings_.end() && it->second.entry == ring["fabric"]["entry"]) {
    const bool here = ring["fabric"].value("installed_here", false);
    ring["fabric"] = fabric_view_locked(it->second);
    set_installed(ring, here, it->second);
  }
  return r;
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
    for (const FabricEntry& e : entries) {
      if (e.box == cfg_.fabric->self) {
        rec.local = true;
        rec.tree = e.tree;
      } else {
        PeerPush p;
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
  const Status s = rec.local ? dp_.call(install_cmd(rec), reply) : Status{};
  lock.lock();
  bool installed = rec.local && s.ok();
  // Undo if the data plane refused the ring, or is down and required. The
  // fabric thread may have pushed the ring's entries meanwhile: they go too.
  if (!s && (s.code() != StatusCode::unavailable || cfg_.require_dataplane)) {
    rings_.erase(spec.ring_id);
    queue_removals_locked(spec.ring_id, rec);
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
  RingRecord old = it->second;
  rings_.erase(it);
  const auto deletes_before = deletes_;
  queue_removals_locked(id, old);
  if (Status s = save_locked(); !s) {
    rings_.emplace(id, std::move(old));
    deletes_ = deletes_before;
    return error_reply({StatusCode::internal, "", "cannot persist the state: " + s.message()});
  }
  lock.unlock();
  json reply;
  // A data plane that is down, or lost the ring, is fixed by the reconciler.
  if (old.local) (void)dp_.call(dpcmd::remove_ring(id), reply);
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
  if (Status s = dp_.call(dpcmd::stats(), st); !s) return error_reply(s);
  if (Status s = dp_.call(dpcmd::list_rings(), rings); !s) return error_reply(s);
  st.erase("ok");
  st["rings"] = rings.value("rings", json::array());
  return {200, st};
}

Reply Daemon::health() { return {200, {{"status", "ok"}, {"dataplane_connected", dp_up_.load()}}}; }

Reply Daemon::fabric_put(const json& body) {
  if (!cfg_.fabric)
    return error_reply({StatusCode::conflict, "fabric", "this daemon has no fabric section"});
  if (!body.is_object()) return error_reply(Status::invalid("", "must be a JSON object"));
  const json origin_field = body.value("origin", json());
  const std::string origin = origin_field.is_string() ? origin_field.get<std::string>() : "";
  if (cfg_.fabric->find(origin) < 0 || origin == cfg_.fabric->self)
    return error_reply(Status::invalid("origin", "must name another box of the fabric"));
  const json entry_field = body.value("entry", json());
  if (!entry_field.is_string() || !valid_credential(entry_field.get<std::string>()))
    return error_reply(Status::invalid("entry", "must be 32 lowercase hex digits"));
  const std::string entry = entry_field.get<std::string>();
  const json lease = body.value("lease_ms", json(0));
  if (!lease.is_number_unsigned() && !(lease.is_number_integer() && lease.get<int64_t>() == 0))
    return error_reply(Status::invalid("lease_ms", "must be an unsigned integer"));
  const uint64_t lease_ms = lease.get<uint64_t>();
  if (lease_ms != 0 && (lease_ms < kMinLeaseMs || lease_ms > 0xFFFFFFFFu))
    return error_reply(Status::invalid("lease_ms", "out of range"));
  if (!body.contains("ring")) return error_reply(Status::invalid("ring", "is required"));
  RingRecord rec;
  if (Status s = ring_tree_from_json(body["ring"], rec.spec, rec.tree); !s) return error_reply(s);
  if (Status s = engine::validate(rec.spec); !s) return error_reply(s);
  if (Status s = check_own_entry(rec.spec, rec.tree); !s) return error_reply(s);
  rec.entry = entry;
  rec.origin = origin;
  rec.lease_ms = static_cast<uint32_t>(lease_ms);
  const uint32_t id = rec.spec.ring_id;
  {
    std::unique_lock lock(mu_);  // a renewal, the usual push, waits on no data plane change
    if (auto known = known_fabric_entry(lock, rec)) return *known;
  }
  std::unique_lock change(change_mu_, std::defer_lock);
  if (auto busy = lock_change(change)) return *busy;
  std::unique_lock lock(mu_);
  if (auto known = known_fabric_entry(lock, rec)) return *known;
  std::optional<RingRecord> replaced;
  if (auto it = rings_.find(id); it != rings_.end()) {
    RingRecord& have = it->second;
    if (have.entry.empty() || have.origin != origin)
      return error_reply(
          {StatusCode::conflict, "id",
           id_text(id) + " exists on box " + cfg_.fabric->self +
               (have.entry.empty()
                    ? " (registered here)"
                    : " (registered by box " +
                          (have.origin.empty() ? cfg_.fabric->self : have.origin) + ")")});
    // The same origin registered the id anew (its removal of the old entry
    // has not arrived yet): the origin is authoritative, and the old entry
    // is over.
    replaced = have;
    rings_.erase(it);
  } else if (rings_.size() >= cfg_.max_rings) {
    return error_reply(
        {StatusCode::resource_exhausted, "quotas.max_rings",
         "the daemon holds its maximum of " + std::to_string(cfg_.max_rings) + " rings"});
  }
  const uint64_t need = engine::ring_memory_bytes(rec.spec, engine::ReduceMode::deterministic);
  if (const uint64_t used = memory_locked(); used + need > cfg_.max_memory) {
    if (replaced) rings_.emplace(id, *replaced);
    return error_reply({StatusCode::resource_exhausted, "quotas.max_memory",
                        "the ring needs " + std::to_string(need) + " bytes; " +
                            std::to_string(used) + " of " + std::to_string(cfg_.max_memory) +
                            " are taken on box " + cfg_.fabric->self});
  }
  if (lease_ms) rec.expires = SteadyClock::now() + std::chrono::milliseconds(lease_ms);
  rings_.emplace(id, rec);
  if (Status s = save_locked(); !s) {
    rings_.erase(id);
    if (replaced) rings_.emplace(id, *replaced);
    return error_reply({StatusCode::internal, "", "cannot persist the state: " + s.message()});
  }
  if (replaced) bury_locked(replaced->entry);
  lock.unlock();
  json reply;
  if (replaced) (void)dp_.call(dpcmd::remove_ring(id), reply);
  const Status s = dp_.call(install_cmd(rec), reply);
  lock.lock();
  if (!s && s.code() != StatusCode::unavailable) {  // refused: undo, the origin retries
    rings_.erase(id);
    (void)save_locked();
    return error_reply(s);
  }
  spdlog::info("ring {}: fabric entry from box {} ({})", id, origin,
               rec.tree ? "tree node" : "plain ring");
  json j = ring_reply_locked(rec);
  j["installed"] = s.ok();
  return {201, {{"ring", j}}};
}

Status Daemon::check_own_entry(const engine::RingSpec& spec,
                               const std::optional<engine::TreeSpec>& tree) const {
  // The installation's epoch and key, drawn by the origin; a stand-in key
  // when none came (a plain ring needs none; a tree node must then differ).
  TreeSecret secret;
  secret.key.fill(1);
  if (tree) {
    secret.epoch = tree->epoch;
    secret.key = tree->key;
  }
  std::vector<FabricEntry> entries;
  if (Status s = compute_fabric_entries(spec, *cfg_.fabric, secret, entries); !s)
    return Status(s.code(), "ring." + s.field(), s.message());
  const std::string& self = cfg_.fabric->self;
  auto mine = std::find_if(entries.begin(), entries.end(),
                           [&](const FabricEntry& e) { return e.box == self; });
  if (mine == entries.end())
    return {StatusCode::conflict, "ring",
            "box " + self + " has no part in this ring under its own fabric configuration; " +
                "the origin's fabric section differs from this box's"};
  if (mine->tree != tree)
    return {StatusCode::conflict, "ring.tree",
            "is not the node box " + self + " computes from its own fabric configuration; " +
                "the origin's fabric section differs from this box's"};
  return {};
}

std::optional<Reply> Daemon::lock_change(std::unique_lock<std::timed_mutex>& change) {
  const std::chrono::milliseconds wait(cfg_.dataplane_timeout_ms);
  if (change.try_lock_for(wait)) return std::nullopt;
  return error_reply({StatusCode::unavailable, "dataplane.timeout_ms",
                      "other changes of the data plane held it for " +
                          std::to_string(wait.count()) +
                          " ms (dataplane.timeout_ms); the data plane is slow: retry"});
}

void Daemon::bury_locked(const std::string& entry) {
  if (!buried_.insert(entry).second) return;
  burial_order_.push_back(entry);
  if (burial_order_.size() > kMaxBuried) {
    buried_.erase(burial_order_.front());
    burial_order_.pop_front();
  }
}

std::optional<Reply> Daemon::known_fabric_entry(std::unique_lock<std::mutex>& lock,
                                                const RingRecord& rec) {
  const uint32_t id = rec.spec.ring_id;
  if (buried_.count(rec.entry))
    return error_reply({StatusCode::conflict, "entry",
                        "entry " + rec.entry + " of " + id_text(id) + " from box " + rec.origin +
                            " was removed by its origin (or replaced by a newer registration); "
                            "a late or replayed push of it is refused"});
  auto it = rings_.find(id);
  if (it == rings_.end()) return std::nullopt;
  RingRecord& have = it->second;
  if (have.entry != rec.entry || !same_spec(have.spec, rec.spec) || have.tree != rec.tree)
    return std::nullopt;
  have.lease_ms = rec.lease_ms;
  if (rec.lease_ms) have.expires = SteadyClock::now() + std::chrono::milliseconds(rec.lease_ms);
  json j = ring_reply_locked(have);
  const RingRecord held = have;
  lock.unlock();
  json live;
  j["installed"] = dp_.call(dpcmd::get_ring(id), live).ok() && live.contains("ring") &&
                   installed_as(live["ring"], held);
  return Reply{200, {{"ring", j}}};
}

Reply Daemon::fabric_delete(uint32_t id, const std::string& entry) {
  std::unique_lock change(change_mu_, std::defer_lock);
  if (auto busy = lock_change(change)) return *busy;
  std::unique_lock lock(mu_);
  auto it = rings_.find(id);
  if (it == rings_.end() || entry.empty() || it->second.entry != entry) {
    // A push of it may still be on its way (a late retry, a renewal): it
    // must not install the entry after its removal.
    if (valid_credential(entry)) bury_locked(entry);
    return error_reply(
        {StatusCode::not_found, "id", "no fabric entry " + entry + " of " + id_text(id)});
  }
  RingRecord old = it->second;
  rings_.erase(it);
  if (Status s = save_locked(); !s) {
    rings_.emplace(id, std::move(old));
    return error_reply({StatusCode::internal, "", "cannot persist the state: " + s.message()});
  }
  bury_locked(entry);
  lock.unlock();
  json reply;
  if (old.local) (void)dp_.call(dpcmd::remove_ring(id), reply);
  spdlog::info("ring {}: fabric entry removed by its origin {}", id, old.origin);
  return {204, nullptr};
}

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
  // Live ring counts when nobody holds the lock (a write may hold it for a
  // whole data plane call): never wait for it.
  if (std::unique_lock lock(mu_, std::try_to_lock); lock.owns_lock()) {
    in.configured_rings = rings_.size();
    in.configured_memory = memory_locked();
    in.leased_rings = 0;
    for (const auto& [id, rec] : rings_) in.leased_rings += rec.lease_ms ? 1 : 0;
  }
  in.max_rings = cfg_.max_rings;
  in.max_memory = cfg_.max_memory;
  in.connects = dp_.connects();
  in.reconciles = counters_.reconciles.load();
  in.reconcile_failures = counters_.reconcile_failures.load();
  in.rings_pushed = counters_.rings_pushed.load();
  in.rings_pruned = counters_.rings_pruned.load();
  in.restarts_seen = counters_.restarts_seen.load();
  in.http = http;
  in.rings_expired = counters_.rings_expired.load();
  in.fabric_pushes = counters_.fabric_pushes.load();
  in.fabric_push_failures = counters_.fabric_push_failures.load();
  in.fabric_removals = counters_.fabric_removals.load();
  in.fabric_pending = fabric_pending_.load();
  return render_metrics(in);
}

}  // namespace netreduce::control
