// ICRC fix-up: the shift cache's miss path (icrc_fixup.h).
#include "engine/icrc_fixup.h"

namespace netreduce::engine::detail {

const wire::Crc32Shift& ShiftCache::rebuild(uint32_t len) noexcept {
  const unsigned i = next++ % kEntries;
  lens[i] = len;
  wire::Crc32Shift& e = entries[i];
  e.set(len);
  ++misses;
  return e;
}

}  // namespace netreduce::engine::detail
