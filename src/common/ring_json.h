// JSON forms of a ring spec and of a Status: one codec for the data plane's
// control socket, the control daemon's HTTP API, the CLI and the host
// library. The engine's counters have theirs in engine/engine_json.h.
//
// A ring spec:
//   {"id": 7, "members": ["10.0.0.1", "10.0.0.2", ...],     rank = index
//    "msg_len": 64, "window": 8, "payload_bytes": 4096,
//    "dtypes": ["fp32", "bf16"], "ops": ["sum"],             optional: all allowed
//    "memory_quota": 0,                                      optional, bytes
//    "qpns": [17, 17, 18, ...]}                              optional: rank -> its receiving
//                                                            QP number (ring_spec.h)
// "members" may also be [{"rank": 0, "address": "10.0.0.1"}, ...] with every
// rank 0..P-1 exactly once. Decoding validates types and names the field at
// fault, and validate_fields (common/ring_spec.h) checks the values; the
// memory quota against the ring's needs is the engine's check
// (engine::validate), made where a ring is admitted (daemon, data plane).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "common/ring_spec.h"
#include "common/status.h"

namespace netreduce {

std::string ipv4_to_string(uint32_t addr);
// Strict dotted quad: exactly four decimal numbers 0..255 separated by dots,
// over the whole string. Refused: leading zeros ("010", which inet_aton reads
// as octal 8 and inet_pton refuses: ambiguous, so never accepted), fewer or
// more parts, signs, spaces, an embedded NUL or any byte after the address.
// addr is in host order.
bool ipv4_from_string(std::string_view s, uint32_t& addr);

nlohmann::json ring_to_json(const RingSpec& spec);
Status ring_from_json(const nlohmann::json& j, RingSpec& out);

nlohmann::json status_to_json(const Status& s);  // {"code": ..., "field": ..., "message": ...}

// json::dump with invalid UTF-8 replaced (U+FFFD) instead of thrown: every
// reply that may quote outside input (a parse error, a field) goes through it.
std::string dump_json(const nlohmann::json& j);

}  // namespace netreduce
