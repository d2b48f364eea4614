// netreduced's core, independent of HTTP: the ring table (the source of
// truth, persisted through StateFile), quotas, ownership, leases, the
// fabric's rings in etcd and the reconciler that makes the data plane's
// rings equal to the table. Design: docs/design.md#the-control-plane; API:
// docs/api.md#the-routes. Files: daemon.cc (start, stop, the API),
// daemon_reconcile.cc, daemon_leases.cc, daemon_fabric*.cc (etcd),
// daemon_metrics.cc; daemon_shared.h what they share about ring records.
//
// Example: a job POSTs ring 7 (P = 3 members) with "lease_ms": 30000.
//  1. create_ring: validate the spec and quotas, persist it with a new
//     credential (128 random bits) under `mu_`, then install it in the data
//     plane with `mu_` free; the 201 reply carries the credential, the only
//     time it is sent.
//  2. The data plane restarts. The reconciler's next pass sees a new
//     instance (pid and start time), lists the data plane's rings and
//     installs ring 7 again, with no operator action.
//  3. The job renews the lease (PUT /v1/rings/7/lease, with the credential)
//     until it exits; 30 s after the last renewal the lease thread removes
//     ring 7 from the state, then from the data plane. Meanwhile another
//     job's POST of id 7 gets 409, and a DELETE without the credential 403.
//
// Threads and locks (order: `change_mu_`, then `mu_`; `mu_` is never held
// across a call to the data plane or another process, so renewals, reads and
// health never wait on one):
// - API calls (HTTP workers): a change of the data plane (create, delete,
//   fabric entries) holds `change_mu_` throughout (503 if other changes hold
//   it for dataplane.timeout_ms): validate and persist under `mu_`, release
//   it, call the data plane (bounded by the client's deadline), retake `mu_`
//   to undo what the data plane refused. Renewals and reads take `mu_`
//   alone, for in-memory work.
// - Reconciler (`reconciler_`, every reconcile_interval_ms): holds
//   `change_mu_` for a pass over a copy of the table, so a pass never races
//   a change (the table's membership changes only under both locks).
// - Leases (`leases_`): removes unrenewed rings from the table like a
//   DELETE. Deadlines live in memory: after a restart every lease gets a
//   full period again.
// - Metrics (`metrics_thread_`): copies the data plane's status, stats and
//   rings into `cache_`, swapped under `cache_mu_`. metrics() reads that and
//   takes `mu_` only if free; health() reads atomics only.
// - Fabric (docs/design.md#fabric-state-in-etcd). No lock is held across
//   an etcd call: each step copies what it needs under `mu_`, calls etcd
//   with no lock, and applies the answer under `mu_` to the record only if
//   it is still the one copied (the same `entry`; for an ack, the same
//   claim). By role:
//   - POST at an origin (HTTP worker; daemon_fabric_origin.cc): publishes
//     the peers' entries after create_ring_here, then waits on `acks_cv_`
//     (with `mu_`) for their acks; a failure withdraws the ring like a
//     DELETE (`change_mu_`, then `mu_`).
//   - Upkeep (`fabric_upkeep_`; daemon_fabric_origin.cc, its acks step in
//     daemon_fabric_peer.cc): revokes the leases of removed rings, keeps
//     the others alive, publishes what is not yet, and puts this box's
//     acks; `mu_` alone, never `change_mu_`.
//   - Entries watcher (`entries_watch_`; daemon_fabric_peer.cc): installs
//     and removes what etcd holds for this box, a change of the data plane
//     like an API call (`change_mu_` throughout, `mu_` for the table).
//   - Acks watcher (`acks_watch_`; daemon_fabric_origin.cc): records the
//     peers' acks under `mu_` and wakes the POSTs waiting on `acks_cv_`.
//   One publish() of a registration at a time (`publishing_`, under `mu_`).
//   A peer record's ack has one writer at a time: whoever holds its claim
//   (RingRecord::acking, a number from `ack_claims_`, under `mu_`).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/dataplane_protocol.h"
#include "common/status.h"
#include "control/auth.h"
#include "control/config.h"
#include "control/etcd.h"
#include "control/metrics.h"
#include "control/state.h"

namespace netreduce::control {

// What an API call answers: an HTTP status and a JSON body (or an error).
struct Reply {
  int http = 200;
  nlohmann::json body;
};

// The error body of the API: {"error": {"code", "field", "message"}} with the
// API's code words (quota, conflict, not_found, dataplane_unavailable, ...).
Reply error_reply(const Status& s);

// Who makes a mutating call: the operator token (auth.token_file) or the
// jobs' token (auth.job_token_file), and the ring credential it presents
// (nullopt: no X-Netreduce-Ring-Credential header).
enum class Caller { operator_token, job_token };
struct RingAuth {
  Caller caller = Caller::operator_token;
  std::optional<std::string> credential;
};

// The header a ring's credential travels in.
inline constexpr const char* kCredentialHeader = "X-Netreduce-Ring-Credential";

// The daemon's counters (listed with their meaning in control/metrics.h),
// written by its threads, read by metrics().
struct DaemonCounters {
#define NETREDUCE_X(name, series, help) std::atomic<uint64_t> name{0};
  NETREDUCE_DAEMON_COUNTERS(NETREDUCE_X)
#undef NETREDUCE_X
  DaemonCounterValues read() const noexcept {
    DaemonCounterValues v;
#define NETREDUCE_X(name, series, help) v.name = name.load();
    NETREDUCE_DAEMON_COUNTERS(NETREDUCE_X)
#undef NETREDUCE_X
    return v;
  }
};

class Daemon {
 public:
  explicit Daemon(DaemonConfig cfg);
  ~Daemon();

