// The netreduce side of each MPI communicator the application calls a
// collective on, kept as an MPI attribute of that communicator.
//
// - A CommState is made at the communicator's first intercepted call (no
//   communication) and tallies every call. Its netreduce communicator is
//   set up at the first call that netreduce serves: a collective step over
//   the MPI communicator (rendezvous.h), after which every rank has one or
//   every rank has none and the reason.
// - The attribute's delete callback (MPI_Comm_free, MPI_Finalize) prints the
//   communicator's report line (rank 0; every rank with
//   NETREDUCE_MPI_VERBOSE=1) and frees the netreduce communicator.
//   MPI_Finalize does the same for every communicator the application left
//   alive, before MPI's own finalize.
//
// Threads: the table of live states is guarded by a mutex (set-up and
// teardown only); a state itself is used by the thread that makes the
// communicator's collectives, which MPI already requires to be one at a time.
#pragma once

#include <mpi.h>

#include <memory>
#include <string>

#include "mpi/config.h"
#include "mpi/policy.h"
#include "netreduce/netreduce.hpp"

namespace netreduce::mpi {

struct CommState {
  MPI_Comm comm = MPI_COMM_NULL;
  std::string label;  // its MPI name, or "communicator #N"
  int rank = 0, size = 0, world_rank = 0;
  bool inter = false;
  bool tried = false;                // set-up attempted
  std::unique_ptr<Communicator> nr;  // after a set-up that worked on every rank
  std::string why_not;               // after one that did not
  Tally tally;
};

// The settings, read at the first call (a bad one stops the job, naming it).
const Config& config();
// The state of `comm`, made on first use.
CommState& state_of(MPI_Comm comm);
// Its netreduce communicator, set up on first use; null (the reason in
// why_not) if it cannot be.
Communicator* served_by(CommState& st);
// At MPI_Finalize: reports and frees every state still alive.
void finish_all();
// "netreduce-mpi: rank R of MPI_COMM_WORLD: " for errors and warnings.
std::string who(const CommState& st);

}  // namespace netreduce::mpi
