// netreduce-loopback: the loopback performance benchmark.
//
// Theory of operation
// -------------------
// A generator plays the P workers of a ring (bench/loopback/traffic.h): it
// builds their RoCEv2 RC RDMA WRITE streams (INA headers, PSNs, ICRCs) and
// sends them into the box's port A; a sink takes what the box releases on
// port B and checks every frame byte for byte against the expected reduction
// (bench/loopback/generator.h). Every point (P, payload, dtype) is measured
// with the box forwarding only and aggregating, on the same ports in the same
// run (bench/loopback/sweep.h, bench/loopback/measure.h); the figures and
// checks make the report (bench/loopback/report.h). A wrong, unknown,
// duplicate or missing frame makes the exit status 1; a bad option makes it 2.
//
// Modes.
//   inproc  the box (the real Dataplane) runs in this process on net_ring
//           ports wired to the generator's; lcore 0 runs the box's control
//           loop, lcore 1 the box worker, lcore 2 the generator, placed
//           on the CPUs the process may use (bench/loopback/inproc.h).
//   ports   the box is another process (netreduce-dataplane); the generator
//           uses two DPDK ports given by EAL arguments: memif, af_packet, or
//           real NIC ports cabled to the box's. --box-socket names the box's
//           control socket (to install rings and switch modes).
//
// main() runs the steps in order: the options, the EAL and the generator's
// mbufs, the ports and the phases of the mode, then the report. For example
// `netreduce-loopback --ranks 4 --payloads 1024 --dtypes fp32 --seconds 0.2`
// starts the EAL with the in-process lcores and the box in this process,
// measures the one point (forward, then aggregate) and the idle phase, prints
// the table's one row and the idle line, and exits 0 if every frame was
// right.
#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_ethdev.h>
#include <rte_lcore.h>
#include <rte_mbuf.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <exception>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/loopback/generator.h"
#include "bench/loopback/inproc.h"
#include "bench/loopback/options.h"
#include "bench/loopback/report.h"
#include "bench/loopback/sweep.h"
#include "wire/ina.h"

using nlohmann::json;

