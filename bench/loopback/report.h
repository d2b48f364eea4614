// netreduce-loopback's report: the JSON document (--json writes it), the
// result table printed from it on stdout, and the check that decides the
// exit status. The table is printed from the JSON alone, so it shows what the
// file holds.
//
// Example. A sweep point in the report:
//   {"ranks": 4, "payload": 1024, "dtype": "fp32", "msg_len": 4, "crc_ns": 30.1,
//    "forward": {...}, "aggregate": {..., "verified": {"good": 90112, "bad": 0,
//    ...}}, "box_ns_over_crc": 7.2, "ratio": {"pps": 0.11, ...}}
// prints as the table row "4   1024    fp32  | ... | 90112 good"; one bad
// frame anywhere prints "ERRORS" there and makes report_ok false (exit 1).
#pragma once

#include <nlohmann/json.hpp>

#include "bench/loopback/options.h"

namespace netreduce::bench {

// The report's head: mode, machine (CPU model, online CPUs, TSC rate) and
// the ring parameters common to every point. Needs g_hz set.
nlohmann::json report_head(const Options& o);

// The result table (the sweep's, or the per-worker phase's), then a line per
// point for --scrape-hz and --remove-mid-run, and one for the idle phase.
void print_report(const nlohmann::json& report, const Options& o);

// Every frame out right, none missing. With --remove-mid-run: every frame
// out right, some withheld (the ring was removed mid-message) and the box
// dropped packets of the retired ring instead of forwarding them. In the
// per-worker phase, also no packet dispatched between the box's workers.
bool report_ok(const nlohmann::json& report, bool removed_mid_run);

}  // namespace netreduce::bench
