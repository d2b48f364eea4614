// netreduce-loopback: the loopback performance benchmark.
//
// Theory of operation
// -------------------
// A generator plays the P workers of a ring (traffic.h): it builds their
// RoCEv2 RC RDMA WRITE streams (INA headers, PSNs, ICRCs) and sends them into
// the box's port A; a sink takes what the box releases on port B and checks
// every frame byte for byte against the expected reduction. Both run on one
// lcore; the box runs on its own.
//
// Measurement. Each measurement is a series of rounds. A round's frames are
// built first (not timed); then the timed part pushes them into the box as
// fast as the port takes them and collects the box's output, so the box is
// the bottleneck whenever it is slower than pointer passing. After the round
// every collected frame is checked and freed. For every point (P, payload,
// dtype) the same ports are measured twice in the same run: with the box in
// forward-only mode (the baseline: same burst loop, no INA processing) and
// in aggregate mode. Figures: packet and bit rates in and out (wall clock),
// goodput (one copy of each completed message's tensor data per second), the
// box's own cost per packet from its worker's busy cycles (so "Mpps per lcore"
// is what one box lcore sustains), busy ratio, and latency through the box
// measured separately at light load (one message of every worker at a time).
//
// Modes.
//   inproc  the box (the real Dataplane) runs in this process on net_ring
//           ports wired to the generator's; lcore 0 runs the box's control
//           loop, lcore 1 the box worker, lcore 2 the generator.
//   ports   the box is another process (netreduce-dataplane); the generator
//           uses two DPDK ports given by EAL arguments: memif, af_packet, or
//           real NIC ports cabled to the box's. --box-socket names the box's
//           control socket (to install rings and switch modes).
#include <rte_cycles.h>
#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_eth_ring.h>
#include <rte_ethdev.h>
#include <rte_lcore.h>
#include <rte_mbuf.h>
#include <rte_ring.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "bench/loopback/traffic.h"
#include "common/dataplane_protocol.h"
#include "common/ring_json.h"
#include "dataplane/dataplane.h"
#include "wire/icrc.h"

using nlohmann::json;
namespace nb = netreduce::bench;
namespace wire = netreduce::wire;

namespace {

// The box's control socket through the one data plane client
// (common/dataplane_protocol.h): connects, waiting up to 10 s for a box that
// is still starting; each call has a 10 s deadline. A failed call, or (if
// `must_succeed`) an error reply, throws naming the command and the box's error.
class Box {
 public:
  explicit Box(const std::string& path) : client_(path, std::chrono::seconds(10)) {
    if (netreduce::Status s = client_.wait_until_connected(std::chrono::seconds(10)); !s)
      throw std::runtime_error("cannot connect to the data plane's control socket " + path + ": " +
                               s.to_string());
  }
  json call(const json& req, bool must_succeed = true) {
    json reply;
    const netreduce::Status s = client_.call(req, reply);
    if (!s && (must_succeed || s.code() == netreduce::StatusCode::unavailable))
      throw std::runtime_error("data plane: " + req.value("cmd", std::string("?")) + ": " +
                               s.to_string());
    return reply;
  }

 private:
  netreduce::DataplaneClient client_;
};

// --scrape-hz: a second control client asks the box what netreduced asks it
// for every /metrics scrape (status, stats, list_rings), `hz` times a second,
// on its own thread, from construction to destruction. `window()` counts the
// scrapes completed since the previous call and their latency.
class Scraper {
 public:
  Scraper(const std::string& socket, double hz) {
    if (hz <= 0) return;
    thread_ = std::thread([this, socket, hz] {
      Box box(socket);
      const auto period = std::chrono::duration<double>(1.0 / hz);
      auto next = std::chrono::steady_clock::now();
      while (!stop_.load(std::memory_order_relaxed)) {
        const auto t0 = std::chrono::steady_clock::now();
        for (const json& req : {netreduce::dpcmd::status(), netreduce::dpcmd::stats(),
                                netreduce::dpcmd::list_rings()})
          if (!box.call(req, false).value("ok", false)) failed_.fetch_add(1);
        const double ms =
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                .count();
        {
          std::lock_guard<std::mutex> l(mu_);
          ++count_;
          sum_ms_ += ms;
          max_ms_ = std::max(max_ms_, ms);
        }
        next += std::chrono::duration_cast<std::chrono::steady_clock::duration>(period);
        while (!stop_.load(std::memory_order_relaxed) && std::chrono::steady_clock::now() < next)
          std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(
              next - std::chrono::steady_clock::now(), std::chrono::milliseconds(10)));
      }
    });
  }
  ~Scraper() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
  }
  json window() {
    std::lock_guard<std::mutex> l(mu_);
    json j = {{"scrapes", count_},
              {"failed_requests", failed_.exchange(0)},
              {"mean_ms", count_ ? sum_ms_ / double(count_) : 0.0},
              {"max_ms", max_ms_}};
    count_ = 0;
    sum_ms_ = max_ms_ = 0;
    return j;
  }

 private:
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> failed_{0};
  std::mutex mu_;
  uint64_t count_ = 0;
  double sum_ms_ = 0, max_ms_ = 0;
};

constexpr unsigned kBurst = 32;
constexpr unsigned kRoundPackets = 8192;
constexpr unsigned kPoolMbufs = 24576;
constexpr uint16_t kDataRoom = RTE_PKTMBUF_HEADROOM + 4352;

