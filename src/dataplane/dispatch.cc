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
  unsigned kept = 0;
  rte_mbuf* out[kMaxWorkers][kMaxBurst];
  unsigned nout[kMaxWorkers] = {};
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
    if (owner == w.index)
      mine[kept++] = m;
    else
      out[owner][nout[owner]++] = m;
  }
  for (unsigned o = 0; o < dp.workers().size(); ++o) {
    if (!nout[o]) continue;
    const unsigned sent = rte_ring_enqueue_burst(
        dp.workers()[o]->inbox, reinterpret_cast<void**>(out[o]), nout[o], nullptr);
    w.stats.dispatched += sent;
    for (unsigned i = sent; i < nout[o]; ++i) {
      ++w.stats.dispatch_dropped;
      rte_pktmbuf_free(out[o][i]);
    }
  }
  return kept;
}

}  // namespace netreduce::dataplane
