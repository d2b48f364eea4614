#include "host-lib/loopback.h"

#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <set>
#include <vector>

#include "host-lib/comm_impl.h"
#include "host-lib/plan.h"
#include "wire/message.h"
#include "wire/parse.h"
#include "wire/psn.h"

namespace netreduce::host {

namespace {

struct WriteRec {
  unsigned sender = 0, receiver = 0;
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
  struct RankState {
    std::vector<uint8_t> recv;
    Region recv_region{};
    std::deque<Completion> cq;
    std::condition_variable cv;
    bool taken = false;
    uint32_t psn = 0;
    // This rank's connection to its successor lost a packet. RC would
    // retransmit from there; the loopback does not, and, like an RC
    // receiver discarding everything after a PSN gap, delivers nothing more
    // on it. Completions thus stay in order and the writer times out.
    bool stalled = false;
  };
  mutable std::mutex mu;
  std::vector<std::unique_ptr<RankState>> ranks;
  std::unique_ptr<engine::Engine> box;
  Error box_error;
  std::set<FrameRec*> frames;  // live packets (held by the engine or in flight)
  std::set<WriteRec*> writes;  // writes not fully delivered
  uint64_t into_box = 0, dropped = 0;
  uint16_t pmtu = 1024;

  ~Impl() {
    for (FrameRec* f : frames) delete f;
    for (WriteRec* w : writes) delete w;
  }

  // Lock held.
  void complete(unsigned rank, const Completion& c) {
    ranks[rank]->cq.push_back(c);
    ranks[rank]->cv.notify_all();
  }

  void finish_write(WriteRec* w) {
    Completion rc;
    rc.kind = Completion::Kind::recv_imm;
    rc.imm = w->imm;
    rc.byte_len = w->bytes;
    complete(w->receiver, rc);
    Completion wc;
    wc.kind = Completion::Kind::write_done;
    wc.wr_id = w->wr_id;
    complete(w->sender, wc);
    writes.erase(w);
    delete w;
  }

  // A packet leaves the box towards its receiver. Lock held.
  void deliver(FrameRec* f, const uint8_t* data, size_t len) {
    wire::ParsedFrame p;
    WriteRec* w = f->write;
    if (ranks[w->sender]->stalled) {
      lose(f);
      return;
    }
    if (wire::parse_frame(data, len, p) == wire::ParseStatus::ok) {
      RankState& rx = *ranks[w->receiver];
      if (f->remote_off + p.payload_len <= rx.recv.size())
        std::memcpy(rx.recv.data() + f->remote_off, data + p.payload, p.payload_len);
      if (--w->remaining == 0) finish_write(w);
      frames.erase(f);
      delete f;
    } else {
      lose(f);  // cannot happen with frames the engine released
    }
  }

  void lose(FrameRec* f) {
    ++dropped;
    ranks[f->write->sender]->stalled = true;
    frames.erase(f);
    delete f;
  }

