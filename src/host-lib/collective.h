// The two all-reduce algorithms over a Transport (transport.h), as plan.h
// lays them out.
//
// Buffers. Everything the NIC reads is registered once, when the collective
// is created, and reused: the INA send slots (N messages of msg_len * pmtu
// bytes) and the ring path's work buffer (one segment). The receive region
// belongs to the transport (its rkey went to the predecessor at connect
// time). Tensors are copied in and results copied out, without the header.
//
// INA path. Message i goes into send slot i mod N: INA header, then data;
// one RDMA WRITE WITH IMM (imm = message id) to the successor's receive
// slot i mod N. Rule W keeps at most N messages open; since the box releases
// message i + N only once this rank has sent it, which it does only after
// copying out message i, slot i mod N is free again when i + N lands.
//
// Ring path. Segments of at most P * stride / esize elements. The receive
// region is two halves (segment parity), each 2(P - 1) slots of `stride`
// bytes, one per step. Each step: one WRITE WITH IMM (imm = segment tag << 8 |
// step) of the chunk to send, then wait for that write's completion and for
// the predecessor's write of this step; reduce (reduce-scatter) or store
// (all-gather). The predecessor starts segment j + 1 only after finishing j,
// whose last data depends on this rank having sent in segment j, so half
// (j + 1) mod 2 is no longer read here: no credit messages are needed.
//
// Any timeout or transport error leaves the ranks out of step: the
// collective then refuses further calls with the first error.
#pragma once

#include <deque>
#include <memory>
#include <string>

#include "host-lib/plan.h"
#include "host-lib/transport.h"

namespace netreduce::host {

struct CollectiveConfig {
  Path path = Path::ring;
  std::string reason;  // why this path
  uint32_t ring_id = 0;
  uint16_t msg_len = 4;
  uint16_t pmtu = 1024;
  uint16_t window = 2;
};

// Receive-region bytes a configuration needs (at least ring_buffer_bytes).
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

  const CollectiveConfig& config() const noexcept { return cfg_; }

 private:
  Collective(Transport& t, const CollectiveConfig& cfg);
  Error check_args(const void* send, void* recv, size_t count, DataType t, Op op) const;
  Error fail(Error e);

  Transport& t_;
  CollectiveConfig cfg_;
  struct Buffer;
  std::unique_ptr<Buffer> send_buf_, work_buf_;
  Region send_mr_{}, work_mr_{};
  size_t ring_stride_ = 0;  // bytes per ring receive slot
  uint32_t next_msg_id_ = 0;
  uint32_t seg_seq_ = 0;
  Error failed_{};
  std::deque<Completion> early_;  // ring path: receives that came before their step
};

// Checks that the box really is on the path before the INA path is trusted:
// one all-reduce of int32 (rank + 1) that must sum to P (P + 1) / 2. Without
// a box each rank would get its predecessor's data and the INA path would
// silently return wrong results. Returns the all-reduce's own error (a
// timeout: the box drops our packets), or ok with `confirmed` false and a
// reason when the sum is wrong.
Error probe_box(Collective& c, unsigned rank, unsigned world, Clock::time_point deadline,
                bool& confirmed, std::string& reason);

}  // namespace netreduce::host
