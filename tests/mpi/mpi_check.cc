// mpi-check: an MPI program that knows nothing of netreduce. Run under
// mpirun with libnetreduce-mpi preloaded, it makes each collective the
// interposer may serve twice: through MPI_ (served or delegated) and
// through PMPI_ (Open MPI's own result, the reference), and compares the
// bytes. The values are small multiples of 1/8, so every sum is exact in
// any order and the comparison is bit-exact for every type and op.
//
// It also makes calls that must go to MPI (a user op, MPI_PROD, a derived
// type, mismatched all-gather types, a 3-byte all-gather block, a zero
// count, MPI_Iallreduce, an intercommunicator) and prints, per
// communicator, what it made: "mpi-check: rank R expect <name> <size>:
// eligible=N; op=A; ...;" (on a one-rank communicator every call is
// "communicator size"), for the test to hold against the interposer's own
// report line, and the bytes of its servable MPI_Allreduce calls
// ("mpi-check: rank R allreduce-bytes <name>: B"). Output: "mpi-check: rank
// R: C checks, M mismatches" per rank; exit status 1 on any mismatch.
// --allreduce-only: MPI_COMM_WORLD's all-reduces and the delegated calls
// only, so that every byte a box aggregates is one of those B.
#include <mpi.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

namespace {

int g_checks = 0, g_mismatches = 0;

struct Expect {
  int size = 0;
  std::map<std::string, int> n;  // "eligible" and the delegation reasons
};
std::map<std::string, Expect> g_expect;
std::map<std::string, uint64_t> g_allreduce_bytes;

std::string name_of(MPI_Comm comm) {
  char name[MPI_MAX_OBJECT_NAME] = {};
  int len = 0;
  PMPI_Comm_get_name(comm, name, &len);
  return name;
}

void note(MPI_Comm comm, const std::string& what) {
  int size = 0;
  PMPI_Comm_size(comm, &size);
  Expect& e = g_expect[name_of(comm)];
  e.size = size;
  e.n[size < 2 && what != "intercommunicator" ? "communicator size" : what]++;
}

// A call netreduce can serve, of `bytes` (the call's vector: what one rank
// reduces or receives,
// docs/mpi.md#what-goes-to-mpi-and-why-it-is-counted): "below threshold"
// under NETREDUCE_MPI_MIN_BYTES, "eligible" otherwise.
uint64_t g_min_bytes = 0;

bool servable(MPI_Comm comm, uint64_t bytes) {
  const bool small = bytes < g_min_bytes;
  note(comm, small ? "below threshold" : "eligible");
  return !small;
}

void compare(const char* what, const void* got, const void* want, size_t bytes, MPI_Comm comm) {
  ++g_checks;
  if (std::memcmp(got, want, bytes) == 0) return;
  ++g_mismatches;
  int rank = 0;
  PMPI_Comm_rank(MPI_COMM_WORLD, &rank);
  char name[MPI_MAX_OBJECT_NAME] = {};
  int len = 0;
  PMPI_Comm_get_name(comm, name, &len);
  std::fprintf(stderr, "mpi-check: rank %d: %s on %s differs from Open MPI's result\n", rank, what,
               name);
}

struct Type {
  MPI_Datatype t;
  const char* name;
  size_t size;
};

// Element i of rank r as bytes of type t: small multiples of 1/8 (or of 1
// for the integers), negative and positive.
std::vector<uint8_t> values(const Type& t, size_t n, int r, int salt) {
  std::vector<uint8_t> out(n * t.size);
  for (size_t i = 0; i < n; ++i) {
    const long v = static_cast<long>((static_cast<size_t>(r) * 7 + i * 3 + salt) % 41) - 20;
    uint8_t* p = out.data() + i * t.size;
    if (t.t == MPI_FLOAT) {
      const float f = static_cast<float>(v) / 8;
      std::memcpy(p, &f, 4);
    } else if (t.t == MPI_DOUBLE) {
      const double d = static_cast<double>(v) / 8;
      std::memcpy(p, &d, 8);
    } else if (t.size == 4) {
      const int32_t x = static_cast<int32_t>(v);
      std::memcpy(p, &x, 4);
    } else if (t.size == 8) {
      const int64_t x = v * 1000000007L;
      std::memcpy(p, &x, 8);
    } else {
      *p = static_cast<uint8_t>(v);
    }
  }
  return out;
}

const Type kSummed[] = {{MPI_FLOAT, "MPI_FLOAT", 4},
                        {MPI_DOUBLE, "MPI_DOUBLE", 8},
                        {MPI_INT, "MPI_INT", 4},
                        {MPI_INT32_T, "MPI_INT32_T", 4},
                        {MPI_LONG, "MPI_LONG", 8},
                        {MPI_INT64_T, "MPI_INT64_T", 8},
                        {MPI_LONG_LONG, "MPI_LONG_LONG", 8}};
const MPI_Op kOps[] = {MPI_SUM, MPI_MIN, MPI_MAX};
const size_t kCounts[] = {1, 300, 5000};

void user_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  for (int i = 0; i < *len; ++i) static_cast<float*>(inout)[i] += static_cast<float*>(in)[i];
}

