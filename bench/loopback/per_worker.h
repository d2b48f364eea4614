// The per-worker phase (--per-worker; --workers 2..4 implies it): what each
// of the box's workers costs when every worker runs its own ring at once.
//
// Theory of operation
// -------------------
// One ring per box worker (ids ring_id + q: disjoint members, so the box
// places ring q on worker q), each driven by its own generator thread on
// queue q of both ports; the box's worker q polls queue q and transmits on
// its own queue q, so the workers share no port queue, ring or engine (no
// dispatch: the report's `dispatched` must stay 0). With --stripes the rings
// are one job's stripes instead: the same members, each ring its own QPs,
// and the box spreads them over its workers by connection. For every
// (P, payload, dtype) the generators run aggregate rounds for --seconds at
// the same time. Per box worker: packets received, busy TSC cycles per
// packet (with two workers on one CPU a burst the kernel preempts also
// counts the other's time slice), the same less the polls over 100 us
// ("clean"), and the kernel's CPU time of its thread per packet (exact under
// oversubscription; includes its empty polls, few while the generators keep
// --max-inflight frames out).
//
// Example. --workers 2 --stripes --ranks 4: rings 0xB0 and 0xB1 over the
// same four members, QPs 0x100.. and 0x200..; each worker should receive
// 50.0% of the packets, and generator 0 decides for both when to stop.
#pragma once

#include <atomic>
#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "bench/loopback/generator.h"
#include "bench/loopback/options.h"

namespace netreduce::bench {

// What the generator threads of the phase share. Thread 0 also talks to the
// box (installs and removes the rings, samples its counters) and records
// the points.
struct PhaseShared {
  const Options* o = nullptr;
  unsigned n = 1;  // generator threads = box workers
  std::vector<Ports> ports;
  std::atomic<unsigned> arrived{0};
  std::vector<Figures> figs;
  std::vector<std::string> errors;
  nlohmann::json points = nlohmann::json::array();
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

// Generator thread q of the phase: every point of the options in turn.
void per_worker_thread(PhaseShared& sh, unsigned q);

}  // namespace netreduce::bench
