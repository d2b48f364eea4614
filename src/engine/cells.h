// Aggregator cells and what they keep (docs/design.md#cells-and-the-window-rule).
//
// A ring has S message slots of msg_len cells; a cell holds one packet
// position of one message: its tag (msg_id), the ranks that arrived, and the
// state empty -> collecting -> complete (a tree node's cell passes through
// awaiting between the two: partial sent up, result not yet back; tree.h).
// cell_case() is the state machine's decision for a data packet, the five
// cases of docs/design.md#cells-and-the-window-rule (cell_case_box() the
// same for a child box's partial, on its own bitmap):
//   1 serve      tag == m, complete: emit the stored result in this packet
//   2 duplicate  tag == m, the rank's bit set, not complete: drop
//   3 take       tag == m (or empty), bit clear: hold it; P-th completes
//   4 reset      tag older than m: reset the cell to m, then take
//   5 stale      tag newer than m: drop (never happens under rule W)
//
// What a cell keeps per rank until completion: deterministic mode holds the
// packet (Held: the buffer, its parse, no copy); accumulate mode keeps only
// its headers (StoredHdr) and rebuilds the released packet from them
// (store_header / rebuild_header). Both keep the CRC state of the packet's
// ICRC-covered bytes before its data (head_crc), a by-product of ICRC
// verification that the linear fix-up reuses (icrc_fixup.h). Written and
// read by the engine thread only.
#pragma once

#include <array>
#include <cstdint>

#include "engine/engine.h"
#include "wire/headers.h"
#include "wire/opcode.h"
#include "wire/parse.h"
#include "wire/psn.h"

namespace netreduce::engine::detail {

enum class CellState : uint8_t { empty, collecting, awaiting, complete };

struct Cell {
  uint64_t arrived = 0;   // bitmap over ranks
  uint64_t first_at = 0;  // first arrival (process()'s clock), for stall reporting
  uint32_t tag = 0;       // msg_id
  uint16_t data_len = 0;  // data bytes per packet (excludes the INA header)
  uint8_t dtype = 0;
  uint8_t op = 0;
  CellState state = CellState::empty;
  uint16_t boxes = 0;  // tree: bitmap over child boxes whose partial arrived (in the padding)
  uint32_t crc = 0;    // complete: crc32 of the result (the digest's part, digest.h; the fix-up's)
};
static_assert(sizeof(Cell) == 32, "a cell stays half a line");

struct MsgSlot {
  uint32_t tag = 0;
  uint16_t len = 0;
  uint16_t cells_done = 0;
  bool valid = false;
};

enum class CellCase : uint8_t { serve, duplicate, take, reset, stale };

inline CellCase cell_case(const Cell& c, uint32_t msg_id, uint64_t rank_bit) noexcept {
  if (c.state != CellState::empty && c.tag != msg_id)
    return wire::msg_before(msg_id, c.tag) ? CellCase::stale : CellCase::reset;
  if (c.state == CellState::complete) return CellCase::serve;
  if (c.arrived & rank_bit) return CellCase::duplicate;
  return CellCase::take;
}

inline CellCase cell_case_box(const Cell& c, uint32_t msg_id, uint16_t box_bit) noexcept {
  if (c.state != CellState::empty && c.tag != msg_id)
    return wire::msg_before(msg_id, c.tag) ? CellCase::stale : CellCase::reset;
  if (c.state == CellState::complete) return CellCase::serve;
  if (c.boxes & box_bit) return CellCase::duplicate;
  return CellCase::take;
}

// Deterministic mode: a held packet.
struct Held {
  Pkt pkt;
  wire::ParsedFrame parsed;
  uint16_t data_off = 0;
  uint32_t head_crc = 0;  // linear fix-up: CRC of the ICRC-covered bytes before data_off
};

// The bytes before the data of an RDMA WRITE that parse_frame accepts: at
// most Ethernet + two VLAN tags + IPv4 without options + UDP + BTH + the
// WRITE opcodes' largest extension headers + the INA header.
inline constexpr size_t kMaxWriteExt = sizeof(wire::Reth) + sizeof(wire::ImmDt);
consteval bool write_ext_fits() {
  for (unsigned op = 0; op < 256; ++op)
    if (wire::is_rdma_write(static_cast<uint8_t>(op)) &&
        wire::opcode_info(static_cast<uint8_t>(op)).ext_bytes > kMaxWriteExt)
      return false;
  return true;
}
static_assert(write_ext_fits(), "an RDMA WRITE opcode carries more extension bytes");
inline constexpr size_t kMaxDataOffset = sizeof(wire::EthHdr) + 2 * sizeof(wire::VlanTag) +
                                         sizeof(wire::Ipv4Hdr) + sizeof(wire::UdpHdr) +
                                         sizeof(wire::Bth) + kMaxWriteExt + sizeof(wire::InaHdr);
inline constexpr size_t kMaxPad = 3;  // BTH pad count: two bits

// Accumulate mode: what it takes to rebuild a released packet.
struct StoredHdr {
  wire::ParsedFrame parsed;
  uint16_t meta = 0;
  uint16_t frame_len = 0;
  uint16_t data_off = 0;
  uint32_t head_crc = 0;  // as Held::head_crc
  uint8_t pad_bytes[kMaxPad] = {};
  uint8_t bytes[kMaxDataOffset];
};
static_assert(sizeof(StoredHdr::pad_bytes) == kMaxPad);

// Keeps what rebuild_header needs of a packet whose data is
// [data_off, data_off + data_len). data_off <= kMaxDataOffset for every
// frame parse_frame accepted.
void store_header(StoredHdr& sh, const Pkt& pkt, const wire::ParsedFrame& p, uint16_t data_off,
                  uint16_t data_len, uint32_t head_crc) noexcept;
// Writes the stored headers and pad into `out` (sh.frame_len bytes); the
// data bytes are left for the caller.
void rebuild_header(const StoredHdr& sh, uint16_t data_len, uint8_t* out) noexcept;

}  // namespace netreduce::engine::detail
