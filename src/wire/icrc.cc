#include "wire/icrc.h"

#include <isa-l/crc.h>

#include <cstring>

namespace netreduce::wire {

namespace {
// Bytes of the masked prefix: pseudo-LRH + IPv4 + UDP + BTH.
constexpr size_t kLrhBytes = 8;
constexpr size_t kPrefixBytes = kLrhBytes + sizeof(Ipv4Hdr) + sizeof(UdpHdr) + sizeof(Bth);
static_assert(kPrefixBytes == 48);
}  // namespace

uint32_t crc32(uint32_t crc, const uint8_t* buf, size_t len) noexcept {
  return crc32_gzip_refl(crc, buf, len);
}

uint32_t icrc_compute(const uint8_t* frame, const ParsedFrame& p) noexcept {
  uint8_t prefix[kPrefixBytes];
  std::memset(prefix, 0xFF, kLrhBytes);
  std::memcpy(prefix + kLrhBytes, frame + p.l3, kPrefixBytes - kLrhBytes);

  auto* ip = reinterpret_cast<Ipv4Hdr*>(prefix + kLrhBytes);
  ip->tos = 0xFF;
  ip->ttl = 0xFF;
  ip->checksum.set(0xFFFF);
  auto* udp = reinterpret_cast<UdpHdr*>(prefix + kLrhBytes + sizeof(Ipv4Hdr));
  udp->checksum.set(0xFFFF);
  auto* bth = reinterpret_cast<Bth*>(prefix + kLrhBytes + sizeof(Ipv4Hdr) + sizeof(UdpHdr));
  bth->resv8a = 0xFF;

  uint32_t crc = crc32(0, prefix, kPrefixBytes);
  const size_t rest = p.bth + sizeof(Bth);
  return crc32(crc, frame + rest, p.icrc() - rest);
}

uint32_t icrc_load(const uint8_t* frame, const ParsedFrame& p) noexcept {
  const uint8_t* b = frame + p.icrc();
  return uint32_t{b[0]} | (uint32_t{b[1]} << 8) | (uint32_t{b[2]} << 16) | (uint32_t{b[3]} << 24);
}

void icrc_store(uint8_t* frame, const ParsedFrame& p, uint32_t icrc) noexcept {
  uint8_t* b = frame + p.icrc();
  b[0] = static_cast<uint8_t>(icrc);
  b[1] = static_cast<uint8_t>(icrc >> 8);
  b[2] = static_cast<uint8_t>(icrc >> 16);
  b[3] = static_cast<uint8_t>(icrc >> 24);
}

bool icrc_verify(const uint8_t* frame, const ParsedFrame& p) noexcept {
  return icrc_compute(frame, p) == icrc_load(frame, p);
}

void icrc_update(uint8_t* frame, const ParsedFrame& p) noexcept {
  icrc_store(frame, p, icrc_compute(frame, p));
}

}  // namespace netreduce::wire
