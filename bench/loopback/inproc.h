// netreduce-loopback's in-process mode: the box (the real Dataplane) runs in
// this process on net_ring ports wired to the generator's, and the phases
// (bench/loopback/sweep.h, bench/loopback/per_worker.h) run on lcores of
// their own while the box's control loop runs on the main lcore.
//
// Theory of operation
// -------------------
// Lcore 0 runs the box's control loop; box worker q runs on lcore 2q + 1 and
// its generator on lcore 2q + 2. CPU 0 takes the control loop and the
// generators, CPU 1 the box workers. Every generator port has one queue per
// box worker: generator q uses queue q of both ports, which the ring PMD
// wires to queue q of the box's ports. Generator 0 stops the box when its
// phase is over, and the box's run returns.
//
// Example. --workers 2: EAL --lcores 0@0,1@1,2@0,3@1,4@0; box workers on
// lcores 1 and 3, generators on lcores 2 (queue 0) and 4 (queue 1).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/loopback/generator.h"
#include "bench/loopback/options.h"

namespace netreduce::bench {

// The EAL arguments of the in-process mode (after the program name): no
// hugepages, no PCI, the lcores above, `prefix` as the file prefix.
std::vector<std::string> inproc_eal_args(unsigned workers, const std::string& prefix);

// Creates the ring ports (into ports.tx, ports.rx) and the box on the other
// ends, runs the phases against it, and fills the report's points (and
// "per_worker", "idle"); a phase's failure goes to `error`. Returns 0, or
// the exit status when the ports or the box cannot be set up (said on
// stderr).
int run_inproc(const Options& o, Ports& ports, nlohmann::json& report, std::string& error);

}  // namespace netreduce::bench
