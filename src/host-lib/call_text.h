// Small pieces of the collectives' error texts, shared by the INA path
// (ina_path.cc) and the ring path (collective.cc).
#pragma once

#include <chrono>
#include <cstdio>
#include <string>

#include "host-lib/transport.h"

namespace netreduce::host {

// Milliseconds since `start`, as text.
inline std::string ms_since(Clock::time_point start) {
  return std::to_string(
      std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count());
}

inline std::string hex(uint32_t v) {
  char b[16];
  std::snprintf(b, sizeof b, "0x%x", v);
  return b;
}

// A completion must belong to one of the communicator's rings (a transport
// that says otherwise is broken).
inline Error check_lane(const Completion& c, unsigned rings, const std::string& who) {
  if (c.lane < rings) return {};
  return Error::make(ErrorCode::internal, who + "completion of lane " + std::to_string(c.lane) +
                                              " of a communicator with " + std::to_string(rings) +
                                              " rings");
}

}  // namespace netreduce::host
