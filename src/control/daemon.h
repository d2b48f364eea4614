// netreduced's core, independent of HTTP: the ring table (the source of
// truth, persisted through StateFile), quotas, and the reconciler that makes
// the data plane's rings equal to it.
//
// Locking: `mu_` guards `rings_` and the state file. Every mutation is made
// under it in the order validate -> persist -> push to the data plane, and
// the reconciler holds it for a whole pass, so a pass never races an API call.
// Data plane calls under the lock are bounded by the client's deadline.
//
// Metrics: a thread that every `metrics.refresh_interval_ms` takes the data
// plane's status, stats and rings into `cache_` (a shared_ptr swapped under
// `cache_mu_`, held only to copy the pointer). metrics() renders from it and
// never calls the data plane or waits for `mu_` (it takes `mu_` only when it
// is free, else uses the cached ring counts), and health() reads atomics
// only: neither queues behind a slow data plane. The other API calls do call
// it; the HTTP front end bounds how many run at once.
//
// Reconciler: a thread that every `reconcile_interval_ms` asks the data plane
// for its status. When the connection was (re)made since the last pass, when
// the data plane's "instance" (pid and start time) changed, or when the last
// pass did not finish, it reconciles: lists the data plane's rings, removes
// those the state does not have (or has with another spec) and installs the
// missing ones. "Installed with the identical spec" counts as done. So a
// restarted data plane gets every ring back with no operator action, and a
// restarted daemon pushes what it persisted.
//
// Ownership: a ring belongs to the job that created it. POST of a new id
// issues a credential (128 random bits from getrandom, 32 hex digits), kept
// in the state file and returned once in the 201 reply. Whoever presents it
// (header X-Netreduce-Ring-Credential, compared in constant time) may
// re-POST the same spec (200, idempotent), renew the ring's lease and delete
// it. Everyone else gets 409 on a POST of that id (the reply never reveals
// the credential) and 403 on DELETE or renewal, except the operator token,
// which may delete and renew any ring without a credential. A request that
// presents a credential is held to it whatever its token: a wrong one is 403,
// so a job can never remove a ring that another job registered under the id
// it once had. With auth.job_token_file, jobs use that token: it may create
// rings and delete or renew only those whose credential it presents.
//
// Leases: a POST may carry "lease_ms" (kMinLeaseMs..quotas.max_lease_ms).
// The lease thread removes a leased ring not renewed (PUT
// /v1/rings/{id}/lease, or an idempotent re-POST) within lease_ms: from the
// state (persisted), then from the data plane; it is logged and counted
// (netreduce_rings_expired_total). Rings without a lease never expire. The
// deadlines live in memory only: after a restart every lease gets a fresh
// full period, so a daemon that was down never expires a ring for it.
//
// Fabric (config `fabric:`, control/fabric.h): the daemon a ring is POSTed
// to is its origin. It computes every involved box's entry, persists the
// ring with all of them (RingRecord::peers), installs its own (if it holds a
// part) through the reconciler like any ring, and pushes each other entry to
// that box's daemon (POST /v1/fabric/rings, the fabric token). A peer
// persists the entry (RingRecord::origin) and reconciles it like any ring,
// so a restarted box or daemon gets it back by itself. Pushing is the
// `fabric_` thread's job (every 100 ms, and once at the end of a POST or
// DELETE): it takes what is due under `mu_`, calls the peers holding only
// `push_mu_` (never `mu_`, so two daemons pushing to each other cannot
// deadlock), then records the outcome under `mu_`. Due: an entry not yet
// accepted (retried at most once a second; a restarted origin pushes every
// entry once more, the push is idempotent), and for a leased ring every
// lease/3: the push renews the peer's copy of the lease, so a peer drops the
// entry by itself when the origin stops renewing it (origin gone, ring
// deleted or expired there). DELETE and lease expiry at the origin queue a
// removal per peer (`deletes_`, persisted with the rings) sent until the
// peer answers 204 or 404; the removal names the registration (`entry`), so
// it never removes a newer ring of the same id.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>

#include "common/dataplane_protocol.h"
#include "common/status.h"
#include "control/config.h"
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

