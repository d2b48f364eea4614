// How an INA message maps onto RDMA WRITE packets, for every producer of INA
// traffic (host library, simulator, benchmark generator) to agree on.
//
// A message carries the 24-byte INA header followed by `data_bytes` of
// tensor data, cut into packets of `pmtu` payload bytes: packet 0 holds the
// header and pmtu - 24 data bytes, later packets pmtu data bytes, the last
// one the rest. One packet: WRITE ONLY (WITH IMMEDIATE); more: FIRST,
// MIDDLE..., LAST (WITH IMMEDIATE). PSNs run psn0, psn0 + 1, ... mod 2^24.
#pragma once

#include <cstddef>
#include <cstdint>

#include "wire/build.h"
#include "wire/ina.h"

namespace netreduce::wire {

// Packets for a message with `data_bytes` of data (at least 1).
uint32_t message_packets(size_t data_bytes, uint16_t pmtu) noexcept;
// Largest data_bytes a message of `packets` packets can carry.
size_t message_capacity(uint32_t packets, uint16_t pmtu) noexcept;

struct InaMessage {
  RoceFrameSpec base;  // addresses, ports, QPN, TOS...; opcode/psn/payload are set per packet
  InaInfo ina;         // msg_len is filled in from the data size
  uint32_t psn0 = 0;
  const uint8_t* data = nullptr;
  size_t data_bytes = 0;
  uint16_t pmtu = 1024;
  uint64_t va = 0;  // RETH virtual address of the message
  uint32_t rkey = 0;
  bool with_imm = true;  // LAST/ONLY carry ImmDt
  uint32_t imm = 0;
};

// Builds packet k of the message into out[0, cap); returns its length, or 0
// if k is out of range or it does not fit.
size_t build_message_packet(const InaMessage& msg, uint32_t k, uint8_t* out, size_t cap) noexcept;

// Data bytes packet k carries, and where they start in the message's data.
size_t packet_data_offset(uint32_t k, uint16_t pmtu) noexcept;
size_t packet_data_bytes(const InaMessage& msg, uint32_t k) noexcept;

}  // namespace netreduce::wire
