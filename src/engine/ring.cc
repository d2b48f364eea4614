#include "engine/ring.h"

#include <algorithm>
#include <bit>

#include "engine/cells.h"
#include "engine/history.h"
#include "reduce/reduce.h"

namespace netreduce::engine {

uint32_t slots_for_window(uint32_t window) noexcept {
  return std::bit_ceil(2 * std::max(window, 1u));
}

Status validate(const RingSpec& s) {
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
  if (s.memory_quota != 0) {
    const uint64_t need = ring_memory_bytes(s, ReduceMode::deterministic);
    if (need > s.memory_quota)
      return {StatusCode::resource_exhausted, "memory_quota",
              "ring needs " + std::to_string(need) + " bytes, quota is " +
                  std::to_string(s.memory_quota)};
  }
  return {};
}

uint64_t ring_memory_bytes(const RingSpec& s, ReduceMode mode) noexcept {
  using namespace detail;
  // Largest frame of a held packet: its headers (kMaxDataOffset counts the
  // INA header, which payload_bytes already includes) + payload + pad + ICRC.
  constexpr uint64_t kFrameOverhead =
      kMaxDataOffset - sizeof(wire::InaHdr) + kMaxPad + wire::kIcrcBytes;
  const uint64_t slots = slots_for_window(s.window);
  const uint64_t cells = slots * s.msg_len;
  const uint64_t p = s.ranks();
  const uint64_t result = s.payload_bytes;
  const uint64_t per_ring =
      slots * (sizeof(MsgSlot) + p * sizeof(HistEntry)) + p * sizeof(RankConn);
  if (mode == ReduceMode::deterministic) {
    // Held packets (all but the completing one) + held-packet records + result.
    return per_ring + cells * (sizeof(Cell) + result + p * sizeof(Held) +
                               (p - 1) * (kFrameOverhead + s.payload_bytes));
  }
  // Accumulator in fp32 for 16-bit types (twice the payload) + stored headers.
  return per_ring + cells * (sizeof(Cell) + 2 * result + result + p * sizeof(StoredHdr));
}

}  // namespace netreduce::engine