namespace netreduce::bench {
namespace {

constexpr unsigned kPoolMbufs = 24576;
constexpr uint16_t kDataRoom = RTE_PKTMBUF_HEADROOM + 4352;

void add_options(CLI::App& app, Options& o) {
  app.add_option("--mode", o.mode, "inproc (box in this process, net_ring ports) or ports")
      ->check(CLI::IsMember({"inproc", "ports"}));
  app.add_flag("--pause-box-at-exit", o.pause_box_at_exit,
               "ports: resume the box's port polling at start and pause it (set_polling) before "
               "this process detaches its ports (memif: a box polling while its peer disconnects "
               "can crash inside the PMD)");
  app.add_option("--ranks", o.ranks, "workers per ring (2..16), e.g. --ranks 2,4,8,16")
      ->delimiter(',');
  app.add_option("--payloads", o.payloads, "RoCE payload bytes per packet (256..4096)")
      ->delimiter(',');
  app.add_option("--dtypes", o.dtypes, "fp32, bf16, fp16, int32, int64, fp64")->delimiter(',');
  app.add_option("--msg-len", o.msg_len, "packets per message")->check(CLI::Range(1, 65535));
  app.add_option("--window", o.window, "host window N (the box keeps 2N message slots)")
      ->check(CLI::Range(1, 65535));
  app.add_option("--seconds", o.seconds, "timed seconds per measurement");
  app.add_option("--latency-rounds", o.latency_rounds, "light-load messages for latency");
  app.add_flag("!--no-forward", o.forward, "skip the forward-only baseline");
  app.add_flag("--forward-only", o.forward_only,
               "measure only the forward-only baseline (no ring: e.g. before the ring is "
               "installed through netreduced)");
  app.add_flag("--remove-mid-run", o.remove_mid_run,
               "functional test: remove the ring halfway through the first aggregate round; "
               "fails if any frame released is wrong, or nothing was withheld");
  app.add_flag("!--no-install", o.install,
               "ports mode: the ring is installed already (e.g. through netreduced)");
  app.add_option("--ring-id", o.ring_id, "ring id the generator uses");
  app.add_option("--box-socket", o.box_socket, "ports mode: the box's control socket");
  app.add_option("--tx-port", o.tx_port, "ports mode: DPDK port cabled to the box's port A");
  app.add_option("--rx-port", o.rx_port, "ports mode: DPDK port cabled to the box's port B");
  app.add_option("--json", o.json_out, "write the report as JSON to this file");
  app.add_flag("--quiet", o.quiet,
               "no progress lines: only the result table on stdout (nothing at all with --json)");
  app.add_option("--idle-seconds", o.idle_seconds,
                 "inproc: seconds of the idle phase after the sweep (CPU share of the box's "
                 "worker with no traffic, then one message through it, verified); 0: none");
  app.add_option("--idle-sleep-max-us", o.idle_sleep_max_us,
                 "inproc: the box's idle_sleep_max_us (default: the data plane's default)")
      ->check(CLI::Range(0, 100000));
  app.add_option("--reduce-mode", o.reduce_mode,
                 "inproc: the box's engine.reduce_mode (deterministic or accumulate)")
      ->check(CLI::IsMember({"deterministic", "accumulate"}));
  app.add_option("--workers", o.workers,
                 "inproc: box workers (1 to 16; more than 1 runs the per-worker phase: one ring "
                 "and one generator thread per worker, each on a CPU of its own while the "
                 "machine has 2W + 1, sharing them past that)")
      ->check(CLI::Range(1, 16));
  app.add_flag("--stripes", o.stripes,
               "per-worker phase: the rings are the stripes of one job (the same members, "
               "each ring its own QPs, as the host library's Options::rings registers them): "
               "the box spreads them over its workers by connection");
  app.add_flag("--per-worker", o.per_worker,
               "inproc: the per-worker phase instead of the sweep (aggregate only; per box "
               "worker: busy and CPU ns per packet), e.g. with --workers 1 as the baseline");
  app.add_option("--scrape-hz", o.scrape_hz,
                 "a second control client asks status, stats and list_rings (a netreduced "
                 "scrape) this often per second during the sweep (0: never)")
      ->check(CLI::Range(0.0, 10000.0));
  app.add_option("--max-inflight", o.max_inflight,
                 "frames sent and not yet back (default 4096 in process, 512 over ports; must "
                 "exceed ranks x msg-len)");
  app.allow_extras();
}

// The options against each other, and the defaults that depend on the mode.
// 0, or the exit status (2) after saying what is wrong.
int check_options(Options& o) {
  for (const auto& d : o.dtypes)
    if (!wire::parse_dtype(d)) {
      std::fprintf(stderr, "netreduce-loopback: --dtypes: unknown dtype '%s'\n", d.c_str());
      return 2;
    }
  const bool inproc = o.mode == "inproc";
  if (o.workers > 1) o.per_worker = true;
  if (o.per_worker && (!inproc || o.remove_mid_run || o.forward_only)) {
    std::fprintf(stderr,
                 "netreduce-loopback: --per-worker / --workers N is for inproc mode, without "
                 "--remove-mid-run and --forward-only\n");
    return 2;
  }
  if (o.max_inflight == 0) o.max_inflight = inproc ? 4096 : 512;
  for (unsigned P : o.ranks)
    if (o.max_inflight <= size_t{P} * o.msg_len) {
      std::fprintf(stderr, "netreduce-loopback: --max-inflight must exceed ranks x msg-len (%u)\n",
                   P * o.msg_len);
      return 2;
    }
  if (o.forward_only && (!o.forward || o.remove_mid_run)) {
    std::fprintf(stderr,
                 "netreduce-loopback: --forward-only excludes --no-forward and --remove-mid-run\n");
    return 2;
  }
  if (!o.install && o.forward && !o.forward_only) {
    std::fprintf(stderr,
                 "netreduce-loopback: --no-install measures aggregate mode only (the box refuses "
                 "forward mode while a ring is installed): add --no-forward, and measure the "
                 "baseline with --forward-only before installing the ring\n");
    return 2;
  }
  if (!o.install && o.remove_mid_run) {
    std::fprintf(stderr, "netreduce-loopback: --remove-mid-run removes the ring it installs\n");
    return 2;
  }
  if (!o.install && (inproc || o.ranks.size() * o.payloads.size() * o.dtypes.size() != 1)) {
    std::fprintf(stderr,
                 "netreduce-loopback: --no-install is for ports mode with one ring (one value "
                 "each of --ranks, --payloads, --dtypes); reinstall the ring between runs\n");
    return 2;
  }
  if (!inproc && (o.box_socket.empty() || o.tx_port.empty() || o.rx_port.empty())) {
    std::fprintf(stderr,
                 "netreduce-loopback: ports mode needs --box-socket, --tx-port and --rx-port\n");
    return 2;
  }
  return 0;
}

// The EAL's arguments: the in-process mode's own (its box's control socket
// is named after this process), then the command line's after "--".
std::vector<std::string> eal_arguments(Options& o, std::vector<std::string> extra) {
  if (!extra.empty() && extra.front() == "--") extra.erase(extra.begin());
  const std::string prefix = "nrlb" + std::to_string(::getpid());
  std::vector<std::string> eal = {"netreduce-loopback"};
  if (o.mode == "inproc") {
    o.box_socket = "/tmp/" + prefix + ".sock";
    o.lcore_cpus = inproc_cpus(o.workers, usable_cpus());  // before the EAL pins this thread
    const std::vector<std::string> own = inproc_eal_args(o.lcore_cpus, prefix);
    eal.insert(eal.end(), own.begin(), own.end());
  }
  eal.insert(eal.end(), extra.begin(), extra.end());
  return eal;
}

// The EAL on `eal` (which outlives it), the TSC rate, the generator's mbufs.
// 0, or the exit status (1).
int start_eal(std::vector<std::string>& eal, unsigned workers, Ports& ports) {
  std::vector<char*> eal_argv;
  for (auto& a : eal) eal_argv.push_back(a.data());
  if (rte_eal_init(static_cast<int>(eal_argv.size()), eal_argv.data()) < 0) {
    std::fprintf(stderr, "netreduce-loopback: EAL initialization failed: %s\n",
                 rte_strerror(rte_errno));
    return 1;
  }
  g_hz = rte_get_tsc_hz();
  // Each generator thread allocates a round's mbufs (up to kRoundPackets)
  // at once: one pool share per two workers.
  ports.pool = rte_pktmbuf_pool_create("nrlb_gen", kPoolMbufs * std::max(1u, (workers + 1) / 2),
                                       256, 0, kDataRoom, rte_socket_id());
  if (!ports.pool) {
    std::fprintf(stderr, "netreduce-loopback: cannot allocate the generator's mbufs: %s\n",
                 rte_strerror(rte_errno));
    return 1;
  }
  return 0;
}

// Ports mode: the sweep on the two DPDK ports named, against a box in another
// process. 0, or the exit status when the ports cannot be set up.
int run_ports(const Options& o, Ports& ports, json& report, std::string& error) {
  uint16_t tx, rx;
  if (rte_eth_dev_get_port_by_name(o.tx_port.c_str(), &tx) != 0 ||
      rte_eth_dev_get_port_by_name(o.rx_port.c_str(), &rx) != 0) {
    std::fprintf(stderr, "netreduce-loopback: no DPDK port named %s or %s (give --vdev/-a)\n",
                 o.tx_port.c_str(), o.rx_port.c_str());
    return 2;
  }
  ports.tx = tx;
  ports.rx = rx;
  std::string e = port_setup(tx, ports.pool);
  if (e.empty() && rx != tx) e = port_setup(rx, ports.pool);
  if (!e.empty()) {
    std::fprintf(stderr, "netreduce-loopback: %s\n", e.c_str());
    return 1;
  }
  try {
    report["points"] = sweep(o, ports);
  } catch (const std::exception& ex) {
    error = ex.what();
  }
  return 0;
}

// The results on stdout, the verdict, the ports and the EAL closed, the
// report written (--json). Returns the exit status.
int finish(const Options& o, const Ports& ports, json& report, const std::string& error) {
  int rc = 0;
  // --quiet --json: the report goes to the file alone, stdout stays empty.
  const bool print_results = !(o.quiet && !o.json_out.empty());
  if (!error.empty()) {
    std::fprintf(stderr, "netreduce-loopback: %s\n", error.c_str());
    rc = 1;
  } else if (print_results) {
    print_report(report, o);
  }
  if (error.empty() && !report_ok(report, o.remove_mid_run)) {
    std::fprintf(stderr, "netreduce-loopback: some released frames were wrong or missing\n");
    rc = 1;
  }
  for (uint16_t p : {ports.tx, ports.rx}) {
    rte_eth_dev_stop(p);
    rte_eth_dev_close(p);
  }
  report["ok"] = rc == 0;
  if (!o.json_out.empty()) std::ofstream(o.json_out) << report.dump(2) << "\n";
  rte_eal_cleanup();
  return rc;
}

}  // namespace
}  // namespace netreduce::bench

int main(int argc, char** argv) {
  CLI::App app{
      "netreduce-loopback: P synthetic RoCE workers through the box; every released frame "
      "checked; figures with their ratio to the forward-only mode on the same ports"};
  namespace nb = netreduce::bench;
  nb::Options o;
  nb::add_options(app, o);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  // The in-process box logs as netreduce-dataplane does, but to stderr:
  // stdout holds the results alone. --quiet keeps its warnings only.
  spdlog::set_default_logger(spdlog::stderr_logger_mt("netreduce-loopback"));
  if (o.quiet) spdlog::set_level(spdlog::level::warn);
  if (const int rc = nb::check_options(o); rc != 0) return rc;
  std::vector<std::string> eal = nb::eal_arguments(o, app.remaining());
  nb::Ports ports;
  if (const int rc = nb::start_eal(eal, o.workers, ports); rc != 0) return rc;
  json report = nb::report_head(o);
  std::string error;
  const int rc = o.mode == "inproc" ? nb::run_inproc(o, ports, report, error)
                                    : nb::run_ports(o, ports, report, error);
  if (rc != 0) return rc;
  return nb::finish(o, ports, report, error);
}
