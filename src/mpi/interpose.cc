// libnetreduce-mpi: MPI's collectives through netreduce, for an unchanged
// MPI program (LD_PRELOAD, or linked before the MPI library).
//
// Each MPI_ function below decides (policy.h) whether netreduce serves the
// call; if so it runs on the communicator's netreduce communicator
// (comms.h), otherwise it is its PMPI_ twin, unchanged. A served call that
// fails (a rank missing past NETREDUCE_MPI_TIMEOUT_MS, a transport error)
// is reported naming the rank and goes to the communicator's MPI error
// handler: by default that ends the job, and it never returns a wrong
// result as if it were right.
//
// Datatypes: reductions carry MPI_FLOAT, MPI_DOUBLE, MPI_INT, MPI_INT32_T,
// MPI_LONG (64-bit), MPI_LONG_LONG and MPI_INT64_T with MPI_SUM, MPI_MIN and
// MPI_MAX; broadcast and all-gather copy any named type without padding as
// 32-bit words when the bytes are a multiple of 4 (bit-exact). MPI_IN_PLACE
// is taken by MPI_Allreduce, MPI_Allgather and MPI_Reduce_scatter_block.
// Example: MPI_Allreduce(MPI_IN_PLACE, x, 1024, MPI_FLOAT, MPI_SUM, world)
// on 4 ranks is Communicator::allreduce(x, x, 1024, fp32, sum) on the
// netreduce communicator of MPI_COMM_WORLD, set up at this first call.
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <optional>

#include "mpi/comms.h"

using namespace netreduce;
using namespace netreduce::mpi;

namespace {

// A named type whose elements lie back to back: no padding (MPI_DOUBLE_INT
// has 12 bytes of data in 16 of extent), so count x size bytes are the data.
bool named(MPI_Datatype t) {
  if (t == MPI_DATATYPE_NULL) return false;
  int ni = 0, na = 0, nd = 0, combiner = 0;
  PMPI_Type_get_envelope(t, &ni, &na, &nd, &combiner);
  if (combiner != MPI_COMBINER_NAMED) return false;
  int size = 0;
  MPI_Aint lb = 0, extent = 0;
  PMPI_Type_size(t, &size);
  PMPI_Type_get_extent(t, &lb, &extent);
  return lb == 0 && extent == size && size > 0;
}

std::optional<DataType> summed_type(MPI_Datatype t) {
  if (t == MPI_FLOAT) return DataType::fp32;
  if (t == MPI_DOUBLE) return DataType::fp64;
  if (t == MPI_INT || t == MPI_INT32_T) return DataType::int32;
  if (t == MPI_INT64_T || t == MPI_LONG_LONG || t == MPI_LONG_LONG_INT ||
      (t == MPI_LONG && sizeof(long) == 8))
    return DataType::int64;
  return std::nullopt;
}

std::optional<Op> op_of(MPI_Op op) {
  if (op == MPI_SUM) return Op::sum;
  if (op == MPI_MIN) return Op::min;
  if (op == MPI_MAX) return Op::max;
  return std::nullopt;
}

uint64_t type_bytes(MPI_Datatype t) {
  int size = 0;
  PMPI_Type_size(t, &size);
  return size > 0 ? static_cast<uint64_t>(size) : 0;
}

// Reductions: the facts of `count` elements of t under op.
CallFacts reduction(const CommState& st, MPI_Datatype t, MPI_Op op, uint64_t count) {
  CallFacts f;
  f.intercomm = st.inter;
  f.comm_size = st.size;
  f.op_ok = op_of(op).has_value();
  f.type_ok = named(t) && summed_type(t).has_value();
  f.bytes = f.type_ok ? count * type_bytes(t) : 0;
  return f;
}

// Copies: `blocks` blocks of `count` elements of t (one per rank for
// all-gather), each carried as 32-bit words.
CallFacts copy(const CommState& st, MPI_Datatype t, uint64_t count, uint64_t blocks) {
  CallFacts f;
  f.intercomm = st.inter;
  f.comm_size = st.size;
  const bool ok = named(t);
  const uint64_t block = ok ? count * type_bytes(t) : 0;
  f.bytes = block * blocks;
  f.type_ok = ok && block % 4 == 0;
  return f;
}

// The call's outcome: tallied by the path it took, or reported and handed
// to the communicator's error handler.
int finish(CommState& st, const char* call, const Error& e) {
  if (e.ok()) {
    (st.nr->last_call().path == Path::ina ? st.tally.served_ina : st.tally.served_ring)++;
    return MPI_SUCCESS;
  }
  std::fprintf(stderr, "%s%s: %s\n", who(st).c_str(), call, e.message.c_str());
  PMPI_Comm_call_errhandler(st.comm, MPI_ERR_OTHER);
  return MPI_ERR_OTHER;
}

// The netreduce communicator for a call policy.h serves, or null when the
// call goes to MPI (tallied with its reason).
Communicator* serve(CommState& st, const CallFacts& f) {
  const Reason r = decide(f, config().min_bytes);
  if (r == Reason::served) {
    if (Communicator* nr = served_by(st)) return nr;
    st.tally.to_mpi[static_cast<size_t>(Reason::no_communicator)]++;
    return nullptr;
  }
  st.tally.to_mpi[static_cast<size_t>(r)]++;
  return nullptr;
}

int timeout() { return config().timeout_ms; }

// An entry point's body: nothing escapes into the application's C code (a
// bad_alloc, a throwing std::function); an exception is the call's error.
template <typename Body>
int guarded(MPI_Comm comm, const char* call, Body&& body) {
  const char* what = "unknown exception";
  try {
    return body();
  } catch (const std::exception& e) {
    what = e.what();
  } catch (...) {
  }
  std::fprintf(stderr, "netreduce-mpi: %s: %s\n", call, what);
  PMPI_Comm_call_errhandler(comm, MPI_ERR_OTHER);
  return MPI_ERR_OTHER;
}

}  // namespace

