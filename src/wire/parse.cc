#include "wire/parse.h"

namespace netreduce::wire {

namespace {
template <typename H>
const H* at(const uint8_t* data, size_t off) noexcept {
  return reinterpret_cast<const H*>(data + off);
}
}  // namespace

ParseStatus parse_frame(const uint8_t* data, size_t len, ParsedFrame& out) noexcept {
  out = ParsedFrame{};
  // Offsets are stored as uint16_t; a longer frame is never a valid RoCE frame
  // (MTU 4096 + headers), and IPv4 cannot describe it anyway.
  if (len > 0xFFFF) len = 0xFFFF;

  // L2: Ethernet + up to two VLAN tags.
  if (len < sizeof(EthHdr)) return ParseStatus::truncated_l2;
  size_t off = sizeof(EthHdr);
  uint16_t ether_type = at<EthHdr>(data, 0)->ether_type.host();
  while (ether_type == kEtherTypeVlan || ether_type == kEtherTypeQinQ) {
    if (out.vlans == 2) return ParseStatus::too_many_vlans;
    if (len < off + sizeof(VlanTag)) return ParseStatus::truncated_l2;
    ether_type = at<VlanTag>(data, off)->ether_type.host();
    off += sizeof(VlanTag);
    ++out.vlans;
  }
  if (ether_type != kEtherTypeIpv4) return ParseStatus::not_ipv4;

  // L3: IPv4 without options, not fragmented.
  if (len < off + sizeof(Ipv4Hdr)) return ParseStatus::truncated_ip;
  const Ipv4Hdr* ip = at<Ipv4Hdr>(data, off);
  if (ip->version() != 4) return ParseStatus::ip_version;
  if (ip->ihl_bytes() < sizeof(Ipv4Hdr)) return ParseStatus::ip_header_length;
  const size_t ip_total = ip->total_length.host();
  if (ip_total < ip->ihl_bytes() || len - off < ip_total) return ParseStatus::ip_total_length;
  if ((ip->flags_frag.host() & 0x3FFF) != 0) return ParseStatus::ip_fragment;
  if (ip->protocol != kIpProtoUdp) return ParseStatus::not_udp;
  if (ip->ihl_bytes() != sizeof(Ipv4Hdr)) {
    // Only a UDP datagram to 4791 with options is malformed RoCE; anything
    // else with options is ordinary traffic.
    const size_t udp_off = off + ip->ihl_bytes();
    if (ip_total < ip->ihl_bytes() + sizeof(UdpHdr) ||
        at<UdpHdr>(data, udp_off)->dst_port.host() != kRoceV2Port) {
      return ParseStatus::not_roce_port;
    }
    return ParseStatus::ip_options;
  }
  out.l3 = static_cast<uint16_t>(off);
  const size_t end = off + ip_total;

  // L4: UDP to 4791.
  off += sizeof(Ipv4Hdr);
  if (ip_total < sizeof(Ipv4Hdr) + sizeof(UdpHdr)) return ParseStatus::ip_total_length;
  const UdpHdr* udp = at<UdpHdr>(data, off);
  if (udp->dst_port.host() != kRoceV2Port) return ParseStatus::not_roce_port;
  if (udp->length.host() != ip_total - sizeof(Ipv4Hdr)) return ParseStatus::udp_length;
  out.l4 = static_cast<uint16_t>(off);

  // BTH.
  off += sizeof(UdpHdr);
  if (end < off + sizeof(Bth) + kIcrcBytes) return ParseStatus::truncated_bth;
  const Bth* bth = at<Bth>(data, off);
  if (bth->transport_version() != 0) return ParseStatus::bth_version;
  const OpcodeInfo& info = opcode_info(bth->opcode);
  if (!info.known()) return ParseStatus::unknown_opcode;
  out.bth = static_cast<uint16_t>(off);
  out.opcode = bth->opcode;

  // Extension headers, in IBA order.
  off += sizeof(Bth);
  if (end < off + info.ext_bytes + kIcrcBytes) return ParseStatus::truncated_ext;
  if (info.has(kExtReth)) {
    out.reth = static_cast<uint16_t>(off);
    off += sizeof(Reth);
  }
  if (info.has(kExtAtomicEth)) off += sizeof(AtomicEth);
  if (info.has(kExtAeth)) {
    out.aeth = static_cast<uint16_t>(off);
    off += sizeof(Aeth);
  }
  if (info.has(kExtAtomicAckEth)) off += sizeof(AtomicAckEth);
  if (info.has(kExtImmDt)) {
    out.immdt = static_cast<uint16_t>(off);
    off += sizeof(ImmDt);
  }
  if (info.has(kExtIeth)) off += sizeof(Ieth);

  // Payload, pad, ICRC.
  const size_t body = end - kIcrcBytes - off;  // payload + pad
  if (body != 0 && !info.has(kHasPayload)) return ParseStatus::unexpected_payload;
  const uint8_t pad = bth->pad_count();
  if (pad > body) return ParseStatus::bad_pad;
  out.payload = static_cast<uint16_t>(off);
  out.payload_len = static_cast<uint16_t>(body - pad);
  out.pad = pad;
  out.end = static_cast<uint16_t>(end);
  return ParseStatus::ok;
}

}  // namespace netreduce::wire
