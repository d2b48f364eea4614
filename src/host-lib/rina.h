// Rina mode (ICNP '24): an all-reduce for a job whose racks do not all have
// a box. A rack with a box and m >= 2 ranks is one group: its ranks reduce
// through their box first, so each holds the rack's sum; every other rank
// is a group of its own. A ring all-reduce then runs across the G groups,
// each group represented by its members in parallel: the tensor is cut into
// K lanes (K = the largest box rack's m), lane j carried in group g by its
// member j mod m_g, each lane its own ring across the groups. Last, each box
// rack spreads its members' lanes through its box (an all-gather: an int32
// sum of raw bits, zeros outside a member's lanes, bit-exact).
//
// Example: racks [3 with a box, 2 with a box, 1 without], ranks 0-2, 3-4, 5.
// Groups {0,1,2}, {3,4}, {5}: G = 3, K = 3 lanes. Lane 0 runs on ranks 0, 3
// and 5; lane 1 on 1, 4 and 5; lane 2 on 2, 3 and 5. Dependent steps: the
// rack's pass, 2(G - 1) = 4 ring steps, the spread's pass: 6, where the flat
// ring of 6 ranks takes 10.
//
// Order rule (every dtype, bit-exact): element e of lane j is
//   ring(lane j over the groups' values), a group's value its rack's sum in
//   rank order (the box's order; a rank alone: its input),
// where ring() is the ring path's order over the G groups in group order
// (docs/host-library.md#the-two-paths: chunk c folded from group c round to
// c - 1). For integers and min/max that equals the flat rank-order result.
// op avg: the sum, then each element divided by the world.
//
// A rack whose box fails: its communicator finishes the call on the rack's
// ring (failover, collective.h) and runs the rack's stages there until its
// box answers again (failback); the lanes and the other racks do not
// change. The rack's sum then follows the ring's order inside the rack.
//
// Threads: one caller at a time; the lanes' calls run concurrently on
// their communicators' progress threads.
#pragma once

#include <memory>
#include <vector>

#include "netreduce/netreduce.hpp"

namespace netreduce::host {

struct RinaRack {
  std::vector<unsigned> ranks;  // the job's ranks in the rack, in its ring order
  bool box = false;
};

// Who does what, for every rank alike.
struct RinaPlan {
  std::vector<std::vector<unsigned>> groups;  // ranks per group, group order
  unsigned lanes = 1;                         // K
  unsigned world = 0;
  // The group of each rank and its index in it.
  std::vector<unsigned> group_of, member_of;
  // The rank that carries lane j in group g.
  unsigned carrier(unsigned g, unsigned j) const { return groups[g][j % groups[g].size()]; }
};

// The plan of racks (ring order): every rank 0..world-1 in exactly one rack,
// at least one rank per rack. invalid_argument otherwise.
Error make_rina_plan(const std::vector<RinaRack>& racks, RinaPlan& out);

class Rina {
 public:
  // rank: this rank. rack: its rack's communicator (world m, rank its index
  // in the rack) when its group has m >= 2 ranks, else null. lanes: K
  // entries, lane j's communicator (world G, rank this rank's group) where
  // this rank carries lane j, else null. The communicators stay the
  // caller's and must outlive this.
  static Error create(const RinaPlan& plan, unsigned rank, Communicator* rack,
                      std::vector<Communicator*> lanes, std::unique_ptr<Rina>& out);

  // recv may equal send. timeout_ms bounds the whole call (< 0: each stage
  // its communicator's op_timeout_ms). An error on one member of a box rack
  // (a lane that failed) reaches every member of the rack: the spread
  // counts the members whose lanes succeeded.
  Error allreduce(const void* send, void* recv, size_t count, DataType t, Op op,
                  int timeout_ms = -1);

  // The rack stage's path now (ina, or ring after its box failed); ina for
  // a rank alone in its group.
  Path rack_path() const;

 private:
  Rina(const RinaPlan& plan, unsigned rank, Communicator* rack, std::vector<Communicator*> lanes);
  Error spread(uint8_t* out, size_t count, DataType t, bool lanes_ok, unsigned& ok_members,
               int timeout_ms);
  RinaPlan plan_;
  unsigned member_;  // this rank's index in its group
  Communicator* rack_;
  std::vector<Communicator*> lanes_;
  std::vector<uint8_t> scratch_;  // the spread's words
};

}  // namespace netreduce::host