struct Options {
  std::string mode = "inproc";
  bool pause_box_at_exit = false;  // ports: resume the box's polling at start, pause it at exit
  std::vector<unsigned> ranks{2, 4, 8, 16};
  std::vector<unsigned> payloads{1024, 4096};
  std::vector<std::string> dtypes{"fp32", "bf16"};
  unsigned msg_len = 4;
  unsigned window = 16;
  double seconds = 0.5;
  unsigned latency_rounds = 300;
  bool forward = true;
  bool forward_only = false;
  bool install = true;
  bool remove_mid_run = false;
  uint32_t ring_id = 0xB0;
  std::string box_socket;
  std::string tx_port, rx_port;
  std::string json_out;
  bool quiet = false;
  size_t max_inflight = 0;     // 0: 4096 in process, 512 over ports
  double scrape_hz = 0;        // a scraper's status+stats+list_rings per second (0: none)
  double idle_seconds = 2;     // inproc: the idle phase (0: none)
  int idle_sleep_max_us = -1;  // inproc: the box's idle_sleep_max_us (-1: its default)
  std::string reduce_mode = "deterministic";  // inproc: the box's engine.reduce_mode
  unsigned workers = 1;                       // inproc: box workers
  bool per_worker = false;                    // inproc: the per-worker phase instead of the sweep
  bool stripes = false;  // per-worker phase: the rings are one job's stripes (same members)
};

struct Figures {
  uint64_t packets_in = 0, packets_out = 0, bytes_in = 0, bytes_out = 0;
  uint64_t cycles = 0;  // timed
  uint64_t good = 0, bad = 0, unknown = 0, duplicate = 0, missing = 0;
  uint64_t ring_retired = 0;  // --remove-mid-run: the box's counts after the removal
  uint64_t ring_removed = 0;
  uint64_t messages = 0;
  uint64_t box_busy = 0, box_packets = 0, box_busy_polls = 0;
  std::vector<double> busy_per_lcore;
  double lat_p50_us = 0, lat_p99_us = 0;
  double seconds(uint64_t hz) const { return double(cycles) / double(hz); }
};

struct Ports {
  uint16_t tx = 0, rx = 0;
  uint16_t q = 0;  // the queue (of both ports) this generator uses
  rte_mempool* pool = nullptr;
};

uint64_t g_hz = 0;

// A generator port through the data plane's own port setup (ports.h): nq
// RX and TX queues, 2048 descriptors, the largest MTU up to 4200, started
// promiscuous. "" or what failed.
std::string port_setup(uint16_t port, rte_mempool* pool, uint16_t nq = 1) {
  netreduce::dataplane::PortSetup p;
  p.port = port;
  p.name = "generator port " + std::to_string(port);
  p.field = "port";
  p.rx_queues = p.tx_queues = nq;
  p.rx_desc = p.tx_desc = 2048;
  p.pool = pool;
  if (netreduce::Status s = netreduce::dataplane::configure_port(p); !s) return s.to_string();
  if (netreduce::Status s = netreduce::dataplane::start_port(p); !s) return s.to_string();
  return "";
}

// The box's worker counters, summed: (busy cycles, packets received, per-worker busy).
struct BoxSample {
  uint64_t busy = 0, packets = 0, busy_polls = 0;
  std::vector<uint64_t> busy_w, total_w, packets_w;
  std::vector<uint64_t> stalls_w, stall_cycles_w, stall_rx_w;  // polls over 100 us (preempted)
};
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

class Generator {
 public:
  Generator(const Ports& ports, const nb::Traffic& t, Figures& f, size_t max_inflight)
      : p_(ports), t_(t), f_(f), scratch_(t.max_frame()), max_inflight_(max_inflight) {}

  // Called once, in the next round, about halfway and mid-message: when the
  // frames of its first half plus one packet position have been sent and
  // released, and P-1 workers' packets of the next position have been sent
  // (so the box holds them). --remove-mid-run removes the ring there.
  void at_half(std::function<void()> fn) { at_half_ = std::move(fn); }

