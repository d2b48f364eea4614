#include "host-lib/loopback.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <vector>

#include "host-lib/comm_impl.h"
#include "host-lib/link_figures.h"
#include "host-lib/local.h"
#include "host-lib/plan.h"
#include "host-lib/ring_order.h"
#include "wire/message.h"
#include "wire/parse.h"
#include "wire/psn.h"

namespace netreduce::host {

namespace {

struct WriteRec {
  unsigned sender = 0, receiver = 0, lane = 0;
  uint64_t serial = 0;  // order of posting, over the fabric
  uint64_t wr_id = 0;
  uint32_t imm = 0;
  uint32_t bytes = 0;
  uint32_t remaining = 0;  // packets not delivered yet
};

struct FrameRec {
  std::vector<uint8_t> frame;
  WriteRec* write = nullptr;
  size_t remote_off = 0;  // where this packet's payload lands in the receive region
};

}  // namespace

struct LoopbackFabric::Impl {
  // One lane of a rank: its receive region and its connection to the successor.
  struct Lane {
    std::vector<uint8_t> recv;
    Region recv_region{};
    uint32_t psn = 0;
    // This lane's connection to the successor lost a packet. RC would
    // retransmit from there; the loopback does not, and, like an RC
    // receiver discarding everything after a PSN gap, delivers nothing more
    // on it. Completions thus stay in order and the writer times out.
    bool stalled = false;
  };
  // One host (one rank without local ranks).
  struct RankState {
    std::vector<Lane> lanes;                 // local rank l's at [l R, l R + R)
    std::vector<std::deque<Completion>> cq;  // per local rank: its lanes' completions
    std::condition_variable cv;
    std::vector<bool> taken;  // per local rank
    // Late ACKs (LoopbackConfig::late_ack): each with the first serial
    // whose delivery to this host releases it.
    std::deque<std::pair<uint64_t, Completion>> late;
    // Late reads (LoopbackConfig::late_read): receives held until the next
    // write to this host is delivered.
    std::deque<Completion> late_reads;
  };
  mutable std::mutex mu;
  std::vector<std::unique_ptr<RankState>> ranks;
  std::unique_ptr<engine::Engine> box;
  Error box_error;
  std::set<FrameRec*> frames;  // live packets (held by the engine or in flight)
  std::set<WriteRec*> writes;  // writes not fully delivered
  uint64_t into_box = 0, dropped = 0;
  uint16_t pmtu = 1024;
  unsigned group_lanes = 1;  // lanes per local rank (R)
  std::function<bool(unsigned, unsigned, uint32_t, uint32_t)> cfg_bypass;  // LoopbackConfig::bypass
  std::function<bool(unsigned, unsigned, uint64_t)> cfg_late_ack;   // LoopbackConfig::late_ack
  std::function<bool(unsigned, unsigned, uint32_t)> cfg_late_read;  // LoopbackConfig::late_read
  uint64_t serials = 0;                                             // writes posted so far
  std::vector<uint64_t> host_payload;  // INA payload bytes each host sent into the box
  unsigned installed = 0;  // rings installed in the box (ids ring.ring_id + 0..installed-1)

  // exchange(): round k of each rank is its k-th call, among its local
  // rank's ring; a round is erased once every member has read it. Its own
  // lock: callers hold no other.
  std::mutex x_mu;
  std::condition_variable x_cv;
  struct Round {
    std::vector<std::string> blobs;
    std::vector<bool> in;
    unsigned reads = 0;
  };
  std::map<std::pair<unsigned, uint64_t>, Round> x_rounds;  // by (local rank's ring, round)
  std::vector<uint64_t> x_next;                             // per rank

  ~Impl() {
    for (FrameRec* f : frames) delete f;
    for (WriteRec* w : writes) delete w;
  }

  // Lock held.
  void complete(unsigned rank, const Completion& c) {
    ranks[rank]->cq[c.lane / group_lanes].push_back(c);
    ranks[rank]->cv.notify_all();
  }

