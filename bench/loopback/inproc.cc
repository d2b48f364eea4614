#include "bench/loopback/inproc.h"

#include <rte_errno.h>
#include <rte_eth_ring.h>
#include <rte_launch.h>
#include <rte_lcore.h>
#include <rte_ring.h>
#include <sched.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>

#include "bench/loopback/box_client.h"
#include "bench/loopback/per_worker.h"
#include "bench/loopback/sweep.h"
#include "dataplane/dataplane.h"

using nlohmann::json;

namespace netreduce::bench {

namespace {

// What a generator lcore runs and what it leaves for the report.
struct InprocArgs {
  const Options* o;
  Ports ports;
  json points;
  json idle;
  std::string error;
  netreduce::dataplane::Dataplane* dp;
  PhaseShared* phase = nullptr;
  unsigned q = 0;
};

int generator_lcore(void* arg) {
  auto* a = static_cast<InprocArgs*>(arg);
  if (a->phase) {
    try {
      per_worker_thread(*a->phase, a->q);
    } catch (const std::exception& e) {
      a->error = e.what();
      a->phase->failed.store(true);
      // Other threads may wait in a barrier for this one: a failed phase
      // exits the process after reporting.
      std::fprintf(stderr, "netreduce-loopback: per-worker phase: %s\n", e.what());
      std::fflush(stderr);
      std::_Exit(1);
    }
    if (a->q == 0) a->dp->stop();
    return 0;
  }
  try {
    a->points = sweep(*a->o, a->ports);
    if (a->o->idle_seconds > 0 && !a->o->forward_only && !a->o->remove_mid_run) {
      Box box(a->o->box_socket);
      a->idle = idle_phase(*a->o, a->ports, box);
    }
  } catch (const std::exception& e) {
    a->error = e.what();
  }
  a->dp->stop();
  return 0;
}

// Creates a net_ring port pair: `a` receives what `b` sends and vice versa.
std::string ring_pair(const std::string& a, const std::string& b, uint16_t& pa, uint16_t& pb,
                      unsigned nq = 1) {
  std::vector<rte_ring*> ab(nq), ba(nq);
  for (unsigned q = 0; q < nq; ++q) {
    // Appends only: GCC 12 at -O3 warns falsely (-Wrestrict) on
    // `"literal" + std::string` here.
    const std::string sfx = nq > 1 ? std::string("_").append(std::to_string(q)) : std::string();
    ab[q] = rte_ring_create((a + "_to_" + b + sfx).c_str(), 16384, rte_socket_id(),
                            RING_F_SP_ENQ | RING_F_SC_DEQ);
    ba[q] = rte_ring_create((b + "_to_" + a + sfx).c_str(), 16384, rte_socket_id(),
                            RING_F_SP_ENQ | RING_F_SC_DEQ);
    if (!ab[q] || !ba[q]) return "cannot create rings: " + std::string(rte_strerror(rte_errno));
  }
  const int ia = rte_eth_from_rings(a.c_str(), ba.data(), nq, ab.data(), nq, rte_socket_id());
  const int ib = rte_eth_from_rings(b.c_str(), ab.data(), nq, ba.data(), nq, rte_socket_id());
  if (ia < 0 || ib < 0) return "cannot create ring ports: " + std::string(rte_strerror(rte_errno));
  pa = static_cast<uint16_t>(ia);
  pb = static_cast<uint16_t>(ib);
  return "";
}

// The generator's ports (ports.tx, ports.rx) and the box's ends of them, a
// queue per box worker. "" or what failed.
std::string make_ports(Ports& ports, unsigned workers) {
  uint16_t box_a, box_b;
  const auto nq = static_cast<uint16_t>(workers);
  std::string e = ring_pair("nrlb_gen_a", "nrlb_box_a", ports.tx, box_a, nq);
  if (e.empty()) e = ring_pair("nrlb_gen_b", "nrlb_box_b", ports.rx, box_b, nq);
  if (e.empty()) e = port_setup(ports.tx, ports.pool, nq);
  if (e.empty()) e = port_setup(ports.rx, ports.pool, nq);
  return e;
}

netreduce::dataplane::DataplaneConfig box_config(const Options& o) {
  netreduce::dataplane::DataplaneConfig cfg;
  cfg.ports = {{"net_ring_nrlb_box_a"}, {"net_ring_nrlb_box_b"}};  // the ring PMD prefixes names
  cfg.workers.clear();
  for (unsigned q = 0; q < o.workers; ++q) cfg.workers.push_back(2 * q + 1);
  // Each worker's ring may hold 384 packets, and half the pool stays for RX.
  cfg.mbufs = std::max(8192u, 2048 * o.workers);
  cfg.engine_memory = 512ull << 20;
  cfg.control_socket = o.box_socket;
  cfg.retire_grace_ms = 100;  // a removed ring is gone before the next point
  if (o.idle_sleep_max_us >= 0) cfg.idle_sleep_max_us = static_cast<uint32_t>(o.idle_sleep_max_us);
  cfg.reduce_mode = o.reduce_mode == "accumulate" ? netreduce::engine::ReduceMode::accumulate
                                                  : netreduce::engine::ReduceMode::deterministic;
  return cfg;
}

}  // namespace

std::vector<unsigned> usable_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<unsigned> cpus;
  if (sched_getaffinity(0, sizeof set, &set) == 0)
    for (unsigned c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) cpus.push_back(c);
  if (cpus.empty()) cpus.push_back(0);
  return cpus;
}

