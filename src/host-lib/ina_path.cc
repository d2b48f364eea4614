// The INA path of one all-reduce call (collective.h has the example and the
// contracts): post what every ring's window allows, take completions, copy
// out each sealed result; stop at the first data no box sealed.
//
// Data no box sealed (a failed seal; with failover on also a raw write
// ahead of this rank or a wrong header) ends the call once what is in
// flight is back (no new message is sent). Without failover that is every
// result of what this rank sent: the transport is then as quiet as after a
// call that succeeded (the probe's ring path goes on over it). With
// failover, the predecessor may have sent more or fewer messages than this
// rank: only this rank's writes are awaited here, the receives once the
// ranks have agreed (failover.cc). And a rank that stops tells its
// successor at once, with a stop notice on every ring (a zero-length WRITE
// WITH IMM, which no INA message is): the successor, maybe waiting for a
// message this rank will not send, stops too and passes it on, so every
// rank reaches the agreement without waiting for its deadline.
#include <array>
#include <cstring>
#include <string>

#include "host-lib/call_text.h"
#include "host-lib/collective.h"
#include "wire/icrc.h"
#include "wire/ina.h"

namespace netreduce::host {
namespace {

// The work request id of a stop notice (a zero-length WRITE WITH IMM to the
// successor); message indices never reach it.
constexpr uint64_t kStopWrId = ~uint64_t{0};

}  // namespace

class Collective::InaCall {
 public:
  InaCall(Collective& c, const void* send, void* recv, size_t count, DataType t, Op op)
      : c_(c),
        src_(static_cast<const uint8_t*>(send)),
        dst_(static_cast<uint8_t*>(recv)),
        count_(count),
        t_(t),
        op_(op),
        es_(element_size(t)),
        R_(c.rings()),
        failover_(static_cast<bool>(c.exchange_)),
        call_tag_(static_cast<uint32_t>(c.calls_) & ~kStopBit),
        have_tail_(c.tail_.call != 0 && c.tail_.call + 1 == c.calls_),
        who_(fmt::format("rank {}: ", c.t_.job_rank(c.t_.rank()))) {}

  // Each ring's stripe, plan, window and message ids; `total` messages.
  Error plan(size_t& total);
  Error run(Clock::time_point deadline);

 private:
  struct Stripe {
    StripeRange s;
    MessagePlan plan;
    Window w;
    uint32_t base = 0;
    uint32_t copied = 0, received = 0;  // messages copied out, receives completed
  };

  Error post_sends();
  bool finished() const;
  void record(bool recoverable);
  Error halt(Error e);
  Error raw(Error e);
  Error take(const Completion& c);
  Error take_write(Stripe& k, const Completion& c);
  Error take_receive(Stripe& k, const Completion& c);
  Error stop_notice(const Completion& c);
  Error copy_out(Stripe& k, const Completion& c);
  Error timed_out();
  std::string ring(unsigned g) const { return c_.ring_tag(g, st_[g].s, es_); }

