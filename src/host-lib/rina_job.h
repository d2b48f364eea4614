// Rina mode in a job (Options::rina, NETREDUCE_RINA=1): the communicators
// Rina (rina.h) runs on, made at create from what the job's bootstrap
// already knows.
//
// Theory of operation
// -------------------
// The job's communicator is made as on the ring path (it carries every
// collective but all-reduce, and the bootstrap). Its racks are its ranks'
// labels (ring_order.h: Options::rack, else the rack of the box's fabric
// that holds the rank's address), in the ring's order; a rack has a box
// when its label is a leaf of the fabric. make_rina_plan turns them into
// groups and lanes. Then one communicator per box rack (its ranks, through
// its box: the daemon's fabric installs a ring of one rack on that rack's
// leaf) and one per lane (a carrier of every group, ring path). Each has
// a bootstrap of its own: its first member listens on a port the system
// picks at the address it reaches the job's rank 0 through, one allgather
// of the job tells every member, and every rank makes its communicators
// in one global order (racks, then lanes 0..K-1), so no two ranks wait on
// each other in opposite orders.
//
// Example: racks leaf0 = {0, 1}, leaf1 = {2, 3}, and rank 4 in no rack of
// the fabric. Communicators: rack leaf0 (ranks 0, 1; rank 0 listens), rack
// leaf1 (2, 3), lane 0 (0, 2, 4; rank 0 listens), lane 1 (1, 3, 4; rank 1
// listens). Rank 4 makes lane 0, then lane 1.
//
// Every communicator's ring order is pinned to its members' order, so the
// job's NETREDUCE_RING_ORDER or NETREDUCE_RACK do not reorder a part.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "host-lib/bootstrap.h"
#include "host-lib/rina.h"
#include "host-lib/ring_order.h"

namespace netreduce::host {

// Options::rina, else NETREDUCE_RINA=1.
bool rina_mode(const Options& options);

struct RinaJob {
  RinaPlan plan;
  std::vector<std::string> labels;                   // each group's rack label ("" for none)
  std::unique_ptr<Communicator> rack;                // this rank's box rack's; else null
  std::vector<std::unique_ptr<Communicator>> lanes;  // K; null where this rank carries none
  std::unique_ptr<Rina> rina;
  ~RinaJob();  // the Rina, then the lanes in order, then the rack
  // "3 groups, 2 lanes: leaf0 (ranks 0, 1) through its box, ..."
  std::string describe() const;
};

// What the job's setup knows. rack_of: every rank's label; ring: the ranks
// in ring order; boxes: the fabric's racks (a label that is a leaf has a
// box). device, gid_index: as the job's.
struct RinaJobInput {
  unsigned rank = 0;
  std::vector<std::string> rack_of;
  std::vector<unsigned> ring;
  std::vector<FabricRack> boxes;
  std::string device;
  int gid_index = -1;
  std::string job_key;
};

// On an error `out` holds the parts made so far: the caller keeps them until
// every rank knows (their close waits for their other members).
Error make_rina_job(const RinaJobInput& in, Bootstrap& job, const Options& options,
                    Clock::time_point deadline, std::unique_ptr<RinaJob>& out);

// Communicator::create over a bootstrap already made (its rank 0 has
// accepted the others) for one of a Rina job's parts: never Rina mode
// itself, whatever NETREDUCE_RINA says. `address` names it (ring ids are
// derived from it).
Error create_on_bootstrap(unsigned rank, unsigned world, const std::string& device, int gid_index,
                          std::unique_ptr<Bootstrap> boot, const std::string& address,
                          const Options& options, std::unique_ptr<Communicator>& out);

}  // namespace netreduce::host