  void finish_write(WriteRec* w) {
    Completion rc;
    rc.kind = Completion::Kind::recv_imm;
    rc.imm = w->imm;
    rc.byte_len = w->bytes;
    rc.lane = w->lane;
    auto& held = ranks[w->receiver]->late_reads;
    if (cfg_late_read && cfg_late_read(w->receiver, w->lane, w->imm)) {
      held.push_back(rc);
    } else {
      for (const Completion& h : held) complete(w->receiver, h);
      held.clear();
      complete(w->receiver, rc);
    }
    auto& late = ranks[w->receiver]->late;
    while (!late.empty() && w->serial >= late.front().first) {
      complete(w->receiver, late.front().second);
      late.pop_front();
    }
    Completion wc;
    wc.kind = Completion::Kind::write_done;
    wc.wr_id = w->wr_id;
    wc.lane = w->lane;
    if (cfg_late_ack && cfg_late_ack(w->sender, w->lane, w->wr_id))
      ranks[w->sender]->late.emplace_back(serials, wc);
    else
      complete(w->sender, wc);
    writes.erase(w);
    delete w;
  }

  // A packet leaves the box towards its receiver. Lock held.
  void deliver(FrameRec* f, const uint8_t* data, size_t len) {
    wire::ParsedFrame p;
    WriteRec* w = f->write;
    if (ranks[w->sender]->lanes[w->lane].stalled) {
      lose(f);
      return;
    }
    if (wire::parse_frame(data, len, p) == wire::ParseStatus::ok) {
      Lane& rx = ranks[w->receiver]->lanes[w->lane];
      if (f->remote_off + p.payload_len <= rx.recv.size())
        std::memcpy(rx.recv.data() + f->remote_off, data + p.payload, p.payload_len);
      if (p.immdt) w->imm = reinterpret_cast<const wire::ImmDt*>(data + p.immdt)->imm.host();
      if (--w->remaining == 0) finish_write(w);
      frames.erase(f);
      delete f;
    } else {
      lose(f);  // cannot happen with frames the engine released
    }
  }

  void lose(FrameRec* f) {
    ++dropped;
    ranks[f->write->sender]->lanes[f->write->lane].stalled = true;
    frames.erase(f);
    delete f;
  }

