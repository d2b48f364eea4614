// The loopback benchmark's generator and sink: plays the P workers of a ring
// (bench/loopback/traffic.h) on one lcore, sends their frames into the box's
// port A, takes what the box releases on port B and checks every frame byte
// for byte against the expected reduction.
//
// Theory of operation
// -------------------
// A round sends `count` messages of every worker. Its frames are built first
// (not timed), message by message, each message's packet k of every worker
// before packet k+1: frame i is worker i mod P's packet (i / P) mod L of
// message i / (P L), L packets per message. The timed part pushes them as
// fast as the port takes them, with at most `max_inflight` frames sent and
// not yet back, and collects the box's output until every frame is back (or
// 2 s pass without one). Then every collected frame is checked and freed,
// and the counts go into a Figures.
//
// Example. P = 4, L = 4: a timed round is kRoundPackets / (P L) = 512
// messages, 8192 frames, at most 4096 of them out at once in process.
// at_half() fires after frames 0..4099 (256 whole messages and packet 0 of
// message 256) came back and 3 workers' packet 1 of message 256 was sent:
// the box holds those 3 when --remove-mid-run removes the ring there.
#pragma once

#include <rte_mbuf.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "bench/loopback/traffic.h"

namespace netreduce::bench {

// Frames per timed round (rounded down to whole messages of every worker).
constexpr unsigned kRoundPackets = 8192;

// TSC ticks per second, set once after the EAL is up.
extern uint64_t g_hz;

// What a generator counts over its rounds.
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

// A generator port through the data plane's own port setup (ports.h): nq
// RX and TX queues, 2048 descriptors, the largest MTU up to 4200, started
// promiscuous. "" or what failed.
std::string port_setup(uint16_t port, rte_mempool* pool, uint16_t nq = 1);

class Generator {
 public:
  Generator(const Ports& ports, const Traffic& t, Figures& f, size_t max_inflight)
      : p_(ports), t_(t), f_(f), scratch_(t.max_frame()), max_inflight_(max_inflight) {}

  // Called once, in the next round, about halfway and mid-message: when the
  // frames of its first half plus one packet position have been sent and
  // released, and P-1 workers' packets of the next position have been sent
  // (so the box holds them). --remove-mid-run removes the ring there.
  void at_half(std::function<void()> fn) { at_half_ = std::move(fn); }

  // Sends messages [base, base + count) of every worker; collects and checks
  // what comes back. Returns false if the pool ran dry.
  bool round(uint64_t base, uint64_t count, bool aggregated, bool timed,
             std::vector<double>* latencies);

 private:
  // The timed part of a round: sends the `total` frames built in out_ (at
  // most `cut` before at_half fires, once `complete` came back) and collects
  // what comes back into in_. Returns how many frames came back.
  size_t push_and_collect(size_t total, size_t complete, size_t cut, bool timed,
                          std::vector<double>* latencies);
  // Checks the `got` frames collected in in_ and frees them.
  void check(uint64_t base, uint64_t count, size_t total, size_t got, bool aggregated);

  Ports p_;
  const Traffic& t_;
  Figures& f_;
  std::vector<uint8_t> scratch_;
  std::vector<rte_mbuf*> out_, in_;
  std::vector<uint8_t> seen_;
  size_t max_inflight_;  // frames sent and not yet back: bounds what queues in the ports
  std::function<void()> at_half_;
};

}  // namespace netreduce::bench
