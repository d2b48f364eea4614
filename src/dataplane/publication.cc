// The workers' publications (Published, lcore.h): the worker's side
// (publish: its counters, the engine's totals and, when asked, every ring's
// figures, under a sequence counter) and the readers' (read_published:
// control thread and DPDK telemetry's thread; never a command, never a lock
// the worker takes, every wait bounded by control.command_timeout_ms).
#include <rte_cycles.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include "dataplane/dataplane.h"

namespace netreduce::dataplane {

void Dataplane::publish(Worker& w, uint64_t now, bool rings) {
  Published& p = w.pub;
  const uint32_t s = p.seq.load(std::memory_order_relaxed);
  p.seq.store(s + 1, std::memory_order_relaxed);  // odd: writing
  std::atomic_thread_fence(std::memory_order_release);
  p.f.tsc = now;
  p.f.stats = w.stats;
  p.f.reasons = w.engine->counters();
  p.f.memory = w.engine->memory_in_use();
  p.f.rings = static_cast<uint32_t>(w.engine->ring_count());
  p.f.retired = static_cast<uint32_t>(w.engine->retired_count());
  if (rings || w.rings_asked.load(std::memory_order_relaxed) > p.f.rings_tsc) {
    p.f.ring_figures = w.engine->ring_figures(p.ring_figures, p.ring_capacity, now, w.stall_cycles);
    p.f.rings_tsc = now;
  }
  p.seq.store(s + 2, std::memory_order_release);  // even: done
  w.published_at = now;
}

WorkerFigures Dataplane::read_published(unsigned idx, double& age_ms, bool* answering,
                                        std::vector<engine::RingFigures>* rings) {
  Worker& w = *workers_[idx];
  const uint64_t hz = rte_get_tsc_hz();
  // Workers not running (before start, after stop) publish nothing more:
  // the control thread publishes for them (nobody else writes then).
  bool running = started_ && !w.stopped.load(std::memory_order_acquire);
  const uint64_t asked = rte_rdtsc();
  if (!running) {  // callers (control socket, telemetry) may race here: one publishes at a time
    std::lock_guard<std::mutex> lock(on_worker_mu_);
    publish(w, rte_rdtsc(), rings != nullptr);
  }
  if (rings) rings->reserve(w.pub.ring_capacity);  // the copies below allocate nothing
  auto ask = [asked](std::atomic<uint64_t>& a) {
    uint64_t prev = a.load(std::memory_order_relaxed);
    while (prev < asked && !a.compare_exchange_weak(prev, asked, std::memory_order_relaxed)) {
    }
  };
  if (running) {
    if (rings) ask(w.rings_asked);  // the worker tests either (publish, worker_loop)
    ask(w.asked);
  }
  // What the reader waits for: the figures it asked for copied after `asked`.
  auto copied_at = [rings](const WorkerFigures& f) { return rings ? f.rings_tsc : f.tsc; };
  // A worker that missed a reader's deadline (`unanswered`) is not waited
  // for again while it has published nothing since: its last figures, with
  // their age. One that has published since (it recovered, or a lost update
  // between two readers left a stale mark) is waited for as usual.
  uint64_t missed = w.unanswered.load(std::memory_order_relaxed);
  if (missed && running) {
    const uint32_t s0 = w.pub.seq.load(std::memory_order_acquire);
    const uint64_t last = w.pub.f.tsc;  // validated by the sequence counter below
    std::atomic_thread_fence(std::memory_order_acquire);
    if ((s0 & 1) == 0 && w.pub.seq.load(std::memory_order_relaxed) == s0 && last >= missed) {
      w.unanswered.store(0, std::memory_order_relaxed);
      missed = 0;
    }
  }
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(missed && running ? 0 : cfg_.command_timeout_ms);
  WorkerFigures out;
  for (;;) {
    const uint32_t s0 = w.pub.seq.load(std::memory_order_acquire);
    if ((s0 & 1) == 0) {
      out = w.pub.f;
      if (rings)
        rings->assign(w.pub.ring_figures,
                      w.pub.ring_figures + std::min(out.ring_figures, w.pub.ring_capacity));
      std::atomic_thread_fence(std::memory_order_acquire);
      if (w.pub.seq.load(std::memory_order_relaxed) == s0 &&
          (!running || copied_at(out) >= asked || std::chrono::steady_clock::now() > deadline))
        break;
    }
    if (running && w.stopped.load(std::memory_order_acquire)) {
      running = false;  // it left: its last publication (at exit) is final
      continue;
    }
    // A worker stopped inside publish() (seq odd for good): no consistent
    // copy exists; after the deadline (plus the microseconds a publication
    // takes, many times over) the reader gets none rather than spinning.
    if (running && (s0 & 1) &&
        std::chrono::steady_clock::now() > deadline + std::chrono::milliseconds(10)) {
      out = WorkerFigures{};
      if (rings) rings->clear();
      break;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  const uint64_t at = copied_at(out);
  age_ms = at >= asked ? 0.0 : double(asked - at) * 1e3 / double(hz);
  // Answering: the figures asked for, copied after the request.
  const bool ok = !running || at >= asked;
  if (ok) {
    if (w.unanswered.load(std::memory_order_relaxed) != 0)  // the line stays shared otherwise
      w.unanswered.store(0, std::memory_order_relaxed);
  } else if (!missed) {
    w.unanswered.store(asked, std::memory_order_relaxed);
  }
  if (answering) *answering = ok;
  return out;
}

}  // namespace netreduce::dataplane
