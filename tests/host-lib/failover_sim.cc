// The RC failover simulator: the host library's own Collective (INA path,
// seal checks, failover to the ring path, failback: src/host-lib/) on P
// ranks, each a thread, over simulated RC connections through a real
// engine::Engine, with the box bypassed or restarted at random points. The
// engine simulator (tests/engine/sim.h) proves that no wrong result is
// accepted with its own endpoints; this one proves that every call of the
// real library completes, exactly, on every rank.
//
// The RC connections (one fabric thread, one lock):
// - A write becomes RDMA WRITE packets of pmtu payload bytes: FIRST (RETH),
//   MIDDLE..., LAST WITH IMM, or ONLY WITH IMM (a zero-length stop notice
//   too), PSNs per connection from anywhere in 2^24.
// - Every frame, data and ACK, crosses the box over channels that drop,
//   duplicate, reorder and corrupt (sim_net.h's Channel).
// - A receiver checks the ICRC, takes only the expected PSN, ACKs it, NAKs
//   the first packet after a gap and re-ACKs duplicates; a LAST or ONLY
//   WITH IMM taken in order completes the write there, with the immediate
//   as delivered (the box's seal) and the RETH's length.
// - A sender goes back N on a NAK or after `rto` ticks without progress; a
//   write completes when its last packet is acknowledged.
// - Faults, counted in frames that reached the box's position: bypassed
//   for frames [a, b) (frames pass untouched, as a bypass relay does), or
//   restarted at frame r (what it held is gone; a fresh engine forwards
//   everything until the ring is installed again r + g frames later, or
//   never).
// Time: ticks pass only while frames are in flight or unacknowledged (a
// tick with nothing to deliver waits up to 50 us for a post), so fault
// points fall within the traffic. The ranks' deadlines are real time; the
// interleaving of threads is not replayed by a seed, its parameters are.
//
// Property, per seed: every call returns ok on every rank with the
// reference result bit for bit, and no sender met the 7 retransmission
// timeouts in a row at which a real queue pair fails. Inputs are small multiples of powers of two
// whose sums are exact in every order, so the box's order and the ring
// path's give the same bits and any raw or mixed data shows.
//   failover-sim-test [SEEDS] [FIRST_SEED]    NETREDUCE_SIM_SEED=S replays S
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>
#include <vector>

#include "engine/reference.h"
#include "engine/sim_net.h"
#include "host-lib/collective.h"
#include "host-lib/loopback.h"
#include "support/ring_traffic.h"
#include "wire/icrc.h"
#include "wire/parse.h"
#include "wire/psn.h"

