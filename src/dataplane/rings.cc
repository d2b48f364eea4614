// Ring placement and lifecycle (control thread only).
//
// Placement. A link is an ordered pair of adjacent ring members (src, dst);
// all packets of one connection must meet in one engine, because they carry
// one PSN sequence. Without QP numbers the box knows a ring's links only, so
// a link is owned by one worker: `link_use_` counts, per link, the rings
// using it on each worker (installed and retiring alike). A new ring goes to
// the worker that owns any of its links, or to the least loaded worker when
// none is owned. A ring whose links are owned by two different workers is
// refused (conflict, naming the rings and workers): placing it would
// re-point one worker's links to the other and strand that ring's packets
// on a worker without it. A link's owner never changes while any ring uses
// it; it is dropped when its last ring is gone.
//
// Spreading. A ring that gives its QP numbers (spec.qpns), and
// whose link-sharing rings all do too (the stripes of one job: the same
// members, one QP pair per ring), is placed on the least loaded worker,
// preferring workers without a ring sharing its links: its links may then
// be split over workers, and dispatch sends a split link's packets by their
// receiving connection (dst, dest QP; `conn_use_`). Every connection of a
// ring on a split link is known, so none of its packets can reach another
// worker's engine. A ring installed again while its namesake retires joins
// the tombstone's worker (the engine re-binds retired connections only
// there); a connection another installed ring uses is refused. Trees keep
// the link rule.
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
// thread drops the ring's entry and its link references kRetireMargin later.
// Meanwhile forward mode is refused. The same id may be installed again: the
// new ring shares the old one's links, so it joins the worker holding the
// tombstone, whose engine re-binds a retired connection only to a first
// packet naming an installed ring, never over a live one (engine.h).
//
// Trees. A ring installed with a tree node (engine/tree.h) owns only its
// local ranks' links (links_of), is admitted with its child boxes' partial
// store (tree_memory_bytes) and with every local packet held while a cell
// awaits its parent, and counts in `tree_use_` (tree id -> owner), which
// steers its box-to-box frames. The same ring with the same tree again is
// a no-op; another tree (or none) under an installed id is a conflict.
//
// Published state. Workers see only the LinkTable (link -> owner, tree id
// -> owner, the box's box-to-box addresses), rebuilt from `link_use_`,
// `tree_use_` and `box_ip_use_` and published RCU-style (dataplane.h).
// `rings_` and `link_use_` are control-thread state; workers never read
// them.
#include <rte_mbuf.h>
#include <rte_rcu_qsbr.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>
#include <tuple>

#include "dataplane/dataplane.h"