  Error through_box(unsigned sender, unsigned lane, const uint8_t* msg, size_t len,
                    size_t remote_off, uint32_t imm, uint64_t wr_id, const wire::InaInfo& ina) {
    const unsigned P = static_cast<unsigned>(ranks.size());
    const unsigned receiver = (sender + 1) % P;
    Lane& tx = ranks[sender]->lanes[lane];
    wire::InaMessage m;
    m.base.src_ip = LoopbackFabric::rank_ip(sender);
    m.base.dst_ip = LoopbackFabric::rank_ip(receiver);
    m.base.dest_qp = 0x100 + 64 * lane + receiver;
    m.base.udp_src_port = static_cast<uint16_t>(0xC000 + 64 * lane + sender);
    m.ina = ina;
    m.psn0 = tx.psn;
    m.data = msg + sizeof(wire::InaHdr);
    m.data_bytes = len - sizeof(wire::InaHdr);
    m.pmtu = pmtu;
    m.va = reinterpret_cast<uintptr_t>(ranks[receiver]->lanes[lane].recv.data()) + remote_off;
    m.rkey = 0x1000 + 64 * lane + receiver;
    m.with_imm = true;
    m.imm = imm;
    const uint32_t packets = wire::message_packets(m.data_bytes, pmtu);
    host_payload[sender] += m.data_bytes;
    tx.psn = wire::psn_add(m.psn0, packets);
    auto* w = new WriteRec{
        sender, receiver, lane, serials++, wr_id, imm, static_cast<uint32_t>(len), packets};
    writes.insert(w);
    const uint64_t now = static_cast<uint64_t>(Clock::now().time_since_epoch().count());
    for (uint32_t k = 0; k < packets; ++k) {
      auto* f = new FrameRec;
      f->frame.resize(size_t{pmtu} + 128);
      f->write = w;
      f->remote_off = remote_off + size_t{k} * pmtu;
      const size_t flen = wire::build_message_packet(m, k, f->frame.data(), f->frame.size());
      if (flen == 0) {
        delete f;
        return Error::make(ErrorCode::internal,
                           "loopback: cannot build packet " + std::to_string(k) + " of a message");
      }
      f->frame.resize(flen);
      frames.insert(f);
      if (cfg_bypass && cfg_bypass(sender, lane, ina.msg_id, k)) {
        deliver(f, f->frame.data(), f->frame.size());
        continue;
      }
      ++into_box;
      engine::Sink sink;
      const engine::Outcome o =
          box->process({f->frame.data(), static_cast<uint16_t>(flen), f}, now, sink);
      // Released packets first: they may include this one.
      for (unsigned i = 0; i < sink.ntx; ++i) {
        auto* rf = static_cast<FrameRec*>(sink.tx[i].handle);
        deliver(rf, sink.tx[i].data, sink.tx[i].len);
      }
      for (unsigned i = 0; i < sink.ndrop; ++i) lose(static_cast<FrameRec*>(sink.drop[i].handle));
      switch (o.verdict) {
        case engine::Verdict::forward:
        case engine::Verdict::emit:
          deliver(f, f->frame.data(), f->frame.size());
          break;
        case engine::Verdict::held:
          break;
        case engine::Verdict::consumed:
          frames.erase(f);  // accumulate mode kept what it needs
          delete f;
          break;
        case engine::Verdict::drop:
          lose(f);
          break;
      }
    }
    return {};
  }
};

namespace {

class LoopbackTransport final : public Transport {
 public:
  // Host `rank`'s local rank `group`: lanes [group R, group R + R) of the host.
  LoopbackTransport(LoopbackFabric::Impl& f, unsigned rank, unsigned group)
      : f_(f), rank_(rank), group_(group), lane0_(group * f.group_lanes) {}
  unsigned rank() const noexcept override { return rank_; }
  unsigned world() const noexcept override { return static_cast<unsigned>(f_.ranks.size()); }
  unsigned lanes() const noexcept override { return f_.group_lanes; }
  unsigned job_rank(unsigned place) const noexcept override {
    return place < job_ranks_.size() ? job_ranks_[place] : place;
  }
  // The job's rank at each place of this ring (job_rank).
  void set_job_ranks(std::vector<unsigned> by_place) { job_ranks_ = std::move(by_place); }

  Error register_memory(void* addr, size_t len, Region& out) override {
    if (addr == nullptr || len == 0)
      return Error::make(ErrorCode::invalid_argument, "register_memory: empty region");
    out = {static_cast<uint8_t*>(addr), len, 1, 1};
    return {};
  }
  const Region& recv_region(unsigned lane) const noexcept override {
    return f_.ranks[rank_]->lanes[lane0_ + lane].recv_region;
  }
  size_t successor_recv_bytes() const noexcept override {
    return f_.ranks[successor()]->lanes[0].recv.size();
  }
  unsigned max_outstanding_writes() const noexcept override { return 1024; }

  Error post_write_imm(unsigned local_lane, const Region& src, size_t off, size_t len,
                       size_t remote_off, uint32_t imm, uint64_t wr_id) override {
    std::lock_guard lk(f_.mu);
    const unsigned succ = successor();
    if (local_lane >= lanes())
      return Error::make(ErrorCode::internal, "rank " + std::to_string(rank_) + ": lane " +
                                                  std::to_string(local_lane) + " of " +
                                                  std::to_string(lanes()));
    const unsigned lane = lane0_ + local_lane;
    auto& rx = f_.ranks[succ]->lanes[lane];
    if (off + len > src.len || remote_off + len > rx.recv.size())
      return Error::make(ErrorCode::transport,
                         "rank " + std::to_string(rank_) + ": write of " + std::to_string(len) +
                             " bytes at remote offset " + std::to_string(remote_off) +
                             " is outside successor rank " + std::to_string(succ) +
                             "'s receive region");
    const uint8_t* msg = src.addr + off;
    if (f_.ranks[rank_]->lanes[lane].stalled) return {};  // accepted, never delivered (see Lane)
    if (f_.box && len >= sizeof(wire::InaHdr)) {
      if (auto ina = wire::ina_decode(msg, len))
        return f_.through_box(rank_, lane, msg, len, remote_off, imm, wr_id, *ina);
    }
    if (len > 0) std::memcpy(rx.recv.data() + remote_off, msg, len);
    auto* w =
        new WriteRec{rank_, succ, lane, f_.serials++, wr_id, imm, static_cast<uint32_t>(len), 0};
    f_.writes.insert(w);
    f_.finish_write(w);
    return {};
  }