namespace netreduce::sim {
namespace {

using host::Clock;
using host::Completion;
using host::Region;
using testing::RingAddressing;

constexpr uint32_t kRingId = 91;
constexpr uint8_t kSyndromeAck = 0x00;
constexpr uint8_t kSyndromeNakSeq = 0x60;
constexpr uint64_t kVa0 = 0x10000000;  // the RETH address of receive offset 0
constexpr auto kCallBudget = std::chrono::seconds(5);
// Ticks without an ACK before a sender goes back N. A real queue pair errs
// at its 7th timeout in a row (the host library's retry count 6): no
// sender may meet that many, so the box's forwarding must come first.
constexpr uint64_t kRto = 40;
constexpr unsigned kRcRetries = 6;

struct Params {
  uint64_t seed = 1;
  unsigned ranks = 3, calls = 3;
  DataType dtype = DataType::fp32;
  Op op = Op::sum;
  uint16_t pmtu = 256, msg_len = 4, window = 2;
  engine::IcrcFixup fixup = engine::IcrcFixup::linear;
  double drop = 0, dup = 0, reorder = 0, corrupt = 0;  // each way
  uint32_t psn_base = 0;
  uint32_t failback_calls = 1;
  std::vector<size_t> counts;               // elements per call
  uint64_t bypass_from = 0, bypass_to = 0;  // frames [from, to) pass the box untouched
  uint64_t restart_at = 0;                  // frame at which the box restarts (0: never)
  uint64_t reinstall_gap = 0;               // frames after it until the ring is back (0: never)
};

// A seed's parameters. Faults are drawn over the frames the calls need
// (about 2 frames per packet, as each packet is acknowledged).
Params random_params(uint64_t seed) {
  std::mt19937_64 rng(seed ^ 0xFA11'0FE7ull);
  auto u = [&](uint64_t lo, uint64_t hi) { return lo + rng() % (hi - lo + 1); };
  auto rate = [&](double max) { return std::uniform_real_distribution<double>(0, max)(rng); };
  Params p;
  p.seed = seed;
  p.ranks = static_cast<unsigned>(u(2, 6));
  p.calls = static_cast<unsigned>(u(2, 5));
  static const DataType dts[] = {DataType::fp32,  DataType::fp16,  DataType::bf16,
                                 DataType::int32, DataType::int64, DataType::fp64};
  static const Op ops[] = {Op::sum, Op::min, Op::max};
  p.dtype = dts[seed % 6];
  p.op = ops[(seed / 6) % 3];
  static const uint16_t mtus[] = {256, 512, 1024};
  p.pmtu = mtus[u(0, 2)];
  p.msg_len = static_cast<uint16_t>(u(1, 4));
  p.window = static_cast<uint16_t>(u(1, 4));
  p.fixup = u(0, 1) ? engine::IcrcFixup::linear : engine::IcrcFixup::full;
  p.drop = rate(0.03);
  p.dup = rate(0.03);
  p.reorder = rate(0.03);
  p.corrupt = rate(0.005);
  p.psn_base = u(0, 3) == 0 ? static_cast<uint32_t>(wire::kPsnMask - u(0, 64))
                            : static_cast<uint32_t>(u(0, wire::kPsnMask));
  p.failback_calls = static_cast<uint32_t>(u(1, 2));
  const size_t cap = (size_t{p.msg_len} * p.pmtu - sizeof(wire::InaHdr)) / element_size(p.dtype);
  uint64_t packets = 0;
  for (unsigned c = 0; c < p.calls; ++c) {
    p.counts.push_back(u(1, cap * (u(0, 3) == 0 ? 1 : 6)));
    packets +=
        (p.counts.back() * element_size(p.dtype) / (p.pmtu - sizeof(wire::InaHdr)) + 1) * p.ranks;
  }
  const uint64_t frames = 2 * packets + 1;
  switch (u(0, 3)) {
    case 0:  // a bypass: a flap of 1-3 frames, a while, or to the end
      p.bypass_from = u(1, frames);
      p.bypass_to = p.bypass_from + (u(0, 2) == 0 ? u(1, 3) : u(0, 1) ? u(4, frames) : ~0ull / 2);
      break;
    case 1:  // a restart, the ring installed again later (or never)
      p.restart_at = u(1, frames);
      p.reinstall_gap = u(0, 2) == 0 ? 0 : u(1, frames);
      break;
    default:  // no fault: loss, duplication, reordering and corruption only
      break;
  }
  return p;
}

std::string describe(const Params& p) {
  std::ostringstream o;
  o << "seed=" << p.seed << " P=" << p.ranks << " " << to_string(p.dtype) << "/" << to_string(p.op)
    << " calls=" << p.calls << " counts=";
  for (size_t c : p.counts) o << c << ",";
  o << " pmtu=" << p.pmtu << " msg_len=" << p.msg_len << " N=" << p.window
    << " icrc=" << (p.fixup == engine::IcrcFixup::linear ? "linear" : "full")
    << " loss/dup/reorder/corrupt=" << p.drop << "/" << p.dup << "/" << p.reorder << "/"
    << p.corrupt << " failback_calls=" << p.failback_calls;
  if (p.bypass_from) o << " bypass=[" << p.bypass_from << "," << p.bypass_to << ")";
  if (p.restart_at) o << " restart_at=" << p.restart_at << " reinstall_gap=" << p.reinstall_gap;
  return o.str();
}

// One rank's input for one call: integers times 2^e, |integer| <= 4 and
// e in [-1, 1] for floats (a sum of 6 is a multiple of 1/2 of at most 48:
// 7 significant bits, exact even in bf16), any value for integers.
void fill_exact(DataType t, std::mt19937_64& rng, uint8_t* out, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    const float v = std::ldexp(static_cast<float>(static_cast<int>(rng() % 9) - 4),
                               static_cast<int>(rng() % 3) - 1);
    switch (t) {
      case DataType::fp32:
        std::memcpy(out + 4 * i, &v, 4);
        break;
      case DataType::fp64: {
        const double d = v;
        std::memcpy(out + 8 * i, &d, 8);
        break;
      }
      case DataType::fp16: {
        const uint16_t h = ref::fp16_narrow(v);
        std::memcpy(out + 2 * i, &h, 2);
        break;
      }
      case DataType::bf16: {
        const uint16_t h = ref::bf16_narrow(v);
        std::memcpy(out + 2 * i, &h, 2);
        break;
      }
      case DataType::int32: {
        const uint32_t x = static_cast<uint32_t>(rng());
        std::memcpy(out + 4 * i, &x, 4);
        break;
      }
      case DataType::int64: {
        const uint64_t x = rng();
        std::memcpy(out + 8 * i, &x, 8);
        break;
      }
    }
  }
}

// The ranks' connections and the box; every member under mu_.
class Fabric {
 public:
  Fabric(const Params& p, size_t recv_bytes)
      : p_(p),
        rng_(p.seed),
        in_(p.drop, p.dup, p.reorder, p.corrupt, rng_, pool_),
        out_(p.drop, p.dup, p.reorder, p.corrupt, rng_, pool_),
        ranks_(p.ranks) {
    for (unsigned r = 0; r < p.ranks; ++r) {
      Rank& k = ranks_[r];
      k.recv.assign(recv_bytes, 0);
      k.psn_base = wire::psn_add(p.psn_base, r * 7919u);
    }
    make_engine();
    install();
    thread_ = std::thread([this] { run(); });
  }
  ~Fabric() { stop(); }