  // Sends messages [base, base + count) of every worker; collects and checks
  // what comes back. Returns false if the pool ran dry.
  bool round(uint64_t base, uint64_t count, bool aggregated, bool timed,
             std::vector<double>* latencies) {
    const unsigned P = t_.spec().ranks;
    const uint32_t L = t_.packets_per_message();
    const size_t total = count * L * P;
    // --remove-mid-run: frames before `complete` are released before the
    // callback; the P-1 after it are held.
    const size_t complete = std::min(total, (total / (2 * P) + 1) * P);
    const size_t cut = at_half_ ? std::min(total, complete + P - 1) : total;
    out_.resize(total);
    in_.resize(total + kBurst);
    if (rte_pktmbuf_alloc_bulk(p_.pool, out_.data(), static_cast<unsigned>(total)) != 0)
      return false;
    size_t i = 0;
    for (uint64_t n = base; n < base + count; ++n)
      for (uint32_t k = 0; k < L; ++k)
        for (unsigned r = 0; r < P; ++r, ++i) {
          rte_mbuf* m = out_[i];
          const size_t len =
              t_.build(r, n, k, rte_pktmbuf_mtod(m, uint8_t*), rte_pktmbuf_tailroom(m));
          m->data_len = static_cast<uint16_t>(len);
          m->pkt_len = static_cast<uint32_t>(len);
          f_.bytes_in += len;
        }
    // Timed: push everything, collect everything (or give up after 2 s of silence).
    size_t sent = 0, got = 0;
    const uint64_t t0 = rte_rdtsc();
    uint64_t last = t0, t_last_rx = t0;
    while (got < total) {
      if (sent < total && sent - got < max_inflight_)
        sent += rte_eth_tx_burst(
            p_.tx, p_.q, out_.data() + sent,
            static_cast<uint16_t>(std::min<size_t>(kBurst, (at_half_ ? cut : total) - sent)));
      if (at_half_ && sent == cut && got >= complete) {
        at_half_();
        at_half_ = nullptr;
        last = rte_rdtsc();
      }
      if (p_.tx != p_.rx) {  // nothing should come back the way it went: count and free it
        rte_mbuf* back[kBurst];
        const uint16_t b = rte_eth_rx_burst(p_.tx, p_.q, back, kBurst);
        f_.unknown += b;
        rte_pktmbuf_free_bulk(back, b);
      }
      const uint16_t n = rte_eth_rx_burst(p_.rx, p_.q, in_.data() + got, kBurst);
      const uint64_t now = rte_rdtsc();
      if (n) {
        if (latencies)
          for (uint16_t j = 0; j < n; ++j)
            latencies->push_back(double(now - t0) * 1e6 / double(g_hz));
        got += n;
        last = t_last_rx = now;
        if (got + kBurst > in_.size()) in_.resize(in_.size() * 2);  // more than sent: keep counting
      } else if (now - last > 2 * g_hz) {
        break;
      }
    }
    if (timed) f_.cycles += t_last_rx - t0;
    if (sent < total)
      rte_pktmbuf_free_bulk(out_.data() + sent, static_cast<unsigned>(total - sent));
    f_.packets_in += sent;
    f_.packets_out += got;
    // Check every frame the box released.
    seen_.assign(total, 0);
    for (size_t j = 0; j < got; ++j) {
      rte_mbuf* m = in_[j];
      f_.bytes_out += m->pkt_len;
      nb::Traffic::Id id;
      const auto v = m->nb_segs == 1
                         ? t_.check_frame(rte_pktmbuf_mtod(m, const uint8_t*), m->data_len,
                                          aggregated, base, count, id, scratch_.data())
                         : nb::Traffic::Verdict::unknown;
      if (v == nb::Traffic::Verdict::good) {
        uint8_t& s = seen_[((id.n - base) * L + id.k) * P + id.rank];
        if (s++)
          ++f_.duplicate;
        else
          ++f_.good;
      } else if (v == nb::Traffic::Verdict::bad) {
        ++f_.bad;
      } else {
        ++f_.unknown;
      }
    }
    rte_pktmbuf_free_bulk(in_.data(), static_cast<unsigned>(got));
    for (uint8_t s : seen_) f_.missing += s == 0;
    // A message is complete when every worker got every packet of it.
    for (uint64_t n = 0; n < count; ++n) {
      bool all = true;
      for (size_t j = n * L * P; j < (n + 1) * L * P; ++j) all = all && seen_[j];
      f_.messages += all;
    }
    return true;
  }

 private:
  Ports p_;
  const nb::Traffic& t_;
  Figures& f_;
  std::vector<uint8_t> scratch_;
  std::vector<rte_mbuf*> out_, in_;
  std::vector<uint8_t> seen_;
  size_t max_inflight_;  // frames sent and not yet back: bounds what queues in the ports
  std::function<void()> at_half_;
};

double percentile(std::vector<double>& v, double q) {
  if (v.empty()) return 0;
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(q * double(v.size())));
  std::nth_element(v.begin(), v.begin() + static_cast<long>(i), v.end());
  return v[i];
}

