#include "wire/message.h"

#include <algorithm>
#include <cstring>

#include "wire/headers.h"
#include "wire/opcode.h"
#include "wire/psn.h"

namespace netreduce::wire {

uint32_t message_packets(size_t data_bytes, uint16_t pmtu) noexcept {
  return static_cast<uint32_t>((sizeof(InaHdr) + data_bytes + pmtu - 1) / pmtu);
}

size_t message_capacity(uint32_t packets, uint16_t pmtu) noexcept {
  return size_t{packets} * pmtu - sizeof(InaHdr);
}

size_t packet_data_offset(uint32_t k, uint16_t pmtu) noexcept {
  return k == 0 ? 0 : size_t{k} * pmtu - sizeof(InaHdr);
}

size_t packet_data_bytes(const InaMessage& m, uint32_t k) noexcept {
  const size_t off = packet_data_offset(k, m.pmtu);
  if (off >= m.data_bytes) return 0;
  const size_t room = k == 0 ? m.pmtu - sizeof(InaHdr) : m.pmtu;
  return std::min(room, m.data_bytes - off);
}

size_t build_message_packet(const InaMessage& m, uint32_t k, uint8_t* out, size_t cap) noexcept {
  const uint32_t n = message_packets(m.data_bytes, m.pmtu);
  if (k >= n || m.pmtu < sizeof(InaHdr) || m.pmtu > 4096) return 0;
  RoceFrameSpec s = m.base;
  s.psn = psn_add(m.psn0, k);
  s.va = m.va;
  s.rkey = m.rkey;
  s.dma_length = static_cast<uint32_t>(sizeof(InaHdr) + m.data_bytes);
  s.imm = m.imm;
  const bool last = k + 1 == n;
  if (n == 1)
    s.opcode = static_cast<uint8_t>(m.with_imm ? Opcode::kWriteOnlyImm : Opcode::kWriteOnly);
  else if (k == 0)
    s.opcode = static_cast<uint8_t>(Opcode::kWriteFirst);
  else if (last)
    s.opcode = static_cast<uint8_t>(m.with_imm ? Opcode::kWriteLastImm : Opcode::kWriteLast);
  else
    s.opcode = static_cast<uint8_t>(Opcode::kWriteMiddle);
  s.ack_req = last;
  s.solicited = last && m.with_imm;

  // Payload: [INA header] + data slice, assembled in a stack buffer.
  uint8_t payload[4096];
  size_t len = 0;
  if (k == 0) {
    InaInfo ina = m.ina;
    ina.msg_len = static_cast<uint16_t>(n);
    ina_encode(ina, payload);
    len = sizeof(InaHdr);
  }
  const size_t bytes = packet_data_bytes(m, k);
  if (bytes) std::memcpy(payload + len, m.data + packet_data_offset(k, m.pmtu), bytes);
  len += bytes;
  s.payload = payload;
  s.payload_len = len;
  return build_frame(s, out, cap);
}

}  // namespace netreduce::wire
