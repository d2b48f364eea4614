// The two all-reduce algorithms over a Transport (transport.h), as plan.h
// lays them out, striped over R = transport.lanes() rings (Options::rings):
// the INA path in ina_path.cc, the ring path (and the classic ring
// reduce-scatter and all-gather) in collective.cc, failover between them in
// failover.cc.
// Design: docs/design.md#cells-and-the-window-rule (rule W) and
// docs/design.md#parallel-rings (stripes).
//
// Example: P = 3 ranks, R = 2 rings, window N = 2, a call on 5 fp32.
//  - Stripes: ring 0 takes elements 0-2, ring 1 elements 3-4 (plan.h), each
//    with its own lane (QPs, receive region), send slots or work buffer,
//    message ids or segment tags, and window. One loop posts what every
//    window allows, then polls the one completion queue and hands each
//    completion to its ring (Completion::lane). R = 1 is unstriped.
//  - INA path: ring 0's message j goes into its send slot j mod 2 (INA
//    header with ring 0's id, then data) and leaves as one RDMA WRITE WITH
//    IMM (imm = j) to the successor's receive slot j mod 2 of lane 0; the
//    box reduces it with the other ranks' and releases the sum there, its
//    immediate now j ^ crc32(sum): this rank copies the result out only
//    when the immediate it gets is that seal (src/engine/digest.h).
//  - Ring path: per ring, segments of at most P * stride / esize elements;
//    2(P - 1) = 4 steps each, one WRITE WITH IMM (imm = segment tag << 8 |
//    step) into the successor's half (segment parity) of its receive
//    region, then reduce (reduce-scatter) or store (all-gather) what the
//    predecessor wrote for this step.
//  - Ring reduce-scatter and all-gather (the classic forms): the same
//    calls with ring_step's first (or last) P - 1 = 2 steps per segment;
//    stripes and segments cut each rank's part [0, n), so a segment is one
//    sub-range of all P parts (chunks of at most stride / esize elements),
//    and ring_step's chunk q is chunk q - 1: the reduce-scatter leaves rank
//    r with shard r, the all-gather sends its own part first. Shard c is
//    folded from rank c + 1 round to rank c: with P = 3, rank 0 gets
//    (x1[0] op x2[0]) op x0[0] (any R, any segments).
//
// Contracts (one caller at a time per collective):
// - This rank writes only its send slots and work buffer (registered once,
//   at create), and copies results out of its receive region.
// - INA: the result of message j + N can land in slot j mod N only after
//   this rank sent j + N, which it does after copying out message j.
// - Ring: the predecessor starts segment j + 1, and so writes half
//   (j + 1) mod 2, only after segment j, which needs this rank's sends: no
//   credit messages (with P - 1 steps too: the predecessor's last step of
//   segment j + 1 waits on this rank's first). A receive that comes before
//   its step waits in a queue.
// - A timeout or transport error leaves the ranks out of step: later calls
//   fail with the first error, which names the ring and the message.
// - Failover (failover.cc, once set_exchange was called): an INA call that
//   met data no box sealed is finished on the ring path by every rank
//   together, agreeing over the exchange; calls then take the ring path.
// The box reduces each stripe in rank order, so INA results equal the
// unstriped ones; ring all-reduce float sums follow chunk order and depend
// on R and the segments; the ring reduce-scatter's order does not.
#pragma once

#include <array>
#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "host-lib/plan.h"
#include "host-lib/transport.h"

namespace netreduce::host {

struct CollectiveConfig {
  Path path = Path::ring;
  std::string reason;  // why this path
  // The box's ring id of each ring (lane), ring_ids[i] for ring i; missing
  // entries are 0 (the ring path has no box ring).
  std::vector<uint32_t> ring_ids;
  uint16_t msg_len = 4;
  uint16_t pmtu = 1024;
  uint16_t window = 2;

