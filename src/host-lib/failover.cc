// Failover: an INA call that failed on data no box sealed is finished on the
// ring path, every rank agreeing, and the collective stays on the ring path.
// Design: docs/design.md#failover.
//
// Example: P = 3, one ring, a call of 4 messages; the box is bypassed while
// message 2 is out. Rank 0 copied out messages 0-2 (their seals held), ranks
// 1 and 2 only 0-1; every rank got raw data after that and stopped sending.
//  1. Each rank waits for its own writes to be acknowledged, then sends a
//     report over the bootstrap (call number, count, dtype, op, per ring:
//     the call's first message id, messages copied out, sent, receives
//     seen; the previous call's tail it keeps; whether it can recover, and
//     its error). Every rank gets every report: all decide alike.
//  2. Each rank drains the receives its predecessor's `sent` still owes it,
//     so no INA write lands in the receive region after this point.
//  3. Messages [min copied, max copied) = [2, 3) have a result somewhere:
//     the lowest rank that copied out the most (rank 0) sends its bytes of
//     them in a second exchange; ranks 1 and 2 copy them in.
//  4. Messages [max copied, 4) = [3, 4) reached no rank: every rank still
//     holds its input there (copy-out happens only after a seal), and the
//     ring path all-reduces that element range.
// Result: messages 0-2 as the box summed them (rank order), message 3 in the
// ring's order; the same bytes on every rank.
// Between two calls: when the box went between the ranks' last results of
// call k, ranks that completed k and are in k + 1 give a rank still in k its
// missing last messages from the tail they keep (Collective::Tail), and
// k + 1 goes to the ring path on every rank. When k was the job's last call,
// the ranks that completed it give the tail as they leave (close()).
// If any rank cannot recover (a deadline, a transport error: its QPs may be
// in error) or the reports disagree, every rank returns an error naming it.
// Failback (fail_back): failback_calls calls later the ranks probe the box
// and take the INA path again if every rank's probe is sealed and right.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <sstream>

#include "host-lib/call_text.h"
#include "host-lib/collective.h"

namespace netreduce::host {

struct FailoverReport {
  uint64_t call = 0, count = 0;
  unsigned dtype = 0, op = 0, recoverable = 0, rings = 0;
  // Per ring: the call's first message id; messages copied out, sent and
  // received (Collective::InaOutcome).
  std::array<uint32_t, kMaxRings> base{}, copied{}, sent{}, received{};
  // The previous call, when this rank completed it on the INA path and
  // keeps its tail (Collective::Tail); call 0: none.
  uint64_t tail_call = 0, tail_count = 0;
  unsigned tail_dtype = 0, tail_op = 0;
  std::string error;

