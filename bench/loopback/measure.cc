#include "bench/loopback/measure.h"

#include <rte_cycles.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "common/dataplane_protocol.h"
#include "wire/icrc.h"

using nlohmann::json;

namespace netreduce::bench {

namespace {

double percentile(std::vector<double>& v, double q) {
  if (v.empty()) return 0;
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(q * double(v.size())));
  std::nth_element(v.begin(), v.begin() + static_cast<long>(i), v.end());
  return v[i];
}

}  // namespace

BoxSample sample(Box& box) {
  const json s = box.call(netreduce::dpcmd::stats());
  BoxSample b;
  for (const auto& w : s.at("workers")) {
    b.busy += w.at("busy_cycles").get<uint64_t>();
    b.busy_polls += w.value("busy_polls", uint64_t{0});
    b.busy_w.push_back(w.at("busy_cycles").get<uint64_t>());
    b.total_w.push_back(w.at("total_cycles").get<uint64_t>());
    uint64_t rx = 0;
    for (const auto& p : w.at("rx_packets")) rx += p.get<uint64_t>();
    b.packets += rx;
    b.packets_w.push_back(rx);
    b.stalls_w.push_back(w.value("stalls", uint64_t{0}));
    b.stall_cycles_w.push_back(w.value("stall_cycles", uint64_t{0}));
    b.stall_rx_w.push_back(w.value("stall_rx_packets", uint64_t{0}));
  }
  return b;
}

Figures measure(const Options& o, const Ports& ports, const Traffic& t, Box& box, bool aggregated,
                uint64_t& next) {
  Figures f;
  Generator g(ports, t, f, o.max_inflight);
  const uint64_t per_round =
      std::max<uint64_t>(1, kRoundPackets / (uint64_t{t.spec().ranks} * t.packets_per_message()));
  // Warm-up round (caches, the box's first CLT entries), not counted.
  {
    Figures w;
    Generator gw(ports, t, w, o.max_inflight);
    if (!gw.round(next, per_round, aggregated, false, nullptr))
      throw std::runtime_error("generator mbuf pool exhausted");
    next += per_round;
    // Not timed, but checked: wrong output on the first CLT entries counts.
    f.bad += w.bad;
    f.unknown += w.unknown;
    f.duplicate += w.duplicate;
    f.missing += w.missing;
  }
  const BoxSample b0 = sample(box);
  if (aggregated && o.remove_mid_run) {
    g.at_half([&] { box.call(netreduce::dpcmd::remove_ring(t.spec().ring_id)); });
    if (!g.round(next, per_round, aggregated, true, nullptr))
      throw std::runtime_error("generator mbuf pool exhausted");
    next += per_round;
    const json st = box.call(netreduce::dpcmd::stats());
    f.ring_retired = st.at("reasons").value("ring_retired", uint64_t{0});
    f.ring_removed = st.at("reasons").value("ring_removed", uint64_t{0});
    return f;
  }
  unsigned rounds = 0;
  while ((rounds < 2 || f.seconds(g_hz) < o.seconds) && f.bad + f.unknown + f.missing == 0) {
    if (!g.round(next, per_round, aggregated, true, nullptr))
      throw std::runtime_error("generator mbuf pool exhausted");
    next += per_round;
    ++rounds;
    if (f.bad + f.unknown + f.missing > 0) break;  // reported as errors; no point going on
  }
  const BoxSample b1 = sample(box);
  f.box_busy = b1.busy - b0.busy;
  f.box_packets = b1.packets - b0.packets;
  f.box_busy_polls = b1.busy_polls - b0.busy_polls;
  for (size_t w = 0; w < b1.busy_w.size() && w < b0.busy_w.size(); ++w)
    f.busy_per_lcore.push_back(f.cycles ? double(b1.busy_w[w] - b0.busy_w[w]) / double(f.cycles)
                                        : 0.0);
  // Latency at light load: one message of every worker at a time. The first
  // round is not recorded: it follows the stats call above, a pause long
  // enough for the box's worker to sleep (idle_after_us), and the first
  // packets after an idle period are the idle phase's figure, not this one.
  std::vector<double> lat;
  Figures lf;
  Generator gl(ports, t, lf, o.max_inflight);
  if (o.latency_rounds > 0 && !gl.round(next++, 1, aggregated, false, nullptr))
    throw std::runtime_error("generator mbuf pool exhausted");
  // Skipped once anything went wrong: each round would wait out its 2 s timeout.
  for (unsigned i = 0; i < o.latency_rounds && f.bad + f.unknown + f.missing == 0 &&
                       lf.bad + lf.unknown + lf.missing == 0;
       ++i, ++next)
    if (!gl.round(next, 1, aggregated, false, &lat))
      throw std::runtime_error("generator mbuf pool exhausted");
  f.good += lf.good;
  f.bad += lf.bad;
  f.unknown += lf.unknown;
  f.duplicate += lf.duplicate;
  f.missing += lf.missing;
  f.lat_p50_us = percentile(lat, 0.5);
  f.lat_p99_us = percentile(lat, 0.99);
  return f;
}

