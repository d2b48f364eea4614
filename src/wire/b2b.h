// The box-to-box protocol of a multi-rack tree (docs/design.md#hierarchy,
// docs/design.md#wire-format): a child box sends a partial reduction up to
// its parent, the parent sends the result down, and a parent that lost its
// cells (a restarted box) gets a result its children already hold.
//
// Frame: Ethernet [802.1Q, up to two tags] | IPv4 (no options, not
// fragmented) | UDP to kB2bPort, checksum 0 | B2bHdr (48 bytes) | data. The
// data is the reduced data bytes of one packet position k of one message m
// (never an INA header). kB2bPort (4792, next to RoCEv2's 4791) is not
// IANA-registered for this use: a fabric sends no other traffic to a box
// address on it. Port, magic and version are named here only.
//
// Example: leaf L1, child 1 of spine S, sends S its partial of ring 7,
// message 5, position k = 1 of msg_len 2: 256 fp32 sums.
//   IPv4 L1 -> S | UDP -> 4792 | magic "NR", version 2, kind partial,
//   tree_id 7, msg_id 5, k 1, msg_len 2, child 1, dtype fp32, op sum,
//   length 1024, epoch E, mac | 1024 bytes of data
// S answers with kind result and child 1, the same (tree_id, msg_id, k),
// from S to L1. A query (no data, length 0) goes down the same way and is
// answered with a final going up.
//
// Trust. Every box of one tree installation shares its epoch and a 32-byte
// key (the daemon that created the ring drew both from the kernel's CSPRNG
// and pushed them with the tree). The mac, over the UDP payload with the
// mac field zero under that key (wire/b2b_mac.h), decides whether a frame
// may touch a cell: a corrupted frame, a forged one (no key) and one from
// another installation of the tree id (another key; its epoch names it)
// are all rejected. A frame repeated within one installation is a resend,
// which the protocol takes idempotently (tree.h). Checking the mac needs
// the tree's key, so parse_b2b leaves it to the receiver (B2bMac::verify).
//
// Status. parse_b2b never reads outside [data, data + len). not_b2b is
// ordinary traffic (not IPv4 / UDP / kB2bPort). later_fragment is an IPv4
// fragment of a UDP datagram after the first: it carries no UDP header, so
// only its address can say whether it is box-to-box (a box address takes
// nothing but box-to-box frames: the caller decides). Every other status
// but ok names one kind of malformed frame. Pure functions: any thread.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "wire/headers.h"
#include "wire/status_enum.h"

