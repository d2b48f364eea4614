// Tree nodes (src/engine/tree.h): two or more leaf boxes and a root driven in
// one process, one Engine each, frames passed between them by the test (a
// "fabric" that can lose and duplicate any of them). Every worker's released
// packet is checked against an independent reference (tests/engine/
// reference.h) in tree order: rank order inside a rack, child order above;
// every cell must be aggregated exactly once at every box and every buffer
// come back.
#include <algorithm>
#include <catch2/catch.hpp>
#include <compare>
#include <cstddef>
#include <deque>
#include <functional>
#include <map>
#include <random>
#include <utility>

#include "engine/box_harness.h"
#include "engine/reference.h"
#include "wire/b2b.h"
#include "wire/b2b_mac.h"
#include "wire/headers.h"
#include "wire/psn.h"

using namespace netreduce;
using namespace netreduce::testing;
using engine::Reason;
using engine::TreeSpec;
using engine::Verdict;

namespace {

constexpr uint32_t kRootIp = 0x0A010001;   // 10.1.0.1
constexpr uint32_t kInnerIp = 0x0A0100F0;  // 10.1.0.240
uint32_t leaf_ip(unsigned i) { return 0x0A010002 + i; }
wire::MacAddr mac_of(uint32_t ip) {
  return {0x02, 0xBB, uint8_t(ip >> 24), uint8_t(ip >> 16), uint8_t(ip >> 8), uint8_t(ip)};
}
engine::TreeBox box(uint32_t ip) { return {ip, mac_of(ip)}; }
// A tree node of the test installation (kTreeEpoch, tree_key()).
TreeSpec keyed_node() {
  TreeSpec t;
  t.epoch = kTreeEpoch;
  t.key = tree_key();
  return t;
}

// Worker packets: where they come from, and what they must carry at the end.
struct PacketId {
  unsigned rank;
  uint32_t m;
  uint32_t k;
  auto operator<=>(const PacketId&) const = default;
};

// A ring over racks (ranks numbered in rack order), one leaf box per rack
// under one root; with root_ranks, rack 0 hangs off the root itself (its
// ranks are the root's local children, before the child boxes); with
// inner and at least three leaves, every leaf but the first hangs off an
// inner box, the root's last child (three levels).
struct Fabric {
  static constexpr unsigned kWorker = ~0u;  // "to the workers" in lose()

  std::vector<std::vector<unsigned>> racks;  // rack -> ranks
  bool root_ranks = false;
  bool use_inner = false;
  std::vector<std::unique_ptr<Harness>> boxes;  // 0: root; 1 + i: leaf of rack i
  std::vector<uint32_t> ips;
  RingTraffic t;
  std::mt19937 rng{1};
  std::vector<std::vector<std::vector<uint8_t>>> data;    // [m][rank]
  std::vector<std::vector<uint32_t>> psn0;                // [m][rank]
  std::map<std::pair<uint32_t, uint32_t>, PacketId> ids;  // (src ip, psn) -> packet
  std::map<PacketId, std::vector<uint8_t>> sent_by_worker;
  std::map<PacketId, unsigned> delivered;  // copies that reached the receiver, checked
  // Return true to lose a frame going from box `from` to box `to` (kWorker:
  // a released worker packet on its way to the receiver).
  std::function<bool(unsigned from, unsigned to, const std::vector<uint8_t>&)> lose;
  std::function<bool(const std::vector<uint8_t>&)> duplicate;
  std::map<uint32_t, std::vector<uint8_t>> want_;  // reference(m), computed once
  engine::RingSpec spec;
  TreeSpec root_tree;

  Fabric(std::vector<unsigned> rack_sizes, wire::Dtype dt, wire::ReduceOp op,
         bool ranks_at_root = false, uint16_t window = 2, bool inner = false)
      : root_ranks(ranks_at_root) {
    unsigned p = 0;
    for (unsigned n : rack_sizes) {
      racks.emplace_back();
      for (unsigned i = 0; i < n; ++i) racks.back().push_back(p++);
    }
    t.ranks = p;
    t.dtype = dt;
    t.op = op;
    spec = ring_spec(t.ring_id, p, 4, window);
    boxes.push_back(std::make_unique<Harness>());
    ips.push_back(kRootIp);
    TreeSpec root = keyed_node();
    root.self = box(kRootIp);
    unsigned first_leaf = 0;
    if (root_ranks) {
      for (unsigned r : racks[0]) root.children.push_back(TreeSpec::rank(uint16_t(r)));
      first_leaf = 1;
    }
    use_inner = inner && racks.size() - first_leaf >= 3;
    TreeSpec mid = keyed_node();
    mid.self = box(kInnerIp);
    mid.has_parent = true;
    mid.parent = box(kRootIp);
    for (unsigned i = first_leaf; i < racks.size(); ++i) {
      const bool under_inner = use_inner && i > first_leaf;
      TreeSpec& up = under_inner ? mid : root;
      const auto b = static_cast<uint16_t>(up.boxes.size());
      up.boxes.push_back(box(leaf_ip(i)));
      up.children.push_back(TreeSpec::box(b));
      TreeSpec leaf = keyed_node();
      leaf.self = box(leaf_ip(i));
      for (unsigned r : racks[i]) leaf.children.push_back(TreeSpec::rank(uint16_t(r)));
      leaf.has_parent = true;
      leaf.parent = up.self;
      leaf.index_at_parent = b;
      boxes.push_back(std::make_unique<Harness>());
      ips.push_back(leaf_ip(i));
      REQUIRE(boxes.back()->e->install_ring(spec, leaf).ok());
    }
    if (use_inner) {
      const auto b = static_cast<uint16_t>(root.boxes.size());
      root.boxes.push_back(box(kInnerIp));
      root.children.push_back(TreeSpec::box(b));
      mid.index_at_parent = b;
      boxes.push_back(std::make_unique<Harness>());
      ips.push_back(kInnerIp);
      REQUIRE(boxes.back()->e->install_ring(spec, mid).ok());
    }
    REQUIRE(boxes[0]->e->install_ring(spec, root).ok());
    root_tree = root;
  }

