// Parallel NetReduce (paper section 3.4, docs/design.md#parallel-rings): n local ranks
// on one host (processes, or threads) share one all-reduce.
//
// Theory of operation
// -------------------
// Locality. A job of P ranks runs on H hosts with n = local_size ranks each
// (every host the same n). A rank's host is its host identity (Options::host_id,
// else NETREDUCE_HOST_ID, else /proc/sys/kernel/random/boot_id + hostname):
// the ranks with one identity are one host. Hosts are numbered by their
// lowest global rank. Local ranks are given (Options::local_rank, every rank
// of the host, 0..n-1 once each) or, when none is given, numbered in global
// rank order. resolve_locality() checks and numbers every rank's claim (the
// verbs communicator's bootstrap allgather, job.h; the loopback fabric
// numbers ranks itself).
//
// Rings. Local rank l of every host forms ring l (H members, host order):
// its own QPs and, with the box, its own ring id (R stripes: rings l R ..
// l R + R - 1 of the job, ids in that order). Ring l is an ordinary
// Collective (collective.h) whose rank is the host index and whose world is H.
//
// One call, on every local rank, chunk by chunk (chunks of at most
// chunk_bytes of the tensor, element-aligned, the same on every rank; one
// empty round for count 0). Each rank first writes its call (count, dtype,
// op) into its header entry; after the first barrier A every rank compares
// them, so local ranks that disagree fail at once, naming each other.
//   1. copy the chunk into my input slot of the segment;      barrier A
//   2. shard l of the chunk (plan.h's stripe rule with n shards: shard l
//      holds c / n elements plus one if l < c % n) is folded over the n input
//      slots in local-rank order into the segment's result area;
//   3. ring l all-reduces that shard in place across the hosts (INA path
//      through the box, or the ring fallback);               barrier B
//   4. copy the whole result area out.
// Nobody writes an input slot before barrier A of the next chunk, which
// every rank reaches only after its reads of step 2; nobody writes the
// result area before that either, and every rank has copied it out by then.
//
// Bit-exact rule (INA path): for each element,
//     result = box_fold over hosts in ring order (host 0, 1, ..., H - 1) of
//              local_fold over local ranks in local order (0, 1, ..., n - 1),
// each fold being reduce.h's (in order; fp16/bf16 widened, rounded once per
// fold). Chunking and striping do not change it. The ring fallback folds
// across hosts in the ring's chunk order (collective.h), as it does without
// local ranks.
//
// Segment. One POSIX shm segment per communicator and host, named from the
// job (a nonce rank 0 chose) and the host index. Local rank 0 creates it
// (O_EXCL), sizes and allocates it (posix_fallocate: a full /dev/shm is an
// error at creation, not a SIGBUS later), initialises the header and publishes the magic last;
// the others open it (retrying every millisecond until the deadline). Every
// rank then waits at the first barrier, after which everybody unlinks the
// name (ENOENT is fine): from then on a crash leaks nothing. Errors and
// destruction unlink as well.
//
// Signalling. Barriers are counters in the header: each local rank stores the
// number of the barrier it reached (arrived[l], written by local rank l only,
// read by all), then bumps `bell` and FUTEX_WAKEs it; a waiter sleeps in
// FUTEX_WAIT on `bell` (shared, not private: other processes map it) until
// every arrived[j] reaches its barrier. No spinning. A rank that fails posts
// `failed` = local rank + 1 and a message and rings the bell, so the others
// fail at once with its reason; a rank that never comes is named when the
// deadline passes. After any error the group refuses further calls.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "host-lib/collective.h"
#include "host-lib/transport.h"

namespace netreduce::host {

// Local ranks per host, at most (each costs the segment one chunk).
inline constexpr unsigned kMaxLocalRanks = 16;

// What one rank says about itself in the bootstrap's allgather.
struct LocalityClaim {
  std::string host_id;
  int local_rank = -1;  // -1: discover
  int local_size = -1;  // -1: discover
};

struct Locality {
  unsigned local_rank = 0, local_size = 1;
  unsigned host = 0, hosts = 1;  // host index (by lowest global rank), host count
  std::vector<unsigned> ring;    // global ranks of my ring (local rank l of each host), host order
  std::vector<std::vector<unsigned>> rings;  // rings[l]: ring l's global ranks, host order
};

// Numbers hosts and local ranks from every rank's claim (index = global
// rank) and checks them: every host the same number of ranks (else an error
// naming each host and its ranks), explicit local_size equal to it, explicit
// local ranks 0..n-1 once each on every host that gives them (all of a
// host's ranks, or none).
Error resolve_locality(const std::vector<LocalityClaim>& all, unsigned rank, Locality& out);

// options.host_id, else NETREDUCE_HOST_ID, else boot_id + "/" + hostname.
std::string host_identity(const Options& options);

// Checks Options::local_rank / local_size as given (-1 or in range).
Error check_local_options(const Options& options);

class LocalGroup {
 public:
  // Collective: every local rank of the host calls it with the same name,
  // local_size and chunk_bytes; returns once all have mapped the segment, or
  // a timeout naming who did not come.
  static Error create(const std::string& name, unsigned local_rank, unsigned local_size,
                      unsigned host, size_t chunk_bytes, Clock::time_point deadline,
                      std::unique_ptr<LocalGroup>& out);
  ~LocalGroup();
  LocalGroup(const LocalGroup&) = delete;
  LocalGroup& operator=(const LocalGroup&) = delete;

  // The parallel all-reduce (see the top of this file); `ring` is this local
  // rank's ring across the hosts.
  Error allreduce(Collective& ring, const void* send, void* recv, size_t count, DataType t, Op op,
                  Clock::time_point deadline);

  unsigned local_rank() const noexcept { return l_; }
  unsigned local_size() const noexcept { return n_; }
  const std::string& name() const noexcept { return name_; }
  size_t chunk_bytes() const noexcept { return chunk_; }

  struct Header;

 private:
  LocalGroup(std::string name, unsigned l, unsigned n, unsigned host, size_t chunk)
      : name_(std::move(name)), l_(l), n_(n), host_(host), chunk_(chunk) {}
  Error barrier(const char* what, Clock::time_point deadline);
  Error fail(Error e, bool tell_peers);
  uint8_t* slot(unsigned j) const noexcept;
  uint8_t* result() const noexcept;
  std::string who() const;

  std::string name_;
  unsigned l_, n_, host_;
  size_t chunk_;
  void* base_ = nullptr;
  size_t bytes_ = 0;
  Header* h_ = nullptr;
  uint64_t barriers_ = 0;  // barriers passed (all local ranks count alike)
  Error failed_{};
};

// The segment's name for a job nonce and a host: "/netreduce-<nonce>-<host>".
std::string local_segment_name(uint64_t nonce, unsigned host);

}  // namespace netreduce::host
