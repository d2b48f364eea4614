#include "bench/loopback/sweep.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "bench/loopback/measure.h"
#include "common/dataplane_protocol.h"
#include "common/ring_json.h"

using nlohmann::json;

namespace netreduce::bench {

namespace {

// --no-install: the box must hold the generator's ring already.
void check_installed(Box& box, const RingSpec& ring) {
  const json r = box.call(netreduce::dpcmd::get_ring(ring.ring_id), false);
  RingSpec have;
  // get_ring answers {"ring": {"spec": {...}, "counters": ...}}.
  if (!r.value("ok", false) || !r.contains("ring") || !r["ring"].contains("spec") ||
      !netreduce::ring_from_json(r["ring"]["spec"], have).ok() || have.members != ring.members ||
      have.msg_len != ring.msg_len || have.payload_bytes != ring.payload_bytes)
    throw std::runtime_error("--no-install: the box has no ring " + std::to_string(ring.ring_id) +
                             " matching the generator (install " +
                             netreduce::ring_to_json(ring).dump() + ")");
}

// One point of the sweep: its forward baseline, then aggregate mode.
json sweep_point(const Options& o, const Ports& ports, Box& box, Scraper& scraper, unsigned P,
                 unsigned payload, const std::string& dt) {
  // Message ids and PSNs start afresh for every point: the ring is
  // installed anew for it (with --no-install there is one point).
  const TrafficSpec s = point_spec(o, P, payload, dt);
  if (std::string e = check(s); !e.empty()) throw std::runtime_error(e);
  const Traffic t(s);
  uint64_t next = 0;
  const RingSpec ring = ring_of(t);
  json pt = {{"ranks", P},
             {"payload", payload},
             {"dtype", dt},
             {"msg_len", o.msg_len},
             {"crc_ns", crc_ns(payload)}};
  // The forward-only baseline first, on a box without the ring: forward
  // mode is refused while any ring is installed or retiring (it would
  // send their packets out unreduced).
  std::optional<Figures> fwd;
  if (o.forward) {
    box.call(netreduce::dpcmd::set_mode("forward"));
    fwd = measure(o, ports, t, box, false, next);
    box.call(netreduce::dpcmd::set_mode("aggregate"));
    pt["forward"] = figures_json(*fwd, t);
  }
  if (o.forward_only) return pt;
  if (o.install)
    box.call(netreduce::dpcmd::install_ring(ring));
  else
    check_installed(box, ring);
  if (o.scrape_hz > 0) (void)scraper.window();
  const Figures agg = measure(o, ports, t, box, true, next);
  pt["aggregate"] = figures_json(agg, t);
  if (o.scrape_hz > 0) pt["aggregate"]["scrape"] = scraper.window();
  pt["box_ns_over_crc"] =
      pt["aggregate"]["box_ns_per_packet"].get<double>() / pt["crc_ns"].get<double>();
  if (fwd) {
    const json& a = pt["aggregate"];
    const json& b = pt["forward"];
    pt["ratio"] = {
        {"pps", a["mpps_out"].get<double>() / std::max(1e-9, b["mpps_out"].get<double>())},
        {"box_mpps_per_lcore", a["box_mpps_per_lcore"].get<double>() /
                                   std::max(1e-9, b["box_mpps_per_lcore"].get<double>())}};
  }
  if (o.install) {
    if (!o.remove_mid_run) box.call(netreduce::dpcmd::remove_ring(s.ring_id));
    wait_retired(box, s.ring_id);  // the next point installs the same id and links
  }
  if (!o.quiet)
    std::fprintf(
        stderr, "  P=%u payload=%u %s: aggregate %.2f Mpps%s\n", P, payload, dt.c_str(),
        pt["aggregate"]["mpps_out"].get<double>(),
        fwd ? (", " + std::to_string(pt["ratio"]["pps"].get<double>()) + " of forwarding").c_str()
            : "");
  return pt;
}

// --pause-box-at-exit: the box polls its ports while this process runs and
// is paused (no worker inside a PMD call) before this process disconnects
// its memif ports, which can crash a box polling during the disconnect
// (dataplane.h, polling()).
struct PauseAtExit {
  Box* box;
  ~PauseAtExit() {
    if (!box) return;
    try {
      box->call(netreduce::dpcmd::set_polling(false));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "netreduce-loopback: could not pause the box's polling: %s\n", e.what());
    }
  }
};

}  // namespace

json sweep(const Options& o, const Ports& ports) {
  Box box(o.box_socket);
  PauseAtExit pause_at_exit{o.pause_box_at_exit ? &box : nullptr};
  if (o.pause_box_at_exit) box.call(netreduce::dpcmd::set_polling(true));
  Scraper scraper(o.box_socket, o.scrape_hz);
  json points = json::array();
  for (unsigned P : o.ranks)
    for (unsigned payload : o.payloads)
      for (const std::string& dt : o.dtypes)
        points.push_back(sweep_point(o, ports, box, scraper, P, payload, dt));
  return points;
}

json idle_phase(const Options& o, const Ports& ports, Box& box) {
  const TrafficSpec s = point_spec(o, o.ranks.front(), o.payloads.front(), o.dtypes.front());
  const Traffic t(s);
  box.call(netreduce::dpcmd::install_ring(ring_of(t)));
  uint64_t next = 0;
  Figures f;
  Generator g(ports, t, f, o.max_inflight);
  if (!g.round(next++, 1, true, false, nullptr)) throw std::runtime_error("generator mbufs");
  auto slept = [&] {
    std::vector<uint64_t> v;
    const json st = box.call(netreduce::dpcmd::stats());
    for (const auto& w : st.at("workers")) v.push_back(w.value("idle_sleep_ns", uint64_t{0}));
    return v;
  };
  std::set<std::string> names;
  const json st =
      box.call(netreduce::dpcmd::stats());  // kept: a range-for over a temporary's member dangles
  for (const auto& w : st.at("workers"))
    names.insert("rte-worker-" + std::to_string(w.value("lcore", 0u)));
  const auto cpu0 = worker_cpu_ns(names);
  const auto slept0 = slept();
  const auto t0 = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(o.idle_seconds));
  const auto cpu1 = worker_cpu_ns(names);
  const auto slept1 = slept();
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() * 1e9;
  json workers = json::array();
  for (const auto& [name, ns] : cpu1) {
    const uint64_t before = cpu0.count(name) ? cpu0.at(name) : 0;
    workers.push_back({{"thread", name}, {"cpu_share", double(ns - before) / wall}});
  }
  json slept_share = json::array();
  for (size_t i = 0; i < slept1.size() && i < slept0.size(); ++i)
    slept_share.push_back(double(slept1[i] - slept0[i]) / wall);
  std::vector<double> lat;
  if (!g.round(next++, 1, true, false, &lat)) throw std::runtime_error("generator mbufs");
  box.call(netreduce::dpcmd::remove_ring(s.ring_id));
  wait_retired(box, s.ring_id);
  return {{"seconds", o.idle_seconds},
          {"threads", workers},
          {"slept_share", slept_share},
          {"after_idle_latency_us", lat.empty() ? 0.0 : *std::max_element(lat.begin(), lat.end())},
          {"after_idle_verified",
           {{"good", f.good}, {"bad", f.bad}, {"unknown", f.unknown}, {"missing", f.missing}}}};
}

}  // namespace netreduce::bench
