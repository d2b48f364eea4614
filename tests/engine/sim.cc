#include "engine/sim.h"

#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <queue>
#include <random>
#include <sstream>
#include <vector>

#include "engine/reference.h"
#include "engine/sim_net.h"
#include "support/ring_traffic.h"
#include "wire/icrc.h"
#include "wire/message.h"
#include "wire/parse.h"
#include "wire/psn.h"

namespace netreduce::sim {

using engine::Pkt;
using wire::Dtype;
using wire::ReduceOp;

namespace {

constexpr uint32_t kRingId = 77;
// After a removal: no worker accepted a packet or got an ACK forward for this
// long (50 retransmission timeouts at the default RTO): the job is stuck.
constexpr uint64_t kStuckTicks = 2000;
// Removed rings stay retired longer than any stuck run lasts.
constexpr uint64_t kRetireGrace = 100000;
constexpr uint8_t kSyndromeAck = 0x00;
constexpr uint8_t kSyndromeNakSeq = 0x60;

// Addresses and data connections: the shared fixture (support/ring_traffic.h).
// The ACK direction (send_qpn, UDP source port 0xD000 + rank) is the
// simulator's own: only its RC endpoints send ACKs.
using testing::RingAddressing;
uint32_t ip_of(unsigned rank) { return RingAddressing{}.ip(rank); }
// Receives data from the predecessor.
uint32_t recv_qpn(unsigned rank) { return RingAddressing{}.recv_qpn(rank); }
uint32_t send_qpn(unsigned rank) { return 0x200 + rank; }  // receives ACKs from the successor

struct Worker {
  unsigned rank = 0;
  uint32_t psn_base = 0;            // PSN of the first packet of message 0
  std::vector<uint8_t> tensor;      // what this worker contributes
  std::vector<uint32_t> msg_first;  // packet index of each message's first packet
  uint32_t total = 0;               // packets over all messages
  // sender
  uint32_t snd_una = 0, snd_nxt = 0;  // packet indexes
  uint64_t last_progress = 0;
  uint32_t allowed = 0;  // messages [0, allowed) may be sent (rule W)
  // receiver (from the predecessor)
  uint32_t rcv_next = 0;  // next expected packet index
  bool nak_sent = false;
  std::vector<uint8_t> rbuf;  // predecessor's messages as written into our memory
  uint32_t results = 0;       // messages received completely (in order) and accepted
  bool rejected = false;      // a message failed its seal: this worker stopped
};

struct Layout {
  size_t es = 4;
  size_t elems = 0;  // per worker tensor
  size_t cap = 0;    // data bytes per full message
  unsigned messages = 0;
  size_t data_bytes(unsigned m, size_t total_bytes) const {
    return std::min(cap, total_bytes - size_t{m} * cap);
  }
};

class Sim {
 public:
  explicit Sim(const SimParams& p)
      : p_(p),
        rng_(p.seed),
        in_(p.drop_in, p.dup_in, p.reorder_in, p.corrupt_in, rng_, pool_),
        out_(p.drop_out, p.dup_out, p.reorder_out, p.corrupt_out, rng_, pool_) {}

  SimResult run();

 private:
  static engine::Pkt alloc_cb(void* ctx, uint16_t len) {
    auto* self = static_cast<Sim*>(ctx);
    return as_pkt(self->pool_.make(len));
  }
  void setup();
  void fill_tensor(std::vector<uint8_t>& t);
  size_t build_packet(const Worker& w, uint32_t idx, std::vector<uint8_t>& out) const;
  void sender_tick(Worker& w);
  void deliver(Frame* f);
  void on_data(Worker& w, Frame* f, const wire::ParsedFrame& pf);
  void on_ack(Worker& w, const uint8_t* d, const wire::ParsedFrame& pf);
  void send_ack(const Worker& from, uint8_t syndrome, uint32_t psn);
  void box(Frame* f);
  bool done() const;
  void lifecycle();
  void make_engine();
  bool bypassed() const { return p_.bypass_at && now_ >= p_.bypass_at && now_ < p_.bypass_until; }
  bool seal_ok(const Worker& w, unsigned m, const wire::ParsedFrame& pf, const uint8_t* f) const;
  engine::RingSpec spec() const;
  bool msg_done(const Worker& w, uint32_t m) const {
    return w.results > m && w.snd_una >= w.msg_first[m + 1];
  }
  std::string check_results();