  // The root restarts: its ring removed (cells gone) and installed again.
  void restart_root() {
    std::vector<engine::Pkt> released;
    REQUIRE(boxes[0]->e->remove_ring(t.ring_id, ++boxes[0]->now, released).ok());
    REQUIRE(released.empty());  // a root without local ranks holds no worker packet
    REQUIRE(boxes[0]->e->install_ring(spec, root_tree).ok());
  }

  unsigned box_of_rank(unsigned r) const {
    for (unsigned i = 0; i < racks.size(); ++i)
      for (unsigned x : racks[i])
        if (x == r) return root_ranks && i == 0 ? 0 : (root_ranks ? i : i + 1);
    FAIL("no rack");
    return 0;
  }
  unsigned box_of_ip(uint32_t ip) const {
    for (unsigned i = 0; i < ips.size(); ++i)
      if (ips[i] == ip) return i;
    FAIL("no box has " << ip);
    return 0;
  }

  // Message m: random bytes of every dtype (NaNs included: the reference
  // and the kernels agree on them), 3 packets of 256 bytes.
  void add_message(size_t bytes = 3 * 256 - 24) {
    std::vector<std::vector<uint8_t>> d;
    std::vector<uint32_t> p;
    for (unsigned r = 0; r < t.ranks; ++r) {
      d.emplace_back(bytes);
      for (auto& b : d.back()) b = static_cast<uint8_t>(rng());
      p.push_back(psn0.empty() ? wire::psn_add(0xFFFFF0, r * 1000)
                               : wire::psn_add(psn0.back()[r],
                                               wire::message_packets(data.back()[r].size(), 256)));
    }
    data.push_back(std::move(d));
    psn0.push_back(std::move(p));
  }
  uint32_t packets(uint32_t m) const { return wire::message_packets(data[m][0].size(), t.pmtu); }
  std::vector<uint8_t> pkt(unsigned r, uint32_t m, uint32_t k) {
    auto f = t.packet(r, m, data[m][r], psn0[m][r], k);
    const PacketId id{r, m, k};
    ids[{rank_ip(r), wire::psn_add(psn0[m][r], k)}] = id;
    sent_by_worker[id] = f;
    return f;
  }

  // Reference result of message m: each rack in rank order, then the
  // inner box's children in order, then the root's.
  std::vector<uint8_t> reference(uint32_t m) const {
    const size_t bytes = data[m][0].size();
    std::vector<std::vector<uint8_t>> partials;  // one per leaf rack, in order
    partials.reserve(racks.size() + 1);
    const unsigned first_leaf = root_ranks ? 1 : 0;
    for (unsigned i = first_leaf; i < racks.size(); ++i) {
      std::vector<const uint8_t*> in;
      for (unsigned r : racks[i]) in.push_back(data[m][r].data());
      partials.emplace_back(bytes);
      ref::reduce(t.dtype, t.op, in, bytes, partials.back().data());
    }
    std::vector<const uint8_t*> top;
    if (root_ranks)
      for (unsigned r : racks[0]) top.push_back(data[m][r].data());
    if (use_inner) {
      std::vector<const uint8_t*> mid;
      for (size_t i = 1; i < partials.size(); ++i) mid.push_back(partials[i].data());
      std::vector<uint8_t> inner(bytes);
      ref::reduce(t.dtype, t.op, mid, bytes, inner.data());
      partials.resize(1);
      partials.push_back(std::move(inner));
    }
    for (const auto& p : partials) top.push_back(p.data());
    std::vector<uint8_t> out(bytes);
    ref::reduce(t.dtype, t.op, top, bytes, out.data());
    return out;
  }

  // A worker sends (or resends) a packet: into its leaf, then everything
  // that follows, until the fabric is quiet.
  void send(unsigned r, uint32_t m, uint32_t k) { inject(box_of_rank(r), pkt(r, m, k)); }

  void inject(unsigned at, std::vector<uint8_t> frame) {
    std::deque<std::pair<unsigned, std::vector<uint8_t>>> q;
    q.emplace_back(at, std::move(frame));
    while (!q.empty()) {
      auto [n, f] = std::move(q.front());
      q.pop_front();
      boxes[n]->feed(f);
      for (auto& out : boxes[n]->take_sent()) {
        wire::B2bFrame b;
        const bool b2b = wire::parse_b2b(out.data(), out.size(), b) != wire::B2bStatus::not_b2b;
        const unsigned to = b2b ? box_of_ip(b.dst_ip) : kWorker;
        const int copies = 1 + (duplicate && duplicate(out) ? 1 : 0);
        for (int c = 0; c < copies; ++c) {
          if (lose && lose(n, to, out)) continue;
          if (b2b)
            q.emplace_back(to, out);
          else
            receive(out);
        }
      }
    }
  }

