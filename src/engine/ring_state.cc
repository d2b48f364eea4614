// Ring installation, removal, tombstones and reporting (ring_state.h).
#include "engine/ring_state.h"

#include <algorithm>
#include <string>

namespace netreduce::engine::detail {

RingTable::RingTable(const EngineConfig& cfg)
    : cfg_(cfg),
      rings_(cfg.max_rings),
      by_id_(cfg.max_rings),
      links_(std::max(cfg.link_capacity, 2 * kMaxRanks)) {}

void RingDeleter::operator()(Ring* r) const noexcept { delete r; }

namespace {
// Whether this box holds rank k's packets, hence owns the link k -> k + 1.
bool owns_link(const Ring& r, unsigned k) noexcept { return (r.all_ranks >> k) & 1; }
}  // namespace

Status RingTable::prepare(const EngineConfig& cfg, const RingSpec& spec, const TreeSpec* tree,
                          PreparedRing& out) {
  if (Status s = validate(spec); !s) return s;  // fields, and the quota in deterministic terms
  if (tree) {
    if (Status s = validate_tree(spec, *tree); !s) return s;
    if (cfg.mode != ReduceMode::deterministic)
      return {StatusCode::unimplemented, "tree", "a tree node needs deterministic mode"};
    if (!cfg.allocator.alloc)
      return {StatusCode::internal, "allocator", "a tree node needs a packet allocator"};
  }
  // The quota against this engine's mode too (accumulate needs more than
  // deterministic at P = 2: three payloads per cell against one held packet).
  const uint64_t need = ring_memory_bytes(spec, cfg.mode);
  if (spec.memory_quota && need > spec.memory_quota)
    return {StatusCode::resource_exhausted, "memory_quota",
            "ring needs " + std::to_string(need) + " bytes, quota is " +
                std::to_string(spec.memory_quota)};
  if (cfg.mode == ReduceMode::accumulate && !cfg.allocator.alloc)
    return {StatusCode::internal, "allocator", "accumulate mode needs a packet allocator"};
  PreparedRing ring(new Ring);
  Ring& r = *ring;
  r.spec = spec;
  r.ranks = spec.ranks();
  r.all_ranks = r.ranks == 64 ? ~uint64_t{0} : (uint64_t{1} << r.ranks) - 1;
  r.slots = slots_for_window(spec.window);
  r.msg_len = spec.msg_len;
  r.memory = need;
  const size_t cells = size_t{r.slots} * r.msg_len;
  r.cells.assign(cells, Cell{});
  r.msgs.assign(r.slots, MsgSlot{});
  r.hist.assign(size_t{r.ranks} * r.slots, HistEntry{});
  r.conns.assign(r.ranks, RankConn{});
  r.result.assign(cells * spec.payload_bytes, 0);
  if (cfg.mode == ReduceMode::deterministic)
    r.held.assign(cells * r.ranks, Held{});
  else {
    r.hdrs.resize(cells * r.ranks);
    r.acc.assign(cells * 2 * spec.payload_bytes, 0);
  }
  if (tree) {
    auto node = std::make_unique<TreeNode>();
    node->spec = *tree;
    node->nboxes = static_cast<unsigned>(tree->boxes.size());
    node->udp_src_port = static_cast<uint16_t>(0xC000 | (spec.ring_id & 0x3FFF));
    node->payload_bytes = spec.payload_bytes;
    node->box_data.assign(cells * node->nboxes * spec.payload_bytes, 0);
    node->mac = std::make_unique<wire::B2bMac>(tree->key);
    if (!node->mac->ok())
      return {StatusCode::internal, "tree.key",
              "cannot set up the box-to-box MAC: " + node->mac->error()};
    r.all_ranks = 0;
    for (const TreeChild& c : tree->children)
      if (c.kind == TreeChild::Kind::rank) r.all_ranks |= uint64_t{1} << c.index;
    r.all_boxes = static_cast<uint16_t>((1u << node->nboxes) - 1);
    r.memory += node->box_data.size();
    r.tree = std::move(node);
  }
  out = std::move(ring);
  return {};
}

Status RingTable::install(PreparedRing& ring) {
  if (!ring) return {StatusCode::internal, "ring", "no prepared ring"};
  const RingSpec& spec = ring->spec;
  if (const int at = find(spec.ring_id); at >= 0) {
    const Ring& have = *rings_[at];
    const bool same_tree =
        have.tree ? ring->tree && have.tree->spec == ring->tree->spec : !ring->tree;
    if (have.spec == spec && same_tree) return {};  // the caller frees the copy it prepared
    return {StatusCode::conflict, "id",
            "ring " + std::to_string(spec.ring_id) + " is installed with a different spec"};
  }
  const uint64_t need = ring->memory;
  if (memory_ + need > cfg_.memory_budget)
    return {StatusCode::resource_exhausted, "memory",
            "ring needs " + std::to_string(need) + " bytes, " +
                std::to_string(cfg_.memory_budget - memory_) + " of " +
                std::to_string(cfg_.memory_budget) + " free"};
  auto free_slot = std::find(rings_.begin(), rings_.end(), nullptr);
  if (free_slot == rings_.end())
    return {StatusCode::resource_exhausted, "id",
            "all " + std::to_string(cfg_.max_rings) + " ring slots are in use"};
  const unsigned p = spec.ranks();
  size_t new_links = 0;
  for (unsigned k = 0; k < p; ++k)
    new_links += owns_link(*ring, k) && !link(spec.members[k], spec.members[(k + 1) % p]);
  if (links_.size() + new_links > links_.capacity())
    return {StatusCode::resource_exhausted, "members",
            "the link table is full (" + std::to_string(links_.capacity()) +
                " links of installed and retired rings)"};
  if (ring->tree) add_box_ip(ring->tree->spec.self.ip);  // the only allocation: first
  for (unsigned k = 0; k < p; ++k)
    if (owns_link(*ring, k))
      ++links_.insert(link_key(spec.members[k], spec.members[(k + 1) % p]))->live;
  by_id_.insert(spec.ring_id)->index = static_cast<uint16_t>(free_slot - rings_.begin());
  memory_ += need;
  *free_slot = std::move(ring);
  return {};
}

Status RingTable::remove(uint32_t ring_id, uint64_t now, Clt& clt, std::vector<Pkt>& released,
                         ReasonCounters& counters, PreparedRing* detached) {
  const int at = find(ring_id);
  if (at < 0) return {StatusCode::not_found, "id", "no ring " + std::to_string(ring_id)};
  Ring& r = *rings_[at];
  // The tombstone first (the only allocation): a removal never half happens.
  auto tomb_it =
      std::find_if(tombs_.begin(), tombs_.end(), [](const Tombstone& t) { return !t.used; });
  if (tomb_it == tombs_.end()) tomb_it = tombs_.emplace(tombs_.end());
  const auto tomb = static_cast<uint32_t>(tomb_it - tombs_.begin());
  Tombstone& t = *tomb_it;
  t.used = true;
  t.ring_id = ring_id;
  t.conns.clear();
  t.links.clear();
  t.conns.reserve(r.ranks);
  t.links.reserve(r.ranks);
  const uint64_t grace = cfg_.retire_grace;
  t.expires = grace == kRetireNever || now >= kRetireNever - grace ? kRetireNever : now + grace;
  ++retired_;
  next_expiry_ = std::min(next_expiry_, t.expires);

  // Bound connections become the tombstone's: their CLT entries stay, so no
  // later packet or go-back-N resend of the running message is forwarded raw.
  for (unsigned rank = 0; rank < r.ranks; ++rank) {
    RankConn& rc = r.conns[rank];
    if (!rc.bound) continue;
    if (Clt::Slot* slot = clt.find(rc.key); slot && slot->ina()) {
      slot->state = ConnState::retired;
      slot->owner = tomb;
      t.conns.push_back(rc.key);
    }
    rc = RankConn{};
  }
  for (unsigned k = 0; k < r.ranks; ++k) {
    if (!owns_link(r, k)) continue;
    const uint64_t key = link_key(r.spec.members[k], r.spec.members[(k + 1) % r.ranks]);
    LinkUse& l = *links_.find(key);  // installed with the ring
    --l.live;
    ++l.retired;
    t.links.push_back(key);
  }
  release_all(r, released, counters);
  if (r.tree) drop_box_ip(r.tree->spec.self.ip);
  memory_ -= r.memory;
  // The ring slot is free now: no CLT entry points into it.
  if (detached)
    *detached = std::move(rings_[at]);
  else
    rings_[at].reset();
  by_id_.erase(ring_id);
  return {};
}

void RingTable::add_box_ip(uint32_t ip) {
  ++trees_;
  for (BoxIp& b : box_ips_)
    if (b.ip == ip) {
      ++b.trees;
      return;
    }
  box_ips_.push_back({ip, 1});
}

void RingTable::drop_box_ip(uint32_t ip) noexcept {
  --trees_;
  for (size_t i = 0; i < box_ips_.size(); ++i)
    if (box_ips_[i].ip == ip && --box_ips_[i].trees == 0) {
      box_ips_[i] = box_ips_.back();
      box_ips_.pop_back();
      return;
    }
}

unsigned RingTable::expire(uint64_t now, Clt& clt) noexcept {
  if (now < next_expiry_) return 0;  // the common case: one compare
  unsigned purged = 0;
  next_expiry_ = kRetireNever;
  for (uint32_t i = 0; i < tombs_.size(); ++i) {
    Tombstone& t = tombs_[i];
    if (!t.used) continue;
    if (t.expires == kRetireNever || t.expires > now) {
      next_expiry_ = std::min(next_expiry_, t.expires);
      continue;
    }
    purge(i, clt);
    ++purged;
  }
  return purged;
}

void RingTable::purge(uint32_t tomb, Clt& clt) noexcept {
  Tombstone& t = tombs_[tomb];
  for (const ConnKey& k : t.conns) {
    const Clt::Slot* s = clt.find(k);
    // Only if still this tombstone's: a live ring may have re-bound the key,
    // or a later tombstone may own it now.
    if (s && s->retired() && s->owner == tomb) clt.erase(k);
  }
  for (const uint64_t key : t.links) {
    LinkTable::Slot* l = links_.find(key);
    if (!l) continue;
    if (l->retired) --l->retired;
    if (l->live == 0 && l->retired == 0) links_.erase(key);
  }
  t.conns.clear();
  t.links.clear();
  t.used = false;
  t.expires = kRetireNever;
  --retired_;
}

void RingTable::unbind(Ring& ring, unsigned rank, Clt& clt) noexcept {
  RankConn& rc = ring.conns[rank];
  if (rc.bound) clt.erase(rc.key);
  rc = RankConn{};
  std::fill_n(ring.hist_row(rank), ring.slots, HistEntry{});
}

void RingTable::release_all(Ring& ring, std::vector<Pkt>& released,
                            ReasonCounters& counters) noexcept {
  if (ring.held_packets == 0) return;  // nothing to scan for (an idle ring's removal is O(P))
  for (Held& h : ring.held) {
    if (!h.pkt.data) continue;
    released.push_back(h.pkt);
    ++counters[static_cast<size_t>(Reason::ring_removed)];
    h = Held{};
  }
  ring.held_packets = 0;
  ring.held_bytes = 0;
}

namespace {

void figures_of(const Ring& r, uint64_t now, uint64_t stall, RingFigures& f) noexcept {
  f.ring_id = r.spec.ring_id;
  f.counters = r.counters;
  f.slots = r.slots;
  f.memory_bytes = r.memory;
  f.held_packets = r.held_packets;
  f.held_bytes = r.held_bytes;
  f.open_cells = r.open_cells;
  f.stalled_cells = 0;
  // Stalled cells: only the open ones are looked at, and the scan stops at
  // the last of them (none open, the common case between messages: no scan).
  uint32_t seen = 0;
  for (size_t i = 0; i < r.cells.size() && seen < r.open_cells; ++i) {
    const Cell& c = r.cells[i];
    if (c.state != CellState::collecting && c.state != CellState::awaiting) continue;
    ++seen;
    if (stall && now > c.first_at && now - c.first_at > stall) ++f.stalled_cells;
  }
}

}  // namespace

std::optional<RingInfo> RingTable::info(uint32_t ring_id, uint64_t now, uint64_t stall) const {
  const int at = find(ring_id);
  if (at < 0) return std::nullopt;
  const Ring& r = *rings_[at];
  RingInfo info;
  figures_of(r, now, stall, info);
  info.spec = r.spec;
  if (r.tree) info.tree = r.tree->spec;
  return info;
}

unsigned RingTable::figures(RingFigures* out, unsigned cap, uint64_t now,
                            uint64_t stall) const noexcept {
  unsigned n = 0;
  for (const PreparedRing& r : rings_)
    if (r && n < cap) figures_of(*r, now, stall, out[n++]);
  return n;
}

std::vector<RetiredRing> RingTable::retired_rings(const Clt& clt) const {
  std::vector<RetiredRing> out;
  for (uint32_t i = 0; i < tombs_.size(); ++i) {
    const Tombstone& t = tombs_[i];
    if (!t.used) continue;
    RetiredRing rr{t.ring_id, t.expires, 0};
    for (const ConnKey& k : t.conns) {
      const Clt::Slot* s = clt.find(k);
      if (s && s->retired() && s->owner == i) ++rr.connections;
    }
    out.push_back(rr);
  }
  std::sort(out.begin(), out.end(),
            [](const RetiredRing& a, const RetiredRing& b) { return a.expires < b.expires; });
  return out;
}

std::vector<uint32_t> RingTable::ids() const {
  std::vector<uint32_t> ids;
  for (const PreparedRing& r : rings_)
    if (r) ids.push_back(r->spec.ring_id);
  std::sort(ids.begin(), ids.end());
  return ids;
}

}  // namespace netreduce::engine::detail
