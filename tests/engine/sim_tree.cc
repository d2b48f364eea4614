// The RC ring simulator over a tree of boxes (docs/design.md#hierarchy).
//   engine-sim-tree-test [SEEDS] [FIRST_SEED]   random fabric and job per seed
//   NETREDUCE_SIM_SEED=S engine-sim-tree-test   replay one seed, verbosely
//
// Theory of operation
//
// Fabric. 2-4 racks of 1-4 workers; a leaf box per rack and a spine box
// (the root) above them. Some seeds put rack 0 on the spine itself (its
// ranks are the root's local children) and some put every leaf but the
// first under an inner box (three levels). Ranks are numbered in rack order
// or spread over the racks at random. Every box is a real engine::Engine
// with its part of the tree installed (engine/tree.h), fed through the burst
// entry (classify + process_burst). Every directed link (rack -> its box,
// box -> rack, child box <-> parent box) is a sim::Channel with its own
// loss, duplication and reordering rates (up to 5% each; every link at
// exactly 5% in one seed of four) and corruption (up to 1%).
//
// Routing. Each box sends a frame by its destination IPv4 address: down to
// its rack or to the child box whose subtree holds the address, otherwise up
// to its parent (the root drops what has no route: a corrupted address).
// Released results crossing racks, ACKs and NAKs take the same routes as
// any traffic; the engines own only their local senders' links.
//
// Workers. The ring simulator's RC endpoints (sim.cc): a sender QP to the
// successor and a receiver QP from the predecessor, 24-bit PSNs starting
// near the wrap on some seeds, ACK, NAK on a sequence error, go-back-N on a
// NAK or a retransmission timeout, WRITE WITH IMMEDIATE completion, ICRC
// verification on receipt (like rxe), and rule W. Senders emit 1-8 packets
// a tick with a timeout of 10-80 ticks, which can be shorter than a round
// trip over the tree: an ACK is taken against the highest PSN ever sent
// (as a real QP does), not against snd_nxt after a go-back-N, or a sender
// would ignore every answer to its earlier round and never advance.
//
// Restarts. One seed in eight removes the ring from one box mid-job (its
// held packets dropped, its cells gone) and in three of four installs the
// same ring and tree again at a later tick. A box without local ranks that
// gets its entry back must let the job finish: its children's queries and
// finals (tree.h) refill the cells it lost. Otherwise (never reinstalled,
// or a box with local ranks, whose workers' connections the engine retires)
// the job may get stuck: expected (the host library reports it), as long
// as every message a worker completed holds the reference and nothing
// leaks; the exactly-once and livelock checks are not made for such a run.
// The restarted box's counters are never checked (they start again with
// its new ring).
//
// Checks per seed (any failure prints the seed and the replay command):
// - every worker's received data equals an independent reference
//   (tests/engine/reference.h) reduced in tree order: rank order inside a
//   rack, child order above (one rounding per level), bit for bit;
// - every cell and message completed exactly once at every box, every local
//   rank's packet aggregated once, every partial taken once per child box,
//   every result received once per box with a parent (engine counters);
// - at the end no cell open and no packet held at any box; removing the
//   rings gives nothing back, and every frame buffer returns to the pool;
// - a box-to-box frame corrupted in its header or data and arriving at its
//   box is rejected: by its mac (b2b_bad_mac), or before it by a field read
//   first (b2b_malformed, b2b_unknown_tree, b2b_stale_epoch); a RoCE frame
//   corrupted in a byte its ICRC covers never enters a cell;
// - no rule-W violation is seen by a box (evicted_incomplete), no buffer
//   allocation fails;
// - the run terminates: all workers done before kStuckTicks pass without
//   progress and before max_ticks (else a livelock, reported), unless a
//   restart stopped the job (see Restarts).
//
// The RC endpoint code is the ring simulator's, addressed the same way: the
// shared fixture (support/ring_traffic.h) for the data direction, QPN
// 0x200 + r for ACKs.
#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/reference.h"
#include "engine/sim_net.h"
#include "support/ring_traffic.h"
#include "wire/b2b.h"
#include "wire/icrc.h"
#include "wire/message.h"
#include "wire/parse.h"
#include "wire/psn.h"

using namespace netreduce;
using engine::Pkt;
using engine::Reason;
using wire::Dtype;
using wire::ReduceOp;

