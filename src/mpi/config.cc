#include "mpi/config.h"

#include <charconv>
#include <cstring>
#include <limits>

namespace netreduce::mpi {
namespace {

template <typename T>
bool parse_int(const char* s, T lo, T hi, T& out) {
  const char* end = s + std::strlen(s);
  T v{};
  auto [p, ec] = std::from_chars(s, end, v);
  if (ec != std::errc() || p != end || s == end || v < lo || v > hi) return false;
  out = v;
  return true;
}

}  // namespace

bool read_config(const std::function<const char*(const char*)>& get, Config& out,
                 std::string& error) {
  Config c;
  auto bad = [&](const char* name, const char* v, const char* want) {
    error = std::string(name) + "='" + v + "' is not " + want;
    return false;
  };
  auto flag = [&](const char* name, bool& f) {
    const char* v = get(name);
    if (v == nullptr || *v == '\0') return true;
    if (std::strcmp(v, "0") == 0 || std::strcmp(v, "1") == 0) {
      f = *v == '1';
      return true;
    }
    return bad(name, v, "0 or 1");
  };
  if (const char* v = get("NETREDUCE_MPI_DEVICE")) c.device = v;
  if (const char* v = get("NETREDUCE_MPI_GID_INDEX"); v && *v)
    if (!parse_int(v, -1, 255, c.gid_index))
      return bad("NETREDUCE_MPI_GID_INDEX", v, "a GID index in -1..255");
  if (const char* v = get("NETREDUCE_MPI_MIN_BYTES"); v && *v)
    if (!parse_int<uint64_t>(v, 0, std::numeric_limits<uint64_t>::max(), c.min_bytes))
      return bad("NETREDUCE_MPI_MIN_BYTES", v, "a byte count");
  if (const char* v = get("NETREDUCE_MPI_TIMEOUT_MS"); v && *v)
    if (!parse_int(v, 1, std::numeric_limits<int>::max(), c.timeout_ms))
      return bad("NETREDUCE_MPI_TIMEOUT_MS", v, "a positive number of milliseconds");
  if (const char* v = get("NETREDUCE_MPI_LOCAL_SIZE"); v && *v)
    if (!parse_int(v, -1, 64, c.local_size) || c.local_size == 0)
      return bad("NETREDUCE_MPI_LOCAL_SIZE", v, "-1 (discovered) or 1..64");
  if (const char* v = get("NETREDUCE_MPI_QP_TIMEOUT"); v && *v)
    if (!parse_int(v, 1, 31, c.qp_timeout))
      return bad("NETREDUCE_MPI_QP_TIMEOUT", v, "an exponent in 1..31");
  if (!flag("NETREDUCE_MPI_FORCE_RING", c.force_ring) ||
      !flag("NETREDUCE_MPI_KEEP_RINGS", c.keep_rings) ||
      !flag("NETREDUCE_MPI_REQUIRE", c.require) || !flag("NETREDUCE_MPI_VERBOSE", c.verbose))
    return false;
  out = c;
  return true;
}

}  // namespace netreduce::mpi