extern "C" {

int MPI_Allreduce(const void* sendbuf, void* recvbuf, int count, MPI_Datatype datatype, MPI_Op op,
                  MPI_Comm comm) {
  return guarded(comm, "MPI_Allreduce", [&] {
    CommState& st = state_of(comm);
    Communicator* nr = serve(st, reduction(st, datatype, op, static_cast<uint64_t>(count)));
    if (nr == nullptr) return PMPI_Allreduce(sendbuf, recvbuf, count, datatype, op, comm);
    const void* send = sendbuf == MPI_IN_PLACE ? recvbuf : sendbuf;
    return finish(st, "MPI_Allreduce",
                  nr->allreduce(send, recvbuf, static_cast<size_t>(count), *summed_type(datatype),
                                *op_of(op), timeout()));
  });
}

int MPI_Iallreduce(const void* sendbuf, void* recvbuf, int count, MPI_Datatype datatype, MPI_Op op,
                   MPI_Comm comm, MPI_Request* request) {
  return guarded(comm, "MPI_Iallreduce", [&] {
    CommState& st = state_of(comm);
    CallFacts f = reduction(st, datatype, op, static_cast<uint64_t>(count));
    f.non_blocking = true;
    serve(st, f);
    return PMPI_Iallreduce(sendbuf, recvbuf, count, datatype, op, comm, request);
  });
}

int MPI_Reduce_scatter_block(const void* sendbuf, void* recvbuf, int recvcount,
                             MPI_Datatype datatype, MPI_Op op, MPI_Comm comm) {
  return guarded(comm, "MPI_Reduce_scatter_block", [&] {
    CommState& st = state_of(comm);
    const uint64_t n = static_cast<uint64_t>(recvcount) * static_cast<uint64_t>(st.size);
    Communicator* nr = serve(st, reduction(st, datatype, op, n));
    if (nr == nullptr)
      return PMPI_Reduce_scatter_block(sendbuf, recvbuf, recvcount, datatype, op, comm);
    // In place, the input is recvbuf and the result its first block.
    const void* send = sendbuf == MPI_IN_PLACE ? recvbuf : sendbuf;
    return finish(st, "MPI_Reduce_scatter_block",
                  nr->reduce_scatter(send, recvbuf, static_cast<size_t>(recvcount),
                                     *summed_type(datatype), *op_of(op), timeout()));
  });
}

int MPI_Allgather(const void* sendbuf, int sendcount, MPI_Datatype sendtype, void* recvbuf,
                  int recvcount, MPI_Datatype recvtype, MPI_Comm comm) {
  return guarded(comm, "MPI_Allgather", [&] {
    CommState& st = state_of(comm);
    const bool in_place = sendbuf == MPI_IN_PLACE;
    CallFacts f =
        copy(st, recvtype, static_cast<uint64_t>(recvcount), static_cast<uint64_t>(st.size));
    f.types_match = in_place || (sendtype == recvtype && sendcount == recvcount);
    Communicator* nr = serve(st, f);
    if (nr == nullptr)
      return PMPI_Allgather(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm);
    const size_t block = static_cast<size_t>(recvcount) * type_bytes(recvtype);
    const void* send =
        in_place ? static_cast<char*>(recvbuf) + block * static_cast<size_t>(st.rank) : sendbuf;
    return finish(st, "MPI_Allgather",
                  nr->all_gather(send, recvbuf, block / 4, DataType::int32, timeout()));
  });
}

int MPI_Bcast(void* buffer, int count, MPI_Datatype datatype, int root, MPI_Comm comm) {
  return guarded(comm, "MPI_Bcast", [&] {
    CommState& st = state_of(comm);
    Communicator* nr = serve(st, copy(st, datatype, static_cast<uint64_t>(count), 1));
    if (nr == nullptr) return PMPI_Bcast(buffer, count, datatype, root, comm);
    const size_t bytes = static_cast<size_t>(count) * type_bytes(datatype);
    return finish(st, "MPI_Bcast",
                  nr->broadcast(buffer, bytes / 4, DataType::int32, root, timeout()));
  });
}

int MPI_Barrier(MPI_Comm comm) {
  return guarded(comm, "MPI_Barrier", [&] {
    CommState& st = state_of(comm);
    CallFacts f;
    f.intercomm = st.inter;
    f.comm_size = st.size;
    f.has_vector = false;
    Communicator* nr = serve(st, f);
    if (nr == nullptr) return PMPI_Barrier(comm);
    // The ring path waits for ranks any distance apart (netreduce.hpp).
    return finish(st, "MPI_Barrier", nr->barrier(PathChoice::ring, timeout()));
  });
}

// MPI_THREAD_MULTIPLE (comms.h): the application gets no less than it
// asked for.
int MPI_Init(int* argc, char*** argv) {
  int provided = MPI_THREAD_SINGLE;
  return PMPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
}

int MPI_Init_thread(int* argc, char*** argv, int required, int* provided) {
  return PMPI_Init_thread(argc, argv, std::max(required, int{MPI_THREAD_MULTIPLE}), provided);
}

// The netreduce communicator goes first, while the MPI one still works.
int MPI_Comm_free(MPI_Comm* comm) {
  if (comm == nullptr || *comm == MPI_COMM_NULL) return PMPI_Comm_free(comm);
  const int rc = guarded(*comm, "MPI_Comm_free", [&] {
    release(*comm);
    return MPI_SUCCESS;
  });
  return rc == MPI_SUCCESS ? PMPI_Comm_free(comm) : rc;
}

int MPI_Finalize(void) {
  guarded(MPI_COMM_WORLD, "MPI_Finalize", [] {
    finish_all();
    return MPI_SUCCESS;
  });
  return PMPI_Finalize();
}

}  // extern "C"
