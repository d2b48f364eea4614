#include "wire/build.h"

#include <cstring>

#include "wire/icrc.h"
#include "wire/opcode.h"
#include "wire/parse.h"

namespace netreduce::wire {

uint16_t internet_checksum(const uint8_t* data, size_t len) noexcept {
  uint32_t sum = 0;
  for (size_t i = 0; i + 1 < len; i += 2) sum += (uint32_t{data[i]} << 8) | data[i + 1];
  if (len & 1) sum += uint32_t{data[len - 1]} << 8;
  while (sum >> 16) sum = (sum & 0xFFFF) + (sum >> 16);
  return static_cast<uint16_t>(~sum);
}

void write_ipv4_udp(uint8_t* at, const Ipv4Fields& f, uint16_t ip_total, uint16_t src_port,
                    uint16_t dst_port, uint16_t udp_checksum) noexcept {
  auto* ip = reinterpret_cast<Ipv4Hdr*>(at);
  ip->version_ihl = 0x45;
  ip->tos = f.tos;
  ip->total_length.set(ip_total);
  ip->id.set(f.id);
  ip->flags_frag.set(f.dont_fragment ? 0x4000 : 0);
  ip->ttl = f.ttl;
  ip->protocol = kIpProtoUdp;
  ip->checksum.set(0);
  ip->src.set(f.src);
  ip->dst.set(f.dst);
  ip->checksum.set(internet_checksum(at, sizeof(Ipv4Hdr)));
  auto* udp = reinterpret_cast<UdpHdr*>(at + sizeof(Ipv4Hdr));
  udp->src_port.set(src_port);
  udp->dst_port.set(dst_port);
  udp->length.set(static_cast<uint16_t>(ip_total - sizeof(Ipv4Hdr)));
  udp->checksum.set(udp_checksum);
}

namespace {
size_t pad_of(size_t payload_len) { return (4 - (payload_len & 3)) & 3; }

size_t l2_bytes(const RoceFrameSpec& s) { return sizeof(EthHdr) + (s.vlan ? sizeof(VlanTag) : 0); }
}  // namespace

size_t frame_size(const RoceFrameSpec& s) noexcept {
  const OpcodeInfo& info = opcode_info(s.opcode);
  if (!info.known()) return 0;
  if (s.payload_len != 0 && !info.has(kHasPayload)) return 0;
  const size_t pad = info.has(kHasPayload) ? pad_of(s.payload_len) : 0;
  const size_t ip_total = sizeof(Ipv4Hdr) + sizeof(UdpHdr) + sizeof(Bth) + info.ext_bytes +
                          s.payload_len + pad + kIcrcBytes;
  if (ip_total > 0xFFFF) return 0;
  return l2_bytes(s) + ip_total;
}

size_t build_frame(const RoceFrameSpec& s, uint8_t* out, size_t cap) noexcept {
  const size_t total = frame_size(s);
  if (total == 0 || total > cap) return 0;
  const OpcodeInfo& info = opcode_info(s.opcode);
  std::memset(out, 0, total);

  size_t off = 0;
  auto* eth = reinterpret_cast<EthHdr*>(out);
  eth->dst = s.dst_mac;
  eth->src = s.src_mac;
  off += sizeof(EthHdr);
  if (s.vlan) {
    eth->ether_type.set(kEtherTypeVlan);
    auto* tag = reinterpret_cast<VlanTag*>(out + off);
    tag->tci.set(s.vlan_tci);
    tag->ether_type.set(kEtherTypeIpv4);
    off += sizeof(VlanTag);
  } else {
    eth->ether_type.set(kEtherTypeIpv4);
  }

  const size_t ip_total = total - off;
  write_ipv4_udp(out + off, {s.src_ip, s.dst_ip, s.tos, s.ttl, s.ip_id, s.dont_fragment},
                 static_cast<uint16_t>(ip_total), s.udp_src_port, kRoceV2Port, s.udp_checksum);
  off += sizeof(Ipv4Hdr) + sizeof(UdpHdr);

  const size_t pad = info.has(kHasPayload) ? pad_of(s.payload_len) : 0;
  auto* bth = reinterpret_cast<Bth*>(out + off);
  bth->opcode = s.opcode;
  bth->flags = static_cast<uint8_t>((s.solicited ? 0x80 : 0) | (pad << 4));
  bth->pkey.set(s.pkey);
  bth->resv8a = s.resv8a;
  bth->dest_qp.set(s.dest_qp);
  bth->ack_req = s.ack_req ? 0x80 : 0;
  bth->psn.set(s.psn);
  off += sizeof(Bth);

  if (info.has(kExtReth)) {
    auto* reth = reinterpret_cast<Reth*>(out + off);
    reth->virtual_address.set(s.va);
    reth->rkey.set(s.rkey);
    reth->dma_length.set(s.dma_length);
    off += sizeof(Reth);
  }
  if (info.has(kExtAtomicEth)) off += sizeof(AtomicEth);
  if (info.has(kExtAeth)) {
    auto* aeth = reinterpret_cast<Aeth*>(out + off);
    aeth->syndrome = s.syndrome;
    aeth->msn.set(s.msn);
    off += sizeof(Aeth);
  }
  if (info.has(kExtAtomicAckEth)) off += sizeof(AtomicAckEth);
  if (info.has(kExtImmDt)) {
    reinterpret_cast<ImmDt*>(out + off)->imm.set(s.imm);
    off += sizeof(ImmDt);
  }
  if (info.has(kExtIeth)) off += sizeof(Ieth);

  if (s.payload_len != 0) std::memcpy(out + off, s.payload, s.payload_len);

  ParsedFrame p;
  if (parse_frame(out, total, p) != ParseStatus::ok) return 0;  // cannot happen for a valid spec
  icrc_update(out, p);
  return total;
}

}  // namespace netreduce::wire