  // A worker packet reaching its receiver: the reference data, a valid
  // ICRC, every other byte as the sender sent it but a last packet's ImmDt:
  // the message's seal.
  void receive(const std::vector<uint8_t>& f) {
    wire::ParsedFrame p;
    REQUIRE(wire::parse_frame(f.data(), f.size(), p) == wire::ParseStatus::ok);
    const auto* ip = reinterpret_cast<const wire::Ipv4Hdr*>(f.data() + p.l3);
    const auto* bth = reinterpret_cast<const wire::Bth*>(f.data() + p.bth);
    const auto it = ids.find({ip->src.host(), bth->psn.host()});
    REQUIRE(it != ids.end());
    const PacketId id = it->second;
    INFO("rank " << id.rank << " message " << id.m << " packet " << id.k);
    // As an RC receiver does, a last packet after a gap is discarded (its
    // sender goes back): only one that completes the message is checked.
    if (p.immdt)
      for (uint32_t k = 0; k < id.k; ++k)
        if (!delivered.count({id.rank, id.m, k})) return;
    auto cached = want_.find(id.m);
    if (cached == want_.end()) cached = want_.emplace(id.m, reference(id.m)).first;
    const auto& want = cached->second;
    const size_t off = wire::packet_data_offset(id.k, t.pmtu);
    const auto got = data_of(f);
    REQUIRE(off + got.size() <= want.size());
    CHECK(std::equal(got.begin(), got.end(), want.begin() + static_cast<long>(off)));
    CHECK(icrc_ok(f));
    const auto& orig = sent_by_worker.at(id);
    REQUIRE(orig.size() == f.size());
    const size_t data_start = f.size() - p.pad - wire::kIcrcBytes - got.size();
    std::vector<uint8_t> head(f.begin(), f.begin() + static_cast<long>(data_start));
    if (p.immdt) {
      CHECK(imm_of(f) == expected_seal(id.m, want));
      std::memcpy(head.data() + p.immdt, orig.data() + p.immdt, sizeof(wire::ImmDt));
    }
    CHECK(std::equal(head.begin(), head.end(), orig.begin()));
    ++delivered[id];
  }

  bool all_delivered() const {
    for (uint32_t m = 0; m < data.size(); ++m)
      for (unsigned r = 0; r < t.ranks; ++r)
        for (uint32_t k = 0; k < packets(m); ++k)
          if (!delivered.count({r, m, k})) return false;
    return true;
  }

  engine::RingInfo info(unsigned b) const {
    auto i = boxes[b]->e->ring_info(t.ring_id);
    REQUIRE(i);
    return *i;
  }
  uint64_t reason(unsigned b, Reason r) const {
    return boxes[b]->e->counters()[static_cast<size_t>(r)];
  }

  // Every cell aggregated exactly once at every box; nothing held, no
  // buffer lost.
  void check_exactly_once() const {
    uint64_t cells = 0;
    for (uint32_t m = 0; m < data.size(); ++m) cells += packets(m);
    for (unsigned b = 0; b < boxes.size(); ++b) {
      INFO("box " << b);
      const auto i = info(b);
      CHECK(i.counters.cells_completed == cells);
      CHECK(i.counters.messages_completed == data.size());
      CHECK(i.held_packets == 0);
      CHECK(i.open_cells == 0);
      CHECK(boxes[b]->live.empty());
    }
  }
};

// A box-to-box frame of tree `tree` (message 0 of 3 packets, fp32 sum)
// with `data_len` zero data bytes, sealed for the test installation (or
// for another epoch or key).
std::vector<uint8_t> b2b_frame(uint32_t src, uint32_t dst, wire::B2bKind kind, uint16_t child,
                               uint32_t tree, size_t data_len, uint32_t epoch = kTreeEpoch,
                               const wire::B2bKey& key = tree_key()) {
  std::vector<uint8_t> d(data_len, 0);
  wire::B2bMac mac(key);
  wire::B2bFrameSpec s;
  s.mac = &mac;
  s.info.epoch = epoch;
  s.src_ip = src;
  s.dst_ip = dst;
  s.info.kind = kind;
  s.info.tree_id = tree;
  s.info.msg_len = 3;
  s.info.child = child;
  s.info.dtype = static_cast<uint8_t>(wire::Dtype::fp32);
  s.info.op = static_cast<uint8_t>(wire::ReduceOp::sum);
  s.data = d.data();
  s.data_len = d.size();
  std::vector<uint8_t> f(wire::b2b_frame_size(d.size()));
  REQUIRE(wire::build_b2b(s, f.data(), f.size()) == f.size());
  return f;
}

}  // namespace

TEST_CASE("two leaves and a root: every worker gets the tree reference, every dtype x op",
          "[engine][tree]") {
  for (auto dt : {wire::Dtype::fp32, wire::Dtype::fp16, wire::Dtype::bf16, wire::Dtype::int32,
                  wire::Dtype::int64, wire::Dtype::fp64})
    for (auto op : {wire::ReduceOp::sum, wire::ReduceOp::min, wire::ReduceOp::max}) {
      INFO(wire::to_string(dt) << " " << wire::to_string(op));
      Fabric x({2, 2}, dt, op);
      x.add_message();
      x.add_message();
      for (uint32_t m = 0; m < 2; ++m)
        for (uint32_t k = 0; k < x.packets(m); ++k)
          for (unsigned r : {3u, 0u, 2u, 1u}) x.send(r, m, k);
      CHECK(x.all_delivered());
      for (const auto& [id, n] : x.delivered) CHECK(n == 1);
      x.check_exactly_once();
      const uint64_t cells = 6;
      for (unsigned leaf : {1u, 2u}) {
        const auto i = x.info(leaf);
        CHECK(i.counters.tree.partials_sent == cells);
        CHECK(i.counters.tree.results_received == cells);
        CHECK(i.counters.tree.partials_resent == 0);
      }
      const auto root = x.info(0);
      CHECK(root.counters.tree.partials_received == 2 * cells);
      CHECK(root.counters.tree.results_sent == 2 * cells);
      CHECK(root.held_packets == 0);
      CHECK(x.reason(0, Reason::held) == 0);  // the root holds no worker packet
    }
}

