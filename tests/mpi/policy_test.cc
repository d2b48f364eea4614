// The interposer's settings and its serve-or-delegate rule (src/mpi/
// config.h, policy.h), without MPI.
#include "mpi/policy.h"

#include <catch2/catch.hpp>
#include <map>
#include <string>

#include "mpi/config.h"

using namespace netreduce::mpi;

namespace {

bool read(const std::map<std::string, std::string>& env, Config& c, std::string& error) {
  return read_config(
      [&](const char* n) {
        auto it = env.find(n);
        return it == env.end() ? static_cast<const char*>(nullptr) : it->second.c_str();
      },
      c, error);
}

CallFacts served_allreduce() {
  CallFacts f;
  f.comm_size = 4;
  f.type_ok = true;
  f.bytes = 4096;
  return f;
}

}  // namespace

TEST_CASE("mpi config: defaults, every variable, and bad values named", "[mpi]") {
  Config c;
  std::string error;
  REQUIRE(read({}, c, error));
  CHECK(c.device.empty());
  CHECK(c.gid_index == -1);
  CHECK(c.min_bytes == 0);
  CHECK(c.timeout_ms == 300000);
  CHECK(c.local_size == -1);
  CHECK(c.qp_timeout == -1);
  CHECK_FALSE(c.keep_rings);
  CHECK_FALSE(c.force_ring);
  CHECK_FALSE(c.require);
  CHECK_FALSE(c.verbose);

  REQUIRE(read({{"NETREDUCE_MPI_DEVICE", "rxe0"},
                {"NETREDUCE_MPI_GID_INDEX", "1"},
                {"NETREDUCE_MPI_MIN_BYTES", "65536"},
                {"NETREDUCE_MPI_TIMEOUT_MS", "2000"},
                {"NETREDUCE_MPI_FORCE_RING", "1"},
                {"NETREDUCE_MPI_LOCAL_SIZE", "1"},
                {"NETREDUCE_MPI_QP_TIMEOUT", "18"},
                {"NETREDUCE_MPI_KEEP_RINGS", "1"},
                {"NETREDUCE_MPI_REQUIRE", "1"},
                {"NETREDUCE_MPI_VERBOSE", "1"}},
               c, error));
  CHECK(c.device == "rxe0");
  CHECK(c.gid_index == 1);
  CHECK(c.min_bytes == 65536);
  CHECK(c.timeout_ms == 2000);
  CHECK(c.force_ring);
  CHECK(c.local_size == 1);
  CHECK(c.qp_timeout == 18);
  CHECK(c.keep_rings);
  CHECK(c.require);
  CHECK(c.verbose);

  const std::map<std::string, std::string> bad[] = {
      {{"NETREDUCE_MPI_GID_INDEX", "x"}},    {{"NETREDUCE_MPI_GID_INDEX", "256"}},
      {{"NETREDUCE_MPI_MIN_BYTES", "-1"}},   {{"NETREDUCE_MPI_MIN_BYTES", "1k"}},
      {{"NETREDUCE_MPI_TIMEOUT_MS", "0"}},   {{"NETREDUCE_MPI_TIMEOUT_MS", "9999999999"}},
      {{"NETREDUCE_MPI_FORCE_RING", "yes"}}, {{"NETREDUCE_MPI_LOCAL_SIZE", "0"}},
      {{"NETREDUCE_MPI_LOCAL_SIZE", "65"}},  {{"NETREDUCE_MPI_VERBOSE", "2"}},
      {{"NETREDUCE_MPI_REQUIRE", " 1"}},     {{"NETREDUCE_MPI_QP_TIMEOUT", "0"}},
      {{"NETREDUCE_MPI_QP_TIMEOUT", "32"}},  {{"NETREDUCE_MPI_KEEP_RINGS", "true"}},
  };
  for (const auto& env : bad) {
    Config before;
    before.device = "kept";
    error.clear();
    INFO(env.begin()->first << "=" << env.begin()->second);
    CHECK_FALSE(read(env, before, error));
    CHECK(error.find(env.begin()->first + "='" + env.begin()->second + "'") == 0);
    CHECK(before.device == "kept");  // nothing half-applied
  }
}

TEST_CASE("mpi policy: the first reason that applies sends a call to MPI", "[mpi]") {
  CHECK(decide(served_allreduce(), 0) == Reason::served);
  CHECK(decide(served_allreduce(), 4096) == Reason::served);
  CHECK(decide(served_allreduce(), 4097) == Reason::below_threshold);

  CallFacts f = served_allreduce();
  f.intercomm = true;
  f.op_ok = false;  // the earlier reason wins
  CHECK(decide(f, 0) == Reason::intercomm);
  for (int size : {0, 1, 65}) {
    f = served_allreduce();
    f.comm_size = size;
    CHECK(decide(f, 0) == Reason::comm_size);
  }
  f = served_allreduce();
  f.comm_size = 64;
  CHECK(decide(f, 0) == Reason::served);
  f.op_ok = false;
  f.type_ok = false;
  CHECK(decide(f, 0) == Reason::op);
  f.op_ok = true;
  CHECK(decide(f, 0) == Reason::datatype);
  f = served_allreduce();
  f.types_match = false;
  CHECK(decide(f, 0) == Reason::type_mismatch);
  f = served_allreduce();
  f.bytes = 0;
  CHECK(decide(f, 0) == Reason::below_threshold);  // an empty vector is never served
  f = served_allreduce();
  f.non_blocking = true;
  CHECK(decide(f, 0) == Reason::non_blocking);
  f.bytes = 1;
  CHECK(decide(f, 2) == Reason::below_threshold);

  CallFacts barrier;
  barrier.comm_size = 3;
  barrier.has_vector = false;
  CHECK(decide(barrier, 1 << 20) == Reason::served);  // no vector: no type, no threshold
}

TEST_CASE("mpi policy: the report line names every reason that counted", "[mpi]") {
  Tally t;
  t.served_ring = 40;
  t.served_ina = 2;
  t.to_mpi[static_cast<size_t>(Reason::op)] = 2;
  t.to_mpi[static_cast<size_t>(Reason::intercomm)] = 1;
  CHECK(report_line(0, 0, "MPI_COMM_WORLD", 4, t, "path ring: forced") ==
        "netreduce-mpi: rank 0 (rank 0 of MPI_COMM_WORLD, 4 ranks): 42 served (ina 2, ring 40), 3 "
        "to MPI "
        "(intercommunicator 1, op 2); path ring: forced");
  CHECK(report_line(3, 1, "even", 2, Tally{}, "not set up (no call was served)") ==
        "netreduce-mpi: rank 3 (rank 1 of even, 2 ranks): 0 served (ina 0, ring 0), 0 to MPI; not "
        "set up (no "
        "call was served)");
}