// Constant-time comparison: the time taken depends only on the lengths, not
// on where the contents differ. An empty `want` never matches.
bool same_secret(const std::string& given, const std::string& want) noexcept;

struct DaemonCounters {
  std::atomic<uint64_t> reconciles{0};            // completed reconcile passes
  std::atomic<uint64_t> reconcile_failures{0};    // passes that failed (retried next interval)
  std::atomic<uint64_t> rings_pushed{0};          // install_ring sent by the reconciler
  std::atomic<uint64_t> rings_pruned{0};          // remove_ring sent by the reconciler
  std::atomic<uint64_t> restarts_seen{0};         // data plane instance changes observed
  std::atomic<uint64_t> rings_expired{0};         // leased rings removed for want of renewal
  std::atomic<uint64_t> fabric_pushes{0};         // entries a peer accepted (origin)
  std::atomic<uint64_t> fabric_push_failures{0};  // pushes and removals that failed (retried)
  std::atomic<uint64_t> fabric_removals{0};       // removals a peer confirmed (origin)
};

class Daemon {
 public:
  explicit Daemon(DaemonConfig cfg);
  ~Daemon();

  // Locks the state file (error: another netreduced holds it, named by pid),
  // loads the persisted state (error: unreadable state file) and starts the
  // reconciler and the metrics thread.
  Status start();
  void stop();

  // body: ring JSON (common/ring_json.h) plus optional "lease_ms".
  Reply create_ring(const nlohmann::json& body, const RingAuth& auth = {});
  Reply delete_ring(uint32_t id, const RingAuth& auth = {});
  Reply renew_lease(uint32_t id, const RingAuth& auth);
  // Fabric peers' calls (fabric token): an origin's entry for this box
  // ({"origin", "entry", "lease_ms", "ring": ring JSON + "tree"}; the same
  // entry again renews it), and its removal (only if `entry` matches).
  Reply fabric_put(const nlohmann::json& body);
  Reply fabric_delete(uint32_t id, const std::string& entry);
  // The bearer token for calls to peer daemons (fabric.token_file); before start().
  void set_fabric_token(std::string token) { fabric_token_ = std::move(token); }
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
    std::chrono::steady_clock::time_point taken;
  };

  // create_ring's work under mu_ (the pushes to peers come after it).
  Reply create_ring_here(const nlohmann::json& body, const RingAuth& auth);
  void fabric_main();
  // One push pass over what is due (see the top); true if anything was done.
  // `only`: that ring's tasks alone (a POST's own push, so a slow peer of
  // other rings does not hold its reply). A box whose daemon cannot be
  // reached is skipped for the rest of the pass (each try may wait out a
  // connect timeout), so one dead peer does not starve the others' renewals.
  bool push_pass(std::optional<uint32_t> only = std::nullopt);
  Status save_locked() { return state_.save(rings_, deletes_); }
  // Queues the removal of a fabric ring from its peers (origin).
  void queue_removals_locked(uint32_t id, const RingRecord& rec);
  nlohmann::json fabric_view_locked(const RingRecord& rec) const;
  void reconciler_main();
  void metrics_main();
  void refresh_metrics();
  void lease_main();
  // Checks that `auth` may delete or renew `rec` (nullopt: allowed).
  std::optional<Reply> check_owner(uint32_t id, const RingRecord& rec, const RingAuth& auth,
                                   const char* what) const;
  nlohmann::json ring_reply_locked(const RingRecord& rec) const;
  Status reconcile_locked();
  uint64_t memory_locked() const;

  const DaemonConfig cfg_;
  StateFile state_;
  DataplaneClient dp_;

  std::mutex mu_;
  RingMap rings_;
  std::vector<FabricDelete> deletes_;  // guarded by mu_; persisted with rings_
  std::mutex push_mu_;                 // one push pass at a time (never held with mu_ waiting)
  std::thread fabric_;
  std::string fabric_token_;                 // written before start(), read-only after
  std::atomic<uint64_t> fabric_pending_{0};  // written by push_pass, read by metrics()

  std::atomic<bool> dp_up_{false};
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
