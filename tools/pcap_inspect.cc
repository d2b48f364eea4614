// netreduce-pcap-inspect: decodes a capture taken on the box's ports (or made
// by a generator) frame by frame with the project's own parser, checks every
// RoCEv2 frame's ICRC, and shows the INA header of first packets.
//
// Exit status: 0 every RoCE frame's ICRC is valid; 1 some ICRC is invalid or
// some UDP-4791 frame is malformed; 2 usage or file error.
#include <CLI/CLI.hpp>
#include <array>
#include <cstdio>
#include <string>
#include <vector>

#include "wire/icrc.h"
#include "wire/ina.h"
#include "wire/parse.h"
#include "wire/pcap.h"

namespace nw = netreduce::wire;

namespace {
std::string ip_str(uint32_t a) {
  char b[16];
  std::snprintf(b, sizeof(b), "%u.%u.%u.%u", a >> 24, (a >> 16) & 255, (a >> 8) & 255, a & 255);
  return b;
}
}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Decode a pcap of RoCEv2 traffic and check every ICRC"};
  std::string path;
  bool summary_only = false;
  app.add_option("pcap", path, "capture file (classic pcap, Ethernet)")->required();
  app.add_flag("-s,--summary", summary_only, "print only the totals");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }

  std::vector<nw::PcapRecord> records;
  std::string error;
  if (!nw::pcap_read(path, records, error)) {
    std::fprintf(stderr, "netreduce-pcap-inspect: %s\n", error.c_str());
    return 2;
  }

  std::array<size_t, nw::kParseStatusCount> by_status{};
  size_t icrc_ok = 0, icrc_bad = 0, ina_first = 0;
  for (size_t i = 0; i < records.size(); ++i) {
    const auto& d = records[i].data;
    nw::ParsedFrame p;
    const nw::ParseStatus st = nw::parse_frame(d.data(), d.size(), p);
    ++by_status[static_cast<size_t>(st)];
    if (st != nw::ParseStatus::ok) {
      if (!summary_only)
        std::printf("%6zu %5zu  %s\n", i, d.size(), std::string(nw::to_string(st)).c_str());
      continue;
    }
    const bool good = nw::icrc_verify(d.data(), p);
    (good ? icrc_ok : icrc_bad)++;
    const auto* ip = reinterpret_cast<const nw::Ipv4Hdr*>(d.data() + p.l3);
    const auto* bth = reinterpret_cast<const nw::Bth*>(d.data() + p.bth);
    std::optional<nw::InaInfo> ina;
    if (nw::is_write_first(p.opcode)) ina = nw::ina_decode(d.data() + p.payload, p.payload_len);
    if (ina) ++ina_first;
    if (summary_only) continue;
    std::printf("%6zu %5zu  %-15s > %-15s qp=%-8u psn=%-8u %-34s len=%-5u icrc=%s", i, d.size(),
                ip_str(ip->src.host()).c_str(), ip_str(ip->dst.host()).c_str(), bth->dest_qp.host(),
                bth->psn.host(), std::string(nw::opcode_info(p.opcode).name).c_str(), p.payload_len,
                good ? "ok" : "BAD");
    if (ina) {
      std::printf("  ina ring=%u rank=%u msg=%u len=%u %s/%s", ina->ring_id, ina->rank, ina->msg_id,
                  ina->msg_len,
                  std::string(nw::to_string(static_cast<nw::Dtype>(ina->dtype))).c_str(),
                  std::string(nw::to_string(static_cast<nw::ReduceOp>(ina->op))).c_str());
    }
    std::printf("\n");
  }

  size_t malformed = 0;
  std::printf("%zu frames: %zu RoCEv2 (ICRC ok %zu, bad %zu), %zu INA first packets\n",
              records.size(), icrc_ok + icrc_bad, icrc_ok, icrc_bad, ina_first);
  for (size_t s = 1; s < by_status.size(); ++s) {
    if (by_status[s] == 0) continue;
    const auto st = static_cast<nw::ParseStatus>(s);
    if (!nw::is_not_roce(st)) malformed += by_status[s];
    std::printf("  %-20s %zu  (%s)\n", std::string(nw::to_string(st)).c_str(), by_status[s],
                std::string(nw::describe(st)).c_str());
  }
  return (icrc_bad == 0 && malformed == 0) ? 0 : 1;
}
