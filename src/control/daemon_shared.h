// What the daemon's files (daemon*.cc) share about ring records: how one is
// installed, named and compared with a data plane's report. Not part of
// Daemon's interface (control/daemon.h).
#pragma once

#include <chrono>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "control/state.h"

namespace netreduce::control {

using SteadyClock = std::chrono::steady_clock;

// Two specs describe the same ring. Compared in their JSON form, where an
// omitted dtype/op list (mask 0, "all") and the full list are the same thing.
bool same_spec(const engine::RingSpec& a, const engine::RingSpec& b);

// "ring <id>", for messages.
std::string id_text(uint32_t id);

// The data plane's install_ring for a record: its tree node inside the spec.
nlohmann::json install_cmd(const RingRecord& rec);

// A ring reply's "installed": this box's part (true at an origin that holds
// none) and, at a fabric ring's origin, every peer's entry accepted and
// installed there, so the host library's wait for "installed" covers the
// whole tree. "fabric.installed_here" keeps this box's own part.
void set_installed(nlohmann::json& j, bool here, const RingRecord& rec);

// A data plane ring report ({"spec": ring JSON + "tree", ...}) is this
// record, installed. The report's tree names its key by key_id only: the
// tree is compared as the report writes it.
bool installed_as(const nlohmann::json& r, const RingRecord& rec);

}  // namespace netreduce::control