// One measurement of one mode (the box is in that mode already). `next` is
// the first message index to use. With --remove-mid-run (aggregate only) the
// ring is removed halfway through the first timed round, and the measurement
// ends with that round: every frame released until then must be right, and
// none may come out after.
Figures measure(const Options& o, const Ports& ports, const nb::Traffic& t, Box& box,
                bool aggregated, uint64_t& next) {
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

json figures_json(const Figures& f, const nb::Traffic& t) {
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

// A removed ring stays retiring for the box's rings.retire_grace_ms; its id
// cannot be installed again, and forward mode is refused, until it is over.
void wait_retired(Box& box, uint32_t id) {
  const json st = box.call(netreduce::dpcmd::status());
  const uint64_t grace_ms = st.value("retire_grace_ms", uint64_t{0});
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(grace_ms) +
                     std::chrono::seconds(10);
  if (grace_ms > 2000)
    std::fprintf(stderr, "  waiting up to %.0f s for ring %u to retire (rings.retire_grace_ms)\n",
                 double(grace_ms) / 1000, id);
  for (;;) {
    bool retiring = false;
    for (const auto& r : box.call(netreduce::dpcmd::status()).value("retiring", json::array()))
      retiring = retiring || r.value("id", uint64_t{0}) == id;
    if (!retiring) return;
    if (std::chrono::steady_clock::now() > until)
      throw std::runtime_error("ring " + std::to_string(id) + " is still retiring after " +
                               std::to_string(grace_ms / 1000 + 10) + " s");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// The ring a traffic model's workers form.
netreduce::engine::RingSpec ring_of(const nb::Traffic& t) {
  netreduce::engine::RingSpec ring;
  ring.ring_id = t.spec().ring_id;
  ring.members = t.members();
  ring.msg_len = t.spec().msg_len;
  ring.window = t.spec().window;
  ring.payload_bytes = t.spec().pmtu;
  // Each member's receiving QP, as the host library registers it: lets the
  // box spread rings over the same members (--stripes) by connection.
  const auto a = t.addressing();
  for (unsigned r = 0; r < t.spec().ranks; ++r) ring.qpns.push_back(a.recv_qpn(r));
  return ring;
}

// One CRC-32 of `bytes` payload bytes, hot, in ns: the unit the box's cost
// per packet is compared with (the bytes a packet must touch at least once).
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

// CPU time (utime + stime, ns) of this process's threads with the given
// names (DPDK names an lcore's thread rte-worker-<lcore>), by name.
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

// The idle phase (inproc): the box with a ring installed and no traffic for
// o.idle_seconds; each worker's CPU share from the kernel's accounting of its
// thread (and the time the box says it slept), then one message through the
// box right after the idle period: verified, and its latency (what the idle
// sleep adds to the first packets after a pause).
json idle_phase(const Options& o, const Ports& ports, Box& box) {
  nb::TrafficSpec s;
  s.ring_id = o.ring_id;
  s.ranks = o.ranks.front();
  s.pmtu = static_cast<uint16_t>(o.payloads.front());
  s.msg_len = static_cast<uint16_t>(o.msg_len);
  s.dtype = *wire::parse_dtype(o.dtypes.front());
  s.window = static_cast<uint16_t>(o.window);
  s.msg_id0 = 1;
  const nb::Traffic t(s);
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

// The whole sweep; returns the report.
json sweep(const Options& o, const Ports& ports) {
  Box box(o.box_socket);
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
        std::fprintf(stderr, "netreduce-loopback: could not pause the box's polling: %s\n",
                     e.what());
      }
    }
  } pause_at_exit{o.pause_box_at_exit ? &box : nullptr};
  if (o.pause_box_at_exit) box.call(netreduce::dpcmd::set_polling(true));
  Scraper scraper(o.box_socket, o.scrape_hz);
  json points = json::array();
  uint64_t next = 0;
  for (unsigned P : o.ranks)
    for (unsigned payload : o.payloads)
      for (const std::string& dt : o.dtypes) {
        nb::TrafficSpec s;
        s.ring_id = o.ring_id;
        s.ranks = P;
        s.pmtu = static_cast<uint16_t>(payload);
        s.msg_len = static_cast<uint16_t>(o.msg_len);
        s.dtype = *wire::parse_dtype(dt);
        s.window = static_cast<uint16_t>(o.window);
        // Message ids and PSNs start afresh for every point: the ring is
        // installed anew for it (with --no-install there is one point).
        s.msg_id0 = 1;
        if (std::string e = nb::check(s); !e.empty()) throw std::runtime_error(e);
        const nb::Traffic t(s);
        next = 0;
        const netreduce::engine::RingSpec ring = ring_of(t);
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
        if (o.forward_only) {
          points.push_back(pt);
          continue;
        }
        if (o.install) {
          box.call(netreduce::dpcmd::install_ring(ring));
        } else {
          const json r = box.call(netreduce::dpcmd::get_ring(s.ring_id), false);
          netreduce::engine::RingSpec have;
          // get_ring answers {"ring": {"spec": {...}, "counters": ...}}.
          if (!r.value("ok", false) || !r.contains("ring") || !r["ring"].contains("spec") ||
              !netreduce::ring_from_json(r["ring"]["spec"], have).ok() ||
              have.members != ring.members || have.msg_len != ring.msg_len ||
              have.payload_bytes != ring.payload_bytes)
            throw std::runtime_error(
                "--no-install: the box has no ring " + std::to_string(s.ring_id) +
                " matching the generator (install " + netreduce::ring_to_json(ring).dump() + ")");
        }
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
              fwd ? (", " + std::to_string(pt["ratio"]["pps"].get<double>()) + " of forwarding")
                        .c_str()
                  : "");
        points.push_back(pt);
      }
  return points;
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.starts_with("model name")) return line.substr(line.find(':') + 2);
  return "unknown";
}

// A figure of the forward baseline, or "-" when it was not measured (--no-forward).
std::string fmt(bool have, const json& p, const char* pointer) {
  if (!have) return "-";
  char b[32];
  std::snprintf(b, sizeof(b), "%.2f", p.at(json::json_pointer(pointer)).get<double>());
  return b;
}