namespace netreduce::dataplane {

namespace {

// After the engine's grace: the worker expires its tombstone first, then the
// control thread drops the links (different clocks: TSC and steady_clock).
constexpr auto kRetireMargin = std::chrono::milliseconds(100);

}  // namespace

std::vector<uint64_t> links_of(const engine::RingSpec& spec,
                               const std::optional<engine::TreeSpec>& tree) {
  std::vector<uint64_t> out;
  const unsigned p = spec.ranks();
  out.reserve(p);
  if (tree) {
    for (const engine::TreeChild& c : tree->children)
      if (c.kind == engine::TreeChild::Kind::rank)
        out.push_back(LinkTable::key(spec.members[c.index], spec.members[(c.index + 1u) % p]));
    return out;
  }
  for (unsigned r = 0; r < p; ++r)
    out.push_back(LinkTable::key(spec.members[r], spec.members[(r + 1) % p]));
  return out;
}

std::vector<uint64_t> conns_of(const engine::RingSpec& spec,
                               const std::optional<engine::TreeSpec>& tree) {
  std::vector<uint64_t> out;
  if (spec.qpns.empty() || tree) return out;
  const unsigned p = spec.ranks();
  for (unsigned r = 0; r < p; ++r)
    out.push_back(LinkTable::conn_key(spec.members[(r + 1) % p], spec.qpns[(r + 1) % p]));
  return out;
}

namespace {

std::string join_ids(const std::set<uint32_t>& ids) {
  std::string s;
  for (uint32_t id : ids) s += (s.empty() ? "" : ", ") + std::to_string(id);
  return s;
}

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

void Dataplane::publish_link_use() {
  auto next = std::make_unique<LinkTable>();
  next->owner.reserve(link_use_.size());
  for (const auto& [key, by] : link_use_)  // split: flagged, with its lowest worker as home
    next->owner.emplace(
        key, by.size() == 1 ? by.begin()->first : LinkTable::kSplitBit | by.begin()->first);
  next->conn_owner.reserve(conn_use_.size());
  for (const auto& [key, use] : conn_use_) next->conn_owner.emplace(key, use.owner);
  next->tree_owner.reserve(tree_use_.size());
  for (const auto& [id, use] : tree_use_) next->tree_owner.emplace(id, use.owner);
  next->box_ips.reserve(box_ip_use_.size());
  for (const auto& [ip, trees] : box_ip_use_) next->box_ips.push_back(ip);
  publish_links(std::move(next));
}

Status Dataplane::place(const engine::RingSpec& spec, const std::optional<engine::TreeSpec>& tree,
                        unsigned& owner) const {
  // Which workers own this ring's links, and through which rings; a tree
  // joins the worker of a retiring tree with its id (one owner per tree id).
  std::map<unsigned, std::set<uint32_t>> owners;
  const std::vector<uint64_t> mine = links_of(spec, tree);
  for (uint64_t key : mine)
    if (auto it = link_use_.find(key); it != link_use_.end())
      for (const auto& [w, n] : it->second) owners[w];
  if (tree)
    if (auto it = tree_use_.find(spec.ring_id); it != tree_use_.end())
      owners[it->second.owner].insert(spec.ring_id);
  // Spreading (see the top): this ring and every ring sharing a link with it
  // give their QP numbers.
  const auto shares = [&](const engine::RingSpec& other, const std::optional<engine::TreeSpec>& t) {
    for (uint64_t key : links_of(other, t))
      if (std::find(mine.begin(), mine.end(), key) != mine.end()) return true;
    return false;
  };
  bool spread = !spec.qpns.empty() && !tree;
  std::vector<unsigned> sharing(workers_.size(), 0);  // per worker: rings sharing a link
  for (const auto& [id, e] : rings_)
    if (shares(e.spec, e.tree)) {
      spread = spread && !e.spec.qpns.empty() && !e.tree;
      ++sharing[e.owner];
    }
  for (const Retiring& r : retiring_)
    if (shares(r.spec, r.tree)) {
      spread = spread && !r.spec.qpns.empty() && !r.tree;
      ++sharing[r.owner];
    }
  if (spread) {
    // A connection is one ring's: an installed ring using it refuses this
    // one (a retiring one is the tombstone of this id, on its worker).
    const std::vector<uint64_t> conns = conns_of(spec, tree);
    for (const auto& [id, e] : rings_)
      for (uint64_t c : conns_of(e.spec, e.tree))
        if (std::find(conns.begin(), conns.end(), c) != conns.end())
          return {StatusCode::conflict, "qpns",
                  "ring " + std::to_string(spec.ring_id) + " names a receiving QP (address and " +
                      "QP number) that ring " + std::to_string(id) +
                      " uses: each connection belongs to one ring"};
    // The tombstone of this id, or of a connection this ring reuses, keeps
    // its packets on its worker: join it.
    for (const Retiring& r : retiring_) {
      bool reuses = r.spec.ring_id == spec.ring_id;
      for (uint64_t c : conns_of(r.spec, r.tree))
        reuses = reuses || std::find(conns.begin(), conns.end(), c) != conns.end();
      if (reuses) {
        owner = r.owner;
        return {};
      }
    }
    std::vector<unsigned> load(workers_.size(), 0);
    for (const auto& [id, e] : rings_) ++load[e.owner];
    for (const Retiring& r : retiring_) ++load[r.owner];
    owner = 0;
    for (unsigned w = 1; w < workers_.size(); ++w)
      if (std::tie(load[w], sharing[w]) < std::tie(load[owner], sharing[owner])) owner = w;
    return {};
  }
  if (owners.size() > 1) {
    const auto name = [&](const engine::RingSpec& other, const std::optional<engine::TreeSpec>& t,
                          unsigned w) {
      for (uint64_t key : links_of(other, t))
        if (std::find(mine.begin(), mine.end(), key) != mine.end()) owners[w].insert(other.ring_id);
    };
    for (const auto& [id, e] : rings_) name(e.spec, e.tree, e.owner);
    for (const Retiring& r : retiring_) name(r.spec, r.tree, r.owner);
    std::string who;
    for (const auto& [w, ids] : owners)
      who += (who.empty() ? "" : "; ") + std::string(ids.size() > 1 ? "rings " : "ring ") +
             join_ids(ids) + " on worker " + std::to_string(w);
    return {StatusCode::conflict, "members",
            "ring " + std::to_string(spec.ring_id) +
                " shares links (adjacent member pairs) with rings on different workers (" + who +
                "); a link's packets must all meet in one worker: remove one of those rings "
                "first, or change the member order (rings that all give their QP numbers, "
                "\"qpns\", may share links across workers)"};
  }
  if (owners.size() == 1) {
    owner = owners.begin()->first;
    return {};
  }
  std::vector<unsigned> load(workers_.size(), 0);
  for (const auto& [id, e] : rings_) ++load[e.owner];
  for (const Retiring& r : retiring_) ++load[r.owner];
  owner = static_cast<unsigned>(std::min_element(load.begin(), load.end()) - load.begin());
  return {};
}

std::string Dataplane::rings_in_use() const {
  std::set<uint32_t> installed, retiring;
  for (const auto& [id, e] : rings_) installed.insert(id);
  for (const Retiring& r : retiring_) retiring.insert(r.spec.ring_id);
  std::string s;
  if (!installed.empty()) s = "installed: " + join_ids(installed);
  if (!retiring.empty())
    s += (s.empty() ? "" : "; ") + std::string("retiring: ") + join_ids(retiring);
  return s;
}

Status Dataplane::set_mode(Mode m) {
  if (m == Mode::forward && !(rings_.empty() && retiring_.empty()))
    return {StatusCode::conflict, "mode",
            "forward mode would send every ring's packets out unreduced, and their jobs would "
            "accept them as results; rings in use (" +
                rings_in_use() +
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
  if (auto it = rings_.find(spec.ring_id); it != rings_.end()) {
    if (it->second.spec == spec && it->second.tree == tree) return {};
    if (it->second.spec == spec)
      return {StatusCode::conflict, "tree",
              "ring " + std::to_string(spec.ring_id) + " is installed with " +
                  (it->second.tree ? "a different tree" : "no tree") +
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
  if (Status s = place(spec, tree, owner); !s) return s;
  // A connection is dispatched to one worker: one still counted for a ring on
  // another worker (a retiring one whose QP number the host reused) would
  // send this ring's packets there.
  for (uint64_t c : conns_of(spec, tree))
    if (auto it = conn_use_.find(c); it != conn_use_.end() && it->second.owner != owner)
      return {StatusCode::conflict, "qpns",
              "ring " + std::to_string(spec.ring_id) +
                  " names a receiving QP (address and QP number) still in use by a ring on "
                  "worker " +
                  std::to_string(it->second.owner) +
                  " (removed, retiring): wait out rings.retire_grace_ms or use new QPs"};
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
  for (uint64_t key : links_of(spec, tree)) ++link_use_[key][static_cast<uint16_t>(owner)];
  for (uint64_t key : conns_of(spec, tree))
    ++conn_use_.try_emplace(key, LinkUse{static_cast<uint16_t>(owner), 0}).first->second.rings;
  if (tree) {
    ++tree_use_.try_emplace(spec.ring_id, LinkUse{static_cast<uint16_t>(owner), 0})
          .first->second.rings;
    ++box_ip_use_[tree->self.ip];
  }
  publish_link_use();
  rings_[spec.ring_id] = {spec, tree, owner, need, held_max};
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
  auto it = rings_.find(ring_id);
  if (it == rings_.end()) {
    for (const Retiring& r : retiring_)
      if (r.spec.ring_id == ring_id)
        return {StatusCode::not_found, "id",
                "no ring " + std::to_string(ring_id) + " (removed already; retiring, " +
                    seconds_left(r) + " s left)"};
    return {StatusCode::not_found, "id", "no ring " + std::to_string(ring_id)};
  }
  const RingEntry e = it->second;
  // The owner's engine retires the ring; its links stay (see the top).
  // The worker detaches the ring and hands its held packets back; both are
  // freed here, on the control thread.
  Status result;
  std::vector<engine::Pkt> rel;
  engine::PreparedRing detached;
  if (Status s = on_worker(
          e.owner,
          [&](Worker& w) { result = w.engine->remove_ring(ring_id, rte_rdtsc(), rel, &detached); });
      !s)
    return s;  // nothing changed: the command was cancelled before it ran
  const size_t released = rel.size();
  for (const auto& p : rel) rte_pktmbuf_free(static_cast<rte_mbuf*>(p.handle));
  detached.reset();
  if (!result) return result;
  rings_.erase(it);
  retiring_.push_back({e.spec, e.tree, e.owner,
                       std::chrono::steady_clock::now() +
                           std::chrono::milliseconds(cfg_.retire_grace_ms) + kRetireMargin});
  // The engine freed the ring's cells and its held packets at once.
  memory_reserved_ -= e.memory;
  mbufs_reserved_ -= e.mbufs;
  spdlog::info(
      "ring {} removed from worker {}; {} held packets released; retiring for {} ms (its packets "
      "are dropped meanwhile)",
      ring_id, e.owner, released, cfg_.retire_grace_ms);
  return {};
}

std::string Dataplane::seconds_left(const Retiring& r) const {
  const auto left = std::chrono::duration<double>(r.until - std::chrono::steady_clock::now());
  char b[32];
  std::snprintf(b, sizeof(b), "%.1f", std::max(0.0, left.count()));
  return b;
}

void Dataplane::housekeeping() {
  std::erase_if(links_deferred_,
                [&](const auto& d) { return rte_rcu_qsbr_check(qsbr_, d.first, false) == 1; });
  const auto now = std::chrono::steady_clock::now();
  const auto due = [&](const Retiring& r) { return r.until <= now; };
  if (std::none_of(retiring_.begin(), retiring_.end(), due)) return;
  for (const Retiring& r : retiring_) {
    if (!due(r)) continue;
    for (uint64_t key : links_of(r.spec, r.tree)) {
      auto it = link_use_.find(key);
      if (it == link_use_.end()) continue;
      auto w = it->second.find(static_cast<uint16_t>(r.owner));
      if (w != it->second.end() && --w->second == 0) it->second.erase(w);
      if (it->second.empty()) link_use_.erase(it);
    }
    for (uint64_t key : conns_of(r.spec, r.tree))
      if (auto it = conn_use_.find(key); it != conn_use_.end() && --it->second.rings == 0)
        conn_use_.erase(it);
    if (r.tree) {
      if (auto it = tree_use_.find(r.spec.ring_id);
          it != tree_use_.end() && --it->second.rings == 0)
        tree_use_.erase(it);
      if (auto it = box_ip_use_.find(r.tree->self.ip); it != box_ip_use_.end() && --it->second == 0)
        box_ip_use_.erase(it);
    }
    spdlog::info("ring {} retired: its links are released", r.spec.ring_id);
  }
  std::erase_if(retiring_, due);
  publish_link_use();
}

nlohmann::json Dataplane::retiring_json() const {
  auto arr = nlohmann::json::array();
  for (const Retiring& r : retiring_)
    arr.push_back({{"id", r.spec.ring_id},
                   {"worker", r.owner},
                   {"seconds_left", std::stod(seconds_left(r))}});
  return arr;
}

}  // namespace netreduce::dataplane