namespace netreduce::wire {

inline constexpr uint16_t kB2bPort = 4792;
inline constexpr uint16_t kB2bMagic = 0x4E52;  // "NR"
inline constexpr uint8_t kB2bVersion = 2;
inline constexpr size_t kB2bKeyBytes = 32;
inline constexpr size_t kB2bMacBytes = 16;

// A tree installation's key (TreeSpec::key).
using B2bKey = std::array<uint8_t, kB2bKeyBytes>;

enum class B2bKind : uint8_t {
  partial = 1,  // child -> parent: the child's reduction of its children
  result = 2,   // parent -> child: the tree's final result
  query = 3,    // parent -> child, no data: answer with your partial or the final result
  final = 4,    // child -> parent: the tree's final result, from a child's complete cell
};

// Kinds that carry data (all but query).
constexpr bool b2b_kind_has_data(B2bKind k) noexcept { return k != B2bKind::query; }

// Header fields, all big-endian:
//   magic    "NR" (0x4E52): catches traffic that is not ours on the port
//   version  kB2bVersion; a box drops every other version (bad_version)
//            before it reads anything else, so a later version may change
//            the rest of the layout, the mac included
//   kind     B2bKind
//   tree_id  the id of the ring the tree serves
//   msg_id   m, the ring's message id (serial-number arithmetic, as INA)
//   k        packet position of the data in message m (k < msg_len)
//   msg_len  packets in message m
//   child    partial, final: the sender's index among its parent's child
//            boxes; result, query: the index of the child it is for
//   dtype/op wire::Dtype / wire::ReduceOp, as in the INA header
//   length   data bytes after the header, exactly what the UDP length
//            leaves: 0 for a query, else whole elements, at least one
//   flags, reserved  zero on send, ignored on receipt
//   epoch    the tree installation's epoch (TreeSpec::epoch)
//   mac      B2bMac (wire/b2b_mac.h) under the installation's key, over
//            the UDP payload with this field zero
struct B2bHdr {
  be16 magic;
  uint8_t version;
  uint8_t kind;
  be32 tree_id;
  be32 msg_id;
  be16 k;
  be16 msg_len;
  be16 child;
  uint8_t dtype;
  uint8_t op;
  be16 length;
  be16 flags;
  be32 epoch;
  be32 reserved;
  uint8_t mac[kB2bMacBytes];
};
static_assert(sizeof(B2bHdr) == 48 && alignof(B2bHdr) == 1);
static_assert(sizeof(B2bHdr) % 8 == 0, "keeps 8-byte elements aligned as in the INA header");

// X(name, description)
#define NETREDUCE_B2B_STATUS(X)                                                           \
  X(ok, "box-to-box frame parsed")                                                        \
  X(not_b2b, "not IPv4 / UDP to the box-to-box port: ordinary traffic")                   \
  X(later_fragment, "IPv4 fragment of a UDP datagram after the first: no UDP header")     \
  X(truncated, "frame shorter than its headers, or than its IPv4 total length")           \
  X(bad_ip, "IPv4 header with options, IHL below 5, a fragment, or a short length")       \
  X(bad_udp_length, "UDP length inconsistent with the IPv4 total length")                 \
  X(bad_magic, "magic is not \"NR\"")                                                     \
  X(bad_version, "protocol version not understood")                                       \
  X(bad_kind, "kind is not partial, result, query or final")                              \
  X(bad_dtype, "dtype is not a wire::Dtype")                                              \
  X(bad_op, "op is not a wire::ReduceOp")                                                 \
  X(bad_length,                                                                           \
    "length is not what the UDP length leaves, or not whole elements (none for a query)") \
  X(bad_position, "packet position k outside the message (k >= msg_len or msg_len 0)")

NETREDUCE_DEFINE_STATUS_ENUM(B2bStatus, kB2bStatusCount, NETREDUCE_B2B_STATUS)

// The header's fields in host order.
struct B2bInfo {
  B2bKind kind = B2bKind::partial;
  uint32_t tree_id = 0;
  uint32_t msg_id = 0;
  uint16_t k = 0;
  uint16_t msg_len = 1;
  uint16_t child = 0;
  uint8_t dtype = 0;
  uint8_t op = 0;
  uint32_t epoch = 0;
  bool operator==(const B2bInfo&) const = default;
};

// A parsed frame: offsets from the frame's first byte. src_ip / dst_ip are
// set whenever the IPv4 header was read (any status but not_b2b from L2,
// truncated before L3), so a box can tell frames for others from frames
// for itself before it looks at the rest; info, data and data_len only
// when ok.
struct B2bFrame {
  uint16_t l3 = 0;
  uint16_t l4 = 0;
  uint16_t hdr = 0;
  uint16_t data = 0;
  uint16_t data_len = 0;
  uint32_t src_ip = 0;
  uint32_t dst_ip = 0;
  B2bInfo info;
};

B2bStatus parse_b2b(const uint8_t* data, size_t len, B2bFrame& out) noexcept;

// The tree id of a box-to-box frame whose IPv4 header, without options,
// starts at `l3` (a classifier found it IPv4 and not RoCE): nullopt unless
// its UDP header goes to kB2bPort and a whole B2bHdr follows within `len`.
// A steering hint only: the receiver still parses it (parse_b2b) and checks
// its mac. Reads nothing outside [data, data + len).
inline std::optional<uint32_t> b2b_tree_id_at(const uint8_t* data, size_t len, size_t l3) noexcept {
  const size_t udp = l3 + sizeof(Ipv4Hdr);
  if (len < udp + sizeof(UdpHdr) + sizeof(B2bHdr)) return std::nullopt;
  if (reinterpret_cast<const UdpHdr*>(data + udp)->dst_port.host() != kB2bPort) return std::nullopt;
  return reinterpret_cast<const B2bHdr*>(data + udp + sizeof(UdpHdr))->tree_id.host();
}

class B2bMac;

struct B2bFrameSpec {
  MacAddr src_mac{};
  MacAddr dst_mac{};
  uint32_t src_ip = 0;
  uint32_t dst_ip = 0;
  uint8_t tos = 0;
  uint8_t ttl = 64;
  uint16_t ip_id = 0;
  bool dont_fragment = true;
  uint16_t udp_src_port = kB2bPort;
  B2bInfo info;
  const uint8_t* data = nullptr;
  size_t data_len = 0;    // the header's length field
  B2bMac* mac = nullptr;  // required: seals the frame (wire/b2b_mac.h)
};

// Bytes of a frame with `data_len` data bytes (no VLAN tag).
constexpr size_t b2b_frame_size(size_t data_len) noexcept {
  return sizeof(EthHdr) + sizeof(Ipv4Hdr) + sizeof(UdpHdr) + sizeof(B2bHdr) + data_len;
}

// Builds the frame into out[0, cap): valid IPv4 checksum, UDP checksum 0,
// the header's mac. Returns its length, or 0 when there is no mac (or it
// cannot seal), it does not fit or data_len is over 65535 - the headers. Validates nothing else:
// tests build malformed frames with it. No allocation; the engine builds partials and results with
// it on the packet path.
size_t build_b2b(const B2bFrameSpec& spec, uint8_t* out, size_t cap) noexcept;

}  // namespace netreduce::wire
