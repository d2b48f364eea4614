// Cross-check of the parser and the ICRC against scapy.contrib.roce.
//
// tests/tools/roce_golden.py generates the frames and records the field values
// and the ICRC scapy computed (build step: roce_golden.pcap/.jsonl). Every
// frame must parse to the same fields and the same ICRC. Then single-bit
// flips: any bit of a covered field must break verification; bits of the
// masked fields (TOS, TTL, IPv4 checksum, UDP checksum, BTH resv8a) and of the
// Ethernet/VLAN headers must not.
#include <catch2/catch.hpp>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "wire/golden.h"
#include "wire/icrc.h"
#include "wire/parse.h"
#include "wire/pcap.h"

using namespace netreduce::wire;
using json = nlohmann::json;

namespace {
using netreduce::testing::Golden;
using netreduce::testing::ip_of;

const Golden& golden() {
  static const Golden g =
      netreduce::testing::load_golden("NETREDUCE_GOLDEN_PCAP", "NETREDUCE_GOLDEN_MANIFEST");
  return g;
}
}  // namespace

TEST_CASE("parser and ICRC agree with scapy on every golden frame", "[wire][icrc][golden]") {
  const Golden& g = golden();
  REQUIRE(g.frames.size() == g.manifest.size());
  REQUIRE(g.frames.size() >= 1000);

  size_t compared = 0, mismatches = 0, writes = 0, with_imm = 0;
  for (size_t i = 0; i < g.frames.size(); ++i) {
    const auto& f = g.frames[i].data;
    const json& m = g.manifest[i];
    INFO("frame " << i << " " << m.dump());
    ParsedFrame p;
    REQUIRE(parse_frame(f.data(), f.size(), p) == ParseStatus::ok);
    const auto* ip = reinterpret_cast<const Ipv4Hdr*>(f.data() + p.l3);
    const auto* bth = reinterpret_cast<const Bth*>(f.data() + p.bth);
    bool same = true;
    auto expect = [&](bool ok, const char* what) {
      if (!ok) {
        UNSCOPED_INFO("field differs: " << what);
        same = false;
      }
    };
    expect(p.opcode == m["opcode"].get<int>(), "opcode");
    expect(ip->src.host() == ip_of(m["src_ip"]), "src ip");
    expect(ip->dst.host() == ip_of(m["dst_ip"]), "dst ip");
    expect(ip->tos == m["tos"].get<int>() && ip->ttl == m["ttl"].get<int>(), "tos/ttl");
    expect(bth->dest_qp.host() == m["dqpn"].get<uint32_t>(), "dest qp");
    expect(bth->psn.host() == m["psn"].get<uint32_t>(), "psn");
    expect(bth->pkey.host() == m["pkey"].get<uint32_t>(), "pkey");
    expect(p.payload_len == m["payload_len"].get<int>(), "payload length");
    expect(p.pad == m["pad"].get<int>(), "pad");
    expect(p.vlans == m["vlan"].get<int>(), "vlan");
    expect(f.size() == m["frame_len"].get<size_t>(), "frame length");
    if (m.contains("reth")) {
      const auto* reth = reinterpret_cast<const Reth*>(f.data() + p.reth);
      expect(p.reth != 0 && reth->virtual_address.host() == m["reth"]["va"].get<uint64_t>() &&
                 reth->rkey.host() == m["reth"]["rkey"].get<uint32_t>() &&
                 reth->dma_length.host() == m["reth"]["dma_len"].get<uint32_t>(),
             "reth");
    } else {
      expect(p.reth == 0, "no reth");
    }
    if (m.contains("imm")) {
      ++with_imm;
      expect(p.immdt != 0 && reinterpret_cast<const ImmDt*>(f.data() + p.immdt)->imm.host() ==
                                 m["imm"].get<uint32_t>(),
             "immdt");
    }
    if (m.contains("aeth")) {
      expect(p.aeth != 0 && reinterpret_cast<const Aeth*>(f.data() + p.aeth)->msn.host() ==
                                m["aeth"]["msn"].get<uint32_t>(),
             "aeth");
    }
    const uint32_t ours = icrc_compute(f.data(), p);
    expect(ours == m["icrc"].get<uint32_t>(), "icrc vs scapy");
    expect(icrc_load(f.data(), p) == ours, "stored icrc");
    if (is_rdma_write(p.opcode)) ++writes;
    ++compared;
    if (!same) {
      ++mismatches;
      CHECK(same);
    }
  }
  std::printf(
      "icrc golden: %zu frames compared with scapy (%zu RDMA WRITE, %zu with ImmDt), %zu "
      "mismatches\n",
      compared, writes, with_imm, mismatches);
  CHECK(mismatches == 0);
  CHECK(writes >= 900);
}

TEST_CASE("single-bit flips: covered fields fail, masked fields pass", "[wire][icrc][golden]") {
  const Golden& g = golden();
  std::mt19937_64 rng(20261122);
  size_t covered_flips = 0, masked_flips = 0, undetected = 0, false_alarms = 0;
  for (size_t i = 0; i < g.frames.size(); ++i) {
    std::vector<uint8_t> f = g.frames[i].data;
    ParsedFrame p;
    REQUIRE(parse_frame(f.data(), f.size(), p) == ParseStatus::ok);
    REQUIRE(icrc_verify(f.data(), p));
    const size_t l3 = p.l3, l4 = p.l4, bth = p.bth;
    auto masked = [&](size_t byte) {
      return byte == l3 + 1 /* TOS */ || byte == l3 + 8 /* TTL */ || byte == l3 + 10 ||
             byte == l3 + 11 /* IPv4 checksum */ || byte == l4 + 6 ||
             byte == l4 + 7 /* UDP csum */ || byte == bth + 4 /* resv8a: FECN, BECN */ ||
             byte < l3 /* Ethernet, VLAN */;
    };
    auto flip_and_check = [&](size_t byte, int bit) {
      f[byte] ^= static_cast<uint8_t>(1u << bit);
      const bool ok = icrc_verify(f.data(), p);
      f[byte] ^= static_cast<uint8_t>(1u << bit);
      if (masked(byte)) {
        ++masked_flips;
        if (!ok) ++false_alarms;
      } else {
        ++covered_flips;
        if (ok) ++undetected;
      }
    };
    // Every bit of every header byte (L2 through the extension headers) and
    // of the stored ICRC; 64 random payload/pad bits.
    for (size_t byte = 0; byte < p.payload; ++byte)
      for (int bit = 0; bit < 8; ++bit) flip_and_check(byte, bit);
    for (size_t byte = p.icrc(); byte < p.end; ++byte)
      for (int bit = 0; bit < 8; ++bit) flip_and_check(byte, bit);
    const size_t body = p.payload_len + p.pad;
    for (int k = 0; body && k < 64; ++k)
      flip_and_check(p.payload + rng() % body, static_cast<int>(rng() % 8));
  }
  std::printf(
      "icrc flips: %zu covered-bit flips (%zu undetected), %zu masked-bit flips (%zu rejected)\n",
      covered_flips, undetected, masked_flips, false_alarms);
  CHECK(undetected == 0);
  CHECK(false_alarms == 0);
  CHECK(covered_flips > 100000);
  CHECK(masked_flips > 10000);
}
