// Placement (placement.h): the rules, in the order place() applies them.
#include "dataplane/placement.h"

#include <algorithm>
#include <tuple>

namespace netreduce::dataplane {

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

bool contains(const std::vector<uint64_t>& keys, uint64_t key) {
  return std::find(keys.begin(), keys.end(), key) != keys.end();
}

bool shares_link(const std::vector<uint64_t>& mine, const Placement::Ring& other) {
  for (uint64_t key : links_of(other.spec, other.tree))
    if (contains(mine, key)) return true;
  return false;
}

}  // namespace

Status Placement::place(const engine::RingSpec& spec, const std::optional<engine::TreeSpec>& tree,
                        unsigned& owner) const {
  // Which workers own this ring's links; a tree joins the worker of a
  // retiring tree with its id (one owner per tree id).
  std::map<unsigned, std::set<uint32_t>> owners;
  const std::vector<uint64_t> mine = links_of(spec, tree);
  for (uint64_t key : mine)
    if (auto it = link_use_.find(key); it != link_use_.end())
      for (const auto& [w, n] : it->second) owners[w];
  if (tree)
    if (auto it = tree_use_.find(spec.ring_id); it != tree_use_.end())
      owners[it->second.owner].insert(spec.ring_id);
  // Spreading: this ring and every ring sharing a link with it give their
  // QP numbers.
  bool spreads = !spec.qpns.empty() && !tree;
  std::vector<unsigned> sharing(workers_, 0);  // per worker: rings sharing a link
  each([&](const Ring& r) {
    if (!shares_link(mine, r)) return;
    spreads = spreads && !r.spec.qpns.empty() && !r.tree;
    ++sharing[r.owner];
  });
  unsigned chosen = 0;
  if (spreads) {
    if (Status s = spread(spec, sharing, chosen); !s) return s;
  } else if (owners.size() > 1) {
    return links_conflict(spec, tree, std::move(owners));
  } else if (owners.size() == 1) {
    chosen = owners.begin()->first;
  } else {
    const std::vector<unsigned> l = load();
    chosen = static_cast<unsigned>(std::min_element(l.begin(), l.end()) - l.begin());
  }
  // A connection is dispatched to one worker: one still counted for a ring
  // on another worker (a retiring one whose QP number the host reused) would
  // send this ring's packets there.
  for (uint64_t c : conns_of(spec, tree))
    if (auto it = conn_use_.find(c); it != conn_use_.end() && it->second.owner != chosen)
      return {StatusCode::conflict, "qpns",
              "ring " + std::to_string(spec.ring_id) +
                  " names a receiving QP (address and QP number) still in use by a ring on "
                  "worker " +
                  std::to_string(it->second.owner) +
                  " (removed, retiring): wait out rings.retire_grace_ms or use new QPs"};
  owner = chosen;
  return {};
}

Status Placement::spread(const engine::RingSpec& spec, const std::vector<unsigned>& sharing,
                         unsigned& owner) const {
  // A connection is one ring's: an installed ring using it refuses this one
  // (a retiring one is the tombstone of this id, on its worker).
  const std::vector<uint64_t> conns = conns_of(spec, std::nullopt);
  for (const auto& [id, r] : installed_)
    for (uint64_t c : conns_of(r.spec, r.tree))
      if (contains(conns, c))
        return {StatusCode::conflict, "qpns",
                "ring " + std::to_string(spec.ring_id) + " names a receiving QP (address and " +
                    "QP number) that ring " + std::to_string(id) +
                    " uses: each connection belongs to one ring"};
  // The tombstone of this id, or of a connection this ring reuses, keeps
  // its packets on its worker: join it.
  for (const Retiring& r : retiring_) {
    bool reuses = r.spec.ring_id == spec.ring_id;
    for (uint64_t c : conns_of(r.spec, r.tree)) reuses = reuses || contains(conns, c);
    if (reuses) {
      owner = r.owner;
      return {};
    }
  }
  const std::vector<unsigned> l = load();
  owner = 0;
  for (unsigned w = 1; w < workers_; ++w)
    if (std::tie(l[w], sharing[w]) < std::tie(l[owner], sharing[owner])) owner = w;
  return {};
}

