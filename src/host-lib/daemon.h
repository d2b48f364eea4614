// Registration of a job's ring with the control daemon (src/control, API in
// docs/api.md#post-v1rings), done by rank 0.
//
// register_ring: POST /v1/rings with the ring JSON of common/ring_json.h
// (plus "lease_ms"), bearer token; then GET /v1/rings/{id} until it reports
// "installed": true (the data plane has it), within the deadline. It never
// deletes a ring it did not create: no DELETE before the POST. The daemon
// answers a new id with the ring's credential (OwnedRing keeps it), and an id
// another job holds with 409:
//   - a derived id (Options::ring_id 0): up to kIdAttempts fresh ids, each
//     derived with a new random nonce, so a job never takes over (nor waits
//     for) another job's ring, nor the leftover of its own earlier run;
//   - an explicit Options::ring_id: the ring path, with the daemon's reason.
// Anything else (no daemon configured, no answer, a non-2xx answer, never
// installed) also means the ring path, and `reason` says which. A ring the
// daemon accepted but did not install in time is deleted again (with its
// credential) before the ring path is taken.
//
// OwnedRing: what rank 0 holds for the communicator's lifetime. With a lease
// it renews it (PUT /v1/rings/{id}/lease with the credential) every
// lease_ms / 3 on its own thread; a failure is written to stderr once and
// never reaches a collective. release() (also from the destructor) stops the
// renewals and DELETEs the ring with its credential, so the job removes
// exactly its own ring; a job that dies without it leaves a ring the daemon
// removes when the lease runs out.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/ring.h"
#include "host-lib/ring_order.h"
#include "netreduce/netreduce.hpp"

