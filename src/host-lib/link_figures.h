// The cost model's figures of a job's links (LinkFigures, netreduce.hpp):
// configured from the options, or measured at create on the job's own QPs.
//
// Measuring (path_choice model; every rank of the ring together, right
// after the probe):
//  - alpha: the median of 5 ring all-reduces of one int32, divided by their
//    2(P - 1) dependent steps: one hop's latency, the ring's per-step cost.
//  - box: the probe's time (create's one pass through the box, one int32
//    per ring) less one hop: what the box adds to a pass. No extra INA
//    call, so the box's counters see only the probe, as before.
//  - bandwidth: one ring all-reduce of 1 MiB: 2(P - 1) steps of 1 MiB / P
//    bytes each, their alpha taken off.
// The ring calls cross the box as ordinary traffic (forwarded).
// Example: P = 3, five 4-byte ring calls take 40, 41, 40, 43, 40 us: alpha
// = 40 / 4 = 10 us; a probe of 13 us gives box = 3 us; the 1 MiB call
// takes 440 us: 4 x 349,525 bytes in 440 - 40 us = 28 Gb/s.
// Rank 0's figures are everyone's (share_link_figures), so every rank's
// model makes the same choice for the same call. A figure the measurement
// cannot give (a negative difference) keeps its configured value.
#pragma once

#include <string>
#include <vector>

#include "host-lib/transport.h"
#include "netreduce/netreduce.hpp"

namespace netreduce::host {

class Collective;

// alpha = rtt_us / 2, link_gbps and box_us of the options.
LinkFigures configured_links(const Options& o);

// Measures `figures` (starting from configured values) on the collective's
// ring; probe_us: the probe's time through the box. world: the ring's
// ranks. Fails only with a call's error.
Error measure_links(Collective& c, unsigned world, double probe_us, Clock::time_point deadline,
                    LinkFigures& figures);

// The text every rank sends so that rank 0's figures and path choice become
// everyone's, and the reading of rank 0's (false: malformed).
std::string encode_links(PathChoice choice, const LinkFigures& f);
bool decode_links(const std::string& s, PathChoice& choice, LinkFigures& f);

}  // namespace netreduce::host
