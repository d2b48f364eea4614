// What the control side reports about the workers: snapshots of their
// publications (Published, lcore.h; no command) and the JSON the control
// socket, DPDK telemetry and the final report print. Control thread and
// DPDK telemetry's thread; nothing here touches a worker's state.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "dataplane/dataplane.h"

namespace netreduce::dataplane {

// One worker's figures as published, and how fresh they are.
struct WorkerSnapshot {
  WorkerFigures f;
  double age_ms = 0;      // how old the published figures are (0: fresh)
  bool answering = true;  // false: the worker missed a deadline and has published nothing since
};
// Every worker's counters, read from its publication (no command): a worker
// that does not publish in time shows its last figures and their age.
std::vector<WorkerSnapshot> snapshots(Dataplane& dp);

// One worker's ring figures as read_published gives them (rings: true).
struct RingSnapshot {
  std::vector<engine::RingFigures> rings;
  double age_ms = 0;
  bool answering = true;
};
RingSnapshot ring_snapshot(Dataplane& dp, unsigned w);

// The data plane's own reasons (dataplane/reasons.h) as {name: count}.
nlohmann::json dataplane_reasons_json(const uint64_t (&c)[kReasonCount]);
// Summed over port slots (one worker) into `sum`.
void add_reasons(uint64_t (&sum)[kReasonCount], const WorkerStats& ws);
// A port's device counters, plus the workers' per-port counts if `snaps`.
nlohmann::json port_json(const Dataplane& dp, unsigned slot,
                         const std::vector<WorkerSnapshot>* snaps = nullptr);
// The stats reply (without "ok" and "retiring").
nlohmann::json stats_json(Dataplane& dp, const std::vector<WorkerSnapshot>& snaps);

// This process's identity: pid and start time, fixed at the first call
// (run() makes it at start-up). The daemon's restart detector.
const std::string& instance_id();

// DPDK telemetry (telemetry.cc): /netreduce/stats and /netreduce/rings read
// `dp` from start until stop returns (which waits for calls in flight).
void telemetry_start(Dataplane* dp);
void telemetry_stop();

}  // namespace netreduce::dataplane