  // Stops the fabric thread and takes back every frame; returns how many
  // were not freed (a leak).
  int64_t stop() {
    {
      std::lock_guard lk(mu_);
      if (stop_) return pool_.live;
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
    std::vector<engine::Pkt> held;
    if (installed_) (void)engine_->remove_ring(kRingId, now_, held);
    for (const engine::Pkt& pk : held) pool_.free(of(pk));
    while (Frame* f = in_.next(~0ull)) pool_.free(f);
    while (Frame* f = out_.next(~0ull)) pool_.free(f);
    return pool_.live;
  }
  uint64_t frames() const {  // frames that reached the box's position
    std::lock_guard lk(mu_);
    return frames_;
  }
  // The most retransmission timeouts any sender met in a row.
  unsigned max_timeouts() const {
    std::lock_guard lk(mu_);
    return max_timeouts_;
  }

  Error post(unsigned r, const uint8_t* src, size_t len, size_t remote_off, uint32_t imm,
             uint64_t wr_id);
  void poll(unsigned r, Completion* out, unsigned max, unsigned& n, Clock::time_point deadline);
  uint8_t* recv(unsigned r) { return ranks_[r].recv.data(); }
  size_t recv_bytes() const { return ranks_[0].recv.size(); }

 private:
  struct Rank {
    std::vector<uint8_t> recv;
    std::deque<Completion> cq;
    std::condition_variable cv;
    // Sender (to the successor): packets [first, first + pkts.size()) kept
    // for retransmission, una..nxt in flight; each write's last packet.
    uint32_t psn_base = 0;
    std::deque<std::vector<uint8_t>> pkts;
    uint32_t first = 0, una = 0, nxt = 0;
    uint64_t last_progress = 0;
    unsigned timeouts = 0;                             // in a row, without an ACK moving una
    std::deque<std::pair<uint32_t, uint64_t>> writes;  // last packet index, wr_id
    // Receiver (from the predecessor): next packet index, the write in progress.
    uint32_t rcv_next = 0;
    bool nak_sent = false;
    size_t write_off = 0, write_got = 0;
    uint32_t write_len = 0;
  };
  static engine::Pkt alloc_cb(void* ctx, uint16_t len) {
    return as_pkt(static_cast<Fabric*>(ctx)->pool_.make(len));
  }
  void make_engine();
  void install();
  void run();
  bool idle() const;
  void tick();
  void box(Frame* f);
  void deliver(Frame* f);
  void on_data(unsigned r, const Frame& f, const wire::ParsedFrame& pf);
  void on_ack(unsigned r, const Frame& f, const wire::ParsedFrame& pf);
  void send_ack(unsigned r, uint8_t syndrome, uint32_t psn);
  // NETREDUCE_SIM_TRACE: each frame at the box, faults, completions.
  void trace(const Frame& f, const char* what) const {
    wire::ParsedFrame pf;
    if (wire::parse_frame(f.b.data(), f.b.size(), pf) != wire::ParseStatus::ok) return;
    const uint8_t* d = f.b.data();
    const uint32_t src =
        reinterpret_cast<const wire::Ipv4Hdr*>(d + pf.l3)->src.host() - RingAddressing{}.ip(0);
    const uint32_t psn = reinterpret_cast<const wire::Bth*>(d + pf.bth)->psn.host();
    const bool ack = pf.opcode == static_cast<uint8_t>(wire::Opcode::kAcknowledge);
    const uint32_t idx = wire::psn_distance(ranks_[ack ? pred(src) : src].psn_base, psn);
    std::fprintf(stderr, "t=%llu frame %llu %s: rank %u %s idx %u len %u\n",
                 (unsigned long long)now_, (unsigned long long)frames_, what, src,
                 ack ? "ack" : "op", idx, unsigned{pf.payload_len});
  }
  void complete(unsigned r, const Completion& c) {
    if (trace_)
      std::fprintf(stderr, "t=%llu rank %u completion %s imm %x wr %llu\n",
                   (unsigned long long)now_, r,
                   c.kind == Completion::Kind::write_done ? "write" : "recv", c.imm,
                   (unsigned long long)c.wr_id);
    ranks_[r].cq.push_back(c);
    ranks_[r].cv.notify_all();
  }
  unsigned pred(unsigned r) const { return (r + p_.ranks - 1) % p_.ranks; }
  static uint32_t send_qpn(unsigned r) { return 0x200 + r; }  // where ACKs to rank r go

  const Params p_;
  mutable std::mutex mu_;
  std::condition_variable cv_;  // the fabric thread's: a post, or stop
  std::mt19937_64 rng_;
  Pool pool_;
  Channel in_, out_;
  std::vector<Rank> ranks_;
  std::unique_ptr<engine::Engine> engine_;
  engine::Sink sink_;
  bool installed_ = false, restarted_ = false, stop_ = false;
  uint64_t now_ = 1, frames_ = 0;
  unsigned max_timeouts_ = 0;
  const bool trace_ = std::getenv("NETREDUCE_SIM_TRACE") != nullptr;
  std::thread thread_;
};

void Fabric::make_engine() {
  engine::EngineConfig cfg;
  cfg.icrc_fixup = p_.fixup;
  cfg.allocator = {&Fabric::alloc_cb, this};
  // 2 retransmission timeouts: the senders' retries also cover losses of
  // what is then forwarded (more than the 1 ms of the data plane, where a
  // timeout is 67 ms).
  cfg.forward_unmatched_after = 2 * kRto;
  cfg.forward_stalled_after = 2 * kRto;
  engine_ = std::make_unique<engine::Engine>(cfg);
  installed_ = false;
}

void Fabric::install() {
  const engine::RingSpec spec =
      RingAddressing{p_.ranks}.spec(kRingId, p_.msg_len, p_.window, p_.pmtu);
  if (Status s = engine_->install_ring(spec); !s)
    throw std::runtime_error("install_ring: " + s.to_string());
  installed_ = true;
}

Error Fabric::post(unsigned r, const uint8_t* src, size_t len, size_t remote_off, uint32_t imm,
                   uint64_t wr_id) {
  std::lock_guard lk(mu_);
  if (remote_off + len > recv_bytes())
    return Error::make(ErrorCode::transport,
                       "rank " + std::to_string(r) + ": write outside the successor's region");
  Rank& k = ranks_[r];
  const RingAddressing a{p_.ranks};
  const uint32_t n = len == 0 ? 1 : static_cast<uint32_t>((len + p_.pmtu - 1) / p_.pmtu);
  const uint32_t idx0 = k.first + static_cast<uint32_t>(k.pkts.size());
  for (uint32_t i = 0; i < n; ++i) {
    wire::RoceFrameSpec s;
    s.src_ip = a.ip(r);
    s.dst_ip = a.ip(a.succ(r));
    s.dest_qp = a.recv_qpn(a.succ(r));
    s.udp_src_port = RingAddressing::udp_src_port(r);
    s.psn = wire::psn_add(k.psn_base, idx0 + i);
    s.va = kVa0 + remote_off;
    s.rkey = 0x1234;
    s.dma_length = static_cast<uint32_t>(len);
    s.imm = imm;
    const bool last = i + 1 == n;
    s.opcode = static_cast<uint8_t>(n == 1   ? wire::Opcode::kWriteOnlyImm
                                    : i == 0 ? wire::Opcode::kWriteFirst
                                    : last   ? wire::Opcode::kWriteLastImm
                                             : wire::Opcode::kWriteMiddle);
    s.ack_req = last;
    s.solicited = last;
    s.payload = src + size_t{i} * p_.pmtu;
    s.payload_len = std::min<size_t>(p_.pmtu, len - size_t{i} * p_.pmtu);
    std::vector<uint8_t> frame(wire::frame_size(s));
    if (frame.empty() || wire::build_frame(s, frame.data(), frame.size()) == 0)
      return Error::make(ErrorCode::internal, "cannot build a packet");
    k.pkts.push_back(std::move(frame));
  }
  k.writes.emplace_back(idx0 + n - 1, wr_id);
  cv_.notify_all();
  return {};
}

void Fabric::poll(unsigned r, Completion* out, unsigned max, unsigned& n,
                  Clock::time_point deadline) {
  std::unique_lock lk(mu_);
  Rank& k = ranks_[r];
  n = 0;
  k.cv.wait_until(lk, deadline, [&] { return !k.cq.empty(); });
  while (n < max && !k.cq.empty()) {
    out[n++] = k.cq.front();
    k.cq.pop_front();
  }
}

bool Fabric::idle() const {
  if (!in_.empty() || !out_.empty()) return false;
  for (const Rank& k : ranks_)
    if (k.una != k.first + k.pkts.size()) return false;
  return true;
}

void Fabric::run() {
  std::unique_lock lk(mu_);
  while (!stop_) {
    if (idle()) {
      cv_.wait(lk);
      continue;
    }
    if (in_.empty() && out_.empty())  // only retransmission timers run: let time pass
      cv_.wait_for(lk, std::chrono::microseconds(50));
    tick();
  }
}

void Fabric::tick() {
  ++now_;
  while (Frame* f = in_.next(now_)) box(f);
  while (Frame* f = out_.next(now_)) deliver(f);
  for (unsigned r = 0; r < p_.ranks; ++r) {
    Rank& k = ranks_[r];
    const uint32_t end = k.first + static_cast<uint32_t>(k.pkts.size());
    if (k.una == k.nxt && k.nxt < end) k.last_progress = now_;  // the timer starts
    for (unsigned i = 0; i < 4 && k.nxt < end; ++i, ++k.nxt) {
      Frame* f = pool_.make(0);
      f->b = k.pkts[k.nxt - k.first];
      in_.send(f, now_);
    }
    if (k.una < k.nxt && now_ - k.last_progress > kRto) {  // retransmission timeout
      k.nxt = k.una;
      k.last_progress = now_;
      max_timeouts_ = std::max(max_timeouts_, ++k.timeouts);
      if (trace_)
        std::fprintf(stderr, "t=%llu rank %u timeout %u: resends from %u\n",
                     static_cast<unsigned long long>(now_), r, k.timeouts, k.una);
    }
  }
}

// The frame reaches the box's position: faults first, then the box.
void Fabric::box(Frame* f) {
  ++frames_;
  if (p_.restart_at && frames_ == p_.restart_at) {
    std::vector<engine::Pkt> held;  // gone with the process
    if (installed_) (void)engine_->remove_ring(kRingId, now_, held);
    for (const engine::Pkt& pk : held) pool_.free(of(pk));
    make_engine();
    restarted_ = true;
    if (trace_) std::fprintf(stderr, "frame %llu: box restarted\n", (unsigned long long)frames_);
  }
  if (restarted_ && !installed_ && p_.reinstall_gap && frames_ >= p_.restart_at + p_.reinstall_gap)
    install();
  if (frames_ >= p_.bypass_from && frames_ < p_.bypass_to) {
    if (trace_) trace(*f, "bypass");
    out_.send(f, now_);
    return;
  }
  sink_.clear();
  if (trace_) trace(*f, "in");
  const engine::Outcome o = engine_->process(as_pkt(f), now_, sink_);
  if (trace_)
    std::fprintf(stderr, "   -> %s, %u released\n",
                 std::string(engine::to_string(o.reason)).c_str(), unsigned{sink_.ntx});
  if (o.verdict == engine::Verdict::forward || o.verdict == engine::Verdict::emit)
    out_.send(f, now_);
  else if (o.verdict != engine::Verdict::held)
    pool_.free(f);
  for (unsigned i = 0; i < sink_.ntx; ++i) out_.send(of(sink_.tx[i]), now_);
  for (unsigned i = 0; i < sink_.ndrop; ++i) pool_.free(of(sink_.drop[i]));
}

void Fabric::deliver(Frame* f) {
  wire::ParsedFrame pf;
  if (wire::parse_frame(f->b.data(), f->b.size(), pf) == wire::ParseStatus::ok &&
      wire::icrc_verify(f->b.data(), pf)) {
    const uint8_t* d = f->b.data();
    const uint32_t dst = reinterpret_cast<const wire::Ipv4Hdr*>(d + pf.l3)->dst.host();
    const uint32_t qpn = reinterpret_cast<const wire::Bth*>(d + pf.bth)->dest_qp.host();
    const uint32_t r = dst - RingAddressing{}.ip(0);
    if (r < p_.ranks && wire::is_rdma_write(pf.opcode) && qpn == RingAddressing{}.recv_qpn(r))
      on_data(r, *f, pf);
    else if (r < p_.ranks && pf.opcode == static_cast<uint8_t>(wire::Opcode::kAcknowledge) &&
             qpn == send_qpn(r))
      on_ack(r, *f, pf);
  }
  pool_.free(f);
}

void Fabric::on_data(unsigned r, const Frame& f, const wire::ParsedFrame& pf) {
  Rank& k = ranks_[r];
  const Rank& from = ranks_[pred(r)];
  const uint8_t* d = f.b.data();
  const uint32_t psn = reinterpret_cast<const wire::Bth*>(d + pf.bth)->psn.host();
  const uint32_t idx = wire::psn_distance(from.psn_base, psn);
  if (idx != k.rcv_next) {
    if (idx < k.rcv_next) {  // a duplicate: ACK what we have
      send_ack(r, kSyndromeAck, wire::psn_add(from.psn_base, k.rcv_next - 1));
    } else if (!k.nak_sent) {  // a gap: NAK once per expected PSN
      k.nak_sent = true;
      send_ack(r, kSyndromeNakSeq, wire::psn_add(from.psn_base, k.rcv_next));
    }
    return;
  }
  if (pf.reth) {
    const auto* reth = reinterpret_cast<const wire::Reth*>(d + pf.reth);
    k.write_off = static_cast<size_t>(reth->virtual_address.host() - kVa0);
    k.write_len = reth->dma_length.host();
    k.write_got = 0;
  }
  if (k.write_off + k.write_got + pf.payload_len <= k.recv.size())
    std::memcpy(k.recv.data() + k.write_off + k.write_got, d + pf.payload, pf.payload_len);
  k.write_got += pf.payload_len;
  ++k.rcv_next;
  k.nak_sent = false;
  if (pf.immdt) {
    Completion c;
    c.kind = Completion::Kind::recv_imm;
    c.imm = reinterpret_cast<const wire::ImmDt*>(d + pf.immdt)->imm.host();
    c.byte_len = k.write_len;
    complete(r, c);
  }
  send_ack(r, kSyndromeAck, psn);
}

void Fabric::on_ack(unsigned r, const Frame& f, const wire::ParsedFrame& pf) {
  Rank& k = ranks_[r];
  const uint8_t* d = f.b.data();
  const uint32_t psn = reinterpret_cast<const wire::Bth*>(d + pf.bth)->psn.host();
  const uint8_t syndrome = reinterpret_cast<const wire::Aeth*>(d + pf.aeth)->syndrome;
  const uint32_t idx = wire::psn_distance(k.psn_base, psn);
  if (syndrome == kSyndromeAck && idx >= k.una && idx < k.nxt) {
    k.una = idx + 1;
    k.last_progress = now_;
    k.timeouts = 0;
  } else if (syndrome == kSyndromeNakSeq && idx >= k.una && idx <= k.nxt) {
    k.una = k.nxt = idx;  // go back N
    k.last_progress = now_;
  }
  while (!k.writes.empty() && k.writes.front().first < k.una) {
    Completion c;
    c.kind = Completion::Kind::write_done;
    c.wr_id = k.writes.front().second;
    complete(r, c);
    k.writes.pop_front();
  }
  while (k.first < k.una) {
    k.pkts.pop_front();
    ++k.first;
  }
}

void Fabric::send_ack(unsigned r, uint8_t syndrome, uint32_t psn) {
  const unsigned to = pred(r);
  wire::RoceFrameSpec s;
  s.src_ip = RingAddressing{}.ip(r);
  s.dst_ip = RingAddressing{}.ip(to);
  s.udp_src_port = static_cast<uint16_t>(0xD000 + r);
  s.opcode = static_cast<uint8_t>(wire::Opcode::kAcknowledge);
  s.dest_qp = send_qpn(to);
  s.psn = psn;
  s.syndrome = syndrome;
  Frame* f = pool_.make(wire::frame_size(s));
  wire::build_frame(s, f->b.data(), f->b.size());
  in_.send(f, now_);
}

// One rank's Transport over the fabric: one lane.
class SimTransport final : public host::Transport {
 public:
  SimTransport(Fabric& f, unsigned rank, unsigned world) : f_(f), rank_(rank), world_(world) {
    region_ = {f.recv(rank), f.recv_bytes(), 2, 2};
  }
  unsigned rank() const noexcept override { return rank_; }
  unsigned world() const noexcept override { return world_; }
  unsigned lanes() const noexcept override { return 1; }
  Error register_memory(void* addr, size_t len, Region& out) override {
    out = {static_cast<uint8_t*>(addr), len, 1, 1};
    return {};
  }
  const Region& recv_region(unsigned) const noexcept override { return region_; }
  size_t successor_recv_bytes() const noexcept override { return f_.recv_bytes(); }
  Error post_write_imm(unsigned, const Region& src, size_t off, size_t len, size_t remote_off,
                       uint32_t imm, uint64_t wr_id) override {
    return f_.post(rank_, src.addr + off, len, remote_off, imm, wr_id);
  }
  Error poll(Completion* out, unsigned max, unsigned& n, Clock::time_point deadline) override {
    f_.poll(rank_, out, max, n, deadline);
    return {};
  }
  unsigned max_outstanding_writes() const noexcept override { return 1024; }

