// The two all-reduce algorithms over a Transport (transport.h), as plan.h
// lays them out, striped over the transport's lanes.
//
// Rings. A communicator runs R = transport.lanes() rings side by side
// (Options::rings). A call cuts the tensor into R stripes (plan.h: stripe i
// holds count / R elements, one more for i < count % R) and stripe i runs on
// ring i: its own lane (QPs, receive region), its own send slots and work
// buffer, its own message ids (INA) or segment tags (ring path), its own
// window. All R are in flight at once: one loop posts what every ring's
// window allows, then polls the one completion queue and hands each
// completion to its ring (Completion::lane). R = 1 is the unstriped
// collective, byte for byte.
//
// Buffers. Everything the NIC reads is registered once, when the collective
// is created, and reused: the INA send slots (per ring N messages of msg_len
// * pmtu bytes) and the ring path's work buffer (per ring one segment). The
// receive regions belong to the transport (their rkeys went to the
// predecessor at connect time). Tensors are copied in and results copied
// out, without the header.
//
// INA path. On ring i, message j goes into that ring's send slot j mod N:
// INA header (ring i's id), then data; one RDMA WRITE WITH IMM (imm =
// message id) to the successor's receive slot j mod N of lane i. Rule W
// keeps at most N messages of each ring open; since the box releases
// message j + N only once this rank has sent it, which it does only after
// copying out message j, slot j mod N is free again when j + N lands.
// Bit-exact rule: the box reduces every stripe in rank order on its ring,
// element by element, so the striped result equals the unstriped one.
//
// Ring path. Per ring, segments of at most P * stride / esize elements of
// its stripe. The receive region is two halves (segment parity), each
// 2(P - 1) slots of `stride` bytes, one per step. Each step: one WRITE WITH
// IMM (imm = segment tag << 8 | step) of the chunk to send, then wait for
// that write's completion and for the predecessor's write of this step;
// reduce (reduce-scatter) or store (all-gather). The predecessor starts
// segment j + 1 only after finishing j, whose last data depends on this rank
// having sent in segment j, so half (j + 1) mod 2 is no longer read here: no
// credit messages are needed. A ring's receive that arrives before its step
// (the predecessor runs ahead, possibly into the next call) waits in that
// ring's queue. Float sums follow each segment's chunk order, so they depend
// on R (as on ring_buffer_bytes); integers and min/max do not.
//
// Any timeout or transport error leaves the ranks out of step: the
// collective then refuses further calls with the first error. Errors name
// the ring (index, id, the stripe's byte range) and the message.
#pragma once

#include <deque>
#include <memory>
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

class Collective {
 public:
  static Error create(Transport& transport, const CollectiveConfig& cfg,
                      std::unique_ptr<Collective>& out);
  ~Collective();

  Error allreduce(const void* send, void* recv, size_t count, DataType t, Op op,
                  Clock::time_point deadline);
  // Same, forcing the ring algorithm (tests; also what the ring path runs).
  Error ring_allreduce(const void* send, void* recv, size_t count, DataType t, Op op,
                       Clock::time_point deadline);
  Error ina_allreduce(const void* send, void* recv, size_t count, DataType t, Op op,
                      Clock::time_point deadline);

  // The arguments of a call (dtype, op, buffers, size, overlap), as
  // allreduce checks them; also the local stage's (local.h).
  static Error check_args(const void* send, void* recv, size_t count, DataType t, Op op);

  const CollectiveConfig& config() const noexcept { return cfg_; }
  unsigned rings() const noexcept { return static_cast<unsigned>(rings_.size()); }

 private:
  Collective(Transport& t, const CollectiveConfig& cfg);
  Error fail(Error e);
  // "ring i of R (id X, stripe bytes [a, b))" for errors.
  std::string ring_name(unsigned i, const StripeRange& s, size_t esize) const;
  // That and ": " with R > 1; empty with one ring (whose errors read as
  // they did before striping).
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
  std::vector<RingState> rings_;
  Error failed_{};
};

// Checks that the box really is on the path before the INA path is trusted:
// one all-reduce of R int32 (rank + 1), one element per ring, each of which
// must sum to P (P + 1) / 2. Without a box each rank would get its
// predecessor's data and the INA path would silently return wrong results.
// Returns the all-reduce's own error (a timeout: the box drops our packets),
// or ok with `confirmed` false and a reason (naming the ring) when a sum is
// wrong.
Error probe_box(Collective& c, unsigned rank, unsigned world, Clock::time_point deadline,
                bool& confirmed, std::string& reason);

}  // namespace netreduce::host