namespace {

using sim::Channel;
using sim::Frame;
using sim::Pool;

constexpr uint32_t kRingId = 91;
constexpr uint8_t kSyndromeAck = 0x00;
constexpr uint8_t kSyndromeNakSeq = 0x60;
// No worker accepted data or saw its ACKs advance for this long (100
// retransmission timeouts, far past the latest reordered frame): livelock.
constexpr uint64_t kStuckTicks = 4000;
constexpr unsigned kBurst = 32;

using testing::RingAddressing;
uint32_t ip_of(unsigned rank) { return RingAddressing{}.ip(rank); }
uint32_t recv_qpn(unsigned rank) { return RingAddressing{}.recv_qpn(rank); }
uint32_t send_qpn(unsigned rank) { return 0x200 + rank; }
constexpr uint32_t kSpineIp = 0x0A010001;  // 10.1.0.1
constexpr uint32_t kInnerIp = 0x0A0100F0;  // 10.1.0.240
uint32_t leaf_ip(unsigned rack) { return 0x0A010002 + rack; }
wire::MacAddr mac_of(uint32_t ip) {
  return {0x02, 0xBB, uint8_t(ip >> 24), uint8_t(ip >> 16), uint8_t(ip >> 8), uint8_t(ip)};
}

struct LinkRates {
  double drop = 0, dup = 0, reorder = 0, corrupt = 0;
};

struct Params {
  uint64_t seed = 1;
  std::vector<std::vector<unsigned>> racks;  // rack -> its ranks, ascending
  bool root_ranks = false;                   // rack 0 sits on the spine itself
  bool inner = false;  // leaves after the first one under an inner box (3 levels)
  unsigned ranks = 0;
  unsigned messages = 4;
  uint16_t pmtu = 256;
  uint16_t msg_len = 4;
  uint16_t window = 2;
  Dtype dtype = Dtype::fp32;
  ReduceOp op = ReduceOp::sum;
  engine::IcrcFixup fixup = engine::IcrcFixup::linear;
  reduce::Isa isa = reduce::Isa::scalar;
  bool all_at_max = false;  // every link at exactly 5% loss/dup/reorder and 1% corruption
  uint32_t psn_base = 0;
  unsigned burst = 4;
  unsigned rto = 40;
  uint64_t max_ticks = 400000;
  // Box restart: at remove_at (0: never) box restart_box loses its ring
  // (held packets dropped, cells gone) and, if reinstall_at is not 0, gets
  // the same ring and tree back then, with empty cells.
  int restart_box = -1;  // index in Sim::boxes_ (0: the spine)
  uint64_t remove_at = 0;
  uint64_t reinstall_at = 0;
};

struct Worker {
  unsigned rank = 0;
  unsigned rack = 0;
  uint32_t psn_base = 0;
  std::vector<uint8_t> tensor;
  std::vector<uint32_t> msg_first;  // packet index of each message's first packet (+ end)
  uint32_t total = 0;
  uint32_t snd_una = 0, snd_nxt = 0;
  uint32_t snd_max = 0;  // one past the highest packet ever sent: ACKs up to it are valid
  uint64_t last_progress = 0;
  uint32_t allowed = 0;  // messages [0, allowed) may be sent (rule W)
  uint32_t rcv_next = 0;
  bool nak_sent = false;
  std::vector<uint8_t> rbuf;
  uint32_t results = 0;
};

// A box of the fabric: its engine, its place in the tree, its links.
struct Box {
  uint32_t ip = 0;
  int parent = -1;             // index into Sim::boxes_, -1 at the root
  std::vector<unsigned> kids;  // child boxes, in child order
  int rack = -1;               // the rack whose workers hang off it
  engine::TreeSpec spec;
  std::unique_ptr<engine::Engine> e;
  Channel* up = nullptr;                // to the parent
  Channel* down_rack = nullptr;         // to the rack's workers
  std::vector<Channel*> in;             // every link into this box
  std::map<uint32_t, Channel*> routes;  // destination below this box -> link
  std::vector<uint8_t> partial;         // reference reduction of the current message
};

struct Result {
  bool ok = false;
  std::string error;
  std::string note;  // how a run stuck after a restart ended (printed on replay)
  uint64_t ticks = 0;
  uint64_t frames = 0;                // frames handed to engines
  engine::ReasonCounters counters{};  // summed over boxes
  uint64_t b2b_corrupt_rejected = 0;  // corrupted box-to-box frames at their box, rejected
  uint64_t roce_corrupt_seen = 0;     // corrupted RoCE frames (ICRC-covered byte) at a box
  uint64_t partials_resent = 0, results_resent = 0;
  // A box lost its ring and the workers could not finish: the expected
  // outcome of a restart (the job fails), as long as every message a worker
  // did complete holds the reference.
  bool stuck_after_restart = false;
  bool restarted = false;       // the removal happened before the job ended
  unsigned restarted_kind = 0;  // 0 a box without local ranks, 1 with
};

class Sim {
 public:
  explicit Sim(const Params& p) : p_(p), rng_(p.seed) {}
  Result run();

 private:
  static Pkt alloc_cb(void* ctx, uint16_t len) {
    return sim::as_pkt(static_cast<Pool*>(ctx)->make(len));
  }
  Channel* link(const LinkRates& r) {
    links_.push_back(std::make_unique<Channel>(r.drop, r.dup, r.reorder, r.corrupt, rng_, pool_));
    return links_.back().get();
  }
  LinkRates rates();
  void build_fabric();
  void setup_workers();
  unsigned add_box(uint32_t ip, int parent);
  void route(const Box& b, Frame* f);
  void box_input(unsigned bi, std::vector<Frame*>& in);
  void check_frame(const Box& b, const Frame& f, const engine::Outcome& o, bool b2b_for_me,
                   bool roce_covered);
  size_t build_packet(const Worker& w, uint32_t idx, std::vector<uint8_t>& out) const;
  void sender_tick(Worker& w);
  void deliver(Frame* f);
  void on_data(Worker& w, Frame* f, const wire::ParsedFrame& pf);
  void on_ack(Worker& w, const uint8_t* d, const wire::ParsedFrame& pf);
  void send_ack(const Worker& from, uint8_t syndrome, uint32_t psn);
  bool msg_done(const Worker& w, uint32_t m) const {
    return w.results > m && w.snd_una >= w.msg_first[m + 1];
  }
  bool done() const;
  size_t data_bytes(unsigned m) const {
    return std::min(cap_, w_[0].tensor.size() - size_t{m} * cap_);
  }
  uint64_t cells() const;
  void reduce_box(unsigned bi, unsigned m);
  std::string check_results();
  std::string check_counters();
  void lifecycle();
  void fail(const std::string& e) {
    if (error_.empty()) error_ = e;
  }

