// The fabric at a ring's origin, the box it was POSTed to
// (docs/design.md#fabric-state-in-etcd): the other boxes' entries written to
// etcd in one transaction under one lease, that lease kept alive while the
// ring is in the table and revoked once it leaves, and the peers' acks read
// back into the ring's `peers`. Threads and locks: control/daemon.h.
//
// - HTTP worker, POST /v1/rings: create_ring() publishes, then waits up to
//   kAckWait on `acks_cv_` for every peer's ack; a failed publish, or a peer
//   holding the id as its own ring, withdraws the ring.
// - Upkeep (`fabric_upkeep_`): revoke_removed(), keep_leases_alive() and
//   publish_unpublished(), each over a copy of what is due, the answers
//   applied to the records still of the same registration.
// - Acks watcher (`acks_watch_`): apply_ack() and sync_acks() record the
//   acks of this origin's entries and wake the waiting POSTs.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <string>
#include <vector>

#include "control/daemon.h"
#include "control/daemon_fabric_shared.h"
#include "control/daemon_shared.h"

namespace netreduce::control {

using nlohmann::json;

namespace {

// How long a POST waits for its peers' acks before it answers (the host
// library then polls "installed").
constexpr auto kAckWait = std::chrono::milliseconds(1000);
// The etcd lease of a ring without a job lease: kept alive while the ring is
// in its origin's table, so its entries outlive a dead origin by this much.
constexpr int64_t kUnleasedTtlS = 10;

}  // namespace

// --- POST and publishing ------------------------------------------------------

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

// --- The upkeep's steps -------------------------------------------------------

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

// --- The acks watcher ---------------------------------------------------------

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

}  // namespace netreduce::control
