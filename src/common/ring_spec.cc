#include "common/ring_spec.h"

#include <algorithm>
#include <bit>
#include <string>

#include "wire/ina.h"

namespace netreduce {

uint32_t slots_for_window(uint32_t window) noexcept {
  return std::bit_ceil(2 * std::max(window, 1u));
}

Status validate_fields(const RingSpec& s) {
  const unsigned p = s.ranks();
  if (p < kMinRanks || p > kMaxRanks)
    return Status::invalid("members", "a ring needs " + std::to_string(kMinRanks) + " to " +
                                          std::to_string(kMaxRanks) + " ranks, got " +
                                          std::to_string(p));
  for (unsigned r = 0; r < p; ++r) {
    const uint32_t a = s.members[r];
    if (a == 0 || a == 0xFFFFFFFF || (a >> 28) == 0xE)
      return Status::invalid("members[" + std::to_string(r) + "]", "not a unicast IPv4 address");
    for (unsigned q = 0; q < r; ++q)
      if (s.members[q] == a)
        return Status::invalid("members[" + std::to_string(r) + "]",
                               "same address as rank " + std::to_string(q));
  }
  if (s.msg_len == 0 || s.msg_len > kMaxMsgLen)
    return Status::invalid("msg_len",
                           "packets per message must be 1.." + std::to_string(kMaxMsgLen));
  if (s.window == 0 || s.window > kMaxWindow)
    return Status::invalid("window",
                           "window must be 1.." + std::to_string(kMaxWindow) + " messages");
  switch (s.payload_bytes) {
    case 256:
    case 512:
    case 1024:
    case 2048:
    case 4096:
      break;
    default:
      return Status::invalid("payload_bytes",
                             "must be a RoCE path MTU: 256, 512, 1024, 2048 or 4096");
  }
  for (unsigned d = 0; d < 8; ++d)
    if (((s.dtype_mask >> d) & 1) && !wire::is_valid_dtype(static_cast<uint8_t>(d)))
      return Status::invalid("dtype_mask", "bit " + std::to_string(d) + " is not a dtype");
  for (unsigned o = 0; o < 8; ++o)
    if (((s.op_mask >> o) & 1) && !wire::is_valid_op(static_cast<uint8_t>(o)))
      return Status::invalid("op_mask", "bit " + std::to_string(o) + " is not a reduction op");
  if (!s.qpns.empty()) {
    if (s.qpns.size() != p)
      return Status::invalid("qpns", "needs one QP number per member (" + std::to_string(p) +
                                         "), got " + std::to_string(s.qpns.size()));
    for (unsigned r = 0; r < p; ++r)
      if (s.qpns[r] > 0xFFFFFF)
        return Status::invalid("qpns[" + std::to_string(r) + "]",
                               "a QP number has 24 bits (0..16777215)");
  }
  return {};
}

}  // namespace netreduce
