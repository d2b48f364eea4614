#include "mpi/rendezvous.h"

#include <algorithm>
#include <memory>
#include <thread>

namespace netreduce::mpi {

constexpr const char* kWho = "netreduce-mpi: ";

MpiRendezvous::MpiRendezvous(MPI_Comm comm) {
  PMPI_Comm_dup(comm, &comm_);
  PMPI_Comm_size(comm_, &size_);
}

MpiRendezvous::~MpiRendezvous() {
  if (!broken_ && comm_ != MPI_COMM_NULL) PMPI_Comm_free(&comm_);
}

bool MpiRendezvous::wait(MPI_Request& req, Deadline deadline) {
  for (;;) {
    int done = 0;
    PMPI_Test(&req, &done, MPI_STATUS_IGNORE);
    if (done) return true;
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

// Every buffer a round's collectives use lives in a Round on the heap: a
// round abandoned at its deadline is leaked, since MPI may still write into
// it (a collective cannot be cancelled).
struct MpiRendezvous::Round {
  int mine[2] = {0, 0};
  std::string bytes, table;
  std::vector<int> heads, counts, displs;
};

bool MpiRendezvous::round(Kind k, const std::string& bytes, std::vector<int>& kinds,
                          std::vector<std::string>& all, Deadline deadline) {
  auto r = std::make_unique<Round>();
  r->bytes = bytes;
  r->mine[0] = k;
  r->mine[1] = static_cast<int>(bytes.size());
  r->heads.assign(2 * static_cast<size_t>(size_), 0);
  MPI_Request req;
  PMPI_Iallgather(r->mine, 2, MPI_INT, r->heads.data(), 2, MPI_INT, comm_, &req);
  if (!wait(req, deadline)) {
    r.release();  // NOLINT: MPI may still write into it
    return false;
  }
  r->counts.assign(size_, 0);
  r->displs.assign(size_, 0);
  int total = 0;
  kinds.assign(size_, 0);
  for (int q = 0; q < size_; ++q) {
    kinds[q] = r->heads[2 * q];
    r->counts[q] = r->heads[2 * q + 1];
    r->displs[q] = total;
    total += r->counts[q];
  }
  r->table.assign(static_cast<size_t>(total), '\0');
  PMPI_Iallgatherv(r->bytes.data(), r->mine[1], MPI_CHAR, r->table.data(), r->counts.data(),
                   r->displs.data(), MPI_CHAR, comm_, &req);
  if (!wait(req, deadline)) {
    r.release();  // NOLINT: as above
    return false;
  }
  all.assign(size_, {});
  for (int q = 0; q < size_; ++q) all[q] = r->table.substr(r->displs[q], r->counts[q]);
  return true;
}

Error MpiRendezvous::allgather(const std::string& mine, std::vector<std::string>& all,
                               Deadline deadline) {
  if (broken_ || closed_)
    return Error::make(ErrorCode::bootstrap,
                       std::string(kWho) + (broken_ ? "an earlier exchange timed out"
                                                    : "the set-up failed: no exchange"));
  if (others_left_) return Error::make(ErrorCode::bootstrap, std::string(kWho) + "set-up ended");
  std::vector<int> kinds;
  if (!round(blob, mine, kinds, all, deadline)) {
    broken_ = true;
    return Error::make(ErrorCode::timeout,
                       std::string(kWho) +
                           "an exchange over MPI did not finish by its deadline "
                           "(a rank is not taking part)");
  }
  const auto it = std::find_if(kinds.begin(), kinds.end(), [](int k) { return k != blob; });
  if (it == kinds.end()) return {};
  others_left_ = true;
  return Error::make(
      ErrorCode::bootstrap,
      std::string(kWho) + "rank " + std::to_string(it - kinds.begin()) + " left the set-up");
}

std::string MpiRendezvous::settle(const Error& mine, Deadline deadline) {
  if (broken_) return "rank ?: " + mine.message;
  const Kind k = mine.ok() ? done : others_left_ ? left : failed;
  std::vector<int> kinds;
  std::vector<std::string> all;
  do {
    if (!round(k, mine.message, kinds, all, deadline)) {
      broken_ = true;
      return std::string(kWho) + "the set-up's closing exchange did not finish by its deadline";
    }
  } while (std::any_of(kinds.begin(), kinds.end(), [](int x) { return x == blob; }));
  // Create is over on every rank: later rounds are the communicator's own.
  others_left_ = false;
  for (Kind want : {failed, left})
    for (int r = 0; r < size_; ++r)
      if (kinds[r] == want) {
        closed_ = true;
        return "rank " + std::to_string(r) + ": " + all[r];
      }
  return {};
}

}  // namespace netreduce::mpi
