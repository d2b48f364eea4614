#include "engine/ring.h"

#include <algorithm>
#include <bit>

#include "engine/cells.h"
#include "engine/history.h"
#include "reduce/reduce.h"

namespace netreduce::engine {

Status validate(const RingSpec& s) {
  if (Status st = validate_fields(s); !st) return st;
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
