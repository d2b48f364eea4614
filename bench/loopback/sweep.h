// The loopback benchmark's sweep over points (P, payload, dtype), and the
// idle phase that follows it in process.
//
// Theory of operation
// -------------------
// Every point is measured twice on the same ports in the same run
// (bench/loopback/measure.h): first with the box in forward-only mode (the
// baseline: same burst loop, no INA processing) and without the ring, since
// the box refuses forward mode while any ring is installed or retiring; then
// in aggregate mode with the point's ring installed. The ring is removed
// after the point and its retirement waited out, so the next point installs
// the same id afresh.
//
// Example. --ranks 2,4 --payloads 1024 --dtypes fp32,bf16 gives four points,
// (2, 1024, fp32), (2, 1024, bf16), (4, 1024, fp32), (4, 1024, bf16), each
// with "forward", "aggregate" and "ratio" (aggregate over forward) in the
// report.
#pragma once

#include <nlohmann/json.hpp>

#include "bench/loopback/box_client.h"
#include "bench/loopback/generator.h"
#include "bench/loopback/options.h"

namespace netreduce::bench {

// The whole sweep; returns the report's points.
nlohmann::json sweep(const Options& o, const Ports& ports);

// The idle phase (inproc): the box with a ring installed and no traffic for
// o.idle_seconds; each worker's CPU share from the kernel's accounting of its
// thread (and the time the box says it slept), then one message through the
// box right after the idle period: verified, and its latency (what the idle
// sleep adds to the first packets after a pause).
nlohmann::json idle_phase(const Options& o, const Ports& ports, Box& box);

}  // namespace netreduce::bench
