// The data plane's control channel: a Unix stream socket speaking one JSON
// object per line, request and response. The control daemon (netreduced) is
// its client; `socat - UNIX-CONNECT:/run/netreduce/dataplane.sock` works too.
//
//   {"cmd": "ping"}                                   -> {"ok": true}
//   {"cmd": "status"}                                 -> instance, ports, workers, memory, mbufs,
//                                                     rings, retiring, retire_grace_ms,
//                                                     capabilities, control (the socket's
//                                                     counters) ("instance" differs in every
//                                                     process: the daemon's restart detector)
//   {"cmd": "stats"}                                  -> reasons (engine, summed),
//                                                     dataplane_reasons (dataplane/reasons.h,
//                                                     summed), per worker (both), per port
//                                                     (device counters, box_reasons),
//                                                     faults (as list_faults')
//   {"cmd": "install_ring", "ring": {...}}            -> {"ok": true} (see common/ring_json.h;
//                                                     an optional "tree" in the ring: this
//                                                     box's node of a multi-rack tree,
//                                                     engine/engine_json.h)
//   {"cmd": "remove_ring", "id": 7}                  -> the ring retires: its packets are dropped
//                                                     for rings.retire_grace_ms, then it is gone
//                                                     (listed under "retiring" in status, stats
//                                                     and list_rings meanwhile)
//   {"cmd": "list_rings"} / {"cmd": "get_ring", "id": 7}  -> rings by id: spec, counters, cells,
//                                                     "worker", "published_age_ms", "answering"
//                                                     (a tree node: spec.tree, counters.tree)
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
//   {"cmd": "set_fault", "ring": 7 | "all", "kind": "drop", "fraction": 0.5,
//    "duration_ms": 10000}                           -> {"ok": true, "faults": [...]}
//                                                     injects a fault (dataplane/faults.h):
//                                                     drop | duplicate | reorder | bypass;
//                                                     fraction 0..1 (default 1); duration_ms
//                                                     required, 1..faults.max_duration_ms.
//                                                     Refused (conflict, field faults.enabled)
//                                                     unless faults.enabled
//   {"cmd": "clear_faults", "ring": 7}               -> {"ok": true, "cleared": n, "faults": [...]}
//                                                     (no "ring", or "all": every fault)
//   {"cmd": "list_faults"}                           -> {"ok": true, "enabled", "max_duration_ms",
//                                                     "faults": [{"ring", "kind", "fraction",
//                                                     "remaining_ms", "packets"}]}
//   {"cmd": "shutdown"}
// Errors: {"ok": false, "error": {"code": "...", "field": "...", "message": "..."}}.
// Requests that run a command on workers (install_ring, remove_ring) answer
// "unavailable", field control.command_timeout_ms, naming the worker and its
// lcore, when a worker does not take the command in time
// (Dataplane::on_worker; dataplane.h). Reads run no command: stats,
// list_rings, get_ring and telemetry copy each worker's publication
// (Published, lcore.h), waiting for a fresh one at most that long; a
// worker that does not publish in time shows its last figures with their
// age ("published_age_ms", "answering": false).
// Every line gets one reply, also a line that is not JSON or not UTF-8
// (replies replace invalid UTF-8; handle_request never throws). The transport
// (who may connect, how many, buffering) is in control_socket.h.
// DPDK telemetry is in telemetry.cc, the process lifecycle (run) in run.cc.
#include <rte_ethdev.h>
#include <rte_lcore.h>
#include <rte_mempool.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <optional>
#include <string_view>
#include <utility>

#include "common/dataplane_protocol.h"
#include "common/ring_json.h"
#include "dataplane/control_socket.h"
#include "dataplane/reports.h"
#include "engine/engine_json.h"

