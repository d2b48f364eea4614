// Frame parser: Ethernet [802.1Q/QinQ] IPv4 UDP(4791) BTH [ext headers]
// payload pad ICRC.
//
// `parse_frame` never reads outside [data, data + len). It returns a status
// and, when the status is `ok`, a `ParsedFrame` of offsets that are all
// mutually consistent (see the invariants on ParsedFrame). Statuses split in
// two groups:
//   - "not RoCE" (not_ipv4, not_udp, not_roce_port): ordinary traffic the box
//     forwards untouched;
//   - malformed RoCE: a frame addressed to UDP 4791 whose headers are
//     inconsistent. The data plane counts these under their own name.
// IPv6 RoCEv2 is reported as not_ipv4 (forwarded, never aggregated).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "wire/headers.h"
#include "wire/opcode.h"
#include "wire/status_enum.h"

namespace netreduce::wire {

// X(name, description)
#define NETREDUCE_PARSE_STATUS(X)                                             \
  X(ok, "RoCEv2 frame parsed")                                                \
  X(truncated_l2, "frame shorter than its Ethernet/VLAN headers")             \
  X(too_many_vlans, "more than two VLAN tags")                                \
  X(not_ipv4, "EtherType is not IPv4")                                        \
  X(truncated_ip, "frame shorter than the IPv4 header")                       \
  X(ip_version, "EtherType IPv4 but IP version is not 4")                     \
  X(ip_header_length, "IPv4 IHL below 5")                                     \
  X(ip_options, "IPv4 header carries options (RoCEv2 does not use them)")     \
  X(ip_total_length, "IPv4 total length inconsistent with the frame")         \
  X(ip_fragment, "IPv4 fragment")                                             \
  X(not_udp, "IPv4 protocol is not UDP")                                      \
  X(not_roce_port, "UDP destination port is not 4791")                        \
  X(udp_length, "UDP length inconsistent with the IPv4 total length")         \
  X(truncated_bth, "UDP payload shorter than BTH + ICRC")                     \
  X(bth_version, "BTH transport version is not 0")                            \
  X(unknown_opcode, "BTH opcode not known to netreduce")                      \
  X(truncated_ext, "UDP payload shorter than the opcode's extension headers") \
  X(unexpected_payload, "payload present on an opcode that carries none")     \
  X(bad_pad, "BTH pad count larger than the payload")

NETREDUCE_DEFINE_STATUS_ENUM(ParseStatus, kParseStatusCount, NETREDUCE_PARSE_STATUS)

// Traffic that is not RoCEv2 at all (as opposed to malformed RoCEv2).
constexpr bool is_not_roce(ParseStatus s) noexcept {
  return s == ParseStatus::not_ipv4 || s == ParseStatus::not_udp || s == ParseStatus::not_roce_port;
}

// Offsets into the frame, all from its first byte. Invariants when ok:
//   l3 + 20 == l4, l4 + 8 == bth, bth + 12 + ext_bytes == payload,
//   payload + payload_len + pad + 4 == end <= frame length,
//   end == l3 + IPv4 total length (bytes after `end` are Ethernet padding).
// An offset of 0 means "header absent" (no header can start at 0 but Ethernet).
struct ParsedFrame {
  uint16_t l3 = 0;           // IPv4 header
  uint16_t l4 = 0;           // UDP header
  uint16_t bth = 0;          // BTH
  uint16_t reth = 0;         // RETH or 0
  uint16_t aeth = 0;         // AETH or 0
  uint16_t immdt = 0;        // ImmDt or 0
  uint16_t payload = 0;      // first payload byte (after all extension headers)
  uint16_t payload_len = 0;  // payload bytes, excluding pad and ICRC
  uint16_t end = 0;          // one past the ICRC
  uint8_t pad = 0;           // BTH pad count
  uint8_t opcode = 0;
  uint8_t vlans = 0;  // VLAN tags seen (0..2)

  uint16_t icrc() const noexcept { return static_cast<uint16_t>(end - kIcrcBytes); }
};

ParseStatus parse_frame(const uint8_t* data, size_t len, ParsedFrame& out) noexcept;

}  // namespace netreduce::wire