json figures_json(const Figures& f, const Traffic& t) {
  const double s = f.seconds(g_hz);
  const double box_cpp = f.box_packets ? double(f.box_busy) / double(f.box_packets) : 0;
  return {
      {"packets_in", f.packets_in},
      {"packets_out", f.packets_out},
      {"seconds", s},
      {"mpps_in", s > 0 ? double(f.packets_in) / s / 1e6 : 0},
      {"mpps_out", s > 0 ? double(f.packets_out) / s / 1e6 : 0},
      {"gbps_in", s > 0 ? double(f.bytes_in) * 8 / s / 1e9 : 0},
      {"gbps_out", s > 0 ? double(f.bytes_out) * 8 / s / 1e9 : 0},
      {"goodput_gbps", s > 0 ? double(f.messages) * double(t.data_bytes()) * 8 / s / 1e9 : 0},
      {"messages_completed", f.messages},
      {"box_ns_per_packet", box_cpp * 1e9 / double(g_hz)},
      // Packets per loop iteration that moved any: near the burst size (32)
      // the box is saturated; near 1 it waits for traffic and box_ns_per_packet
      // is mostly its polling loop.
      {"box_mean_burst", f.box_busy_polls ? double(f.box_packets) / double(f.box_busy_polls) : 0.0},
      {"box_mpps_per_lcore", box_cpp > 0 ? double(g_hz) / box_cpp / 1e6 : 0},
      {"busy_per_lcore", f.busy_per_lcore},
      {"latency_p50_us", f.lat_p50_us},
      {"latency_p99_us", f.lat_p99_us},
      {"verified",
       {{"good", f.good},
        {"bad", f.bad},
        {"unknown", f.unknown},
        {"duplicate", f.duplicate},
        {"missing", f.missing}}},
      {"ring_retired", f.ring_retired},
      {"ring_removed", f.ring_removed}};
}

double crc_ns(unsigned bytes) {
  std::vector<uint8_t> buf(bytes);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<uint8_t>(i * 131 + 7);
  uint32_t sink = 0;
  constexpr unsigned kRuns = 5, kIters = 20000;
  double best = 1e30;
  for (unsigned r = 0; r < kRuns; ++r) {
    const uint64_t t0 = rte_rdtsc();
    for (unsigned i = 0; i < kIters; ++i) sink = wire::crc32(sink, buf.data(), buf.size());
    best = std::min(best, double(rte_rdtsc() - t0) / kIters * 1e9 / double(g_hz));
  }
  volatile uint32_t keep = sink;
  (void)keep;
  return best;
}

std::map<std::string, uint64_t> worker_cpu_ns(const std::set<std::string>& names) {
  std::map<std::string, uint64_t> out;
  const long tick = ::sysconf(_SC_CLK_TCK);
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream c(e.path() / "comm");
    std::string name;
    std::getline(c, name);
    if (!names.count(name)) continue;
    std::ifstream s(e.path() / "stat");
    std::string line;
    std::getline(s, line);
    std::istringstream rest(line.substr(line.rfind(')') + 2));
    std::string f;
    uint64_t ut = 0, st = 0;
    for (int i = 3; i <= 15 && rest >> f; ++i) {
      if (i == 14) ut = std::stoull(f);
      if (i == 15) st = std::stoull(f);
    }
    out[name] = (ut + st) * 1000000000ull / static_cast<uint64_t>(tick);
  }
  return out;
}

}  // namespace netreduce::bench
