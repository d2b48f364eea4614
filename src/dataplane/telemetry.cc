// DPDK telemetry for the data plane: /netreduce/stats (packet fates summed
// over workers: packets, the data plane's and the engine's reasons, idle
// sleeps) and /netreduce/rings (installed ring ids). Both read the workers'
// publications (no command), on DPDK's telemetry thread.
#include <rte_telemetry.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include "dataplane/reports.h"

namespace netreduce::dataplane {

namespace {

// The telemetry thread outlives the Dataplane: callbacks announce themselves
// in `g_telemetry_inflight` before reading the pointer, and shutdown clears
// the pointer and then waits for the count to drain (both seq_cst).
std::atomic<Dataplane*> g_telemetry_dp{nullptr};
std::atomic<int> g_telemetry_inflight{0};

struct TelemetryCall {
  Dataplane* dp;
  TelemetryCall() : dp((++g_telemetry_inflight, g_telemetry_dp.load())) {}
  ~TelemetryCall() { --g_telemetry_inflight; }
};

int telemetry_stats(const char*, const char*, rte_tel_data* d) {
  TelemetryCall call;
  if (!call.dp) return -1;
  const std::vector<WorkerSnapshot> snaps = snapshots(*call.dp);
  engine::ReasonCounters sum{};
  // Summed over workers: packets, the data plane's own reasons
  // (dataplane/reasons.h), and the idle rule's sleeps.
  uint64_t rx = 0, tx = 0, dispatched = 0, sleeps = 0, slept_ns = 0;
  uint64_t dp_sum[kReasonCount] = {};
  for (const auto& s : snaps) {
    for (size_t r = 0; r < sum.size(); ++r) sum[r] += s.f.reasons[r];
    const WorkerStats& ws = s.f.stats;
    rx += ws.rx[0] + ws.rx[1];
    tx += ws.tx[0] + ws.tx[1];
    add_reasons(dp_sum, ws);
    dispatched += ws.dispatched;
    sleeps += ws.idle_sleeps;
    slept_ns += ws.idle_sleep_ns;
  }
  rte_tel_data_start_dict(d);
  rte_tel_data_add_dict_u64(d, "rx_packets", rx);
  rte_tel_data_add_dict_u64(d, "tx_packets", tx);
  rte_tel_data_add_dict_u64(d, "dispatched", dispatched);
  rte_tel_data_add_dict_u64(d, "idle_sleeps", sleeps);
  rte_tel_data_add_dict_u64(d, "idle_sleep_ns", slept_ns);
  // The data plane's reasons and the engine's share one dict: the names differ.
  for (size_t r = 0; r < kReasonCount; ++r)
    rte_tel_data_add_dict_u64(d, std::string(to_string(static_cast<Reason>(r))).c_str(), dp_sum[r]);
  for (size_t r = 0; r < sum.size(); ++r)
    rte_tel_data_add_dict_u64(
        d, std::string(engine::to_string(static_cast<engine::Reason>(r))).c_str(), sum[r]);
  return 0;
}

int telemetry_rings(const char*, const char*, rte_tel_data* d) {
  TelemetryCall call;
  if (!call.dp) return -1;
  rte_tel_data_start_array(d, RTE_TEL_INT_VAL);
  for (unsigned w = 0; w < call.dp->workers().size(); ++w)
    for (const auto& r : ring_snapshot(*call.dp, w).rings)
      rte_tel_data_add_array_int(d, static_cast<int>(r.ring_id));
  return 0;
}

}  // namespace

void telemetry_start(Dataplane* dp) {
  g_telemetry_dp.store(dp);
  rte_telemetry_register_cmd("/netreduce/stats", telemetry_stats,
                             "netreduce: packet fates summed over workers");
  rte_telemetry_register_cmd("/netreduce/rings", telemetry_rings, "netreduce: installed ring ids");
}

void telemetry_stop() {
  g_telemetry_dp.store(nullptr);
  while (g_telemetry_inflight.load() != 0)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

}  // namespace netreduce::dataplane
