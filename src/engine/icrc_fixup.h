// ICRC fix-up of released packets (docs/design.md#icrc-fix-up).
//
// full: recompute each released packet's ICRC over the whole packet.
// linear: ICRC = crc(head || data || pad) = combine(crc(head), crc(data ||
// pad)) with CRC linearity: crc(data) once per cell (Cell::crc), per packet
// only its head CRC and the shift of len(data || pad). The head CRC comes
// with the packet (Held / StoredHdr::head_crc): ICRC verification produced
// it on arrival (wire::icrc_verify_head), and the engine only rewrites the
// data and the ICRC, so the released packet's masked header bytes are the
// received ones. The shift operators are cached per engine by length
// (ShiftCache). Engine thread only.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/line_vector.h"
#include "engine/ring.h"
#include "wire/icrc.h"
#include "wire/parse.h"

namespace netreduce::engine::detail {

// Shift operators for the linear fix-up, by data length, one cache per
// engine (rings come and go; lengths stay). A ring sees few lengths (full
// first packets, full middle packets, each message's last packet) and rings
// on one box mostly share their MTU, so eight entries replaced round-robin
// almost never miss; a miss rebuilds one table (about 2 us).
struct ShiftCache {
  static constexpr unsigned kEntries = 8;
  static constexpr uint32_t kNone = UINT32_MAX;
  uint32_t lens[kEntries] = {kNone, kNone, kNone, kNone,
                             kNone, kNone, kNone, kNone};  // one line to scan
  LineVector<wire::Crc32Shift> entries;  // kEntries, sized by the engine (linear only)
  unsigned next = 0;
  unsigned misses = 0;  // tables rebuilt
  const wire::Crc32Shift& get(uint32_t len) noexcept {
    for (unsigned i = 0; i < kEntries; ++i)
      if (lens[i] == len) return entries[i];
    return rebuild(len);
  }
  const wire::Crc32Shift& rebuild(uint32_t len) noexcept;
};

// The head CRC a released packet needs for fix_icrc<F> when verification
// did not produce it (verification off): computed from the frame. 0 for full.
template <IcrcFixup F>
inline uint32_t head_crc(const uint8_t* frame, const wire::ParsedFrame& p,
                         uint16_t data_off) noexcept {
  if constexpr (F == IcrcFixup::linear) return wire::icrc_head(frame, p, data_off);
  return 0;
}

// Stores the ICRC of a frame whose data [data_off, data_off + data_len) was
// rewritten with a result whose crc32 is crc_data (Cell::crc; full ignores it).
template <IcrcFixup F>
inline void fix_icrc(ShiftCache& shifts, uint8_t* frame, const wire::ParsedFrame& p,
                     uint16_t data_off, uint16_t data_len, uint32_t crc_data,
                     uint32_t head) noexcept {
  if constexpr (F == IcrcFixup::full) {
    wire::icrc_update(frame, p);
  } else {
    const uint32_t tail =
        p.pad ? wire::crc32(crc_data, frame + data_off + data_len, p.pad) : crc_data;
    wire::icrc_store(frame, p, shifts.get(data_len + p.pad).combine(head, tail));
  }
}

}  // namespace netreduce::engine::detail
