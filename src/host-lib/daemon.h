// Registration of a job's ring with the control daemon (/work/api-contract.md,
// src/control): POST /v1/rings with the ring JSON of common/ring_json.h,
// bearer token; then GET /v1/rings/{id} until it reports "installed": true
// (the data plane has it), within the deadline. Anything else (no daemon
// configured, no answer, a non-2xx answer, never installed) means the ring
// path, and `reason` says which.
#pragma once

#include <string>

#include "engine/ring.h"
#include "netreduce/netreduce.hpp"

namespace netreduce::host {

struct DaemonTarget {
  std::string url;    // "http://host:port"; empty = no box configured
  std::string token;  // may be empty
  std::string error;  // a problem finding the token (reported as the reason)
};

// Options first, then NETREDUCE_DAEMON, NETREDUCE_TOKEN, NETREDUCE_TOKEN_FILE.
DaemonTarget daemon_target(const Options& options);

struct Registration {
  bool installed = false;
  std::string reason;
};

Registration register_ring(const DaemonTarget& target, const engine::RingSpec& spec,
                           int timeout_ms);

}  // namespace netreduce::host
