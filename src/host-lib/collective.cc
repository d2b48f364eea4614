#include "host-lib/collective.h"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <string>

#include "reduce/reduce.h"
#include "wire/icrc.h"
#include "wire/ina.h"

namespace netreduce::host {

namespace {

// The work request id of a stop notice (a zero-length WRITE WITH IMM to the
// successor); message indices never reach it.
constexpr uint64_t kStopWrId = ~uint64_t{0};

std::string ms_since(Clock::time_point start) {
  return std::to_string(
      std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count());
}

std::string hex(uint32_t v) {
  char b[16];
  std::snprintf(b, sizeof b, "0x%x", v);
  return b;
}

// A completion must belong to one of the communicator's rings (a transport
// that says otherwise is broken).
Error check_lane(const Completion& c, unsigned rings, const std::string& who) {
  if (c.lane < rings) return {};
  return Error::make(ErrorCode::internal, who + "completion of lane " + std::to_string(c.lane) +
                                              " of a communicator with " + std::to_string(rings) +
                                              " rings");
}

}  // namespace

struct Collective::Buffer {
  explicit Buffer(size_t n) : len(std::max<size_t>(n, 64)) {
    data = static_cast<uint8_t*>(std::aligned_alloc(4096, (len + 4095) / 4096 * 4096));
    if (data) std::memset(data, 0, len);
  }
  ~Buffer() { std::free(data); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  uint8_t* data = nullptr;
  size_t len;
};

size_t recv_region_bytes(const CollectiveConfig& cfg, unsigned /*world*/,
                         size_t ring_buffer_bytes) {
  return std::max(size_t{cfg.window} * cfg.msg_len * cfg.pmtu, ring_buffer_bytes);
}

Collective::Collective(Transport& t, const CollectiveConfig& cfg) : t_(t), cfg_(cfg) {}
Collective::~Collective() = default;

Error Collective::create(Transport& transport, const CollectiveConfig& cfg,
                         std::unique_ptr<Collective>& out) {
  std::unique_ptr<Collective> c(new Collective(transport, cfg));
  MessagePlan probe;
  if (Error e = make_plan(0, DataType::fp32, cfg.msg_len, cfg.pmtu, probe)) return e;
  if (cfg.window < 1 || cfg.window > 1024)
    return Error::make(ErrorCode::invalid_argument,
                       "window: " + std::to_string(cfg.window) + " is outside 1..1024");
  const unsigned R = transport.lanes();
  if (Error e = check_rings(R)) return e;
  if (cfg.path == Path::ina && cfg.ring_ids.size() != R)
    return Error::make(ErrorCode::invalid_argument,
                       "rings: " + std::to_string(cfg.ring_ids.size()) + " ring ids for " +
                           std::to_string(R) + " rings");
  const unsigned P = transport.world();
  const size_t slot = probe.slot_bytes();
  const size_t local = transport.recv_region(0).len, remote = transport.successor_recv_bytes();
  if (local != remote)
    return Error::make(ErrorCode::invalid_argument,
                       "ring_buffer_bytes: this rank's receive region (" + std::to_string(local) +
                           " bytes) differs from successor rank " +
                           std::to_string(transport.successor()) + "'s (" + std::to_string(remote) +
                           "): every rank needs the same options");
  if (cfg.path == Path::ina && local < size_t{cfg.window} * slot)
    return Error::make(ErrorCode::invalid_argument, "window: " + std::to_string(cfg.window) +
                                                        " messages of " + std::to_string(slot) +
                                                        " bytes do not fit the receive region");
  if (P > 1) {
    c->ring_stride_ = local / (4 * size_t{P - 1}) / 64 * 64;
    if (c->ring_stride_ < 64)
      return Error::make(ErrorCode::invalid_argument,
                         "ring_buffer_bytes: " + std::to_string(local) + " is too small for " +
                             std::to_string(P) + " ranks (needs at least " +
                             std::to_string(256 * (P - 1)) + ")");
  }
  c->rings_.resize(R);
  c->path_.store(cfg.path);
  c->reasons_.push_back(cfg.reason);
  c->stage_.resize(slot);
  c->send_ring_bytes_ = size_t{cfg.window} * slot;
  c->work_ring_bytes_ = size_t{P} * std::max<size_t>(c->ring_stride_, 64);
  if (cfg.path == Path::ina) c->tail_bytes_.resize(R * c->send_ring_bytes_);  // failover's
  c->send_buf_ = std::make_unique<Buffer>(R * c->send_ring_bytes_);
  c->work_buf_ = std::make_unique<Buffer>(R * c->work_ring_bytes_);
  if (!c->send_buf_->data || !c->work_buf_->data)
    return Error::make(ErrorCode::internal, "out of memory for the send buffers");
  if (Error e = transport.register_memory(c->send_buf_->data, c->send_buf_->len, c->send_mr_))
    return e;
  if (Error e = transport.register_memory(c->work_buf_->data, c->work_buf_->len, c->work_mr_))
    return e;
  out = std::move(c);
  return {};
}

Error Collective::check_dtype(DataType t) {
  if (element_size(t) == 0)
    return Error::make(ErrorCode::invalid_argument,
                       "dtype: " + std::to_string(static_cast<int>(t)) + " is not a data type");
  return {};
}

Error Collective::check_op(Op op) {
  if (!wire::is_valid_op(static_cast<uint8_t>(op)))
    return Error::make(ErrorCode::invalid_argument,
                       "op: " + std::to_string(static_cast<int>(op)) + " is not sum, min or max");
  return {};
}

Error Collective::check_args(const void* send, void* recv, size_t count, DataType t, Op op) {
  if (Error e = check_dtype(t)) return e;
  if (Error e = check_op(op)) return e;
  if (count > 0 && (send == nullptr || recv == nullptr))
    return Error::make(ErrorCode::invalid_argument,
                       std::string(send == nullptr ? "send" : "recv") + ": null buffer");
  if (count > kMaxCallBytes / element_size(t))
    return Error::make(ErrorCode::invalid_argument,
                       "count: " + std::to_string(count) + " elements is too large");
  if (count > 0 && send != recv) {
    const auto* s = static_cast<const uint8_t*>(send);
    const auto* r = static_cast<const uint8_t*>(recv);
    const size_t bytes = count * element_size(t);
    if (s < r + bytes && r < s + bytes)
      return Error::make(ErrorCode::invalid_argument,
                         "recv: overlaps send without being the same buffer");
  }
  return {};
}

Error Collective::fail(Error e) {
  if (e.code == ErrorCode::timeout || e.code == ErrorCode::transport ||
      e.code == ErrorCode::internal)
    failed_ = e;
  return e;
}

std::string Collective::ring_name(unsigned i, const StripeRange& s, size_t esize) const {
  std::string n = "ring " + std::to_string(i) + " of " + std::to_string(rings()) + " (";
  if (cfg_.ring_id(i) != 0) n += "id " + std::to_string(cfg_.ring_id(i)) + ", ";
  return n + "stripe bytes [" + std::to_string(s.first * esize) + ", " +
         std::to_string((s.first + s.count) * esize) + "))";
}

std::string Collective::ring_tag(unsigned i, const StripeRange& s, size_t esize) const {
  return rings() > 1 ? ring_name(i, s, esize) + ": " : std::string();
}

// ---------------------------------------------------------------- INA path

Error Collective::ina_allreduce(const void* send, void* recv, size_t count, DataType t, Op op,
                                Clock::time_point deadline) {
  last_ = {};
  if (!failed_.ok())
    return Error::make(failed_.code, "communicator unusable after: " + failed_.message);
  if (Error e = check_args(send, recv, count, t, op)) return e;
  const unsigned R = rings();
  const size_t es = element_size(t);
  // One stripe per ring: its plan, window and first message id.
  struct Stripe {
    StripeRange s;
    MessagePlan plan;
    Window w;
    uint32_t base = 0;
    uint32_t copied = 0, received = 0;  // messages copied out, receives completed
  };
  std::array<Stripe, kMaxRings> st;
  pending_.insert(pending_.end(), next_call_.begin(), next_call_.end());
  next_call_.clear();
  size_t total = 0;
  for (unsigned g = 0; g < R; ++g) {
    Stripe& k = st[g];
    k.s = stripe(count, R, g);
    if (Error e = make_plan(k.s.count, t, cfg_.msg_len, cfg_.pmtu, k.plan)) return e;
    k.w = Window(cfg_.window);
    k.w.reset(k.plan.messages);
    k.base = rings_[g].next_msg_id;
    rings_[g].next_msg_id += static_cast<uint32_t>(k.plan.messages);  // every rank alike
    total += k.plan.messages;
  }
  if (total == 0) return {};

  const Clock::time_point start = Clock::now();
  const unsigned N = cfg_.window;
  const size_t slot = st[0].plan.slot_bytes();
  const auto* src = static_cast<const uint8_t*>(send);
  auto* dst = static_cast<uint8_t*>(recv);
  const std::string who = "rank " + std::to_string(t_.rank()) + ": ";

  // Data no box sealed (a failed seal; with failover on also a raw write
  // ahead of this rank or a wrong header) ends the call once what is in
  // flight is back (no new message is sent). Without failover that is
  // every result of what this rank sent: the transport is then as quiet as
  // after a call that succeeded (the probe's ring path goes on over it).
  // With failover, the predecessor may have sent more or fewer messages
  // than this rank: only this rank's writes are awaited here, the receives
  // once the ranks have agreed (failover.cc). And a rank that stops tells
  // its successor at once, with a stop notice on every ring (a zero-length
  // WRITE WITH IMM, which no INA message is): the successor, maybe waiting
  // for a message this rank will not send, stops too and passes it on, so
  // every rank reaches the agreement without waiting for its deadline.
  Error unsealed;
  const bool failover = static_cast<bool>(exchange_);
  std::array<uint8_t, kMaxRings> stop{};  // per ring: 0 none, 1 notice sent, 2 acknowledged
  // A notice carries its call's number (the immediate). One of the next
  // call: the predecessor completed this one and stopped that. One of the
  // previous call, which this rank completed and whose tail it keeps: the
  // predecessor lost results of it, which the agreement gives it from the
  // tails. Any other: no agreement can finish the calls, and this rank says
  // so in its report.
  const uint32_t call_tag = static_cast<uint32_t>(calls_);
  const bool have_tail = tail_.call != 0 && tail_.call + 1 == calls_;
  bool foreign_stop = false;
  const auto drained = [&](unsigned g) {
    const Window& w = st[g].w;
    return w.writes_completed() == w.next_send() && stop[g] != 1 &&
           (failover || w.results_received() == w.next_send());
  };
  const auto record = [&](bool recoverable) {
    for (unsigned g = 0; g < R; ++g) {
      last_.base[g] = st[g].base;
      last_.copied[g] = st[g].copied;
      last_.sent[g] = static_cast<uint32_t>(st[g].w.next_send()) + (stop[g] != 0 ? 1 : 0);
      last_.received[g] = st[g].received;
    }
    // Receives taken but kept for the next call, or not read yet, arrived too.
    for (const auto* q : {&pending_, &next_call_})
      for (const Completion& c : *q)
        if (c.lane < R) ++last_.received[c.lane];
    last_.recoverable = recoverable && !foreign_stop;
  };
  // The first cause ends the call; with failover, the stop notices go out.
  const auto halt = [&](Error e) -> Error {
    if (!unsealed.ok()) return {};
    unsealed = std::move(e);
    for (unsigned g = 0; failover && g < R; ++g) {
      // Only where the send queue has room (a full window leaves none): the
      // successor then learns at its deadline.
      const Window& w = st[g].w;
      if (w.next_send() - w.writes_completed() >= t_.max_outstanding_writes()) continue;
      if (Error x = t_.post_write_imm(g, send_mr_, 0, 0, 0, call_tag, kStopWrId)) return x;
      stop[g] = 1;
    }
    return {};
  };
  Completion comps[kPollBatch];
  for (;;) {
    bool finished = true;
    for (unsigned g = 0; g < R; ++g) {
      Stripe& k = st[g];
      while (unsealed.ok() && k.w.can_send(k.w.next_send())) {
        const size_t i = k.w.next_send();
        const size_t remote = (i % N) * slot;
        const size_t off = g * send_ring_bytes_ + remote;
        uint8_t* s = send_buf_->data + off;
        wire::InaInfo info;
        info.dtype = static_cast<uint8_t>(t);
        info.op = static_cast<uint8_t>(op);
        info.ring_id = cfg_.ring_id(g);
        info.rank = static_cast<uint16_t>(t_.rank());
        info.msg_len = k.plan.packets(i);
        info.msg_id = k.base + static_cast<uint32_t>(i);
        wire::ina_encode(info, s);
        std::memcpy(s + kInaHeaderBytes, src + (k.s.first + k.plan.first_elem(i)) * es,
                    k.plan.data_bytes(i));
        if (Error e = t_.post_write_imm(g, send_mr_, off, kInaHeaderBytes + k.plan.data_bytes(i),
                                        remote, info.msg_id, i))
          return fail(e);
        (void)k.w.sent(i);
      }
      finished = finished && (unsealed.ok() ? k.w.finished() : drained(g));
    }
    if (finished) {
      record(!unsealed.ok());
      if (!unsealed.ok()) return fail(unsealed);
      if (failover) keep_tail(recv, count, t, op);
      return {};
    }
    unsigned n = 0;
    while (n < kPollBatch && !pending_.empty()) {
      comps[n++] = pending_.front();
      pending_.pop_front();
    }
    if (n == 0)
      if (Error e = t_.poll(comps, kPollBatch, n, deadline)) return fail(e);
    if (n == 0) {
      // Results missing with every write of this rank acknowledged: a
      // predecessor that stopped sending (it met raw data); the transport is
      // sound, so failover may finish the call. Writes missing: it is not.
      bool writes_back = true;
      for (unsigned g = 0; g < R; ++g)
        writes_back =
            writes_back && st[g].w.writes_completed() == st[g].w.next_send() && stop[g] != 1;
      record(failover && writes_back);
      if (!unsealed.ok()) return fail(unsealed);  // the first cause, not the drain's timeout
      std::string what;
      for (unsigned g = 0; g < R; ++g) {
        const Stripe& k = st[g];
        if (k.w.finished()) continue;
        const size_t i = k.w.done();
        const uint32_t id = k.base + static_cast<uint32_t>(i);
        std::string miss;
        if (k.w.results_received() <= i)
          miss = "result of message id " + std::to_string(id) +
                 " not received from predecessor rank " + std::to_string(t_.predecessor()) +
                 " (through the box: some rank's message " + std::to_string(id) +
                 " has not reached it)";
        if (k.w.writes_completed() <= i)
          miss += std::string(miss.empty() ? "" : "; ") + "write of message id " +
                  std::to_string(id) + " to successor rank " + std::to_string(t_.successor()) +
                  " not acknowledged";
        const std::string at =
            "at message " + std::to_string(i) + " of " + std::to_string(k.plan.messages) + ": ";
        what += R == 1 ? at + miss
                       : std::string(what.empty() ? "" : "; ") + ring_name(g, k.s, es) + " " + at +
                             miss;
      }
      // One ring: "(ina path, ring <id>) ... at message i of n: ...", no stripe named.
      return fail(Error::make(ErrorCode::timeout,
                              who + "all-reduce (ina path, " +
                                  (R == 1 ? "ring " + std::to_string(cfg_.ring_id(0)) +
                                                ") timed out after " + ms_since(start) + " ms "
                                          : std::to_string(R) + " rings) timed out after " +
                                                ms_since(start) + " ms: ") +
                                  what));
    }
    for (unsigned c_i = 0; c_i < n; ++c_i) {
      const Completion& c = comps[c_i];
      if (Error e = check_lane(c, R, who)) return fail(e);
      Stripe& k = st[c.lane];
      const auto ring = [&] { return ring_tag(c.lane, k.s, es); };  // errors only
      if (c.kind == Completion::Kind::write_done && c.wr_id == kStopWrId) {
        if (!c.ok) {
          record(false);
          return fail(Error::make(ErrorCode::transport,
                                  who + ring() + "stop notice to successor rank " +
                                      std::to_string(t_.successor()) + " failed (" + c.what +
                                      ", status " + std::to_string(c.vendor_status) + ")"));
        }
        stop[c.lane] = 2;
        continue;
      }
      if (c.kind == Completion::Kind::write_done) {
        if (!c.ok)
          return fail(Error::make(ErrorCode::transport,
                                  who + ring() + "write of message id " +
                                      std::to_string(k.base + static_cast<uint32_t>(c.wr_id)) +
                                      " to successor rank " + std::to_string(t_.successor()) +
                                      " failed (" + c.what + ", status " +
                                      std::to_string(c.vendor_status) + ")"));
        if (!k.w.write_completed(c.wr_id))
          return fail(Error::make(ErrorCode::internal,
                                  who + ring() + "write completion out of order (work request " +
                                      std::to_string(c.wr_id) + ")"));
        continue;
      }
      const size_t i = k.w.results_received();
      const uint32_t id = k.base + static_cast<uint32_t>(i);
      // Every result of this ring is in and only ACKs are awaited: a write
      // past the call, or a stop notice of the next call, is the next
      // call's (the predecessor finished this one), not raw data of this.
      if (c.ok && i >= k.plan.messages &&
          (c.byte_len != 0 || (failover && c.imm == call_tag + 1))) {
        next_call_.push_back(c);
        continue;
      }
      if (!c.ok) {
        record(false);
        return fail(Error::make(ErrorCode::transport,
                                who + ring() + "receive of message id " + std::to_string(id) +
                                    " from predecessor rank " + std::to_string(t_.predecessor()) +
                                    " failed (" + c.what + ", status " +
                                    std::to_string(c.vendor_status) + ")"));
      }
      ++k.received;
      // Raw data, not the box's: ends the call (with failover, once this
      // rank's writes are back; without, at once).
      const auto raw = [&](Error e) -> Error {
        if (!failover) {
          record(false);
          return fail(std::move(e));
        }
        if (Error x = halt(std::move(e))) {
          record(false);
          return fail(x);
        }
        return {};
      };
      if (failover && c.byte_len == 0) {  // the predecessor's stop notice
        const std::string pred = "predecessor rank " + std::to_string(t_.predecessor());
        std::string why;
        if (c.imm == call_tag)
          why = pred + " stopped the call (it met data no box sealed)";
        else if (c.imm == call_tag + 1)
          why = pred + " completed this call and stopped the next (it met data no box sealed)";
        else if (c.imm + 1 == call_tag && have_tail)
          why = pred + " stopped all-reduce call " + std::to_string(c.imm) +
                ", which this rank completed: the box was lost between the ranks' last results";
        else {
          why = pred + " stopped all-reduce call " + std::to_string(c.imm) +
                ", which this rank cannot finish with it";
          foreign_stop = true;
        }
        if (Error e = raw(Error::make(ErrorCode::transport, who + ring() + why))) return e;
        continue;
      }
      if (i >= k.w.next_send()) {
        if (!unsealed.ok()) continue;  // draining: the predecessor was ahead
        if (Error e = raw(Error::make(ErrorCode::transport,
                                      who + ring() + "from predecessor rank " +
                                          std::to_string(t_.predecessor()) + ": immediate " +
                                          hex(c.imm) + " for message id " + std::to_string(id) +
                                          ", not sent yet by this rank (the "
                                          "predecessor's raw write: box bypassed?)")))
          return e;
        continue;
      }
      const uint8_t* r = t_.recv_region(c.lane).addr + (i % N) * slot;
      const size_t want = kInaHeaderBytes + k.plan.data_bytes(i);
      const auto hdr = wire::ina_decode(r, c.byte_len);
      if (!unsealed.ok()) {
        (void)k.w.result_received(i);  // draining: nothing more is copied out
        continue;
      }
      if (c.byte_len != want || !hdr || hdr->msg_id != id ||
          hdr->dtype != static_cast<uint8_t>(t) || hdr->op != static_cast<uint8_t>(op) ||
          hdr->ring_id != cfg_.ring_id(c.lane)) {
        if (Error e = raw(Error::make(
                ErrorCode::transport,
                who + ring() + "message id " + std::to_string(id) + " from predecessor rank " +
                    std::to_string(t_.predecessor()) + " has a wrong INA header or length (" +
                    std::to_string(c.byte_len) + " bytes, expected " + std::to_string(want) + ")")))
          return e;
        (void)k.w.result_received(i);
        continue;
      }
      // The box's seal (docs/design.md#result-digests), checked on a
      // private copy: a bypassed box lets the predecessor's raw write of a
      // later message land in this slot at any moment, so the slot is read
      // once, and the caller gets exactly the bytes the CRC covered, or
      // nothing.
      const size_t bytes = k.plan.data_bytes(i);
      std::memcpy(stage_.data(), r + kInaHeaderBytes, bytes);
      const uint32_t crc = wire::crc32(0, stage_.data(), bytes);
      if ((c.imm ^ crc) == id) {
        std::memcpy(dst + (k.s.first + k.plan.first_elem(i)) * es, stage_.data(), bytes);
        ++k.copied;
      } else {
        failed_seal_ = true;
        Error e = Error::make(
            ErrorCode::transport,
            who + ring() + "message id " + std::to_string(id) + " from predecessor rank " +
                std::to_string(t_.predecessor()) + " fails the box's seal (immediate " +
                hex(c.imm) + ", data crc32 " + hex(crc) +
                "): no box reduced it from every rank (bypassed or restarted on the path?)");
        if (Error x = halt(std::move(e))) {
          record(false);
          return fail(x);
        }
      }
      (void)k.w.result_received(i);
    }
  }
}

// --------------------------------------------------------------- ring path

Error Collective::ring_allreduce(const void* send, void* recv, size_t count, DataType t, Op op,
                                 Clock::time_point deadline) {
  if (!failed_.ok())
    return Error::make(failed_.code, "communicator unusable after: " + failed_.message);
  if (Error e = check_args(send, recv, count, t, op)) return e;
  const size_t es = element_size(t);
  const unsigned P = t_.world(), r = t_.rank(), R = rings();
  if (count == 0) return {};
  if (P == 1) {
    std::memmove(recv, send, count * es);
    return {};
  }
  const reduce::ReduceFn reduce_fn =
      reduce::kernels(reduce::best_isa(), static_cast<wire::Dtype>(t),
                      static_cast<wire::ReduceOp>(op))
          .reduce;
  const Clock::time_point start = Clock::now();
  const unsigned steps = ring_steps(P);
  const size_t seg_max = size_t{P} * (ring_stride_ / es);
  const auto* src = static_cast<const uint8_t*>(send);
  auto* dst = static_cast<uint8_t*>(recv);
  const std::string who = "rank " + std::to_string(r) + ": ";

  // Each ring's place in its stripe: the segment, the step, and which of the
  // step's two completions (own write, predecessor's write) it has.
  struct Stripe {
    StripeRange s;
    uint8_t* work = nullptr;
    size_t work_off = 0;   // of `work` in work_mr_
    size_t seg_first = 0;  // element offset of the segment in the stripe
    size_t n = 0;          // elements in the segment
    uint32_t tag = 0;
    size_t half = 0;
    unsigned step = 0;
    bool wrote = false, got = false, done = false;
    uint32_t imm() const noexcept { return tag << 8 | step; }
  };
  std::array<Stripe, kMaxRings> st;

  const auto where = [&](const Stripe& k) {
    const RingStep rs = ring_step(r, P, k.step);
    return "message id " + hex(k.imm()) + " (segment " + std::to_string(k.tag) + ", step " +
           std::to_string(k.step) + " of " + std::to_string(steps) +
           (rs.reduce ? ", reduce-scatter" : ", all-gather") + ")";
  };
  const auto start_segment = [&](Stripe& k, unsigned g) {
    k.n = std::min(k.s.count - k.seg_first, seg_max);
    std::memcpy(k.work, src + (k.s.first + k.seg_first) * es, k.n * es);
    k.tag = rings_[g].seg_seq & 0xFFFFFF;
    k.half = (rings_[g].seg_seq & 1) * steps;
    k.step = 0;
  };
  // The predecessor's write of the current step: check it, reduce or store.
  const auto receive = [&](Stripe& k, unsigned g, const Completion& c) -> Error {
    const RingStep rs = ring_step(r, P, k.step);
    const ChunkRange rc = ring_chunk(k.n, P, rs.recv_chunk);
    if (c.imm != k.imm() || c.byte_len != rc.count * es)
      return Error::make(ErrorCode::transport,
                         who + ring_tag(g, k.s, es) + "from predecessor rank " +
                             std::to_string(t_.predecessor()) + ": immediate " + hex(c.imm) +
                             " with " + std::to_string(c.byte_len) + " bytes where " + where(k) +
                             " with " + std::to_string(rc.count * es) + " bytes was expected");
    k.got = true;
    const uint8_t* in = t_.recv_region(g).addr + (k.half + k.step) * ring_stride_;
    uint8_t* own = k.work + rc.first * es;
    if (rs.reduce) {
      const uint8_t* srcs[2] = {in, own};  // op(received, own): the ring order
      reduce_fn(srcs, 2, own, rc.count);
    } else if (rc.count > 0) {
      std::memcpy(own, in, rc.count * es);
    }
    return {};
  };
  // Posts the current step's write, and takes its receive if it came early.
  const auto begin_step = [&](Stripe& k, unsigned g) -> Error {
    const RingStep rs = ring_step(r, P, k.step);
    const ChunkRange sc = ring_chunk(k.n, P, rs.send_chunk);
    k.wrote = k.got = false;
    if (Error e = t_.post_write_imm(g, work_mr_, k.work_off + sc.first * es, sc.count * es,
                                    (k.half + k.step) * ring_stride_, k.imm(), k.imm()))
      return e;
    auto& early = rings_[g].early;
    if (early.empty()) return {};
    const Completion c = early.front();
    early.pop_front();
    return receive(k, g, c);
  };
  // After a completion: while the step has both, move on (next step, next
  // segment, or the stripe is done).
  const auto advance = [&](Stripe& k, unsigned g) -> Error {
    while (!k.done && k.wrote && k.got) {
      if (++k.step == steps) {
        std::memcpy(dst + (k.s.first + k.seg_first) * es, k.work, k.n * es);
        k.seg_first += k.n;
        ++rings_[g].seg_seq;
        if (k.seg_first >= k.s.count) {
          k.done = true;
          break;
        }
        start_segment(k, g);
      }
      if (Error e = begin_step(k, g)) return e;
    }
    return {};
  };

  for (unsigned g = 0; g < R; ++g) {
    Stripe& k = st[g];
    k.s = stripe(count, R, g);
    k.work_off = g * work_ring_bytes_;
    k.work = work_buf_->data + k.work_off;
    if (k.s.count == 0) {
      k.done = true;
      continue;
    }
    start_segment(k, g);
    if (Error e = begin_step(k, g)) return fail(e);
  }
  Completion comps[kPollBatch];
  for (;;) {
    bool finished = true;
    for (unsigned g = 0; g < R; ++g) finished = finished && st[g].done;
    if (finished) return {};
    unsigned n = 0;
    if (Error e = t_.poll(comps, kPollBatch, n, deadline)) return fail(e);
    if (n == 0) {
      std::string what;
      for (unsigned g = 0; g < R; ++g) {
        const Stripe& k = st[g];
        if (k.done) continue;
        const RingStep rs = ring_step(r, P, k.step);
        std::string miss;
        if (!k.got)
          miss = "chunk " + std::to_string(rs.recv_chunk) + " not received from predecessor rank " +
                 std::to_string(t_.predecessor());
        if (!k.wrote)
          miss += std::string(miss.empty() ? "" : "; ") + "write of chunk " +
                  std::to_string(rs.send_chunk) + " to successor rank " +
                  std::to_string(t_.successor()) + " not acknowledged";
        what += R == 1 ? "at " + where(k) + ": " + miss
                       : std::string(what.empty() ? "" : "; ") + ring_name(g, k.s, es) + " at " +
                             where(k) + ": " + miss;
      }
      // One ring: "(ring path) ... at message id ...: ...", no stripe named.
      return fail(Error::make(ErrorCode::timeout,
                              who + "all-reduce (ring path" +
                                  (R == 1 ? ") timed out after " + ms_since(start) + " ms "
                                          : ", " + std::to_string(R) + " rings) timed out after " +
                                                ms_since(start) + " ms: ") +
                                  what));
    }
    for (unsigned c_i = 0; c_i < n; ++c_i) {
      const Completion& c = comps[c_i];
      if (Error e = check_lane(c, R, who)) return fail(e);
      Stripe& k = st[c.lane];
      if (c.ok && c.kind == Completion::Kind::recv_imm && (k.done || k.got)) {
        rings_[c.lane].early.push_back(c);  // the predecessor is ahead: keep it for its step
        continue;
      }
      const auto ring = [&] { return ring_tag(c.lane, k.s, es); };  // errors only
      if (!c.ok)
        return fail(Error::make(
            ErrorCode::transport,
            who + ring() +
                (c.kind == Completion::Kind::write_done
                     ? "write to successor rank " + std::to_string(t_.successor())
                     : "receive from predecessor rank " + std::to_string(t_.predecessor())) +
                " failed" + (k.done ? std::string() : " at " + where(k)) + " (" + c.what +
                ", status " + std::to_string(c.vendor_status) + ")"));
      if (c.kind == Completion::Kind::write_done) {
        if (k.done || c.wr_id != k.imm() || k.wrote)
          return fail(
              Error::make(ErrorCode::internal, who + ring() + "unexpected write completion" +
                                                   (k.done ? std::string() : " at " + where(k))));
        k.wrote = true;
      } else if (Error e = receive(k, c.lane, c)) {
        return fail(e);
      }
      if (Error e = advance(k, c.lane)) return fail(e);
    }
  }
}

Error probe_box(Collective& c, unsigned rank, unsigned world, Clock::time_point deadline,
                bool& confirmed, std::string& reason) {
  confirmed = false;
  const unsigned R = c.rings();
  std::array<int32_t, kMaxRings> mine{}, got{};
  mine.fill(static_cast<int32_t>(rank) + 1);
  if (Error e = c.ina_allreduce(mine.data(), got.data(), R, DataType::int32, Op::sum, deadline)) {
    if (!c.failed_seal()) return e;
    reason = e.message;  // no sealing box on the path: the ring path, said why
    return {};
  }
  const int32_t want = static_cast<int32_t>(world * (world + 1) / 2);
  for (unsigned g = 0; g < R; ++g) {
    if (got[g] == want) continue;
    reason = "probe all-reduce gave " + std::to_string(got[g]) + " instead of " +
             std::to_string(want) +
             (R > 1 ? " on ring " + std::to_string(g) + " (id " +
                          std::to_string(c.config().ring_id(g)) + ")"
                    : std::string()) +
             ": the box is not on the path between the ranks";
    return {};
  }
  confirmed = true;
  return {};
}

}  // namespace netreduce::host
