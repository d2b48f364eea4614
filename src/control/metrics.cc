#include "control/metrics.h"

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <string_view>

#include "dataplane/reasons.h"
#include "engine/reasons.h"

namespace netreduce::control {

using nlohmann::json;
using prometheus::Labels;

namespace {

double num(const json& j, const char* key) {
  if (!j.is_object() || !j.contains(key) || !j[key].is_number()) return 0;
  return j[key].get<double>();
}

class Builder {
 public:
  // A counter family; set(labels, value) records one series.
  auto& counter(const std::string& name, const std::string& help) {
    return prometheus::BuildCounter().Name(name).Help(help).Register(reg_);
  }
  auto& gauge(const std::string& name, const std::string& help) {
    return prometheus::BuildGauge().Name(name).Help(help).Register(reg_);
  }
  std::string text() const { return prometheus::TextSerializer().Serialize(reg_.Collect()); }

 private:
  prometheus::Registry reg_;
};

void set(prometheus::Family<prometheus::Counter>& f, const Labels& l, double v) {
  f.Add(l).Increment(v);
}
void set(prometheus::Family<prometheus::Gauge>& f, const Labels& l, double v) { f.Add(l).Set(v); }

const char* fate_name(engine::Fate f) {
  return f == engine::Fate::forward     ? "forward"
         : f == engine::Fate::aggregate ? "aggregate"
                                        : "drop";
}

// One series per reason of an X-macro list (engine/reasons.h,
// dataplane/reasons.h), labelled with its fate; `counts` is {name: count}.
template <typename Reason, size_t kCount>
void reason_series(prometheus::Family<prometheus::Counter>& f, const json& counts) {
  for (size_t r = 0; r < kCount; ++r) {
    const auto reason = static_cast<Reason>(r);
    const std::string name(to_string(reason));
    set(f, {{"fate", fate_name(fate_of(reason))}, {"reason", name}}, num(counts, name.c_str()));
  }
}

}  // namespace

std::string render_metrics(const MetricsInput& in) {
  Builder b;
  // The daemon.
  set(b.gauge("netreduce_dataplane_up", "1 if the daemon reaches the data plane's control socket"),
      {}, in.dataplane_up ? 1 : 0);
  set(b.counter("netreduce_dataplane_connections_total",
                "connections the daemon made to the data plane's control socket"),
      {}, static_cast<double>(in.connects));
#define NETREDUCE_X(name, series, help) \
  set(b.counter(series, help), {}, static_cast<double>(in.counters.name));
  NETREDUCE_DAEMON_COUNTERS(NETREDUCE_X)
#undef NETREDUCE_X
  set(b.gauge("netreduce_rings_configured", "rings in the daemon's persisted state"), {},
      static_cast<double>(in.configured_rings));
  set(b.gauge("netreduce_rings_leased", "configured rings with a lease (removed unless renewed)"),
      {}, static_cast<double>(in.leased_rings));
  set(b.gauge("netreduce_fabric_pending",
              "fabric entries this origin has not yet published in etcd or seen installed"),
      {}, static_cast<double>(in.fabric_pending));
  set(b.gauge("netreduce_rings_max", "quotas.max_rings"), {}, static_cast<double>(in.max_rings));
  set(b.gauge("netreduce_rings_configured_memory_bytes",
              "worst-case engine memory of the configured rings (deterministic mode)"),
      {}, static_cast<double>(in.configured_memory));
  set(b.gauge("netreduce_rings_max_memory_bytes", "quotas.max_memory"), {},
      static_cast<double>(in.max_memory));
  set(b.gauge("netreduce_metrics_cache_age_seconds",
              "age of the data plane figures below (refreshed every metrics.refresh_interval_ms)"),
      {}, in.cache_age_seconds);
  set(b.gauge("netreduce_metrics_refresh_success",
              "1 if the last metrics refresh reached the data plane"),
      {}, in.cache_fresh ? 1 : 0);
  set(b.gauge("netreduce_http_connections_open", "HTTP connections open (all states)"), {},
      static_cast<double>(in.http.open_connections));
  set(b.counter("netreduce_http_connections_accepted_total", "HTTP connections accepted"), {},
      static_cast<double>(in.http.accepted));
  auto& refused = b.counter("netreduce_http_refused_total",
                            "HTTP connections and requests the front end refused, by reason");
  for (const auto& [reason, n] : in.http.refused)
    set(refused, {{"reason", reason}}, static_cast<double>(n));
  if (!in.dataplane_up) return b.text();

  // Engine packet fates, summed over lcores.
  reason_series<engine::Reason, engine::kReasonCount>(
      b.counter("netreduce_packets_total",
                "packets by engine fate (forward, aggregate, drop) and reason"),
      in.stats.value("reasons", json::object()));
  // The data plane's own reasons (dataplane/reasons.h), summed over lcores.
  reason_series<dataplane::Reason, dataplane::kReasonCount>(
      b.counter("netreduce_dataplane_packets_total",
                "packets the data plane dropped or passed on untouched before the engine saw "
                "them, by fate and reason"),
      in.stats.value("dataplane_reasons", json::object()));
  // Injected faults in force (dataplane/faults.h): a rehearsal, or a
  // forgotten one, shows on dashboards and can be alerted on.
  auto& faults = b.gauge("netreduce_dataplane_faults_active",
                         "1 for each ring with an injected fault in force, by ring and kind "
                         "(drop, duplicate, reorder, bypass)");
  for (const json& f : in.stats.value("faults", json::array()))
    set(faults, {{"ring", std::to_string(f.value("ring", 0u))}, {"kind", f.value("kind", "")}}, 1);

  // Ports.
  auto& rx_p = b.counter("netreduce_port_received_packets_total", "packets received by the port");
  auto& tx_p = b.counter("netreduce_port_transmitted_packets_total", "packets sent by the port");
  auto& rx_b = b.counter("netreduce_port_received_bytes_total", "bytes received by the port");
  auto& tx_b = b.counter("netreduce_port_transmitted_bytes_total", "bytes sent by the port");
  auto& drops = b.counter("netreduce_port_dropped_packets_total",
                          "packets the port lost: rx_missed (no RX descriptor), rx_errors, "
                          "tx_errors (NIC), tx_full (TX queue full, dropped by the box)");
  auto& box_rx = b.counter("netreduce_port_box_received_packets_total",
                           "packets the box's workers took from the port (counted by the box, "
                           "not the NIC; some virtual PMDs count nothing in the device counters)");
  auto& box_tx = b.counter("netreduce_port_box_transmitted_packets_total",
                           "packets the box's workers handed to the port for transmission");
  auto& link = b.gauge("netreduce_port_link_up", "1 if the port's link is up");
  const json ports = in.stats.value("ports", json::array());
  const json workers = in.stats.value("workers", json::array());
  for (size_t i = 0; i < ports.size(); ++i) {
    const json& p = ports[i];
    const Labels l{{"port", p.value("name", std::to_string(i))}};
    set(rx_p, l, num(p, "rx_packets"));
    set(tx_p, l, num(p, "tx_packets"));
    set(rx_b, l, num(p, "rx_bytes"));
    set(tx_b, l, num(p, "tx_bytes"));
    set(box_rx, l, num(p, "box_rx_packets"));
    set(box_tx, l, num(p, "box_tx_packets"));
    const double tx_full = num(p.value("box_reasons", json::object()), "tx_full");
    set(drops, {{"port", l.at("port")}, {"reason", "rx_missed"}}, num(p, "rx_missed"));
    set(drops, {{"port", l.at("port")}, {"reason", "rx_errors"}}, num(p, "rx_errors"));
    set(drops, {{"port", l.at("port")}, {"reason", "tx_errors"}}, num(p, "tx_errors"));
    set(drops, {{"port", l.at("port")}, {"reason", "tx_full"}}, tx_full);
    set(link, l, p.value("link_up", false) ? 1 : 0);
  }

  // Worker lcores.
  auto& busy =
      b.gauge("netreduce_lcore_busy_ratio",
              "share of the worker lcore's cycles spent on bursts with packets, since start");
  auto& lmem = b.gauge("netreduce_lcore_engine_memory_bytes",
                       "engine memory in use on the worker lcore (cells, tables)");
  auto& disp = b.counter("netreduce_lcore_dispatched_packets_total",
                         "packets the lcore handed to another lcore's ring owner");
  auto& ddrop = b.counter("netreduce_lcore_dispatch_dropped_packets_total",
                          "packets dropped because another lcore's inbox was full");
  auto& slept = b.counter("netreduce_lcore_idle_sleep_seconds_total",
                          "time the worker lcore slept because it had no traffic (adaptive "
                          "polling, idle_sleep_max_us)");
  auto& stalls = b.counter("netreduce_lcore_stalls_total",
                           "busy polls of the worker lcore that took over 100 us: it was "
                           "preempted or interrupted (the lcore is not isolated)");
  for (const json& w : workers) {
    const Labels l{{"lcore", std::to_string(w.value("lcore", 0u))}};
    set(busy, l, num(w, "busy_ratio"));
    set(stalls, l, num(w, "stalls"));
    set(lmem, l, num(w, "memory_bytes"));
    set(disp, l, num(w, "dispatched"));
    set(ddrop, l, num(w.value("dataplane_reasons", json::object()), "inbox_full"));
    set(slept, l, num(w, "idle_sleep_ns") / 1e9);
  }

  // Memory.
  const json mem = in.status.value("memory", json::object());
  const json mbufs = in.status.value("mbufs", json::object());
  set(b.gauge("netreduce_engine_memory_reserved_bytes",
              "engine memory reserved by installed rings"),
      {}, num(mem, "engine_reserved_bytes"));
  set(b.gauge("netreduce_engine_memory_budget_bytes", "memory.engine: what all rings may reserve"),
      {}, num(mem, "engine_budget_bytes"));
  set(b.gauge("netreduce_mbufs_in_use", "packet buffers in use (held packets included)"), {},
      num(mbufs, "in_use"));
  set(b.gauge("netreduce_mbufs", "packet buffers in the pool"), {}, num(mbufs, "total"));

  // Rings.
  auto& r_pk = b.counter("netreduce_ring_aggregated_packets_total",
                         "packets of the ring taken into aggregator cells");
  auto& r_by = b.counter("netreduce_ring_aggregated_bytes_total",
                         "payload bytes of the ring taken into aggregator cells");
  auto& r_msg =
      b.counter("netreduce_ring_messages_completed_total", "messages whose every cell completed");
  auto& r_seal = b.counter("netreduce_ring_messages_sealed_total",
                           "message results sealed with the box's digest (released or served)");
  auto& r_cell = b.counter("netreduce_ring_cells_completed_total",
                           "cells that collected every rank and were released");
  auto& r_rtx = b.counter("netreduce_ring_retransmissions_served_total",
                          "retransmissions answered from a completed cell's stored result");
  auto& r_rb = b.counter("netreduce_ring_connections_rebound_total",
                         "connections re-bound to the ring (a rank's new QP)");
  auto& r_drop =
      b.counter("netreduce_ring_dropped_packets_total", "packets of the ring dropped, by reason");
  auto& r_held = b.gauge("netreduce_ring_held_packets", "packets held in the ring's open cells");
  auto& r_hb = b.gauge("netreduce_ring_held_bytes", "bytes held in the ring's cells");
  auto& r_mem =
      b.gauge("netreduce_ring_memory_reserved_bytes", "engine memory reserved for the ring");
  auto& r_open = b.gauge("netreduce_ring_open_cells", "cells collecting (some ranks arrived)");
  auto& r_stall = b.gauge("netreduce_ring_stalled_cells",
                          "open cells collecting for longer than engine.stall_timeout_ms");
  auto& r_ranks = b.gauge("netreduce_ring_ranks", "members of the ring");
  auto& r_worker = b.gauge("netreduce_ring_worker",
                           "the box worker (lcore index in dataplane.workers) that runs the ring; "
                           "a job's striped rings run on different workers");
  // A tree node's box-to-box counters (engine::TreeCounters), rings with a tree only.
  static constexpr std::pair<const char*, const char*> kTree[] = {
      {"partials_sent", "partials sent up to the parent box (first copy of each cell)"},
      {"partials_resent", "partials sent up again (a resend reached a cell awaiting its result)"},
      {"partials_received", "partials taken from child boxes into cells"},
      {"results_received", "results from the parent box, delivered"},
      {"results_sent", "results sent down to child boxes"},
      {"results_resent", "results sent again to a child box whose partial reached a complete cell"},
      {"queries_sent", "queries sent to child boxes missing from a cell"},
      {"finals_sent", "results sent up from a complete cell (a query's answer)"},
      {"finals_received", "finals from child boxes, delivered"}};
  std::vector<prometheus::Family<prometheus::Counter>*> r_tree;
  for (const auto& [name, help] : kTree)
    r_tree.push_back(&b.counter("netreduce_ring_tree_" + std::string(name) + "_total",
                                std::string("box-to-box: ") + help));
  double held_total = 0;
  for (const json& r : in.rings) {
    const json spec = r.value("spec", json::object());
    const Labels l{{"ring", std::to_string(spec.value("id", 0u))}};
    const json c = r.value("counters", json::object());
    set(r_pk, l, num(c, "packets_aggregated"));
    set(r_by, l, num(c, "bytes_aggregated"));
    set(r_msg, l, num(c, "messages_completed"));
    set(r_seal, l, num(c, "messages_sealed"));
    set(r_cell, l, num(c, "cells_completed"));
    set(r_rtx, l, num(c, "retransmissions_served"));
    set(r_rb, l, num(c, "connections_rebound"));
    const json c_drops = c.value("drops", json::object());
    for (const auto& [reason, v] : c_drops.items())
      set(r_drop, {{"ring", l.at("ring")}, {"reason", reason}},
          v.is_number() ? v.get<double>() : 0);
    set(r_held, l, num(r, "held_packets"));
    set(r_hb, l, num(r, "held_bytes"));
    set(r_mem, l, num(r, "memory_bytes"));
    set(r_open, l, num(r, "open_cells"));
    set(r_stall, l, num(r, "stalled_cells"));
    set(r_ranks, l, static_cast<double>(spec.value("members", json::array()).size()));
    if (r.contains("worker")) set(r_worker, l, num(r, "worker"));
    held_total += num(r, "held_bytes");
    if (c.contains("tree") && c["tree"].is_object())
      for (size_t i = 0; i < r_tree.size(); ++i) set(*r_tree[i], l, num(c["tree"], kTree[i].first));
  }
  set(b.gauge("netreduce_cell_memory_held_bytes",
              "bytes of packets held in aggregator cells, all rings"),
      {}, held_total);
  return b.text();
}

}  // namespace netreduce::control
