// Box-to-box frames: parser and builder (b2b.h).
#include "wire/b2b.h"

#include <cstddef>
#include <cstring>

#include "wire/b2b_mac.h"
#include "wire/build.h"
#include "wire/ina.h"

namespace netreduce::wire {

namespace {
template <typename H>
const H* at(const uint8_t* data, size_t off) noexcept {
  return reinterpret_cast<const H*>(data + off);
}
}  // namespace

B2bStatus parse_b2b(const uint8_t* data, size_t len, B2bFrame& out) noexcept {
  out = B2bFrame{};
  if (len > 0xFFFF) len = 0xFFFF;
  // L2: Ethernet + up to two VLAN tags (more: not ours to judge).
  if (len < sizeof(EthHdr)) return B2bStatus::not_b2b;
  size_t off = sizeof(EthHdr);
  uint16_t ether_type = at<EthHdr>(data, 0)->ether_type.host();
  for (unsigned tags = 0; ether_type == kEtherTypeVlan || ether_type == kEtherTypeQinQ; ++tags) {
    if (tags == 2 || len < off + sizeof(VlanTag)) return B2bStatus::not_b2b;
    ether_type = at<VlanTag>(data, off)->ether_type.host();
    off += sizeof(VlanTag);
  }
  if (ether_type != kEtherTypeIpv4 || len < off + sizeof(Ipv4Hdr)) return B2bStatus::not_b2b;
  const Ipv4Hdr* ip = at<Ipv4Hdr>(data, off);
  if (ip->version() != 4 || ip->protocol != kIpProtoUdp) return B2bStatus::not_b2b;
  const size_t ihl = ip->ihl_bytes();
  if (ihl < sizeof(Ipv4Hdr)) return B2bStatus::not_b2b;
  if ((ip->flags_frag.host() & 0x1FFF) != 0) {
    // A later fragment: what sits where the UDP header would is data, never
    // a port to read.
    out.l3 = static_cast<uint16_t>(off);
    out.src_ip = ip->src.host();
    out.dst_ip = ip->dst.host();
    return B2bStatus::later_fragment;
  }
  if (len < off + ihl + sizeof(UdpHdr)) return B2bStatus::not_b2b;
  if (at<UdpHdr>(data, off + ihl)->dst_port.host() != kB2bPort) return B2bStatus::not_b2b;
  // From here on it claims to be ours: every defect has its own status.
  out.l3 = static_cast<uint16_t>(off);
  out.src_ip = ip->src.host();
  out.dst_ip = ip->dst.host();
  const size_t ip_total = ip->total_length.host();
  if (ihl != sizeof(Ipv4Hdr) || (ip->flags_frag.host() & 0x3FFF) != 0 ||
      ip_total < sizeof(Ipv4Hdr) + sizeof(UdpHdr))
    return B2bStatus::bad_ip;
  if (len - off < ip_total) return B2bStatus::truncated;
  off += sizeof(Ipv4Hdr);
  out.l4 = static_cast<uint16_t>(off);
  const UdpHdr* udp = at<UdpHdr>(data, off);
  const size_t udp_len = udp->length.host();
  if (udp_len != ip_total - sizeof(Ipv4Hdr)) return B2bStatus::bad_udp_length;
  off += sizeof(UdpHdr);
  const size_t body = udp_len - sizeof(UdpHdr);  // header + data
  if (body < sizeof(B2bHdr)) return B2bStatus::truncated;
  out.hdr = static_cast<uint16_t>(off);
  const B2bHdr* h = at<B2bHdr>(data, off);
  if (h->magic.host() != kB2bMagic) return B2bStatus::bad_magic;
  if (h->version != kB2bVersion) return B2bStatus::bad_version;
  const size_t data_len = body - sizeof(B2bHdr);
  if (h->kind < static_cast<uint8_t>(B2bKind::partial) ||
      h->kind > static_cast<uint8_t>(B2bKind::final))
    return B2bStatus::bad_kind;
  if (!is_valid_dtype(h->dtype)) return B2bStatus::bad_dtype;
  if (!is_valid_op(h->op)) return B2bStatus::bad_op;
  const bool has_data = b2b_kind_has_data(static_cast<B2bKind>(h->kind));
  if (h->length.host() != data_len || (data_len == 0) == has_data ||
      data_len % dtype_size(h->dtype) != 0)
    return B2bStatus::bad_length;
  const uint16_t k = h->k.host();
  const uint16_t msg_len = h->msg_len.host();
  if (msg_len == 0 || k >= msg_len) return B2bStatus::bad_position;
  out.data = static_cast<uint16_t>(off + sizeof(B2bHdr));
  out.data_len = static_cast<uint16_t>(data_len);
  out.info.kind = static_cast<B2bKind>(h->kind);
  out.info.tree_id = h->tree_id.host();
  out.info.msg_id = h->msg_id.host();
  out.info.k = k;
  out.info.msg_len = msg_len;
  out.info.child = h->child.host();
  out.info.dtype = h->dtype;
  out.info.op = h->op;
  out.info.epoch = h->epoch.host();
  return B2bStatus::ok;
}

size_t build_b2b(const B2bFrameSpec& s, uint8_t* out, size_t cap) noexcept {
  if (!s.mac) return 0;
  if (s.data_len > 0xFFFF - (sizeof(Ipv4Hdr) + sizeof(UdpHdr) + sizeof(B2bHdr))) return 0;
  const size_t total = b2b_frame_size(s.data_len);
  if (total > cap) return 0;
  auto* eth = reinterpret_cast<EthHdr*>(out);
  eth->dst = s.dst_mac;
  eth->src = s.src_mac;
  eth->ether_type.set(kEtherTypeIpv4);
  size_t off = sizeof(EthHdr);

  const size_t ip_total = total - off;
  write_ipv4_udp(out + off, {s.src_ip, s.dst_ip, s.tos, s.ttl, s.ip_id, s.dont_fragment},
                 static_cast<uint16_t>(ip_total), s.udp_src_port, kB2bPort, 0);
  off += sizeof(Ipv4Hdr) + sizeof(UdpHdr);

  auto* h = reinterpret_cast<B2bHdr*>(out + off);
  h->magic.set(kB2bMagic);
  h->version = kB2bVersion;
  h->kind = static_cast<uint8_t>(s.info.kind);
  h->tree_id.set(s.info.tree_id);
  h->msg_id.set(s.info.msg_id);
  h->k.set(s.info.k);
  h->msg_len.set(s.info.msg_len);
  h->child.set(s.info.child);
  h->dtype = s.info.dtype;
  h->op = s.info.op;
  h->length.set(static_cast<uint16_t>(s.data_len));
  h->flags.set(0);
  h->epoch.set(s.info.epoch);
  h->reserved.set(0);
  if (s.data_len) std::memmove(out + off + sizeof(B2bHdr), s.data, s.data_len);
  return s.mac->seal(out + off, s.data_len) ? total : 0;
}

}  // namespace netreduce::wire