Status Placement::links_conflict(const engine::RingSpec& spec,
                                 const std::optional<engine::TreeSpec>& tree,
                                 std::map<unsigned, std::set<uint32_t>> owners) const {
  const std::vector<uint64_t> mine = links_of(spec, tree);
  each([&](const Ring& r) {
    if (shares_link(mine, r)) owners[r.owner].insert(r.spec.ring_id);
  });
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

std::vector<unsigned> Placement::load() const {
  std::vector<unsigned> l(workers_, 0);
  each([&](const Ring& r) { ++l[r.owner]; });
  return l;
}

void Placement::add(Ring ring) {
  const auto owner = static_cast<uint16_t>(ring.owner);
  for (uint64_t key : links_of(ring.spec, ring.tree)) ++link_use_[key][owner];
  for (uint64_t key : conns_of(ring.spec, ring.tree))
    ++conn_use_.try_emplace(key, Use{owner, 0}).first->second.rings;
  if (ring.tree) {
    ++tree_use_.try_emplace(ring.spec.ring_id, Use{owner, 0}).first->second.rings;
    ++box_ip_use_[ring.tree->self.ip];
  }
  const uint32_t id = ring.spec.ring_id;
  installed_[id] = std::move(ring);
}

void Placement::retire(uint32_t id, Clock::time_point until) {
  auto it = installed_.find(id);
  if (it == installed_.end()) return;
  retiring_.push_back({std::move(it->second), until});
  installed_.erase(it);
}

std::vector<Placement::Retiring> Placement::expire(Clock::time_point now) {
  std::vector<Retiring> gone;
  for (const Retiring& r : retiring_)
    if (r.until <= now) {
      release(r);
      gone.push_back(r);
    }
  std::erase_if(retiring_, [&](const Retiring& r) { return r.until <= now; });
  return gone;
}

void Placement::release(const Ring& r) {
  const auto owner = static_cast<uint16_t>(r.owner);
  for (uint64_t key : links_of(r.spec, r.tree)) {
    auto it = link_use_.find(key);
    if (it == link_use_.end()) continue;
    auto w = it->second.find(owner);
    if (w != it->second.end() && --w->second == 0) it->second.erase(w);
    if (it->second.empty()) link_use_.erase(it);
  }
  for (uint64_t key : conns_of(r.spec, r.tree))
    if (auto it = conn_use_.find(key); it != conn_use_.end() && --it->second.rings == 0)
      conn_use_.erase(it);
  if (r.tree) {
    if (auto it = tree_use_.find(r.spec.ring_id); it != tree_use_.end() && --it->second.rings == 0)
      tree_use_.erase(it);
    if (auto it = box_ip_use_.find(r.tree->self.ip); it != box_ip_use_.end() && --it->second == 0)
      box_ip_use_.erase(it);
  }
}

const Placement::Ring* Placement::installed(uint32_t id) const {
  auto it = installed_.find(id);
  return it == installed_.end() ? nullptr : &it->second;
}

std::string Placement::in_use() const {
  std::set<uint32_t> installed, retiring;
  for (const auto& [id, r] : installed_) installed.insert(id);
  for (const Retiring& r : retiring_) retiring.insert(r.spec.ring_id);
  std::string s;
  if (!installed.empty()) s = "installed: " + join_ids(installed);
  if (!retiring.empty())
    s += (s.empty() ? "" : "; ") + std::string("retiring: ") + join_ids(retiring);
  return s;
}

std::unique_ptr<LinkTable> Placement::link_table() const {
  auto t = std::make_unique<LinkTable>();
  t->owner.reserve(link_use_.size());
  for (const auto& [key, by] : link_use_)  // split: flagged, with its lowest worker as home
    t->owner.emplace(key,
                     by.size() == 1 ? by.begin()->first : LinkTable::kSplitBit | by.begin()->first);
  t->conn_owner.reserve(conn_use_.size());
  for (const auto& [key, use] : conn_use_) t->conn_owner.emplace(key, use.owner);
  t->tree_owner.reserve(tree_use_.size());
  for (const auto& [id, use] : tree_use_) t->tree_owner.emplace(id, use.owner);
  t->box_ips.reserve(box_ip_use_.size());
  for (const auto& [ip, trees] : box_ip_use_) t->box_ips.push_back(ip);
  return t;
}

}  // namespace netreduce::dataplane
