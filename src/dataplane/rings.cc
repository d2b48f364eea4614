// The rings' lifecycle (control thread only): admission, install,
// removal and retirement. Which worker owns a ring is Placement's
// (placement.h); this file applies its answer.
//
// Install. A ring is admitted against the engine memory budget and the
// mbufs its cells may hold (half the pool stays for RX), placed, built on
// the control thread (Engine::prepare_ring: allocation and zero-fill), and
// attached by its worker's engine; only then do its links point at the
// owner (a new LinkTable, published RCU-style, dataplane.h).
//
// Retirement. Removing a ring must make its running job fail, never hand
// it unreduced data: packets of the ring still in flight (later positions of
// a message, go-back-N resends of held ones) must not leave the box. So the
// owner's engine retires the ring (held packets freed, reason ring_removed;
// its connections kept as a tombstone whose packets are dropped as
// ring_retired) and the ring's links keep pointing at the owner, so dispatch
// still brings those packets to the engine holding the tombstone. After
// rings.retire_grace_ms the worker's engine forgets the tombstone
// (expire_retired, every loop iteration), and housekeeping() on the control
// thread lets the placement drop the ring's links kRetireMargin later.
// Meanwhile forward mode is refused. The same id may be installed again: the
// new ring joins the worker holding the tombstone, whose engine re-binds a
// retired connection only to a first packet naming an installed ring, never
// over a live one (engine.h).
//
// Trees. A ring installed with a tree node (engine/tree.h) is admitted with
// its child boxes' partial store (tree_memory_bytes) and with every local
// packet held while a cell awaits its parent. The same ring with the same
// tree again is a no-op; another tree (or none) under an installed id is a
// conflict.
#include <rte_mbuf.h>
#include <rte_rcu_qsbr.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "dataplane/dataplane.h"