  uint32_t ring_id(unsigned i) const noexcept { return i < ring_ids.size() ? ring_ids[i] : 0; }
};

// Receive-region bytes a configuration needs per lane (at least ring_buffer_bytes).
size_t recv_region_bytes(const CollectiveConfig& cfg, unsigned world, size_t ring_buffer_bytes);

inline constexpr unsigned kPollBatch = 16;  // completions taken per poll
// Immediates: a ring-path write's is tag << 8 | step, its tag 23 bits, so
// bit 31 is clear; a stop notice's (failover) is kStopBit | its call's
// number: an INA call that meets a zero-length write of a ring-path call
// that follows it tells the two apart.
inline constexpr uint32_t kRingTagMask = 0x7FFFFF;
inline constexpr uint32_t kStopBit = 0x80000000u;
// The most data bytes one call may carry (check_args).
inline constexpr size_t kMaxCallBytes = size_t{1} << 40;
// The most one exchange carries (the bootstrap's frames hold 16 MiB).
inline constexpr size_t kMaxExchangeBytes = size_t{15} << 20;

// One rank's account of a failed INA call (failover.cc).
struct FailoverReport;

// Out-of-band allgather among the ring's ranks (the bootstrap connection):
// every rank's blob in rank order, within the deadline. Failover uses it to
// agree on a failed call (failover.cc).
using Exchange = std::function<Error(const std::string& mine, std::vector<std::string>& all,
                                     Clock::time_point deadline)>;

class Collective {
 public:
  static Error create(Transport& transport, const CollectiveConfig& cfg,
                      std::unique_ptr<Collective>& out);
  ~Collective();

  // Leaving the job (the communicator closes): a rank whose last call
  // completed on the INA path may keep the only copy of a result another
  // rank lost in that call (the box left between the ranks' last results:
  // failover.cc). It takes part in that rank's agreement as a rank at the
  // next call with nothing to reduce. Every rank whose last call completed
  // on the INA path with failover on does so, so with nobody behind it is a
  // barrier over the exchange; other ranks return at once.
  Error close(Clock::time_point deadline);
  // On the path in use; an INA call that fails is finished on the ring path
  // when failover is on (set_exchange) and every rank can (failover.cc).
  Error allreduce(const void* send, void* recv, size_t count, DataType t, Op op,
                  Clock::time_point deadline);
  // Same, forcing the ring algorithm (tests; also what the ring path runs).
  Error ring_allreduce(const void* send, void* recv, size_t count, DataType t, Op op,
                       Clock::time_point deadline);
  // The classic ring reduce-scatter, P - 1 steps: send holds world x
  // recv_count elements, recv gets this rank's shard r, elements
  // [r recv_count, (r + 1) recv_count) of the reduction, folded from rank
  // r + 1 round to rank r (see the top of this file). recv may be send's
  // own shard (send + rank x recv_count), and may not overlap it otherwise.
  Error ring_reduce_scatter(const void* send, void* recv, size_t recv_count, DataType t, Op op,
                            Clock::time_point deadline);
  // The classic ring all-gather, P - 1 steps: recv (world x count
  // elements) gets rank 0's send, rank 1's, ..., as raw bytes (bit-exact,
  // any dtype). send may be recv + rank x count (in place), and may not
  // overlap recv otherwise.
  Error ring_all_gather(const void* send, void* recv, size_t count, DataType t,
                        Clock::time_point deadline);
  Error ina_allreduce(const void* send, void* recv, size_t count, DataType t, Op op,
                      Clock::time_point deadline);

  // The arguments of a call (dtype, op, buffers, size, overlap), as
  // allreduce checks them; also the local stage's (local.h).
  static Error check_args(const void* send, void* recv, size_t count, DataType t, Op op);
  // Its parts that name a bad type or op (the one-pass collectives' too).
  static Error check_dtype(DataType t);
  static Error check_op(Op op);