  Error poll(Completion* out, unsigned max, unsigned& n, Clock::time_point deadline) override {
    std::unique_lock lk(f_.mu);
    auto& me = *f_.ranks[rank_];
    auto& cq = me.cq[group_];
    n = 0;
    me.cv.wait_until(lk, deadline, [&] { return !cq.empty(); });
    while (n < max && !cq.empty()) {
      out[n] = cq.front();
      out[n++].lane -= lane0_;
      cq.pop_front();
    }
    return {};
  }

 private:
  LoopbackFabric::Impl& f_;
  unsigned rank_, group_, lane0_;
  std::vector<unsigned> job_ranks_;
};

}  // namespace

LoopbackFabric::LoopbackFabric(const LoopbackConfig& cfg) : cfg_(cfg), impl_(new Impl) {
  if (Error e = check_rings(cfg.rings)) {
    impl_->box_error = e;
    cfg_.rings = 1;
  }
  if (cfg.local_size < 1 || cfg.local_size > kMaxLocalRanks) {
    impl_->box_error = Error::make(ErrorCode::invalid_argument,
                                   "local_size: " + std::to_string(cfg.local_size) +
                                       " is outside 1.." + std::to_string(kMaxLocalRanks));
    cfg_.local_size = 1;
  }
  nonce_ = std::random_device{}() * 0x100000001ull ^ std::random_device{}();
  impl_->group_lanes = cfg_.rings;
  impl_->cfg_bypass = cfg_.bypass;
  impl_->cfg_late_ack = cfg_.late_ack;
  impl_->cfg_late_read = cfg_.late_read;
  impl_->host_payload.assign(cfg.world, 0);
  const unsigned lanes = cfg_.rings * cfg_.local_size;
  for (unsigned r = 0; r < cfg.world; ++r) {
    auto s = std::make_unique<Impl::RankState>();
    s->lanes.resize(lanes);
    s->cq.resize(cfg_.local_size);
    s->taken.assign(cfg_.local_size, false);
    for (unsigned g = 0; g < lanes; ++g) {
      Impl::Lane& l = s->lanes[g];
      l.recv.assign(cfg.recv_bytes, 0);
      l.recv_region = {l.recv.data(), l.recv.size(), 2, 2};
      // Near the 2^24 wrap on purpose.
      l.psn = wire::psn_add(0xFFFFF0u, 7919u * r + 104729u * g);
    }
    impl_->ranks.push_back(std::move(s));
  }
  if (cfg.box && impl_->box_error.ok()) {
    cfg_.ring.members.clear();
    for (unsigned r = 0; r < cfg.world; ++r) cfg_.ring.members.push_back(rank_ip(r));
    impl_->pmtu = cfg_.ring.payload_bytes;
    impl_->box = std::make_unique<engine::Engine>(cfg_.engine);
    for (unsigned g = 0; g < lanes && impl_->box_error.ok(); ++g) {
      engine::RingSpec spec = cfg_.ring;
      spec.ring_id += g;
      const Status st = impl_->box->install_ring(spec);
      if (!st.ok())
        impl_->box_error = Error::make(ErrorCode::invalid_argument,
                                       "loopback box refused ring " + std::to_string(g) + " (id " +
                                           std::to_string(spec.ring_id) + "): " + st.to_string());
      else
        impl_->installed = g + 1;
    }
  }
}

LoopbackFabric::~LoopbackFabric() {
  if (impl_->box) {
    std::vector<engine::Pkt> held;
    for (unsigned g = 0; g < impl_->installed; ++g)  // their packets are in impl_->frames
      (void)impl_->box->remove_ring(cfg_.ring.ring_id + g, 0, held);
  }
}

Error LoopbackFabric::transport(unsigned rank, std::unique_ptr<Transport>& out) {
  std::lock_guard lk(impl_->mu);
  const unsigned n = cfg_.local_size, P = cfg_.world * n;
  if (rank >= P)
    return Error::make(ErrorCode::invalid_argument,
                       "rank: " + std::to_string(rank) + " is outside 0.." + std::to_string(P - 1));
  if (!impl_->box_error.ok()) return impl_->box_error;
  const unsigned host = rank / n, l = rank % n;
  if (impl_->ranks[host]->taken[l])
    return Error::make(ErrorCode::invalid_argument,
                       "rank: " + std::to_string(rank) + " taken twice");
  impl_->ranks[host]->taken[l] = true;
  out = std::make_unique<LoopbackTransport>(*impl_, host, l);
  return {};
}

Error LoopbackFabric::exchange(unsigned rank, const std::string& mine,
                               std::vector<std::string>& all, Clock::time_point deadline) {
  const unsigned n = cfg_.local_size, H = cfg_.world;
  if (rank >= H * n) return Error::make(ErrorCode::invalid_argument, "exchange: rank out of range");
  // Among the ring of local rank l: every host's local rank l, by host.
  const unsigned l = rank % n, host = rank / n;
  Impl& m = *impl_;
  std::unique_lock lk(m.x_mu);
  if (m.x_next.empty()) m.x_next.assign(size_t{H} * n, 0);
  const std::pair<unsigned, uint64_t> key{l, m.x_next[rank]++};
  Impl::Round& r = m.x_rounds[key];
  if (r.blobs.empty()) {
    r.blobs.resize(H);
    r.in.assign(H, false);
  }
  r.blobs[host] = mine;
  r.in[host] = true;
  m.x_cv.notify_all();
  const auto complete = [&] { return std::count(r.in.begin(), r.in.end(), true) == H; };
  if (!m.x_cv.wait_until(lk, deadline, complete)) {
    unsigned missing = 0;
    while (r.in[missing]) ++missing;
    return Error::make(ErrorCode::timeout, "exchange: rank " + std::to_string(missing * n + l) +
                                               " did not take part before the deadline");
  }
  all = r.blobs;
  if (++r.reads == H) m.x_rounds.erase(key);
  return {};
}

uint64_t LoopbackFabric::host_bytes_into_box(unsigned host) const {
  std::lock_guard lk(impl_->mu);
  return host < impl_->host_payload.size() ? impl_->host_payload[host] : 0;
}

size_t LoopbackFabric::completions_queued(unsigned rank) const {
  std::lock_guard lk(impl_->mu);
  size_t n = 0;
  for (const auto& q : impl_->ranks.at(rank)->cq) n += q.size();
  return n;
}

uint64_t LoopbackFabric::packets_into_box() const {
  std::lock_guard lk(impl_->mu);
  return impl_->into_box;
}
uint64_t LoopbackFabric::packets_dropped_by_box() const {
  std::lock_guard lk(impl_->mu);
  return impl_->dropped;
}
std::optional<engine::RingInfo> LoopbackFabric::box_ring(unsigned g) const {
  std::lock_guard lk(impl_->mu);
  if (!impl_->box || g >= impl_->installed) return std::nullopt;
  return impl_->box->ring_info(cfg_.ring.ring_id + g);
}

// A communicator over the loopback fabric (tests, allreduce-perf --loopback).
Error make_loopback_communicator(LoopbackFabric& fabric, unsigned rank, const Options& options,
                                 std::unique_ptr<Communicator>& out) {
  const unsigned R = fabric.config().rings;
  if (options.rings != 0) {
    if (Error e = check_rings(options.rings)) return e;
    if (options.rings != R)
      return Error::make(ErrorCode::invalid_argument, "rings: " + std::to_string(options.rings) +
                                                          " where the loopback fabric has " +
                                                          std::to_string(R) + " (give 0 or " +
                                                          std::to_string(R) + ")");
  }
  const unsigned n = fabric.config().local_size;
  if (Error e = check_local_options(options)) return e;
  if (Error e = check_path_choice(options.path_choice)) return e;
  if (options.local_size != -1 && static_cast<unsigned>(options.local_size) != n)
    return Error::make(ErrorCode::invalid_argument,
                       "local_size: " + std::to_string(options.local_size) +
                           " where the loopback fabric has " + std::to_string(n));
  if (options.local_rank != -1 && static_cast<unsigned>(options.local_rank) != rank % n)
    return Error::make(ErrorCode::invalid_argument,
                       "local_rank: " + std::to_string(options.local_rank) + " where rank " +
                           std::to_string(rank) + " of the loopback fabric is local rank " +
                           std::to_string(rank % n));
  // A pinned ring order (Options::ring_order; racks need the bootstrap):
  // the transport's rank is the ring's place.
  unsigned place = rank;
  bool in_rank_order = true;
  std::vector<unsigned> order;  // place -> rank
  if (!options.ring_order.empty()) {
    if (n > 1)
      return Error::make(ErrorCode::invalid_argument,
                         "ring_order: not with the loopback fabric's local ranks");
    const unsigned P = fabric.config().world;
    std::vector<LocalityClaim> claims(P);
    std::vector<std::vector<unsigned>> hosts;
    for (unsigned r = 0; r < P; ++r) {
      claims[r].ring_order = options.ring_order;
      hosts.push_back({r});
    }
    if (Error e = ring_order(claims, hosts, order)) return e;
    place = static_cast<unsigned>(std::find(order.begin(), order.end(), rank) - order.begin());
    in_rank_order = std::is_sorted(order.begin(), order.end());
  }
  std::unique_ptr<Transport> t;
  if (Error e = fabric.transport(place, t)) return e;
  {
    std::vector<unsigned> by_place(fabric.config().world);
    for (unsigned p = 0; p < by_place.size(); ++p) by_place[p] = p * n + rank % n;
    if (!in_rank_order) by_place = order;
    static_cast<LoopbackTransport&>(*t).set_job_ranks(std::move(by_place));
  }
  std::unique_ptr<LocalGroup> local;
  if (n > 1) {
    const auto deadline = Clock::now() + std::chrono::milliseconds(options.connect_timeout_ms);
    if (Error e = LocalGroup::create(local_segment_name(fabric.nonce(), rank / n), rank % n, n,
                                     rank / n, options.ring_buffer_bytes, deadline, local))
      return e;
  }
  CollectiveConfig cc;
  const bool box = fabric.config().box && !options.force_ring;
  cc.path = box ? Path::ina : Path::ring;
  cc.reason = box ? "loopback box (engine::Engine in process)"
                  : (fabric.config().box ? "ring forced by options" : "loopback without a box");
  if (box)
    for (unsigned g = 0; g < R; ++g)
      cc.ring_ids.push_back(fabric.config().ring.ring_id + (rank % n) * R + g);
  cc.msg_len = box ? fabric.config().ring.msg_len : options.msg_len;
  cc.pmtu = box ? fabric.config().ring.payload_bytes : options.payload_bytes;
  cc.window = options.window != 0 ? options.window
                                  : window_from_bdp(options.link_gbps, options.rtt_us,
                                                    size_t{cc.msg_len} * cc.pmtu);
  std::unique_ptr<Collective> c;
  if (Error e = Collective::create(*t, cc, c)) return e;
  const unsigned host = t->rank();
  auto impl = std::make_unique<Communicator::Impl>(std::move(t), std::move(c), options);
  impl->links = configured_links(options);  // threads: a measurement would time the scheduler
  impl->ring_in_rank_order = in_rank_order;
  if (n > 1 || !in_rank_order) {
    impl->local = std::move(local);
    impl->global_rank = static_cast<int>(rank);
    impl->global_world = static_cast<int>(fabric.config().world * n);
    impl->host = host;
  }
  if (box) {
    impl->collective->set_exchange([&fabric, place](const std::string& mine,
                                                    std::vector<std::string>& all,
                                                    Clock::time_point deadline) {
      return fabric.exchange(place, mine, all, deadline);
    });
    impl->collective->set_failback(options.failback_calls, nullptr);
  }
  out = std::make_unique<Communicator>(std::move(impl));
  return {};
}

}  // namespace netreduce::host
