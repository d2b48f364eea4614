#include "control/metrics.h"

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dataplane/reasons.h"
#include "engine/reasons.h"

namespace netreduce::control {

using nlohmann::json;
using prometheus::Labels;

namespace {

// The number at `path` in j ("a/b": j["a"]["b"]); 0 if there is none.
double num(const json& j, const char* path) {
  const json* at = &j;
  for (std::string_view rest = path;;) {
    const size_t slash = rest.find('/');
    if (!at->is_object()) return 0;
    const auto it = at->find(std::string(rest.substr(0, slash)));
    if (it == at->end()) return 0;
    at = &*it;
    if (slash == std::string_view::npos) break;
    rest.remove_prefix(slash + 1);
  }
  return at->is_number() ? at->get<double>() : 0;
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

enum class Kind { counter, gauge };

// A series that each port, lcore or ring of the data plane's replies has:
// the number at `path` of its object (num()), divided by `divisor`, in
// family `name`. The rows of one family follow each other, the first with
// its help; `reason`, where given, labels the series within the family.
struct Series {
  Kind kind;
  const char* name;
  const char* help;
  const char* path;
  const char* reason = nullptr;
  double divisor = 1;
};

// The families of a table of Series, registered in its order when it is
// made; write() sets one item's series.
class SeriesTable {
 public:
  SeriesTable(Builder& b, std::span<const Series> rows) : rows_(rows) {
    for (size_t i = 0; i < rows.size(); ++i) {
      const Series& s = rows[i];
      if (i > 0 && std::string_view(s.name) == rows[i - 1].name)
        families_.push_back(families_.back());
      else if (s.kind == Kind::counter)
        families_.push_back({&b.counter(s.name, s.help), nullptr});
      else
        families_.push_back({nullptr, &b.gauge(s.name, s.help)});
    }
  }

  void write(const json& item, const Labels& labels) const {
    for (size_t i = 0; i < rows_.size(); ++i) {
      Labels l = labels;
      if (rows_[i].reason) l.emplace("reason", rows_[i].reason);
      const double v = num(item, rows_[i].path) / rows_[i].divisor;
      if (families_[i].counter)
        set(*families_[i].counter, l, v);
      else
        set(*families_[i].gauge, l, v);
    }
  }

 private:
  struct Family {
    prometheus::Family<prometheus::Counter>* counter;
    prometheus::Family<prometheus::Gauge>* gauge;
  };
  const std::span<const Series> rows_;
  std::vector<Family> families_;
};

// Each port's, from stats "ports", labelled by port.
constexpr Series kPortSeries[] = {
    {Kind::counter, "netreduce_port_received_packets_total", "packets received by the port",
     "rx_packets"},
    {Kind::counter, "netreduce_port_transmitted_packets_total", "packets sent by the port",
     "tx_packets"},
    {Kind::counter, "netreduce_port_received_bytes_total", "bytes received by the port",
     "rx_bytes"},
    {Kind::counter, "netreduce_port_transmitted_bytes_total", "bytes sent by the port", "tx_bytes"},
    {Kind::counter, "netreduce_port_dropped_packets_total",
     "packets the port lost: rx_missed (no RX descriptor), rx_errors, tx_errors (NIC), tx_full "
     "(TX queue full, dropped by the box)",
     "rx_missed", "rx_missed"},
    {Kind::counter, "netreduce_port_dropped_packets_total", "", "rx_errors", "rx_errors"},
    {Kind::counter, "netreduce_port_dropped_packets_total", "", "tx_errors", "tx_errors"},
    {Kind::counter, "netreduce_port_dropped_packets_total", "", "box_reasons/tx_full", "tx_full"},
    {Kind::counter, "netreduce_port_box_received_packets_total",
     "packets the box's workers took from the port (counted by the box, not the NIC; some "
     "virtual PMDs count nothing in the device counters)",
     "box_rx_packets"},
    {Kind::counter, "netreduce_port_box_transmitted_packets_total",
     "packets the box's workers handed to the port for transmission", "box_tx_packets"},
};

// Each worker lcore's, from stats "workers", labelled by lcore.
constexpr Series kLcoreSeries[] = {
    {Kind::gauge, "netreduce_lcore_busy_ratio",
     "share of the worker lcore's cycles spent on bursts with packets, since start", "busy_ratio"},
    {Kind::gauge, "netreduce_lcore_engine_memory_bytes",
     "engine memory in use on the worker lcore (cells, tables)", "memory_bytes"},
    {Kind::counter, "netreduce_lcore_dispatched_packets_total",
     "packets the lcore handed to another lcore's ring owner", "dispatched"},
    {Kind::counter, "netreduce_lcore_dispatch_dropped_packets_total",
     "packets dropped because another lcore's inbox was full", "dataplane_reasons/inbox_full"},
    {Kind::counter, "netreduce_lcore_idle_sleep_seconds_total",
     "time the worker lcore slept because it had no traffic (adaptive polling, "
     "idle_sleep_max_us)",
     "idle_sleep_ns", nullptr, 1e9},
    {Kind::counter, "netreduce_lcore_stalls_total",
     "busy polls of the worker lcore that took over 100 us: it was preempted or interrupted (the "
     "lcore is not isolated)",
     "stalls"},
};

// Each ring's, from list_rings, labelled by ring.
constexpr Series kRingSeries[] = {
    {Kind::counter, "netreduce_ring_aggregated_packets_total",
     "packets of the ring taken into aggregator cells", "counters/packets_aggregated"},
    {Kind::counter, "netreduce_ring_aggregated_bytes_total",
     "payload bytes of the ring taken into aggregator cells", "counters/bytes_aggregated"},
    {Kind::counter, "netreduce_ring_messages_completed_total",
     "messages whose every cell completed", "counters/messages_completed"},
    {Kind::counter, "netreduce_ring_messages_sealed_total",
     "message results sealed with the box's digest (released or served)",
     "counters/messages_sealed"},
    {Kind::counter, "netreduce_ring_cells_completed_total",
     "cells that collected every rank and were released", "counters/cells_completed"},
    {Kind::counter, "netreduce_ring_retransmissions_served_total",
     "retransmissions answered from a completed cell's stored result",
     "counters/retransmissions_served"},
    {Kind::counter, "netreduce_ring_connections_rebound_total",
     "connections re-bound to the ring (a rank's new QP)", "counters/connections_rebound"},
    {Kind::gauge, "netreduce_ring_held_packets", "packets held in the ring's open cells",
     "held_packets"},
    {Kind::gauge, "netreduce_ring_held_bytes", "bytes held in the ring's cells", "held_bytes"},
    {Kind::gauge, "netreduce_ring_memory_reserved_bytes", "engine memory reserved for the ring",
     "memory_bytes"},
    {Kind::gauge, "netreduce_ring_open_cells", "cells collecting (some ranks arrived)",
     "open_cells"},
    {Kind::gauge, "netreduce_ring_stalled_cells",
     "open cells collecting for longer than engine.stall_timeout_ms", "stalled_cells"},
};

// The daemon's own figures, and its HTTP front end's.
void daemon_series(Builder& b, const MetricsInput& in) {
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
}

// The data plane's packet fates and the faults injected into it.
void packet_series(Builder& b, const json& stats) {
  // Engine packet fates, summed over lcores.
  reason_series<engine::Reason, engine::kReasonCount>(
      b.counter("netreduce_packets_total",
                "packets by engine fate (forward, aggregate, drop) and reason"),
      stats.value("reasons", json::object()));
  // The data plane's own reasons (dataplane/reasons.h), summed over lcores.
  reason_series<dataplane::Reason, dataplane::kReasonCount>(
      b.counter("netreduce_dataplane_packets_total",
                "packets the data plane dropped or passed on untouched before the engine saw "
                "them, by fate and reason"),
      stats.value("dataplane_reasons", json::object()));
  // Injected faults in force (dataplane/faults.h): a rehearsal, or a
  // forgotten one, shows on dashboards and can be alerted on.
  auto& faults = b.gauge("netreduce_dataplane_faults_active",
                         "1 for each ring with an injected fault in force, by ring and kind "
                         "(drop, duplicate, reorder, bypass)");
  for (const json& f : stats.value("faults", json::array()))
    set(faults, {{"ring", std::to_string(f.value("ring", 0u))}, {"kind", f.value("kind", "")}}, 1);
}

void port_series(Builder& b, const json& stats) {
  const SeriesTable figures(b, kPortSeries);
  auto& link = b.gauge("netreduce_port_link_up", "1 if the port's link is up");
  const json ports = stats.value("ports", json::array());
  for (size_t i = 0; i < ports.size(); ++i) {
    const json& p = ports[i];
    const Labels l{{"port", p.value("name", std::to_string(i))}};
    figures.write(p, l);
    set(link, l, p.value("link_up", false) ? 1 : 0);
  }
}

void lcore_series(Builder& b, const json& stats) {
  const SeriesTable figures(b, kLcoreSeries);
  for (const json& w : stats.value("workers", json::array()))
    figures.write(w, {{"lcore", std::to_string(w.value("lcore", 0u))}});
}

void memory_series(Builder& b, const json& status) {
  const json mem = status.value("memory", json::object());
  const json mbufs = status.value("mbufs", json::object());
  set(b.gauge("netreduce_engine_memory_reserved_bytes",
              "engine memory reserved by installed rings"),
      {}, num(mem, "engine_reserved_bytes"));
  set(b.gauge("netreduce_engine_memory_budget_bytes", "memory.engine: what all rings may reserve"),
      {}, num(mem, "engine_budget_bytes"));
  set(b.gauge("netreduce_mbufs_in_use", "packet buffers in use (held packets included)"), {},
      num(mbufs, "in_use"));
  set(b.gauge("netreduce_mbufs", "packet buffers in the pool"), {}, num(mbufs, "total"));
}

// Each ring's series, then the cells' memory of all rings.
void ring_series(Builder& b, const json& rings) {
  const SeriesTable figures(b, kRingSeries);
  auto& r_drop =
      b.counter("netreduce_ring_dropped_packets_total", "packets of the ring dropped, by reason");
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
  for (const json& r : rings) {
    const json spec = r.value("spec", json::object());
    const Labels l{{"ring", std::to_string(spec.value("id", 0u))}};
    const json c = r.value("counters", json::object());
    figures.write(r, l);
    const json c_drops = c.value("drops", json::object());
    for (const auto& [reason, v] : c_drops.items())
      set(r_drop, {{"ring", l.at("ring")}, {"reason", reason}},
          v.is_number() ? v.get<double>() : 0);
    set(r_ranks, l, static_cast<double>(spec.value("members", json::array()).size()));
    if (r.contains("worker")) set(r_worker, l, num(r, "worker"));
    held_total += num(r, "held_bytes");
    if (c.contains("tree") && c["tree"].is_object())
      for (size_t i = 0; i < r_tree.size(); ++i) set(*r_tree[i], l, num(c["tree"], kTree[i].first));
  }
  set(b.gauge("netreduce_cell_memory_held_bytes",
              "bytes of packets held in aggregator cells, all rings"),
      {}, held_total);
}

}  // namespace

std::string render_metrics(const MetricsInput& in) {
  Builder b;
  daemon_series(b, in);
  if (!in.dataplane_up) return b.text();
  packet_series(b, in.stats);
  port_series(b, in.stats);
  lcore_series(b, in.stats);
  memory_series(b, in.status);
  ring_series(b, in.rings);
  return b.text();
}

}  // namespace netreduce::control