  template <class Outcome>
  void take(const Outcome& o) {
    base = o.base;
    copied = o.copied;
    sent = o.sent;
    received = o.received;
  }
  bool same_call(const FailoverReport& x) const {
    return x.call == call && x.count == count && x.dtype == dtype && x.op == op && x.rings == rings;
  }
};

namespace {

using Report = FailoverReport;

constexpr const char* kMagic = "nr-failover-2";

// Message ids a probe skips when trying the box again: past every cell the
// box may still hold for the failed call (its slots are 2 x its window).
constexpr uint32_t kFailbackIdSkip = 1u << 16;

// A rank that cannot recover only tells the others (their reports change
// nothing for it): it waits this long for them, not the whole agreement
// budget. A box that died without a bypass cuts the bootstrap's path too.
constexpr auto kReportGrace = std::chrono::seconds(1);

std::string encode(const Report& r) {
  std::ostringstream o;
  o << kMagic << ' ' << r.call << ' ' << r.count << ' ' << r.dtype << ' ' << r.op << ' '
    << r.recoverable << ' ' << r.rings << ' ' << r.tail_call << ' ' << r.tail_count << ' '
    << r.tail_dtype << ' ' << r.tail_op;
  for (unsigned g = 0; g < r.rings; ++g)
    o << ' ' << r.base[g] << ' ' << r.copied[g] << ' ' << r.sent[g] << ' ' << r.received[g];
  o << '\n' << r.error;
  return o.str();
}

bool decode(const std::string& s, Report& r) {
  const size_t nl = s.find('\n');
  if (nl == std::string::npos) return false;
  std::istringstream i(s.substr(0, nl));
  std::string magic;
  if (!(i >> magic >> r.call >> r.count >> r.dtype >> r.op >> r.recoverable >> r.rings >>
        r.tail_call >> r.tail_count >> r.tail_dtype >> r.tail_op) ||
      magic != kMagic || r.rings < 1 || r.rings > kMaxRings)
    return false;
  for (unsigned g = 0; g < r.rings; ++g)
    if (!(i >> r.base[g] >> r.copied[g] >> r.sent[g] >> r.received[g])) return false;
  r.error = s.substr(nl + 1);
  return true;
}

// The receives this rank still owes from its predecessor, per ring: what
// the predecessor sent, counted from this rank's first message id of the
// call it reports (the predecessor may be one call ahead). Empty when the
// counts cannot be (ids more than 2^30 apart: reports of unrelated calls).
std::vector<uint32_t> owed_receives(const Report& mine, const Report& pred, unsigned rings) {
  std::vector<uint32_t> owed(rings);
  for (unsigned g = 0; g < rings; ++g) {
    owed[g] = pred.base[g] + pred.sent[g] - mine.base[g];  // modulo 2^32, as ids wrap
    if (owed[g] > (1u << 30)) return {};
  }
  return owed;
}

// The calls the reports name: every rank at the lowest, K, or at K + 1
// having completed K on the INA path (it keeps K's tail) with nothing of
// K + 1 copied out (no box could seal it: the ranks at K never sent it).
// Ranks at one call agree on it. Returns why not, or "".
std::string check_calls(const std::vector<Report>& all, uint64_t k, const Transport& t) {
  const Report* at[2] = {nullptr, nullptr};
  for (unsigned r = 0; r < all.size(); ++r) {
    const Report& x = all[r];
    if (x.call != k && x.call != k + 1)
      return fmt::format("rank {} reported call {} where another rank is at call {}", t.job_rank(r),
                         x.call, k);
    const Report*& first = at[x.call - k];
    if (!first) first = &x;
    if (!first->same_call(x))
      return fmt::format(
          "rank {} reported call {} of {} elements where another rank reported it with {}",
          t.job_rank(r), x.call, x.count, first->count);
  }
  for (unsigned r = 0; r < all.size(); ++r) {
    const Report& x = all[r];
    if (x.call == k) continue;
    if (x.tail_call != k || x.tail_count != at[0]->count || x.tail_dtype != at[0]->dtype ||
        x.tail_op != at[0]->op)
      return fmt::format("rank {} is at call {} without the results of call {}", t.job_rank(r),
                         k + 1, k);
    for (unsigned g = 0; g < x.rings; ++g)
      if (x.copied[g] != 0)
        return fmt::format("rank {} copied out results of call {}, which another rank never sent",
                           t.job_rank(r), k + 1);
  }
  return "";
}

}  // namespace

Error Collective::allreduce(const void* send, void* recv, size_t count, DataType t, Op op,
                            Clock::time_point deadline) {
  ++calls_;
  next_is_allreduce_ = false;
  if (path() == Path::ring && failback_at_ != 0 && calls_ >= failback_at_ && failed_.ok()) {
    // The try has a budget of its own (the call's), and the call its own again.
    const Clock::duration budget = std::max(deadline - Clock::now(), Clock::duration{0});
    if (Error e = fail_back(Clock::now() + budget, budget)) return e;
    deadline = Clock::now() + budget;
  }
  if (path() == Path::ring) return ring_allreduce(send, recv, count, t, op, deadline);
  const bool usable = failed_.ok();
  const Clock::time_point start = Clock::now();
  Error e = ina_allreduce(send, recv, count, t, op, deadline);
  if (e.ok() || !exchange_ || !usable || e.code == ErrorCode::invalid_argument) return e;
  // The agreement runs until the call's deadline plus its budget again: a
  // rank that learns of the failure only at its own deadline (a timeout)
  // still finds the others waiting, and has a budget of its own left.
  const Clock::time_point until =
      std::max(deadline, Clock::now()) + std::max(deadline - start, Clock::duration{0});
  return fail_over(send, recv, count, t, op, until, e);
}

Error Collective::close(Clock::time_point deadline) {
  if (!exchange_ || !failed_.ok() || path() != Path::ina || tail_.call == 0 || tail_.call != calls_)
    return {};
  ++calls_;
  last_ = {};
  for (unsigned g = 0; g < rings(); ++g) last_.base[g] = rings_[g].next_msg_id;
  last_.recoverable = true;
  closing_ = true;
  const Error e =
      fail_over(nullptr, nullptr, 0, tail_.t, tail_.op, deadline,
                format_error(ErrorCode::internal, "rank {}: closing", t_.job_rank(t_.rank())));
  closing_ = false;
  return e;
}

const std::string& Collective::path_reason() const {
  std::lock_guard lk(reason_mu_);
  return reasons_.back();
}

void Collective::keep_tail(const void* recv, size_t count, DataType t, Op op) {
  const unsigned R = rings();
  const size_t es = element_size(t);
  const auto* res = static_cast<const uint8_t*>(recv);
  tail_ = {};
  size_t at = 0;
  for (unsigned g = 0; g < R; ++g) {
    const StripeRange s = stripe(count, R, g);
    MessagePlan plan;
    if (!make_plan(s.count, t, cfg_.msg_len, cfg_.pmtu, plan).ok()) return;
    const size_t first = plan.messages > cfg_.window ? plan.messages - cfg_.window : 0;
    const size_t from = first < plan.messages ? plan.first_elem(first) : s.count;
    const size_t bytes = (s.count - from) * es;
    if (at + bytes > tail_bytes_.size()) return;  // a window of messages always fits
    if (bytes > 0) std::memcpy(tail_bytes_.data() + at, res + (s.first + from) * es, bytes);
    tail_.first[g] = static_cast<uint32_t>(first);
    tail_.at[g] = at;
    at += bytes;
  }
  tail_.call = calls_;
  tail_.count = count;
  tail_.t = t;
  tail_.op = op;
}

Error Collective::drain_receives(const std::vector<uint32_t>& expected, Path next,
                                 Clock::time_point deadline) {
  const unsigned R = rings();
  Completion comps[kPollBatch];
  for (;;) {
    bool done = true;
    for (unsigned g = 0; g < R; ++g) done = done && last_.received[g] >= expected[g];
    if (done) return {};
    unsigned n = 0;
    // One at a time: a completion past what is owed belongs to the next
    // call, whichever path it takes.
    if (Error e = t_.poll(comps, 1, n, deadline)) return e;
    if (n == 0)
      return format_error(ErrorCode::timeout,
                          "{}'s INA writes did not all arrive before the deadline",
                          predecessor_rank(t_));
    for (unsigned i = 0; i < n; ++i) {
      const Completion& c = comps[i];
      if (c.lane >= R || !c.ok || c.kind != Completion::Kind::recv_imm)
        return format_error(ErrorCode::transport,
                            "unexpected completion while draining the INA call ({})",
                            c.ok ? "a write" : c.what);
      if (last_.received[c.lane] < expected[c.lane])
        ++last_.received[c.lane];
      else if (next == Path::ring)  // the predecessor's first ring-path write: kept for its step
        rings_[c.lane].early.push_back(c);
      else  // back on the INA path: the predecessor's first message of the next call
        pending_.push_back(c);
    }
  }
}

// Step 1: every rank's report, and the call k being finished (the lowest
// reported). Returns why the ranks cannot finish it, or "".
std::string Collective::gather_reports(size_t count, DataType t, Op op, const Error& cause,
                                       Clock::time_point deadline, std::vector<FailoverReport>& all,
                                       uint64_t& k) {
  const unsigned P = t_.world(), me = t_.rank();
  Report mine;
  mine.call = calls_;
  mine.count = count;
  mine.dtype = static_cast<unsigned>(t);
  mine.op = static_cast<unsigned>(op);
  mine.recoverable = last_.recoverable ? 1 : 0;
  mine.rings = rings();
  mine.take(last_);
  if (tail_.call != 0 && tail_.call + 1 == calls_) {
    mine.tail_call = tail_.call;
    mine.tail_count = tail_.count;
    mine.tail_dtype = static_cast<unsigned>(tail_.t);
    mine.tail_op = static_cast<unsigned>(tail_.op);
  }
  mine.error = cause.message.substr(0, 400);
  std::vector<std::string> blobs;
  const Clock::time_point report_by =
      mine.recoverable ? deadline : std::min(deadline, Clock::now() + kReportGrace);
  if (Error e = exchange_(encode(mine), blobs, report_by))
    return mine.recoverable ? fmt::format("the ranks could not agree ({})", e.message)
                            : "this rank cannot (a transport error, or writes not acknowledged)";
  all.assign(P, {});
  k = mine.call;
  for (unsigned r = 0; r < P; ++r) {
    if (r >= blobs.size() || !decode(blobs[r], all[r]))
      return fmt::format("rank {} sent no failover report", t_.job_rank(r));
    k = std::min(k, all[r].call);
  }
  if (std::string why = check_calls(all, k, t_); !why.empty()) return why;
  std::string cannot;
  for (unsigned r = 0; r < P; ++r)
    if (!all[r].recoverable)
      list_append(cannot, r == me
                              ? std::string("this rank cannot")
                              : fmt::format("rank {} cannot ({})", t_.job_rank(r), all[r].error));
  return cannot;
}

// Where call k's stripe on ring g stands: messages [lo, hi) were copied out
// by some rank (a rank at k + 1 copied out all of k), `source` the lowest
// rank that copied out most; from hi on no rank got a result.
Collective::Split Collective::split(const std::vector<FailoverReport>& all, uint64_t k,
                                    unsigned g) const {
  const Report& kc =
      *std::find_if(all.begin(), all.end(), [&](const Report& x) { return x.call == k; });
  Split sp;
  const auto t = static_cast<DataType>(kc.dtype);
  sp.es = element_size(t);
  sp.s = stripe(kc.count, rings(), g);
  (void)make_plan(sp.s.count, t, cfg_.msg_len, cfg_.pmtu, sp.plan);  // sound: the call ran
  const auto copied = [&](unsigned r) {
    return all[r].call == k ? all[r].copied[g] : static_cast<uint32_t>(sp.plan.messages);
  };
  sp.lo = sp.hi = copied(0);
  for (unsigned r = 0; r < all.size(); ++r) {
    sp.lo = std::min(sp.lo, copied(r));
    if (copied(r) > sp.hi) {
      sp.hi = copied(r);
      sp.source = static_cast<unsigned>(r);
    }
  }
  return sp;
}

// Step 3: call k's messages [lo, hi) of every ring from their source (its
// receive buffer at k, its tail at k + 1) to the ranks at k.
std::string Collective::share_results(const std::vector<FailoverReport>& all, uint64_t k,
                                      void* recv, Clock::time_point deadline) {
  const unsigned P = t_.world(), me = t_.rank(), R = rings();
  const bool ahead = all[me].call == k + 1;
  auto* dst = static_cast<uint8_t*>(recv);
  std::string blob;
  size_t total = 0;  // every rank computes the same from the reports
  std::array<Split, kMaxRings> sp;
  for (unsigned g = 0; g < R; ++g) {
    sp[g] = split(all, k, g);
    const Split& x = sp[g];
    const size_t bytes = (x.elem(x.hi) - x.elem(x.lo)) * x.es;
    total += bytes;
    if (bytes == 0 || x.source != me) continue;
    if (!ahead) {
      blob.append(reinterpret_cast<const char*>(dst + (x.s.first + x.elem(x.lo)) * x.es), bytes);
      continue;
    }
    if (x.lo < tail_.first[g])
      return fmt::format(
          "ranks lack messages of call {} from {} on, and this rank keeps them from {}", k, x.lo,
          tail_.first[g]);
    const size_t off = tail_.at[g] + (x.elem(x.lo) - x.elem(tail_.first[g])) * x.es;
    blob.append(reinterpret_cast<const char*>(tail_bytes_.data() + off), bytes);
  }
  if (total == 0) return "";
  if (total > kMaxExchangeBytes)
    return fmt::format(
        "{} bytes of results to pass between the ranks, more than one bootstrap exchange carries "
        "({})",
        total, kMaxExchangeBytes);
  std::vector<std::string> blobs;
  if (Error e = exchange_(blob, blobs, deadline))
    return fmt::format("the ranks could not exchange results ({})", e.message);
  std::vector<size_t> at(P, 0);
  for (unsigned g = 0; g < R; ++g) {
    const Split& x = sp[g];
    const size_t bytes = (x.elem(x.hi) - x.elem(x.lo)) * x.es;
    if (bytes == 0) continue;
    if (blobs[x.source].size() < at[x.source] + bytes)
      return fmt::format("rank {} sent too few result bytes", t_.job_rank(x.source));
    // Where this rank copied out too, these are the same bytes (the box's
    // one result for each message). A rank at k + 1 holds call k + 1's
    // buffers: k's results are not its to copy.
    if (x.source != me && !ahead)
      std::memcpy(dst + (x.s.first + x.elem(x.lo)) * x.es, blobs[x.source].data() + at[x.source],
                  bytes);
    at[x.source] += bytes;
  }
  return "";
}

Error Collective::fail_over(const void* send, void* recv, size_t count, DataType t, Op op,
                            Clock::time_point deadline, const Error& cause) {
  const unsigned me = t_.rank(), R = rings();
  const auto give_up = [&](const std::string& why) {
    return fail(
        format_error(cause.code, "{}; not finished on the ring path: {}", cause.message, why));
  };
  // 1. Reports.
  std::vector<Report> all;
  uint64_t k = 0;
  if (std::string why = gather_reports(count, t, op, cause, deadline, all, k); !why.empty())
    return give_up(why);
  const bool ahead = all[me].call == k + 1;  // this rank completed call k
  const auto next_call =
      std::find_if(all.begin(), all.end(), [&](const Report& x) { return x.call == k + 1; });
  const bool mixed = next_call != all.end();
  if (closing_ && !ahead) return {};  // every rank is closing: nobody lacks a result

  // 2. The predecessor's INA writes still owed to this rank. What else was
  // taken (an INA write of the next call, kept) belongs to a call the ring
  // path now finishes.
  const std::vector<uint32_t> owed = owed_receives(all[me], all[t_.predecessor()], R);
  if (owed.empty()) return give_up("the predecessor's message ids do not follow this rank's");
  if (Error e = drain_receives(owed, Path::ring, deadline)) return give_up(e.message);
  pending_.clear();
  next_call_.clear();
  failed_ = {};

  // 3. Results that exist.
  if (std::string why = share_results(all, k, recv, deadline); !why.empty()) return give_up(why);

  // 4. What no rank got, on the ring path from every rank's input: call k's
  // messages from hi on, or all of call k + 1 (a rank at k runs it when it
  // comes).
  if (closing_) return {};  // a rank behind had its results: this one leaves
  if (ahead) {
    if (Error e = ring_allreduce_part(send, recv, count, t, op, deadline))
      return give_up(e.message);
  } else {
    const auto* src = static_cast<const uint8_t*>(send);
    auto* dst = static_cast<uint8_t*>(recv);
    for (unsigned g = 0; g < R; ++g) {
      const Split x = split(all, k, g);
      const size_t first = x.s.first + x.elem(x.hi), n = x.s.count - x.elem(x.hi),
                   off = first * x.es;
      if (n == 0) continue;
      if (Error e = ring_allreduce_part(src + off, dst + off, n, t, op, deadline))
        return give_up(e.message);
    }
  }
  // A rank at k takes the message ids the others reached, so that a later
  // try of the box starts every rank at the same id.
  // The others ran call k + 1 as an all-reduce on the ring path: so must
  // this rank, whatever collective it is (not a classic ring form).
  if (mixed && !ahead) next_is_allreduce_ = true;
  if (mixed && !ahead)
    for (unsigned g = 0; g < R; ++g) {
      MessagePlan plan;
      const auto nt = static_cast<DataType>(next_call->dtype);
      if (Error e =
              make_plan(stripe(next_call->count, R, g).count, nt, cfg_.msg_len, cfg_.pmtu, plan))
        return give_up(e.message);
      rings_[g].next_msg_id = next_call->base[g] + static_cast<uint32_t>(plan.messages);
    }

  std::string behind, first_error;  // ranks at call k, and the first of their errors
  for (unsigned r = 0; r < all.size(); ++r) {
    if (all[r].call != k) continue;
    list_append(behind, fmt::to_string(t_.job_rank(r)), ", ");
    if (first_error.empty()) first_error = all[r].error;
  }
  const std::string reason =
      mixed ? fmt::format(
                  "all-reduce call {0} met data no box sealed on rank(s) {1} after the others had "
                  "completed it (the box was lost between the ranks' last results): call {0} was "
                  "finished with the box's results the others kept, and call {2} on the ring path",
                  k, behind, k + 1)
            : fmt::format(
                  "all-reduce call {} failed on the INA path and was finished on the ring path", k);
  switch_path(Path::ring, fmt::format("{}; the ranks' first error: {}", reason, first_error));
  if (failback_first_ > 0) {
    failback_gap_ = failback_first_;
    failback_at_ = k + (mixed ? 1 : 0) + failback_gap_;  // the same call on every rank
  }
  return {};
}

void Collective::switch_path(Path p, std::string reason) {
  std::fprintf(stderr, "netreduce: rank %u: switched to the %s path: %s\n", t_.job_rank(t_.rank()),
               p == Path::ina ? "INA" : "ring", reason.c_str());
  {
    std::lock_guard lk(reason_mu_);
    reasons_.push_back(std::move(reason));
  }
  path_.store(p, std::memory_order_release);
  if (p == Path::ring) failovers_.fetch_add(1, std::memory_order_acq_rel);
}

// Trying the box again: rank 0's gate, then one probe all-reduce through the
// box (int32 rank + 1 per ring, message ids past any the box may still
// hold), then every rank's verdict. All sealed and right: the INA path
// again. Otherwise the ring path, and the next try after twice the gap. A
// probe that left a rank's connections unsound (writes never acknowledged:
// the box drops the ring's traffic) ends the communicator, as a failed INA
// call without failover would.
Error Collective::fail_back(Clock::time_point deadline, Clock::duration budget) {
  const unsigned P = t_.world(), me = t_.rank(), R = rings();
  const auto later = [&] {
    failback_gap_ = std::min<uint64_t>(failback_gap_ * 2, uint64_t{failback_first_} * 64);
    failback_at_ = calls_ + failback_gap_;
  };
  const auto broken = [&](const std::string& why) {
    failback_at_ = 0;  // the communicator is unusable: no more tries
    return fail(format_error(ErrorCode::transport,
                             "rank {}: trying the box again (all-reduce call {}): {}",
                             t_.job_rank(me), calls_, why));
  };
  std::vector<std::string> blobs;
  const std::string gate = me == 0 && failback_gate_ ? failback_gate_() : std::string();
  if (Error e = exchange_(gate, blobs, deadline)) return broken(e.message);
  if (blobs.empty() || !blobs[0].empty()) {
    later();
    return {};
  }
  for (RingState& g : rings_) g.next_msg_id += kFailbackIdSkip;
  std::array<int32_t, kMaxRings> mine{}, got{};
  mine.fill(static_cast<int32_t>(me) + 1);
  const Error e = ina_allreduce(mine.data(), got.data(), R, DataType::int32, Op::sum, deadline);
  tail_ = {};  // the probe is no call of the user's
  // The verdicts, as in a failover: a rank whose probe ended at its deadline
  // still finds the others waiting.
  deadline = std::max(deadline, Clock::now()) + budget;
  std::string wrong;
  for (unsigned g = 0; e.ok() && g < R && wrong.empty(); ++g)
    if (got[g] != static_cast<int32_t>(P * (P + 1) / 2))
      wrong = fmt::format("probe all-reduce gave {} on ring {}", got[g], g);
  Report mine_r;
  mine_r.call = calls_;
  mine_r.count = R;
  mine_r.dtype = static_cast<unsigned>(DataType::int32);
  mine_r.op = static_cast<unsigned>(Op::sum);
  mine_r.recoverable = e.ok() || last_.recoverable ? 1 : 0;
  mine_r.rings = R;
  mine_r.take(last_);
  mine_r.error = e.ok() ? wrong : e.message.substr(0, 400);
  if (Error x = exchange_(encode(mine_r), blobs, deadline)) return broken(x.message);
  std::vector<Report> all(P);
  std::string unsound, first_error;
  for (unsigned r = 0; r < P; ++r) {
    if (r >= blobs.size() || !decode(blobs[r], all[r]))
      return broken(fmt::format("rank {} sent no probe report", t_.job_rank(r)));
    if (!all[r].recoverable)
      list_append(unsound, fmt::format("rank {}: {}", t_.job_rank(r), all[r].error));
    if (first_error.empty() && !all[r].error.empty()) first_error = all[r].error;
  }
  if (!unsound.empty()) return broken(unsound);
  const std::vector<uint32_t> owed = owed_receives(mine_r, all[t_.predecessor()], R);
  if (owed.empty()) return broken("the predecessor's probe ids do not follow this rank's");
  if (Error x = drain_receives(owed, first_error.empty() ? Path::ina : Path::ring, deadline))
    return broken(x.message);
  failed_ = {};
  if (!first_error.empty()) {
    pending_.clear();  // the probe's INA writes, drained
    next_call_.clear();
    later();
    return {};
  }
  switch_path(Path::ina, fmt::format("after all-reduce call {}, a probe through the box was sealed "
                                     "and right on every rank",
                                     calls_ - 1));
  failback_at_ = 0;
  return {};
}

}  // namespace netreduce::host
