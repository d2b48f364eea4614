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
// table equal to it. Threads and locks: control/daemon.h.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <vector>

#include "common/ring_json.h"
#include "control/daemon.h"
#include "control/daemon_shared.h"
#include "control/fabric.h"
#include "engine/engine_json.h"

namespace netreduce::control {

using nlohmann::json;

namespace {

// How long a POST waits for its peers' acks before it answers (the host
// library then polls "installed").
constexpr auto kAckWait = std::chrono::milliseconds(1000);
// The etcd lease of a ring without a job lease: kept alive while the ring is
// in its origin's table, so its entries outlive a dead origin by this much.
constexpr int64_t kUnleasedTtlS = 10;
// One watch stream's length; the next resumes at the next revision.
constexpr int kWatchWindowMs = 5000;
// How often a watcher reads its prefix whole anyway.
constexpr auto kReadWholeEvery = std::chrono::seconds(60);
// After a failed publish or watch, the next try.
constexpr auto kRetry = std::chrono::seconds(1);

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

// The ring id at the end of an entry key (".../rings/<id>"); false if none.
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

}  // namespace

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

// --- Origin: POST and publishing -------------------------------------------

int64_t Daemon::etcd_ttl_s(const RingRecord& rec) const {
  // At least the job's lease, and long enough for a keepalive every TTL/3
  // to try every member once (each attempt up to fabric.etcd.timeout_ms).
  const int64_t job_s =
      rec.lease_ms ? (static_cast<int64_t>(rec.lease_ms) + 999) / 1000 : kUnleasedTtlS;
  const int64_t tries_ms =
      3 * static_cast<int64_t>(cfg_.fabric->etcd_endpoints.size()) * cfg_.fabric->etcd_timeout_ms;
  return std::max({job_s, int64_t{2}, (tries_ms + 999) / 1000});
}

void Daemon::queue_revoke_locked(int64_t lease, const RingRecord& rec) {
  if (lease) revoke_.push_back({lease, SteadyClock::now() + std::chrono::seconds(etcd_ttl_s(rec))});
}

Reply Daemon::create_ring(const json& body, const RingAuth& auth) {
  Reply r = create_ring_here(body, auth);
  if (r.http != 201 || !cfg_.fabric || !r.body["ring"].contains("fabric") ||
      r.body["ring"]["fabric"].value("peers", json::array()).empty())
    return r;
  const uint32_t id = r.body["ring"]["id"].get<uint32_t>();
  const std::string entry = r.body["ring"]["fabric"]["entry"].get<std::string>();
  Status s = publish(id, entry);
  {
    std::lock_guard lock(mu_);  // from now on the upkeep may publish it too
    if (auto it = rings_.find(id); it != rings_.end() && it->second.entry == entry)
      it->second.etcd_failed = SteadyClock::now();
  }
  std::unique_lock lock(mu_);
  if (s) {
    acks_cv_.wait_for(lock, kAckWait, [&] {
      auto it = rings_.find(id);
      if (it == rings_.end() || it->second.entry != entry) return true;
      return std::all_of(it->second.peers.begin(), it->second.peers.end(),
                         [](const PeerEntry& p) { return p.installed || !p.error.empty(); });
    });
    // A box that holds the id itself (a ring registered there) refused its
    // entry: the id is taken, and the job's host library picks another.
    if (auto it = rings_.find(id); it != rings_.end() && it->second.entry == entry)
      for (const PeerEntry& p : it->second.peers)
        if (p.error_field == "id")
          s = {StatusCode::conflict, "id", "box " + p.box + ": " + p.error};
  }
  if (!s) {
    // Nothing of it stays: the ring leaves this box, its lease is revoked,
    // and the job takes its ring path with this reason.
    lock.unlock();
    withdraw(id, entry);
    Reply e = error_reply(s.code() == StatusCode::not_found  // the lease ended meanwhile
                              ? Status(StatusCode::unavailable, s.field(), s.message())
                              : s);
    if (s.code() == StatusCode::unavailable || s.code() == StatusCode::not_found)
      e.body["error"]["code"] = "fabric_unavailable";
    return e;
  }
  json& ring = r.body["ring"];
  if (auto it = rings_.find(id); it != rings_.end() && it->second.entry == entry) {
    const bool here = ring["fabric"].value("installed_here", false);
    ring["fabric"] = fabric_view_locked(it->second);
    set_installed(ring, here, it->second);
  }
  return r;
}

void Daemon::withdraw(uint32_t id, const std::string& entry) {
  std::lock_guard change(change_mu_);
  std::unique_lock lock(mu_);
  auto it = rings_.find(id);
  if (it == rings_.end() || it->second.entry != entry) return;
  const RingRecord old = it->second;
  rings_.erase(it);
  if (Status s = save_locked(); !s) {
    rings_.emplace(id, old);
    spdlog::error("ring {}: cannot withdraw it: {}", id, s.to_string());
    return;
  }
  queue_revoke_locked(old.etcd_lease, old);  // published by the upkeep meanwhile
  lock.unlock();
  json reply;
  if (old.local) (void)change_call(dpcmd::remove_ring(id), reply);
}

Status Daemon::publish(uint32_t id, const std::string& entry) {
  RingRecord rec;
  {
    std::lock_guard lock(mu_);
    auto it = rings_.find(id);
    // Published, or another thread (a POST, the upkeep) is publishing it.
    if (it == rings_.end() || it->second.entry != entry || it->second.peers.empty() ||
        it->second.etcd_lease || !publishing_.insert(entry).second)
      return {};
    rec = it->second;
  }
  struct Release {
    Daemon& d;
    const std::string& entry;
    ~Release() {
      std::lock_guard lock(d.mu_);
      d.publishing_.erase(entry);
    }
  } release{*this, entry};
  int64_t lease = 0;
  Status s = etcd_->grant(etcd_ttl_s(rec), lease);
  std::vector<std::pair<std::string, std::string>> kvs;
  for (const PeerEntry& p : rec.peers)
    kvs.emplace_back(entries_prefix(p.box) + std::to_string(id), json{{"origin", cfg_.fabric->self},
                                                                      {"entry", rec.entry},
                                                                      {"lease_ms", rec.lease_ms},
                                                                      {"etcd_lease", lease},
                                                                      {"ring", p.ring}}
                                                                     .dump());
  for (int attempt = 0; s && attempt < 2; ++attempt) {
    bool created = false;
    std::vector<EtcdKv> held;
    s = etcd_->put_if_absent(kvs, lease, created, held);
    if (!s || created) break;
    // Keys some registration holds: this one's (a try whose answer was
    // lost, by this call or an earlier one: keep that lease), an older one
    // of this box's (its lease ends now, then try again), or another box's
    // (a conflict).
    int64_t adopt = 0;
    std::string taken;
    for (const EtcdKv& kv : held) {
      const json v = parse_object(kv.value);
      const std::string origin = text_field(v, "origin");
      if (origin == cfg_.fabric->self && text_field(v, "entry") == rec.entry) {
        adopt = kv.lease;
      } else if (origin == cfg_.fabric->self) {
        (void)etcd_->revoke(kv.lease);
      } else {
        taken = kv.key.substr(cfg_.fabric->etcd_prefix.size()) + " (registered by box " +
                (origin.empty() ? std::string("?") : origin) + ")";
      }
    }
    if (!taken.empty()) {
      s = {StatusCode::conflict, "id",
           id_text(id) + " is taken in the fabric: " + taken + "; choose another id"};
    } else if (adopt) {
      if (adopt != lease) (void)etcd_->revoke(lease);
      lease = adopt;
      break;
    } else if (attempt == 1) {
      s = {StatusCode::conflict, "id",
           id_text(id) + " is still held in etcd by an older registration of this box; retry"};
    }
  }
  std::lock_guard lock(mu_);
  if (!s) {
    queue_revoke_locked(lease, rec);  // whatever the lost answers may have written
    if (s.code() != StatusCode::conflict) ++counters_.fabric_etcd_errors;
    return s;
  }
  auto it = rings_.find(id);
  if (it == rings_.end() || it->second.entry != rec.entry) {
    queue_revoke_locked(lease, rec);  // removed meanwhile
    return {};
  }
  it->second.etcd_lease = lease;
  it->second.etcd_renewed = SteadyClock::now();
  if (Status saved = save_locked(); !saved)
    spdlog::error("ring {}: published, but the state cannot be saved: {}", id, saved.to_string());
  ++counters_.fabric_publishes;
  spdlog::info("ring {}: entries for {} box(es) published in etcd", id, rec.peers.size());
  return {};
}

// --- The upkeep thread ----------------------------------------------------

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

void Daemon::revoke_removed() {
  std::vector<PendingRevoke> due;
  {
    std::lock_guard lock(mu_);
    due.swap(revoke_);
  }
  // Until it succeeds, or the lease has ended by itself (nobody keeps it alive).
  std::vector<PendingRevoke> again;
  for (const PendingRevoke& r : due)
    if (Status s = etcd_->revoke(r.lease); !s) {
      ++counters_.fabric_etcd_errors;
      if (SteadyClock::now() < r.give_up) again.push_back(r);
    }
  if (again.empty()) return;
  std::lock_guard lock(mu_);
  revoke_.insert(revoke_.end(), again.begin(), again.end());
}

void Daemon::publish_unpublished() {
  std::vector<std::pair<uint32_t, std::string>> due;
  {
    std::lock_guard lock(mu_);
    const auto now = SteadyClock::now();
    for (const auto& [id, rec] : rings_)
      if (!rec.peers.empty() && !rec.etcd_lease && now - rec.etcd_failed >= kRetry)
        due.emplace_back(id, rec.entry);
  }
  for (const auto& [id, entry] : due)
    if (Status s = publish(id, entry); !s) {
      spdlog::warn("ring {}: publishing its fabric entries: {}", id, s.to_string());
      std::lock_guard lock(mu_);
      if (auto it = rings_.find(id); it != rings_.end() && it->second.entry == entry)
        it->second.etcd_failed = SteadyClock::now();
    }
}

void Daemon::keep_leases_alive() {
  struct Due {
    uint32_t id;
    std::string entry;
    int64_t lease;
  };
  std::vector<Due> due;
  {
    std::lock_guard lock(mu_);
    const auto now = SteadyClock::now();
    for (const auto& [id, rec] : rings_)  // an origin's leases only (a peer's is its origin's)
      if (rec.origin.empty() && rec.etcd_lease &&
          now - rec.etcd_renewed >= std::chrono::seconds(etcd_ttl_s(rec)) / 3 &&
          now - rec.etcd_failed >= kRetry)
        due.push_back({id, rec.entry, rec.etcd_lease});
  }
  for (const Due& d : due) {
    int64_t ttl = 0;
    const Status s = etcd_->keepalive(d.lease, ttl);
    if (!s) ++counters_.fabric_etcd_errors;
    std::lock_guard lock(mu_);
    auto it = rings_.find(d.id);
    if (it == rings_.end() || it->second.entry != d.entry) continue;
    if (!s) {
      it->second.etcd_failed = SteadyClock::now();  // etcd away: the lease has TTL left
    } else if (ttl > 0) {
      it->second.etcd_renewed = SteadyClock::now();
    } else {
      // etcd ended the lease (this origin could not reach it in time): the
      // peers removed the entries; publish them again.
      spdlog::warn("ring {}: its etcd lease ended; publishing its entries again", d.id);
      it->second.etcd_lease = 0;
      for (PeerEntry& p : it->second.peers) p.installed = false;
    }
  }
}

bool Daemon::put_ack(const RingRecord& rec, bool installed, const Status& error) {
  // An entry without a lease was not written by an origin's publish: its
  // refusal is counted and logged here, not acked for ever.
  if (!rec.etcd_lease) return true;
  const json ack = {{"entry", rec.entry},
                    {"installed", installed},
                    {"error", error ? "" : error.message()},
                    {"field", error ? "" : error.field()}};
  const std::string key =
      acks_prefix(rec.origin) + std::to_string(rec.spec.ring_id) + "/" + cfg_.fabric->self;
  const Status s = etcd_->put(key, ack.dump(), rec.etcd_lease);
  // not_found: the entry's lease is gone, and the entry with it (its
  // removal is on its way through the watch).
  if (!s && s.code() != StatusCode::not_found) ++counters_.fabric_etcd_errors;
  return s.ok();
}

void Daemon::refresh_acks() {
  std::vector<RingRecord> changed;
  {
    std::lock_guard lock(mu_);
    // One writer of a record's ack at a time: two puts in flight could land
    // in etcd in the other order, leaving the older value as the last word.
    for (auto& [id, rec] : rings_)
      if (!rec.origin.empty() && rec.etcd_lease && !rec.acking) {
        rec.acking = ++ack_claims_;  // the copy below carries it
        changed.push_back(rec);
      }
  }
  for (const RingRecord& rec : changed) {
    // Only a refresh begun after the last ack tells anything new (an older
    // one may predate the install that ack reported).
    const std::optional<bool> installed = installed_per_cache(rec, rec.acked_at);
    const auto asked = SteadyClock::now();
    const bool sent = installed && rec.acked != *installed && put_ack(rec, *installed, {});
    std::lock_guard lock(mu_);
    // The claim, not the entry, names the record: the same entry may have
    // left and come back (a new lease) meanwhile, claimed by its install.
    if (auto it = rings_.find(rec.spec.ring_id);
        it != rings_.end() && it->second.acking == rec.acking) {
      it->second.acking = 0;
      if (sent) {
        it->second.acked = *installed;
        it->second.acked_at = asked;
      }
    }
  }
}

// --- Watchers -------------------------------------------------------------

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

void Daemon::apply_entry(const EtcdKv& kv) {
  uint32_t id = 0;
  const json v = parse_object(kv.value);
  const std::string origin = text_field(v, "origin");
  const std::string entry = text_field(v, "entry");
  // Not an entry any origin of this fabric wrote: nobody to tell.
  if (!id_from_key(kv.key, entries_prefix(cfg_.fabric->self), id) ||
      cfg_.fabric->find(origin) < 0 || origin == cfg_.fabric->self || !valid_credential(entry)) {
    ++counters_.fabric_entries_refused;
    spdlog::warn("fabric: {} is not an entry of another box of this fabric; ignored", kv.key);
    return;
  }
  RingRecord rec;
  rec.origin = origin;
  rec.entry = entry;
  rec.etcd_lease = kv.lease;
  rec.spec.ring_id = id;
  Status s = ring_tree_from_json(v.value("ring", json()), rec.spec, rec.tree);
  if (!s) s = Status(s.code(), "ring." + s.field(), s.message());
  if (s && rec.spec.ring_id != id)
    s = Status::invalid("ring.id", "is not the key's id " + std::to_string(id));
  if (s) s = engine::validate(rec.spec);
  if (s) s = check_own_entry(rec.spec, rec.tree);
  bool known = false;
  uint64_t claim = 0;
  if (s) s = install_entry(rec, known, claim);
  if (known) return;  // held already (a whole read after a restart)
  const bool refused = !s && s.code() != StatusCode::unavailable;
  if (refused) {
    ++counters_.fabric_entries_refused;
    spdlog::warn("ring {}: entry from box {} refused: {}", id, origin, s.to_string());
    // etcd holds this entry for the id now: an older one held here is over.
    drop_other_entry(id, entry);
  } else {
    ++counters_.fabric_entries_applied;
    spdlog::info("ring {}: fabric entry from box {} ({})", id, origin,
                 rec.tree ? "tree node" : "plain ring");
  }
  // Acked with no lock held. A record that entered the table did so claimed
  // for this ack (`claim`), so the upkeep's acks of it come after this one;
  // they correct it from a metrics refresh begun after it, or send what it
  // missed.
  const auto asked = SteadyClock::now();
  const bool sent = put_ack(rec, s.ok(), refused ? s : Status());
  if (!claim) return;
  std::lock_guard lock(mu_);
  if (auto it = rings_.find(id); it != rings_.end() && it->second.acking == claim) {
    it->second.acking = 0;
    it->second.acked_at = asked;
    if (sent) it->second.acked = s.ok();
  }
}

Status Daemon::install_entry(const RingRecord& rec, bool& known, uint64_t& claim) {
  const uint32_t id = rec.spec.ring_id;
  std::lock_guard change(change_mu_);
  std::unique_lock lock(mu_);
  std::optional<RingRecord> replaced;
  if (auto it = rings_.find(id); it != rings_.end()) {
    RingRecord& have = it->second;
    if (have.origin.empty())
      return {StatusCode::conflict, "id",
              id_text(id) + " is registered on box " + cfg_.fabric->self + " itself"};
    if (have.entry == rec.entry && same_spec(have.spec, rec.spec) && have.tree == rec.tree) {
      if (have.etcd_lease != rec.etcd_lease) {
        // Published again under a new lease: the old lease's ack went with
        // it, so the upkeep acks again under the new one.
        have.etcd_lease = rec.etcd_lease;
        have.acked.reset();
      }
      known = true;
      return {};
    }
    // A newer registration of the id (etcd's order): the old entry is over.
    replaced = have;
    rings_.erase(it);
  } else if (rings_.size() >= cfg_.max_rings) {
    return {StatusCode::resource_exhausted, "quotas.max_rings",
            "box " + cfg_.fabric->self + " holds its maximum of " + std::to_string(cfg_.max_rings) +
                " rings"};
  }
  const uint64_t need = engine::ring_memory_bytes(rec.spec, engine::ReduceMode::deterministic);
  if (const uint64_t used = memory_locked(); used + need > cfg_.max_memory)
    return {StatusCode::resource_exhausted, "quotas.max_memory",
            "the ring needs " + std::to_string(need) + " bytes; " + std::to_string(used) + " of " +
                std::to_string(cfg_.max_memory) + " are taken on box " + cfg_.fabric->self};
  claim = ++ack_claims_;
  rings_.emplace(id, rec).first->second.acking = claim;  // apply_entry's ack
  if (Status s = save_locked(); !s) {
    rings_.erase(id);
    return {StatusCode::internal, "", "cannot persist the state: " + s.message()};
  }
  lock.unlock();
  json reply;
  if (replaced) (void)change_call(dpcmd::remove_ring(id), reply);
  const Status s = change_call(install_cmd(rec), reply);
  if (!s && s.code() != StatusCode::unavailable) {  // refused by the data plane
    lock.lock();
    rings_.erase(id);
    (void)save_locked();
  }
  return s;
}

void Daemon::drop_other_entry(uint32_t id, const std::string& keep) {
  std::string other;
  {
    std::lock_guard lock(mu_);
    auto it = rings_.find(id);
    if (it == rings_.end() || it->second.origin.empty() || it->second.entry == keep) return;
    other = it->second.entry;
  }
  remove_entry(id, other);
}

void Daemon::on_entry_event(const EtcdEvent& e) {
  if (!e.deleted) return apply_entry(e.kv);
  uint32_t id = 0;
  if (!id_from_key(e.kv.key, entries_prefix(cfg_.fabric->self), id)) return;
  remove_entry(id, e.prev ? text_field(parse_object(e.prev->value), "entry") : "");
}

void Daemon::remove_entry(uint32_t id, const std::string& entry) {
  std::lock_guard change(change_mu_);
  std::unique_lock lock(mu_);
  auto it = rings_.find(id);
  if (it == rings_.end() || it->second.origin.empty() ||
      (!entry.empty() && it->second.entry != entry))
    return;
  const RingRecord old = it->second;
  rings_.erase(it);
  if (Status s = save_locked(); !s) {
    rings_.emplace(id, old);
    spdlog::error("ring {}: etcd removed its entry, but the state cannot be saved: {}", id,
                  s.to_string());
    return;
  }
  lock.unlock();
  json reply;
  if (old.local) (void)change_call(dpcmd::remove_ring(id), reply);
  ++counters_.fabric_entries_removed;
  spdlog::info("ring {}: fabric entry from box {} removed (gone from etcd)", id, old.origin);
}

void Daemon::sync_entries(const std::vector<EtcdKv>& kvs) {
  std::map<uint32_t, std::string> in_etcd;  // id -> entry
  for (const EtcdKv& kv : kvs) {
    uint32_t id = 0;
    if (id_from_key(kv.key, entries_prefix(cfg_.fabric->self), id))
      in_etcd[id] = text_field(parse_object(kv.value), "entry");
    try {
      apply_entry(kv);
    } catch (const std::exception& e) {  // the next entries and the removals go on
      ++counters_.fabric_entries_refused;
      spdlog::error("fabric: {}: {}", kv.key, e.what());
    }
  }
  // What this box holds and etcd does not (or holds another registration of).
  std::vector<std::pair<uint32_t, std::string>> gone;
  {
    std::lock_guard lock(mu_);
    for (const auto& [id, rec] : rings_) {
      auto it = in_etcd.find(id);
      if (!rec.origin.empty() && (it == in_etcd.end() || it->second != rec.entry))
        gone.emplace_back(id, rec.entry);
    }
  }
  for (const auto& [id, entry] : gone) remove_entry(id, entry);
}

void Daemon::apply_ack(const EtcdKv& kv, bool deleted) {
  // ".../acks/<id>/<box>"
  const std::string rest = kv.key.substr(acks_prefix(cfg_.fabric->self).size());
  const size_t slash = rest.find('/');
  uint32_t id = 0;
  if (slash == std::string::npos || !id_from_key(rest.substr(0, slash), "", id)) return;
  const std::string box = rest.substr(slash + 1);
  const json v = parse_object(kv.value);
  std::lock_guard lock(mu_);
  auto it = rings_.find(id);
  if (it == rings_.end() || (!deleted && text_field(v, "entry") != it->second.entry)) return;
  for (PeerEntry& p : it->second.peers)
    if (p.box == box) {
      p.installed = !deleted && true_field(v, "installed");
      p.error = deleted ? "" : text_field(v, "error");
      p.error_field = deleted ? "" : text_field(v, "field");
    }
  acks_cv_.notify_all();
}

void Daemon::sync_acks(const std::vector<EtcdKv>& kvs) {
  {
    std::lock_guard lock(mu_);
    for (auto& [id, rec] : rings_)
      for (PeerEntry& p : rec.peers) {
        p.installed = false;
        p.error.clear();
        p.error_field.clear();
      }
  }
  for (const EtcdKv& kv : kvs) apply_ack(kv, false);
}

// --- A peer's check of its own entry --------------------------------------

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

}  // namespace netreduce::control