  Error through_box(unsigned sender, const uint8_t* msg, size_t len, size_t remote_off,
                    uint32_t imm, uint64_t wr_id, const wire::InaInfo& ina) {
    const unsigned P = static_cast<unsigned>(ranks.size());
    const unsigned receiver = (sender + 1) % P;
    wire::InaMessage m;
    m.base.src_ip = LoopbackFabric::rank_ip(sender);
    m.base.dst_ip = LoopbackFabric::rank_ip(receiver);
    m.base.dest_qp = 0x100 + receiver;
    m.base.udp_src_port = static_cast<uint16_t>(0xC000 + sender);
    m.ina = ina;
    m.psn0 = ranks[sender]->psn;
    m.data = msg + sizeof(wire::InaHdr);
    m.data_bytes = len - sizeof(wire::InaHdr);
    m.pmtu = pmtu;
    m.va = reinterpret_cast<uintptr_t>(ranks[receiver]->recv.data()) + remote_off;
    m.rkey = 0x1000 + receiver;
    m.with_imm = true;
    m.imm = imm;
    const uint32_t packets = wire::message_packets(m.data_bytes, pmtu);
    ranks[sender]->psn = wire::psn_add(m.psn0, packets);
    auto* w = new WriteRec{sender, receiver, wr_id, imm, static_cast<uint32_t>(len), packets};
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
  LoopbackTransport(LoopbackFabric::Impl& f, unsigned rank) : f_(f), rank_(rank) {}
  unsigned rank() const noexcept override { return rank_; }
  unsigned world() const noexcept override { return static_cast<unsigned>(f_.ranks.size()); }

  Error register_memory(void* addr, size_t len, Region& out) override {
    if (addr == nullptr || len == 0)
      return Error::make(ErrorCode::invalid_argument, "register_memory: empty region");
    out = {static_cast<uint8_t*>(addr), len, 1, 1};
    return {};
  }
  const Region& recv_region() const noexcept override { return f_.ranks[rank_]->recv_region; }
  size_t successor_recv_bytes() const noexcept override {
    return f_.ranks[successor()]->recv.size();
  }
  unsigned max_outstanding_writes() const noexcept override { return 1024; }

  Error post_write_imm(const Region& src, size_t off, size_t len, size_t remote_off, uint32_t imm,
                       uint64_t wr_id) override {
    std::lock_guard lk(f_.mu);
    const unsigned succ = successor();
    auto& rx = *f_.ranks[succ];
    if (off + len > src.len || remote_off + len > rx.recv.size())
      return Error::make(ErrorCode::transport,
                         "rank " + std::to_string(rank_) + ": write of " + std::to_string(len) +
                             " bytes at remote offset " + std::to_string(remote_off) +
                             " is outside successor rank " + std::to_string(succ) +
                             "'s receive region");
    const uint8_t* msg = src.addr + off;
    if (f_.ranks[rank_]->stalled) return {};  // accepted, never delivered (see RankState)
    if (f_.box && len >= sizeof(wire::InaHdr)) {
      if (auto ina = wire::ina_decode(msg, len))
        return f_.through_box(rank_, msg, len, remote_off, imm, wr_id, *ina);
    }
    if (len > 0) std::memcpy(rx.recv.data() + remote_off, msg, len);
    auto* w = new WriteRec{rank_, succ, wr_id, imm, static_cast<uint32_t>(len), 0};
    f_.writes.insert(w);
    f_.finish_write(w);
    return {};
  }

  Error poll(Completion* out, unsigned max, unsigned& n, Clock::time_point deadline) override {
    std::unique_lock lk(f_.mu);
    auto& me = *f_.ranks[rank_];
    n = 0;
    me.cv.wait_until(lk, deadline, [&] { return !me.cq.empty(); });
    while (n < max && !me.cq.empty()) {
      out[n++] = me.cq.front();
      me.cq.pop_front();
    }
    return {};
  }

 private:
  LoopbackFabric::Impl& f_;
  unsigned rank_;
};

}  // namespace

LoopbackFabric::LoopbackFabric(const LoopbackConfig& cfg) : cfg_(cfg), impl_(new Impl) {
  for (unsigned r = 0; r < cfg.world; ++r) {
    auto s = std::make_unique<Impl::RankState>();
    s->recv.assign(cfg.recv_bytes, 0);
    s->recv_region = {s->recv.data(), s->recv.size(), 2, 2};
    s->psn = wire::psn_add(0xFFFFF0u, 7919u * r);  // near the 2^24 wrap on purpose
    impl_->ranks.push_back(std::move(s));
  }
  if (cfg.box) {
    cfg_.ring.members.clear();
    for (unsigned r = 0; r < cfg.world; ++r) cfg_.ring.members.push_back(rank_ip(r));
    impl_->pmtu = cfg_.ring.payload_bytes;
    impl_->box = std::make_unique<engine::Engine>(cfg_.engine);
    const Status st = impl_->box->install_ring(cfg_.ring);
    if (!st.ok())
      impl_->box_error = Error::make(ErrorCode::invalid_argument,
                                     "loopback box refused the ring: " + st.to_string());
  }
}

LoopbackFabric::~LoopbackFabric() {
  if (impl_->box) {
    std::vector<engine::Pkt> held;
    (void)impl_->box->remove_ring(cfg_.ring.ring_id, 0, held);  // its packets are in impl_->frames
  }
}

Error LoopbackFabric::transport(unsigned rank, std::unique_ptr<Transport>& out) {
  std::lock_guard lk(impl_->mu);
  if (rank >= cfg_.world)
    return Error::make(
        ErrorCode::invalid_argument,
        "rank: " + std::to_string(rank) + " is outside 0.." + std::to_string(cfg_.world - 1));
  if (!impl_->box_error.ok()) return impl_->box_error;
  if (impl_->ranks[rank]->taken)
    return Error::make(ErrorCode::invalid_argument,
                       "rank: " + std::to_string(rank) + " taken twice");
  impl_->ranks[rank]->taken = true;
  out = std::make_unique<LoopbackTransport>(*impl_, rank);
  return {};
}

uint64_t LoopbackFabric::packets_into_box() const {
  std::lock_guard lk(impl_->mu);
  return impl_->into_box;
}
uint64_t LoopbackFabric::packets_dropped_by_box() const {
  std::lock_guard lk(impl_->mu);
  return impl_->dropped;
}
std::optional<engine::RingInfo> LoopbackFabric::box_ring() const {
  std::lock_guard lk(impl_->mu);
  if (!impl_->box) return std::nullopt;
  return impl_->box->ring_info(cfg_.ring.ring_id);
}

// A communicator over the loopback fabric (tests, allreduce-perf --loopback).
Error make_loopback_communicator(LoopbackFabric& fabric, unsigned rank, const Options& options,
                                 std::unique_ptr<Communicator>& out) {
  std::unique_ptr<Transport> t;
  if (Error e = fabric.transport(rank, t)) return e;
  CollectiveConfig cc;
  const bool box = fabric.config().box && !options.force_ring;
  cc.path = box ? Path::ina : Path::ring;
  cc.reason = box ? "loopback box (engine::Engine in process)"
                  : (fabric.config().box ? "ring forced by options" : "loopback without a box");
  cc.ring_id = box ? fabric.config().ring.ring_id : 0;
  cc.msg_len = box ? fabric.config().ring.msg_len : options.msg_len;
  cc.pmtu = box ? fabric.config().ring.payload_bytes : options.payload_bytes;
  cc.window = options.window != 0 ? options.window
                                  : window_from_bdp(options.link_gbps, options.rtt_us,
                                                    size_t{cc.msg_len} * cc.pmtu);
  std::unique_ptr<Collective> c;
  if (Error e = Collective::create(*t, cc, c)) return e;
  out = std::make_unique<Communicator>(
      std::make_unique<Communicator::Impl>(std::move(t), std::move(c), options));
  return {};
}

}  // namespace netreduce::host