void check_allreduce(MPI_Comm comm, int rank) {
  for (const Type& t : kSummed)
    for (MPI_Op op : kOps)
      for (size_t n : kCounts) {
        const auto in = values(t, n, rank, 1);
        std::vector<uint8_t> got(in.size()), want(in.size());
        MPI_Allreduce(in.data(), got.data(), static_cast<int>(n), t.t, op, comm);
        if (servable(comm, in.size())) g_allreduce_bytes[name_of(comm)] += in.size();
        PMPI_Allreduce(in.data(), want.data(), static_cast<int>(n), t.t, op, comm);
        compare("MPI_Allreduce", got.data(), want.data(), got.size(), comm);
        if (n == 300) {  // in place
          got = in;
          MPI_Allreduce(MPI_IN_PLACE, got.data(), static_cast<int>(n), t.t, op, comm);
          if (servable(comm, in.size())) g_allreduce_bytes[name_of(comm)] += in.size();
          compare("MPI_Allreduce in place", got.data(), want.data(), got.size(), comm);
        }
      }
}

void check_reduce_scatter(MPI_Comm comm, int rank, int size) {
  for (const Type& t : kSummed)
    for (MPI_Op op : kOps)
      for (size_t n : {size_t{1}, size_t{777}}) {
        const auto in = values(t, n * static_cast<size_t>(size), rank, 2);
        std::vector<uint8_t> got(n * t.size), want(n * t.size);
        MPI_Reduce_scatter_block(in.data(), got.data(), static_cast<int>(n), t.t, op, comm);
        servable(comm, in.size());
        PMPI_Reduce_scatter_block(in.data(), want.data(), static_cast<int>(n), t.t, op, comm);
        compare("MPI_Reduce_scatter_block", got.data(), want.data(), got.size(), comm);
        if (n == 777) {
          auto inplace = in;
          MPI_Reduce_scatter_block(MPI_IN_PLACE, inplace.data(), static_cast<int>(n), t.t, op,
                                   comm);
          servable(comm, in.size());
          compare("MPI_Reduce_scatter_block in place", inplace.data(), want.data(), want.size(),
                  comm);
        }
      }
}

void check_copies(MPI_Comm comm, int rank, int size) {
  const Type copied[] = {
      {MPI_FLOAT, "MPI_FLOAT", 4}, {MPI_DOUBLE, "MPI_DOUBLE", 8}, {MPI_BYTE, "MPI_BYTE", 1}};
  for (const Type& t : copied)
    for (size_t n : {size_t{4}, size_t{4096}}) {
      const auto in = values(t, n, rank, 3);
      std::vector<uint8_t> got(in.size() * static_cast<size_t>(size)), want(got.size());
      MPI_Allgather(in.data(), static_cast<int>(n), t.t, got.data(), static_cast<int>(n), t.t,
                    comm);
      servable(comm, got.size());
      PMPI_Allgather(in.data(), static_cast<int>(n), t.t, want.data(), static_cast<int>(n), t.t,
                     comm);
      compare("MPI_Allgather", got.data(), want.data(), got.size(), comm);
      std::vector<uint8_t> inplace(got.size());
      std::memcpy(inplace.data() + in.size() * static_cast<size_t>(rank), in.data(), in.size());
      MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, inplace.data(), static_cast<int>(n), t.t,
                    comm);
      servable(comm, got.size());
      compare("MPI_Allgather in place", inplace.data(), want.data(), want.size(), comm);
      for (int root : {0, size - 1}) {
        auto b = values(t, n, rank, 4 + root), ref = b;
        MPI_Bcast(b.data(), static_cast<int>(n), t.t, root, comm);
        servable(comm, b.size());
        PMPI_Bcast(ref.data(), static_cast<int>(n), t.t, root, comm);
        compare("MPI_Bcast", b.data(), ref.data(), b.size(), comm);
      }
    }
  MPI_Barrier(comm);
  note(comm, "eligible");  // no vector: no threshold
}