TEST_CASE("a lost partial: a worker's resend sends it again; aggregated once", "[engine][tree]") {
  Fabric x({2, 2}, wire::Dtype::fp32, wire::ReduceOp::sum);
  x.add_message();
  bool lost = false;
  x.lose = [&](unsigned from, unsigned to, const std::vector<uint8_t>&) {
    if (from == 1 && to == 0 && !lost) return lost = true;  // leaf A's first partial
    return false;
  };
  for (unsigned r = 0; r < 4; ++r) x.send(r, 0, 0);
  REQUIRE(lost);
  CHECK(x.delivered.empty());  // nobody has a result: A's cell awaits, the root collects
  CHECK(x.info(1).open_cells == 1);
  CHECK(x.info(0).open_cells == 1);
  // Rank 1's RC retransmission (the same bytes) reaches the awaiting cell.
  const auto o = x.boxes[1]->feed(x.pkt(1, 0, 0));
  CHECK(o.verdict == Verdict::drop);
  CHECK(o.reason == Reason::duplicate_resent_partial);
  for (auto& f : x.boxes[1]->take_sent()) x.inject(0, f);  // the partial, to the root
  CHECK(x.info(1).counters.tree.partials_resent == 1);
  for (unsigned r = 0; r < 4; ++r) CHECK(x.delivered[{r, 0, 0}] == 1);
  for (uint32_t k = 1; k < x.packets(0); ++k)
    for (unsigned r = 0; r < 4; ++r) x.send(r, 0, k);
  CHECK(x.all_delivered());
  x.check_exactly_once();
}

TEST_CASE("a lost result: the root answers the resent partial from its complete cell",
          "[engine][tree]") {
  Fabric x({2, 2}, wire::Dtype::int32, wire::ReduceOp::sum);
  x.add_message();
  bool lost = false;
  x.lose = [&](unsigned from, unsigned to, const std::vector<uint8_t>&) {
    if (from == 0 && to == 2 && !lost) return lost = true;  // the result to leaf B
    return false;
  };
  for (unsigned r = 0; r < 4; ++r) x.send(r, 0, 0);
  REQUIRE(lost);
  CHECK(x.delivered[{0, 0, 0}] == 1);
  CHECK(x.delivered[{1, 0, 0}] == 1);
  CHECK(!x.delivered.count({2, 0, 0}));
  CHECK(!x.delivered.count({3, 0, 0}));
  x.send(3, 0, 0);  // rank 3 resends; leaf B resends its partial
  CHECK(x.info(0).counters.tree.results_resent == 1);
  CHECK(x.reason(0, Reason::partial_answered) == 1);
  for (unsigned r = 0; r < 4; ++r) CHECK(x.delivered[{r, 0, 0}] == 1);
  x.send(2, 0, 0);  // a resend now: served from leaf B's complete cell
  CHECK(x.delivered[{2, 0, 0}] == 2);
  CHECK(x.reason(2, Reason::served_from_cell) == 1);
  for (uint32_t k = 1; k < x.packets(0); ++k)
    for (unsigned r = 0; r < 4; ++r) x.send(r, 0, k);
  x.check_exactly_once();
}

// The hold at the source leaf (docs/design.md#hierarchy) with a parent that
// lost its cells: leaf A got the result, leaf B's was lost, then the root restarted.
// B's workers resend, B resends its partial; only A's final can complete the
// fresh root cell, since A's workers are done with it.
TEST_CASE("a restarted root asks the child that has the result (query, final)", "[engine][tree]") {
  Fabric x({2, 2}, wire::Dtype::fp32, wire::ReduceOp::sum);
  x.add_message();
  bool lost = false;
  x.lose = [&](unsigned from, unsigned to, const std::vector<uint8_t>&) {
    if (from == 0 && to == 2 && !lost) return lost = true;  // the result to leaf B
    return false;
  };
  for (unsigned r = 0; r < 4; ++r) x.send(r, 0, 0);
  REQUIRE(lost);
  REQUIRE(x.delivered.size() == 2);  // ranks 0 and 1 (leaf A) have the result
  x.restart_root();
  x.send(3, 0, 0);                                 // B's partial again: a fresh root cell takes it
  CHECK(x.reason(0, Reason::partial_taken) == 3);  // 2 before the restart (box counters)
  CHECK(x.info(0).counters.tree.partials_received == 1);  // the new ring's
  CHECK(x.reason(0, Reason::duplicate_queried) == 0);
  CHECK(x.info(0).open_cells == 1);
  CHECK(!x.delivered.count({2, 0, 0}));
  x.send(3, 0, 0);  // and again: the root queries A, A answers with its final
  CHECK(x.reason(0, Reason::duplicate_queried) == 1);
  CHECK(x.info(0).counters.tree.queries_sent == 1);  // A only: B's partial is in the cell
  CHECK(x.reason(1, Reason::query_answered) == 1);
  CHECK(x.info(1).counters.tree.finals_sent == 1);
  CHECK(x.reason(0, Reason::final_taken) == 1);
  CHECK(x.info(0).counters.tree.finals_received == 1);
  CHECK(x.info(0).open_cells == 0);
  CHECK(x.reason(2, Reason::result_taken) == 1);
  CHECK(x.reason(1, Reason::b2b_result_unexpected) == 1);               // A has it already
  for (unsigned r = 0; r < 4; ++r) CHECK(x.delivered[{r, 0, 0}] == 1);  // the reference
  for (uint32_t k = 1; k < x.packets(0); ++k)
    for (unsigned r = 0; r < 4; ++r) x.send(r, 0, k);
  CHECK(x.all_delivered());
  for (unsigned b : {1u, 2u}) {
    INFO("leaf " << b);
    CHECK(x.info(b).counters.cells_completed == x.packets(0));
    CHECK(x.info(b).held_packets == 0);
    CHECK(x.boxes[b]->live.empty());
  }
  CHECK(x.info(0).counters.cells_completed == x.packets(0));  // since the restart
}

