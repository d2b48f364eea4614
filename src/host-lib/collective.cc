#include "host-lib/collective.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#include "reduce/reduce.h"
#include "wire/ina.h"

namespace netreduce::host {

namespace {

constexpr unsigned kPollBatch = 16;

std::string ms_since(Clock::time_point start) {
  return std::to_string(
      std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count());
}

std::string hex(uint32_t v) {
  char b[16];
  std::snprintf(b, sizeof b, "0x%x", v);
  return b;
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
  const unsigned P = transport.world();
  const size_t slot = probe.slot_bytes();
  const size_t local = transport.recv_region().len, remote = transport.successor_recv_bytes();
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
  c->send_buf_ = std::make_unique<Buffer>(size_t{cfg.window} * slot);
  c->work_buf_ = std::make_unique<Buffer>(size_t{P} * std::max<size_t>(c->ring_stride_, 64));
  if (!c->send_buf_->data || !c->work_buf_->data)
    return Error::make(ErrorCode::internal, "out of memory for the send buffers");
  if (Error e = transport.register_memory(c->send_buf_->data, c->send_buf_->len, c->send_mr_))
    return e;
  if (Error e = transport.register_memory(c->work_buf_->data, c->work_buf_->len, c->work_mr_))
    return e;
  out = std::move(c);
  return {};
}

Error Collective::check_args(const void* send, void* recv, size_t count, DataType t, Op op) const {
  if (element_size(t) == 0)
    return Error::make(ErrorCode::invalid_argument,
                       "dtype: " + std::to_string(static_cast<int>(t)) + " is not a data type");
  if (!wire::is_valid_op(static_cast<uint8_t>(op)))
    return Error::make(ErrorCode::invalid_argument,
                       "op: " + std::to_string(static_cast<int>(op)) + " is not sum, min or max");
  if (count > 0 && (send == nullptr || recv == nullptr))
    return Error::make(ErrorCode::invalid_argument,
                       std::string(send == nullptr ? "send" : "recv") + ": null buffer");
  if (count > (size_t{1} << 40) / element_size(t))
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

Error Collective::allreduce(const void* send, void* recv, size_t count, DataType t, Op op,
                            Clock::time_point deadline) {
  return cfg_.path == Path::ina ? ina_allreduce(send, recv, count, t, op, deadline)
                                : ring_allreduce(send, recv, count, t, op, deadline);
}

// ---------------------------------------------------------------- INA path

Error Collective::ina_allreduce(const void* send, void* recv, size_t count, DataType t, Op op,
                                Clock::time_point deadline) {
  if (!failed_.ok())
    return Error::make(failed_.code, "communicator unusable after: " + failed_.message);
  if (Error e = check_args(send, recv, count, t, op)) return e;
  MessagePlan plan;
  if (Error e = make_plan(count, t, cfg_.msg_len, cfg_.pmtu, plan)) return e;
  if (plan.messages == 0) return {};

  const Clock::time_point start = Clock::now();
  const unsigned N = cfg_.window;
  const size_t slot = plan.slot_bytes();
  const uint32_t base = next_msg_id_;
  next_msg_id_ += static_cast<uint32_t>(plan.messages);  // every rank advances alike
  const auto* src = static_cast<const uint8_t*>(send);
  auto* dst = static_cast<uint8_t*>(recv);
  const Region& rr = t_.recv_region();
  const std::string who = "rank " + std::to_string(t_.rank()) + ": ";

  Window w(N);
  w.reset(plan.messages);
  Completion comps[kPollBatch];
  while (!w.finished()) {
    while (w.can_send(w.next_send())) {
      const size_t i = w.next_send();
      const size_t off = (i % N) * slot;
      uint8_t* s = send_buf_->data + off;
      wire::InaInfo info;
      info.dtype = static_cast<uint8_t>(t);
      info.op = static_cast<uint8_t>(op);
      info.ring_id = cfg_.ring_id;
      info.rank = static_cast<uint16_t>(t_.rank());
      info.msg_len = plan.packets(i);
      info.msg_id = base + static_cast<uint32_t>(i);
      wire::ina_encode(info, s);
      std::memcpy(s + kInaHeaderBytes, src + plan.first_elem(i) * plan.esize, plan.data_bytes(i));
      if (Error e = t_.post_write_imm(send_mr_, off, kInaHeaderBytes + plan.data_bytes(i), off,
                                      info.msg_id, i))
        return fail(e);
      (void)w.sent(i);
    }
    unsigned n = 0;
    if (Error e = t_.poll(comps, kPollBatch, n, deadline)) return fail(e);
    if (n == 0) {
      const size_t i = w.done();
      const uint32_t id = base + static_cast<uint32_t>(i);
      std::string what;
      if (w.results_received() <= i)
        what = "result of message id " + std::to_string(id) +
               " not received from predecessor rank " + std::to_string(t_.predecessor()) +
               " (through the box: some rank's message " + std::to_string(id) +
               " has not reached it)";
      if (w.writes_completed() <= i)
        what += std::string(what.empty() ? "" : "; ") + "write of message id " +
                std::to_string(id) + " to successor rank " + std::to_string(t_.successor()) +
                " not acknowledged";
      return fail(Error::make(ErrorCode::timeout,
                              who + "all-reduce (ina path, ring " + std::to_string(cfg_.ring_id) +
                                  ") timed out after " + ms_since(start) + " ms at message " +
                                  std::to_string(i) + " of " + std::to_string(plan.messages) +
                                  ": " + what));
    }
    for (unsigned k = 0; k < n; ++k) {
      const Completion& c = comps[k];
      if (c.kind == Completion::Kind::write_done) {
        if (!c.ok)
          return fail(Error::make(
              ErrorCode::transport,
              who + "write of message id " + std::to_string(base + static_cast<uint32_t>(c.wr_id)) +
                  " to successor rank " + std::to_string(t_.successor()) + " failed (" + c.what +
                  ", status " + std::to_string(c.vendor_status) + ")"));
        if (!w.write_completed(c.wr_id))
          return fail(Error::make(ErrorCode::internal,
                                  who + "write completion out of order (work request " +
                                      std::to_string(c.wr_id) + ")"));
        continue;
      }
      const size_t i = w.results_received();
      const uint32_t id = base + static_cast<uint32_t>(i);
      if (!c.ok)
        return fail(Error::make(ErrorCode::transport,
                                who + "receive of message id " + std::to_string(id) +
                                    " from predecessor rank " + std::to_string(t_.predecessor()) +
                                    " failed (" + c.what + ", status " +
                                    std::to_string(c.vendor_status) + ")"));
      if (c.imm != id || i >= w.next_send())
        return fail(Error::make(ErrorCode::transport,
                                who + "from predecessor rank " + std::to_string(t_.predecessor()) +
                                    ": immediate " + std::to_string(c.imm) + " where message id " +
                                    std::to_string(id) + " was expected" +
                                    (i >= w.next_send() ? " (not sent yet by this rank)" : "")));
      const uint8_t* r = rr.addr + (i % N) * slot;
      const size_t want = kInaHeaderBytes + plan.data_bytes(i);
      const auto hdr = wire::ina_decode(r, c.byte_len);
      if (c.byte_len != want || !hdr || hdr->msg_id != id ||
          hdr->dtype != static_cast<uint8_t>(t) || hdr->op != static_cast<uint8_t>(op) ||
          hdr->ring_id != cfg_.ring_id)
        return fail(Error::make(
            ErrorCode::transport,
            who + "message id " + std::to_string(id) + " from predecessor rank " +
                std::to_string(t_.predecessor()) + " has a wrong INA header or length (" +
                std::to_string(c.byte_len) + " bytes, expected " + std::to_string(want) + ")"));
      std::memcpy(dst + plan.first_elem(i) * plan.esize, r + kInaHeaderBytes, plan.data_bytes(i));
      (void)w.result_received(i);
    }
  }
  return {};
}

// --------------------------------------------------------------- ring path

Error Collective::ring_allreduce(const void* send, void* recv, size_t count, DataType t, Op op,
                                 Clock::time_point deadline) {
  if (!failed_.ok())
    return Error::make(failed_.code, "communicator unusable after: " + failed_.message);
  if (Error e = check_args(send, recv, count, t, op)) return e;
  const size_t es = element_size(t);
  const unsigned P = t_.world(), r = t_.rank();
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
  const size_t chunk_max = ring_stride_ / es;
  const size_t seg_max = size_t{P} * chunk_max;
  const auto* src = static_cast<const uint8_t*>(send);
  auto* dst = static_cast<uint8_t*>(recv);
  uint8_t* work = work_buf_->data;
  const std::string who = "rank " + std::to_string(r) + ": ";

  for (size_t seg_first = 0; seg_first < count;) {
    const size_t n = std::min(count - seg_first, seg_max);
    std::memcpy(work, src + seg_first * es, n * es);
    const uint32_t tag = seg_seq_ & 0xFFFFFF;
    const size_t half = (seg_seq_ & 1) * steps;
    for (unsigned s = 0; s < steps; ++s) {
      const RingStep st = ring_step(r, P, s);
      const ChunkRange sc = ring_chunk(n, P, st.send_chunk);
      const ChunkRange rc = ring_chunk(n, P, st.recv_chunk);
      const uint32_t imm = tag << 8 | s;
      if (Error e = t_.post_write_imm(work_mr_, sc.first * es, sc.count * es,
                                      (half + s) * ring_stride_, imm, imm))
        return fail(e);
      bool wrote = false, got = false;
      while (!wrote || !got) {
        Completion c;
        unsigned nc = 1;
        if (!got && !early_.empty()) {  // the predecessor's write arrived while we waited
          c = early_.front();
          early_.pop_front();
        } else if (Error e = t_.poll(&c, 1, nc, deadline)) {
          return fail(e);
        }
        if (nc == 1 && c.ok && c.kind == Completion::Kind::recv_imm && got) {
          early_.push_back(c);  // the predecessor is a step ahead: keep it for the next step
          continue;
        }
        const std::string where = "message id " + hex(imm) + " (segment " + std::to_string(tag) +
                                  ", step " + std::to_string(s) + " of " + std::to_string(steps) +
                                  (st.reduce ? ", reduce-scatter" : ", all-gather") + ")";
        if (nc == 0) {
          std::string what;
          if (!got)
            what = "chunk " + std::to_string(st.recv_chunk) +
                   " not received from predecessor rank " + std::to_string(t_.predecessor());
          if (!wrote)
            what += std::string(what.empty() ? "" : "; ") + "write of chunk " +
                    std::to_string(st.send_chunk) + " to successor rank " +
                    std::to_string(t_.successor()) + " not acknowledged";
          return fail(Error::make(ErrorCode::timeout,
                                  who + "all-reduce (ring path) timed out after " +
                                      ms_since(start) + " ms at " + where + ": " + what));
        }
        if (!c.ok)
          return fail(Error::make(
              ErrorCode::transport,
              who +
                  (c.kind == Completion::Kind::write_done
                       ? "write to successor rank " + std::to_string(t_.successor())
                       : "receive from predecessor rank " + std::to_string(t_.predecessor())) +
                  " failed at " + where + " (" + c.what + ", status " +
                  std::to_string(c.vendor_status) + ")"));
        if (c.kind == Completion::Kind::write_done) {
          if (c.wr_id != imm || wrote)
            return fail(
                Error::make(ErrorCode::internal, who + "unexpected write completion at " + where));
          wrote = true;
          continue;
        }
        if (c.imm != imm || got || c.byte_len != rc.count * es)
          return fail(Error::make(
              ErrorCode::transport,
              who + "from predecessor rank " + std::to_string(t_.predecessor()) + ": immediate " +
                  hex(c.imm) + " with " + std::to_string(c.byte_len) + " bytes where " + where +
                  " with " + std::to_string(rc.count * es) + " bytes was expected"));
        got = true;
        const uint8_t* in = t_.recv_region().addr + (half + s) * ring_stride_;
        uint8_t* own = work + rc.first * es;
        if (st.reduce) {
          const uint8_t* srcs[2] = {in, own};  // op(received, own): the ring order
          reduce_fn(srcs, 2, own, rc.count);
        } else if (rc.count > 0) {
          std::memcpy(own, in, rc.count * es);
        }
      }
    }
    std::memcpy(dst + seg_first * es, work, n * es);
    seg_first += n;
    ++seg_seq_;
  }
  return {};
}

Error probe_box(Collective& c, unsigned rank, unsigned world, Clock::time_point deadline,
                bool& confirmed, std::string& reason) {
  confirmed = false;
  const int32_t mine = static_cast<int32_t>(rank) + 1;
  int32_t got = 0;
  if (Error e = c.ina_allreduce(&mine, &got, 1, DataType::int32, Op::sum, deadline)) return e;
  const int32_t want = static_cast<int32_t>(world * (world + 1) / 2);
  confirmed = got == want;
  if (!confirmed)
    reason = "probe all-reduce gave " + std::to_string(got) + " instead of " +
             std::to_string(want) + ": the box is not on the path between the ranks";
  return {};
}

}  // namespace netreduce::host