// Calls the interposer must leave to MPI, each still compared with PMPI_.
void check_delegated(MPI_Comm comm, int rank, int size) {
  const Type f{MPI_FLOAT, "MPI_FLOAT", 4};
  const auto in = values(f, 64, rank, 5);
  std::vector<uint8_t> got(in.size()), want(in.size());
  MPI_Op mine;
  PMPI_Op_create(user_sum, 1, &mine);
  MPI_Allreduce(in.data(), got.data(), 64, MPI_FLOAT, mine, comm);
  note(comm, "op");
  PMPI_Allreduce(in.data(), want.data(), 64, MPI_FLOAT, mine, comm);
  compare("MPI_Allreduce (user op)", got.data(), want.data(), got.size(), comm);
  PMPI_Op_free(&mine);
  const auto ints = values({MPI_INT, "MPI_INT", 4}, 16, rank, 6);
  std::vector<uint8_t> gi(ints.size()), wi(ints.size());
  MPI_Allreduce(ints.data(), gi.data(), 16, MPI_INT, MPI_PROD, comm);
  note(comm, "op");
  PMPI_Allreduce(ints.data(), wi.data(), 16, MPI_INT, MPI_PROD, comm);
  compare("MPI_Allreduce (MPI_PROD)", gi.data(), wi.data(), gi.size(), comm);

  MPI_Datatype pair;
  PMPI_Type_contiguous(2, MPI_FLOAT, &pair);
  PMPI_Type_commit(&pair);
  std::vector<uint8_t> gp(in.size() * static_cast<size_t>(size)), wp(gp.size());
  MPI_Allgather(in.data(), 32, pair, gp.data(), 32, pair, comm);
  note(comm, "datatype");
  PMPI_Allgather(in.data(), 32, pair, wp.data(), 32, pair, comm);
  compare("MPI_Allgather (derived type)", gp.data(), wp.data(), gp.size(), comm);
  auto b = in, rb = in;
  MPI_Bcast(b.data(), 32, pair, 0, comm);
  note(comm, "datatype");
  PMPI_Bcast(rb.data(), 32, pair, 0, comm);
  compare("MPI_Bcast (derived type)", b.data(), rb.data(), b.size(), comm);
  // Legal MPI (the type signatures match), described differently.
  std::vector<uint8_t> gm(in.size() * static_cast<size_t>(size)), wm(gm.size());
  MPI_Allgather(in.data(), 32, pair, gm.data(), 64, MPI_FLOAT, comm);
  note(comm, "type mismatch");
  PMPI_Allgather(in.data(), 32, pair, wm.data(), 64, MPI_FLOAT, comm);
  compare("MPI_Allgather (send and receive types differ)", gm.data(), wm.data(), gm.size(), comm);
  PMPI_Type_free(&pair);

  // A named type the reductions do not carry; copies with padding in the
  // type (MPI_DOUBLE_INT: 12 bytes of data in 16) or not a multiple of 4.
  std::vector<uint32_t> u(16, static_cast<uint32_t>(rank + 1)), gu(16), wu(16);
  MPI_Allreduce(u.data(), gu.data(), 16, MPI_UNSIGNED, MPI_SUM, comm);
  note(comm, "datatype");
  PMPI_Allreduce(u.data(), wu.data(), 16, MPI_UNSIGNED, MPI_SUM, comm);
  compare("MPI_Allreduce (MPI_UNSIGNED)", gu.data(), wu.data(), gu.size() * 4, comm);
  struct DoubleInt {
    double d;
    int i;
  };
  std::vector<DoubleInt> di(8), rdi(8);
  for (size_t k = 0; k < di.size(); ++k) {
    std::memset(&di[k], 0, sizeof di[k]);  // the padding compared too
    di[k].d = static_cast<double>(rank) + static_cast<double>(k) / 8;
    di[k].i = rank * 100 + static_cast<int>(k);
  }
  rdi = di;
  MPI_Bcast(di.data(), 8, MPI_DOUBLE_INT, size - 1, comm);
  note(comm, "datatype");
  PMPI_Bcast(rdi.data(), 8, MPI_DOUBLE_INT, size - 1, comm);
  compare("MPI_Bcast (MPI_DOUBLE_INT)", di.data(), rdi.data(), di.size() * sizeof(DoubleInt), comm);
  std::vector<uint8_t> b3(in.begin(), in.begin() + 3), rb3 = b3;
  MPI_Bcast(b3.data(), 3, MPI_BYTE, 0, comm);
  note(comm, "datatype");
  PMPI_Bcast(rb3.data(), 3, MPI_BYTE, 0, comm);
  compare("MPI_Bcast (3 bytes)", b3.data(), rb3.data(), 3, comm);

  PMPI_Op_create(user_sum, 1, &mine);
  const auto rs_in = values(f, 8 * static_cast<size_t>(size), rank, 7);
  std::vector<uint8_t> grs(8 * 4), wrs(8 * 4);
  MPI_Reduce_scatter_block(rs_in.data(), grs.data(), 8, MPI_FLOAT, mine, comm);
  note(comm, "op");
  PMPI_Reduce_scatter_block(rs_in.data(), wrs.data(), 8, MPI_FLOAT, mine, comm);
  compare("MPI_Reduce_scatter_block (user op)", grs.data(), wrs.data(), grs.size(), comm);
  PMPI_Op_free(&mine);

  std::vector<uint8_t> g3(3 * static_cast<size_t>(size)), w3(g3.size());
  MPI_Allgather(in.data(), 3, MPI_BYTE, g3.data(), 3, MPI_BYTE, comm);
  note(comm, "datatype");
  PMPI_Allgather(in.data(), 3, MPI_BYTE, w3.data(), 3, MPI_BYTE, comm);
  compare("MPI_Allgather (3-byte blocks)", g3.data(), w3.data(), g3.size(), comm);

  MPI_Allreduce(in.data(), got.data(), 0, MPI_FLOAT, MPI_SUM, comm);
  note(comm, "below threshold");

  MPI_Request req;
  MPI_Iallreduce(in.data(), got.data(), 64, MPI_FLOAT, MPI_SUM, comm, &req);
  note(comm, 256 < g_min_bytes ? "below threshold" : "non-blocking");
  PMPI_Wait(&req, MPI_STATUS_IGNORE);
  PMPI_Allreduce(in.data(), want.data(), 64, MPI_FLOAT, MPI_SUM, comm);
  compare("MPI_Iallreduce", got.data(), want.data(), got.size(), comm);
}