TEST_CASE("a query: an awaiting child resends its partial; a collecting one has nothing yet",
          "[engine][tree]") {
  Fabric x({2, 2}, wire::Dtype::int32, wire::ReduceOp::max);
  x.add_message();
  x.lose = [&](unsigned from, unsigned to, const std::vector<uint8_t>&) {
    return from == 1 && to == 0;  // every partial of leaf A is lost
  };
  x.send(0, 0, 0);  // leaf A collects (rank 1 missing)
  x.send(2, 0, 0);
  x.send(3, 0, 0);  // leaf B awaits; the root has B's partial
  x.send(3, 0, 0);  // B's again: the root queries A, which is still collecting
  CHECK(x.reason(0, Reason::duplicate_queried) == 1);
  CHECK(x.reason(1, Reason::query_unanswerable) == 1);
  x.send(1, 0, 0);  // leaf A awaits now; its partial is lost
  x.lose = nullptr;
  x.send(2, 0, 0);  // B's worker resends: the query makes A send its partial again
  CHECK(x.reason(0, Reason::duplicate_queried) == 2);
  CHECK(x.reason(1, Reason::query_answered) == 1);
  CHECK(x.info(1).counters.tree.partials_resent == 1);
  CHECK(x.info(1).counters.tree.finals_sent == 0);
  for (unsigned r = 0; r < 4; ++r) CHECK(x.delivered[{r, 0, 0}] == 1);
  CHECK(x.reason(0, Reason::partial_taken) == 2);  // each child's partial once
}

TEST_CASE("three levels: a lost partial above an inner box is resent through it",
          "[engine][tree]") {
  Fabric x({1, 2, 1}, wire::Dtype::fp64, wire::ReduceOp::sum, false, 2, true);
  REQUIRE(x.use_inner);
  const unsigned inner = 4;
  x.add_message();
  bool lost = false;
  x.lose = [&](unsigned from, unsigned to, const std::vector<uint8_t>&) {
    if (from == inner && to == 0 && !lost) return lost = true;
    return false;
  };
  for (unsigned r = 0; r < 4; ++r) x.send(r, 0, 0);
  REQUIRE(lost);
  CHECK(x.delivered.empty());
  x.send(2, 0, 0);  // rank 2 (under the inner box) resends
  CHECK(x.info(inner).counters.tree.partials_resent == 1);
  CHECK(x.reason(inner, Reason::duplicate_resent_partial) == 1);
  for (unsigned r = 0; r < 4; ++r) CHECK(x.delivered[{r, 0, 0}] == 1);
  for (uint32_t k = 1; k < x.packets(0); ++k)
    for (unsigned r = 0; r < 4; ++r) x.send(r, 0, k);
  CHECK(x.all_delivered());
  x.check_exactly_once();
  CHECK(x.info(inner).counters.tree.results_received == 3);
  CHECK(x.info(inner).counters.tree.results_sent == 6);
}

TEST_CASE("traffic a box does not own passes untouched", "[engine][tree]") {
  Fabric x({2, 2}, wire::Dtype::fp32, wire::ReduceOp::sum);
  x.add_message();
  std::vector<std::vector<uint8_t>> crossing;  // rank 1 -> rank 2: leaf A to leaf B
  x.lose = [&](unsigned, unsigned to, const std::vector<uint8_t>& f) {
    if (to != Fabric::kWorker) return false;
    const auto* ip = reinterpret_cast<const wire::Ipv4Hdr*>(f.data() + sizeof(wire::EthHdr));
    if (ip->src.host() == rank_ip(1)) crossing.push_back(f);
    return false;
  };
  for (uint32_t k = 0; k < x.packets(0); ++k)
    for (unsigned r = 0; r < 4; ++r) x.send(r, 0, k);
  REQUIRE(crossing.size() == x.packets(0));
  for (const auto& f : crossing)
    for (unsigned b : {0u, 2u}) {  // across the root, into rack B
      CHECK(x.boxes[b]->feed(f).verdict == Verdict::forward);
      const auto out = x.boxes[b]->take_sent();
      REQUIRE(out.size() == 1);
      CHECK(out[0] == f);
    }
  // Raw worker packets of rank 2 (rack B) seen at leaf A (e.g. on a shared
  // segment) are not A's either.
  CHECK(x.boxes[1]->feed(x.pkt(2, 0, 0)).verdict == Verdict::forward);
  x.boxes[1]->take_sent();
  // A box-to-box frame for another box passes.
  const auto partial = wire::B2bKind::partial;
  CHECK(x.boxes[0]->feed(b2b_frame(leaf_ip(0), 0x0A0100FF, partial, 0, x.t.ring_id, 64)).reason ==
        Reason::fwd_b2b_transit);
  // A box with no tree: the port is ordinary traffic.
  Harness plain;
  REQUIRE(plain.e->install_ring(ring_spec(1, 4)).ok());
  CHECK(plain.feed(b2b_frame(leaf_ip(0), kRootIp, partial, 0, x.t.ring_id, 64)).reason ==
        Reason::fwd_not_roce);
}

