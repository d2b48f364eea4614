// Stage: dispatch. Packets of a ring link owned by another worker go to that
// worker's inbox; everything else stays. Cost: one parse and one hash lookup
// per RDMA WRITE (~15 ns); skipped entirely with a single worker.
#include <rte_mbuf.h>
#include <rte_ring.h>

#include "dataplane/dataplane.h"
#include "wire/parse.h"

namespace netreduce::dataplane {

unsigned dispatch(Dataplane& dp, Worker& w, rte_mbuf** pkts, unsigned n, rte_mbuf** mine) {
  if (dp.workers().size() == 1) {
    for (unsigned i = 0; i < n; ++i) mine[i] = pkts[i];
    return n;
  }
  const LinkTable* links = dp.links();
  unsigned kept = 0, away = 0;
  uint16_t owner_of[kMaxBurst];
  rte_mbuf* others[kMaxBurst];
  for (unsigned i = 0; i < n; ++i) {
    rte_mbuf* m = pkts[i];
    wire::ParsedFrame p;
    unsigned owner = w.index;
    if (links && !links->owner.empty() && m->nb_segs == 1 &&
        wire::parse_frame(rte_pktmbuf_mtod(m, const uint8_t*), m->data_len, p) ==
            wire::ParseStatus::ok &&
        wire::is_rdma_write(p.opcode)) {
      const auto* ip = rte_pktmbuf_mtod_offset(m, const wire::Ipv4Hdr*, p.l3);
      auto it = links->owner.find(LinkTable::key(ip->src.host(), ip->dst.host()));
      if (it != links->owner.end()) owner = it->second;
    }
    if (owner == w.index) {
      mine[kept++] = m;
    } else {
      owner_of[away] = static_cast<uint16_t>(owner);
      others[away++] = m;
    }
  }
  // Hand the others over, one enqueue per destination worker.
  rte_mbuf* batch[kMaxBurst];
  while (away) {
    const uint16_t dest = owner_of[0];
    unsigned nb = 0, rest = 0;
    for (unsigned i = 0; i < away; ++i) {
      if (owner_of[i] == dest) {
        batch[nb++] = others[i];
      } else {
        owner_of[rest] = owner_of[i];
        others[rest++] = others[i];
      }
    }
    away = rest;
    const unsigned sent = rte_ring_enqueue_burst(dp.workers()[dest]->inbox,
                                                 reinterpret_cast<void**>(batch), nb, nullptr);
    w.stats.dispatched += sent;
    for (unsigned i = sent; i < nb; ++i) {
      ++w.stats.dispatch_dropped;
      rte_pktmbuf_free(batch[i]);
    }
  }
  return kept;
}

}  // namespace netreduce::dataplane