  Params p_;
  std::mt19937_64 rng_;
  Pool pool_;
  std::vector<std::unique_ptr<Channel>> links_;
  std::vector<Box> boxes_;                     // 0: the spine
  std::vector<unsigned> box_of_rack_;          // rack -> box
  std::vector<Channel*> rack_up_, rack_down_;  // rack -> its box, box -> rack
  std::vector<Worker> w_;
  size_t cap_ = 0;
  size_t es_ = 4;
  uint64_t now_ = 0;
  uint64_t progress_ = 0;
  uint64_t frames_ = 0;
  std::string error_;
  Result res_;
  // Corrupted box-to-box frames whose tree id the corruption changed, per box ip.
  std::map<uint32_t, uint64_t> corrupt_unknown_tree_;
  engine::RingSpec spec_;
  bool removed_ = false;  // restart_box's ring is not installed now
  engine::Sink sink_;
  const bool trace_ = std::getenv("NETREDUCE_SIM_TRACE") != nullptr;
};

LinkRates Sim::rates() {
  if (p_.all_at_max) return {0.05, 0.05, 0.05, 0.01};
  auto r = [&](double max) { return std::uniform_real_distribution<double>(0, max)(rng_); };
  LinkRates l;
  l.drop = r(0.05);
  l.dup = r(0.05);
  l.reorder = r(0.05);
  l.corrupt = r(0.01);
  return l;
}

unsigned Sim::add_box(uint32_t ip, int parent) {
  Box b;
  b.ip = ip;
  b.parent = parent;
  b.spec.self = {ip, mac_of(ip), 0};
  b.spec.epoch = 0x5EED0001;  // one installation: every box the same epoch and key
  b.spec.key.fill(0x5A);
  engine::EngineConfig cfg;
  cfg.icrc_fixup = p_.fixup;
  cfg.isa = p_.isa;
  cfg.allocator = {&Sim::alloc_cb, &pool_};
  b.e = std::make_unique<engine::Engine>(cfg);
  boxes_.push_back(std::move(b));
  const auto i = static_cast<unsigned>(boxes_.size() - 1);
  if (parent >= 0) {
    Box& up = boxes_[static_cast<unsigned>(parent)];
    Box& me = boxes_[i];
    const auto child = static_cast<uint16_t>(up.spec.boxes.size());
    up.spec.boxes.push_back(me.spec.self);
    up.spec.children.push_back(engine::TreeSpec::box(child));
    up.kids.push_back(i);
    me.spec.has_parent = true;
    me.spec.parent = up.spec.self;
    me.spec.index_at_parent = child;
    me.up = link(rates());
    up.in.push_back(me.up);
    Channel* down = link(rates());
    me.in.push_back(down);
  }
  return i;
}

// The tree: spine, maybe an inner box, a leaf per rack (rack 0 maybe on the
// spine); links and routes. Child order: local ranks first, then child
// boxes in the order they were added.
void Sim::build_fabric() {
  add_box(kSpineIp, -1);
  box_of_rack_.assign(p_.racks.size(), 0);
  unsigned first_leaf = p_.root_ranks ? 1 : 0;
  int inner = -1;
  for (unsigned i = first_leaf; i < p_.racks.size(); ++i) {
    int parent = 0;
    if (p_.inner && i > first_leaf) {
      if (inner < 0) inner = static_cast<int>(add_box(kInnerIp, 0));
      parent = inner;
    }
    box_of_rack_[i] = add_box(leaf_ip(i), parent);
  }
  for (unsigned i = 0; i < p_.racks.size(); ++i) {
    Box& b = boxes_[box_of_rack_[i]];
    b.rack = static_cast<int>(i);
    // Local ranks come before child boxes in the reduction order.
    std::vector<engine::TreeChild> ch;
    for (unsigned r : p_.racks[i]) ch.push_back(engine::TreeSpec::rank(static_cast<uint16_t>(r)));
    b.spec.children.insert(b.spec.children.begin(), ch.begin(), ch.end());
    rack_up_.push_back(link(rates()));
    rack_down_.push_back(link(rates()));
    b.in.push_back(rack_up_.back());
    b.down_rack = rack_down_.back();
  }
  // Routes: every address below a box, toward the link that leads there.
  // Box i's link down to child c is the one c reads first (made in add_box).
  for (unsigned i = 0; i < boxes_.size(); ++i) {
    Box& b = boxes_[i];
    if (b.rack >= 0)
      for (unsigned r : p_.racks[static_cast<unsigned>(b.rack)]) b.routes[ip_of(r)] = b.down_rack;
    for (unsigned c : b.kids) {
      std::vector<unsigned> stack{c};
      while (!stack.empty()) {
        const Box& d = boxes_[stack.back()];
        stack.pop_back();
        b.routes[d.ip] = boxes_[c].in[0];
        if (d.rack >= 0)
          for (unsigned r : p_.racks[static_cast<unsigned>(d.rack)])
            b.routes[ip_of(r)] = boxes_[c].in[0];
        for (unsigned k : d.kids) stack.push_back(k);
      }
    }
  }
  spec_ = RingAddressing{p_.ranks}.spec(kRingId, p_.msg_len, p_.window, p_.pmtu);
  const engine::RingSpec& spec = spec_;
  for (Box& b : boxes_)
    if (Status s = b.e->install_ring(spec, b.spec); !s)
      throw std::runtime_error("install_ring at box " + std::to_string(b.ip & 0xFF) + ": " +
                               s.to_string());
}

void Sim::setup_workers() {
  es_ = wire::dtype_size(p_.dtype);
  cap_ = wire::message_capacity(p_.msg_len, p_.pmtu) / es_ * es_;
  const size_t last_elems = 1 + rng_() % (cap_ / es_);
  const size_t elems = (cap_ / es_) * (p_.messages - 1) + last_elems;
  w_.resize(p_.ranks);
  for (unsigned i = 0; i < p_.racks.size(); ++i)
    for (unsigned r : p_.racks[i]) w_[r].rack = i;
  for (unsigned r = 0; r < p_.ranks; ++r) {
    Worker& w = w_[r];
    w.rank = r;
    w.psn_base = wire::psn_add(p_.psn_base, r * 7919u);
    w.tensor.resize(elems * es_);
    sim::fill_tensor(p_.dtype, rng_, w.tensor.data(), elems);
    uint32_t idx = 0;
    for (unsigned m = 0; m < p_.messages; ++m) {
      w.msg_first.push_back(idx);
      idx += wire::message_packets(std::min(cap_, w.tensor.size() - size_t{m} * cap_), p_.pmtu);
    }
    w.msg_first.push_back(idx);
    w.total = idx;
    w.rbuf.assign(size_t{p_.messages} * p_.msg_len * p_.pmtu, 0);
  }
}

// ---- boxes ------------------------------------------------------------------

void Sim::route(const Box& b, Frame* f) {
  if (f->b.size() < sizeof(wire::EthHdr) + sizeof(wire::Ipv4Hdr)) return pool_.free(f);
  const auto* ip = reinterpret_cast<const wire::Ipv4Hdr*>(f->b.data() + sizeof(wire::EthHdr));
  const uint32_t dst = ip->dst.host();
  const auto it = b.routes.find(dst);
  if (it != b.routes.end()) return it->second->send(f, now_);
  if (dst == b.ip || !b.up) return pool_.free(f);  // no route (a corrupted address)
  b.up->send(f, now_);
}

// What a frame arriving corrupted must meet: a box-to-box frame for this
// box corrupted past its UDP header is rejected, by its mac (or by a field
// read before it: malformed, unknown tree, stale epoch); a RoCE frame corrupted in a
// byte its ICRC covers never enters a cell.
void Sim::check_frame(const Box& b, const Frame& f, const engine::Outcome& o, bool b2b_for_me,
                      bool roce_covered) {
  std::ostringstream e;
  if (b2b_for_me) {
    if (o.reason == Reason::b2b_bad_mac)
      ++res_.b2b_corrupt_rejected;
    else if (o.reason == Reason::b2b_unknown_tree)
      ++corrupt_unknown_tree_[b.ip];
    else if (o.reason != Reason::b2b_malformed && o.reason != Reason::b2b_unknown_tree &&
             o.reason != Reason::b2b_stale_epoch)
      e << "box " << (b.ip & 0xFF) << ": box-to-box frame corrupted at byte " << f.corrupt_at
        << " met " << engine::to_string(o.reason) << ", not a rejection";
  } else if (roce_covered) {
    ++res_.roce_corrupt_seen;
    if (engine::fate_of(o.reason) == engine::Fate::aggregate ||
        o.reason == Reason::duplicate_resent_partial)
      e << "box " << (b.ip & 0xFF) << ": RoCE frame corrupted at byte " << f.corrupt_at << " met "
        << engine::to_string(o.reason);
  }
  if (!e.str().empty()) fail(e.str());
}

void Sim::box_input(unsigned bi, std::vector<Frame*>& in) {
  Box& b = boxes_[bi];
  engine::Frame fr[kBurst];
  engine::Outcome oc[kBurst];
  bool b2b_for_me[kBurst], roce_covered[kBurst];
  size_t i = 0;
  while (i < in.size()) {
    const auto n = static_cast<unsigned>(std::min<size_t>(kBurst, in.size() - i));
    for (unsigned j = 0; j < n; ++j) {
      Frame* f = in[i + j];
      engine::Engine::classify(sim::as_pkt(f), fr[j]);
      b2b_for_me[j] = roce_covered[j] = false;
      if (f->corrupt_at < 0) continue;
      const auto at = static_cast<size_t>(f->corrupt_at);
      wire::B2bFrame bf;
      const wire::B2bStatus st = wire::parse_b2b(f->b.data(), f->b.size(), bf);
      constexpr size_t l4 = sizeof(wire::EthHdr) + sizeof(wire::Ipv4Hdr);
      if (st != wire::B2bStatus::not_b2b) {
        b2b_for_me[j] = bf.dst_ip == b.ip && at >= l4 + sizeof(wire::UdpHdr) &&
                        !(removed_ && static_cast<int>(bi) == p_.restart_box);
      } else {
        // Bytes the ICRC leaves out: Ethernet, IPv4 ToS, TTL and checksum,
        // UDP checksum, BTH resv8a.
        const size_t bth = l4 + sizeof(wire::UdpHdr);
        roce_covered[j] = at >= sizeof(wire::EthHdr) && at != 15 && at != 22 && at != 24 &&
                          at != 25 && at != l4 + 6 && at != l4 + 7 && at != bth + 4;
      }
    }
    sink_.clear();
    const unsigned took = b.e->process_burst(fr, n, now_, oc, sink_);
    frames_ += took;
    for (unsigned j = 0; j < took; ++j) {
      Frame* f = in[i + j];
      if (b2b_for_me[j] || roce_covered[j])
        check_frame(b, *f, oc[j], b2b_for_me[j], roce_covered[j]);
      switch (oc[j].verdict) {
        case engine::Verdict::forward:
        case engine::Verdict::emit:
          route(b, f);
          break;
        case engine::Verdict::consumed:
        case engine::Verdict::drop:
          pool_.free(f);
          break;
        case engine::Verdict::held:
          break;
      }
    }
    for (unsigned t = 0; t < sink_.ntx; ++t) route(b, sim::of(sink_.tx[t]));
    for (unsigned t = 0; t < sink_.ndrop; ++t) pool_.free(sim::of(sink_.drop[t]));
    i += took;
  }
}

// ---- workers (the ring simulator's RC endpoints) ------------------------------

size_t Sim::build_packet(const Worker& w, uint32_t idx, std::vector<uint8_t>& out) const {
  const auto it = std::upper_bound(w.msg_first.begin(), w.msg_first.end(), idx) - 1;
  const auto m = static_cast<unsigned>(it - w.msg_first.begin());
  wire::InaMessage msg = RingAddressing{p_.ranks}.message(
      w.rank, kRingId, m, p_.dtype, p_.op, wire::psn_add(w.psn_base, w.msg_first[m]),
      w.tensor.data() + size_t{m} * cap_, data_bytes(m), p_.pmtu);
  msg.va = 0x10000000ull + uint64_t{m} * p_.msg_len * p_.pmtu;
  msg.rkey = 0x1234;
  msg.imm = m;
  out.resize(wire::kIcrcBytes + 200 + p_.pmtu);
  const size_t n = wire::build_message_packet(msg, idx - w.msg_first[m], out.data(), out.size());
  out.resize(n);
  return n;
}

void Sim::sender_tick(Worker& w) {
  while (w.allowed < p_.messages && (w.allowed < p_.window || msg_done(w, w.allowed - p_.window)))
    ++w.allowed;
  const uint32_t limit = w.msg_first[w.allowed];
  for (unsigned i = 0; i < p_.burst && w.snd_nxt < limit; ++i) {
    Frame* f = pool_.make(0);
    build_packet(w, w.snd_nxt++, f->b);
    w.snd_max = std::max(w.snd_max, w.snd_nxt);
    rack_up_[w.rack]->send(f, now_);
  }
  if (w.snd_una < w.snd_nxt && now_ - w.last_progress > p_.rto) {
    w.snd_nxt = w.snd_una;
    w.last_progress = now_;
  }
}

void Sim::send_ack(const Worker& from, uint8_t syndrome, uint32_t psn) {
  const unsigned pred = (from.rank + p_.ranks - 1) % p_.ranks;
  wire::RoceFrameSpec s;
  s.src_ip = ip_of(from.rank);
  s.dst_ip = ip_of(pred);
  s.udp_src_port = static_cast<uint16_t>(0xD000 + from.rank);
  s.opcode = static_cast<uint8_t>(wire::Opcode::kAcknowledge);
  s.dest_qp = send_qpn(pred);
  s.psn = psn;
  s.syndrome = syndrome;
  Frame* f = pool_.make(wire::frame_size(s));
  wire::build_frame(s, f->b.data(), f->b.size());
  rack_up_[from.rack]->send(f, now_);
}

void Sim::on_data(Worker& w, Frame* f, const wire::ParsedFrame& pf) {
  const Worker& pred = w_[(w.rank + p_.ranks - 1) % p_.ranks];
  const uint32_t psn = reinterpret_cast<const wire::Bth*>(f->b.data() + pf.bth)->psn.host();
  const uint32_t idx = wire::psn_distance(pred.psn_base, psn);
  if (idx == w.rcv_next && idx < pred.total) {
    const auto it = std::upper_bound(pred.msg_first.begin(), pred.msg_first.end(), idx) - 1;
    const auto m = static_cast<unsigned>(it - pred.msg_first.begin());
    const uint32_t k = idx - pred.msg_first[m];
    std::memcpy(w.rbuf.data() + (size_t{m} * p_.msg_len + k) * p_.pmtu, f->b.data() + pf.payload,
                pf.payload_len);
    if (trace_)
      std::fprintf(stderr, "t=%llu worker %u accepts packet %u (message %u, offset %u)\n",
                   static_cast<unsigned long long>(now_), w.rank, idx, m, k);
    ++w.rcv_next;
    w.nak_sent = false;
    progress_ = now_;
    if (w.rcv_next == pred.msg_first[m + 1]) w.results = m + 1;  // WRITE WITH IMM completion
    send_ack(w, kSyndromeAck, psn);
  } else if (idx < w.rcv_next) {
    send_ack(w, kSyndromeAck, wire::psn_add(pred.psn_base, w.rcv_next - 1));
  } else if (!w.nak_sent) {
    w.nak_sent = true;
    send_ack(w, kSyndromeNakSeq, wire::psn_add(pred.psn_base, w.rcv_next));
  }
}

void Sim::on_ack(Worker& w, const uint8_t* d, const wire::ParsedFrame& pf) {
  const uint32_t psn = reinterpret_cast<const wire::Bth*>(d + pf.bth)->psn.host();
  const uint8_t syndrome = reinterpret_cast<const wire::Aeth*>(d + pf.aeth)->syndrome;
  const uint32_t idx = wire::psn_distance(w.psn_base, psn);
  if (idx >= w.total) return;
  if (syndrome == kSyndromeAck) {
    // Against the highest PSN sent, not snd_nxt: after a go-back-N the
    // answer to the earlier round may still be on its way (a round trip over
    // the tree can outlast a short timeout), and it acknowledges all before it.
    if (idx + 1 > w.snd_una && idx < w.snd_max) {
      w.snd_una = idx + 1;
      w.snd_nxt = std::max(w.snd_nxt, w.snd_una);
      w.last_progress = now_;
      progress_ = now_;
    }
  } else if (syndrome == kSyndromeNakSeq) {
    if (idx >= w.snd_una && idx <= w.snd_max) {
      w.snd_una = idx;
      w.snd_nxt = idx;
      w.last_progress = now_;
    }
  }
}

void Sim::deliver(Frame* f) {
  wire::ParsedFrame pf;
  if (wire::parse_frame(f->b.data(), f->b.size(), pf) != wire::ParseStatus::ok ||
      !wire::icrc_verify(f->b.data(), pf)) {
    pool_.free(f);
    return;
  }
  const uint32_t dst = reinterpret_cast<const wire::Ipv4Hdr*>(f->b.data() + pf.l3)->dst.host();
  const uint32_t qpn = reinterpret_cast<const wire::Bth*>(f->b.data() + pf.bth)->dest_qp.host();
  const uint32_t rank = dst - ip_of(0);
  if (rank < p_.ranks) {
    Worker& w = w_[rank];
    if (wire::is_rdma_write(pf.opcode) && qpn == recv_qpn(rank))
      on_data(w, f, pf);
    else if (pf.opcode == static_cast<uint8_t>(wire::Opcode::kAcknowledge) && qpn == send_qpn(rank))
      on_ack(w, f->b.data(), pf);
  }
  pool_.free(f);
}

bool Sim::done() const {
  for (const Worker& w : w_)
    if (w.results < p_.messages || w.snd_una < w.total) return false;
  return true;
}

// ---- checks -----------------------------------------------------------------

uint64_t Sim::cells() const {
  uint64_t n = 0;
  for (unsigned m = 0; m < p_.messages; ++m) n += wire::message_packets(data_bytes(m), p_.pmtu);
  return n;
}

// The reference reduction of box bi's children for message m, in its child
// order, into Box::partial (child boxes first, recursively).
void Sim::reduce_box(unsigned bi, unsigned m) {
  Box& b = boxes_[bi];
  const size_t bytes = data_bytes(m);
  std::vector<const uint8_t*> in;
  for (const engine::TreeChild& c : b.spec.children) {
    if (c.kind == engine::TreeChild::Kind::rank) {
      in.push_back(w_[c.index].tensor.data() + size_t{m} * cap_);
    } else {
      const unsigned kid = b.kids[c.index];
      reduce_box(kid, m);
      in.push_back(boxes_[kid].partial.data());
    }
  }
  b.partial.assign(bytes, 0);
  ref::reduce(p_.dtype, p_.op, in, bytes, b.partial.data());
}

// Every message a worker completed (all of them unless a restart stopped
// the job) against the tree reference.
std::string Sim::check_results() {
  for (unsigned m = 0; m < p_.messages; ++m) {
    reduce_box(0, m);
    const std::vector<uint8_t>& want = boxes_[0].partial;
    for (const Worker& w : w_) {
      if (w.results <= m) continue;  // not completed (only after a restart: checked before)
      const uint8_t* got =
          w.rbuf.data() + size_t{m} * p_.msg_len * p_.pmtu + engine::kInaHeaderBytes;
      if (std::memcmp(got, want.data(), want.size()) == 0) continue;
      size_t i = 0;
      while (got[i] == want[i]) ++i;
      std::ostringstream e;
      e << "worker " << w.rank << " message " << m << ": byte " << i << " (element " << i / es_
        << ") is 0x" << std::hex << int(got[i]) << ", tree reference 0x" << int(want[i]);
      return e.str();
    }
  }
  return {};
}

std::string Sim::check_counters() {
  const uint64_t n = cells();
  for (unsigned bi = 0; bi < boxes_.size(); ++bi) {
    // A restarted box's counters start again with its new ring.
    if (static_cast<int>(bi) == p_.restart_box && res_.restarted) continue;
    const Box& b = boxes_[bi];
    const auto info = b.e->ring_info(kRingId);
    std::ostringstream e;
    e << "box " << (b.ip & 0xFF) << ": ";
    if (!info) return e.str() + "ring missing";
    const engine::RingCounters& c = info->counters;
    const uint64_t local = b.rack >= 0 ? p_.racks[static_cast<unsigned>(b.rack)].size() : 0;
    const uint64_t kids = b.kids.size();
    auto want = [&](const char* what, uint64_t got, uint64_t expect) {
      if (got != expect && e.str().find('=') == std::string::npos)
        e << what << " = " << got << ", expected " << expect;
    };
    want("held packets", info->held_packets, 0);
    want("open cells", info->open_cells, 0);
    want("cells completed", c.cells_completed, n);
    want("messages completed", c.messages_completed, p_.messages);
    want("packets aggregated", c.packets_aggregated, local * n);
    want("partials taken", c.tree.partials_received, kids * n);
    want("results sent (first)", c.tree.results_sent, kids * n);
    want("partials sent (first)", c.tree.partials_sent, b.parent >= 0 ? n : 0);
    want("results received", c.tree.results_received, b.parent >= 0 ? n : 0);
    const auto& r = b.e->counters();
    want("evicted_incomplete", r[engine::index(Reason::evicted_incomplete)], 0);
    want("alloc_failed", r[engine::index(Reason::alloc_failed)], 0);
    const auto corrupted = corrupt_unknown_tree_.find(b.ip);
    want("b2b_unknown_tree", r[engine::index(Reason::b2b_unknown_tree)],
         corrupted == corrupt_unknown_tree_.end() ? 0 : corrupted->second);
    if (e.str().find('=') != std::string::npos) return e.str();
  }
  return {};
}

// The restart: the ring removed at restart_box (what its held packets
// become is the removal's business: dropped), later maybe installed again.
void Sim::lifecycle() {
  if (p_.restart_box < 0) return;
  Box& b = boxes_[static_cast<unsigned>(p_.restart_box)];
  if (now_ == p_.remove_at) {
    std::vector<Pkt> released;
    if (Status s = b.e->remove_ring(kRingId, now_, released); !s)
      throw std::runtime_error("remove_ring: " + s.to_string());
    for (const Pkt& pk : released) pool_.free(sim::of(pk));
    removed_ = res_.restarted = true;
    res_.restarted_kind = b.rack >= 0 ? 1 : 0;
  }
  if (removed_ && now_ == p_.reinstall_at) {
    if (Status s = b.e->install_ring(spec_, b.spec); !s)
      throw std::runtime_error("install_ring again: " + s.to_string());
    removed_ = false;
  }
}

Result Sim::run() {
  build_fabric();
  setup_workers();
  std::vector<Frame*> in;
  for (now_ = 1; now_ <= p_.max_ticks && !done() && error_.empty(); ++now_) {
    if (now_ - progress_ > kStuckTicks) break;
    lifecycle();
    for (unsigned bi = 0; bi < boxes_.size(); ++bi) {
      in.clear();
      for (Channel* c : boxes_[bi].in)
        while (Frame* f = c->next(now_)) in.push_back(f);
      box_input(bi, in);
    }
    for (Channel* c : rack_down_)
      while (Frame* f = c->next(now_)) deliver(f);
    for (Worker& w : w_) sender_tick(w);
  }
  res_.ticks = now_;
  res_.frames = frames_;
  if (error_.empty() && !done()) {
    std::ostringstream e;
    e << (res_.restarted ? "stuck after the restart" : "livelock") << ": no worker progressed for "
      << now_ - progress_ << " ticks at tick " << now_ << ":";
    for (const Worker& w : w_)
      e << " [w" << w.rank << " results " << w.results << "/" << p_.messages << " acked "
        << w.snd_una << "/" << w.total << "]";
    for (const Box& b : boxes_)
      if (auto info = b.e->ring_info(kRingId))
        e << " [box " << (b.ip & 0xFF) << " open cells " << info->open_cells << " held "
          << info->held_packets << "]";
    // Only a job whose restarted box had no local ranks and got its entry
    // back must finish; any other restart may stop it.
    const bool may_stick =
        res_.restarted && (removed_ || boxes_[static_cast<unsigned>(p_.restart_box)].rack >= 0);
    if (res_.restarted && !may_stick) e << " (restarted box without local ranks, reinstalled)";
    res_.stuck_after_restart = may_stick;
    (may_stick ? res_.note : error_) = e.str();
  }
  if (error_.empty()) error_ = check_results();
  if (error_.empty() && !res_.stuck_after_restart) error_ = check_counters();
  for (const Box& b : boxes_) {
    const auto& r = b.e->counters();
    for (size_t i = 0; i < r.size(); ++i) res_.counters[i] += r[i];
    if (auto info = b.e->ring_info(kRingId)) {
      res_.partials_resent += info->counters.tree.partials_resent;
      res_.results_resent += info->counters.tree.results_resent;
    }
  }
  // Tear down: nothing may be held any more, and every buffer comes back.
  for (Box& b : boxes_) {
    std::vector<Pkt> released;
    (void)b.e->remove_ring(kRingId, now_, released);
    if (error_.empty() && !released.empty() && !res_.stuck_after_restart)
      error_ = "box " + std::to_string(b.ip & 0xFF) + " still held " +
               std::to_string(released.size()) + " packets";
    for (const Pkt& pk : released) pool_.free(sim::of(pk));
  }
  links_.clear();
  if (error_.empty() && pool_.live != 0)
    error_ = "leaked " + std::to_string(pool_.live) + " frames";
  res_.error = error_;
  res_.ok = error_.empty();
  return res_;
}

Params random_params(uint64_t seed) {
  std::mt19937_64 rng(seed ^ 0x7EE5EED7EEull);
  auto u = [&](uint64_t lo, uint64_t hi) { return lo + rng() % (hi - lo + 1); };
  Params p;
  p.seed = seed;
  const auto nracks = static_cast<unsigned>(u(2, 4));
  std::vector<unsigned> sizes(nracks);
  for (auto& s : sizes) s = static_cast<unsigned>(u(1, 4));
  for (unsigned s : sizes) p.ranks += s;
  std::vector<unsigned> order(p.ranks);
  for (unsigned r = 0; r < p.ranks; ++r) order[r] = r;
  if (u(0, 1)) std::shuffle(order.begin(), order.end(), rng);  // ranks spread over racks
  unsigned next = 0;
  for (unsigned s : sizes) {
    p.racks.emplace_back(order.begin() + next, order.begin() + next + s);
    std::sort(p.racks.back().begin(), p.racks.back().end());
    next += s;
  }
  p.root_ranks = u(0, 7) == 0;
  p.inner = u(0, 3) == 0 && nracks - (p.root_ranks ? 1 : 0) >= 3;
  static const Dtype dts[] = {Dtype::fp32,  Dtype::fp16,  Dtype::bf16,
                              Dtype::int32, Dtype::int64, Dtype::fp64};
  static const ReduceOp ops[] = {ReduceOp::sum, ReduceOp::min, ReduceOp::max};
  p.dtype = dts[seed % 6];
  p.op = ops[(seed / 6) % 3];
  static const uint16_t mtus[] = {256, 512, 1024};
  p.pmtu = mtus[u(0, 2)];
  p.msg_len = static_cast<uint16_t>(u(1, 6));
  p.window = static_cast<uint16_t>(u(1, 4));
  p.messages = static_cast<unsigned>(u(1, 10));
  p.fixup = u(0, 1) ? engine::IcrcFixup::linear : engine::IcrcFixup::full;
  static const reduce::Isa isas[] = {reduce::Isa::scalar, reduce::Isa::avx2, reduce::Isa::avx512};
  p.isa = isas[u(0, 2)];
  if (!reduce::isa_supported(p.isa)) p.isa = reduce::Isa::scalar;
  p.all_at_max = u(0, 3) == 0;
  // Senders from one packet a tick to eight; a short timeout makes workers
  // resend while their result is still on its way (spurious resends into
  // awaiting cells).
  p.burst = static_cast<unsigned>(u(1, 8));
  static const unsigned rtos[] = {10, 25, 40, 80};
  p.rto = rtos[u(0, 3)];
  p.psn_base = u(0, 3) == 0 ? static_cast<uint32_t>(wire::kPsnMask - u(0, 64))
                            : static_cast<uint32_t>(u(0, wire::kPsnMask));
  if (u(0, 7) == 0) {  // a box restarts mid-job
    const unsigned nboxes = 1 + nracks - (p.root_ranks ? 1 : 0) + (p.inner ? 1 : 0);
    p.restart_box = static_cast<int>(u(0, nboxes - 1));
    p.remove_at = u(1, 250);
    if (u(0, 3) != 0) p.reinstall_at = p.remove_at + u(0, 150);
  }
  return p;
}

std::string describe(const Params& p) {
  std::ostringstream o;
  o << "seed=" << p.seed << " P=" << p.ranks << " racks=";
  for (size_t i = 0; i < p.racks.size(); ++i) {
    o << (i ? "|" : "");
    for (size_t j = 0; j < p.racks[i].size(); ++j) o << (j ? "," : "") << p.racks[i][j];
  }
  o << (p.root_ranks ? " rack0-on-spine" : "") << (p.inner ? " three-levels" : "") << " "
    << wire::to_string(p.dtype) << "/" << wire::to_string(p.op) << " msgs=" << p.messages
    << " pmtu=" << p.pmtu << " msg_len=" << p.msg_len << " N=" << p.window << " burst=" << p.burst
    << " rto=" << p.rto << " icrc=" << (p.fixup == engine::IcrcFixup::linear ? "linear" : "full")
    << " isa=" << reduce::to_string(p.isa) << " psn_base=0x" << std::hex << p.psn_base << std::dec
    << (p.all_at_max ? " links=5%/5%/5%/1%" : " links=random<=5%/5%/5%/1%");
  if (p.restart_box >= 0)
    o << " restart box " << p.restart_box << " at " << p.remove_at << " reinstall at "
      << p.reinstall_at;
  return o.str();
}

}  // namespace