TEST_CASE("box-to-box frames: unknown box, unknown tree, corrupted, malformed, late",
          "[engine][tree]") {
  Fabric x({1, 1}, wire::Dtype::fp32, wire::ReduceOp::sum);
  x.add_message();
  auto frame = [&](uint32_t src, uint32_t dst, wire::B2bKind kind, uint16_t child, uint32_t tree) {
    return b2b_frame(src, dst, kind, child, tree, 232);  // packet 0's data
  };
  const auto partial = wire::B2bKind::partial;
  const auto result = wire::B2bKind::result;
  auto& root = *x.boxes[0];
  auto& leaf = *x.boxes[1];
  CHECK(root.feed(frame(leaf_ip(0), kRootIp, partial, 1, 1)).reason == Reason::b2b_unknown_box);
  CHECK(root.feed(frame(leaf_ip(0), kRootIp, partial, 2, 1)).reason == Reason::b2b_unknown_box);
  CHECK(root.feed(frame(leaf_ip(0), kRootIp, result, 0, 1)).reason == Reason::b2b_unknown_box);
  CHECK(root.feed(frame(leaf_ip(0), kRootIp, partial, 0, 9)).reason == Reason::b2b_unknown_tree);
  CHECK(leaf.feed(frame(leaf_ip(1), leaf_ip(0), result, 0, 1)).reason == Reason::b2b_unknown_box);
  CHECK(leaf.feed(frame(kRootIp, leaf_ip(0), result, 1, 1)).reason == Reason::b2b_unknown_box);
  CHECK(leaf.feed(frame(kRootIp, leaf_ip(0), partial, 0, 1)).reason == Reason::b2b_unknown_box);
  // A result nobody awaits (no partial went up): dropped, not delivered.
  CHECK(leaf.feed(frame(kRootIp, leaf_ip(0), result, 0, 1)).reason ==
        Reason::b2b_result_unexpected);
  auto bad = frame(leaf_ip(0), kRootIp, partial, 0, 1);
  bad.back() ^= 1;
  CHECK(root.feed(bad).reason == Reason::b2b_bad_mac);
  bad = frame(leaf_ip(0), kRootIp, partial, 0, 1);
  bad[sizeof(wire::EthHdr) + sizeof(wire::Ipv4Hdr) + sizeof(wire::UdpHdr) + 2] = 9;  // version
  CHECK(root.feed(bad).reason == Reason::b2b_malformed);
  for (unsigned b = 0; b < 3; ++b) CHECK(x.boxes[b]->take_sent().empty());
  CHECK(x.info(0).counters.drops[static_cast<size_t>(Reason::b2b_unknown_box)] == 3);
  // The job still works, and the drops took no cell.
  for (uint32_t k = 0; k < x.packets(0); ++k)
    for (unsigned r = 0; r < 2; ++r) x.send(r, 0, k);
  CHECK(x.all_delivered());
  x.check_exactly_once();
  // A resend into a complete leaf cell is served there: nothing goes up.
  x.send(0, 0, 0);
  CHECK(x.delivered[{0, 0, 0}] == 2);  // served from leaf A's cell, no partial sent
  CHECK(x.info(1).counters.tree.partials_resent == 0);
}

TEST_CASE("box-to-box frames of another installation, or forged without its key, are dropped",
          "[engine][tree]") {
  Fabric x({1, 1}, wire::Dtype::fp32, wire::ReduceOp::sum);
  x.add_message();
  auto& root = *x.boxes[0];
  auto partial = [&](uint32_t epoch, const wire::B2bKey& key) {
    return b2b_frame(leaf_ip(0), kRootIp, wire::B2bKind::partial, 0, x.t.ring_id, 232, epoch, key);
  };
  auto drops = [&](Reason r) { return x.info(0).counters.drops[static_cast<size_t>(r)]; };
  // Stale: the epoch of an earlier installation (its key too).
  CHECK(root.feed(partial(kTreeEpoch - 1, tree_key(2))).reason == Reason::b2b_stale_epoch);
  // Forged: this installation's epoch, but no key (a guess) or a corrupted mac.
  CHECK(root.feed(partial(kTreeEpoch, tree_key(3))).reason == Reason::b2b_bad_mac);
  auto flipped = partial(kTreeEpoch, tree_key());
  flipped[sizeof(wire::EthHdr) + sizeof(wire::Ipv4Hdr) + sizeof(wire::UdpHdr) +
          offsetof(wire::B2bHdr, mac)] ^= 0x80;
  CHECK(root.feed(flipped).reason == Reason::b2b_bad_mac);
  // A result to a leaf, forged: never delivered to its held packets.
  x.send(0, 0, 0);
  CHECK(x.boxes[1]
            ->feed(b2b_frame(kRootIp, leaf_ip(0), wire::B2bKind::result, 0, x.t.ring_id, 232,
                             kTreeEpoch, tree_key(4)))
            .reason == Reason::b2b_bad_mac);
  CHECK(drops(Reason::b2b_stale_epoch) == 1);
  CHECK(drops(Reason::b2b_bad_mac) == 2);
  CHECK(x.info(1).counters.drops[static_cast<size_t>(Reason::b2b_bad_mac)] == 1);
  CHECK(x.info(0).counters.tree.partials_received == 1);  // rank 0's leaf's, not the forgeries
  for (unsigned b = 0; b < 3; ++b) CHECK(x.boxes[b]->take_sent().empty());
  // The job is untouched: every packet exact, once.
  for (uint32_t k = 0; k < x.packets(0); ++k)
    for (unsigned r = 0; r < 2; ++r)
      if (r != 0 || k != 0) x.send(r, 0, k);
  CHECK(x.all_delivered());
  x.check_exactly_once();
  // Reinstalled as a new installation (new epoch and key): the frames of the
  // old one, replayed, are stale.
  const auto old = partial(kTreeEpoch, tree_key());
  std::vector<engine::Pkt> released;
  REQUIRE(root.e->remove_ring(x.t.ring_id, ++root.now, released).ok());
  TreeSpec next = x.root_tree;
  next.epoch = kTreeEpoch + 1;
  next.key = tree_key(9);
  REQUIRE(root.e->install_ring(x.spec, next).ok());
  CHECK(root.feed(old).reason == Reason::b2b_stale_epoch);
  CHECK(root.feed(partial(kTreeEpoch + 1, tree_key())).reason == Reason::b2b_bad_mac);
  CHECK(root.feed(partial(kTreeEpoch + 1, tree_key(9))).reason == Reason::partial_taken);
}