 private:
  Fabric& f_;
  Region region_{};
  unsigned rank_, world_;
};

struct Outcome {
  std::string error;  // empty: every call of every rank exact
  uint64_t failovers = 0, back_on_ina = 0, frames = 0;
  bool faulted = false;
};

Outcome run_seed(const Params& p) {
  host::CollectiveConfig cc;
  cc.path = Path::ina;
  cc.reason = "failover simulator";
  cc.ring_ids = {kRingId};
  cc.msg_len = p.msg_len;
  cc.pmtu = p.pmtu;
  cc.window = p.window;
  const size_t region = host::recv_region_bytes(cc, p.ranks, 4096 * size_t{p.ranks});

  // Inputs and references, from the seed alone.
  std::mt19937_64 rng(p.seed * 0x9E3779B97F4A7C15ull);
  const size_t es = element_size(p.dtype);
  std::vector<std::vector<std::vector<uint8_t>>> in(p.calls);  // [call][rank]
  std::vector<std::vector<uint8_t>> want(p.calls);
  for (unsigned c = 0; c < p.calls; ++c) {
    std::vector<const uint8_t*> ptrs;
    for (unsigned r = 0; r < p.ranks; ++r) {
      in[c].emplace_back(p.counts[c] * es);
      fill_exact(p.dtype, rng, in[c][r].data(), p.counts[c]);
      ptrs.push_back(in[c][r].data());
    }
    want[c].resize(p.counts[c] * es);
    ref::reduce(static_cast<wire::Dtype>(p.dtype), static_cast<wire::ReduceOp>(p.op), ptrs,
                want[c].size(), want[c].data());
  }

  Outcome out;
  host::LoopbackConfig oob_cfg;  // its exchange stands for the bootstrap connection
  oob_cfg.world = p.ranks;
  oob_cfg.recv_bytes = 64;
  host::LoopbackFabric oob(oob_cfg);
  std::vector<std::string> errors(p.ranks);
  std::vector<uint64_t> failovers(p.ranks), on_ina(p.ranks);
  {
    Fabric fabric(p, region);
    std::vector<std::thread> threads;
    for (unsigned r = 0; r < p.ranks; ++r)
      threads.emplace_back([&, r] {
        SimTransport t(fabric, r, p.ranks);
        std::unique_ptr<host::Collective> coll;
        if (Error e = host::Collective::create(t, cc, coll)) {
          errors[r] = e.message;
          return;
        }
        coll->set_exchange(
            [&oob, r](const std::string& mine, std::vector<std::string>& all,
                      Clock::time_point deadline) { return oob.exchange(r, mine, all, deadline); });
        coll->set_failback(p.failback_calls, nullptr);
        for (unsigned c = 0; c < p.calls && errors[r].empty(); ++c) {
          std::vector<uint8_t> got(want[c].size(), 0xEE);
          const Error e = coll->allreduce(in[c][r].data(), got.data(), p.counts[c], p.dtype, p.op,
                                          Clock::now() + kCallBudget);
          if (!e.ok()) {
            errors[r] = "call " + std::to_string(c) + " failed: " + e.message;
          } else if (got != want[c]) {
            size_t i = 0;
            while (got[i] == want[c][i]) ++i;
            errors[r] = "call " + std::to_string(c) + " (path " + to_string(coll->path()) +
                        ", failovers " + std::to_string(coll->failovers()) + "): element " +
                        std::to_string(i / es) + " differs from the reference";
          }
          if (c + 1 == p.calls) on_ina[r] = coll->path() == Path::ina && coll->failovers() > 0;
        }
        // Leaving: a rank that lost its last result may need this one's.
        if (errors[r].empty())
          if (Error e = coll->close(Clock::now() + kCallBudget)) errors[r] = "close: " + e.message;
        failovers[r] = coll->failovers();
      });
    for (std::thread& th : threads) th.join();
    out.frames = fabric.frames();
    out.faulted = (p.restart_at && out.frames >= p.restart_at) ||
                  (p.bypass_from && out.frames >= p.bypass_from);
    for (unsigned r = 0; r < p.ranks; ++r)  // every rank's, as they may differ
      if (!errors[r].empty())
        out.error +=
            (out.error.empty() ? "" : "\n  ") + ("rank " + std::to_string(r) + ": ") + errors[r];
    if (const int64_t leaked = fabric.stop(); out.error.empty() && leaked != 0)
      out.error = std::to_string(leaked) + " frames leaked";
    if (out.error.empty() && fabric.max_timeouts() > kRcRetries)
      out.error = "a sender met " + std::to_string(fabric.max_timeouts()) +
                  " retransmission timeouts in a row: a real queue pair would have failed";
  }
  out.failovers = failovers[0];
  out.back_on_ina = on_ina[0];
  return out;
}

}  // namespace
}  // namespace netreduce::sim

int main(int argc, char** argv) {
  using namespace netreduce::sim;
  const SeedRange range = seed_range(argc, argv);
  // The library logs each switch of path; only a replay shows them.
  if (!range.replay && !std::getenv("NETREDUCE_SIM_TRACE"))
    (void)std::freopen("/dev/null", "w", stderr);
  const auto t0 = std::chrono::steady_clock::now();
  uint64_t failures = 0, faulted = 0, failed_over = 0, back = 0, frames = 0;
  uint64_t unfaulted_over = 0;  // failed over with no fault: a rank later than the box's wait
  for (uint64_t s = range.first; s < range.first + range.count; ++s) {
    const Params p = random_params(s);
    const Outcome o = run_seed(p);
    if (range.replay || !o.error.empty()) std::printf("%s\n", describe(p).c_str());
    if (!o.error.empty()) {
      std::printf("FAIL: %s\n  replay: NETREDUCE_SIM_SEED=%" PRIu64 " %s\n", o.error.c_str(), s,
                  argv[0]);
      if (++failures >= 5) break;
      continue;
    }
    faulted += o.faulted;
    failed_over += o.faulted && o.failovers > 0;
    unfaulted_over += !o.faulted && o.failovers > 0;
    back += o.faulted && o.back_on_ina;
    frames += o.frames;
  }
  // Not vacuous: with enough seeds, faults landed, calls failed over, and
  // the box was taken back.
  if (range.count >= 100 && failures == 0 &&
      (faulted < range.count / 8 || failed_over < range.count / 16 || back == 0)) {
    std::printf("FAIL: too few faults took effect (%" PRIu64 " faulted, %" PRIu64
                " failed over, %" PRIu64 " back on the box)\n",
                faulted, failed_over, back);
    ++failures;
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("failover sim: %" PRIu64 " seeds from %" PRIu64 " in %.1f s, %" PRIu64
              " failed; %" PRIu64 " frames through the box's position\n",
              range.count, range.first, secs, failures, frames);
  std::printf("  box bypassed or restarted in %" PRIu64 " seeds: %" PRIu64
              " failed over to the ring path, %" PRIu64
              " of them back on the box by their last call; every call of every rank exact\n",
              faulted, failed_over, back);
  std::printf("  %" PRIu64
              " seeds without a fault failed over too: a rank (a thread) later than the box's "
              "wait\n",
              unfaulted_over);
  return failures == 0 ? 0 : 1;
}