  const CollectiveConfig& config() const noexcept { return cfg_; }
  // Turns failover on (a ring without local ranks, after the probe).
  void set_exchange(Exchange x) { exchange_ = std::move(x); }
  // Failback: after a failover, the box is tried again after `first_gap`
  // calls, the gap doubling after each failed try up to 64 x (0: never).
  // `gate`, asked on rank 0 only (may be empty), returns why not to try now
  // (e.g. the daemon does not list the ring as installed), or "".
  void set_failback(uint32_t first_gap, std::function<std::string()> gate) {
    failback_first_ = first_gap;
    failback_gate_ = std::move(gate);
  }
  // The path calls take now: config().path until a failover, then ring.
  Path path() const noexcept { return path_.load(std::memory_order_acquire); }
  // A failover finished the call this rank was in while the others were
  // one call ahead and ran that next call as an all-reduce on the ring
  // path: this rank's next call must be allreduce() too, whatever
  // collective it is (not a classic ring form, not a ring chosen per call).
  bool next_is_allreduce() const noexcept { return next_is_allreduce_; }
  // Failovers so far, and why the path is what it is (config().reason until
  // the first switch, then the last switch's; the reference stays valid
  // while the collective lives).
  unsigned failovers() const noexcept { return failovers_.load(std::memory_order_acquire); }
  const std::string& path_reason() const;
  // The call that made this collective unusable failed on a result the box
  // had not sealed (the error says which message).
  bool failed_seal() const noexcept { return failed_seal_; }
  unsigned rings() const noexcept { return static_cast<unsigned>(rings_.size()); }

  // What this rank's last call did (allreduce, ring_allreduce,
  // ina_allreduce, ring_reduce_scatter, ring_all_gather; a failed call's
  // record is as far as it got). path: where it ran (ring once a failover
  // finished it there). dependent_steps: the network steps one segment's
  // data went through, as executed: 2(P - 1) for a ring all-reduce, P - 1
  // for a ring reduce-scatter or all-gather, 1 for the box's pass, 0 when
  // nothing went on the wire (count 0, one rank). bytes_sent: data bytes
  // this rank wrote to the wire (INA headers not counted).
  struct CallRecord {
    Path path = Path::ring;
    unsigned dependent_steps = 0;
    uint64_t bytes_sent = 0;
  };
  const CallRecord& last_call() const noexcept { return record_; }

 private:
  Collective(Transport& t, const CollectiveConfig& cfg);
  class InaCall;   // one INA call (ina_path.cc)
  class RingCall;  // one ring-path call (collective.cc)
  enum class RingForm : uint8_t { all_reduce, reduce_scatter, all_gather };
  static const char* form_name(RingForm f);
  // One ring-path call of form f, its arguments checked; count: elements
  // (all-reduce) or elements of each rank's part (the others).
  Error ring_run(RingForm f, const void* send, void* recv, size_t count, DataType t, Op op,
                 Clock::time_point deadline);
  // ring_allreduce without starting a new record (failover's ring part).
  Error ring_allreduce_part(const void* send, void* recv, size_t count, DataType t, Op op,
                            Clock::time_point deadline);
  Error check_parts(const void* whole_buf, const void* part_buf, size_t part, DataType t,
                    const char* whole_name, const char* part_name) const;
  Error fail(Error e);
  Error fail_over(const void* send, void* recv, size_t count, DataType t, Op op,
                  Clock::time_point deadline, const Error& cause);
  // Failover's steps (failover.cc); each returns why not, or "".
  std::string gather_reports(size_t count, DataType t, Op op, const Error& cause,
                             Clock::time_point deadline, std::vector<FailoverReport>& all,
                             uint64_t& k);
  std::string share_results(const std::vector<FailoverReport>& all, uint64_t k, void* recv,
                            Clock::time_point deadline);
  struct Split {
    StripeRange s;
    MessagePlan plan;
    size_t es = 0;
    uint32_t lo = 0, hi = 0;
    unsigned source = 0;
    // First element of message m in the stripe (its end for m past the last).
    size_t elem(uint32_t m) const { return m >= plan.messages ? s.count : plan.first_elem(m); }
  };
  Split split(const std::vector<FailoverReport>& all, uint64_t k, unsigned g) const;
  // Takes the receives until ring g's count reaches expected[g]; later
  // ones are kept for the path that comes next.
  Error drain_receives(const std::vector<uint32_t>& expected, Path next,
                       Clock::time_point deadline);
  // Keeps the last window of a completed INA call's result (tail_).
  void keep_tail(const void* recv, size_t count, DataType t, Op op);
  Error fail_back(Clock::time_point deadline, Clock::duration budget);
  void switch_path(Path p, std::string reason);
  // "ring i of R (id X, stripe bytes [a, b))" for errors.
  std::string ring_name(unsigned i, const StripeRange& s, size_t esize) const;
  // That and ": " with R > 1; empty with one ring (its errors name no
  // stripe).
  std::string ring_tag(unsigned i, const StripeRange& s, size_t esize) const;

