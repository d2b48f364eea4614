// mpi-allreduce-bench: MPI_Allreduce latency and bus bandwidth, OSU-style,
// for an MPI program as it is: run it under mpirun with and without
// libnetreduce-mpi preloaded and compare the two tables (bench/mpi_lab.py
// does both in the Soft-RoCE lab).
//
//   mpi-allreduce-bench [-b MIN] [-e MAX] [-f FACTOR] [-n ITERS] [-w WARMUP]
//
// Per size (MPI_FLOAT, MPI_SUM): WARMUP calls, then one call checked
// against PMPI_Allreduce (Open MPI's own result; values are multiples of
// 1/8, so the sums are exact in any order), then ITERS timed calls between
// two PMPI_Barriers. Rank 0 prints "bytes avg_us max_us busbw_gbps": the
// mean over the ranks of their time per call, the slowest rank's, and
// nccl-tests' bus bandwidth 2(P-1)/P x bytes / max_us, in Gbit/s (nccl-tests
// prints GB/s). Exit status 1 if a check differs.
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

long arg(int argc, char** argv, const char* flag, long dflt) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], flag) == 0) return std::strtol(argv[i + 1], nullptr, 10);
  return dflt;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, P = 0;
  PMPI_Comm_rank(MPI_COMM_WORLD, &rank);
  PMPI_Comm_size(MPI_COMM_WORLD, &P);
  const long lo = arg(argc, argv, "-b", 8), hi = arg(argc, argv, "-e", 1 << 20);
  const long factor = arg(argc, argv, "-f", 4), iters = arg(argc, argv, "-n", 20);
  const long warm = arg(argc, argv, "-w", 2);
  if (lo < 4 || lo % 4 != 0 || hi < lo || factor < 2 || iters < 1 || warm < 0) {
    if (rank == 0)
      std::fprintf(stderr,
                   "mpi-allreduce-bench: -b a multiple of 4 (floats), -e >= -b, -f >= 2, -n >= 1, "
                   "-w >= 0\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  int bad = 0;
  if (rank == 0) std::printf("# P = %d, MPI_FLOAT sum, %ld timed calls per size\n", P, iters);
  if (rank == 0) std::printf("%10s %12s %12s %12s\n", "bytes", "avg_us", "max_us", "busbw_gbps");
  for (long bytes = lo; bytes <= hi; bytes *= factor) {
    const int n = static_cast<int>(bytes / 4);
    std::vector<float> in(static_cast<size_t>(n)), out(in.size()), want(in.size());
    for (int i = 0; i < n; ++i)
      in[static_cast<size_t>(i)] = static_cast<float>((i * 3 + rank * 7) % 41 - 20) / 8;
    for (long w = 0; w < warm; ++w)
      MPI_Allreduce(in.data(), out.data(), n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Allreduce(in.data(), out.data(), n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    PMPI_Allreduce(in.data(), want.data(), n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    if (std::memcmp(out.data(), want.data(), out.size() * 4) != 0) {
      std::fprintf(stderr,
                   "mpi-allreduce-bench: rank %d: %ld bytes differ from Open MPI's result\n", rank,
                   bytes);
      bad = 1;
    }
    PMPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    for (long i = 0; i < iters; ++i)
      MPI_Allreduce(in.data(), out.data(), n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    const double us = (MPI_Wtime() - t0) * 1e6 / static_cast<double>(iters);
    PMPI_Barrier(MPI_COMM_WORLD);
    double sum = 0, max = 0;
    PMPI_Reduce(&us, &sum, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
    PMPI_Reduce(&us, &max, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    if (rank == 0)
      std::printf("%10ld %12.1f %12.1f %12.4f\n", bytes, sum / P, max,
                  2.0 * (P - 1) / P * static_cast<double>(bytes) * 8 / (max * 1e3));
    std::fflush(stdout);
  }
  int any = 0;
  PMPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return any;
}
