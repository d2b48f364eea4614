// Stage: transmit. Packets leave on the port opposite to the one they came
// in on, through this worker's TX buffer for that port or, when the device
// has fewer TX queues than workers, through the handoff ring of the worker
// that owns the queue. A buffer is sent when a burst's worth is queued, when
// the worker loop flushes after a short RX poll (force), or by the 100 us
// timer while every poll is full (docs/design.md#the-data-plane).
#include <rte_cycles.h>
#include <rte_ethdev.h>
#include <rte_mbuf.h>
#include <rte_ring.h>

#include "dataplane/lcore.h"

namespace netreduce::dataplane {

void transmit(Lcore& lc, rte_mbuf* m, unsigned in_slot) {
  Worker& w = lc.w;
  const unsigned out = in_slot ^ 1u;
  if (w.txq[out] >= 0) {
    w.stats.tx_bytes[out] += m->pkt_len;
    w.stats.tx[out] +=
        rte_eth_tx_buffer(lc.port_id[out], static_cast<uint16_t>(w.txq[out]), w.txbuf[out], m);
    return;
  }
  if (rte_ring_enqueue(w.tx_handoff_to[out], m) != 0) {
    ++w.stats.reasons[out][index(Reason::tx_full)];
    rte_pktmbuf_free(m);
  }
}

unsigned flush(Lcore& lc, bool force, uint64_t now) {
  Worker& w = lc.w;
  // Packets other workers handed to our TX queues.
  unsigned handed = 0;
  for (unsigned s = 0; s < 2; ++s) {
    if (!w.tx_handoff_in[s] || w.txq[s] < 0) continue;
    rte_mbuf* pk[kMaxBurst];
    const unsigned n = rte_ring_dequeue_burst(w.tx_handoff_in[s], reinterpret_cast<void**>(pk),
                                              kMaxBurst, nullptr);
    handed += n;
    for (unsigned i = 0; i < n; ++i) {
      w.stats.tx_bytes[s] += pk[i]->pkt_len;
      w.stats.tx[s] +=
          rte_eth_tx_buffer(lc.port_id[s], static_cast<uint16_t>(w.txq[s]), w.txbuf[s], pk[i]);
    }
  }
  if (!force && now - w.last_flush < rte_get_tsc_hz() / 10000) return handed;
  w.last_flush = now;
  for (unsigned s = 0; s < 2; ++s)
    if (w.txq[s] >= 0)
      w.stats.tx[s] +=
          rte_eth_tx_buffer_flush(lc.port_id[s], static_cast<uint16_t>(w.txq[s]), w.txbuf[s]);
  return handed;
}

}  // namespace netreduce::dataplane
