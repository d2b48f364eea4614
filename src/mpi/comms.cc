#include "mpi/comms.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>
#include <vector>

namespace netreduce::mpi {
namespace {

std::mutex mu;
std::set<CommState*> live;
int keyval = MPI_KEYVAL_INVALID;
unsigned made = 0;    // states made: "communicator #N"
unsigned set_up = 0;  // netreduce communicators set up (CommState::seq)

void report_and_free(CommState* st) {
  std::string path = "not set up (no call was served)";
  if (st->nr)
    path = std::string("path ") + to_string(st->nr->path()) + ": " + st->nr->path_reason();
  else if (st->tried)
    path = "not set up: " + st->why_not;
  if (st->rank == 0 || config().verbose)
    std::fprintf(
        stderr, "%s\n",
        report_line(st->world_rank, st->rank, st->label, st->size, st->tally, path).c_str());
  delete st;
}

// The attribute's delete callback: a state MPI_Finalize already reported is
// no longer in `live` and is left alone.
int on_delete(MPI_Comm, int, void* value, void*) {
  auto* st = static_cast<CommState*>(value);
  if (st == nullptr) return MPI_SUCCESS;  // before the lock: state_of may hold it here
  {
    std::lock_guard<std::mutex> lk(mu);
    if (live.erase(st) == 0) return MPI_SUCCESS;
  }
  try {  // called from MPI's C code: nothing may escape
    report_and_free(st);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "netreduce-mpi: freeing a communicator: %s\n", e.what());
    return MPI_ERR_OTHER;
  }
  return MPI_SUCCESS;
}

std::string comm_label(MPI_Comm comm) {
  char name[MPI_MAX_OBJECT_NAME] = {};
  int len = 0;
  PMPI_Comm_get_name(comm, name, &len);
  if (len > 0) return std::string(name, static_cast<size_t>(len));
  return "communicator #" + std::to_string(made);
}

}  // namespace

const Config& config() {
  // Never destroyed: a static's destructor may finalize MPI after ours ran.
  static const Config& c = *new Config([] {
    Config out;
    std::string error;
    if (!read_config([](const char* n) { return std::getenv(n); }, out, error)) {
      int rank = 0;
      PMPI_Comm_rank(MPI_COMM_WORLD, &rank);
      std::fprintf(stderr, "netreduce-mpi: rank %d: %s\n", rank, error.c_str());
      PMPI_Abort(MPI_COMM_WORLD, 1);
    }
    return out;
  }());
  return c;
}

std::string who(const CommState& st) {
  return "netreduce-mpi: rank " + std::to_string(st.world_rank) + " (rank " +
         std::to_string(st.rank) + " of " + st.label + "): ";
}

CommState& state_of(MPI_Comm comm) {
  config();
  std::lock_guard<std::mutex> lk(mu);
  if (keyval == MPI_KEYVAL_INVALID)
    PMPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, on_delete, &keyval, nullptr);
  void* value = nullptr;
  int found = 0;
  PMPI_Comm_get_attr(comm, keyval, &value, &found);
  if (found && value != nullptr) return *static_cast<CommState*>(value);
  auto* st = new CommState;
  st->comm = comm;
  ++made;
  st->label = comm_label(comm);
  PMPI_Comm_rank(comm, &st->rank);
  PMPI_Comm_size(comm, &st->size);
  PMPI_Comm_rank(MPI_COMM_WORLD, &st->world_rank);
  int inter = 0;
  PMPI_Comm_test_inter(comm, &inter);
  st->inter = inter != 0;
  PMPI_Comm_set_attr(comm, keyval, st);
  live.insert(st);
  return *st;
}

// The outcome of a set-up every rank learns alike: warned about (rank 0),
// or the job stopped with NETREDUCE_MPI_REQUIRE=1.
Communicator* not_served(CommState& st, const Config& c) {
  if (c.require) {
    std::fprintf(stderr, "%snetreduce cannot serve this communicator: %s\n", who(st).c_str(),
                 st.why_not.c_str());
    PMPI_Abort(st.comm, 1);
  }
  if (st.rank == 0 || c.verbose)
    std::fprintf(stderr, "%sits collectives go to MPI: %s\n", who(st).c_str(), st.why_not.c_str());
  return nullptr;
}

Communicator* served_by(CommState& st) {
  if (st.tried) return st.nr.get();
  st.tried = true;
  const Config& c = config();
  // A failover's exchange runs on netreduce's progress thread and may meet
  // the application's thread inside MPI (a delegated call).
  int level = MPI_THREAD_SINGLE;
  PMPI_Query_thread(&level);
  if (level < MPI_THREAD_MULTIPLE) {
    st.why_not = "MPI gives less than MPI_THREAD_MULTIPLE (netreduce's progress thread uses MPI)";
    return not_served(st, c);
  }
  Options o;
  o.force_ring = c.force_ring;
  o.local_size = c.local_size;
  o.op_timeout_ms = c.timeout_ms;
  if (c.qp_timeout >= 0) o.qp_timeout = static_cast<uint8_t>(c.qp_timeout);
  o.delete_ring_at_close = !c.keep_rings;
  // Set-up deadlines start when the last rank arrives, not the first.
  PMPI_Barrier(st.comm);
  st.rendezvous = std::make_unique<MpiRendezvous>(st.comm);
  MpiRendezvous* mr = st.rendezvous.get();
  Rendezvous rv{
      [mr](const std::string& mine, std::vector<std::string>& all,
           MpiRendezvous::Deadline deadline) { return mr->allgather(mine, all, deadline); },
      "mpi:" + st.label};
  std::unique_ptr<Communicator> nr;
  const Error e = Communicator::create(st.rank, st.size, c.device, c.gid_index, rv, o, nr);
  // The verdict waits for the slowest rank's create: its own steps' time.
  const int settle_ms = std::max(c.timeout_ms, o.connect_timeout_ms + o.daemon_timeout_ms);
  st.why_not =
      mr->settle(e, std::chrono::steady_clock::now() + std::chrono::milliseconds(settle_ms));
  if (!st.why_not.empty()) {
    nr.reset();
    return not_served(st, c);
  }
  st.nr = std::move(nr);
  {
    std::lock_guard<std::mutex> lk(mu);
    st.seq = ++set_up;  // a collective step: the same order on every rank
  }
  if (c.verbose)
    std::fprintf(stderr, "%snetreduce set up, path %s: %s\n", who(st).c_str(),
                 to_string(st.nr->path()), st.nr->path_reason().c_str());
  return st.nr.get();
}

void release(MPI_Comm comm) {
  CommState* st = nullptr;
  {
    std::lock_guard<std::mutex> lk(mu);
    if (keyval == MPI_KEYVAL_INVALID) return;
    void* value = nullptr;
    int found = 0;
    PMPI_Comm_get_attr(comm, keyval, &value, &found);
    if (!found || live.erase(static_cast<CommState*>(value)) == 0) return;
    st = static_cast<CommState*>(value);
  }
  // The attribute goes before the state: its callback finds the state gone
  // from `live`, and no other state can have its address yet.
  PMPI_Comm_delete_attr(comm, keyval);
  report_and_free(st);
}

void finish_all() {
  std::vector<CommState*> rest;
  {
    std::lock_guard<std::mutex> lk(mu);
    rest.assign(live.begin(), live.end());
    live.clear();
  }
  std::sort(rest.begin(), rest.end(),
            [](const CommState* a, const CommState* b) { return a->seq < b->seq; });
  for (CommState* st : rest) report_and_free(st);
}

}  // namespace netreduce::mpi