void check_all(MPI_Comm comm, bool allreduce_only) {
  int rank = 0, size = 0;
  PMPI_Comm_rank(comm, &rank);
  PMPI_Comm_size(comm, &size);
  check_allreduce(comm, rank);
  if (!allreduce_only) {
    check_reduce_scatter(comm, rank, size);
    check_copies(comm, rank, size);
  }
  check_delegated(comm, rank, size);
}

void report(int rank) {
  std::printf("mpi-check: rank %d: %d checks, %d mismatches\n", rank, g_checks, g_mismatches);
  for (const auto& [name, e] : g_expect) {
    std::string line = "mpi-check: rank " + std::to_string(rank) + " expect " + name + " " +
                       std::to_string(e.size) + ":";
    for (const auto& [what, n] : e.n) line += " " + what + "=" + std::to_string(n) + ";";
    std::printf("%s\n", line.c_str());
  }
  for (const auto& [name, b] : g_allreduce_bytes)
    std::printf("mpi-check: rank %d allreduce-bytes %s: %llu\n", rank, name.c_str(),
                static_cast<unsigned long long>(b));
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  const bool allreduce_only = argc > 1 && std::strcmp(argv[1], "--allreduce-only") == 0;
  if (const char* v = std::getenv("NETREDUCE_MPI_MIN_BYTES"))
    g_min_bytes = std::strtoull(v, nullptr, 10);
  int rank = 0, size = 0;
  PMPI_Comm_rank(MPI_COMM_WORLD, &rank);
  PMPI_Comm_size(MPI_COMM_WORLD, &size);
  check_all(MPI_COMM_WORLD, allreduce_only);
  if (allreduce_only) {
    report(rank);
    MPI_Finalize();
    return g_mismatches == 0 ? 0 : 1;
  }

  // One rank: nothing to aggregate.
  int one = rank, one_sum = 0;
  MPI_Allreduce(&one, &one_sum, 1, MPI_INT, MPI_SUM, MPI_COMM_SELF);
  note(MPI_COMM_SELF, "eligible");  // counted as "communicator size"
  compare("MPI_Allreduce (MPI_COMM_SELF)", &one_sum, &one, sizeof one, MPI_COMM_SELF);

  // Halves by rank parity, set up and freed by the application.
  MPI_Comm half;
  PMPI_Comm_split(MPI_COMM_WORLD, rank % 2, rank, &half);
  PMPI_Comm_set_name(half, rank % 2 == 0 ? "even" : "odd");
  check_all(half, false);

  // An intercommunicator between the halves: every call goes to MPI.
  MPI_Comm inter;
  PMPI_Intercomm_create(half, 0, MPI_COMM_WORLD, rank % 2 == 0 ? 1 : 0, 7, &inter);
  PMPI_Comm_set_name(inter, "inter");
  int x = rank, got = 0, want = 0;
  MPI_Allreduce(&x, &got, 1, MPI_INT, MPI_SUM, inter);
  note(inter, "intercommunicator");
  PMPI_Allreduce(&x, &want, 1, MPI_INT, MPI_SUM, inter);
  compare("MPI_Allreduce (intercommunicator)", &got, &want, sizeof got, inter);
  MPI_Barrier(inter);
  note(inter, "intercommunicator");
  MPI_Comm_free(&inter);  // as an application frees them (the interposer's teardown)
  MPI_Comm_free(&half);

  report(rank);
  MPI_Finalize();
  return g_mismatches == 0 ? 0 : 1;
}
