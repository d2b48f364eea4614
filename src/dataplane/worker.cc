// The worker's side of the data plane: a worker lcore's entry point, its
// burst loop (RX -> classify -> dispatch -> aggregate -> transmit, the
// stages of lcore.h, one file each) and the idle rule. Runs on worker
// lcores only; what a worker shares with the control thread, and how, is
// in dataplane.h (Threads) and beside each shared field in lcore.h.
#include <rte_cycles.h>
#include <rte_ethdev.h>
#include <rte_lcore.h>
#include <rte_mbuf.h>
#include <rte_rcu_qsbr.h>
#include <rte_ring.h>
#include <sys/prctl.h>
#include <time.h>

#include <algorithm>

#include "dataplane/dataplane.h"

namespace netreduce::dataplane {

int Dataplane::worker_main(void* arg) {
  auto* pair = static_cast<std::pair<Dataplane*, Worker*>*>(arg);
  pair->first->worker_loop(*pair->second);
  return 0;
}

void Dataplane::worker_loop(Worker& w) {
  rte_rcu_qsbr_thread_register(qsbr_, w.index);
  rte_rcu_qsbr_thread_online(qsbr_, w.index);
  // Short sleeps must be short: the default 50 us timer slack would stretch
  // the idle rule's 1 us first step to 50.
  ::prctl(PR_SET_TIMERSLACK, 1000UL, 0UL, 0UL, 0UL);
  rte_mbuf* pkts[kMaxBurst];
  engine::Frame frames[kMaxBurst];
  Lcore lc{w,
           {port_ids_[0], port_ids_[1]},
           workers_.data(),
           static_cast<unsigned>(workers_.size()),
           &links_,
           &fault_table_,
           pool_};
  // One TSC read per iteration: its end is the next one's start and `now`.
  uint64_t t0 = rte_rdtsc();
  w.last_busy = t0;
  while (!quitting()) {
    if (w.stall) {  // test only (Worker::stall)
      rte_pause();
      t0 = rte_rdtsc();
      continue;
    }
    const bool agg = mode() == Mode::aggregate;
    unsigned moved = 0, received = 0;  // received: RX bursts only (the stall rule's packets)
    bool commanded = false;            // ran a control command (not a stall when long)
    bool drained = w.rxq.empty();      // some RX poll came back short: flush now (dataplane.h)
    // Paused (set_polling): no RX, TX or inbox work at all, only commands.
    const bool poll = polling();
    for (const auto& [slot, q] : w.rxq) {
      if (!poll) break;
      const uint16_t n = rte_eth_rx_burst(port_ids_[slot], q, pkts, cfg_.burst);
      if (n < cfg_.burst) drained = true;
      if (!n) continue;
      moved += n;
      received += n;
      w.stats.rx[slot] += n;
      // Stamp the arrival port: later stages (and other workers, after
      // dispatch) send a packet out of the opposite one. Not every PMD sets
      // mbuf->port on receive (net_ring does not).
      const uint16_t port = port_ids_[slot];
      for (uint16_t i = 0; i < n; ++i) {
        w.stats.rx_bytes[slot] += pkts[i]->pkt_len;
        pkts[i]->port = port;
      }
      if (!agg) {
        forward(lc, pkts, n);
        continue;
      }
      unsigned k = classify(lc, pkts, n, frames);
      // Injected faults (faults.h): one predictable branch while none is active.
      if (const FaultTable* ft = lc.fault_table(); ft) [[unlikely]]
        k = inject_faults(lc, *ft, frames, k, t0);
      k = dispatch(lc, frames, k);
      aggregate(lc, frames, k, t0);
    }
    if (poll) {
      const unsigned n =
          rte_ring_dequeue_burst(w.inbox, reinterpret_cast<void**>(pkts), cfg_.burst, nullptr);
      if (n) {
        moved += n;
        aggregate(lc, frames, classify(lc, pkts, n, frames), t0);
      }
      moved += flush(lc, drained, t0);  // TX handoff packets are work too (idle rule)
    }
    void* c;
    if (!w.ignore_commands && rte_ring_dequeue(w.commands, &c) == 0) {
      ++moved;  // a control command is work too: the next one is not paced by the idle sleep
      commanded = true;
      run_command(w, static_cast<Command*>(c));
      // What it changed (rings, memory) shows in the next read, the rings' figures too.
      publish(w, rte_rdtsc(), true);
    }
    // Retired rings whose grace has passed are forgotten (cheap when none is due).
    w.engine->expire_retired(t0);
    rte_rcu_qsbr_quiescent(qsbr_, w.index);
    const uint64_t t1 = rte_rdtsc();
    if (moved) {
      w.stats.busy_cycles += t1 - t0;
      ++w.stats.busy_polls;
      if (t1 - t0 > stall_threshold_cycles_ && !commanded) [[unlikely]] {
        ++w.stats.stalls;
        w.stats.stall_cycles += t1 - t0;
        w.stats.stall_rx += received;
      }
    }
    if (w.asked.load(std::memory_order_relaxed) > w.published_at ||
        w.rings_asked.load(std::memory_order_relaxed) > w.pub.f.rings_tsc ||
        t1 - w.published_at >= publish_cycles_)
      publish(w, t1);
    idle(w, moved != 0, t1);
    const uint64_t t2 = rte_rdtsc();
    w.stats.total_cycles += t2 - t0;
    t0 = t2;
  }
  // Stopping: flush what is queued (not while paused: the port's peer may be
  // gone), release everything the engine holds.
  if (polling()) flush(lc, true, rte_rdtsc());
  for (uint32_t id : w.engine->ring_ids()) {
    std::vector<engine::Pkt> rel;
    (void)w.engine->remove_ring(id, rte_rdtsc(), rel);
    for (const auto& p : rel) rte_pktmbuf_free(static_cast<rte_mbuf*>(p.handle));
  }
  unsigned n;
  while ((n = rte_ring_dequeue_burst(w.inbox, reinterpret_cast<void**>(pkts), kMaxBurst,
                                     nullptr)) != 0)
    rte_pktmbuf_free_bulk(pkts, n);
  // Answer whatever control work is queued, then let callers act directly.
  void* c;
  while (rte_ring_dequeue(w.commands, &c) == 0) run_command(w, static_cast<Command*>(c));
  publish(w, rte_rdtsc());
  w.stopped.store(true, std::memory_order_release);
  rte_rcu_qsbr_thread_offline(qsbr_, w.index);
  rte_rcu_qsbr_thread_unregister(qsbr_, w.index);
}

void Dataplane::idle(Worker& w, bool moved, uint64_t now) {
  if (moved || cfg_.idle_sleep_max_us == 0) {
    if (moved) w.last_busy = now;
    w.sleep_us = 0;
    return;
  }
  if (w.sleep_us == 0) {
    if (now - w.last_busy < rte_get_tsc_hz() / 1000000 * cfg_.idle_after_us) return;
    w.sleep_us = 1;
  } else {
    w.sleep_us = std::min(w.sleep_us * 2, cfg_.idle_sleep_max_us);
  }
  const timespec ts{0, static_cast<long>(w.sleep_us) * 1000};
  ::nanosleep(&ts, nullptr);
  ++w.stats.idle_sleeps;
  // In double: cycles x 1e9 would overflow 64 bits after a few seconds (a suspended VM).
  w.stats.idle_sleep_ns += static_cast<uint64_t>(static_cast<double>(rte_rdtsc() - now) * 1e9 /
                                                 static_cast<double>(rte_get_tsc_hz()));
}

}  // namespace netreduce::dataplane
