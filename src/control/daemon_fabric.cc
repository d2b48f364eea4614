// The daemon's fabric part (docs/design.md#fabric-pushes): at an origin, the
// push lanes that deliver each peer box's entries and removals and a POST's
// own push; at a peer, the fabric routes, which check an entry against this
// box's own fabric section and refuse entries their origin removed. Threads
// and locks: control/daemon.h.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <vector>

#include "common/http_client.h"
#include "common/ring_json.h"
#include "control/daemon.h"
#include "control/daemon_shared.h"
#include "control/fabric.h"
#include "engine/engine_json.h"

namespace netreduce::control {

using nlohmann::json;

namespace {

// A push to or removal at a peer daemon, connect to last byte.
constexpr int kPushTimeoutMs = 5000;
// How long a POST waits for a peer's lane to push its entries itself.
constexpr int kLaneWaitMs = 200;

}  // namespace

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

void Daemon::lane_main(Lane& lane) {
  run_until_stopped(std::chrono::milliseconds(100), [&] {
    std::lock_guard lane_lock(lane.mu);
    push_lane_locked(lane);
  });
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
  if (replaced) (void)change_call(dpcmd::remove_ring(id), reply);
  const Status s = change_call(install_cmd(rec), reply);
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
  // From the metrics thread's copy of the data plane's rings, so that a
  // renewal never waits for the data plane.
  j["installed"] = installed_per_cache(held);
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
  if (old.local) (void)change_call(dpcmd::remove_ring(id), reply);
  spdlog::info("ring {}: fabric entry removed by its origin {}", id, old.origin);
  return {204, nullptr};
}

}  // namespace netreduce::control