namespace netreduce::dataplane {

using nlohmann::json;

namespace {

json error_json(const Status& s) { return {{"ok", false}, {"error", status_to_json(s)}}; }

// One reply line. Strings that came from outside (a parse error quoting the
// bytes it choked on) may hold invalid UTF-8: replaced (U+FFFD), never thrown.
std::string to_line(const json& j) { return dump_json(j); }

// The request's "id": a ring id.
Status ring_id_of(const json& req, uint32_t& id) {
  const auto it = req.find("id");
  if (it == req.end() || !it->is_number_unsigned() || it->get<uint64_t>() > 0xFFFFFFFFu)
    return Status::invalid("id", "a ring id (unsigned 32-bit integer) is required");
  id = it->get<uint32_t>();
  return {};
}

// "ring": an id, or "all" (also absent, where `required` is false).
Status fault_ring(const json& req, bool required, std::optional<uint32_t>& ring) {
  const auto r = req.find("ring");
  if (r != req.end() && r->is_number_unsigned() && r->get<uint64_t>() <= 0xFFFFFFFFu) {
    ring = r->get<uint32_t>();
    return {};
  }
  if ((r != req.end() && *r == "all") || (!required && r == req.end())) return {};
  return Status::invalid("ring", "a ring id (unsigned 32-bit integer) or \"all\" is required");
}

}  // namespace

json Dataplane::answer(const std::string& line) {
  using Handler = json (Dataplane::*)(const json&);
  static constexpr std::pair<std::string_view, Handler> kCommands[] = {
      {dpcmd::kPing, &Dataplane::cmd_ping},
      {dpcmd::kShutdown, &Dataplane::cmd_shutdown},
      {dpcmd::kInstallRing, &Dataplane::cmd_install_ring},
      {dpcmd::kRemoveRing, &Dataplane::cmd_remove_ring},
      {dpcmd::kListRings, &Dataplane::cmd_list_rings},
      {dpcmd::kGetRing, &Dataplane::cmd_get_ring},
      {dpcmd::kStats, &Dataplane::cmd_stats},
      {dpcmd::kStatus, &Dataplane::cmd_status},
      {dpcmd::kSetMode, &Dataplane::cmd_set_mode},
      {dpcmd::kSetPolling, &Dataplane::cmd_set_polling},
      {dpcmd::kSetFault, &Dataplane::cmd_set_fault},
      {dpcmd::kClearFaults, &Dataplane::cmd_clear_faults},
      {dpcmd::kListFaults, &Dataplane::cmd_list_faults},
  };
  json req;
  try {
    req = json::parse(line);
  } catch (const std::exception& e) {
    return error_json(Status::invalid("", std::string("not JSON: ") + e.what()));
  }
  if (!req.is_object() || !req.contains("cmd") || !req["cmd"].is_string())
    return error_json(Status::invalid("cmd", "a request is an object with a string \"cmd\""));
  const std::string cmd = req["cmd"];
  for (const auto& [name, handler] : kCommands) {
    if (cmd != name) continue;
    try {
      return (this->*handler)(req);
    } catch (const std::exception& e) {  // a malformed field the checks missed
      return error_json({StatusCode::invalid_argument, "", e.what()});
    }
  }
  return error_json(Status::invalid("cmd", "unknown command '" + cmd + "'"));
}

json Dataplane::cmd_ping(const json&) { return json{{"ok", true}}; }

json Dataplane::cmd_shutdown(const json&) {
  stop();
  return json{{"ok", true}};
}

json Dataplane::cmd_install_ring(const json& req) {
  if (!req.contains("ring")) return error_json(Status::invalid("ring", "is required"));
  engine::RingSpec spec;
  std::optional<engine::TreeSpec> tree;
  if (Status s = ring_tree_from_json(req["ring"], spec, tree); !s) return error_json(s);
  if (Status s = install_ring(spec, tree); !s) return error_json(s);
  return json{{"ok", true}};
}

json Dataplane::cmd_remove_ring(const json& req) {
  uint32_t id;
  if (Status s = ring_id_of(req, id); !s) return error_json(s);
  if (Status s = remove_ring(id); !s) return error_json(s);
  return json{{"ok", true}};
}

json Dataplane::cmd_list_rings(const json&) {
  return json{{"ok", true}, {"rings", rings_json(std::nullopt)}, {"retiring", retiring_json()}};
}

json Dataplane::cmd_get_ring(const json& req) {
  uint32_t id;
  if (Status s = ring_id_of(req, id); !s) return error_json(s);
  if (!placement_.installed(id)) {
    std::string why;
    for (const Placement::Retiring& r : placement_.retiring())
      if (r.spec.ring_id == id) why = " (removed; retiring, " + seconds_left(r) + " s left)";
    return error_json({StatusCode::not_found, "id", "no ring " + std::to_string(id) + why});
  }
  return json{{"ok", true}, {"ring", rings_json(id)[0]}};
}

// Installed rings by id (or the one): specs and owners from the registry
// (this thread's), figures from each owner's publication. No command runs,
// so a stuck worker's rings show their last figures and age.
json Dataplane::rings_json(std::optional<uint32_t> only) {
  std::vector<std::optional<RingSnapshot>> snaps(workers_.size());
  std::vector<uint32_t> ids;
  for (const auto& [id, e] : placement_.installed())
    if (!only || id == *only) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  json arr = json::array();
  for (uint32_t id : ids) {
    const Placement::Ring& e = *placement_.installed(id);
    if (!snaps[e.owner]) snaps[e.owner] = ring_snapshot(*this, e.owner);
    const RingSnapshot& rs = *snaps[e.owner];
    engine::RingInfo info;
    bool published = false;  // false: installed after its owner's last copy (figures 0)
    for (const engine::RingFigures& f : rs.rings)
      if (f.ring_id == id) {
        static_cast<engine::RingFigures&>(info) = f;
        published = true;
      }
    info.spec = e.spec;
    info.tree = e.tree;
    json j = ring_info_to_json(info);
    j["worker"] = e.owner;
    j["published"] = published;
    j["published_age_ms"] = rs.age_ms;
    j["answering"] = rs.answering;
    arr.push_back(std::move(j));
  }
  return arr;
}

json Dataplane::cmd_stats(const json&) {
  json j = stats_json(*this, snapshots(*this));
  j["retiring"] = retiring_json();
  j["faults"] = faults_json();  // injected faults in force (faults.h)
  j["ok"] = true;
  return j;
}

json Dataplane::cmd_status(const json&) {
  json ws = json::array();
  for (Worker* w : workers_) ws.push_back({{"worker", w->index}, {"lcore", w->lcore}});
  return json{
      {"ok", true},
      {"instance", instance_id()},
      {"mode", mode() == Mode::aggregate ? "aggregate" : "forward"},
      {"polling", polling()},
      {"ports", {port_json(*this, 0), port_json(*this, 1)}},
      {"workers", ws},
      {"main_lcore", rte_get_main_lcore()},
      {"rings", placement_.installed().size()},
      {"retiring", retiring_json()},
      {"retire_grace_ms", cfg_.retire_grace_ms},
      // What hosts may rely on: "result_digest", every INA result
      // sealed (docs/design.md#result-digests).
      {"capabilities", json::array({"result_digest"})},
      {"memory",
       {{"engine_reserved_bytes", memory_reserved_}, {"engine_budget_bytes", cfg_.engine_memory}}},
      {"mbufs", {{"total", cfg_.mbufs}, {"in_use", rte_mempool_in_use_count(pool_)}}},
      {"control", control_json()}};
}

json Dataplane::cmd_set_mode(const json& req) {
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

json Dataplane::cmd_set_polling(const json& req) {
  const auto it = req.find("enabled");
  if (it == req.end() || !it->is_boolean())
    return error_json(Status::invalid("enabled", "must be true or false"));
  const bool previous = polling();
  const Status s = set_polling(it->get<bool>());
  if (previous != polling()) spdlog::info("port polling {}", polling() ? "resumed" : "paused");
  if (!s) return error_json(s);  // the flag is set, but a stuck worker may be in a PMD call
  return json{{"ok", true}, {"polling", polling()}, {"previous", previous}};
}

json Dataplane::cmd_set_fault(const json& req) {
  if (Status s = faults_allowed(); !s) return error_json(s);
  std::optional<uint32_t> ring;
  if (Status s = fault_ring(req, true, ring); !s) return error_json(s);
  const auto k = req.find("kind");
  const std::optional<FaultKind> kind =
      k != req.end() && k->is_string() ? fault_kind_from(k->get<std::string>()) : std::nullopt;
  if (!kind)
    return error_json(
        Status::invalid("kind", "must be \"drop\", \"duplicate\", \"reorder\" or \"bypass\""));
  double fraction = 1.0;
  if (const auto f = req.find("fraction"); f != req.end()) {
    if (!f->is_number() || !(f->get<double>() >= 0.0 && f->get<double>() <= 1.0))
      return error_json(Status::invalid("fraction", "must be a number from 0 to 1"));
    fraction = f->get<double>();
  }
  const auto d = req.find("duration_ms");
  if (d == req.end() || !d->is_number_unsigned() || d->get<uint64_t>() == 0 ||
      d->get<uint64_t>() > cfg_.faults_max_duration_ms)
    return error_json(
        Status::invalid("duration_ms", "is required: milliseconds, 1.." +
                                           std::to_string(cfg_.faults_max_duration_ms) +
                                           " (faults.max_duration_ms); a fault always ends"));
  if (Status s = set_fault(ring, *kind, fraction, d->get<uint32_t>()); !s) return error_json(s);
  return json{{"ok", true}, {"faults", faults_json()}};
}

json Dataplane::cmd_clear_faults(const json& req) {
  std::optional<uint32_t> ring;
  if (Status s = fault_ring(req, false, ring); !s) return error_json(s);
  const size_t n = clear_faults(ring);
  return json{{"ok", true}, {"cleared", n}, {"faults", faults_json()}};
}

json Dataplane::cmd_list_faults(const json&) {
  return json{{"ok", true},
              {"enabled", cfg_.faults_enabled},
              {"max_duration_ms", cfg_.faults_max_duration_ms},
              {"faults", faults_json()}};
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

}  // namespace netreduce::dataplane
