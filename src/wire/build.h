// Frame builder: writes a complete RoCEv2 frame (Ethernet [802.1Q] IPv4 UDP
// BTH ext-headers payload pad ICRC) from a plain description. Used by the
// tests, the simulator, the benchmark generator and the host-side tools; the
// data plane itself only rewrites frames, it never builds them.
#pragma once

#include <cstddef>
#include <cstdint>

#include "wire/headers.h"

namespace netreduce::wire {

struct RoceFrameSpec {
  MacAddr src_mac{};
  MacAddr dst_mac{};
  bool vlan = false;  // add one 802.1Q tag
  uint16_t vlan_tci = 0;

  uint32_t src_ip = 0;
  uint32_t dst_ip = 0;
  uint8_t tos = 0;
  uint8_t ttl = 64;
  uint16_t ip_id = 0;
  bool dont_fragment = true;

  uint16_t udp_src_port = 0xC000;
  uint16_t udp_checksum = 0;  // RoCEv2 senders send 0

  uint8_t opcode = 0;
  bool solicited = false;
  bool ack_req = false;
  uint8_t resv8a = 0;  // FECN/BECN bits
  uint16_t pkey = 0xFFFF;
  uint32_t dest_qp = 0;
  uint32_t psn = 0;

  // RETH (WRITE FIRST/ONLY, READ REQUEST)
  uint64_t va = 0;
  uint32_t rkey = 0;
  uint32_t dma_length = 0;
  // ImmDt
  uint32_t imm = 0;
  // AETH
  uint8_t syndrome = 0;
  uint32_t msn = 0;

  const uint8_t* payload = nullptr;
  size_t payload_len = 0;
};

// Bytes the frame will take, or 0 if the spec cannot be encoded (unknown
// opcode, payload on an opcode that carries none, frame over 65535 bytes).
size_t frame_size(const RoceFrameSpec& spec) noexcept;

// Builds the frame into out[0, cap). Returns its length, or 0 if the spec
// cannot be encoded or does not fit. The IPv4 checksum and ICRC are valid.
size_t build_frame(const RoceFrameSpec& spec, uint8_t* out, size_t cap) noexcept;

// An IPv4 header without options (protocol UDP, valid checksum) and the UDP
// header after it, at `at`; ip_total is the IPv4 total length. The RoCE
// builder and the box-to-box builder (b2b.h) both write them so.
struct Ipv4Fields {
  uint32_t src = 0;
  uint32_t dst = 0;
  uint8_t tos = 0;
  uint8_t ttl = 64;
  uint16_t id = 0;
  bool dont_fragment = true;
};
void write_ipv4_udp(uint8_t* at, const Ipv4Fields& f, uint16_t ip_total, uint16_t src_port,
                    uint16_t dst_port, uint16_t udp_checksum) noexcept;

// RFC 1071 Internet checksum over `len` bytes (an IPv4 header with its
// checksum field zeroed gives the value to store).
uint16_t internet_checksum(const uint8_t* data, size_t len) noexcept;

}  // namespace netreduce::wire
