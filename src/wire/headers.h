// Wire header layouts: Ethernet, 802.1Q, IPv4, UDP, the InfiniBand transport
// headers RoCEv2 carries (BTH, RETH, ImmDt, AETH) and netreduce's INA header.
//
// Every struct has alignment 1 and its exact wire size (static_assert below),
// so it can be overlaid on any offset of a frame that the parser has already
// bounds-checked. Multi-byte fields are big-endian `Be<T>` types.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "wire/byteorder.h"

namespace netreduce::wire {

inline constexpr uint16_t kEtherTypeIpv4 = 0x0800;
inline constexpr uint16_t kEtherTypeVlan = 0x8100;
inline constexpr uint16_t kEtherTypeQinQ = 0x88A8;
inline constexpr uint8_t kIpProtoUdp = 17;
inline constexpr uint16_t kRoceV2Port = 4791;
inline constexpr size_t kIcrcBytes = 4;

using MacAddr = std::array<uint8_t, 6>;

struct EthHdr {
  MacAddr dst;
  MacAddr src;
  be16 ether_type;
};

struct VlanTag {
  be16 tci;         // PCP(3) DEI(1) VID(12)
  be16 ether_type;  // inner EtherType
};

struct Ipv4Hdr {
  uint8_t version_ihl;  // version(4) IHL(4)
  uint8_t tos;          // DSCP(6) ECN(2); masked in the ICRC
  be16 total_length;
  be16 id;
  be16 flags_frag;  // reserved(1) DF(1) MF(1) fragment offset(13)
  uint8_t ttl;      // masked in the ICRC
  uint8_t protocol;
  be16 checksum;  // masked in the ICRC
  be32 src;
  be32 dst;

  uint8_t version() const noexcept { return version_ihl >> 4; }
  uint8_t ihl_bytes() const noexcept { return static_cast<uint8_t>((version_ihl & 0x0f) * 4); }
};

struct UdpHdr {
  be16 src_port;
  be16 dst_port;
  be16 length;
  be16 checksum;  // 0 for RoCEv2 senders; masked in the ICRC
};

// Base Transport Header (IBA vol. 1, 9.2).
struct Bth {
  uint8_t opcode;
  uint8_t flags;  // SE(1) MigReq(1) PadCnt(2) TVer(4)
  be16 pkey;
  uint8_t resv8a;  // FECN(1) BECN(1) reserved(6); masked in the ICRC
  Be24 dest_qp;
  uint8_t ack_req;  // AckReq(1) reserved(7)
  Be24 psn;

  bool solicited() const noexcept { return (flags & 0x80) != 0; }
  uint8_t pad_count() const noexcept { return (flags >> 4) & 0x3; }
  uint8_t transport_version() const noexcept { return flags & 0x0f; }
  bool ack_requested() const noexcept { return (ack_req & 0x80) != 0; }
};

// RDMA Extended Transport Header: carried by WRITE FIRST/ONLY and READ requests.
struct Reth {
  be64 virtual_address;
  be32 rkey;
  be32 dma_length;
};

// Immediate data: carried by *_WITH_IMMEDIATE opcodes.
struct ImmDt {
  be32 imm;
};

// ACK Extended Transport Header: ACK, NAK, READ responses.
struct Aeth {
  uint8_t syndrome;
  Be24 msn;
};

// Invalidate ETH (SEND_*_WITH_INVALIDATE).
struct Ieth {
  be32 rkey;
};

// Atomic ETH (COMPARE_SWAP, FETCH_ADD).
struct AtomicEth {
  be64 virtual_address;
  be32 rkey;
  be64 swap_add;
  be64 compare;
};

// Atomic ACK ETH.
struct AtomicAckEth {
  be64 original;
};

// INA header: the first 24 bytes of the payload of the first packet (WRITE
// FIRST or ONLY) of every INA message. Fields as in
// docs/design.md#wire-format plus a 32-bit reserved word: 24 bytes keeps
// every element of every dtype (up to 8 bytes) at the same packet-relative
// alignment in first and later packets, so no element ever straddles two
// packets of a message.
struct InaHdr {
  be32 magic;  // kInaMagic ("InetTag")
  uint8_t version;
  uint8_t dtype;
  uint8_t op;
  uint8_t flags;
  be32 ring_id;
  be16 rank;
  be16 msg_len;  // packets per message
  be32 msg_id;
  be32 reserved;  // zero on send; carried through untouched
};

inline constexpr uint32_t kInaMagic = 0x494E4554;  // "INET"
inline constexpr uint8_t kInaVersion = 1;

static_assert(sizeof(EthHdr) == 14 && alignof(EthHdr) == 1);
static_assert(sizeof(VlanTag) == 4 && alignof(VlanTag) == 1);
static_assert(sizeof(Ipv4Hdr) == 20 && alignof(Ipv4Hdr) == 1);
static_assert(sizeof(UdpHdr) == 8 && alignof(UdpHdr) == 1);
static_assert(sizeof(Bth) == 12 && alignof(Bth) == 1);
static_assert(sizeof(Reth) == 16 && alignof(Reth) == 1);
static_assert(sizeof(ImmDt) == 4 && alignof(ImmDt) == 1);
static_assert(sizeof(Aeth) == 4 && alignof(Aeth) == 1);
static_assert(sizeof(Ieth) == 4 && alignof(Ieth) == 1);
static_assert(sizeof(AtomicEth) == 28 && alignof(AtomicEth) == 1);
static_assert(sizeof(AtomicAckEth) == 8 && alignof(AtomicAckEth) == 1);
static_assert(sizeof(InaHdr) == 24 && alignof(InaHdr) == 1);
static_assert(sizeof(InaHdr) % 8 == 0, "INA header must keep 8-byte elements aligned");

}  // namespace netreduce::wire
