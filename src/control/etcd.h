// A client of etcd's v3 API through its HTTP/JSON gateway (etcd 3.4:
// POST /v3/kv/range, /v3/kv/txn, /v3/lease/grant, ..., /v3/watch), over
// libcurl (common/http_client.h), so the daemon needs no gRPC. Keys and
// values travel base64-encoded; revisions and lease ids as decimal strings.
//
// Deadlines: every call is bounded. One attempt at one endpoint takes at
// most `timeout_ms` (connect to last byte, libcurl's total timeout); an
// attempt that gets no answer, or a 5xx, moves on to the next endpoint, so a
// call costs at most endpoints x timeout_ms. The endpoint that last answered
// is tried first by every later call of every thread: a dripping or frozen
// member costs one attempt, not one per call. An answer from etcd is final
// (a 4xx, or etcd's error in the body: the next member would say the same).
// A watch is a stream bounded by its own window (watch()); its attempt at a
// member ends at timeout_ms unless the member has begun the stream by then.
//
// Example: the origin of ring 7 publishes leaf B's entry with the job's lease.
//   Etcd etcd(cfg);                               // endpoints, timeout_ms
//   int64_t lease = 0;
//   etcd.grant(30, lease);                        // TTL in seconds
//   std::vector<EtcdKv> held;
//   bool done = false;
//   etcd.put_if_absent({{"/netreduce/boxes/leafB/rings/7", value}}, lease, done, held);
//   // done == false: `held` lists the keys some other write holds.
//   int64_t ttl = 0;
//   etcd.keepalive(lease, ttl);                   // ttl 0: the lease is gone
//   etcd.revoke(lease);                           // every key of the lease goes
//
// Threads: every method may be called from any thread at once (an idle
// connection pool under a mutex that no call holds across the network).
// cancel() ends every call in progress (within HttpClient::kWakeMs, unless
// it is running on_events) and every later one at once (they return
// unavailable): stop() of the daemon.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"

namespace netreduce {
class HttpClient;
}

namespace netreduce::control {

struct EtcdConfig {
  std::vector<std::string> endpoints;  // "http://host:port", at least one
  int timeout_ms = 1000;               // one attempt at one endpoint
};

struct EtcdKv {
  std::string key;
  std::string value;
  int64_t create_revision = 0;
  int64_t mod_revision = 0;
  int64_t lease = 0;  // 0: none
};

struct EtcdEvent {
  bool deleted = false;        // DELETE (a removal or a lease's end); else PUT
  EtcdKv kv;                   // for a DELETE: the key and its mod_revision only
  std::optional<EtcdKv> prev;  // the key's value before the event, when etcd kept it
};

// An endpoint as Etcd takes it: http://<host>:<port>, nothing after the port.
bool etcd_endpoint_ok(const std::string& url);

class Etcd {
 public:
  // Errors (field fabric.etcd.endpoints): no endpoint, or one not
  // http://host:port; (field fabric.etcd.timeout_ms) a timeout below 1.
  static Status check(const EtcdConfig& cfg);
  explicit Etcd(EtcdConfig cfg);
  ~Etcd();
  Etcd(const Etcd&) = delete;
  Etcd& operator=(const Etcd&) = delete;

  // Every error below: code unavailable (no endpoint answered; the message
  // names each endpoint's failure), not_found where said (etcd's NOT_FOUND:
  // no such lease), or internal (an answer that is not the gateway's JSON,
  // or another etcd error, with etcd's message).

  // A new lease of `ttl_s` seconds (etcd may raise it to its minimum).
  Status grant(int64_t ttl_s, int64_t& id);
  // Renews lease `id` once. ttl: its TTL after the renewal; 0 when etcd
  // holds no such lease (expired or revoked; its keys are gone).
  Status keepalive(int64_t id, int64_t& ttl);
  // Ends lease `id` and deletes its keys. A lease already gone is success.
  Status revoke(int64_t id);

  // One transaction: if none of `kvs`' keys exists, puts them all with
  // `lease` (0: none) and sets created; else writes nothing, clears created
  // and fills `held` with the keys that exist (key, value, revisions, lease).
  // Error not_found when the lease is gone and no key exists.
  Status put_if_absent(const std::vector<std::pair<std::string, std::string>>& kvs, int64_t lease,
                       bool& created, std::vector<EtcdKv>& held);
  // Puts `key` = `value` with `lease` (0: none). Error not_found when the
  // lease is gone.
  Status put(const std::string& key, const std::string& value, int64_t lease);
  // Every key that starts with `prefix`, in key order, and the store's
  // revision they were read at.
  Status range(const std::string& prefix, std::vector<EtcdKv>& out, int64_t& revision);

  // Streams the events of keys under `prefix` from `start_revision` on (0:
  // from now), calling on_events once per batch (in revision order;
  // `revision`: the store's revision that batch was sent at), until
  // `window_ms` has passed, the stream ends, or cancel(). A member that has
  // not confirmed the watch ("created") within timeout_ms is passed over
  // for the next one, within what is left of the window; the first that
  // does streams the rest of the window. ok: the window ended with the
  // stream healthy (watch again from the last revision seen + 1). Error
  // not_found: start_revision was compacted away, or the store is behind it
  // (etcd recreated or restored): read everything again with range(). A
  // member without a leader refuses the watch. Error unavailable: no endpoint streamed, or the
  // stream ended before the window did (watch again from the last revision seen + 1). on_events
  // runs on the calling thread; it may take its time (the stream waits), and what it throws leaves
  // watch() once the stream is closed.
  Status watch(
      const std::string& prefix, int64_t start_revision, int window_ms,
      const std::function<void(const std::vector<EtcdEvent>&, int64_t revision)>& on_events);

  void cancel() noexcept { cancelled_ = true; }
  const EtcdConfig& config() const noexcept { return cfg_; }

 private:
  // One call: tries the endpoints from the preferred one on.
  Status call(const std::string& path, const std::string& body, std::string& answer);
  // The members from the preferred one on, while time_left(): attempt(i,
  // its client, why) returns the call's end, or nullopt with `why` to try
  // the next. Error unavailable ("etcd <path>: <none_did> (<each why>)")
  // when none ended it, or after cancel().
  using Attempt = std::function<std::optional<Status>(size_t, HttpClient&, std::string&)>;
  Status each_member(const std::string& path, const char* none_did,
                     const std::function<bool()>& time_left, const Attempt& attempt);
  std::unique_ptr<HttpClient> take(size_t endpoint);
  void give(size_t endpoint, std::unique_ptr<HttpClient> c);

  const EtcdConfig cfg_;
  std::atomic<size_t> preferred_{0};
  std::atomic<bool> cancelled_{false};
  std::mutex pool_mu_;  // idle clients; never held across a call
  std::vector<std::vector<std::unique_ptr<HttpClient>>> pool_;  // per endpoint
};

}  // namespace netreduce::control
