// Snapshots of the workers' publications and the JSON reported about them
// (reports.h).
#include "dataplane/reports.h"

#include <rte_ethdev.h>
#include <unistd.h>

#include <chrono>
#include <string>

#include "engine/engine_json.h"

namespace netreduce::dataplane {

using nlohmann::json;

namespace {

// Telemetry puts both lists in one dict (telemetry_stats).
constexpr bool reason_names_distinct() {
  for (size_t a = 0; a < kReasonCount; ++a)
    for (size_t b = 0; b < engine::kReasonCount; ++b)
      if (to_string(static_cast<Reason>(a)) == engine::to_string(static_cast<engine::Reason>(b)))
        return false;
  return true;
}
static_assert(reason_names_distinct(), "a data plane reason has an engine reason's name");

}  // namespace

// This process's identity: pid and start time, fixed at start-up.
const std::string& instance_id() {
  static const std::string id =
      std::to_string(::getpid()) + "-" +
      std::to_string(std::chrono::duration_cast<std::chrono::nanoseconds>(
                         std::chrono::system_clock::now().time_since_epoch())
                         .count());
  return id;
}

std::vector<WorkerSnapshot> snapshots(Dataplane& dp) {
  std::vector<WorkerSnapshot> out(dp.workers().size());
  for (unsigned i = 0; i < out.size(); ++i) {
    double age = 0;
    bool answering = true;
    out[i].f = dp.read_published(i, age, &answering);
    out[i].age_ms = age;
    out[i].answering = answering;
  }
  return out;
}

RingSnapshot ring_snapshot(Dataplane& dp, unsigned w) {
  RingSnapshot r;
  dp.read_published(w, r.age_ms, &r.answering, &r.rings);
  return r;
}

// The data plane's own reasons (dataplane/reasons.h) as {name: count}.
json dataplane_reasons_json(const uint64_t (&c)[kReasonCount]) {
  json j = json::object();
  for (size_t r = 0; r < kReasonCount; ++r)
    j[std::string(to_string(static_cast<Reason>(r)))] = c[r];
  return j;
}

// Summed over port slots (one worker) or over workers and slots.
void add_reasons(uint64_t (&sum)[kReasonCount], const WorkerStats& ws) {
  for (unsigned slot = 0; slot < 2; ++slot)
    for (size_t r = 0; r < kReasonCount; ++r) sum[r] += ws.reasons[slot][r];
}

// The device's counters (rte_eth_stats: what the NIC or PMD counted; some
// virtual PMDs, e.g. memif in the server role, count nothing) and the box's
// own per-port counts summed over workers (box_*: what the workers received
// from and handed to the port, whatever the PMD reports).
json port_json(const Dataplane& dp, unsigned slot, const std::vector<WorkerSnapshot>* snaps) {
  uint64_t box_rx = 0, box_tx = 0;
  uint64_t box_reasons[kReasonCount] = {};
  if (snaps)
    for (const WorkerSnapshot& s : *snaps) {
      box_rx += s.f.stats.rx[slot];
      box_tx += s.f.stats.tx[slot];
      for (size_t r = 0; r < kReasonCount; ++r) box_reasons[r] += s.f.stats.reasons[slot][r];
    }
  rte_eth_stats st{};
  rte_eth_stats_get(dp.port_id(slot), &st);
  rte_eth_link link{};
  rte_eth_link_get_nowait(dp.port_id(slot), &link);
  json j = {{"name", dp.config().ports[slot].name},
            {"port_id", dp.port_id(slot)},
            {"link_up", link.link_status == RTE_ETH_LINK_UP},
            {"speed_mbps", link.link_speed},
            {"rx_packets", st.ipackets},
            {"tx_packets", st.opackets},
            {"rx_bytes", st.ibytes},
            {"tx_bytes", st.obytes},
            {"rx_missed", st.imissed},
            {"rx_errors", st.ierrors},
            {"tx_errors", st.oerrors}};
  if (snaps) {
    j["box_rx_packets"] = box_rx;
    j["box_tx_packets"] = box_tx;
    j["box_reasons"] = dataplane_reasons_json(box_reasons);
  }
  return j;
}

json stats_json(Dataplane& dp, const std::vector<WorkerSnapshot>& snaps) {
  engine::ReasonCounters sum{};
  uint64_t dp_sum[kReasonCount] = {};
  json workers = json::array();
  for (size_t i = 0; i < snaps.size(); ++i) {
    const WorkerSnapshot& s = snaps[i];
    for (size_t r = 0; r < sum.size(); ++r) sum[r] += s.f.reasons[r];
    const WorkerStats& ws = s.f.stats;
    uint64_t dp_worker[kReasonCount] = {};
    add_reasons(dp_worker, ws);
    add_reasons(dp_sum, ws);
    workers.push_back(
        {{"worker", i},
         {"lcore", dp.workers()[i]->lcore},
         {"published_age_ms", s.age_ms},
         {"answering", s.answering},
         {"rx_packets", {ws.rx[0], ws.rx[1]}},
         {"tx_packets", {ws.tx[0], ws.tx[1]}},
         {"rx_bytes", {ws.rx_bytes[0], ws.rx_bytes[1]}},
         {"tx_bytes", {ws.tx_bytes[0], ws.tx_bytes[1]}},
         {"dataplane_reasons", dataplane_reasons_json(dp_worker)},
         {"dispatched", ws.dispatched},
         {"busy_ratio", ws.total_cycles ? double(ws.busy_cycles) / double(ws.total_cycles) : 0.0},
         {"busy_cycles", ws.busy_cycles},
         {"total_cycles", ws.total_cycles},
         {"busy_polls", ws.busy_polls},
         {"idle_sleeps", ws.idle_sleeps},
         {"stalls", ws.stalls},
         {"stall_cycles", ws.stall_cycles},
         {"stall_rx_packets", ws.stall_rx},
         {"idle_sleep_ns", ws.idle_sleep_ns},
         {"rings", s.f.rings},
         {"retired_rings", s.f.retired},
         {"memory_bytes", s.f.memory},
         {"reasons", reasons_to_json(s.f.reasons)}});
  }
  return {{"reasons", reasons_to_json(sum)},
          {"dataplane_reasons", dataplane_reasons_json(dp_sum)},
          {"tsc_hz", rte_get_tsc_hz()},
          {"workers", workers},
          {"ports", {port_json(dp, 0, &snaps), port_json(dp, 1, &snaps)}}};
}

}  // namespace netreduce::dataplane
