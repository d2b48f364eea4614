// Which MPI calls netreduce serves, and the tally of what each
// communicator's calls did.
//
// A call is served only when every rank makes the same decision from what
// it alone sees: MPI requires matching communicators, counts, types, ops and
// roots on every rank, so the facts below agree across ranks and no rank
// waits in netreduce while another calls MPI. The first reason that applies
// (in this order) sends the call to its PMPI_ twin unchanged:
//   intercommunicator: not a ring of the communicator's ranks;
//   communicator size: 1 rank, or more than netreduce's 64;
//   op: not MPI_SUM, MPI_MIN or MPI_MAX (user ops, MPI_PROD, ...);
//   datatype: not a named type the call can carry (derived types, types
//             with padding, and for reductions a type netreduce does not
//             sum; for copies, blocks not a multiple of 4 bytes);
//   type mismatch: send and receive sides described differently;
//   below threshold: an empty vector, or smaller than NETREDUCE_MPI_MIN_BYTES;
//   non-blocking: MPI_Iallreduce (its request belongs to MPI);
//   no communicator: netreduce could not be set up for this communicator.
// Example: MPI_Allreduce of 3 MPI_FLOAT with a user op on a 4-rank
// communicator is "op"; the same with MPI_SUM and NETREDUCE_MPI_MIN_BYTES=64
// is "below threshold" (12 bytes); with 1024 floats it is served.
#pragma once

#include <array>
#include <cstdint>
#include <string>

namespace netreduce::mpi {

enum class Reason : uint8_t {
  intercomm,
  comm_size,
  op,
  datatype,
  type_mismatch,
  below_threshold,
  non_blocking,
  no_communicator,
  served,
};
constexpr size_t kReasons = static_cast<size_t>(Reason::served);
const char* to_string(Reason r) noexcept;

struct CallFacts {
  bool intercomm = false;
  int comm_size = 0;
  bool op_ok = true;     // reductions: sum, min or max
  bool type_ok = false;  // a named type this call can carry
  bool types_match = true;
  bool has_vector = true;  // false for a barrier
  uint64_t bytes = 0;      // the call's vector: what one rank reduces or receives
  bool non_blocking = false;
};

// Reason::served, or the first reason the call goes to MPI.
Reason decide(const CallFacts& f, uint64_t min_bytes) noexcept;

// One communicator's calls, as its rank sees them.
struct Tally {
  uint64_t served_ina = 0, served_ring = 0;
  std::array<uint64_t, kReasons> to_mpi{};
};

// "netreduce-mpi: rank 5 (rank 1 of even, 4 ranks): 40 served (ina 0, ring
// 40), 7 to MPI (op 2, datatype 3, intercommunicator 2); path ring: <why>"
// (rank 5 of MPI_COMM_WORLD is rank 1 of the communicator "even").
std::string report_line(int world_rank, int rank, const std::string& label, int size,
                        const Tally& t, const std::string& path);

}  // namespace netreduce::mpi