namespace netreduce::dataplane {

namespace {

// After the engine's grace: the worker expires its tombstone first, then the
// control thread drops the links (different clocks: TSC and steady_clock).
constexpr auto kRetireMargin = std::chrono::milliseconds(100);

}  // namespace

void Dataplane::publish_links(std::unique_ptr<LinkTable> t) {
  links_.store(t.get(), std::memory_order_release);
  uint64_t token = 0;
  if (Status s = quiesce(&token); !s) {
    // A stuck worker may still hold the old table: it is freed later
    // (housekeeping), never under it. The new one is live already.
    spdlog::warn("link table replaced; the old one is kept until {}", s.message());
    links_deferred_.emplace_back(token, std::move(links_owned_));
  }
  links_owned_ = std::move(t);  // the old table is unreachable now: freed here
}

Status Dataplane::set_mode(Mode m) {
  if (m == Mode::forward && !placement_.empty())
    return {StatusCode::conflict, "mode",
            "forward mode would send every ring's packets out unreduced, and their jobs would "
            "accept them as results; rings in use (" +
                placement_.in_use() +
                "): remove them and wait out their retirement (rings.retire_grace_ms) first"};
  const Mode previous = mode_.exchange(m, std::memory_order_acq_rel);
  if (previous == m) return {};  // nothing changed: nothing to wait for
  // Every worker finishes the burst it is in: none processes in the old mode
  // once this returns. A stuck worker might: the old mode comes back (with
  // no ring in either, the few bursts that saw the new one changed nothing).
  if (Status s = quiesce(); !s) {
    mode_.store(previous, std::memory_order_release);
    return s;
  }
  return {};
}

Status Dataplane::set_polling(bool on) {
  polling_.store(on, std::memory_order_release);
  // Pausing: every worker finishes the iteration it is in, so none is inside
  // a PMD call made before the store once this returns. Resuming needs no
  // grace.
  return on ? Status{} : quiesce();
}

Status Dataplane::install_ring(const engine::RingSpec& spec,
                               const std::optional<engine::TreeSpec>& tree) {
  if (Status s = engine::validate(spec); !s) return s;
  if (tree) {
    if (Status s = engine::validate_tree(spec, *tree); !s)
      return Status(s.code(), "tree." + s.field(), s.message());
    if (cfg_.reduce_mode != engine::ReduceMode::deterministic)
      return {StatusCode::unimplemented, "tree",
              "a tree node needs engine.reduce_mode deterministic (accumulate mode is not built "
              "for trees yet)"};
  }
  if (mode() != Mode::aggregate)
    return {StatusCode::conflict, "mode",
            "the box is in forward mode, which would send the ring's packets out unreduced: "
            "set_mode aggregate first"};
  if (const Placement::Ring* had = placement_.installed(spec.ring_id)) {
    if (had->spec == spec && had->tree == tree) return {};
    if (had->spec == spec)
      return {StatusCode::conflict, "tree",
              "ring " + std::to_string(spec.ring_id) + " is installed with " +
                  (had->tree ? "a different tree" : "no tree") +
                  ": remove it first to change its tree"};
    return {StatusCode::conflict, "id",
            "ring " + std::to_string(spec.ring_id) + " is installed with a different spec"};
  }
  // A tree node keeps its child boxes' partials too (box_data).
  const uint64_t need = engine::ring_memory_bytes(spec, cfg_.reduce_mode) +
                        (tree ? engine::tree_memory_bytes(spec, *tree) : 0);
  if (memory_reserved_ + need > cfg_.engine_memory)
    return {StatusCode::resource_exhausted, "memory",
            "ring needs " + std::to_string(need) + " bytes; " +
                std::to_string(cfg_.engine_memory - memory_reserved_) +
                " of memory.engine=" + std::to_string(cfg_.engine_memory) + " are free"};
  // Held packets keep their mbufs: all rings together may hold at most half
  // the pool, or RX could starve and stall every job. A tree node holds
  // every local rank's packet while its cell awaits the parent's result.
  unsigned holders = spec.ranks() - 1;
  if (tree) {
    holders = 0;
    for (const engine::TreeChild& c : tree->children)
      holders += c.kind == engine::TreeChild::Kind::rank;
  }
  const uint64_t held_max =
      cfg_.reduce_mode == engine::ReduceMode::deterministic
          ? uint64_t{engine::slots_for_window(spec.window)} * spec.msg_len * holders
          : 0;
  if (mbufs_reserved_ + held_max > cfg_.mbufs / 2)
    return {
        StatusCode::resource_exhausted, "memory.mbufs",
        "ring may hold " + std::to_string(held_max) + " packets; " +
            std::to_string(cfg_.mbufs / 2 - std::min<uint64_t>(mbufs_reserved_, cfg_.mbufs / 2)) +
            " of the pool's " + std::to_string(cfg_.mbufs) +
            " mbufs are left for holding (half stay for RX): raise memory.mbufs, or lower "
            "window/msg_len"};
  unsigned owner = 0;
  if (Status s = placement_.place(spec, tree, owner); !s) return s;
  // The ring's state is built here, on the control thread (allocation and
  // zero-fill: milliseconds for a large ring); the worker only attaches it.
  // Whatever the worker does not take is freed here too.
  const auto t0 = std::chrono::steady_clock::now();
  engine::PreparedRing prepared;
  if (Status s = engine::Engine::prepare_ring(workers_[owner]->engine->config(), spec,
                                              tree ? &*tree : nullptr, prepared);
      !s)
    return s;
  const auto t1 = std::chrono::steady_clock::now();
  Status result;
  uint64_t attach_cycles = 0;
  if (Status s = on_worker(owner,
                           [&](Worker& w) {
                             const uint64_t c0 = rte_rdtsc();
                             result = w.engine->install_ring(prepared);
                             attach_cycles = rte_rdtsc() - c0;
                           });
      !s)
    return s;  // nothing changed: the command was cancelled before it ran
  if (!result) return result;
  // The engine has the ring: now point its links at the owner.
  placement_.add({spec, tree, owner});
  publish_links(placement_.link_table());
  reserved_[spec.ring_id] = {need, held_max};
  memory_reserved_ += need;
  mbufs_reserved_ += held_max;
  spdlog::info(
      "ring {}{} installed on worker {} ({} ranks, {} bytes reserved; built in {:.2f} ms on the "
      "control thread, attached in {:.2f} us on the worker)",
      spec.ring_id, tree ? (tree->has_parent ? " (tree node)" : " (tree root)") : "", owner,
      spec.ranks(), need, std::chrono::duration<double, std::milli>(t1 - t0).count(),
      double(attach_cycles) * 1e6 / double(rte_get_tsc_hz()));
  return {};
}

Status Dataplane::remove_ring(uint32_t ring_id) {
  const Placement::Ring* ring = placement_.installed(ring_id);
  if (!ring) {
    for (const Placement::Retiring& r : placement_.retiring())
      if (r.spec.ring_id == ring_id)
        return {StatusCode::not_found, "id",
                "no ring " + std::to_string(ring_id) + " (removed already; retiring, " +
                    seconds_left(r) + " s left)"};
    return {StatusCode::not_found, "id", "no ring " + std::to_string(ring_id)};
  }
  const unsigned owner = ring->owner;
  // The owner's engine retires the ring; its links stay (see the top).
  // The worker detaches the ring and hands its held packets back; both are
  // freed here, on the control thread.
  Status result;
  std::vector<engine::Pkt> rel;
  engine::PreparedRing detached;
  if (Status s = on_worker(
          owner,
          [&](Worker& w) { result = w.engine->remove_ring(ring_id, rte_rdtsc(), rel, &detached); });
      !s)
    return s;  // nothing changed: the command was cancelled before it ran
  const size_t released = rel.size();
  for (const auto& p : rel) rte_pktmbuf_free(static_cast<rte_mbuf*>(p.handle));
  detached.reset();
  if (!result) return result;
  placement_.retire(ring_id, std::chrono::steady_clock::now() +
                                 std::chrono::milliseconds(cfg_.retire_grace_ms) + kRetireMargin);
  // The engine freed the ring's cells and its held packets at once.
  const auto r = reserved_.extract(ring_id);
  memory_reserved_ -= r.mapped().memory;
  mbufs_reserved_ -= r.mapped().mbufs;
  spdlog::info(
      "ring {} removed from worker {}; {} held packets released; retiring for {} ms (its packets "
      "are dropped meanwhile)",
      ring_id, owner, released, cfg_.retire_grace_ms);
  return {};
}

std::string Dataplane::seconds_left(const Placement::Retiring& r) const {
  const auto left = std::chrono::duration<double>(r.until - std::chrono::steady_clock::now());
  char b[32];
  std::snprintf(b, sizeof(b), "%.1f", std::max(0.0, left.count()));
  return b;
}

void Dataplane::housekeeping() {
  std::erase_if(links_deferred_,
                [&](const auto& d) { return rte_rcu_qsbr_check(qsbr_, d.first, false) == 1; });
  const auto gone = placement_.expire(std::chrono::steady_clock::now());
  if (gone.empty()) return;
  for (const Placement::Retiring& r : gone)
    spdlog::info("ring {} retired: its links are released", r.spec.ring_id);
  publish_links(placement_.link_table());
}

nlohmann::json Dataplane::retiring_json() const {
  auto arr = nlohmann::json::array();
  for (const Placement::Retiring& r : placement_.retiring())
    arr.push_back({{"id", r.spec.ring_id},
                   {"worker", r.owner},
                   {"seconds_left", std::stod(seconds_left(r))}});
  return arr;
}

}  // namespace netreduce::dataplane
