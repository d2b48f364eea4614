// Result digests: how a host tells a result the box made from its
// predecessor's raw data (docs/design.md#result-digests).
//
// A bypassed or restarted box lets a rank's RDMA WRITE reach its successor
// unreduced: same length, same INA header, same immediate. So the box
// vouches for each message it delivers: the ImmDt of the message's last
// packet (the WRITE LAST / ONLY WITH IMMEDIATE the host's completion
// carries) becomes
//     msg_id XOR crc32(the message's result data)
// (crc32: the zlib CRC of the data after the INA header, over all its
// packets), and the host accepts a message only when imm XOR crc32(what it
// received) == msg_id. A message's last packets leave only sealed: while
// an earlier cell of the message is not complete here they are dropped
// (message_incomplete), so no copy of them with the sender's immediate can
// reach a receiver late and be taken. A raw write (the box bypassed) keeps
// the sender's imm == msg_id, which passes only for data whose CRC is 0
// (2^-32): a message any packet of which did not come out of a complete
// cell of this box is rejected.
//
// Example: message 9 of 3 packets, cells c0, c1, c2 of data lengths 1000,
// 1024, 76 with result CRCs r0, r1, r2 (Cell::crc, computed once when each
// completes). c2 completes last: the digest is
//     d = combine(combine(r0, r1, 1024), r2, 76)
// (CRC linearity, wire/icrc.h), and each of the three released last
// packets gets ImmDt 9 ^ d, its ICRC fixed over the new header. Had c1 not
// been complete (one rank's middle packet lost before the box), the last
// packets would be dropped (their receivers lack packet 1 and would
// discard them anyway); the senders go back, and the resent last packets are
// served from c2, sealed, once c1 completes.
//
// Engine thread only; one combine per cell of the message, once per
// released last packet's cell.
#pragma once

#include <cstdint>

#include "engine/icrc_fixup.h"
#include "engine/ring_state.h"

namespace netreduce::engine::detail {

// The crc32 of the data of the message whose last cell is `last` (cell
// index ci = its message's slot base + k, k = ci mod msg_len), when every
// cell 0..k of that message is complete here; false otherwise.
inline bool message_crc(Ring& ring, size_t last, ShiftCache& shifts, uint32_t& out) noexcept {
  const size_t k = last % ring.msg_len;
  const size_t base = last - k;
  const uint32_t tag = ring.cells[last].tag;
  uint32_t d = 0;
  for (size_t j = 0; j <= k; ++j) {
    const Cell& c = ring.cells[base + j];
    if (c.state != CellState::complete || c.tag != tag) return false;
    d = j == 0 ? c.crc : shifts.get(c.data_len).combine(d, c.crc);
  }
  out = d;
  return true;
}

// Writes `imm` into a packet's ImmDt and, for the linear fix-up, the head
// CRC that now covers it (the ImmDt lies before the data).
template <IcrcFixup F>
inline void seal(uint8_t* frame, const wire::ParsedFrame& p, uint16_t data_off, uint32_t imm,
                 uint32_t& head) noexcept {
  reinterpret_cast<wire::ImmDt*>(frame + p.immdt)->imm.set(imm);
  head = head_crc<F>(frame, p, data_off);
}

}  // namespace netreduce::engine::detail
