// Stage: classify. Every frame of a burst is parsed once, here, into an
// engine::Frame (its mbuf, the header offsets, the parse status); dispatch
// and the engine read that parse and never parse the frame again.
//
// Multi-segment mbufs are not frames the engine can read (it needs the
// frame contiguous): they leave at once on the opposite port, untouched,
// counted as multi_segment, ahead of the burst's earlier frames (which leave
// after the engine). Known limit: a connection mixing chained and contiguous
// mbufs in one burst is reordered there (the receiver NAKs and the sender
// resends); the box's own pool holds whole frames, so only chained mbufs
// from a peer process (net_ring, memif) can meet it.
//
// Prefetching: a frame arrives cold (the NIC, or the core that wrote it, has
// it; not this core's cache). Parsing reads its headers (at most the first
// two lines), so while frame i is parsed those of frame i + kAhead are
// prefetched. The rest of the frame (the engine's ICRC check reads every
// line) is prefetched by the engine a couple of packets ahead of use: doing
// it here for a whole burst of 4 KB frames would push them out of L1 before
// the engine reaches them.
#include <rte_mbuf.h>
#include <rte_prefetch.h>

#include "dataplane/lcore.h"

namespace netreduce::dataplane {

namespace {
constexpr unsigned kAhead = 4;

inline void prefetch_headers(const rte_mbuf* m) {
  const auto* d = rte_pktmbuf_mtod(m, const uint8_t*);
  rte_prefetch0(d);
  rte_prefetch0(d + RTE_CACHE_LINE_SIZE);
}
}  // namespace

unsigned classify(Lcore& lc, rte_mbuf** pkts, unsigned n, engine::Frame* frames) {
  for (unsigned i = 0; i < kAhead && i < n; ++i) prefetch_headers(pkts[i]);
  unsigned k = 0;
  for (unsigned i = 0; i < n; ++i) {
    if (i + kAhead < n) prefetch_headers(pkts[i + kAhead]);
    rte_mbuf* m = pkts[i];
    const unsigned slot = lc.slot_of(m->port);
    if (m->nb_segs != 1) {
      ++lc.w.stats.reasons[slot][index(Reason::multi_segment)];
      transmit(lc, m, slot);
      continue;
    }
    engine::Engine::classify(
        {rte_pktmbuf_mtod(m, uint8_t*), m->data_len, m, static_cast<uint16_t>(slot)}, frames[k++]);
  }
  return k;
}

}  // namespace netreduce::dataplane