namespace {

// A valid partial of tree `tree` from src to dst (64 data bytes), and the
// same frame broken in each way a box-to-box frame can be malformed before
// or after its UDP port is read.
std::vector<uint8_t> b2b_partial(uint32_t src, uint32_t dst, uint32_t tree) {
  return b2b_frame(src, dst, wire::B2bKind::partial, 0, tree, 64);
}

struct Broken {
  const char* what;
  std::vector<uint8_t> frame;
  Reason reason = Reason::b2b_malformed;     // to a box address
  Reason transit = Reason::fwd_b2b_transit;  // to another address
};

std::vector<Broken> broken_b2b(uint32_t src, uint32_t dst) {
  constexpr size_t l3 = sizeof(wire::EthHdr), l4 = l3 + sizeof(wire::Ipv4Hdr);
  const auto ip = [](std::vector<uint8_t>& f) { return reinterpret_cast<wire::Ipv4Hdr*>(&f[l3]); };
  const auto resum = [&](std::vector<uint8_t>& f) {
    ip(f)->checksum.set(0);
    ip(f)->checksum.set(wire::internet_checksum(&f[l3], ip(f)->ihl_bytes()));
    return f;
  };
  const std::vector<uint8_t> good = b2b_partial(src, dst, 1);
  std::vector<Broken> out;
  auto f = good;
  f.resize(f.size() - 3);  // the IPv4 total length says 3 bytes more
  out.push_back({"cut short", f});
  f = good;
  ip(f)->flags_frag.set(0x2000);  // more fragments follow
  out.push_back({"first fragment", resum(f)});
  // The last fragment: data only, from offset 64 of the UDP datagram on.
  f = good;
  f.erase(f.begin() + l4, f.begin() + l4 + 64);
  ip(f)->flags_frag.set(64 / 8);
  ip(f)->total_length.set(static_cast<uint16_t>(f.size() - l3));
  // No port to read: to another address it is not known as box-to-box.
  out.push_back({"later fragment", resum(f), Reason::b2b_malformed, Reason::fwd_unparsed});
  f = good;
  f.insert(f.begin() + l4, 4, uint8_t{1});  // four NOP options
  ip(f)->version_ihl = 0x46;
  ip(f)->total_length.set(static_cast<uint16_t>(f.size() - l3));
  out.push_back({"IPv4 options", resum(f)});
  f = good;
  f.resize(l4 + sizeof(wire::UdpHdr) + 20);  // 20 of the header's 32 bytes
  ip(f)->total_length.set(static_cast<uint16_t>(f.size() - l3));
  reinterpret_cast<wire::UdpHdr*>(&f[l4])->length.set(sizeof(wire::UdpHdr) + 20);
  out.push_back({"short header", resum(f)});
  out.push_back({"unknown tree", b2b_partial(src, dst, 99), Reason::b2b_unknown_tree});
  return out;
}

}  // namespace

TEST_CASE("malformed box-to-box frames for the box are dropped by any of its engines",
          "[engine][tree]") {
  Fabric x({1, 1}, wire::Dtype::fp32, wire::ReduceOp::sum);
  std::vector<uint32_t> box_ips{kRootIp, leaf_ip(0)};
  // The engines a frame for the root's address may reach: the root's own;
  // one holding no tree (another worker of the box, with a plain ring);
  // one holding a tree of the box at another address (the leaf's).
  Harness plain;
  REQUIRE(plain.e->install_ring(ring_spec(2, 4)).ok());
  plain.e->set_box_addresses(box_ips.data(), box_ips.size());
  auto& leaf = *x.boxes[1];
  leaf.e->set_box_addresses(box_ips.data(), box_ips.size());
  const std::pair<const char*, Harness*> engines[] = {
      {"the tree's", x.boxes[0].get()}, {"no tree", &plain}, {"another tree", &leaf}};
  for (const auto& [name, h] : engines) {
    INFO("engine: " << name);
    const engine::ReasonCounters before = h->e->counters();
    unsigned dropped = 0;
    for (const Broken& b : broken_b2b(leaf_ip(0), kRootIp)) {
      INFO(b.what);
      const auto o = h->feed(b.frame);
      CHECK(o.verdict == Verdict::drop);
      CHECK(o.reason == b.reason);
      ++dropped;
    }
    // A valid partial of tree 1 for the root's address: only the root holds
    // tree 1 there (the leaf holds it at its own address).
    if (h != x.boxes[0].get()) {
      CHECK(h->feed(b2b_partial(leaf_ip(0), kRootIp, 1)).reason == Reason::b2b_unknown_tree);
      ++dropped;
    }
    CHECK(h->take_sent().empty());
    const auto& c = h->e->counters();
    const auto diff = [&](Reason r) { return c[engine::index(r)] - before[engine::index(r)]; };
    CHECK(diff(Reason::b2b_malformed) + diff(Reason::b2b_unknown_tree) == dropped);
    // Frames for another box pass byte for byte, whatever their state.
    for (const Broken& b : broken_b2b(leaf_ip(0), 0x0A0100FF)) {
      INFO("transit, " << b.what);
      const auto o = h->feed(b.frame);
      CHECK(o.verdict == Verdict::forward);
      CHECK(o.reason == b.transit);
      const auto out = h->take_sent();
      REQUIRE(out.size() == 1);
      CHECK(out[0] == b.frame);
    }
    // UDP to the box address on another port is ordinary traffic, whole or cut short.
    auto other = b2b_partial(leaf_ip(0), kRootIp, 1);
    reinterpret_cast<wire::UdpHdr*>(&other[sizeof(wire::EthHdr) + sizeof(wire::Ipv4Hdr)])
        ->dst_port.set(9999);
    CHECK(h->feed(other).reason == Reason::fwd_not_roce);
    other.resize(other.size() - 3);
    CHECK(h->feed(other).reason == Reason::fwd_unparsed);
    CHECK(h->take_sent().size() == 2);
  }
  // Without box addresses an engine without a tree has no box to judge for:
  // the port is ordinary traffic, as on a box without trees.
  plain.e->set_box_addresses(nullptr, 0);
  for (const Broken& b : broken_b2b(leaf_ip(0), kRootIp)) {
    INFO("no box addresses, " << b.what);
    CHECK(plain.feed(b.frame).verdict == Verdict::forward);
  }
  // The tree still works after the drops: they took no cell.
  x.add_message();
  for (uint32_t k = 0; k < x.packets(0); ++k)
    for (unsigned r = 0; r < 2; ++r) x.send(r, 0, k);
  CHECK(x.all_delivered());
  x.check_exactly_once();
}

