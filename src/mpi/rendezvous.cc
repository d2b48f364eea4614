#include "mpi/rendezvous.h"

#include <algorithm>

namespace netreduce::mpi {

constexpr const char* kLeft = "netreduce-mpi: ";

MpiRendezvous::MpiRendezvous(MPI_Comm comm) : comm_(comm) { PMPI_Comm_size(comm, &size_); }

void MpiRendezvous::round(Kind k, const std::string& bytes, std::vector<int>& kinds,
                          std::vector<std::string>& all) {
  const int mine[2] = {k, static_cast<int>(bytes.size())};
  std::vector<int> heads(2 * static_cast<size_t>(size_));
  PMPI_Allgather(mine, 2, MPI_INT, heads.data(), 2, MPI_INT, comm_);
  std::vector<int> counts(size_), displs(size_);
  int total = 0;
  kinds.assign(size_, 0);
  for (int r = 0; r < size_; ++r) {
    kinds[r] = heads[2 * r];
    counts[r] = heads[2 * r + 1];
    displs[r] = total;
    total += counts[r];
  }
  std::string table(static_cast<size_t>(total), '\0');
  PMPI_Allgatherv(bytes.data(), mine[1], MPI_CHAR, table.data(), counts.data(), displs.data(),
                  MPI_CHAR, comm_);
  all.assign(size_, {});
  for (int r = 0; r < size_; ++r) all[r] = table.substr(displs[r], counts[r]);
}

Error MpiRendezvous::allgather(const std::string& mine, std::vector<std::string>& all) {
  if (others_left_) return Error::make(ErrorCode::bootstrap, std::string(kLeft) + "set-up ended");
  std::vector<int> kinds;
  round(blob, mine, kinds, all);
  const auto it = std::find_if(kinds.begin(), kinds.end(), [](int k) { return k != blob; });
  if (it == kinds.end()) return {};
  others_left_ = true;
  return Error::make(
      ErrorCode::bootstrap,
      std::string(kLeft) + "rank " + std::to_string(it - kinds.begin()) + " left the set-up");
}

std::string MpiRendezvous::settle(const Error& mine) {
  const Kind k = mine.ok() ? done : others_left_ ? left : failed;
  std::vector<int> kinds;
  std::vector<std::string> all;
  do {
    round(k, mine.message, kinds, all);
  } while (std::any_of(kinds.begin(), kinds.end(), [](int x) { return x == blob; }));
  for (Kind want : {failed, left})
    for (int r = 0; r < size_; ++r)
      if (kinds[r] == want) return "rank " + std::to_string(r) + ": " + all[r];
  return {};
}

}  // namespace netreduce::mpi
