// Parallel NetReduce (paper section 3.4, docs/design.md#parallel-rings): n
// local ranks on one host (processes or threads) share one all-reduce.
// Using it: docs/host-library.md#local-ranks-parallel-netreduce.
//
// Example: P = 4 ranks on H = 2 hosts, n = 2 local ranks each. Local rank 0
// of both hosts forms ring 0 (H members, host order), local rank 1 ring 1:
// each an ordinary Collective (collective.h) with its own QPs and ring id.
// One call on a chunk of 7 elements, on every local rank l:
//  1. copy the chunk into input slot l of the shm segment;      barrier A
//  2. fold shard l (shard 0: elements 0-3, shard 1: 4-6; plan.h's stripe
//     rule) over the n input slots, in local-rank order, into the result
//     area;
//  3. ring l all-reduces shard l in place across the hosts;     barrier B
//  4. copy the whole result area out.
// On the INA path each element is the box's fold over hosts (ring order) of
// the local folds (local-rank order), whatever the chunking and striping.
// Hosts: the ranks sharing a host identity (Options::host_id, else
// NETREDUCE_HOST_ID, else boot_id + hostname), numbered by their lowest
// global rank; resolve_locality() checks every rank's claim.
//
// Contracts (one POSIX shm segment per communicator and host):
// - Local rank 0 creates it (O_EXCL, posix_fallocate), initialises the
//   header and stores the magic last; the others open it, retrying every
//   millisecond until the deadline. After the first barrier all unlink it.
// - Local rank l alone writes input slot l, shard l of the result area and
//   arrived[l]; every rank reads them. Nobody writes a slot or the result
//   area before barrier A of the next chunk, reached only after all reads.
// - A barrier: store arrived[l], bump `bell`, FUTEX_WAKE (a shared futex);
//   a waiter sleeps in FUTEX_WAIT on `bell` until every arrived[j] is there.
// - A failing rank posts `failed` = l + 1 and its message and rings the
//   bell: the others fail at once with its reason, and refuse later calls.
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
  int local_rank = -1;     // -1: discover
  int local_size = -1;     // -1: discover
  std::string rack;        // Options::rack as resolved ("": none)
  std::string ring_order;  // Options::ring_order as resolved (rank 0's counts)
};

struct Locality {
  unsigned local_rank = 0, local_size = 1;
  unsigned host = 0, hosts = 1;  // host index (its place in the ring), host count
  bool rank_order = true;        // hosts in the order of their lowest rank
  std::vector<unsigned> ring;    // global ranks of my ring (local rank l of each host), host order
  std::vector<std::vector<unsigned>> rings;  // rings[l]: ring l's global ranks, host order
};

// Numbers hosts and local ranks from every rank's claim (index = global
// rank) and checks them: every host the same number of ranks (else an error
// naming each host and its ranks), explicit local_size equal to it, explicit
// local ranks 0..n-1 once each on every host that gives them (all of a
// host's ranks, or none). Hosts are numbered in ring order (ring_order.h).
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
  // rank's ring across the hosts, its stage the ring algorithm when
  // `on_ring` (a call on the ring path while the ring's path is INA).
  Error allreduce(Collective& ring, const void* send, void* recv, size_t count, DataType t, Op op,
                  Clock::time_point deadline, bool on_ring = false);

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