  Collective& c_;
  const uint8_t* src_;
  uint8_t* dst_;
  const size_t count_;
  const DataType t_;
  const Op op_;
  const size_t es_;
  const unsigned R_;
  const bool failover_;
  // A stop notice carries kStopBit and its call's number (31 bits): see
  // stop_notice.
  const uint32_t call_tag_;
  uint32_t next_tag() const noexcept { return (call_tag_ + 1) & ~kStopBit; }
  static uint32_t stop_call(const Completion& c) noexcept { return c.imm & ~kStopBit; }
  const bool have_tail_;  // this rank keeps the previous call's tail
  const std::string who_;
  std::array<Stripe, kMaxRings> st_;
  std::array<uint8_t, kMaxRings> stop_{};  // per ring: 0 none, 1 notice sent, 2 acknowledged
  Error unsealed_;                         // the first data no box sealed
  bool foreign_stop_ = false;
  Clock::time_point start_{};
};

Error Collective::InaCall::plan(size_t& total) {
  total = 0;
  for (unsigned g = 0; g < R_; ++g) {
    Stripe& k = st_[g];
    k.s = stripe(count_, R_, g);
    if (Error e = make_plan(k.s.count, t_, c_.cfg_.msg_len, c_.cfg_.pmtu, k.plan)) return e;
    k.w = Window(c_.cfg_.window);
    k.w.reset(k.plan.messages);
    k.base = c_.rings_[g].next_msg_id;
    c_.rings_[g].next_msg_id += static_cast<uint32_t>(k.plan.messages);  // every rank alike
    total += k.plan.messages;
  }
  return {};
}

Error Collective::InaCall::run(Clock::time_point deadline) {
  start_ = Clock::now();
  Completion comps[kPollBatch];
  for (;;) {
    if (Error e = post_sends()) return c_.fail(e);
    if (finished()) {
      record(!unsealed_.ok());
      if (!unsealed_.ok()) return c_.fail(unsealed_);
      if (failover_) c_.keep_tail(dst_, count_, t_, op_);
      return {};
    }
    unsigned n = 0;
    while (n < kPollBatch && !c_.pending_.empty()) {
      comps[n++] = c_.pending_.front();
      c_.pending_.pop_front();
    }
    if (n == 0)
      if (Error e = c_.t_.poll(comps, kPollBatch, n, deadline)) return c_.fail(e);
    if (n == 0) return timed_out();
    for (unsigned i = 0; i < n; ++i)
      if (Error e = take(comps[i])) return e;
  }
}

// Every message each ring's window allows (none once the call stops).
Error Collective::InaCall::post_sends() {
  const unsigned N = c_.cfg_.window;
  for (unsigned g = 0; g < R_ && unsealed_.ok(); ++g) {
    Stripe& k = st_[g];
    while (k.w.can_send(k.w.next_send())) {
      const size_t i = k.w.next_send();
      const size_t remote = (i % N) * k.plan.slot_bytes();
      const size_t off = g * c_.send_ring_bytes_ + remote;
      uint8_t* s = c_.send_mr_.addr + off;  // the send slots, registered at create
      wire::InaInfo info;
      info.dtype = static_cast<uint8_t>(t_);
      info.op = static_cast<uint8_t>(op_);
      info.ring_id = c_.cfg_.ring_id(g);
      info.rank = static_cast<uint16_t>(c_.t_.rank());
      info.msg_len = k.plan.packets(i);
      info.msg_id = k.base + static_cast<uint32_t>(i);
      wire::ina_encode(info, s);
      std::memcpy(s + kInaHeaderBytes, src_ + (k.s.first + k.plan.first_elem(i)) * es_,
                  k.plan.data_bytes(i));
      if (Error e = c_.t_.post_write_imm(
              g, c_.send_mr_, off, kInaHeaderBytes + k.plan.data_bytes(i), remote, info.msg_id, i))
        return e;
      c_.record_.dependent_steps = 1;  // the box's one pass
      c_.record_.bytes_sent += k.plan.data_bytes(i);
      (void)k.w.sent(i);
    }
  }
  return {};
}

// Done: every result in, or, once stopped, this rank's writes (and with
// failover its stop notices) back; the receives then wait for the agreement.
bool Collective::InaCall::finished() const {
  for (unsigned g = 0; g < R_; ++g) {
    const Window& w = st_[g].w;
    const bool drained = w.writes_completed() == w.next_send() && stop_[g] != 1 &&
                         (failover_ || w.results_received() == w.next_send());
    if (!(unsealed_.ok() ? w.finished() : drained)) return false;
  }
  return true;
}

// What failover reports of this call (Collective::InaOutcome).
void Collective::InaCall::record(bool recoverable) {
  InaOutcome& last = c_.last_;
  for (unsigned g = 0; g < R_; ++g) {
    last.base[g] = st_[g].base;
    last.copied[g] = st_[g].copied;
    last.sent[g] = static_cast<uint32_t>(st_[g].w.next_send()) + (stop_[g] != 0 ? 1 : 0);
    last.received[g] = st_[g].received;
  }
  // Receives taken but kept for the next call, or not read yet, arrived too.
  for (const auto* q : {&c_.pending_, &c_.next_call_})
    for (const Completion& x : *q)
      if (x.lane < R_) ++last.received[x.lane];
  last.recoverable = recoverable && !foreign_stop_;
}

// The first cause ends the call; with failover, the stop notices go out.
Error Collective::InaCall::halt(Error e) {
  if (!unsealed_.ok()) return {};
  unsealed_ = std::move(e);
  for (unsigned g = 0; failover_ && g < R_; ++g) {
    // Only where the send queue has room (a full window leaves none): the
    // successor then learns at its deadline.
    const Window& w = st_[g].w;
    if (w.next_send() - w.writes_completed() >= c_.t_.max_outstanding_writes()) continue;
    if (Error x = c_.t_.post_write_imm(g, c_.send_mr_, 0, 0, 0, kStopBit | call_tag_, kStopWrId))
      return x;
    stop_[g] = 1;
  }
  return {};
}

// Raw data, not the box's: ends the call (with failover, once this rank's
// writes are back; without, at once).
Error Collective::InaCall::raw(Error e) {
  if (!failover_) {
    record(false);
    return c_.fail(std::move(e));
  }
  if (Error x = halt(std::move(e))) {
    record(false);
    return c_.fail(x);
  }
  return {};
}

Error Collective::InaCall::take(const Completion& c) {
  if (Error e = check_lane(c, R_, who_)) return c_.fail(e);
  Stripe& k = st_[c.lane];
  return c.kind == Completion::Kind::write_done ? take_write(k, c) : take_receive(k, c);
}

Error Collective::InaCall::take_write(Stripe& k, const Completion& c) {
  if (c.wr_id == kStopWrId) {
    if (!c.ok) {
      record(false);
      return c_.fail(format_error(ErrorCode::transport, "{}{}stop notice to {} failed {}", who_,
                                  ring(c.lane), successor_rank(c_.t_), status_of(c)));
    }
    stop_[c.lane] = 2;
    return {};
  }
  if (!c.ok)
    return c_.fail(format_error(ErrorCode::transport, "{}{}write of message id {} to {} failed {}",
                                who_, ring(c.lane), k.base + static_cast<uint32_t>(c.wr_id),
                                successor_rank(c_.t_), status_of(c)));
  if (!k.w.write_completed(c.wr_id))
    return c_.fail(format_error(ErrorCode::internal,
                                "{}{}write completion out of order (work request {})", who_,
                                ring(c.lane), c.wr_id));
  return {};
}

Error Collective::InaCall::take_receive(Stripe& k, const Completion& c) {
  const size_t i = k.w.results_received();
  const uint32_t id = k.base + static_cast<uint32_t>(i);
  // Every result of this ring is in and only ACKs are awaited: a write past
  // the call, or a stop notice of the next call, is the next call's (the
  // predecessor finished this one), not raw data of this.
  const bool stop = c.byte_len == 0 && (c.imm & kStopBit) != 0;
  if (c.ok && i >= k.plan.messages && (!stop || stop_call(c) == next_tag())) {
    c_.next_call_.push_back(c);
    return {};
  }
  if (!c.ok) {
    record(false);
    return c_.fail(format_error(ErrorCode::transport,
                                "{}{}receive of message id {} from {} failed {}", who_,
                                ring(c.lane), id, predecessor_rank(c_.t_), status_of(c)));
  }
  ++k.received;
  if (failover_ && stop) return stop_notice(c);
  if (i >= k.w.next_send()) {
    if (!unsealed_.ok()) return {};  // draining: the predecessor was ahead
    return raw(
        format_error(ErrorCode::transport,
                     "{}{}from {}: immediate {} for message id {}, not sent yet by this rank "
                     "(the predecessor's raw write: box bypassed?)",
                     who_, ring(c.lane), predecessor_rank(c_.t_), hex(c.imm), id));
  }
  if (!unsealed_.ok()) {
    (void)k.w.result_received(i);  // draining: nothing more is copied out
    return {};
  }
  const Error e = copy_out(k, c);
  (void)k.w.result_received(i);
  return e;
}

// The predecessor's stop notice. One of this call, or of the next (the
// predecessor completed this one and stopped that). One of the previous
// call, which this rank completed and whose tail it keeps: the predecessor
// lost results of it, which the agreement gives it from the tails. Any
// other: no agreement can finish the calls, and this rank says so in its
// report.
Error Collective::InaCall::stop_notice(const Completion& c) {
  std::string why;
  const uint32_t call = stop_call(c);
  if (call == call_tag_) {
    why = "stopped the call (it met data no box sealed)";
  } else if (call == next_tag()) {
    why = "completed this call and stopped the next (it met data no box sealed)";
  } else if (((call + 1) & ~kStopBit) == call_tag_ && have_tail_) {
    why = fmt::format(
        "stopped all-reduce call {}, which this rank completed: the box was lost between the "
        "ranks' last results",
        call);
  } else {
    why = fmt::format("stopped all-reduce call {}, which this rank cannot finish with it", call);
    foreign_stop_ = true;
  }
  return raw(format_error(ErrorCode::transport, "{}{}{} {}", who_, ring(c.lane),
                          predecessor_rank(c_.t_), why));
}

// Message i's result: its header must be the call's, and its immediate the
// box's seal (docs/design.md#result-digests), checked on a private copy: a
// bypassed box lets the predecessor's raw write of a later message land in
// this slot at any moment, so the slot is read once, and the caller gets
// exactly the bytes the CRC covered, or nothing.
Error Collective::InaCall::copy_out(Stripe& k, const Completion& c) {
  const size_t i = k.w.results_received();
  const uint32_t id = k.base + static_cast<uint32_t>(i);
  const uint8_t* r = c_.t_.recv_region(c.lane).addr + (i % c_.cfg_.window) * k.plan.slot_bytes();
  const size_t want = kInaHeaderBytes + k.plan.data_bytes(i);
  const auto hdr = wire::ina_decode(r, c.byte_len);
  if (c.byte_len != want || !hdr || hdr->msg_id != id || hdr->dtype != static_cast<uint8_t>(t_) ||
      hdr->op != static_cast<uint8_t>(op_) || hdr->ring_id != c_.cfg_.ring_id(c.lane))
    return raw(format_error(ErrorCode::transport,
                            "{}{}message id {} from {} has a wrong INA header or length ({} bytes, "
                            "expected {})",
                            who_, ring(c.lane), id, predecessor_rank(c_.t_), c.byte_len, want));
  const size_t bytes = k.plan.data_bytes(i);
  std::memcpy(c_.stage_.data(), r + kInaHeaderBytes, bytes);
  const uint32_t crc = wire::crc32(0, c_.stage_.data(), bytes);
  if ((c.imm ^ crc) == id) {
    std::memcpy(dst_ + (k.s.first + k.plan.first_elem(i)) * es_, c_.stage_.data(), bytes);
    ++k.copied;
    return {};
  }
  c_.failed_seal_ = true;
  Error e = format_error(ErrorCode::transport,
                         "{}{}message id {} from {} fails the box's seal (immediate {}, data crc32 "
                         "{}): no box reduced it from every rank (bypassed or restarted on the "
                         "path?)",
                         who_, ring(c.lane), id, predecessor_rank(c_.t_), hex(c.imm), hex(crc));
  if (Error x = halt(std::move(e))) {
    record(false);
    return c_.fail(x);
  }
  return {};
}

// Nothing came before the deadline. Results missing with every write of
// this rank acknowledged: a predecessor that stopped sending (it met raw
// data); the transport is sound, so failover may finish the call. Writes
// missing: it is not.
Error Collective::InaCall::timed_out() {
  bool writes_back = true;
  for (unsigned g = 0; g < R_; ++g)
    writes_back =
        writes_back && st_[g].w.writes_completed() == st_[g].w.next_send() && stop_[g] != 1;
  record(failover_ && writes_back);
  if (!unsealed_.ok()) return c_.fail(unsealed_);  // the first cause, not the drain's timeout
  std::string what;
  for (unsigned g = 0; g < R_; ++g) {
    const Stripe& k = st_[g];
    if (k.w.finished()) continue;
    const size_t i = k.w.done();
    const uint32_t id = k.base + static_cast<uint32_t>(i);
    std::string miss;
    if (k.w.results_received() <= i)
      miss = fmt::format(
          "result of message id {} not received from {} (through the box: some rank's message {} "
          "has not reached it)",
          id, predecessor_rank(c_.t_), id);
    if (k.w.writes_completed() <= i)
      list_append(miss, fmt::format("write of message id {} to {} not acknowledged", id,
                                    successor_rank(c_.t_)));
    const std::string label = R_ == 1 ? "" : c_.ring_name(g, k.s, es_) + " ";
    list_append(what, fmt::format("{}at message {} of {}: {}", label, i, k.plan.messages, miss));
  }
  // One ring: "(ina path, ring <id>) ... at message i of n: ...", no stripe named.
  const std::string rings =
      R_ == 1 ? fmt::format("ring {}", c_.cfg_.ring_id(0)) : fmt::format("{} rings", R_);
  return c_.fail(format_error(ErrorCode::timeout,
                              "{}all-reduce (ina path, {}) timed out after {} ms{}{}", who_, rings,
                              ms_since(start_), R_ == 1 ? " " : ": ", what));
}

Error Collective::ina_allreduce(const void* send, void* recv, size_t count, DataType t, Op op,
                                Clock::time_point deadline) {
  last_ = {};
  record_ = {Path::ina, 0, 0};
  if (!failed_.ok())
    return Error::make(failed_.code, "communicator unusable after: " + failed_.message);
  if (Error e = check_args(send, recv, count, t, op)) return e;
  // Receives a ring-path call before kept for a later step (its
  // predecessor's writes of this call, which the box did not hold: it is
  // gone), then those an INA call before kept: this call's, in order.
  for (RingState& g : rings_) {
    pending_.insert(pending_.end(), g.early.begin(), g.early.end());
    g.early.clear();
  }
  pending_.insert(pending_.end(), next_call_.begin(), next_call_.end());
  next_call_.clear();
  InaCall call(*this, send, recv, count, t, op);
  size_t total = 0;
  if (Error e = call.plan(total)) return e;
  if (total == 0) return {};
  return call.run(deadline);
}

}  // namespace netreduce::host
