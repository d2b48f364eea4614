// A ring's specification: the contract between the host library, the
// control daemon and the data plane (one job's all-reduce group as the
// control plane installs it).
//
// P ranks, rank r at IPv4 address members[r]; each rank RDMA-WRITEs messages
// of up to msg_len packets of up to payload_bytes each (the RoCE path MTU;
// the first packet of a message carries the 24-byte INA header in that
// budget) to its successor. window is the host window N of rule W
// (docs/design.md#cells-and-the-window-rule): the box keeps S >= 2N message
// slots per ring (S is 2N rounded up to a power of two so that msg_id mod S
// is wrap-safe).
//
// qpns (optional): qpns[r] is the number of the QP on which member r
// receives this ring's WRITEs (its predecessor's packets carry it as the
// BTH destination QP). The box never needs it to aggregate; given, it lets
// the data plane tell apart rings over the same members (the stripes of
// one job, Options::rings) by connection and run them on different worker
// lcores (dataplane/placement.h). Empty: not given.
//
// Layering: this file knows the wire's dtype and op codes and nothing of the
// engine. The engine (engine/ring.h) adds what depends on its records: the
// memory a ring needs and the check of a ring's memory quota against it.
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"

namespace netreduce {

inline constexpr unsigned kMinRanks = 2;
inline constexpr unsigned kMaxRanks = 64;
inline constexpr unsigned kMaxMsgLen = 1024;  // packets per message
inline constexpr unsigned kMaxWindow = 1024;  // messages

struct RingSpec {
  uint32_t ring_id = 0;
  std::vector<uint32_t> members;  // rank -> IPv4 address (host order)
  uint16_t msg_len = 0;           // packets per message (at most)
  uint16_t window = 0;            // host window N
  uint16_t payload_bytes = 0;     // RoCE path MTU: 256, 512, 1024, 2048 or 4096
  uint8_t dtype_mask = 0;         // bit (1 << dtype) for each allowed wire::Dtype; 0 = all
  uint8_t op_mask = 0;            // bit (1 << op) for each allowed wire::ReduceOp; 0 = all
  uint64_t memory_quota = 0;      // bytes this ring may hold; 0 = no per-ring quota
  std::vector<uint32_t> qpns;     // rank -> receiving QP number (24 bits); empty: not given

  unsigned ranks() const noexcept { return static_cast<unsigned>(members.size()); }
  bool allows_dtype(uint8_t d) const noexcept { return dtype_mask == 0 || (dtype_mask >> d) & 1; }
  bool allows_op(uint8_t o) const noexcept { return op_mask == 0 || (op_mask >> o) & 1; }
  bool operator==(const RingSpec&) const = default;
};

// Message slots for a window: 2N rounded up to a power of two.
uint32_t slots_for_window(uint32_t window) noexcept;

// Checks every field on its own; the Status names the first bad one. Whether
// memory_quota covers the ring's memory is the engine's check
// (engine::validate), which runs this first.
Status validate_fields(const RingSpec& spec);

}  // namespace netreduce
