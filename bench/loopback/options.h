// netreduce-loopback's options, as parsed from its command line
// (bench/loopback/loopback.cc declares each one with its help text), and the
// traffic model of one point of the sweep: --ranks 4 --payloads 1024
// --dtypes fp32 gives the point (4, 1024, fp32), a ring of 4 workers with
// 1024-byte fp32 packets, --msg-len packets per message.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "bench/loopback/traffic.h"
#include "wire/ina.h"

namespace netreduce::bench {

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
  std::vector<unsigned> lcore_cpus;           // inproc: the CPU of each lcore (set at start)
  bool per_worker = false;                    // inproc: the per-worker phase instead of the sweep
  bool stripes = false;  // per-worker phase: the rings are one job's stripes (same members)
};

// The traffic of one point (ranks, payload, dtype) on ring --ring-id. Message
// ids and PSNs start afresh: the ring is installed anew for every point.
// `dtype` has been checked (wire::parse_dtype accepts it).
inline TrafficSpec point_spec(const Options& o, unsigned ranks, unsigned payload,
                              const std::string& dtype) {
  TrafficSpec s;
  s.ring_id = o.ring_id;
  s.ranks = ranks;
  s.pmtu = static_cast<uint16_t>(payload);
  s.msg_len = static_cast<uint16_t>(o.msg_len);
  s.dtype = *wire::parse_dtype(dtype);
  s.window = static_cast<uint16_t>(o.window);
  s.msg_id0 = 1;
  return s;
}

}  // namespace netreduce::bench
