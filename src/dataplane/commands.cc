// Control work that needs the workers (control thread): commands run on a worker between bursts
// (Command, lcore.h; run_command on the worker, on_worker on the caller) and
// RCU grace periods (quiesce). Every wait is bounded by
// control.command_timeout_ms except for a command a worker has already
// started; the ordering contract is in dataplane.h ("Threads").
#include <rte_cycles.h>
#include <rte_rcu_qsbr.h>
#include <rte_ring.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "dataplane/dataplane.h"

namespace netreduce::dataplane {

void Dataplane::run_command(Worker& w, Command* c) {
  uint8_t expect = Command::queued;
  if (!c->state.compare_exchange_strong(expect, Command::running, std::memory_order_acq_rel)) {
    // Cancelled: its caller left at the deadline. Freed here (rare: only
    // after a worker failed to take commands in time), never run.
    delete c;
    w.abandoned.fetch_sub(1, std::memory_order_release);
    return;
  }
  c->fn(w);
  c->state.store(Command::done, std::memory_order_release);  // the caller frees it
}

Status Dataplane::on_worker(unsigned idx, std::function<void(Worker&)> fn) {
  std::lock_guard<std::mutex> lock(on_worker_mu_);
  Worker& w = *workers_[idx];
  // Workers not running (before start, after stop): act directly.
  if (!started_ || w.stopped.load(std::memory_order_acquire)) {
    fn(w);
    publish(w, rte_rdtsc(), true);  // as the worker does after a command
    return {};
  }
  const std::string who =
      "worker " + std::to_string(idx) + " (lcore " + std::to_string(w.lcore) + ")";
  const std::string timeout = "control.command_timeout_ms";
  if (const uint32_t n = w.abandoned.load(std::memory_order_acquire); n != 0)
    return {StatusCode::unavailable, timeout,
            who + " has still not taken " + std::to_string(n) +
                " earlier command(s) given up after " + std::to_string(cfg_.command_timeout_ms) +
                " ms: it is not polling its command ring (stuck?); the other workers are served"};
  auto* cmd = new Command;
  cmd->fn = std::move(fn);
  if (rte_ring_enqueue(w.commands, cmd) != 0) {
    delete cmd;
    return {StatusCode::unavailable, timeout, who + ": its command ring is full"};
  }
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(cfg_.command_timeout_ms);
  for (;;) {
    const uint8_t st = cmd->state.load(std::memory_order_acquire);
    if (st == Command::done) {
      delete cmd;
      return {};
    }
    if (st == Command::queued && w.stopped.load(std::memory_order_acquire)) {
      // The worker left after draining its ring but before our command
      // landed: it is ours to take back and run (callers are serialized).
      void* c;
      while (rte_ring_dequeue(w.commands, &c) == 0) run_command(w, static_cast<Command*>(c));
      continue;
    }
    if (st == Command::queued && std::chrono::steady_clock::now() > deadline) {
      w.abandoned.fetch_add(1,
                            std::memory_order_acq_rel);  // before the worker can see it cancelled
      uint8_t expect = Command::queued;
      if (cmd->state.compare_exchange_strong(expect, Command::cancelled,
                                             std::memory_order_acq_rel)) {
        spdlog::error("{} did not take a control command within {} ms; cancelled it", who,
                      cfg_.command_timeout_ms);
        return {StatusCode::unavailable, timeout,
                who + " did not take the command within " +
                    std::to_string(cfg_.command_timeout_ms) +
                    " ms (cancelled: it will not run); the other workers are served"};
      }
      w.abandoned.fetch_sub(1, std::memory_order_acq_rel);  // it started: wait for it
      continue;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

Status Dataplane::quiesce(uint64_t* token) {
  if (!started_) return {};
  // A worker that outlived an earlier grace and has not finished it yet is
  // not waited for again (as on_worker does for abandoned commands).
  if (stuck_token_ && rte_rcu_qsbr_check(qsbr_, stuck_token_, false) != 1) {
    if (token) *token = rte_rcu_qsbr_start(qsbr_);
    return {StatusCode::unavailable, "control.command_timeout_ms",
            stuck_who_ + " has still not finished the loop iteration it was in " +
                std::to_string(cfg_.command_timeout_ms) +
                " ms after an earlier request (stuck in a device call?)"};
  }
  stuck_token_ = 0;
  std::vector<uint32_t> seq0;
  for (Worker* w : workers_) seq0.push_back(w->pub.seq.load(std::memory_order_acquire));
  const uint64_t t = rte_rcu_qsbr_start(qsbr_);
  if (token) *token = t;
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(cfg_.command_timeout_ms);
  while (rte_rcu_qsbr_check(qsbr_, t, false) != 1) {
    if (std::chrono::steady_clock::now() > deadline) {
      std::string who;
      for (size_t i = 0; i < workers_.size(); ++i)
        if (!workers_[i]->stopped.load(std::memory_order_acquire) &&
            workers_[i]->pub.seq.load(std::memory_order_acquire) == seq0[i])
          who += (who.empty() ? "" : ", ") + std::string("worker ") + std::to_string(i) +
                 " (lcore " + std::to_string(workers_[i]->lcore) + ")";
      stuck_token_ = t;
      stuck_who_ = who.empty() ? std::string("a worker") : who;
      return {StatusCode::unavailable, "control.command_timeout_ms",
              stuck_who_ + " did not finish its loop iteration within " +
                  std::to_string(cfg_.command_timeout_ms) + " ms (stuck in a device call?)"};
    }
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  return {};
}

}  // namespace netreduce::dataplane
