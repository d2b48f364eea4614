// netreduce-loopback's in-process mode: the box (the real Dataplane) runs in
// this process on net_ring ports wired to the generator's, and the phases
// (bench/loopback/sweep.h, bench/loopback/per_worker.h) run on lcores of
// their own while the box's control loop runs on the main lcore.
//
// Theory of operation
// -------------------
// Lcore 0 runs the box's control loop on CPU 0; box worker q runs on lcore
// 2q + 1 and its generator on lcore 2q + 2. On 2 CPUs, CPU 0 takes the
// control loop and the generators, CPU 1 the box workers. On more, the box
// workers take CPUs 1, 2, ... and the generators the CPUs after them, round
// the CPUs 1..n-1 and then 0 again: each thread has a CPU of its own while
// 2W + 1 <= n; past that the generators share the box workers' CPUs (and
// CPU 0), and from W = n the box workers share CPUs too.
// Every generator port has one queue per box worker: generator q uses queue
// q of both ports, which the ring PMD wires to queue q of the box's ports.
// Generator 0 stops the box when its phase is over, and the box's run
// returns.
//
// Example. --workers 2 on 2 CPUs: EAL --lcores 0@0,1@1,2@0,3@1,4@0; on 16
// CPUs: 0@0,1@1,2@3,3@2,4@4 (box workers on CPUs 1 and 2, generators on 3
// and 4; generator 0 on lcore 2, queue 0).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/loopback/generator.h"
#include "bench/loopback/options.h"

namespace netreduce::bench {

// The CPUs this process may run on (its affinity mask), at least one.
std::vector<unsigned> usable_cpus();

// The CPU of each lcore 0..2W above, `cpus` being the usable ones (CPU 0
// above is the first of them, CPU 1 the second, ...).
std::vector<unsigned> inproc_cpus(unsigned workers, const std::vector<unsigned>& cpus);

// The EAL arguments of the in-process mode (after the program name): no
// hugepages, no PCI, lcore l on CPU place[l] (inproc_cpus), `prefix` as the
// file prefix.
std::vector<std::string> inproc_eal_args(const std::vector<unsigned>& place,
                                         const std::string& prefix);

// Creates the ring ports (into ports.tx, ports.rx) and the box on the other
// ends, runs the phases against it, and fills the report's points (and
// "per_worker", "idle"); a phase's failure goes to `error`. Returns 0, or
// the exit status when the ports or the box cannot be set up (said on
// stderr).
int run_inproc(const Options& o, Ports& ports, nlohmann::json& report, std::string& error);

}  // namespace netreduce::bench
