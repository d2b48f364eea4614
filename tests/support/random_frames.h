// Random but valid RoCEv2 frame specs for tests: every known opcode, payloads
// 0..4096, random addresses, QPNs, PSNs, TOS/TTL, optional VLAN tag.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "wire/build.h"
#include "wire/opcode.h"

namespace netreduce::testing {

inline std::vector<uint8_t> known_opcodes() {
  std::vector<uint8_t> ops;
  for (int op = 0; op < 256; ++op)
    if (wire::opcode_info(static_cast<uint8_t>(op)).known())
      ops.push_back(static_cast<uint8_t>(op));
  return ops;
}

// Fills `spec` (payload points into `payload`, which it resizes).
inline void random_spec(std::mt19937_64& rng, wire::RoceFrameSpec& spec,
                        std::vector<uint8_t>& payload, size_t max_payload = 4096) {
  static const std::vector<uint8_t> ops = known_opcodes();
  auto u = [&](uint64_t lo, uint64_t hi) {
    return std::uniform_int_distribution<uint64_t>(lo, hi)(rng);
  };
  spec = wire::RoceFrameSpec{};
  for (auto& b : spec.src_mac) b = static_cast<uint8_t>(u(0, 255));
  for (auto& b : spec.dst_mac) b = static_cast<uint8_t>(u(0, 255));
  spec.vlan = u(0, 5) == 0;
  spec.vlan_tci = static_cast<uint16_t>(u(0, 0xFFFF));
  spec.src_ip = static_cast<uint32_t>(u(0, 0xFFFFFFFF));
  spec.dst_ip = static_cast<uint32_t>(u(0, 0xFFFFFFFF));
  spec.tos = static_cast<uint8_t>(u(0, 255));
  spec.ttl = static_cast<uint8_t>(u(0, 255));
  spec.ip_id = static_cast<uint16_t>(u(0, 0xFFFF));
  spec.dont_fragment = u(0, 1) == 1;
  spec.udp_src_port = static_cast<uint16_t>(u(0, 0xFFFF));
  spec.udp_checksum = u(0, 3) == 0 ? static_cast<uint16_t>(u(0, 0xFFFF)) : 0;
  spec.opcode = ops[u(0, ops.size() - 1)];
  spec.solicited = u(0, 1) == 1;
  spec.ack_req = u(0, 1) == 1;
  spec.resv8a = static_cast<uint8_t>(u(0, 255));
  spec.pkey = static_cast<uint16_t>(u(0, 0xFFFF));
  spec.dest_qp = static_cast<uint32_t>(u(0, 0xFFFFFF));
  spec.psn = static_cast<uint32_t>(u(0, 0xFFFFFF));
  spec.va = u(0, ~0ull);
  spec.rkey = static_cast<uint32_t>(u(0, 0xFFFFFFFF));
  spec.dma_length = static_cast<uint32_t>(u(0, 1 << 20));
  spec.imm = static_cast<uint32_t>(u(0, 0xFFFFFFFF));
  spec.syndrome = static_cast<uint8_t>(u(0, 255));
  spec.msn = static_cast<uint32_t>(u(0, 0xFFFFFF));
  payload.clear();
  if (wire::opcode_info(spec.opcode).has(wire::kHasPayload)) {
    payload.resize(u(0, max_payload));
    for (auto& b : payload) b = static_cast<uint8_t>(rng());
  }
  spec.payload = payload.data();
  spec.payload_len = payload.size();
}

}  // namespace netreduce::testing
