// The data plane's lifecycle once set up (Dataplane::run): the control
// socket opens first (a box that cannot be controlled starts no port), then
// the ports and the workers; the main lcore serves the control socket and
// housekeeping until stop() or a signal; then the workers are joined,
// telemetry is detached, the final counters are printed (one JSON line on
// stdout, or where the caller says) and the ports are closed. A library
// function rather than main()'s body: netreduce-loopback runs the same box
// in its own process.
#include <rte_cycles.h>
#include <rte_ethdev.h>
#include <rte_launch.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdio>
#include <utility>
#include <vector>

#include "dataplane/control_socket.h"
#include "dataplane/reports.h"

namespace netreduce::dataplane {

using nlohmann::json;

Status Dataplane::run(std::FILE* final_out) {
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
  telemetry_start(this);

  // Nothing a client does blocks this loop (control_socket.h); each round
  // waits at most 100 ms, so a stop request (SIGTERM, "shutdown") ends it
  // within that.
  control_ = &sock;
  const ControlSocket::Handler handler = [this](const std::string& l) { return handle_request(l); };
  while (!quitting()) {
    sock.poll_once(std::chrono::milliseconds(100), handler);
    housekeeping();
    expire_faults();
  }
  sock.close();
  control_ = nullptr;

  rte_eal_mp_wait_lcore();
  telemetry_stop();
  started_ = false;
  if (final_out) final_report(final_out);
  for (unsigned s = 0; s < 2; ++s) {
    rte_eth_dev_stop(port_ids_[s]);
    rte_eth_dev_close(port_ids_[s]);
  }
  return {};
}

void Dataplane::final_report(std::FILE* out) {
  // Every worker has stopped: their last publications are final.
  std::vector<WorkerSnapshot> snaps;
  for (Worker* w : workers_) {
    publish(*w, rte_rdtsc());
    snaps.push_back({w->pub.f});
  }
  json j = stats_json(*this, snaps);
  j["final"] = true;
  std::fprintf(out, "%s\n", j.dump().c_str());
  std::fflush(out);
}

}  // namespace netreduce::dataplane
