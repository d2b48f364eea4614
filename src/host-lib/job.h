// The verbs communicator's job plan: what its bootstrap exchanges and
// decides, as pure functions (tested without RDMA hardware).
//
// Theory of operation
// -------------------
// Every rank of the job (P ranks, global numbering) joins one bootstrap.
//   1. Rank 0 broadcasts the job header: the number of stripes R, a random
//      job nonce and the racks of the box's fabric when its daemon has one
//      ("R <nonce hex>[ <racks JSON>]", ring_order.h). The nonce names the
//      hosts' shared segments (local.h), so two jobs on one host never meet.
//   2. An allgather of every rank's locality claim (host identity, the
//      local_rank / local_size options) that resolve_locality() turns into
//      hosts, local ranks and rings: ring l = local rank l of every host, in
//      host order. Without local ranks (local_size 1) there is one ring, the
//      ranks in global order, and everything below is exactly the plain
//      communicator of before.
//   3. The QP exchange (communicator_create.cc): every rank's PeerInfo to
//      every rank; rank r connects its R lanes to its ring's successor and
//      predecessor.
//   4. Rank 0 registers the job's n x R rings (ring l R + s: local rank l's
//      ring, stripe s; members: ring l's IPs, host order) in one
//      setup_rings() call and broadcasts the decision: "I<id>,...:<reason>"
//      with n x R ids, or "R0:<reason>". Local rank l takes ids
//      [l R, l R + R).
//   5. The probe (one element per stripe on every ring) and its verdict
//      allgather run over all P ranks: one rank's failed probe sends the whole
//      job to the ring path.
//   6. With local ranks on the INA path, each ring gets a bootstrap of its
//      own, over which its members agree on a failover (failover.cc): host
//      0's local rank l listens on a port the system picks, at the address
//      it reaches rank 0 through; an allgather of the job's tells the other
//      members, which join it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "host-lib/bootstrap.h"
#include "host-lib/local.h"
#include "host-lib/ring_order.h"

namespace netreduce::host {

// Step 1: the job header.
struct JobHeader {
  unsigned stripes = 1;
  uint64_t nonce = 0;
  std::vector<FabricRack> racks;  // the box's fabric; empty: none
};
std::string encode_job_header(const JobHeader& h);
Error decode_job_header(const std::string& s, JobHeader& out);

// Step 2: one rank's claim in the bootstrap's allgather.
std::string encode_claim(const LocalityClaim& c);
Error decode_claim(const std::string& s, unsigned rank, LocalityClaim& out);

// Ring index (0 .. n R - 1) of local rank l's stripe s.
inline unsigned job_ring_index(unsigned local_rank, unsigned stripes, unsigned stripe) {
  return local_rank * stripes + stripe;
}

// How errors name a lane: "ring s" without local ranks, else
// "local rank l's ring, stripe s".
std::string lane_label(unsigned local_rank, unsigned local_size, unsigned stripe);

// Step 4: rank 0's decision, and every rank's reading of it.
struct PathDecision {
  bool ina = false;
  std::vector<uint32_t> ring_ids;  // all n x R, job order
  std::string reason;
};
std::string encode_decision(const PathDecision& d);
// `rings`: n x R expected. Error (bootstrap) on anything malformed.
Error decode_decision(const std::string& s, unsigned rings, PathDecision& out);
// Step 6: this rank's ring's own bootstrap (`job`: the job's; every rank
// calls it, all at once).
Error ring_bootstrap(Bootstrap& job, const Locality& loc, const std::string& job_key,
                     Clock::time_point deadline, std::unique_ptr<Bootstrap>& out);

// Local rank l's R ids out of the job's.
std::vector<uint32_t> my_ring_ids(const std::vector<uint32_t>& job, unsigned local_rank,
                                  unsigned stripes);

}  // namespace netreduce::host
