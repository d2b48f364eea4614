// The RoCEv2 opcode table: for each BTH opcode the box understands, which
// extension headers follow the BTH (in wire order RETH/AtomicETH, then
// AETH/AtomicAckETH, then ImmDt/IETH) and whether a payload may follow.
//
// Source: IBA vol. 1 table 38/39 (RC) and the RoCEv2 annex A17 (CNP). Opcodes
// not listed (UC, RD, UD, vendor) are reported as unknown by the parser and
// forwarded untouched by the box.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

namespace netreduce::wire {

// Extension-header flags.
enum ExtFlags : uint16_t {
  kExtReth = 1u << 0,
  kExtAeth = 1u << 1,
  kExtImmDt = 1u << 2,
  kExtIeth = 1u << 3,
  kExtAtomicEth = 1u << 4,
  kExtAtomicAckEth = 1u << 5,
  kHasPayload = 1u << 6,  // a payload (possibly zero-length) may follow
};

// X(enumerator, value, wire name, flags)
#define NETREDUCE_RC_OPCODES(X)                                                                   \
  X(kSendFirst, 0x00, "RC_SEND_FIRST", kHasPayload)                                               \
  X(kSendMiddle, 0x01, "RC_SEND_MIDDLE", kHasPayload)                                             \
  X(kSendLast, 0x02, "RC_SEND_LAST", kHasPayload)                                                 \
  X(kSendLastImm, 0x03, "RC_SEND_LAST_WITH_IMMEDIATE", kExtImmDt | kHasPayload)                   \
  X(kSendOnly, 0x04, "RC_SEND_ONLY", kHasPayload)                                                 \
  X(kSendOnlyImm, 0x05, "RC_SEND_ONLY_WITH_IMMEDIATE", kExtImmDt | kHasPayload)                   \
  X(kWriteFirst, 0x06, "RC_RDMA_WRITE_FIRST", kExtReth | kHasPayload)                             \
  X(kWriteMiddle, 0x07, "RC_RDMA_WRITE_MIDDLE", kHasPayload)                                      \
  X(kWriteLast, 0x08, "RC_RDMA_WRITE_LAST", kHasPayload)                                          \
  X(kWriteLastImm, 0x09, "RC_RDMA_WRITE_LAST_WITH_IMMEDIATE", kExtImmDt | kHasPayload)            \
  X(kWriteOnly, 0x0A, "RC_RDMA_WRITE_ONLY", kExtReth | kHasPayload)                               \
  X(kWriteOnlyImm, 0x0B, "RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", kExtReth | kExtImmDt | kHasPayload) \
  X(kReadRequest, 0x0C, "RC_RDMA_READ_REQUEST", kExtReth)                                         \
  X(kReadResponseFirst, 0x0D, "RC_RDMA_READ_RESPONSE_FIRST", kExtAeth | kHasPayload)              \
  X(kReadResponseMiddle, 0x0E, "RC_RDMA_READ_RESPONSE_MIDDLE", kHasPayload)                       \
  X(kReadResponseLast, 0x0F, "RC_RDMA_READ_RESPONSE_LAST", kExtAeth | kHasPayload)                \
  X(kReadResponseOnly, 0x10, "RC_RDMA_READ_RESPONSE_ONLY", kExtAeth | kHasPayload)                \
  X(kAcknowledge, 0x11, "RC_ACKNOWLEDGE", kExtAeth)                                               \
  X(kAtomicAcknowledge, 0x12, "RC_ATOMIC_ACKNOWLEDGE", kExtAeth | kExtAtomicAckEth)               \
  X(kCompareSwap, 0x13, "RC_COMPARE_SWAP", kExtAtomicEth)                                         \
  X(kFetchAdd, 0x14, "RC_FETCH_ADD", kExtAtomicEth)                                               \
  X(kSendLastInv, 0x16, "RC_SEND_LAST_WITH_INVALIDATE", kExtIeth | kHasPayload)                   \
  X(kSendOnlyInv, 0x17, "RC_SEND_ONLY_WITH_INVALIDATE", kExtIeth | kHasPayload)                   \
  X(kCnp, 0x81, "CNP", kHasPayload)

enum class Opcode : uint8_t {
#define NETREDUCE_X(name, value, str, flags) name = value,
  NETREDUCE_RC_OPCODES(NETREDUCE_X)
#undef NETREDUCE_X
};

struct OpcodeInfo {
  std::string_view name;  // empty: opcode not known to netreduce
  uint16_t flags = 0;
  uint8_t ext_bytes = 0;  // bytes of extension headers after the BTH

  constexpr bool known() const noexcept { return !name.empty(); }
  constexpr bool has(uint16_t f) const noexcept { return (flags & f) != 0; }
};

namespace detail {
constexpr uint8_t ext_bytes_of(uint16_t f) {
  return static_cast<uint8_t>(((f & kExtReth) ? 16 : 0) + ((f & kExtAeth) ? 4 : 0) +
                              ((f & kExtImmDt) ? 4 : 0) + ((f & kExtIeth) ? 4 : 0) +
                              ((f & kExtAtomicEth) ? 28 : 0) + ((f & kExtAtomicAckEth) ? 8 : 0));
}
constexpr std::array<OpcodeInfo, 256> make_opcode_table() {
  std::array<OpcodeInfo, 256> t{};
#define NETREDUCE_X(name, value, str, fl) \
  t[value] = OpcodeInfo{str, static_cast<uint16_t>(fl), ext_bytes_of(fl)};
  NETREDUCE_RC_OPCODES(NETREDUCE_X)
#undef NETREDUCE_X
  return t;
}
}  // namespace detail

inline constexpr std::array<OpcodeInfo, 256> kOpcodeTable = detail::make_opcode_table();

constexpr const OpcodeInfo& opcode_info(uint8_t opcode) noexcept { return kOpcodeTable[opcode]; }

// RDMA WRITE opcodes, the only ones the box aggregates.
constexpr bool is_rdma_write(uint8_t op) noexcept { return op >= 0x06 && op <= 0x0B; }
// First packet of a WRITE message: carries the RETH and, for INA, the INA header.
constexpr bool is_write_first(uint8_t op) noexcept {
  return op == 0x06 || op == 0x0A || op == 0x0B;
}
// Last packet of a WRITE message.
constexpr bool is_write_last(uint8_t op) noexcept { return op >= 0x08 && op <= 0x0B; }
constexpr bool is_write_with_imm(uint8_t op) noexcept { return op == 0x09 || op == 0x0B; }

static_assert(opcode_info(0x0B).ext_bytes == 20);
static_assert(opcode_info(0x12).ext_bytes == 12);
static_assert(opcode_info(0x13).ext_bytes == 28);
static_assert(!opcode_info(0x15).known());
static_assert(!opcode_info(0x2A).known());  // UC WRITE_ONLY: not RC

}  // namespace netreduce::wire