void print_table(const json& report) {
  std::printf(
      "\n%-3s %-7s %-5s | %9s %9s %6s | %8s %8s %7s | %7s %6s %7s %7s | %5s | %8s %8s | %s\n", "P",
      "payload", "dtype", "fwd Mpps", "agg Mpps", "ratio", "Gb/s in", "Gb/s out", "goodput",
      "box ns", "xCRC", "lc Mpps", "lc rat", "busy", "p50 us", "p99 us", "verified");
  for (const auto& p : report["points"]) {
    if (!p.contains("aggregate")) {  // --forward-only
      const json& b = p["forward"];
      const json& v = b["verified"];
      const bool ok = v["bad"] == 0 && v["unknown"] == 0 && v["duplicate"] == 0 &&
                      v["missing"] == 0 && v["good"] != 0;
      std::printf("%-3u %-7u %-5s | %9.2f %9s %6s | forward-only baseline, %s\n",
                  p["ranks"].get<unsigned>(), p["payload"].get<unsigned>(),
                  p["dtype"].get<std::string>().c_str(), b["mpps_out"].get<double>(), "-", "-",
                  ok ? (std::to_string(v["good"].get<uint64_t>()) + " good").c_str() : "ERRORS");
      continue;
    }
    const json& a = p["aggregate"];
    const bool f = p.contains("forward");
    const json& v = a["verified"];
    const bool ok =
        v["bad"] == 0 && v["unknown"] == 0 && v["duplicate"] == 0 && v["missing"] == 0 &&
        (!f || (p["forward"]["verified"]["bad"] == 0 && p["forward"]["verified"]["missing"] == 0));
    const double busy = a["busy_per_lcore"].empty() ? 0.0 : a["busy_per_lcore"][0].get<double>();
    std::printf(
        "%-3u %-7u %-5s | %9s %9.2f %6s | %8.2f %8.2f %7.2f | %7.0f %6.1f %7.2f %7s | %5.2f | "
        "%8.1f %8.1f | %s\n",
        p["ranks"].get<unsigned>(), p["payload"].get<unsigned>(),
        p["dtype"].get<std::string>().c_str(), fmt(f, p, "/forward/mpps_out").c_str(),
        a["mpps_out"].get<double>(), fmt(f, p, "/ratio/pps").c_str(), a["gbps_in"].get<double>(),
        a["gbps_out"].get<double>(), a["goodput_gbps"].get<double>(),
        a["box_ns_per_packet"].get<double>(), p.value("box_ns_over_crc", 0.0),
        a["box_mpps_per_lcore"].get<double>(), fmt(f, p, "/ratio/box_mpps_per_lcore").c_str(), busy,
        a["latency_p50_us"].get<double>(), a["latency_p99_us"].get<double>(),
        ok ? (std::to_string(v["good"].get<uint64_t>()) + " good").c_str() : "ERRORS");
  }
}

// Every frame out right, none missing. With --remove-mid-run: every frame
// out right, some withheld (the ring was removed mid-message) and the box
// dropped packets of the retired ring instead of forwarding them.
bool report_ok(const json& report, bool removed_mid_run) {
  if (report.contains("idle")) {
    const json& v = report["idle"]["after_idle_verified"];
    if (v["good"] == 0 || v["bad"] != 0 || v["unknown"] != 0 || v["missing"] != 0) return false;
  }
  for (const auto& p : report["points"])
    for (const char* m : {"forward", "aggregate"})
      if (p.contains(m)) {
        const json& v = p[m]["verified"];
        if (v["bad"] != 0 || v["unknown"] != 0 || v["duplicate"] != 0 || v["good"] == 0)
          return false;
        // --scrape-hz: every scrape request answered ok under traffic.
        if (p[m].contains("scrape") && p[m]["scrape"]["failed_requests"] != 0) return false;
        const bool cut = removed_mid_run && std::string(m) == "aggregate";
        if (!cut && v["missing"] != 0) return false;
        if (cut && (v["missing"] == 0 || p[m]["ring_retired"] == 0)) return false;
      }
  return true;
}

