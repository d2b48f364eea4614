// netreduce's exchanges over an MPI communicator (netreduce.hpp
// Rendezvous): the set-up's, and later each failover's and the closing one.
//
// They run on a duplicate of the application's communicator, made at
// construction (a collective call), so they never pair with one of the
// application's collectives. Each exchange is one round of two
// non-blocking collectives, polled until its deadline: PMPI_Iallgather of
// every rank's {kind, length}, then PMPI_Iallgatherv of the bytes. A round
// past its deadline is a timeout error that names no rank (MPI cannot say
// who is missing), and the rendezvous is then broken: every later round
// fails at once, and neither the duplicate nor the round's buffers are ever
// freed (a collective may still be pending on them).
//
// Set-up. A rank whose create failed does not just leave (the others would
// wait in a round it never joins): it settles, taking part in rounds with
// the kind "failed" and its reason until every rank has given a verdict. A
// rank still inside create that sees a verdict in its round fails its own
// create with "rank R left the set-up" and settles too. So every rank learns
// the same outcome; after a failed one no round is made any more (a rank's
// closing exchange, in the destructor of the communicator it made, fails at
// once instead of waiting for ranks that have none).
// Example, 3 ranks, rank 2 without an RDMA device: rank 2 fails before its
// first exchange and settles with "failed: no RDMA device"; ranks 0 and 1
// are in their first exchange: that round (kinds blob, blob, failed) fails
// their creates, and the next round (failed, left, left) ends it. Every
// rank's settle returns "rank 2: no RDMA device".
#pragma once

#include <mpi.h>

#include <chrono>
#include <string>
#include <vector>

#include "netreduce/netreduce.hpp"

namespace netreduce::mpi {

class MpiRendezvous {
 public:
  using Deadline = std::chrono::steady_clock::time_point;
  explicit MpiRendezvous(MPI_Comm comm);  // collective: duplicates comm
  ~MpiRendezvous();
  MpiRendezvous(const MpiRendezvous&) = delete;
  MpiRendezvous& operator=(const MpiRendezvous&) = delete;

  // Rendezvous::allgather: one round of blobs.
  Error allgather(const std::string& mine, std::vector<std::string>& all, Deadline deadline);
  // After create, with its result: rounds until every rank gave a verdict.
  // Empty when every rank succeeded; otherwise the first root failure
  // ("rank R: why"), rather than a rank that only saw another leave.
  std::string settle(const Error& mine, Deadline deadline);

 private:
  enum Kind : int { blob = 0, done = 1, failed = 2, left = 3 };
  struct Round;
  bool round(Kind k, const std::string& bytes, std::vector<int>& kinds,
             std::vector<std::string>& all, Deadline deadline);
  bool wait(MPI_Request& req, Deadline deadline);
  MPI_Comm comm_ = MPI_COMM_NULL;
  int size_ = 0;
  bool others_left_ = false;  // a round saw a verdict: create is over
  bool closed_ = false;       // settled on a failure
  bool broken_ = false;       // a round passed its deadline
};

}  // namespace netreduce::mpi
