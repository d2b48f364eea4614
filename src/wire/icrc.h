// RoCEv2 Invariant CRC.
//
// ICRC = CRC-32 (IEEE 802.3 polynomial, reflected, init ~0, final xor ~0: the
// zlib / gzip CRC) over
//     8 bytes of 0xFF (stand-in for the IB LRH)
//  || IPv4 header with TOS, TTL and header checksum set to all 1s
//  || UDP header with the checksum set to all 1s
//  || BTH with the resv8a byte (FECN, BECN, reserved) set to all 1s
//  || extension headers, payload and pad bytes
// and is stored after the pad as the little-endian bytes of that CRC value.
// Matches the Linux soft-RoCE driver (drivers/infiniband/sw/rxe/rxe_icrc.c) and
// scapy.contrib.roce; the tests cross-check against scapy. ISA-L's
// crc32_gzip_refl is this CRC (crc32_ieee is the non-reflected variant).
#pragma once

#include <cstddef>
#include <cstdint>

#include "wire/parse.h"

namespace netreduce::wire {

// zlib-style CRC-32: crc32(crc32(0, a), b) == crc32(0, a || b).
uint32_t crc32(uint32_t crc, const uint8_t* buf, size_t len) noexcept;

// ICRC over a frame that parse_frame accepted (IPv4, no options).
uint32_t icrc_compute(const uint8_t* frame, const ParsedFrame& p) noexcept;
// The ICRC value stored in the frame.
uint32_t icrc_load(const uint8_t* frame, const ParsedFrame& p) noexcept;
// Writes `icrc` into the frame's ICRC field.
void icrc_store(uint8_t* frame, const ParsedFrame& p, uint32_t icrc) noexcept;
// True if the stored ICRC matches the frame's contents.
bool icrc_verify(const uint8_t* frame, const ParsedFrame& p) noexcept;
// icrc_verify that also hands back icrc_head(frame, p, upto) (see below),
// bth + 12 <= upto <= p.icrc(): the CRC runs through `upto` anyway, so the
// head costs nothing extra. The engine keeps it for the linear fix-up of the
// same packet's headers.
bool icrc_verify_head(const uint8_t* frame, const ParsedFrame& p, size_t upto,
                      uint32_t& head) noexcept;
// Recomputes and stores the ICRC.
void icrc_update(uint8_t* frame, const ParsedFrame& p) noexcept;

// --- CRC linearity (docs/design.md#icrc-fix-up) -------------------------
// CRC-32 is affine over GF(2), so the CRC of a concatenation follows from the
// CRCs of its parts: crc32(0, A || B) == crc32_combine(crc32(0, A),
// crc32(0, B), |B|). The combination multiplies crc(A) by x^(8|B|) modulo the
// CRC polynomial (crc32_shift(|B|), computed once per length and cached by
// callers) and xors crc(B): O(1), independent of |B|.

// x^(8 * len) modulo the (reflected) CRC-32 polynomial.
uint32_t crc32_shift(uint64_t len) noexcept;
// a * b modulo the CRC-32 polynomial, reflected representation.
uint32_t crc32_multmod(uint32_t a, uint32_t b) noexcept;
// crc32(0, A || B) from crc_a = crc32(0, A), crc_b = crc32(0, B) and
// shift = crc32_shift(|B|).
inline uint32_t crc32_combine_shifted(uint32_t crc_a, uint32_t crc_b, uint32_t shift) noexcept {
  return crc32_multmod(shift, crc_a) ^ crc_b;
}
uint32_t crc32_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b) noexcept;

// Multiplication by one fixed shift x^(8 len), table-driven: four lookups
// instead of a 32-step loop. Build once per length (about 1,100 operations),
// use per packet.
class Crc32Shift {
 public:
  Crc32Shift() = default;
  explicit Crc32Shift(uint64_t len) noexcept { set(len); }
  void set(uint64_t len) noexcept;
  uint64_t len() const noexcept { return len_; }
  // crc32(0, A || B) from crc32(0, A) and crc32(0, B), |B| == len().
  uint32_t combine(uint32_t crc_a, uint32_t crc_b) const noexcept {
    return t_[0][crc_a & 0xFF] ^ t_[1][(crc_a >> 8) & 0xFF] ^ t_[2][(crc_a >> 16) & 0xFF] ^
           t_[3][crc_a >> 24] ^ crc_b;
  }

 private:
  uint64_t len_ = ~uint64_t{0};
  uint32_t t_[4][256] = {};
};

// CRC state over the ICRC-covered bytes of a frame up to (not including)
// absolute offset `upto` (>= bth + 12): masked pseudo-header, then the bytes
// after the BTH. The ICRC is then
//   crc32_combine(icrc_head(frame, p, upto), crc32(0, frame + upto, icrc - upto), icrc - upto).
uint32_t icrc_head(const uint8_t* frame, const ParsedFrame& p, size_t upto) noexcept;

}  // namespace netreduce::wire