TEST_CASE("tree specs are checked against the ring; same tree again is a no-op", "[engine][tree]") {
  Harness h;
  const auto spec = ring_spec(1, 4);
  TreeSpec t = keyed_node();
  t.self = box(leaf_ip(0));
  t.children = {TreeSpec::rank(0), TreeSpec::rank(1)};
  t.has_parent = true;
  t.parent = box(kRootIp);
  auto refused = [&](TreeSpec bad, const char* field) {
    const Status s = h.e->install_ring(spec, bad);
    INFO(s.message());
    CHECK(!s.ok());
    CHECK(s.field() == field);
  };
  TreeSpec b = t;
  b.key = {};
  refused(b, "key");  // an installation without its key
  b = t;
  b.self.ip = 0;
  refused(b, "self");
  b = t;
  b.children = {TreeSpec::rank(0), TreeSpec::rank(4)};
  refused(b, "children");
  b = t;
  b.children = {TreeSpec::rank(0), TreeSpec::rank(0)};
  refused(b, "children");
  b = t;
  b.children.push_back(TreeSpec::box(0));
  refused(b, "children");
  b = t;
  b.boxes.push_back(box(leaf_ip(3)));
  refused(b, "children");  // a child box that is not a child
  b = t;
  b.parent.ip = t.self.ip;
  refused(b, "parent");
  b = t;
  b.has_parent = false;
  refused(b, "parent");  // a root without child boxes
  CHECK(h.e->ring_count() == 0);
  REQUIRE(h.e->install_ring(spec, t).ok());
  CHECK(h.e->install_ring(spec, t).ok());
  b = t;
  b.children = {TreeSpec::rank(1), TreeSpec::rank(0)};
  CHECK(h.e->install_ring(spec, b).code() == StatusCode::conflict);
  b = t;
  b.epoch += 1;  // another installation: remove this one first
  CHECK(h.e->install_ring(spec, b).code() == StatusCode::conflict);
  CHECK(h.e->install_ring(spec).code() == StatusCode::conflict);
  const auto info = h.e->ring_info(1);
  REQUIRE(info);
  REQUIRE(info->tree);
  CHECK(*info->tree == t);
  // Removing the ring releases what its tree node held.
  RingTraffic tr;
  tr.ranks = 4;
  std::vector<uint8_t> d(232, 0);
  CHECK(h.feed(tr.packet(0, 0, d, 10, 0)).verdict == Verdict::held);
  std::vector<engine::Pkt> released;
  REQUIRE(h.e->remove_ring(1, 0, released).ok());
  CHECK(released.size() == 1);

  engine::EngineConfig acc;
  acc.mode = engine::ReduceMode::accumulate;
  Harness ha(acc);
  CHECK(ha.e->install_ring(spec, t).code() == StatusCode::unimplemented);
}

TEST_CASE("randomized fabrics: loss and duplication on every link, resends until done",
          "[engine][tree]") {
  const auto dtypes = {wire::Dtype::fp32,  wire::Dtype::fp16,  wire::Dtype::bf16,
                       wire::Dtype::int32, wire::Dtype::int64, wire::Dtype::fp64};
  const auto ops = {wire::ReduceOp::sum, wire::ReduceOp::min, wire::ReduceOp::max};
  for (uint32_t seed = 1; seed <= 300; ++seed) {
    std::mt19937 rng(seed);
    std::vector<unsigned> sizes(2 + rng() % 3);
    for (auto& s : sizes) s = 1 + rng() % 4;
    const auto dt = *(dtypes.begin() + seed % dtypes.size());
    const auto op = *(ops.begin() + (seed / dtypes.size()) % ops.size());
    const bool at_root = seed % 5 == 0;
    const bool inner = seed % 2 == 0;
    INFO("seed " << seed << " racks " << sizes.size() << " root ranks " << at_root << " inner "
                 << inner);
    Fabric x(sizes, dt, op, at_root, 4, inner);
    x.rng.seed(seed);
    const unsigned messages = 1 + rng() % 4;
    for (unsigned m = 0; m < messages; ++m) x.add_message(8 * (1 + rng() % 93));
    const double loss = 0.02 * (rng() % 6), dup = 0.02 * (rng() % 4);
    std::uniform_real_distribution<double> u(0, 1);
    x.lose = [&](unsigned, unsigned, const std::vector<uint8_t>&) { return u(rng) < loss; };
    x.duplicate = [&](const std::vector<uint8_t>&) { return u(rng) < dup; };
    unsigned round = 0;
    for (; round < 60 && !x.all_delivered(); ++round) {
      // Every worker sends what its receiver lacks (go-back-N in spirit:
      // in PSN order), each packet itself possibly lost on the way in.
      std::vector<PacketId> todo;
      for (uint32_t m = 0; m < messages; ++m)
        for (uint32_t k = 0; k < x.packets(m); ++k) {
          const size_t from = todo.size();
          for (unsigned r = 0; r < x.t.ranks; ++r)
            if (!x.delivered.count({r, m, k})) todo.push_back({r, m, k});
          std::shuffle(todo.begin() + static_cast<long>(from), todo.end(), rng);
        }
      for (const PacketId& p : todo) {
        if (u(rng) < loss) continue;
        x.send(p.rank, p.m, p.k);
        if (u(rng) < dup) x.send(p.rank, p.m, p.k);
      }
    }
    REQUIRE(x.all_delivered());
    x.check_exactly_once();
  }
}
