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

size_t ina_slots_bytes(const CollectiveConfig& cfg) {
  return (size_t{cfg.window} * cfg.msg_len * cfg.pmtu + 63) / 64 * 64;
}

size_t recv_region_bytes(const CollectiveConfig& cfg, unsigned /*world*/,
                         size_t ring_buffer_bytes) {
  return ina_slots_bytes(cfg) + ring_buffer_bytes;
}

Collective::Collective(Transport& t, const CollectiveConfig& cfg) : t_(t), cfg_(cfg) {}
Collective::~Collective() = default;

Error Collective::create(Transport& transport, const CollectiveConfig& cfg,
                         std::unique_ptr<Collective>& out) {
  std::unique_ptr<Collective> c(new Collective(transport, cfg));
  MessagePlan probe;
  if (Error e = make_plan(0, DataType::fp32, cfg.msg_len, cfg.pmtu, probe)) return e;
  if (cfg.window < 1 || cfg.window > 1024)
    return format_error(ErrorCode::invalid_argument, "window: {} is outside 1..1024", cfg.window);
  const unsigned R = transport.lanes();
  if (Error e = check_rings(R)) return e;
  if (cfg.path == Path::ina && cfg.ring_ids.size() != R)
    return format_error(ErrorCode::invalid_argument, "rings: {} ring ids for {} rings",
                        cfg.ring_ids.size(), R);
  const unsigned P = transport.world();
  const size_t slot = probe.slot_bytes();
  const size_t local = transport.recv_region(0).len, remote = transport.successor_recv_bytes();
  if (local != remote)
    return format_error(ErrorCode::invalid_argument,
                        "ring_buffer_bytes: this rank's receive region ({} bytes) differs from "
                        "{}'s ({}): every rank needs the same options",
                        local, successor_rank(transport), remote);
  if (cfg.path == Path::ina && local < size_t{cfg.window} * slot)
    return format_error(ErrorCode::invalid_argument,
                        "window: {} messages of {} bytes do not fit the receive region", cfg.window,
                        slot);
  // On the INA path the ring path's slots lie past the INA slots: a
  // ring-path call right after an INA call may write before this rank
  // copied out its last result. (A communicator made on the ring path never
  // takes the INA path.)
  c->ring_base_ = cfg.path == Path::ina ? std::min(local, ina_slots_bytes(cfg)) : 0;
  if (P > 1) {
    c->ring_stride_ = (local - c->ring_base_) / (4 * size_t{P - 1}) / 64 * 64;
    if (c->ring_stride_ < 64)
      return format_error(ErrorCode::invalid_argument,
                          "ring_buffer_bytes: {} is too small for {} ranks (needs at least {})",
                          local - c->ring_base_, P, 256 * (P - 1));
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
    return format_error(ErrorCode::invalid_argument, "dtype: {} is not a data type",
                        static_cast<int>(t));
  return {};
}

Error Collective::check_op(Op op) {
  if (!wire::is_valid_op(static_cast<uint8_t>(op)))
    return format_error(ErrorCode::invalid_argument, "op: {} is not sum, min or max",
                        static_cast<int>(op));
  return {};
}

Error Collective::check_args(const void* send, void* recv, size_t count, DataType t, Op op) {
  if (Error e = check_dtype(t)) return e;
  if (Error e = check_op(op)) return e;
  if (count > 0 && (send == nullptr || recv == nullptr))
    return format_error(ErrorCode::invalid_argument, "{}: null buffer",
                        send == nullptr ? "send" : "recv");
  if (count > kMaxCallBytes / element_size(t))
    return format_error(ErrorCode::invalid_argument, "count: {} elements is too large", count);
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
  const std::string id = cfg_.ring_id(i) != 0 ? fmt::format("id {}, ", cfg_.ring_id(i)) : "";
  return fmt::format("ring {} of {} ({}stripe bytes [{}, {}))", i, rings(), id, s.first * esize,
                     (s.first + s.count) * esize);
}

std::string Collective::ring_tag(unsigned i, const StripeRange& s, size_t esize) const {
  return rings() > 1 ? ring_name(i, s, esize) + ": " : std::string();
}

// --------------------------------------------------------------- ring path

// One ring-path call (collective.h has the example and the contracts): on
// every ring, its stripe's segments one after the other, each in the form's
// steps of ring_step (all-reduce: all 2(P - 1); reduce-scatter: the first
// P - 1; all-gather: the last P - 1). A step posts this rank's write of its
// chunk, and is done once that write is acknowledged and the predecessor's
// write of the step has come (reduced into the chunk, or stored); a receive
// that comes before its step waits in its ring's queue (RingState::early).
//
// Chunks: all-reduce cuts a segment of n elements into P chunks
// (ring_chunk); the other forms' segment is the same sub-range of n
// elements of each rank's part (P chunks, `part_` elements apart in the
// user's buffer, n apart in the work buffer), and they turn ring_step's
// chunk q into chunk q - 1, so that the reduce-scatter leaves rank r with
// chunk r and the all-gather starts from it.
class Collective::RingCall {
 public:
  RingCall(Collective& c, RingForm form, const void* send, void* recv, size_t count, DataType t,
           Op op)
      : c_(c),
        form_(form),
        src_(static_cast<const uint8_t*>(send)),
        dst_(static_cast<uint8_t*>(recv)),
        count_(count),
        es_(element_size(t)),
        P_(c.t_.world()),
        r_(c.t_.rank()),
        R_(c.rings()),
        steps_(ring_steps(P_)),
        first_(form == RingForm::all_gather ? P_ - 1 : 0),
        last_(form == RingForm::reduce_scatter ? P_ - 1 : steps_),
        seg_max_((form == RingForm::all_reduce ? size_t{P_} : 1) * (c.ring_stride_ / es_)),
        reduce_fn_(reduce::kernels(reduce::best_isa(), static_cast<wire::Dtype>(t),
                                   static_cast<wire::ReduceOp>(op))
                       .reduce),
        who_(fmt::format("rank {}: ", c.t_.job_rank(r_))) {}

  Error run(Clock::time_point deadline);

 private:
  // Each ring's place in its stripe: the segment, the step, and which of the
  // step's two completions (own write, predecessor's write) it has.
  struct Stripe {
    StripeRange s;
    uint8_t* work = nullptr;
    size_t work_off = 0;   // of `work` in work_mr_
    size_t seg_first = 0;  // element offset of the segment in the stripe
    size_t n = 0;          // elements in the segment (all-reduce) or in each chunk of it
    uint32_t tag = 0;
    size_t half = 0;
    unsigned step = 0;
    bool wrote = false, got = false, done = false;
    uint32_t imm() const noexcept { return tag << 8 | step; }
  };

  Error begin_stripe(unsigned g);
  void start_segment(Stripe& k, unsigned g);
  void end_segment(const Stripe& k);
  Error begin_step(Stripe& k, unsigned g);
  Error receive(Stripe& k, unsigned g, const Completion& c);
  Error advance(Stripe& k, unsigned g);
  Error take(const Completion& c);
  bool finished() const;
  Error timed_out() const;
  // ring_step's chunk q as this form numbers it.
  unsigned turn(unsigned q) const { return form_ == RingForm::all_reduce ? q : (q + P_ - 1) % P_; }
  // Chunk c of the current segment in the work buffer (elements), and the
  // offset of its first element in the user's buffers.
  ChunkRange chunk(const Stripe& k, unsigned c) const;
  size_t user_at(const Stripe& k, unsigned c) const;
  // Where ring k stands, for errors: its message id, segment and step.
  std::string where(const Stripe& k) const;
  // " at <where>", or nothing once the ring is done.
  std::string at_step(const Stripe& k) const { return k.done ? "" : " at " + where(k); }

  Collective& c_;
  const RingForm form_;
  const uint8_t* src_;
  uint8_t* dst_;
  const size_t count_;  // elements (all-reduce), or of each rank's part
  const size_t es_;
  const unsigned P_, r_, R_;
  const unsigned steps_;         // of an all-reduce (ring_step's numbering)
  const unsigned first_, last_;  // the form's steps: [first_, last_)
  const size_t seg_max_;         // elements of a segment (or of its chunks) at most
  const reduce::ReduceFn reduce_fn_;
  const std::string who_;
  std::array<Stripe, kMaxRings> st_;
  Clock::time_point start_{};
};

const char* Collective::form_name(RingForm f) {
  switch (f) {
    case RingForm::reduce_scatter:
      return "reduce-scatter";
    case RingForm::all_gather:
      return "all-gather";
    default:
      return "all-reduce";
  }
}

Error Collective::RingCall::run(Clock::time_point deadline) {
  start_ = Clock::now();
  c_.record_.path = Path::ring;
  for (unsigned g = 0; g < R_; ++g)
    if (Error e = begin_stripe(g)) return c_.fail(e);
  Completion comps[kPollBatch];
  while (!finished()) {
    unsigned n = 0;
    if (Error e = c_.t_.poll(comps, kPollBatch, n, deadline)) return c_.fail(e);
    if (n == 0) return c_.fail(timed_out());
    for (unsigned i = 0; i < n; ++i)
      if (Error e = take(comps[i])) return c_.fail(e);
  }
  return {};
}

ChunkRange Collective::RingCall::chunk(const Stripe& k, unsigned c) const {
  if (form_ == RingForm::all_reduce) return ring_chunk(k.n, P_, c);
  return {c * k.n, k.n};
}

size_t Collective::RingCall::user_at(const Stripe& k, unsigned c) const {
  const size_t at = k.s.first + k.seg_first;
  return form_ == RingForm::all_reduce ? at + ring_chunk(k.n, P_, c).first : c * count_ + at;
}

// Ring g's stripe, and the first step of its first segment (an empty stripe
// is done at once).
Error Collective::RingCall::begin_stripe(unsigned g) {
  Stripe& k = st_[g];
  k.s = stripe(count_, R_, g);
  k.work_off = g * c_.work_ring_bytes_;
  k.work = c_.work_buf_->data + k.work_off;
  if (k.s.count == 0) {
    k.done = true;
    return {};
  }
  start_segment(k, g);
  return begin_step(k, g);
}

// The next segment of the stripe into the work buffer (the all-gather's:
// this rank's own chunk), at the form's first step.
void Collective::RingCall::start_segment(Stripe& k, unsigned g) {
  k.n = std::min(k.s.count - k.seg_first, seg_max_);
  const bool own_only = form_ == RingForm::all_gather;  // send: this rank's part alone
  for (unsigned c = 0; c < P_; ++c) {
    const ChunkRange w = chunk(k, c);
    if (w.count == 0 || (own_only && c != r_)) continue;
    std::memcpy(k.work + w.first * es_,
                src_ + (own_only ? k.s.first + k.seg_first : user_at(k, c)) * es_, w.count * es_);
  }
  k.tag = c_.rings_[g].seg_seq & kRingTagMask;
  k.half = (c_.rings_[g].seg_seq & 1) * steps_;
  k.step = first_;
}

// The segment's result out of the work buffer (the reduce-scatter's: this
// rank's own chunk).
void Collective::RingCall::end_segment(const Stripe& k) {
  const bool own_only = form_ == RingForm::reduce_scatter;
  for (unsigned c = 0; c < P_; ++c) {
    const ChunkRange w = chunk(k, c);
    if (w.count == 0 || (own_only && c != r_)) continue;
    std::memcpy(dst_ + (own_only ? k.s.first + k.seg_first : user_at(k, c)) * es_,
                k.work + w.first * es_, w.count * es_);
  }
  c_.record_.dependent_steps = std::max(c_.record_.dependent_steps, last_ - first_);
}

// Posts the current step's write, and takes its receive if it came early.
Error Collective::RingCall::begin_step(Stripe& k, unsigned g) {
  const ChunkRange sc = chunk(k, turn(ring_step(r_, P_, k.step).send_chunk));
  k.wrote = k.got = false;
  if (Error e = c_.t_.post_write_imm(g, c_.work_mr_, k.work_off + sc.first * es_, sc.count * es_,
                                     c_.ring_slot(k.half + k.step), k.imm(), k.imm()))
    return e;
  c_.record_.bytes_sent += sc.count * es_;
  auto& early = c_.rings_[g].early;
  if (early.empty()) return {};
  const Completion c = early.front();
  early.pop_front();
  return receive(k, g, c);
}

// The predecessor's write of the current step: check it, reduce or store.
Error Collective::RingCall::receive(Stripe& k, unsigned g, const Completion& c) {
  const RingStep rs = ring_step(r_, P_, k.step);
  const ChunkRange rc = chunk(k, turn(rs.recv_chunk));
  if (c.imm != k.imm() || c.byte_len != rc.count * es_)
    return format_error(
        ErrorCode::transport,
        "{}{}from {}: immediate {} with {} bytes where {} with {} bytes was expected", who_,
        c_.ring_tag(g, k.s, es_), predecessor_rank(c_.t_), hex(c.imm), c.byte_len, where(k),
        rc.count * es_);
  k.got = true;
  const uint8_t* in = c_.t_.recv_region(g).addr + c_.ring_slot(k.half + k.step);
  uint8_t* own = k.work + rc.first * es_;
  if (rs.reduce) {
    const uint8_t* srcs[2] = {in, own};  // op(received, own): the ring order
    reduce_fn_(srcs, 2, own, rc.count);
  } else if (rc.count > 0) {
    std::memcpy(own, in, rc.count * es_);
  }
  return {};
}

// After a completion: while the step has both, move on (next step, next
// segment, or the stripe is done).
Error Collective::RingCall::advance(Stripe& k, unsigned g) {
  while (!k.done && k.wrote && k.got) {
    if (++k.step == last_) {
      end_segment(k);
      k.seg_first += k.n;
      ++c_.rings_[g].seg_seq;
      if (k.seg_first >= k.s.count) {
        k.done = true;
        break;
      }
      start_segment(k, g);
    }
    if (Error e = begin_step(k, g)) return e;
  }
  return {};
}

// One completion of any ring: this rank's write, or the predecessor's.
Error Collective::RingCall::take(const Completion& c) {
  if (Error e = check_lane(c, R_, who_)) return e;
  Stripe& k = st_[c.lane];
  if (c.ok && c.kind == Completion::Kind::recv_imm && (k.done || k.got)) {
    c_.rings_[c.lane].early.push_back(c);  // the predecessor is ahead: keep it for its step
    return {};
  }
  const auto ring = [&] { return c_.ring_tag(c.lane, k.s, es_); };  // errors only
  if (!c.ok)
    return format_error(ErrorCode::transport, "{}{}{} failed{} {}", who_, ring(),
                        c.kind == Completion::Kind::write_done
                            ? "write to " + successor_rank(c_.t_)
                            : "receive from " + predecessor_rank(c_.t_),
                        at_step(k), status_of(c));
  if (c.kind == Completion::Kind::write_done) {
    if (k.done || c.wr_id != k.imm() || k.wrote)
      return format_error(ErrorCode::internal, "{}{}unexpected write completion{}", who_, ring(),
                          at_step(k));
    k.wrote = true;
  } else if (Error e = receive(k, c.lane, c)) {
    return e;
  }
  return advance(k, c.lane);
}

bool Collective::RingCall::finished() const {
  for (unsigned g = 0; g < R_; ++g)
    if (!st_[g].done) return false;
  return true;
}

// Nothing came before the deadline: what each unfinished ring still waits
// for at its step.
Error Collective::RingCall::timed_out() const {
  std::string what;
  for (unsigned g = 0; g < R_; ++g) {
    const Stripe& k = st_[g];
    if (k.done) continue;
    const RingStep rs = ring_step(r_, P_, k.step);
    std::string miss;
    if (!k.got)
      miss = fmt::format("chunk {} not received from {}", turn(rs.recv_chunk),
                         predecessor_rank(c_.t_));
    if (!k.wrote)
      list_append(miss, fmt::format("write of chunk {} to {} not acknowledged", turn(rs.send_chunk),
                                    successor_rank(c_.t_)));
    const std::string label = R_ == 1 ? "" : c_.ring_name(g, k.s, es_) + " ";
    list_append(what, fmt::format("{}at {}: {}", label, where(k), miss));
  }
  // One ring: "(ring path) ... at message id ...: ...", no stripe named.
  const std::string rings = R_ == 1 ? "" : fmt::format(", {} rings", R_);
  return format_error(ErrorCode::timeout, "{}{} (ring path{}) timed out after {} ms{}{}", who_,
                      form_name(form_), rings, ms_since(start_), R_ == 1 ? " " : ": ", what);
}

std::string Collective::RingCall::where(const Stripe& k) const {
  const RingStep rs = ring_step(r_, P_, k.step);
  return fmt::format("message id {} (segment {}, step {} of {}, {})", hex(k.imm()), k.tag,
                     k.step - first_, last_ - first_, rs.reduce ? "reduce-scatter" : "all-gather");
}

Error Collective::ring_run(RingForm f, const void* send, void* recv, size_t count, DataType t,
                           Op op, Clock::time_point deadline) {
  // An INA call just before may have taken the predecessor's first writes
  // of this one (it was ahead): they are this call's, each for its step.
  for (auto* q : {&pending_, &next_call_}) {
    for (const Completion& c : *q)
      if (c.lane < rings_.size()) rings_[c.lane].early.push_back(c);
    q->clear();
  }
  return RingCall(*this, f, send, recv, count, t, op).run(deadline);
}

Error Collective::ring_allreduce(const void* send, void* recv, size_t count, DataType t, Op op,
                                 Clock::time_point deadline) {
  record_ = {Path::ring, 0, 0};
  return ring_allreduce_part(send, recv, count, t, op, deadline);
}

Error Collective::ring_allreduce_part(const void* send, void* recv, size_t count, DataType t, Op op,
                                      Clock::time_point deadline) {
  if (!failed_.ok())
    return Error::make(failed_.code, "communicator unusable after: " + failed_.message);
  if (Error e = check_args(send, recv, count, t, op)) return e;
  if (count == 0) return {};
  if (t_.world() == 1) {
    std::memmove(recv, send, count * element_size(t));
    return {};
  }
  return ring_run(RingForm::all_reduce, send, recv, count, t, op, deadline);
}

// The arguments of a reduce-scatter or all-gather: `part` elements per
// rank, `whole` (world x part) on the other side; `part_buf` may be this
// rank's part of `whole_buf` (in place), and may not overlap it otherwise.
Error Collective::check_parts(const void* whole_buf, const void* part_buf, size_t part, DataType t,
                              const char* whole_name, const char* part_name) const {
  if (Error e = check_dtype(t)) return e;
  const size_t es = element_size(t), P = t_.world();
  if (part > kMaxCallBytes / es / P)
    return format_error(ErrorCode::invalid_argument, "count: {} elements x {} ranks is too large",
                        part, P);
  if (part == 0) return {};
  if (whole_buf == nullptr || part_buf == nullptr)
    return format_error(ErrorCode::invalid_argument, "{}: null buffer",
                        whole_buf == nullptr ? whole_name : part_name);
  const auto* w = static_cast<const uint8_t*>(whole_buf);
  const auto* p = static_cast<const uint8_t*>(part_buf);
  const size_t bytes = part * es;
  if (p != w + t_.rank() * bytes && p < w + P * bytes && w < p + bytes)
    return format_error(ErrorCode::invalid_argument,
                        "{}: overlaps {} other than at this rank's part (in place is {} + {} x "
                        "count elements)",
                        part_name, whole_name, whole_name, t_.rank());
  return {};
}

Error Collective::ring_reduce_scatter(const void* send, void* recv, size_t recv_count, DataType t,
                                      Op op, Clock::time_point deadline) {
  record_ = {Path::ring, 0, 0};
  if (!failed_.ok())
    return Error::make(failed_.code, "communicator unusable after: " + failed_.message);
  if (Error e = check_op(op)) return e;
  if (Error e = check_parts(send, recv, recv_count, t, "send", "recv")) return e;
  if (recv_count == 0) return {};
  if (t_.world() == 1) {
    std::memmove(recv, send, recv_count * element_size(t));
    return {};
  }
  return ring_run(RingForm::reduce_scatter, send, recv, recv_count, t, op, deadline);
}

Error Collective::ring_all_gather(const void* send, void* recv, size_t count, DataType t,
                                  Clock::time_point deadline) {
  record_ = {Path::ring, 0, 0};
  if (!failed_.ok())
    return Error::make(failed_.code, "communicator unusable after: " + failed_.message);
  if (Error e = check_parts(recv, send, count, t, "recv", "send")) return e;
  if (count == 0) return {};
  if (t_.world() == 1) {
    std::memmove(recv, send, count * element_size(t));
    return {};
  }
  // The op is unused (no step reduces); sum keeps the kernel lookup valid.
  return ring_run(RingForm::all_gather, send, recv, count, t, Op::sum, deadline);
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
    const std::string ring =
        R > 1 ? fmt::format(" on ring {} (id {})", g, c.config().ring_id(g)) : "";
    reason = fmt::format(
        "probe all-reduce gave {} instead of {}{}: the box is not on the path "
        "between the ranks",
        got[g], want, ring);
    return {};
  }
  confirmed = true;
  return {};
}

}  // namespace netreduce::host
