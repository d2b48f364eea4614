#include "host-lib/collective.h"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <string>

#include "host-lib/call_text.h"
#include "reduce/reduce.h"
#include "wire/ina.h"

namespace netreduce::host {

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