  // Locks the state file (error: another netreduced holds it, named by pid),
  // loads the persisted state (error: unreadable state file) and starts the
  // reconciler and the metrics thread.
  Status start();
  // Ends every data plane call at once (they fail), then stops and joins
  // the daemon's threads. cancel_dataplane_calls() alone: the first step,
  // so that requests in progress finish before the HTTP server stops.
  void stop();
  void cancel_dataplane_calls() noexcept {
    dp_.cancel();
    if (etcd_) etcd_->cancel();
  }

  // body: ring JSON (common/ring_json.h) plus optional "lease_ms".
  Reply create_ring(const nlohmann::json& body, const RingAuth& auth = {});
  Reply delete_ring(uint32_t id, const RingAuth& auth = {});
  Reply renew_lease(uint32_t id, const RingAuth& auth);
  // Fault injection at the data plane (dataplane/faults.h), for operators'
  // rehearsals: the data plane refuses it unless its faults.enabled. body:
  // {"ring": id | "all", "kind", "fraction" (default 1), "duration_ms"}.
  // `ring` nullopt: clear every fault.
  Reply set_fault(const nlohmann::json& body);
  Reply clear_faults(std::optional<uint32_t> ring);
  Reply list_faults();
  Reply list_rings();
  Reply get_ring(uint32_t id);
  Reply status();
  Reply stats();
  Reply health();
  // The Prometheus text: the cached data plane figures, the daemon's own
  // counters and the HTTP front end's `http`.
  std::string metrics(const HttpStats& http = {});

  const DaemonConfig& config() const noexcept { return cfg_; }
  bool dataplane_up() const noexcept { return dp_up_.load(); }

 private:
  struct MetricsCache {
    bool dataplane_up = false;
    nlohmann::json status, stats, rings;
    uint64_t configured_rings = 0;
    uint64_t configured_memory = 0;
    uint64_t leased_rings = 0;
    std::chrono::steady_clock::time_point asked;  // the refresh began (its first data plane call)
    std::chrono::steady_clock::time_point taken;
  };

  // create_ring's work on this box (publishing the peers' entries comes after it).
  Reply create_ring_here(const nlohmann::json& body, const RingAuth& auth);
  Status save_locked() { return state_.save(rings_); }
  // Removes ring `id` of registration `entry` from the table and the data
  // plane (a POST whose entries could not be published).
  void withdraw(uint32_t id, const std::string& entry);
  nlohmann::json fabric_view_locked(const RingRecord& rec) const;