std::vector<unsigned> inproc_cpus(unsigned workers, const std::vector<unsigned>& cpus) {
  const size_t n = cpus.size();
  std::vector<unsigned> place(2 * workers + 1, cpus[0]);
  for (unsigned q = 0; q < workers; ++q) {
    if (n <= 2) {
      place[2 * q + 1] = cpus[1 % n];
      continue;
    }
    // Round the CPUs after the first, then the first again.
    place[2 * q + 1] = cpus[(1 + q) % n];
    place[2 * q + 2] = cpus[(1 + workers + q) % n];
  }
  return place;
}

std::vector<std::string> inproc_eal_args(const std::vector<unsigned>& place,
                                         const std::string& prefix) {
  const auto workers = static_cast<unsigned>(place.size() / 2);
  std::string lcores;
  for (size_t l = 0; l < place.size(); ++l)
    lcores.append(l ? "," : "")
        .append(std::to_string(l))
        .append("@")
        .append(std::to_string(place[l]));
  // The generators' mbufs (a pool share per two workers) and the box's
  // engine memory, with room to spare.
  const std::string memory = std::to_string(std::max(1536u, 1024 + 128 * workers));
  std::vector<std::string> eal;
  for (const char* a : {"--no-huge", "-m", memory.c_str(), "--lcores", lcores.c_str(), "--no-pci",
                        "--log-level", "lib.eal:warning"})
    eal.push_back(a);
  eal.push_back("--file-prefix");
  eal.push_back(prefix);
  return eal;
}

int run_inproc(const Options& o, Ports& ports, json& report, std::string& error) {
  if (std::string e = make_ports(ports, o.workers); !e.empty()) {
    std::fprintf(stderr, "netreduce-loopback: %s\n", e.c_str());
    return 1;
  }
  netreduce::dataplane::Dataplane dp(box_config(o));
  if (netreduce::Status s = dp.setup(); !s) {
    std::fprintf(stderr, "netreduce-loopback: box: %s\n", s.to_string().c_str());
    return 1;
  }
  InprocArgs args{&o, ports, {}, {}, {}, &dp};
  PhaseShared phase;
  // Generators 1.. of the per-worker phase (generator 0 is `args`).
  std::vector<InprocArgs> more(o.workers - 1, InprocArgs{&o, ports, {}, {}, {}, &dp});
  if (o.per_worker) {
    phase.o = &o;
    phase.n = o.workers;
    for (unsigned q = 0; q < o.workers; ++q) {
      phase.ports.push_back(ports);
      phase.ports.back().q = static_cast<uint16_t>(q);
    }
    phase.figs.resize(o.workers);
    args.phase = &phase;
    for (unsigned q = 1; q < o.workers; ++q) {
      more[q - 1].phase = &phase;
      more[q - 1].q = q;
    }
  }
  if (rte_eal_remote_launch(generator_lcore, &args, 2) != 0 ||
      std::any_of(more.begin(), more.end(), [&](InprocArgs& a) {
        return rte_eal_remote_launch(generator_lcore, &a, 2 * a.q + 2) != 0;
      })) {
    std::fprintf(stderr, "netreduce-loopback: cannot start the generator(s) on lcores 2, 4, ...\n");
    return 1;
  }
  // Returns when the generator stops it (or at once, if the box cannot
  // start: the generator then fails to connect and says so).
  // The box's final counters stay off stdout (they would follow the table
  // as one long JSON line); the sweep reads the box's counters itself.
  if (netreduce::Status s = dp.run(nullptr); !s) {
    std::fprintf(stderr, "netreduce-loopback: box: %s\n", s.to_string().c_str());
    dp.stop();
  }
  rte_eal_wait_lcore(2);
  for (const InprocArgs& a : more) rte_eal_wait_lcore(2 * a.q + 2);
  report["lcore_cpus"] = o.lcore_cpus;
  if (o.per_worker) {
    report["per_worker"] = {{"workers", o.workers}, {"points", phase.points}};
    report["points"] = json::array();
  } else {
    report["points"] = args.points;
  }
  if (!args.idle.is_null()) report["idle"] = args.idle;
  error = args.error;
  return 0;
}

}  // namespace netreduce::bench
