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
// Recomputes and stores the ICRC.
void icrc_update(uint8_t* frame, const ParsedFrame& p) noexcept;

}  // namespace netreduce::wire
