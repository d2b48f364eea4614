// The MPI interposer's settings, from the environment of each rank (every
// rank of a job must be given the same ones):
//
//   NETREDUCE_MPI_DEVICE       RDMA device ("" or unset: the first one)
//   NETREDUCE_MPI_GID_INDEX    GID index (-1 or unset: the RoCEv2 IPv4 one)
//   NETREDUCE_MPI_MIN_BYTES    calls whose vector is smaller go to MPI (0)
//   NETREDUCE_MPI_TIMEOUT_MS   a served call's deadline (300000)
//   NETREDUCE_MPI_FORCE_RING   1: never the box, the ring path only (0)
//   NETREDUCE_MPI_LOCAL_SIZE   ranks per host sharing one all-reduce
//                              (-1: discovered; 1: none)
//   NETREDUCE_MPI_QP_TIMEOUT   RC retransmission timeout exponent, 4.096 us
//                              x 2^n (the host library's default)
//   NETREDUCE_MPI_KEEP_RINGS   1: a communicator's ring stays at the daemon
//                              after it is freed, until its lease ends, so
//                              its counters can be read (0)
//   NETREDUCE_MPI_REQUIRE      1: a communicator netreduce cannot make is
//                              an error, not MPI's collectives (0)
//   NETREDUCE_MPI_VERBOSE      1: every rank reports, not only rank 0 (0)
//
// The daemon, token, job key and rack come from the host library's own
// variables (NETREDUCE_DAEMON, ...). A value that does not parse is an
// error naming the variable: the job stops at its first collective rather
// than run with a setting nobody asked for.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace netreduce::mpi {

struct Config {
  std::string device;
  int gid_index = -1;
  uint64_t min_bytes = 0;
  int timeout_ms = 300000;
  bool force_ring = false;
  int local_size = -1;
  int qp_timeout = -1;  // -1: the host library's default
  bool keep_rings = false;
  bool require = false;
  bool verbose = false;
};

// Reads the settings through `get` (a getenv); false with `error` naming
// the variable and the value when one does not parse.
bool read_config(const std::function<const char*(const char*)>& get, Config& out,
                 std::string& error);

}  // namespace netreduce::mpi
