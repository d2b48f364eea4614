// Stage: dispatch. Frames of a ring link owned by another worker go to that
// worker's inbox, which carries mbuf pointers only: the owner classifies
// them again on arrival. Carrying the parse would need room in every mbuf
// (a private area) for the few frames that change workers, while the
// owner's parse reads header lines it is about to read anyway. On a split link
// (rings on several workers share it: rings that gave their QP numbers) the
// frame's receiving connection (dst, BTH dest QP) names the worker, and a
// connection of no ring goes to the link's home worker (one with a ring on
// it: its engine drops an INA packet naming a ring it lacks, and forwards
// plain traffic, as any engine owning the link would). Box-to-box frames (UDP wire::kB2bPort) of a
// tree another worker owns go by the header's tree id; one whose tree id is unknown or cannot be
// read (a short header, IPv4 options, cut short, fragmented) stays, and the engine here, which
// knows the box's addresses (LinkTable::box_ips), drops it if it is for this box. Everything else
// stays, compacted in place.
// Cost: one hash lookup per RDMA WRITE, on the parse classify made (two on a split link), and one
// per UDP frame to the box-to-box port while a tree is installed (RoCE frames never look at the
// tree table); skipped entirely with a single worker.
#include <rte_mbuf.h>
#include <rte_ring.h>

#include "dataplane/lcore.h"
#include "wire/b2b.h"

namespace netreduce::dataplane {

unsigned dispatch(Lcore& lc, engine::Frame* frames, unsigned n) {
  if (lc.nworkers == 1) return n;
  const LinkTable* links = lc.link_table();
  Worker& w = lc.w;
  if (!links || (links->owner.empty() && links->tree_owner.empty())) return n;
  unsigned kept = 0, away = 0;
  uint16_t owner_of[kMaxBurst];
  rte_mbuf* others[kMaxBurst];
  for (unsigned i = 0; i < n; ++i) {
    const engine::Frame& f = frames[i];
    unsigned owner = w.index;
    if (f.status == wire::ParseStatus::ok && wire::is_rdma_write(f.parsed.opcode)) {
      const auto* ip = reinterpret_cast<const wire::Ipv4Hdr*>(f.pkt.data + f.parsed.l3);
      auto it = links->owner.find(LinkTable::key(ip->src.host(), ip->dst.host()));
      if (it != links->owner.end()) {
        owner = it->second;
        if (owner & LinkTable::kSplitBit) {
          const auto* bth = reinterpret_cast<const wire::Bth*>(f.pkt.data + f.parsed.bth);
          auto c = links->conn_owner.find(LinkTable::conn_key(ip->dst.host(), bth->dest_qp.host()));
          owner = c != links->conn_owner.end() ? c->second : owner & ~LinkTable::kSplitBit;
        }
      }
    } else if (f.status == wire::ParseStatus::not_roce_port && f.parsed.l3 != 0 &&
               !links->tree_owner.empty()) {
      // classify stopped at the UDP port: IPv4 without options at l3 (l3 is
      // set only then).
      if (auto id = wire::b2b_tree_id_at(f.pkt.data, f.pkt.len, f.parsed.l3)) {
        auto it = links->tree_owner.find(*id);
        if (it != links->tree_owner.end()) owner = it->second;
      }
    }
    if (owner == w.index) {
      frames[kept++] = f;
    } else {
      owner_of[away] = static_cast<uint16_t>(owner);
      others[away++] = static_cast<rte_mbuf*>(f.pkt.handle);
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
    const unsigned sent = rte_ring_enqueue_burst(lc.workers[dest]->inbox,
                                                 reinterpret_cast<void**>(batch), nb, nullptr);
    w.stats.dispatched += sent;
    for (unsigned i = sent; i < nb; ++i) {
      const unsigned in_slot = lc.slot_of(batch[i]->port);
      ++w.stats.reasons[in_slot][index(Reason::inbox_full)];
      rte_pktmbuf_free(batch[i]);
    }
  }
  return kept;
}

}  // namespace netreduce::dataplane
