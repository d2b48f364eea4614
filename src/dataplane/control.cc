// The data plane's control channel: a Unix stream socket speaking one JSON
// object per line, request and response. The control daemon (netreduced) is
// its client; `socat - UNIX-CONNECT:/run/netreduce/dataplane.sock` works too.
//
//   {"cmd": "ping"}                                   -> {"ok": true}
//   {"cmd": "status"}                                 -> instance, ports, workers, memory, mbufs,
//                                                     rings, retiring, control (the socket's
//                                                     counters) ("instance" differs in every
//                                                     process: the daemon's restart detector)
//   {"cmd": "stats"}                                  -> reasons (engine, summed),
//                                                     dataplane_reasons (dataplane/reasons.h,
//                                                     summed), per worker (both), per port
//                                                     (device counters, box_reasons)
//   {"cmd": "install_ring", "ring": {...}}            -> {"ok": true} (see common/ring_json.h)
//   {"cmd": "remove_ring", "id": 7}                  -> the ring retires: its packets are dropped
//                                                     for rings.retire_grace_ms, then it is gone
//                                                     (listed under "retiring" in status, stats
//                                                     and list_rings meanwhile)
//   {"cmd": "list_rings"} / {"cmd": "get_ring", "id": 7}  -> rings by id: spec, counters, cells,
//                                                     "worker", "published_age_ms", "answering"
//   {"cmd": "install_ctt", ...} / "remove_ctt" / "list_ctt"   reserved for multi-rack
//                                                     connection translation: "unimplemented"
//   {"cmd": "set_mode", "mode": "forward"}           -> {"ok": true, "mode": ..., "previous": ...}
//                                                     aggregate | forward (the benchmark baseline;
//                                                     refused while rings are installed or
//                                                     retiring)
//   {"cmd": "set_polling", "enabled": false}         -> {"ok": true, "polling": ..., "previous":
//   ...}
//                                                     pauses (or resumes) every worker's port
//                                                     polling; when it answers, no worker is
//                                                     inside a PMD call (detach a memif peer
//                                                     only while paused: dataplane.h);
//                                                     "unavailable" naming a stuck worker
//                                                     that could not be waited out
//   {"cmd": "shutdown"}
// Errors: {"ok": false, "error": {"code": "...", "field": "...", "message": "..."}}.
// Requests that run a command on workers (install_ring, remove_ring) answer
// "unavailable", field control.command_timeout_ms, naming the worker and its
// lcore, when a worker does not take the command in time
// (Dataplane::on_worker; dataplane.h). Reads run no command: stats,
// list_rings, get_ring and telemetry copy each worker's publication
// (Published, dataplane.h), waiting for a fresh one at most that long; a
// worker that does not publish in time shows its last figures with their
// age ("published_age_ms", "answering": false).
// Every line gets one reply, also a line that is not JSON or not UTF-8
// (replies replace invalid UTF-8; handle_request never throws). The transport
// (who may connect, how many, buffering) is in control_socket.h.
// Also registered with DPDK telemetry: /netreduce/stats, /netreduce/rings.
#include <rte_cycles.h>
#include <rte_ethdev.h>
#include <rte_launch.h>
#include <rte_lcore.h>
#include <rte_mempool.h>
#include <rte_telemetry.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "common/dataplane_protocol.h"
#include "common/ring_json.h"
#include "dataplane/control_socket.h"
#include "dataplane/dataplane.h"
#include "engine/engine_json.h"

