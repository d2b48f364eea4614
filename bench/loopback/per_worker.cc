#include "bench/loopback/per_worker.h"

#include <cstdio>
#include <map>
#include <optional>
#include <set>

#include "bench/loopback/box_client.h"
#include "bench/loopback/measure.h"
#include "common/dataplane_protocol.h"
#include "tests/support/ring_traffic.h"

using nlohmann::json;

namespace netreduce::bench {

namespace {

// One generator thread's part of the phase.
struct ThreadState {
  ThreadState(PhaseShared& shared, unsigned thread) : sh(shared), q(thread) {}
  PhaseShared& sh;
  unsigned q;
  unsigned gen = 0;              // barriers passed
  std::optional<Box> box;        // thread 0 only
  std::vector<unsigned> lcores;  // thread 0: the box workers' lcores
  std::set<std::string> names;   // and their threads' names
};

// Ring q's traffic at one point.
TrafficSpec worker_spec(const Options& o, unsigned q, unsigned P, unsigned payload,
                        const std::string& dt) {
  TrafficSpec s = point_spec(o, P, payload, dt);
  s.ring_id = o.ring_id + q;
  if (o.stripes) {  // one job: the same members, each ring its own QPs
    s.members_of = o.ring_id;
    s.qpn0 = netreduce::testing::RingAddressing::kQpn0 + 0x100 * q;
  }
  return s;
}

// Thread q's timed rounds; false if one failed.
bool timed_rounds(ThreadState& th, Generator& g, Figures& f, uint64_t& next, uint64_t per_round,
                  bool ok) {
  PhaseShared& sh = th.sh;
  const Options& o = *sh.o;
  unsigned rounds = 0;
  if (!o.stripes) {
    while (ok && (rounds < 2 || f.seconds(g_hz) < o.seconds) &&
           f.bad + f.unknown + f.missing == 0) {
      ok = g.round(next, per_round, true, true, nullptr);
      next += per_round;
      ++rounds;
    }
    return ok;
  }
  // One job's stripes advance together, as a striped all-reduce
  // sends every stripe of each call: every generator runs the same
  // rounds, generator 0 decides when to stop. Two barriers per round
  // (read the decision, then let generator 0 make the next one).
  sh.stop.store(false);
  sh.barrier(th.gen);
  for (;;) {
    if (ok && !sh.failed.load()) ok = g.round(next, per_round, true, true, nullptr);
    next += per_round;
    ++rounds;
    if (!ok || f.bad + f.unknown + f.missing != 0) sh.failed.store(true);
    sh.barrier(th.gen);
    if (th.q == 0 && (sh.failed.load() || (rounds >= 2 && f.seconds(g_hz) >= o.seconds)))
      sh.stop.store(true);
    sh.barrier(th.gen);
    if (sh.stop.load()) break;
  }
  return ok && !sh.failed.load();
}

// Box worker w's figures between the samples b0 and b1 (thread 0).
json worker_json(const ThreadState& th, size_t w, const BoxSample& b0, const BoxSample& b1,
                 const std::map<std::string, uint64_t>& cpu0,
                 const std::map<std::string, uint64_t>& cpu1, const json& st) {
  const uint64_t pk = b1.packets_w[w] - b0.packets_w[w];
  const std::string name = "rte-worker-" + std::to_string(th.lcores.at(w));
  const uint64_t cpu = cpu1.count(name) && cpu0.count(name) ? cpu1.at(name) - cpu0.at(name) : 0;
  const Figures& gf = th.sh.figs.at(w);
  // Busy cycles and packets of the polls that were not preempted.
  const uint64_t stalls = b1.stalls_w[w] - b0.stalls_w[w];
  const uint64_t clean_busy =
      (b1.busy_w[w] - b0.busy_w[w]) - (b1.stall_cycles_w[w] - b0.stall_cycles_w[w]);
  const uint64_t clean_pk = pk - (b1.stall_rx_w[w] - b0.stall_rx_w[w]);
  return {{"worker", w},
          {"packets", pk},
          {"busy_ns_per_packet",
           pk ? double(b1.busy_w[w] - b0.busy_w[w]) * 1e9 / double(g_hz) / double(pk) : 0.0},
          {"stalls", stalls},
          {"unstalled_busy_ns_per_packet",
           clean_pk ? double(clean_busy) * 1e9 / double(g_hz) / double(clean_pk) : 0.0},
          {"cpu_ns_per_packet", pk ? double(cpu) / double(pk) : 0.0},
          {"dispatched", st.at("workers").at(w).value("dispatched", uint64_t{0})},
          {"generator_mpps", gf.cycles ? double(gf.packets_in) / gf.seconds(g_hz) / 1e6 : 0.0},
          {"verified",
           {{"good", gf.good},
            {"bad", gf.bad},
            {"unknown", gf.unknown},
            {"duplicate", gf.duplicate},
            {"missing", gf.missing}}}};
}

// Thread 0 after the timed rounds: records the point, removes the rings.
void record_point(ThreadState& th, const BoxSample& b0, const std::map<std::string, uint64_t>& cpu0,
                  unsigned P, unsigned payload, const std::string& dt) {
  PhaseShared& sh = th.sh;
  const Options& o = *sh.o;
  const BoxSample b1 = sample(*th.box);
  const auto cpu1 = worker_cpu_ns(th.names);
  const json st = th.box->call(netreduce::dpcmd::stats());
  json workers = json::array();
  for (size_t w = 0; w < b1.packets_w.size() && w < b0.packets_w.size(); ++w)
    workers.push_back(worker_json(th, w, b0, b1, cpu0, cpu1, st));
  sh.points.push_back({{"ranks", P},
                       {"payload", payload},
                       {"dtype", dt},
                       {"crc_ns", crc_ns(payload)},
                       {"workers", workers}});
  for (unsigned r = 0; r < sh.n; ++r) {
    th.box->call(netreduce::dpcmd::remove_ring(o.ring_id + r));
    wait_retired(*th.box, o.ring_id + r);
  }
  if (!o.quiet)
    std::fprintf(stderr, "per-worker: P=%u payload=%u %s done\n", P, payload, dt.c_str());
}

// One point, all threads at once: thread 0 installs every ring, each thread
// warms up and runs its timed rounds, thread 0 records and removes.
void run_point(ThreadState& th, unsigned P, unsigned payload, const std::string& dt) {
  PhaseShared& sh = th.sh;
  const Options& o = *sh.o;
  const unsigned q = th.q;
  const Traffic t(worker_spec(o, q, P, payload, dt));
  sh.barrier(th.gen);
  if (q == 0)
    for (unsigned r = 0; r < sh.n; ++r)
      th.box->call(
          netreduce::dpcmd::install_ring(ring_of(Traffic(worker_spec(o, r, P, payload, dt)))));
  sh.barrier(th.gen);
  Figures& f = sh.figs[q];
  f = Figures{};
  Generator g(sh.ports[q], t, f, o.max_inflight);
  const uint64_t per_round =
      std::max<uint64_t>(1, kRoundPackets / (uint64_t{P} * t.packets_per_message()));
  uint64_t next = 0;
  bool ok = !sh.failed.load();
  {  // warm-up, checked, not timed
    Figures w;
    Generator gw(sh.ports[q], t, w, o.max_inflight);
    ok = ok && gw.round(next, per_round, true, false, nullptr);
    next += per_round;
    f.bad += w.bad;
    f.unknown += w.unknown;
    f.missing += w.missing;
    f.duplicate += w.duplicate;
  }
  sh.barrier(th.gen);
  BoxSample b0;
  std::map<std::string, uint64_t> cpu0;
  if (q == 0) {
    b0 = sample(*th.box);
    cpu0 = worker_cpu_ns(th.names);
  }
  sh.barrier(th.gen);
  ok = timed_rounds(th, g, f, next, per_round, ok);
  if (!ok) sh.failed.store(true);
  sh.barrier(th.gen);
  if (q == 0) record_point(th, b0, cpu0, P, payload, dt);
  sh.barrier(th.gen);
}

}  // namespace

void per_worker_thread(PhaseShared& sh, unsigned q) {
  ThreadState th(sh, q);
  if (q == 0) {
    th.box.emplace(sh.o->box_socket);
    const json st = th.box->call(netreduce::dpcmd::stats());
    for (const auto& w : st.at("workers")) {
      th.lcores.push_back(w.value("lcore", 0u));
      th.names.insert("rte-worker-" + std::to_string(th.lcores.back()));
    }
  }
  for (unsigned P : sh.o->ranks)
    for (unsigned payload : sh.o->payloads)
      for (const std::string& dt : sh.o->dtypes) run_point(th, P, payload, dt);
}

}  // namespace netreduce::bench