  // What each ring keeps from call to call.
  struct RingState {
    uint32_t next_msg_id = 0;      // INA path: id of the ring's next message
    uint32_t seg_seq = 0;          // ring path: segments done (tag, half)
    std::deque<Completion> early;  // ring path: receives that came before their step
  };

  Transport& t_;
  CollectiveConfig cfg_;
  struct Buffer;
  std::unique_ptr<Buffer> send_buf_, work_buf_;  // one section per ring
  Region send_mr_{}, work_mr_{};
  size_t send_ring_bytes_ = 0;  // INA send slots of one ring
  size_t work_ring_bytes_ = 0;  // ring path work buffer of one ring
  size_t ring_stride_ = 0;      // bytes per ring-path receive slot
  size_t ring_base_ = 0;        // where they start: past the INA slots
  size_t ring_slot(size_t i) const noexcept { return ring_base_ + i * ring_stride_; }
  std::vector<RingState> rings_;
  std::vector<uint8_t> stage_;  // INA path: a result while its seal is checked
  // INA path: completions a failback's drain took that belong to the next
  // call (read before the transport's).
  std::deque<Completion> pending_;
  // INA path: the predecessor's first write (or stop notice) of the next
  // call, met while this call waited only for its own writes' ACKs (a
  // bypassed box lets it overtake them); pending_ for the next call.
  std::deque<Completion> next_call_;
  Error failed_{};
  bool failed_seal_ = false;
  CallRecord record_{};
  bool next_is_allreduce_ = false;

  // The last INA call, per ring: its first message id, messages copied out
  // (a prefix), sent, and receives completed (those kept for the next call
  // included); `recoverable`: it failed on data no box sealed with every
  // write of this rank acknowledged (the transport is sound).
  struct InaOutcome {
    std::array<uint32_t, kMaxRings> base{}, copied{}, sent{}, received{};
    bool recoverable = false;
  };
  InaOutcome last_{};
  // The last INA call this rank completed, and per ring the result of its
  // last `window` messages (from message `first`, at `at` in tail_bytes_).
  // The box sealed a call's last message only once every rank had sent it,
  // so every rank had copied out all but at most its last window: a rank
  // that lost the rest (the box left between the ranks' last results, and
  // the predecessor's raw write of the next call landed over a result it
  // had not read) gets them from here (failover.cc).
  struct Tail {
    uint64_t call = 0;  // 0: none
    uint64_t count = 0;
    DataType t = DataType::fp32;
    Op op = Op::sum;
    std::array<uint32_t, kMaxRings> first{};
    std::array<size_t, kMaxRings> at{};
  };
  Tail tail_{};
  std::vector<uint8_t> tail_bytes_;  // rings x window x a message's data bytes
  Exchange exchange_;
  uint64_t calls_ = 0;    // allreduce calls so far (every rank alike)
  bool closing_ = false;  // close() runs the agreement as a call of nothing
  uint32_t failback_first_ = 0;
  uint64_t failback_gap_ = 0, failback_at_ = 0;  // calls; at 0: no try scheduled
  std::function<std::string()> failback_gate_;
  std::atomic<Path> path_{Path::ring};
  std::atomic<unsigned> failovers_{0};
  mutable std::mutex reason_mu_;
  std::deque<std::string> reasons_;  // config().reason, then one per failover
};

// Checks that the box really is on the path before the INA path is trusted:
// one all-reduce of R int32 (rank + 1), one element per ring, each of which
// must sum to P (P + 1) / 2. Every INA message is checked against the box's
// seal anyway; the sum is a second check. Returns the all-reduce's own error
// (a timeout: the box drops our packets), or ok with `confirmed` false and a
// reason when a result fails its seal (no sealing box on the path: the
// error's text) or a sum is wrong (naming the ring). Either way `c` is
// unusable afterwards; the caller makes the ring path's.
Error probe_box(Collective& c, unsigned rank, unsigned world, Clock::time_point deadline,
                bool& confirmed, std::string& reason);

}  // namespace netreduce::host
