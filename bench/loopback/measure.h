// One measurement of the box in one mode, and where its figures come from:
// the generator's counts (bench/loopback/generator.h), the box's worker
// counters, the kernel's accounting of the box's threads, and a hot CRC-32
// as the unit of the box's cost per packet.
//
// Theory of operation
// -------------------
// A measurement is a warm-up round (checked, not timed), timed rounds until
// --seconds have passed (at least two), then latency at light load: one
// message of every worker at a time, --latency-rounds times. Figures: packet
// and bit rates in and out (wall clock), goodput (one copy of each completed
// message's tensor data per second), the box's own cost per packet from its
// workers' busy cycles (so "Mpps per lcore" is what one box lcore sustains,
// whatever the generator's speed), busy ratio, and latency p50 and p99.
//
// Example. 9,000,000 busy cycles over 40,000 packets at 3 GHz is 225 cycles
// or 75 ns per packet: box_ns_per_packet 75, box_mpps_per_lcore 13.3; against
// a 1 KB CRC-32 of 30 ns, box_ns_over_crc is 2.5.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "bench/loopback/box_client.h"
#include "bench/loopback/generator.h"
#include "bench/loopback/options.h"
#include "bench/loopback/traffic.h"

namespace netreduce::bench {

// The box's worker counters, summed: (busy cycles, packets received, per-worker busy).
struct BoxSample {
  uint64_t busy = 0, packets = 0, busy_polls = 0;
  std::vector<uint64_t> busy_w, total_w, packets_w;
  std::vector<uint64_t> stalls_w, stall_cycles_w, stall_rx_w;  // polls over 100 us (preempted)
};
BoxSample sample(Box& box);

// One measurement of one mode (the box is in that mode already). `next` is
// the first message index to use. With --remove-mid-run (aggregate only) the
// ring is removed halfway through the first timed round, and the measurement
// ends with that round: every frame released until then must be right, and
// none may come out after.
Figures measure(const Options& o, const Ports& ports, const Traffic& t, Box& box, bool aggregated,
                uint64_t& next);

// A measurement's figures as the report's JSON object.
nlohmann::json figures_json(const Figures& f, const Traffic& t);

// One CRC-32 of `bytes` payload bytes, hot, in ns: the unit the box's cost
// per packet is compared with (the bytes a packet must touch at least once).
double crc_ns(unsigned bytes);

// CPU time (utime + stime, ns) of this process's threads with the given
// names (DPDK names an lcore's thread rte-worker-<lcore>), by name.
std::map<std::string, uint64_t> worker_cpu_ns(const std::set<std::string>& names);

}  // namespace netreduce::bench
