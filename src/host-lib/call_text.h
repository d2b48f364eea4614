// The collectives' error texts (collective.cc, ina_path.cc, failover.cc):
// each is one fmt format string where it is raised, and the pieces they
// share are here, so the ring path, the INA path and failover name a
// neighbour, a completion's status or a list of causes the same way.
#pragma once

#include <fmt/format.h>

#include <chrono>
#include <string>
#include <string_view>
#include <utility>

#include "host-lib/transport.h"

namespace netreduce::host {

// An Error of `code` whose message is `text` (fmt's syntax) with `args`.
template <class... Args>
Error format_error(ErrorCode code, fmt::format_string<Args...> text, Args&&... args) {
  return Error::make(code, fmt::format(text, std::forward<Args>(args)...));
}

// This rank's neighbours on its ring, as errors name them: "predecessor
// rank 2", "successor rank 0".
inline std::string predecessor_rank(const Transport& t) {
  return fmt::format("predecessor rank {}", t.job_rank(t.predecessor()));
}
inline std::string successor_rank(const Transport& t) {
  return fmt::format("successor rank {}", t.job_rank(t.successor()));
}

// A failed completion's cause: "(<status name>, status <number>)".
inline std::string status_of(const Completion& c) {
  return fmt::format("({}, status {})", c.what, c.vendor_status);
}

// Appends `item` to a list of items (causes, ranks), `separator` between two.
inline void list_append(std::string& list, std::string_view item,
                        std::string_view separator = "; ") {
  if (!list.empty()) list += separator;
  list += item;
}

// Milliseconds since `start`, as text.
inline std::string ms_since(Clock::time_point start) {
  return fmt::format(
      "{}", std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count());
}

inline std::string hex(uint32_t v) { return fmt::format("0x{:x}", v); }

// A completion must belong to one of the communicator's rings (a transport
// that says otherwise is broken).
inline Error check_lane(const Completion& c, unsigned rings, const std::string& who) {
  if (c.lane < rings) return {};
  return format_error(ErrorCode::internal,
                      "{}completion of lane {} of a communicator with {} rings", who, c.lane,
                      rings);
}

}  // namespace netreduce::host
