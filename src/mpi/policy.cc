#include "mpi/policy.h"

#include <fmt/format.h>

namespace netreduce::mpi {

const char* to_string(Reason r) noexcept {
  switch (r) {
    case Reason::intercomm:
      return "intercommunicator";
    case Reason::comm_size:
      return "communicator size";
    case Reason::op:
      return "op";
    case Reason::datatype:
      return "datatype";
    case Reason::type_mismatch:
      return "type mismatch";
    case Reason::below_threshold:
      return "below threshold";
    case Reason::non_blocking:
      return "non-blocking";
    case Reason::no_communicator:
      return "no communicator";
    case Reason::served:
      return "served";
  }
  return "?";
}

Reason decide(const CallFacts& f, uint64_t min_bytes) noexcept {
  if (f.intercomm) return Reason::intercomm;
  if (f.comm_size < 2 || f.comm_size > 64) return Reason::comm_size;
  if (!f.op_ok) return Reason::op;
  if (f.has_vector && !f.type_ok) return Reason::datatype;
  if (!f.types_match) return Reason::type_mismatch;
  if (f.has_vector && (f.bytes == 0 || f.bytes < min_bytes)) return Reason::below_threshold;
  if (f.non_blocking) return Reason::non_blocking;
  return Reason::served;
}

std::string report_line(int world_rank, int rank, const std::string& label, int size,
                        const Tally& t, const std::string& path) {
  uint64_t delegated = 0;
  std::string why;
  for (size_t i = 0; i < kReasons; ++i) {
    if (t.to_mpi[i] == 0) continue;
    delegated += t.to_mpi[i];
    why += fmt::format("{}{} {}", why.empty() ? "" : ", ", to_string(static_cast<Reason>(i)),
                       t.to_mpi[i]);
  }
  std::string line = fmt::format(
      "netreduce-mpi: rank {} (rank {} of {}, {} ranks): {} served (ina {}, ring {}), {} to MPI",
      world_rank, rank, label, size, t.served_ina + t.served_ring, t.served_ina, t.served_ring,
      delegated);
  if (!why.empty()) line.append(" (").append(why).append(")");
  return line.append("; ").append(path);
}

}  // namespace netreduce::mpi
