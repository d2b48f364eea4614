// netreduce's set-up over an MPI communicator (netreduce.hpp Rendezvous),
// made safe against a rank that fails part-way.
//
// Communicator::create exchanges a few blobs between the ranks; here each
// exchange is one round of two MPI collectives on the communicator:
// PMPI_Allgather of every rank's {kind, length}, then PMPI_Allgatherv of the
// bytes. A rank whose create failed does not just leave (the others would
// wait in an MPI collective it never calls): it settles, taking part in
// rounds with the kind "failed" and its reason until every rank has given a
// verdict. A rank still inside create that sees a verdict in its round fails
// its own create with "rank R left the set-up" and settles too. So every rank
// makes the same MPI calls, and every rank learns the same outcome.
// Example, 3 ranks, rank 2 without an RDMA device: rank 2 fails before its
// first exchange and settles with "failed: no RDMA device"; ranks 0 and 1
// are in their first exchange: that round (kinds blob, blob, failed) fails
// their creates, and the next round (failed, failed, failed) ends it. Every
// rank's settle returns "rank 2: no RDMA device".
#pragma once

#include <mpi.h>

#include <string>
#include <vector>

#include "netreduce/netreduce.hpp"

namespace netreduce::mpi {

class MpiRendezvous {
 public:
  explicit MpiRendezvous(MPI_Comm comm);
  // Rendezvous::allgather: one round of blobs; an error once a rank left.
  Error allgather(const std::string& mine, std::vector<std::string>& all);
  // After create, with its result: rounds until every rank gave a verdict.
  // Empty when every rank succeeded; otherwise the first root failure
  // ("rank R: why"), rather than a rank that only saw another leave.
  std::string settle(const Error& mine);

 private:
  enum Kind : int { blob = 0, done = 1, failed = 2, left = 3 };
  void round(Kind k, const std::string& bytes, std::vector<int>& kinds,
             std::vector<std::string>& all);
  MPI_Comm comm_;
  int size_ = 0;
  bool others_left_ = false;
};

}  // namespace netreduce::mpi
