// The netreduce side of each MPI communicator the application calls a
// collective on, kept as an MPI attribute of that communicator.
//
// - A CommState is made at the communicator's first intercepted call (no
//   communication) and tallies every call. Its netreduce communicator is
//   set up at the first call that netreduce serves: a collective step over
//   the MPI communicator (rendezvous.h), after which every rank has one or
//   every rank has none and the reason.
// - The netreduce communicator keeps using the MPI communicator after its
//   set-up (netreduce.hpp Rendezvous: a failover's exchange, the closing
//   exchange), so it is freed while the MPI communicator still works, outside
//   any MPI call: in MPI_Comm_free before PMPI_Comm_free, and at MPI_Finalize
//   for every communicator still alive (in the order their set-ups ran: a
//   collective step, so the same order on every rank), before MPI's own
//   finalize. Each prints its report line then (rank 0; every rank with
//   NETREDUCE_MPI_VERBOSE=1). The attribute's delete callback does the same
//   for a communicator MPI frees some other way.
// - The interposer asks MPI for MPI_THREAD_MULTIPLE: a failover's exchange
//   runs on netreduce's progress thread, on the rendezvous's own duplicate of
//   the communicator (rendezvous.h), while the application's thread may be
//   inside MPI. Without that level no communicator is set up.
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
#include "mpi/rendezvous.h"
#include "netreduce/netreduce.hpp"

namespace netreduce::mpi {

struct CommState {
  MPI_Comm comm = MPI_COMM_NULL;
  std::string label;  // its MPI name, or "communicator #N"
  int rank = 0, size = 0, world_rank = 0;
  bool inter = false;
  unsigned seq = 0;    // the order of the set-ups that worked (teardown at MPI_Finalize)
  bool tried = false;  // set-up attempted
  std::unique_ptr<MpiRendezvous> rendezvous;  // outlives nr, which uses it
  std::unique_ptr<Communicator> nr;           // after a set-up that worked on every rank
  std::string why_not;                        // after one that did not
  Tally tally;
};

// The settings, read at the first call (a bad one stops the job, naming it).
const Config& config();
// The state of `comm`, made on first use.
CommState& state_of(MPI_Comm comm);
// Its netreduce communicator, set up on first use; null (the reason in
// why_not) if it cannot be.
Communicator* served_by(CommState& st);
// Before PMPI_Comm_free: reports and frees comm's state, if it has one.
void release(MPI_Comm comm);
// At MPI_Finalize: reports and frees every state still alive.
void finish_all();
// "netreduce-mpi: rank 5 (rank 1 of even): " for errors and warnings (rank
// 5 of MPI_COMM_WORLD).
std::string who(const CommState& st);

}  // namespace netreduce::mpi
