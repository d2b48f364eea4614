// JSON forms of the engine's counters and ring reports (reasons by name,
// a ring's spec, counters and state), for the data plane's control socket
// and telemetry. Above both the engine and common/ring_json.h: neither of
// them includes this.
#pragma once

#include <nlohmann/json.hpp>

#include "engine/engine.h"

namespace netreduce {

nlohmann::json reasons_to_json(
    const engine::ReasonCounters& c);  // {"bad_icrc": 3, ...}, every reason
nlohmann::json ring_info_to_json(const engine::RingInfo& info);  // spec + counters + state

}  // namespace netreduce
