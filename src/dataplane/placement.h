// Placement: which worker owns each ring, and the link table that steers a
// ring's frames to it. Control thread only; DPDK-free (unit-tested in
// tests/dataplane/placement_test.cc). Dataplane (rings.cc) asks place(),
// has the worker's engine take the ring, then add()s it and publishes
// link_table(); removing retires it, and expire() lets it go.
//
// Links. A link is an ordered pair of adjacent ring members (src, dst); all
// packets of one connection must meet in one engine, because they carry one
// PSN sequence. Without QP numbers the box knows a ring's links only, so a
// link is owned by one worker. A new ring goes to the worker that owns any
// of its links, or to the least loaded worker when none is owned. A ring
// whose links are owned by two different workers is refused (conflict,
// naming the rings and workers): placing it would re-point one worker's
// links to the other and strand that ring's packets on a worker without
// it. A link's owner never changes while any ring uses it.
//
// Spreading. A ring that gives its QP numbers (spec.qpns), and whose
// link-sharing rings all do too (the stripes of one job), goes to the least
// loaded worker, preferring workers without a ring sharing its links: its
// links may then be split over workers, and dispatch sends a split link's
// packets by their receiving connection (dst, dest QP). A connection is one
// ring's: an installed ring using it refuses the new one. A ring installed
// again while its namesake (or a ring whose connection it reuses) retires
// joins the tombstone's worker, the only engine that re-binds retired
// connections.
//
// Trees. A tree node owns only its local ranks' links, and its tree id
// steers its box-to-box frames; a tree without local ranks goes where its
// retiring namesake is. Trees keep the link rule.
//
// Retirement. A removed ring's links, connections and tree stay counted
// (pointing at its worker, whose engine drops its late packets) until
// expire() passes its `until`.
//
// Example: two workers. Ring 1 over A, B, C goes to worker 0 (least
// loaded); ring 2 over D, E to worker 1. Ring 3 over A, B, D, E shares
// A->B with ring 1 and D->E with ring 2: refused, "ring 1 on worker 0;
// ring 2 on worker 1". Ring 4 over A, B, F shares A->B only: worker 0.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "dataplane/link_table.h"
#include "engine/engine.h"

namespace netreduce::dataplane {

// The links the box owns for a ring (LinkTable::key), every rank's or a
// tree node's local ranks' only (the engine installs no other; the rest
// pass any worker untouched), and their receiving connections
// (LinkTable::conn_key: the successor's address and QP number; empty
// without qpns), in the same order.
std::vector<uint64_t> links_of(const engine::RingSpec& spec,
                               const std::optional<engine::TreeSpec>& tree);
std::vector<uint64_t> conns_of(const engine::RingSpec& spec,
                               const std::optional<engine::TreeSpec>& tree);

class Placement {
 public:
  using Clock = std::chrono::steady_clock;
  struct Ring {
    engine::RingSpec spec;
    std::optional<engine::TreeSpec> tree;  // this box's node of the ring's tree, if any
    unsigned owner = 0;
  };
  // A removed ring in its grace. The same id may appear twice (removed,
  // installed again, removed again).
  struct Retiring : Ring {
    Clock::time_point until;
  };

  explicit Placement(unsigned workers) : workers_(workers) {}

  // The worker for a ring not installed yet (`owner`), or a conflict that
  // names the field (members, qpns) and the rings and workers in the way
  // (`owner` untouched).
  Status place(const engine::RingSpec& spec, const std::optional<engine::TreeSpec>& tree,
               unsigned& owner) const;
  // The ring is installed on its owner: its links, connections, tree id and
  // box address count from now on.
  void add(Ring ring);
  // The installed ring `id` retires until `until`; it stays counted.
  void retire(uint32_t id, Clock::time_point until);
  // Retiring rings whose `until` has passed are let go; returns them.
  std::vector<Retiring> expire(Clock::time_point now);

  const Ring* installed(uint32_t id) const;
  const std::unordered_map<uint32_t, Ring>& installed() const { return installed_; }
  const std::vector<Retiring>& retiring() const { return retiring_; }
  bool empty() const { return installed_.empty() && retiring_.empty(); }
  std::string in_use() const;  // "installed: 1, 2; retiring: 3"
  // The table workers read, from the current counts.
  std::unique_ptr<LinkTable> link_table() const;

 private:
  struct Use {
    uint16_t owner;  // never changes while rings > 0
    uint32_t rings;  // rings (installed or retiring) using it
  };
  // Every placed ring, installed or retiring, once each.
  template <typename Fn>
  void each(Fn&& fn) const {
    for (const auto& [id, r] : installed_) fn(r);
    for (const Retiring& r : retiring_) fn(static_cast<const Ring&>(r));
  }
  std::vector<unsigned> load() const;  // rings (installed or retiring) per worker
  Status spread(const engine::RingSpec& spec, const std::vector<unsigned>& sharing,
                unsigned& owner) const;
  Status links_conflict(const engine::RingSpec& spec, const std::optional<engine::TreeSpec>& tree,
                        std::map<unsigned, std::set<uint32_t>> owners) const;
  void release(const Ring& r);

  unsigned workers_;
  std::unordered_map<uint32_t, Ring> installed_;
  std::vector<Retiring> retiring_;
  // Link -> worker -> rings on that worker using it. One worker: dispatch by
  // link. Several: a split link (spreading).
  std::unordered_map<uint64_t, std::map<uint16_t, uint32_t>> link_use_;
  // Receiving connection (LinkTable::conn_key) -> owner, for rings with qpns.
  std::unordered_map<uint64_t, Use> conn_use_;
  // Tree id (= ring id) -> owner: one owner per id, since the same id
  // installed again joins its retiring namesake's worker.
  std::unordered_map<uint32_t, Use> tree_use_;
  // Box-to-box address (a tree node's self IP) -> tree nodes with it: an
  // address stays the box's while its removed trees retire, so their frames
  // are dropped, not forwarded.
  std::map<uint32_t, uint32_t> box_ip_use_;
};

}  // namespace netreduce::dataplane