  // The fabric in etcd (daemon_fabric.cc; the other files by job, see the
  // top). Keys, under fabric.etcd.prefix:
  //   boxes/<box>/rings/<id>            an entry for <box> (origin writes)
  //   origins/<origin>/acks/<id>/<box>  <box>'s report of it (<box> writes)
  std::string entries_prefix(const std::string& box) const;
  std::string acks_prefix(const std::string& origin) const;
  void start_fabric();  // the upkeep thread and the two watchers
  // The upkeep thread's pass, one step per job (see the top).
  void fabric_upkeep();
  // A watcher's loop: the whole prefix read into `sync`, then its events
  // into `apply` from the next revision on, window after window; read whole
  // again after a compaction.
  void watch_main(const std::string& prefix,
                  const std::function<void(const std::vector<EtcdKv>&)>& sync,
                  const std::function<void(const EtcdEvent&)>& apply);
  // Origin (daemon_fabric_origin.cc): writes the peer entries of ring `id`,
  // registration `entry`, under a new lease, unless they are (adopts their
  // lease); nothing when another thread is at it. Error conflict (field
  // id): another registration holds one of the keys; unavailable: etcd did
  // not answer.
  Status publish(uint32_t id, const std::string& entry);
  // The etcd lease's TTL for `rec`: its job lease (or kUnleasedTtlS), at
  // least long enough for a keepalive to try every member.
  int64_t etcd_ttl_s(const RingRecord& rec) const;
  // Revokes `lease` (0: none) from the upkeep thread, until it succeeds or
  // would have ended by itself.
  void queue_revoke_locked(int64_t lease, const RingRecord& rec);
  void revoke_removed();
  void publish_unpublished();
  void keep_leases_alive();
  // Acks watcher: the peers' reports of this origin's entries.
  void apply_ack(const EtcdKv& kv, bool deleted);
  void sync_acks(const std::vector<EtcdKv>& kvs);
  // Peer (daemon_fabric_peer.cc). Entries watcher: what etcd holds for this
  // box becomes the table's.
  void on_entry_event(const EtcdEvent& e);
  void apply_entry(const EtcdKv& kv);
  // Takes a checked entry into the table and the data plane (replacing an
  // older registration of its id). known: held already, nothing done.
  // Error: refused (quota, id registered here, the data plane's refusal),
  // or unavailable (kept; the reconciler installs it). claim: the record's
  // ack claim (RingRecord::acking) when it entered the table, else 0.
  Status install_entry(const RingRecord& rec, bool& known, uint64_t& claim);
  // Removes this box's entry of `id` unless it is registration `keep`.
  void drop_other_entry(uint32_t id, const std::string& keep);
  void sync_entries(const std::vector<EtcdKv>& kvs);
  void remove_entry(uint32_t id, const std::string& entry);
  // The upkeep's acks step.
  void refresh_acks();
  // Puts this box's ack of `rec` (a peer entry) with the entry's lease
  // ({"entry", "installed", "error", "field"}: `error` a refusal); false if
  // etcd did not take it.
  bool put_ack(const RingRecord& rec, bool installed, const Status& error);
  // A fabric entry for this box: its tree node (or its being a plain ring)
  // must be what this box computes from its own fabric section, with the
  // installation's epoch and key as published; else conflict, field
  // ring.tree or ring. An origin's word alone installs nothing here.
  Status check_own_entry(const engine::RingSpec& spec,
                         const std::optional<engine::TreeSpec>& tree) const;
  void reconciler_main();
  // Makes the data plane's rings those of `table` (a copy of rings_ taken
  // under change_mu_, which the caller holds).
  Status reconcile(const RingMap& table);
  void metrics_main();
  void refresh_metrics();
  // Whether the data plane held `rec` at the last metrics refresh (false
  // while the data plane is down); nullopt when that refresh began before
  // `since` (or none was made).
  std::optional<bool> installed_per_cache(const RingRecord& rec,
                                          std::chrono::steady_clock::time_point since = {});
  void lease_main();
  // A data plane call of a change (install or remove); when it gets no
  // answer (unavailable: the connection never came, or was lost), the
  // reconciler's next tick makes a pass.
  Status change_call(const nlohmann::json& request, nlohmann::json& reply);
  // A thread's loop: work(), then wait `period` or until stop().
  void run_until_stopped(std::chrono::milliseconds period, const std::function<void()>& work);
  bool stopping();           // stop() was called
  bool any_lease_expired();  // takes mu_ alone
  void expire_leases();      // takes change_mu_
  // Takes `change` (on change_mu_) for an API call, waiting at most
  // dataplane.timeout_ms behind other changes; else the 503 to answer.
  std::optional<Reply> lock_change(std::unique_lock<std::timed_mutex>& change);
  // Checks that `auth` may delete or renew `rec` (nullopt: allowed).
  std::optional<Reply> check_owner(uint32_t id, const RingRecord& rec, const RingAuth& auth,
                                   const char* what) const;
  nlohmann::json ring_reply_locked(const RingRecord& rec) const;
  uint64_t memory_locked() const;

  const DaemonConfig cfg_;
  StateFile state_;
  DataplaneClient dp_;

  std::timed_mutex change_mu_;  // one change of the data plane at a time (see the top)
  std::mutex mu_;               // the table: rings_, revoke_, leases
  RingMap rings_;
  struct PendingRevoke {
    int64_t lease;
    std::chrono::steady_clock::time_point give_up;  // it has ended by itself then
  };
  std::vector<PendingRevoke> revoke_;  // guarded by mu_: etcd leases of removed rings
  std::set<std::string> publishing_;   // guarded by mu_: registrations publish() is at
  uint64_t ack_claims_ = 0;            // guarded by mu_: the last ack claim handed out
  std::condition_variable acks_cv_;    // with mu_: a peer's ack arrived
  std::unique_ptr<Etcd> etcd_;         // with a fabric section; built before start()'s threads
  std::thread fabric_upkeep_, entries_watch_, acks_watch_;
  std::atomic<uint64_t> fabric_pending_{0};  // written by the upkeep, read by metrics()

  std::atomic<bool> dp_up_{false};
  std::atomic<bool> resync_{false};  // set by change_call, taken by the reconciler
  DaemonCounters counters_;
  std::thread reconciler_;
  std::thread metrics_thread_;
  const std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
  std::mutex cache_mu_;
  std::shared_ptr<const MetricsCache> cache_;  // null until the first refresh
  std::thread leases_;
  std::mutex stop_mu_;
  std::condition_variable stop_cv_;
  bool stopping_ = false;
};

}  // namespace netreduce::control