int main(int argc, char** argv) {
  const sim::SeedRange range = sim::seed_range(argc, argv);
  const uint64_t seeds = range.count, first = range.first;
  const bool replay = range.replay;
  const auto t0 = std::chrono::steady_clock::now();
  engine::ReasonCounters total{};
  uint64_t frames = 0, failures = 0, three = 0, spread = 0, on_spine = 0, at_max = 0;
  uint64_t restarts[2][2][2] = {};  // [local ranks][reinstalled][stuck]
  uint64_t b2b_rejected = 0, roce_corrupt = 0, present = 0, rresent = 0;
  for (uint64_t s = first; s < first + seeds; ++s) {
    const Params p = random_params(s);
    Result r;
    try {
      r = Sim(p).run();
    } catch (const std::exception& e) {
      r.error = std::string("exception: ") + e.what();
    }
    if (replay || !r.ok) std::printf("%s\n", describe(p).c_str());
    if (replay && !r.note.empty()) std::printf("%s\n", r.note.c_str());
    if (!r.ok) {
      ++failures;
      std::printf("FAIL: %s\n  replay: NETREDUCE_SIM_SEED=%" PRIu64 " %s\n", r.error.c_str(), s,
                  argv[0]);
      if (failures >= 5) break;
      continue;
    }
    if (r.restarted) ++restarts[r.restarted_kind][p.reinstall_at != 0][r.stuck_after_restart];
    three += p.inner;
    on_spine += p.root_ranks;
    at_max += p.all_at_max;
    bool contiguous = true;
    for (size_t i = 1; i < p.racks.size(); ++i)
      contiguous = contiguous && p.racks[i].front() == p.racks[i - 1].back() + 1;
    spread += !contiguous;
    frames += r.frames;
    b2b_rejected += r.b2b_corrupt_rejected;
    roce_corrupt += r.roce_corrupt_seen;
    present += r.partials_resent;
    rresent += r.results_resent;
    for (size_t i = 0; i < total.size(); ++i) total[i] += r.counters[i];
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("engine sim tree: %" PRIu64 " seeds from %" PRIu64 " in %.1f s, %" PRIu64
              " failed; %" PRIu64 " frames through the engines\n",
              seeds, first, secs, failures, frames);
  std::printf("  fabrics: %" PRIu64 " with three levels, %" PRIu64
              " with a rack on the spine, %" PRIu64 " with ranks spread over racks, %" PRIu64
              " with every link at 5%%/5%%/5%%/1%%\n",
              three, on_spine, spread, at_max);
  static const char* kinds[] = {"box without local ranks", "box with local ranks"};
  std::printf("  box restarts mid-job (job done / stuck: the expected failure):");
  for (unsigned k = 0; k < 2; ++k)
    std::printf(" %s removed %" PRIu64 "/%" PRIu64 ", reinstalled %" PRIu64 "/%" PRIu64 ";",
                kinds[k], restarts[k][0][0], restarts[k][0][1], restarts[k][1][0],
                restarts[k][1][1]);
  std::printf("\n");
  std::printf("  corrupted box-to-box frames rejected by their MAC: %" PRIu64
              "; corrupted RoCE frames at boxes (none aggregated): %" PRIu64
              "; partials resent %" PRIu64 ", results resent %" PRIu64 "\n",
              b2b_rejected, roce_corrupt, present, rresent);
  std::printf("  engine reasons:");
  for (size_t i = 0; i < total.size(); ++i)
    if (total[i])
      std::printf(" %s=%" PRIu64,
                  std::string(engine::to_string(static_cast<engine::Reason>(i))).c_str(), total[i]);
  std::printf("\n");
  // Over many seeds, corruption must have hit box-to-box frames and been caught.
  if (!replay && failures == 0 && seeds >= 200 && (b2b_rejected == 0 || present == 0)) {
    std::printf("FAIL: the run never exercised a corrupted partial/result or a partial resend\n");
    return 1;
  }
  // ... and a reinstalled box without local ranks refilled from its children.
  if (!replay && failures == 0 && seeds >= 1000 &&
      (restarts[0][1][0] == 0 || total[engine::index(Reason::final_taken)] == 0)) {
    std::printf("FAIL: no reinstalled box without local ranks took a child's final\n");
    return 1;
  }
  return failures == 0 ? 0 : 1;
}
