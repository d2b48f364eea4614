#include "bench/loopback/report.h"

#include <cstdio>
#include <fstream>
#include <string>
#include <thread>

#include "bench/loopback/generator.h"

using nlohmann::json;

namespace netreduce::bench {

namespace {

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

// --scrape-hz: the scrapes during each point's aggregate run.
void print_scrapes(const json& report) {
  for (const auto& p : report["points"])
    if (p.contains("aggregate") && p["aggregate"].contains("scrape")) {
      const json& sc = p["aggregate"]["scrape"];
      std::printf(
          "P=%u payload=%u %s: %llu scrapes during the aggregate run (mean %.2f ms, "
          "max %.2f ms, %llu failed requests)\n",
          p["ranks"].get<unsigned>(), p["payload"].get<unsigned>(),
          p["dtype"].get<std::string>().c_str(), (unsigned long long)sc["scrapes"].get<uint64_t>(),
          sc["mean_ms"].get<double>(), sc["max_ms"].get<double>(),
          (unsigned long long)sc["failed_requests"].get<uint64_t>());
    }
}

// --remove-mid-run: what each point's first aggregate round released and withheld.
void print_removals(const json& report) {
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
}

void print_idle(const json& id) {
  std::string shares;
  for (const auto& w : id["threads"])
    shares +=
        (shares.empty() ? "" : ", ") + w["thread"].get<std::string>() + " " +
        std::to_string(static_cast<int>(w["cpu_share"].get<double>() * 1000) / 10.0).substr(0, 4) +
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

}  // namespace

json report_head(const Options& o) {
  return {{"mode", o.mode},
          {"machine",
           {{"cpu", cpu_model()},
            {"online_cpus", std::thread::hardware_concurrency()},
            {"tsc_hz", g_hz}}},
          {"msg_len", o.msg_len},
          {"window", o.window},
          {"reduce_mode", o.reduce_mode}};
}

void print_report(const json& report, const Options& o) {
  if (report.contains("per_worker"))
    print_per_worker(report["per_worker"]["points"], o.workers);
  else
    print_table(report);
  print_scrapes(report);
  if (o.remove_mid_run) print_removals(report);
  if (report.contains("idle")) print_idle(report["idle"]);
}

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
  return !report.contains("per_worker") || per_worker_ok(report["per_worker"]["points"]);
}

}  // namespace netreduce::bench
