// Stage: aggregate. Each packet goes through the worker's Engine (parse, CLT
// lookup, cells, reduction, ICRC fix-up); the verdict decides whether the
// mbuf is transmitted, kept (held in a cell) or freed, and whatever the
// engine releases is transmitted toward the port opposite to where each
// packet came in.
//
// Prefetching: a frame arrives cold (the NIC, or the core that wrote it, has
// it; not this core's cache), and the engine's first touch (parse, then the
// ICRC check over the whole frame) would stall on every line. So while packet
// i is processed, every line of packet i + kAhead is prefetched.
#include <rte_cycles.h>
#include <rte_mbuf.h>
#include <rte_prefetch.h>

#include "dataplane/dataplane.h"

namespace netreduce::dataplane {

namespace {
inline unsigned slot_of(const Dataplane& dp, const rte_mbuf* m) {
  return m->port == dp.port_id(0) ? 0 : 1;
}

constexpr unsigned kAhead = 4;

inline void prefetch_frame(const rte_mbuf* m) {
  const auto* d = rte_pktmbuf_mtod(m, const uint8_t*);
  for (unsigned off = 0; off < m->data_len; off += RTE_CACHE_LINE_SIZE) rte_prefetch0(d + off);
}
}  // namespace

void aggregate(Dataplane& dp, Worker& w, rte_mbuf** pkts, unsigned n, uint64_t now) {
  engine::Sink& sink = w.sink;
  for (unsigned i = 0; i < kAhead && i < n; ++i) prefetch_frame(pkts[i]);
  for (unsigned i = 0; i < n; ++i) {
    if (i + kAhead < n) prefetch_frame(pkts[i + kAhead]);
    rte_mbuf* m = pkts[i];
    const unsigned slot = slot_of(dp, m);
    if (m->nb_segs != 1) {  // the engine needs contiguous frames; a chained one passes untouched
      ++w.stats.multi_segment;
      transmit(dp, w, m, slot);
      continue;
    }
    sink.clear();
    engine::Pkt pkt{rte_pktmbuf_mtod(m, uint8_t*), m->data_len, m, static_cast<uint16_t>(slot)};
    const engine::Outcome o = w.engine->process(pkt, now, sink);
    switch (o.verdict) {
      case engine::Verdict::forward:
      case engine::Verdict::emit:
        transmit(dp, w, m, slot);
        break;
      case engine::Verdict::consumed:
      case engine::Verdict::drop:
        rte_pktmbuf_free(m);
        break;
      case engine::Verdict::held:
        break;
    }
    for (unsigned k = 0; k < sink.ntx; ++k) {
      auto* r = static_cast<rte_mbuf*>(sink.tx[k].handle);
      r->data_len = sink.tx[k].len;
      r->pkt_len = sink.tx[k].len;
      transmit(dp, w, r, sink.tx[k].meta);
    }
    for (unsigned k = 0; k < sink.ndrop; ++k)
      rte_pktmbuf_free(static_cast<rte_mbuf*>(sink.drop[k].handle));
  }
}

}  // namespace netreduce::dataplane