  SimParams p_;
  std::mt19937_64 rng_;
  Pool pool_;
  Channel in_, out_;
  std::unique_ptr<engine::Engine> engine_;
  std::vector<Worker> w_;
  Layout lay_;
  uint64_t now_ = 0;
  uint64_t frames_ = 0;
  uint64_t progress_ = 0;  // last tick a worker accepted data or an ACK moved snd_una
  bool removed_ = false;
  bool faulted_ = false;  // removed, bypassed or restarted so far
  uint64_t rejected_ = 0;
  engine::Sink sink_;
  const bool trace_ = std::getenv("NETREDUCE_SIM_TRACE") != nullptr;
};

engine::RingSpec Sim::spec() const {
  engine::RingSpec spec = RingAddressing{p_.ranks}.spec(kRingId, p_.msg_len, p_.window, p_.pmtu);
  return spec;
}

// The operator removes the ring (and maybe installs it again) mid-run.
void Sim::lifecycle() {
  if (now_ == p_.remove_at) {
    std::vector<Pkt> released;
    if (Status s = engine_->remove_ring(kRingId, now_, released); !s)
      throw std::runtime_error("remove_ring: " + s.to_string());
    for (const Pkt& pk : released) pool_.free(of(pk));
    removed_ = faulted_ = true;
    if (trace_)
      std::fprintf(stderr, "t=%llu ring removed\n", static_cast<unsigned long long>(now_));
  }
  if (removed_ && now_ == p_.reinstall_at) {
    if (Status s = engine_->install_ring(spec()); !s)
      throw std::runtime_error("install_ring again: " + s.to_string());
    if (trace_)
      std::fprintf(stderr, "t=%llu ring installed again\n", static_cast<unsigned long long>(now_));
  }
  if (now_ == p_.bypass_at) faulted_ = true;
  if (now_ == p_.restart_at) {
    // Whatever the engine held is gone with it (its buffers return to the
    // pool, as a restarted process's memory would).
    std::vector<Pkt> released;
    (void)engine_->remove_ring(kRingId, now_, released);
    for (const Pkt& pk : released) pool_.free(of(pk));
    engine_.reset();
    make_engine();
    faulted_ = true;
    if (trace_)
      std::fprintf(stderr, "t=%llu box restarted\n", static_cast<unsigned long long>(now_));
  }
  if (p_.restart_at && now_ == p_.reinstall_after_restart) {
    if (Status s = engine_->install_ring(spec()); !s)
      throw std::runtime_error("install_ring after the restart: " + s.to_string());
  }
  engine_->expire_retired(now_);
}

void Sim::make_engine() {
  engine::EngineConfig cfg;
  cfg.mode = p_.mode;
  cfg.icrc_fixup = p_.fixup;
  cfg.isa = p_.isa;
  cfg.allocator = {&Sim::alloc_cb, this};
  cfg.retire_grace = kRetireGrace;
  engine_ = std::make_unique<engine::Engine>(cfg);
}

void Sim::fill_tensor(std::vector<uint8_t>& t) {
  sim::fill_tensor(p_.dtype, rng_, t.data(), lay_.elems);
}

void Sim::setup() {
  make_engine();
  if (Status s = engine_->install_ring(spec()); !s)
    throw std::runtime_error("install_ring: " + s.to_string());

  lay_.es = wire::dtype_size(p_.dtype);
  lay_.cap = wire::message_capacity(p_.msg_len, p_.pmtu) / lay_.es * lay_.es;
  lay_.messages = p_.messages;
  // The last message is partial (1 element up to full).
  const size_t last_elems = 1 + rng_() % (lay_.cap / lay_.es);
  lay_.elems = (lay_.cap / lay_.es) * (p_.messages - 1) + last_elems;

  w_.resize(p_.ranks);
  for (unsigned r = 0; r < p_.ranks; ++r) {
    Worker& w = w_[r];
    w.rank = r;
    w.psn_base = wire::psn_add(p_.psn_base, r * 7919u);
    w.tensor.resize(lay_.elems * lay_.es);
    fill_tensor(w.tensor);
    uint32_t idx = 0;
    for (unsigned m = 0; m < p_.messages; ++m) {
      w.msg_first.push_back(idx);
      idx += wire::message_packets(lay_.data_bytes(m, w.tensor.size()), p_.pmtu);
    }
    w.msg_first.push_back(idx);
    w.total = idx;
    w.rbuf.assign(size_t{p_.messages} * p_.msg_len * p_.pmtu, 0);
  }
}

size_t Sim::build_packet(const Worker& w, uint32_t idx, std::vector<uint8_t>& out) const {
  const auto it = std::upper_bound(w.msg_first.begin(), w.msg_first.end(), idx) - 1;
  const unsigned m = static_cast<unsigned>(it - w.msg_first.begin());
  wire::InaMessage msg = RingAddressing{p_.ranks}.message(
      w.rank, kRingId, m, p_.dtype, p_.op, wire::psn_add(w.psn_base, w.msg_first[m]),
      w.tensor.data() + size_t{m} * lay_.cap, lay_.data_bytes(m, w.tensor.size()), p_.pmtu);
  msg.va = 0x10000000ull + uint64_t{m} * p_.msg_len * p_.pmtu;
  msg.rkey = 0x1234;
  msg.imm = m;
  out.resize(wire::kIcrcBytes + 200 + p_.pmtu);
  const size_t n = wire::build_message_packet(msg, idx - w.msg_first[m], out.data(), out.size());
  out.resize(n);
  return n;
}

void Sim::sender_tick(Worker& w) {
  // Rule W: message m may go once m - N is done (or m < N).
  while (!w.rejected && w.allowed < p_.messages &&
         (p_.violate_window && w.rank == 0
              ? true
              : w.allowed < p_.window || msg_done(w, w.allowed - p_.window)))
    ++w.allowed;
  const uint32_t limit = w.msg_first[w.allowed];
  for (unsigned i = 0; i < p_.burst && w.snd_nxt < limit; ++i) {
    Frame* f = pool_.make(0);
    build_packet(w, w.snd_nxt++, f->b);
    in_.send(f, now_);
  }
  if (w.snd_una < w.snd_nxt && now_ - w.last_progress > p_.rto) {  // retransmission timeout
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
  in_.send(f, now_);
}

void Sim::on_data(Worker& w, Frame* f, const wire::ParsedFrame& pf) {
  const Worker& pred = w_[(w.rank + p_.ranks - 1) % p_.ranks];
  const uint32_t psn = reinterpret_cast<const wire::Bth*>(f->b.data() + pf.bth)->psn.host();
  const uint32_t idx = wire::psn_distance(pred.psn_base, psn);
  if (idx == w.rcv_next && idx < pred.total) {
    const auto it = std::upper_bound(pred.msg_first.begin(), pred.msg_first.end(), idx) - 1;
    const unsigned m = static_cast<unsigned>(it - pred.msg_first.begin());
    const uint32_t k = idx - pred.msg_first[m];
    std::memcpy(w.rbuf.data() + (size_t{m} * p_.msg_len + k) * p_.pmtu, f->b.data() + pf.payload,
                pf.payload_len);
    if (trace_)
      std::fprintf(stderr, "t=%llu worker %u accepts packet %u (message %u, offset %u, %u bytes)\n",
                   static_cast<unsigned long long>(now_), w.rank, idx, m, k, pf.payload_len);
    ++w.rcv_next;
    w.nak_sent = false;
    progress_ = now_;
    if (w.rcv_next == pred.msg_first[m + 1] && !w.rejected) {  // WRITE WITH IMM completion
      if (seal_ok(w, m, pf, f->b.data())) {
        w.results = m + 1;
      } else {
        w.rejected = true;
        ++rejected_;
        if (trace_)
          std::fprintf(stderr, "t=%llu worker %u rejects message %u (seal)\n",
                       static_cast<unsigned long long>(now_), w.rank, m);
      }
    }
    send_ack(w, kSyndromeAck, psn);
  } else if (idx < w.rcv_next) {  // duplicate: re-ACK what we have
    send_ack(w, kSyndromeAck, wire::psn_add(pred.psn_base, w.rcv_next - 1));
  } else if (!w.nak_sent) {  // gap: NAK sequence error, once per expected PSN
    w.nak_sent = true;
    send_ack(w, kSyndromeNakSeq, wire::psn_add(pred.psn_base, w.rcv_next));
  }
}

// The host's rule: imm ^ crc32(the message's data) == msg_id (the sim's
// msg_id is the message index), with zlib's CRC.
bool Sim::seal_ok(const Worker& w, unsigned m, const wire::ParsedFrame& pf,
                  const uint8_t* f) const {
  if (!pf.immdt) return false;
  const uint32_t imm = reinterpret_cast<const wire::ImmDt*>(f + pf.immdt)->imm.host();
  const size_t bytes = lay_.data_bytes(m, w.tensor.size());
  const uint8_t* data = w.rbuf.data() + size_t{m} * p_.msg_len * p_.pmtu + engine::kInaHeaderBytes;
  return (imm ^ static_cast<uint32_t>(::crc32(0, data, static_cast<uInt>(bytes)))) == m;
}

void Sim::on_ack(Worker& w, const uint8_t* d, const wire::ParsedFrame& pf) {
  const uint32_t psn = reinterpret_cast<const wire::Bth*>(d + pf.bth)->psn.host();
  const uint8_t syndrome = reinterpret_cast<const wire::Aeth*>(d + pf.aeth)->syndrome;
  const uint32_t idx = wire::psn_distance(w.psn_base, psn);
  if (idx >= w.total) return;
  if (syndrome == kSyndromeAck) {
    if (idx + 1 > w.snd_una && idx < w.snd_nxt) {
      w.snd_una = idx + 1;
      w.last_progress = now_;
      progress_ = now_;
    }
  } else if (syndrome == kSyndromeNakSeq) {
    if (idx >= w.snd_una && idx <= w.snd_nxt) {
      w.snd_una = idx;  // everything before the expected PSN arrived
      w.snd_nxt = idx;  // go back N
      w.last_progress = now_;
    }
  }
}

void Sim::deliver(Frame* f) {
  wire::ParsedFrame pf;
  // The receiving NIC checks headers and ICRC like rxe; anything else is dropped.
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

void Sim::box(Frame* f) {
  if (bypassed()) {  // the box is not on the path: the frame goes on as sent
    out_.send(f, now_);
    return;
  }
  ++frames_;
  sink_.clear();
  const engine::Outcome o = engine_->process(as_pkt(f), now_, sink_);
  switch (o.verdict) {
    case engine::Verdict::forward:
    case engine::Verdict::emit:
      out_.send(f, now_);
      break;
    case engine::Verdict::consumed:
    case engine::Verdict::drop:
      pool_.free(f);
      break;
    case engine::Verdict::held:
      break;
  }
  for (unsigned i = 0; i < sink_.ntx; ++i) out_.send(of(sink_.tx[i]), now_);
  for (unsigned i = 0; i < sink_.ndrop; ++i) pool_.free(of(sink_.drop[i]));
}

bool Sim::done() const {
  for (const Worker& w : w_)
    if (w.results < p_.messages || w.snd_una < w.total) return false;
  return true;
}

std::string Sim::check_results() {
  const bool exact = p_.mode == engine::ReduceMode::deterministic || p_.op != ReduceOp::sum ||
                     p_.dtype == Dtype::int32 || p_.dtype == Dtype::int64;
  std::vector<uint8_t> want;
  for (unsigned m = 0; m < p_.messages; ++m) {
    const size_t bytes = lay_.data_bytes(m, w_[0].tensor.size());
    std::vector<const uint8_t*> in;
    for (const Worker& w : w_) in.push_back(w.tensor.data() + size_t{m} * lay_.cap);
    want.resize(bytes);
    ref::reduce(p_.dtype, p_.op, in, bytes, want.data());
    // Received data of message m: the message's bytes after the INA header.
    std::vector<uint8_t> first_got;
    for (const Worker& w : w_) {
      if (w.results <= m) continue;  // not completed (its ring was removed): nothing accepted
      std::vector<uint8_t> got(bytes);
      const uint8_t* base =
          w.rbuf.data() + size_t{m} * p_.msg_len * p_.pmtu + engine::kInaHeaderBytes;
      // The message occupies consecutive pmtu-sized packet slots.
      std::memcpy(got.data(), base, bytes);
      if (first_got.empty()) first_got = got;
      if (got != first_got) {
        std::ostringstream e;
        e << "worker " << w.rank << " message " << m
          << ": result differs from the first worker's that completed it";
        return e.str();
      }
      if (exact && got != want) {
        size_t i = 0;
        while (got[i] == want[i]) ++i;
        std::ostringstream e;
        e << "worker " << w.rank << " message " << m << ": byte " << i << " (element "
          << i / lay_.es << ") is 0x" << std::hex << int(got[i]) << ", reference 0x"
          << int(want[i]);
        return e.str();
      }
      if (!exact) {  // accumulate-mode float sum: within rounding of the reference
        for (size_t i = 0; i < bytes / lay_.es; ++i) {
          double g = 0, r = 0, mag = 0;
          for (const uint8_t* x : in) {
            double v = 0;
            if (p_.dtype == Dtype::fp32) {
              float f;
              std::memcpy(&f, x + i * 4, 4);
              v = f;
            }
            if (p_.dtype == Dtype::fp64) {
              std::memcpy(&v, x + i * 8, 8);
            }
            if (p_.dtype == Dtype::fp16) {
              uint16_t h;
              std::memcpy(&h, x + i * 2, 2);
              v = ref::fp16_widen(h);
            }
            if (p_.dtype == Dtype::bf16) {
              uint16_t h;
              std::memcpy(&h, x + i * 2, 2);
              v = ref::bf16_widen(h);
            }
            mag += std::fabs(v);
          }
          auto val = [&](const uint8_t* b) -> double {
            switch (p_.dtype) {
              case Dtype::fp32: {
                float f;
                std::memcpy(&f, b + i * 4, 4);
                return f;
              }
              case Dtype::fp64: {
                double d;
                std::memcpy(&d, b + i * 8, 8);
                return d;
              }
              case Dtype::fp16: {
                uint16_t h;
                std::memcpy(&h, b + i * 2, 2);
                return ref::fp16_widen(h);
              }
              default: {
                uint16_t h;
                std::memcpy(&h, b + i * 2, 2);
                return ref::bf16_widen(h);
              }
            }
          };
          g = val(got.data());
          r = val(want.data());
          const double eps = p_.dtype == Dtype::fp64   ? 1e-15
                             : p_.dtype == Dtype::fp32 ? 1e-6
                                                       : 1e-2;
          if (std::fabs(g - r) > eps * (mag + 1e-30) * p_.ranks &&
              !(std::isinf(g) && std::isinf(r))) {
            std::ostringstream e;
            e << "worker " << w.rank << " message " << m << " element " << i << ": " << g
              << " vs reference " << r;
            return e.str();
          }
        }
      }
    }
  }
  return {};
}

SimResult Sim::run() {
  SimResult res;
  setup();
  for (now_ = 1; now_ <= p_.max_ticks && !done(); ++now_) {
    if (faulted_ && now_ - progress_ > kStuckTicks) break;
    lifecycle();
    while (Frame* f = in_.next(now_)) box(f);
    while (Frame* f = out_.next(now_)) deliver(f);
    for (Worker& w : w_) sender_tick(w);
  }
  res.ticks = now_;
  res.frames = frames_;
  res.counters = engine_->counters();
  if (auto info = engine_->ring_info(kRingId)) res.ring = info->counters;
  res.removed = removed_;
  res.faulted = faulted_;
  res.rejected = rejected_;
  if (!done() && faulted_) {
    res.stuck_after_fault = true;
    res.error = check_results();  // what the workers did complete must be right
  } else if (!done()) {
    std::ostringstream e;
    e << "no progress after " << p_.max_ticks << " ticks:";
    for (const Worker& w : w_)
      e << " [w" << w.rank << " results " << w.results << "/" << p_.messages << " acked "
        << w.snd_una << "/" << w.total << "]";
    e << " stale=" << res.counters[static_cast<size_t>(engine::Reason::stale_message)];
    res.error = e.str();
  } else {
    res.error = check_results();
  }
  // Tear down: the ring's held packets come back, nothing may leak.
  std::vector<Pkt> released;
  (void)engine_->remove_ring(kRingId, now_, released);  // not_found if removed for good
  for (const Pkt& pk : released) pool_.free(of(pk));
  while (Frame* f = in_.next(~0ull)) pool_.free(f);
  while (Frame* f = out_.next(~0ull)) pool_.free(f);
  if (res.error.empty() && pool_.live != 0)
    res.error = "leaked " + std::to_string(pool_.live) + " frames";
  res.ok = res.error.empty();
  return res;
}

}  // namespace

SimParams random_params(uint64_t seed, bool allow_accumulate) {
  std::mt19937_64 rng(seed ^ 0x5EED5EED5EEDull);
  auto u = [&](uint64_t lo, uint64_t hi) { return lo + rng() % (hi - lo + 1); };
  auto rate = [&](double max) { return std::uniform_real_distribution<double>(0, max)(rng); };
  SimParams p;
  p.seed = seed;
  p.ranks = static_cast<unsigned>(u(2, 16));
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
  p.mode = allow_accumulate && u(0, 3) == 0 ? engine::ReduceMode::accumulate
                                            : engine::ReduceMode::deterministic;
  p.fixup = u(0, 1) ? engine::IcrcFixup::linear : engine::IcrcFixup::full;
  static const reduce::Isa isas[] = {reduce::Isa::scalar, reduce::Isa::avx2, reduce::Isa::avx512};
  p.isa = isas[u(0, 2)];
  if (!reduce::isa_supported(p.isa)) p.isa = reduce::Isa::scalar;
  p.drop_in = rate(0.05);
  p.dup_in = rate(0.05);
  p.reorder_in = rate(0.05);
  p.corrupt_in = rate(0.01);
  p.drop_out = rate(0.05);
  p.dup_out = rate(0.05);
  p.reorder_out = rate(0.05);
  p.corrupt_out = rate(0.01);
  p.psn_base = u(0, 3) == 0 ? static_cast<uint32_t>(wire::kPsnMask - u(0, 64))
                            : static_cast<uint32_t>(u(0, wire::kPsnMask));
  if (u(0, 7) == 0) {  // drawn last: the other parameters of a seed stay as they were
    p.remove_at = u(1, 250);
    if (u(0, 1)) p.reinstall_at = p.remove_at + u(0, 150);
  }
  if (u(0, 7) == 0) {
    p.bypass_at = u(1, 250);
    p.bypass_until = p.bypass_at + (u(0, 2) == 0 ? u(1, 3) : u(20, 400));
  } else if (u(0, 6) == 0 && !p.remove_at) {
    p.restart_at = u(1, 250);
    if (u(0, 3) != 0) p.reinstall_after_restart = p.restart_at + u(0, 150);
  }
  return p;
}

std::string describe(const SimParams& p) {
  std::ostringstream o;
  o << "seed=" << p.seed << " P=" << p.ranks << " " << wire::to_string(p.dtype) << "/"
    << wire::to_string(p.op) << " msgs=" << p.messages << " pmtu=" << p.pmtu
    << " msg_len=" << p.msg_len << " N=" << p.window
    << " mode=" << (p.mode == engine::ReduceMode::deterministic ? "deterministic" : "accumulate")
    << " icrc=" << (p.fixup == engine::IcrcFixup::linear ? "linear" : "full")
    << " isa=" << reduce::to_string(p.isa) << " psn_base=0x" << std::hex << p.psn_base << std::dec
    << " loss/dup/reorder/corrupt in=" << p.drop_in << "/" << p.dup_in << "/" << p.reorder_in << "/"
    << p.corrupt_in << " out=" << p.drop_out << "/" << p.dup_out << "/" << p.reorder_out << "/"
    << p.corrupt_out;
  if (p.remove_at) o << " remove_at=" << p.remove_at;
  if (p.reinstall_at) o << " reinstall_at=" << p.reinstall_at;
  if (p.bypass_at) o << " bypass=[" << p.bypass_at << "," << p.bypass_until << ")";
  if (p.restart_at) o << " restart_at=" << p.restart_at;
  if (p.reinstall_after_restart) o << " reinstall_after_restart=" << p.reinstall_after_restart;
  return o.str();
}

SimResult run_sim(const SimParams& params) {
  Sim s(params);
  return s.run();
}

}  // namespace netreduce::sim
