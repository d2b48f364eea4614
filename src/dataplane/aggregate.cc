// Stage: aggregate. The classified burst goes through the worker's Engine in
// one call (Engine::process_burst: CLT lookup, cells, reduction, ICRC
// fix-up); each frame's verdict decides whether its mbuf is transmitted,
// kept (held in a cell) or freed, and whatever the engine releases is
// transmitted toward the port opposite to where each packet came in, in the
// order the packets would have left one by one (a frame, then what it
// released). The engine stops early only when its sink could overflow: the
// sink is drained and the rest of the burst goes in again.
//
// The engine gets the box's box-to-box addresses (LinkTable::box_ips) for
// the burst, so it drops a frame for the box even without the frame's tree;
// the table is RCU-protected, valid until this worker's next quiescent
// state, so the engine forgets the pointer again before the burst ends.
#include <rte_mbuf.h>

#include "dataplane/lcore.h"

namespace netreduce::dataplane {

void aggregate(Lcore& lc, const engine::Frame* frames, unsigned n, uint64_t now) {
  Worker& w = lc.w;
  engine::Sink& sink = w.sink;
  const LinkTable* links = lc.link_table();
  if (links) w.engine->set_box_addresses(links->box_ips.data(), links->box_ips.size());
  engine::Outcome outcomes[kMaxBurst];
  unsigned done = 0;
  while (done < n) {
    sink.clear();
    const unsigned k = w.engine->process_burst(frames + done, n - done, now, outcomes, sink);
    unsigned next_tx = 0;
    for (unsigned i = 0; i < k; ++i) {
      const engine::Pkt& pkt = frames[done + i].pkt;
      auto* m = static_cast<rte_mbuf*>(pkt.handle);
      switch (outcomes[i].verdict) {
        case engine::Verdict::forward:
        case engine::Verdict::emit:
          transmit(lc, m, pkt.meta);
          break;
        case engine::Verdict::consumed:
        case engine::Verdict::drop:
          rte_pktmbuf_free(m);
          break;
        case engine::Verdict::held:
          break;
      }
      for (const unsigned end = next_tx + outcomes[i].released; next_tx < end; ++next_tx) {
        const engine::Pkt& r = sink.tx[next_tx];
        auto* rm = static_cast<rte_mbuf*>(r.handle);
        rm->data_len = r.len;
        rm->pkt_len = r.len;
        transmit(lc, rm, r.meta);
      }
    }
    for (unsigned i = 0; i < sink.ndrop; ++i)
      rte_pktmbuf_free(static_cast<rte_mbuf*>(sink.drop[i].handle));
    done += k;
  }
  sink.clear();
  w.engine->set_box_addresses(nullptr, 0);
}

}  // namespace netreduce::dataplane