// The per-worker phase (--per-worker; --workers 2..4 implies it). One ring per
// box worker (ids ring_id + q: disjoint members, so the box places ring q on
// worker q), each driven by its own generator thread on queue q of both
// ports; the box's worker q polls queue q and transmits on its own queue q,
// so the workers share no port queue, ring or engine (no dispatch: the
// report's `dispatched` must stay 0). For every (P, payload, dtype) the
// generators run aggregate rounds for --seconds at the same time. Per box
// worker: packets received, busy TSC cycles per packet (with two workers on
// one CPU a burst the kernel preempts also counts the other's time slice)
// and the kernel's CPU time of its thread per packet (exact under
// oversubscription; includes its empty polls, few while the generators keep
// --max-inflight frames out).
struct PhaseShared {
  const Options* o = nullptr;
  unsigned n = 1;  // generator threads = box workers
  std::vector<Ports> ports;
  std::atomic<unsigned> arrived{0};
  std::vector<Figures> figs;
  std::vector<std::string> errors;
  json points = json::array();
  std::atomic<bool> failed{false};
  std::atomic<bool> stop{false};  // --stripes: generator 0's decision to end the timed rounds
  // Every thread calls it the same number of times; `gen` is the caller's count.
  void barrier(unsigned& gen) {
    ++gen;
    arrived.fetch_add(1, std::memory_order_acq_rel);
    while (arrived.load(std::memory_order_acquire) < gen * n)
      std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
};

void per_worker_thread(PhaseShared& sh, unsigned q) {
  const Options& o = *sh.o;
  unsigned gen = 0;
  std::optional<Box> box;
  if (q == 0) box.emplace(o.box_socket);
  std::set<std::string> names;
  std::vector<unsigned> lcores;
  if (q == 0) {
    const json st = box->call(netreduce::dpcmd::stats());
    for (const auto& w : st.at("workers")) {
      lcores.push_back(w.value("lcore", 0u));
      names.insert("rte-worker-" + std::to_string(lcores.back()));
    }
  }
  for (unsigned P : o.ranks)
    for (unsigned payload : o.payloads)
      for (const std::string& dt : o.dtypes) {
        nb::TrafficSpec s;
        s.ring_id = o.ring_id + q;
        if (o.stripes) {  // one job: the same members, each ring its own QPs
          s.members_of = o.ring_id;
          s.qpn0 = netreduce::testing::RingAddressing::kQpn0 + 0x100 * q;
        }
        s.ranks = P;
        s.pmtu = static_cast<uint16_t>(payload);
        s.msg_len = static_cast<uint16_t>(o.msg_len);
        s.dtype = *wire::parse_dtype(dt);
        s.window = static_cast<uint16_t>(o.window);
        s.msg_id0 = 1;
        const nb::Traffic t(s);
        sh.barrier(gen);
        if (q == 0)
          for (unsigned r = 0; r < sh.n; ++r) {
            nb::TrafficSpec sr = s;
            sr.ring_id = o.ring_id + r;
            if (o.stripes) sr.qpn0 = netreduce::testing::RingAddressing::kQpn0 + 0x100 * r;
            box->call(netreduce::dpcmd::install_ring(ring_of(nb::Traffic(sr))));
          }
        sh.barrier(gen);
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
        sh.barrier(gen);
        BoxSample b0;
        std::map<std::string, uint64_t> cpu0;
        if (q == 0) {
          b0 = sample(*box);
          cpu0 = worker_cpu_ns(names);
        }
        sh.barrier(gen);
        unsigned rounds = 0;
        if (!o.stripes) {
          while (ok && (rounds < 2 || f.seconds(g_hz) < o.seconds) &&
                 f.bad + f.unknown + f.missing == 0) {
            ok = g.round(next, per_round, true, true, nullptr);
            next += per_round;
            ++rounds;
          }
        } else {
          // One job's stripes advance together, as a striped all-reduce
          // sends every stripe of each call: every generator runs the same
          // rounds, generator 0 decides when to stop. Two barriers per round
          // (read the decision, then let generator 0 make the next one).
          sh.stop.store(false);
          sh.barrier(gen);
          for (;;) {
            if (ok && !sh.failed.load()) ok = g.round(next, per_round, true, true, nullptr);
            next += per_round;
            ++rounds;
            if (!ok || f.bad + f.unknown + f.missing != 0) sh.failed.store(true);
            sh.barrier(gen);
            if (q == 0 && (sh.failed.load() || (rounds >= 2 && f.seconds(g_hz) >= o.seconds)))
              sh.stop.store(true);
            sh.barrier(gen);
            if (sh.stop.load()) break;
          }
          ok = ok && !sh.failed.load();
        }
        if (!ok) sh.failed.store(true);
        sh.barrier(gen);
        if (q == 0) {
          const BoxSample b1 = sample(*box);
          const auto cpu1 = worker_cpu_ns(names);
          const json st = box->call(netreduce::dpcmd::stats());
          json workers = json::array();
          for (size_t w = 0; w < b1.packets_w.size() && w < b0.packets_w.size(); ++w) {
            const uint64_t pk = b1.packets_w[w] - b0.packets_w[w];
            const std::string name = "rte-worker-" + std::to_string(lcores.at(w));
            const uint64_t cpu =
                cpu1.count(name) && cpu0.count(name) ? cpu1.at(name) - cpu0.at(name) : 0;
            const Figures& gf = sh.figs.at(w);
            // Busy cycles and packets of the polls that were not preempted.
            const uint64_t stalls = b1.stalls_w[w] - b0.stalls_w[w];
            const uint64_t clean_busy =
                (b1.busy_w[w] - b0.busy_w[w]) - (b1.stall_cycles_w[w] - b0.stall_cycles_w[w]);
            const uint64_t clean_pk = pk - (b1.stall_rx_w[w] - b0.stall_rx_w[w]);
            workers.push_back(
                {{"worker", w},
                 {"packets", pk},
                 {"busy_ns_per_packet",
                  pk ? double(b1.busy_w[w] - b0.busy_w[w]) * 1e9 / double(g_hz) / double(pk) : 0.0},
                 {"stalls", stalls},
                 {"unstalled_busy_ns_per_packet",
                  clean_pk ? double(clean_busy) * 1e9 / double(g_hz) / double(clean_pk) : 0.0},
                 {"cpu_ns_per_packet", pk ? double(cpu) / double(pk) : 0.0},
                 {"dispatched", st.at("workers").at(w).value("dispatched", uint64_t{0})},
                 {"generator_mpps",
                  gf.cycles ? double(gf.packets_in) / gf.seconds(g_hz) / 1e6 : 0.0},
                 {"verified",
                  {{"good", gf.good},
                   {"bad", gf.bad},
                   {"unknown", gf.unknown},
                   {"duplicate", gf.duplicate},
                   {"missing", gf.missing}}}});
          }
          sh.points.push_back({{"ranks", P},
                               {"payload", payload},
                               {"dtype", dt},
                               {"crc_ns", crc_ns(payload)},
                               {"workers", workers}});
          for (unsigned r = 0; r < sh.n; ++r) {
            box->call(netreduce::dpcmd::remove_ring(o.ring_id + r));
            wait_retired(*box, o.ring_id + r);
          }
          if (!o.quiet)
            std::fprintf(stderr, "per-worker: P=%u payload=%u %s done\n", P, payload, dt.c_str());
        }
        sh.barrier(gen);
      }
}

void print_per_worker(const json& points, unsigned n) {
  std::printf("\nper-worker phase, %u box worker(s), one ring each, aggregate\n", n);
  std::printf("%-3s %-7s %-5s | %-6s %10s %7s %9s %9s %7s %9s %6s %10s | %s\n", "P", "payload",
              "dtype", "worker", "packets", "share", "busy ns", "clean ns", "stalls", "cpu ns",
              "xCRC", "dispatched", "verified");
  for (const auto& p : points) {
    uint64_t total = 0;
    for (const auto& w : p["workers"]) total += w["packets"].get<uint64_t>();
    for (const auto& w : p["workers"]) {
      const json& v = w["verified"];
      const bool ok = v["bad"] == 0 && v["unknown"] == 0 && v["duplicate"] == 0 &&
                      v["missing"] == 0 && v["good"] != 0;
      std::printf(
          "%-3u %-7u %-5s | %-6u %10llu %6.1f%% %9.1f %9.1f %7llu %9.1f %6.1f %10llu | %s\n",
          p["ranks"].get<unsigned>(), p["payload"].get<unsigned>(),
          p["dtype"].get<std::string>().c_str(), w["worker"].get<unsigned>(),
          (unsigned long long)w["packets"].get<uint64_t>(),
          total ? 100.0 * double(w["packets"].get<uint64_t>()) / double(total) : 0.0,
          w["busy_ns_per_packet"].get<double>(), w["unstalled_busy_ns_per_packet"].get<double>(),
          (unsigned long long)w["stalls"].get<uint64_t>(), w["cpu_ns_per_packet"].get<double>(),
          w["cpu_ns_per_packet"].get<double>() / p["crc_ns"].get<double>(),
          (unsigned long long)w["dispatched"].get<uint64_t>(), ok ? "ok" : "ERRORS");
    }
  }
}

bool per_worker_ok(const json& points) {
  for (const auto& p : points)
    for (const auto& w : p["workers"]) {
      const json& v = w["verified"];
      if (v["bad"] != 0 || v["unknown"] != 0 || v["duplicate"] != 0 || v["missing"] != 0 ||
          v["good"] == 0 || w["dispatched"] != 0)
        return false;
    }
  return true;
}

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
    const std::string sfx = nq > 1 ? "_" + std::to_string(q) : "";
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

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "netreduce-loopback: P synthetic RoCE workers through the box; every released frame "
      "checked; figures with their ratio to the forward-only mode on the same ports"};
  Options o;
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
                 "inproc: box workers (1 to 4; more than 1 runs the per-worker phase: one ring "
                 "and one generator thread per worker, on lcores sharing the 2 CPUs)")
      ->check(CLI::Range(1, 4));
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
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  // The in-process box logs as netreduce-dataplane does, but to stderr:
  // stdout holds the results alone. --quiet keeps its warnings only.
  spdlog::set_default_logger(spdlog::stderr_logger_mt("netreduce-loopback"));
  if (o.quiet) spdlog::set_level(spdlog::level::warn);
  for (const auto& d : o.dtypes)
    if (!wire::parse_dtype(d)) {
      std::fprintf(stderr, "netreduce-loopback: --dtypes: unknown dtype '%s'\n", d.c_str());
      return 2;
    }
  std::vector<std::string> extra = app.remaining();
  if (!extra.empty() && extra.front() == "--") extra.erase(extra.begin());
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
  const std::string prefix = "nrlb" + std::to_string(::getpid());
  std::vector<std::string> eal = {"netreduce-loopback"};
  if (inproc) {
    o.box_socket = "/tmp/" + prefix + ".sock";
    // lcore 0: the box's control loop, 1, 3, ...: box workers, 2, 4, ...:
    // generators (one per worker); CPU 0 takes the control loop and the
    // generators, CPU 1 the box workers.
    std::string lcores = "0@0";
    for (unsigned q = 0; q < o.workers; ++q)
      lcores += "," + std::to_string(2 * q + 1) + "@1," + std::to_string(2 * q + 2) + "@0";
    for (const char* a : {"--no-huge", "-m", "1536", "--lcores", lcores.c_str(), "--no-pci",
                          "--log-level", "lib.eal:warning"})
      eal.push_back(a);
    eal.push_back("--file-prefix");
    eal.push_back(prefix);
  }
  eal.insert(eal.end(), extra.begin(), extra.end());
  std::vector<char*> eal_argv;
  for (auto& a : eal) eal_argv.push_back(a.data());
  if (rte_eal_init(static_cast<int>(eal_argv.size()), eal_argv.data()) < 0) {
    std::fprintf(stderr, "netreduce-loopback: EAL initialization failed: %s\n",
                 rte_strerror(rte_errno));
    return 1;
  }
  g_hz = rte_get_tsc_hz();
  Ports ports;
  // Each generator thread allocates a round's mbufs (up to kRoundPackets)
  // at once: one pool share per two workers.
  ports.pool = rte_pktmbuf_pool_create("nrlb_gen", kPoolMbufs * std::max(1u, (o.workers + 1) / 2),
                                       256, 0, kDataRoom, rte_socket_id());
  if (!ports.pool) {
    std::fprintf(stderr, "netreduce-loopback: cannot allocate the generator's mbufs: %s\n",
                 rte_strerror(rte_errno));
    return 1;
  }
  json report = {{"mode", o.mode},
                 {"machine",
                  {{"cpu", cpu_model()},
                   {"online_cpus", std::thread::hardware_concurrency()},
                   {"tsc_hz", g_hz}}},
                 {"msg_len", o.msg_len},
                 {"window", o.window},
                 {"reduce_mode", o.reduce_mode}};
  std::string error;
  int rc = 0;
  if (inproc) {
    uint16_t box_a, box_b;
    const auto nq = static_cast<uint16_t>(o.workers);
    std::string e = ring_pair("nrlb_gen_a", "nrlb_box_a", ports.tx, box_a, nq);
    if (e.empty()) e = ring_pair("nrlb_gen_b", "nrlb_box_b", ports.rx, box_b, nq);
    if (e.empty()) e = port_setup(ports.tx, ports.pool, nq);
    if (e.empty()) e = port_setup(ports.rx, ports.pool, nq);
    if (!e.empty()) {
      std::fprintf(stderr, "netreduce-loopback: %s\n", e.c_str());
      return 1;
    }
    netreduce::dataplane::DataplaneConfig cfg;
    cfg.ports = {{"net_ring_nrlb_box_a"}, {"net_ring_nrlb_box_b"}};  // the ring PMD prefixes names
    cfg.workers.clear();
    for (unsigned q = 0; q < o.workers; ++q) cfg.workers.push_back(2 * q + 1);
    cfg.mbufs = 8192;
    cfg.engine_memory = 512ull << 20;
    cfg.control_socket = o.box_socket;
    cfg.retire_grace_ms = 100;  // a removed ring is gone before the next point
    if (o.idle_sleep_max_us >= 0)
      cfg.idle_sleep_max_us = static_cast<uint32_t>(o.idle_sleep_max_us);
    cfg.reduce_mode = o.reduce_mode == "accumulate" ? netreduce::engine::ReduceMode::accumulate
                                                    : netreduce::engine::ReduceMode::deterministic;
    netreduce::dataplane::Dataplane dp(cfg);
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
      std::fprintf(stderr,
                   "netreduce-loopback: cannot start the generator(s) on lcores 2, 4, ...\n");
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
    if (o.per_worker) {
      report["per_worker"] = {{"workers", o.workers}, {"points", phase.points}};
      report["points"] = json::array();
    } else {
      report["points"] = args.points;
    }
    if (!args.idle.is_null()) report["idle"] = args.idle;
    error = args.error;
  } else {
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
  }
  // --quiet --json: the report goes to the file alone, stdout stays empty.
  const bool print_results = !(o.quiet && !o.json_out.empty());
  if (!error.empty()) {
    std::fprintf(stderr, "netreduce-loopback: %s\n", error.c_str());
    rc = 1;
  } else if (print_results) {
    if (report.contains("per_worker"))
      print_per_worker(report["per_worker"]["points"], o.workers);
    else
      print_table(report);
    for (const auto& p : report["points"])
      if (p.contains("aggregate") && p["aggregate"].contains("scrape")) {
        const json& sc = p["aggregate"]["scrape"];
        std::printf(
            "P=%u payload=%u %s: %llu scrapes during the aggregate run (mean %.2f ms, "
            "max %.2f ms, %llu failed requests)\n",
            p["ranks"].get<unsigned>(), p["payload"].get<unsigned>(),
            p["dtype"].get<std::string>().c_str(),
            (unsigned long long)sc["scrapes"].get<uint64_t>(), sc["mean_ms"].get<double>(),
            sc["max_ms"].get<double>(), (unsigned long long)sc["failed_requests"].get<uint64_t>());
      }
    if (o.remove_mid_run)
      for (const auto& p : report["points"]) {
        const json& v = p["aggregate"]["verified"];
        std::printf(
            "remove mid-run: P=%u: %llu frames released before the removal, all right; %llu "
            "wrong, %llu withheld; the box freed %llu held packets and dropped %llu later "
            "packets of the retired ring\n",
            p["ranks"].get<unsigned>(), (unsigned long long)v["good"].get<uint64_t>(),
            (unsigned long long)(v["bad"].get<uint64_t>() + v["unknown"].get<uint64_t>() +
                                 v["duplicate"].get<uint64_t>()),
            (unsigned long long)v["missing"].get<uint64_t>(),
            (unsigned long long)p["aggregate"]["ring_removed"].get<uint64_t>(),
            (unsigned long long)p["aggregate"]["ring_retired"].get<uint64_t>());
      }
    if (report.contains("idle")) {
      const json& id = report["idle"];
      std::string shares;
      for (const auto& w : id["threads"])
        shares += (shares.empty() ? "" : ", ") + w["thread"].get<std::string>() + " " +
                  std::to_string(static_cast<int>(w["cpu_share"].get<double>() * 1000) / 10.0)
                      .substr(0, 4) +
                  "%";
      std::printf(
          "idle %.1f s, no traffic: CPU per box worker thread %s (kernel accounting); first "
          "message after it: %.1f us, %s\n",
          id["seconds"].get<double>(), shares.c_str(), id["after_idle_latency_us"].get<double>(),
          id["after_idle_verified"]["good"].get<uint64_t>() > 0 &&
                  id["after_idle_verified"]["bad"] == 0 && id["after_idle_verified"]["missing"] == 0
              ? "verified"
              : "ERRORS");
    }
  }
  if (error.empty()) {
    if (!report_ok(report, o.remove_mid_run) ||
        (report.contains("per_worker") && !per_worker_ok(report["per_worker"]["points"]))) {
      std::fprintf(stderr, "netreduce-loopback: some released frames were wrong or missing\n");
      rc = 1;
    }
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