namespace netreduce::dataplane {

using nlohmann::json;

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

// This process's identity: pid and start time, fixed at start-up.
const std::string& instance_id() {
  static const std::string id =
      std::to_string(::getpid()) + "-" +
      std::to_string(std::chrono::duration_cast<std::chrono::nanoseconds>(
                         std::chrono::system_clock::now().time_since_epoch())
                         .count());
  return id;
}

json error_json(const Status& s) { return {{"ok", false}, {"error", status_to_json(s)}}; }

// One reply line. Strings that came from outside (a parse error quoting the
// bytes it choked on) may hold invalid UTF-8: replaced (U+FFFD), never thrown.
std::string to_line(const json& j) { return dump_json(j); }

struct Snapshot {
  double age_ms = 0;      // how old the published figures are (0: fresh)
  bool answering = true;  // false: the worker missed a deadline and has published nothing since
  WorkerStats stats;
  engine::ReasonCounters reasons{};
  size_t ring_count = 0;
  size_t retired_count = 0;  // tombstones of removed rings in their grace
  uint64_t memory = 0;
};

Snapshot snapshot_of(const Figures& p) {
  Snapshot s;
  s.stats = p.stats;
  s.reasons = p.reasons;
  s.memory = p.memory;
  s.ring_count = p.rings;
  s.retired_count = p.retired;
  return s;
}

// Every worker's counters, read from its publication (no command): a worker
// that does not publish in time shows its last figures and their age.
std::vector<Snapshot> snapshots(Dataplane& dp) {
  std::vector<Snapshot> out(dp.workers().size());
  for (unsigned i = 0; i < out.size(); ++i) {
    double age = 0;
    bool answering = true;
    out[i] = snapshot_of(dp.read_published(i, age, &answering));
    out[i].age_ms = age;
    out[i].answering = answering;
  }
  return out;
}

// One worker's ring figures as read_published gives them (rings: true).
struct RingSnapshot {
  std::vector<engine::RingFigures> rings;
  double age_ms = 0;
  bool answering = true;
};

RingSnapshot ring_snapshot(Dataplane& dp, unsigned w) {
  RingSnapshot r;
  dp.read_published(w, r.age_ms, &r.answering, &r.rings);
  return r;
}

// Telemetry puts both lists in one dict (telemetry_stats).
constexpr bool reason_names_distinct() {
  for (size_t a = 0; a < kReasonCount; ++a)
    for (size_t b = 0; b < engine::kReasonCount; ++b)
      if (to_string(static_cast<Reason>(a)) == engine::to_string(static_cast<engine::Reason>(b)))
        return false;
  return true;
}
static_assert(reason_names_distinct(), "a data plane reason has an engine reason's name");

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
json port_json(const Dataplane& dp, unsigned slot, const std::vector<Snapshot>* snaps = nullptr) {
  uint64_t box_rx = 0, box_tx = 0;
  uint64_t box_reasons[kReasonCount] = {};
  if (snaps)
    for (const Snapshot& s : *snaps) {
      box_rx += s.stats.rx[slot];
      box_tx += s.stats.tx[slot];
      for (size_t r = 0; r < kReasonCount; ++r) box_reasons[r] += s.stats.reasons[slot][r];
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

json stats_json(Dataplane& dp, const std::vector<Snapshot>& snaps) {
  engine::ReasonCounters sum{};
  uint64_t dp_sum[kReasonCount] = {};
  json workers = json::array();
  for (size_t i = 0; i < snaps.size(); ++i) {
    const Snapshot& s = snaps[i];
    for (size_t r = 0; r < sum.size(); ++r) sum[r] += s.reasons[r];
    const WorkerStats& ws = s.stats;
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
         {"idle_sleep_ns", ws.idle_sleep_ns},
         {"rings", s.ring_count},
         {"retired_rings", s.retired_count},
         {"memory_bytes", s.memory},
         {"reasons", reasons_to_json(s.reasons)}});
  }
  return {{"reasons", reasons_to_json(sum)},
          {"dataplane_reasons", dataplane_reasons_json(dp_sum)},
          {"tsc_hz", rte_get_tsc_hz()},
          {"workers", workers},
          {"ports", {port_json(dp, 0, &snaps), port_json(dp, 1, &snaps)}}};
}

int telemetry_stats(const char*, const char*, rte_tel_data* d) {
  TelemetryCall call;
  if (!call.dp) return -1;
  const std::vector<Snapshot> snaps = snapshots(*call.dp);
  engine::ReasonCounters sum{};
  // Summed over workers: packets, the data plane's own reasons
  // (dataplane/reasons.h), and the idle rule's sleeps.
  uint64_t rx = 0, tx = 0, dispatched = 0, sleeps = 0, slept_ns = 0;
  uint64_t dp_sum[kReasonCount] = {};
  for (const auto& s : snaps) {
    for (size_t r = 0; r < sum.size(); ++r) sum[r] += s.reasons[r];
    const WorkerStats& ws = s.stats;
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

json Dataplane::answer(const std::string& line) {
  json req;
  try {
    req = json::parse(line);
  } catch (const std::exception& e) {
    return error_json(Status::invalid("", std::string("not JSON: ") + e.what()));
  }
  if (!req.is_object() || !req.contains("cmd") || !req["cmd"].is_string())
    return error_json(Status::invalid("cmd", "a request is an object with a string \"cmd\""));
  const std::string cmd = req["cmd"];
  auto ring_id = [&](uint32_t& id) -> Status {
    if (!req.contains("id") || !req["id"].is_number_unsigned() ||
        req["id"].get<uint64_t>() > 0xFFFFFFFFu)
      return Status::invalid("id", "a ring id (unsigned 32-bit integer) is required");
    id = req["id"].get<uint32_t>();
    return {};
  };
  try {
    if (cmd == dpcmd::kPing) return json{{"ok", true}};
    if (cmd == dpcmd::kShutdown) {
      stop();
      return json{{"ok", true}};
    }
    if (cmd == dpcmd::kInstallRing) {
      if (!req.contains("ring")) return error_json(Status::invalid("ring", "is required"));
      engine::RingSpec spec;
      if (Status s = ring_from_json(req["ring"], spec); !s) return error_json(s);
      if (Status s = install_ring(spec); !s) return error_json(s);
      return json{{"ok", true}};
    }
    if (cmd == dpcmd::kRemoveRing) {
      uint32_t id;
      if (Status s = ring_id(id); !s) return error_json(s);
      if (Status s = remove_ring(id); !s) return error_json(s);
      return json{{"ok", true}};
    }
    if (cmd == dpcmd::kListRings || cmd == dpcmd::kGetRing) {
      uint32_t want = 0;
      if (cmd == dpcmd::kGetRing) {
        if (Status s = ring_id(want); !s) return error_json(s);
        if (!rings_.count(want)) {
          std::string why;
          for (const Retiring& r : retiring_)
            if (r.spec.ring_id == want)
              why = " (removed; retiring, " + seconds_left(r) + " s left)";
          return error_json({StatusCode::not_found, "id", "no ring " + std::to_string(want) + why});
        }
      }
      // Specs and owners from the registry (this thread's), figures from
      // each owner's publication: no command, a stuck worker's rings show
      // their last figures and age.
      std::vector<std::optional<RingSnapshot>> snaps(workers_.size());
      std::vector<uint32_t> ids;
      for (const auto& [id, e] : rings_)
        if (cmd == dpcmd::kListRings || id == want) ids.push_back(id);
      std::sort(ids.begin(), ids.end());
      json arr = json::array();
      for (uint32_t id : ids) {
        const RingEntry& e = rings_.at(id);
        if (!snaps[e.owner]) snaps[e.owner] = ring_snapshot(*this, e.owner);
        const RingSnapshot& rs = *snaps[e.owner];
        engine::RingInfo info;
        for (const engine::RingFigures& f : rs.rings)
          if (f.ring_id == id) static_cast<engine::RingFigures&>(info) = f;
        info.spec = e.spec;
        json j = ring_info_to_json(info);
        j["worker"] = e.owner;
        j["published_age_ms"] = rs.age_ms;
        j["answering"] = rs.answering;
        arr.push_back(std::move(j));
      }
      if (cmd == dpcmd::kGetRing) return json{{"ok", true}, {"ring", arr[0]}};
      return json{{"ok", true}, {"rings", arr}, {"retiring", retiring_json()}};
    }
    if (cmd == dpcmd::kStats) {
      json j = stats_json(*this, snapshots(*this));
      j["retiring"] = retiring_json();
      j["ok"] = true;
      return j;
    }
    if (cmd == dpcmd::kStatus) {
      json ws = json::array();
      for (Worker* w : workers_) ws.push_back({{"worker", w->index}, {"lcore", w->lcore}});
      return json{{"ok", true},
                  {"instance", instance_id()},
                  {"mode", mode() == Mode::aggregate ? "aggregate" : "forward"},
                  {"polling", polling()},
                  {"ports", {port_json(*this, 0), port_json(*this, 1)}},
                  {"workers", ws},
                  {"main_lcore", rte_get_main_lcore()},
                  {"rings", rings_.size()},
                  {"retiring", retiring_json()},
                  {"retire_grace_ms", cfg_.retire_grace_ms},
                  {"memory",
                   {{"engine_reserved_bytes", memory_reserved_},
                    {"engine_budget_bytes", cfg_.engine_memory}}},
                  {"mbufs", {{"total", cfg_.mbufs}, {"in_use", rte_mempool_in_use_count(pool_)}}},
                  {"control", control_json()}};
    }
    if (cmd == dpcmd::kSetMode) {
      const auto it = req.find("mode");
      const std::string m = it != req.end() && it->is_string() ? it->get<std::string>() : "";
      if (m != "aggregate" && m != "forward")
        return error_json(Status::invalid("mode", "must be \"aggregate\" or \"forward\""));
      const char* previous = mode() == Mode::aggregate ? "aggregate" : "forward";
      if (Status s = set_mode(m == "aggregate" ? Mode::aggregate : Mode::forward); !s)
        return error_json(s);
      spdlog::info("mode {} (was {})", m, previous);
      return json{{"ok", true}, {"mode", m}, {"previous", previous}};
    }
    if (cmd == dpcmd::kSetPolling) {
      const auto it = req.find("enabled");
      if (it == req.end() || !it->is_boolean())
        return error_json(Status::invalid("enabled", "must be true or false"));
      const bool previous = polling();
      const Status s = set_polling(it->get<bool>());
      if (previous != polling()) spdlog::info("port polling {}", polling() ? "resumed" : "paused");
      if (!s) return error_json(s);  // the flag is set, but a stuck worker may be in a PMD call
      return json{{"ok", true}, {"polling", polling()}, {"previous", previous}};
    }
    if (cmd == dpcmd::kInstallCtt || cmd == dpcmd::kRemoveCtt || cmd == dpcmd::kListCtt)
      return error_json({StatusCode::unimplemented, "cmd",
                         "connection translation (multi-rack hierarchies) is not built yet"});
    return error_json(Status::invalid("cmd", "unknown command '" + cmd + "'"));
  } catch (const std::exception& e) {  // a malformed field the checks above missed
    return error_json({StatusCode::invalid_argument, "", e.what()});
  }
}

// Never throws: every reply is serialized with invalid UTF-8 replaced (a
// parse error's message quotes the bytes it choked on, e.g. "\xff"), and
// anything thrown while answering becomes an error reply.
std::string Dataplane::handle_request(const std::string& line) noexcept {
  try {
    return to_line(answer(line));
  } catch (const std::exception& e) {
    try {
      return to_line(error_json({StatusCode::internal, "", e.what()}));
    } catch (...) {
    }
  } catch (...) {
  }
  return R"({"ok":false,"error":{"code":"internal","field":"","message":"the request could not be answered"}})";
}

json Dataplane::control_json() const {
  if (!control_) return json::object();
  const ControlSocketCounters& c = control_->counters();
  return {{"socket", control_->path()},
          {"clients", control_->clients()},
          {"max_clients", cfg_.control_max_clients},
          {"accepted", c.accepted},
          {"requests", c.requests},
          {"refused_credentials", c.refused_credentials},
          {"refused_full", c.refused_full},
          {"dropped_slow", c.dropped_slow},
          {"dropped_long_line", c.dropped_long_line}};
}

Status Dataplane::run() {
  // The control socket first: a box that cannot be controlled (a second
  // instance on the same path, a bad directory) does not start its ports.
  ControlSocket sock;
  if (Status s = sock.open({cfg_.control_socket, cfg_.control_max_clients, control_gid_}); !s)
    return s;
  spdlog::info("control socket {} (mode 0660{})", cfg_.control_socket,
               control_gid_ >= 0 ? ", group " + cfg_.control_group : "");
  for (unsigned s = 0; s < 2; ++s)
    if (Status st = start_port(port_setup(s)); !st) return st;
  std::vector<std::pair<Dataplane*, Worker*>> args;
  args.reserve(workers_.size());
  for (Worker* w : workers_) args.emplace_back(this, w);
  started_ = true;
  for (auto& a : args) rte_eal_remote_launch(&Dataplane::worker_main, &a, a.second->lcore);

  (void)instance_id();  // fixed at start-up
  g_telemetry_dp.store(this);
  rte_telemetry_register_cmd("/netreduce/stats", telemetry_stats,
                             "netreduce: packet fates summed over workers");
  rte_telemetry_register_cmd("/netreduce/rings", telemetry_rings, "netreduce: installed ring ids");

  // Nothing a client does blocks this loop (control_socket.h); each round
  // waits at most 100 ms, so a stop request (SIGTERM, "shutdown") ends it
  // within that.
  control_ = &sock;
  const ControlSocket::Handler handler = [this](const std::string& l) { return handle_request(l); };
  while (!quitting()) {
    sock.poll_once(std::chrono::milliseconds(100), handler);
    housekeeping();
  }
  sock.close();
  control_ = nullptr;

  rte_eal_mp_wait_lcore();
  g_telemetry_dp.store(nullptr);
  while (g_telemetry_inflight.load() != 0)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  started_ = false;
  final_report();
  for (unsigned s = 0; s < 2; ++s) {
    rte_eth_dev_stop(port_ids_[s]);
    rte_eth_dev_close(port_ids_[s]);
  }
  return {};
}

void Dataplane::final_report() {
  // Every worker has stopped: their last publications are final.
  std::vector<Snapshot> snaps;
  for (Worker* w : workers_) {
    publish(*w, rte_rdtsc());
    snaps.push_back(snapshot_of(w->pub.f));
  }
  json j = stats_json(*this, snaps);
  j["final"] = true;
  std::printf("%s\n", j.dump().c_str());
  std::fflush(stdout);
}

}  // namespace netreduce::dataplane
