// ICRC fix-up: the shift cache's miss path (icrc_fixup.h).
#include "engine/icrc_fixup.h"

namespace netreduce::engine::detail {

const wire::Crc32Shift& ShiftCache::rebuild(uint32_t len) noexcept {
  wire::Crc32Shift& e = entries[next++ % kEntries];
  e.set(len);
  ++misses;
  return e;
}

}  // namespace netreduce::engine::detail