namespace netreduce::host {

struct DaemonTarget {
  std::string url;    // "http://host:port"; empty = no box configured
  std::string token;  // may be empty
  std::string error;  // a problem finding the token (reported as the reason)
};

// Options first, then NETREDUCE_DAEMON, NETREDUCE_TOKEN, NETREDUCE_TOKEN_FILE.
DaemonTarget daemon_target(const Options& options);

// The header the ring's credential travels in (control/daemon.h).
inline constexpr const char* kCredentialHeader = "X-Netreduce-Ring-Credential";
// Ids tried for a derived ring id before the ring path is taken.
inline constexpr int kIdAttempts = 3;

// A derived ring id in 1..2^31-1: FNV-1a over the bootstrap address, the
// members and a per-run random nonce (random_nonce()), so two communicators
// of one job, and a relaunch of the same job, get different ids.
uint32_t derive_ring_id(const std::string& bootstrap, const std::vector<uint32_t>& members,
                        uint64_t nonce);
uint64_t random_nonce();

struct Registration {
  bool installed = false;
  std::string reason;
  uint32_t ring_id = 0;    // the id registered (or the last one tried)
  std::string credential;  // the daemon's credential for it (installed only)
  uint32_t lease_ms = 0;
  std::vector<uint32_t> ring_ids;  // setup_rings, installed: every ring's id, in ring order
};

// spec.ring_id is the first id tried. fresh_id empty: an explicit id (one
// attempt); otherwise it gives the next id to try after a 409. timeout_ms
// bounds the whole registration, whatever the daemon does (a daemon that
// answers a byte at a time included); removing a ring that was accepted but
// not installed in time has a budget of its own.
Registration register_ring(const DaemonTarget& target, engine::RingSpec spec, int timeout_ms,
                           uint32_t lease_ms = 0, const std::function<uint32_t()>& fresh_id = {});

class OwnedRing;

// Rank 0's registration for Communicator::create: the spec's members and
// sizes are given, the id is Options::ring_id or derived (bootstrap,
// members, a random nonce; fresh ones after a 409), POSTed with
// Options::lease_ms. When installed, `owned` holds the ring (renewals,
// DELETE at the end).
Registration setup_ring(const Options& options, const std::string& bootstrap, engine::RingSpec spec,
                        std::unique_ptr<OwnedRing>& owned);

// Rank 0's registration of a striped communicator's `rings` rings, all with
// the same spec: ring i as setup_ring with id Options::ring_id + i when that
// is given, else derived (fresh per ring). All or nothing: when ring i is not
// installed, the rings before it are released (deleted) and the reason
// names ring i; `owned` is then empty. rings = 1 is setup_ring exactly.
Registration setup_rings(const Options& options, const std::string& bootstrap,
                         const engine::RingSpec& spec, unsigned rings,
                         std::vector<std::unique_ptr<OwnedRing>>& owned);

// Parallel NetReduce: the job's rings for local ranks 0..n-1 (specs[l]: ring
// l's members, the IPs of local rank l of every host, in host order), each
// striped `stripes` ways: n x stripes rings, ring l stripes + s with spec
// specs[l] and id Options::ring_id + l stripes + s when that is given. One
// call for the whole job, all or nothing as above; a refusal names the
// local rank's ring and the stripe. One spec is the overload above.
Registration setup_rings(const Options& options, const std::string& bootstrap,
                         const std::vector<engine::RingSpec>& specs, unsigned stripes,
                         std::vector<std::unique_ptr<OwnedRing>>& owned);

// The same with one spec per ring (ring g = local rank g / stripes's ring,
// stripe g % stripes): what the verbs communicator registers, since each
// ring names its own QPs (RingSpec::qpns: the box spreads a job's rings over
// its workers by them). The overloads above expand to it.
Registration setup_job_rings(const Options& options, const std::string& bootstrap,
                             const std::vector<engine::RingSpec>& per_ring, unsigned stripes,
                             std::vector<std::unique_ptr<OwnedRing>>& owned);

// What GET /v1/status tells a job. workers: the box's worker count (the
// length of dataplane.workers), Options::rings 0's value (the box spreads a
// job's rings over its workers by their QPs); 0, with `why`, when the daemon
// does not answer or reports no workers (data plane down). racks: the
// fabric's racks ("fabric"."racks", ring_order.h), empty without a fabric
// or when they do not parse.
struct BoxOutline {
  unsigned workers = 0;
  std::vector<FabricRack> racks;
};
BoxOutline box_outline(const DaemonTarget& target, int timeout_ms, std::string& why);

// Why the box behind the daemon cannot carry a job's INA path, or empty
// when it can: it must seal every result (capability "result_digest" in
// GET /v1/status, docs/design.md#result-digests) and keep a removed ring's
// connections retired (dataplane.retire_grace_ms) longer than the job's RC
// retransmission budget, 7 x 4.096 us x 2^qp_timeout, so that no resend of
// an ended job can enter a new ring on the same QP numbers. A daemon that
// does not answer is a reason too.
std::string box_unfit(const DaemonTarget& target, int timeout_ms, uint8_t qp_timeout);

// Why the rings are not ready for INA traffic, or empty when the daemon
// lists every one as installed (GET /v1/rings/{id}): asked before a
// communicator that failed over tries the box again (a ring gone from the
// box would drop the probe until the QPs' retry limit).
std::string rings_not_ready(const DaemonTarget& target, const std::vector<uint32_t>& ids,
                            int timeout_ms);

class OwnedRing {
 public:
  // Starts the renewal thread when lease_ms > 0. timeout_ms bounds each call
  // (the whole exchange, not each read).
  // delete_at_release false: release() only stops the renewals.
  OwnedRing(DaemonTarget target, uint32_t ring_id, std::string credential, uint32_t lease_ms,
            int timeout_ms, bool delete_at_release = true);
  ~OwnedRing();
  OwnedRing(const OwnedRing&) = delete;
  OwnedRing& operator=(const OwnedRing&) = delete;

  // Stops renewing and DELETEs the ring with its credential; once. The
  // outcome ("deleted", "kept", or why not) is returned and kept in
  // released(). `rollback`: delete even when delete_at_release is false (a
  // ring the communicator will never use: a partial registration, a failed
  // probe), so it does not stay on the box until its lease ends, or forever.
  std::string release(bool rollback = false);

  uint32_t ring_id() const noexcept { return ring_id_; }
  uint64_t renewals() const noexcept { return renewals_.load(); }  // successful renewals
  std::string released() const;

 private:
  void renew_main();

  const DaemonTarget target_;
  const uint32_t ring_id_;
  const std::string credential_;
  const uint32_t lease_ms_;
  const int timeout_ms_;
  const bool delete_at_release_;
  std::atomic<uint64_t> renewals_{0};
  mutable std::mutex mu_;  // guards stop_, released_
  std::condition_variable cv_;
  bool stop_ = false;
  std::string released_;
  std::thread thread_;  // written by the constructor, joined by release()
};

}  // namespace netreduce::host
