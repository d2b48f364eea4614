// Writes COUNT random frames made by netreduce's own builder to a pcap, for
// tests/tools/roce_golden.py to check with scapy.
//   usage: write-built-frames OUT.pcap COUNT SEED
#include <cstdio>
#include <cstdlib>
#include <random>

#include "support/random_frames.h"
#include "wire/pcap.h"

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s OUT.pcap COUNT SEED\n", argv[0]);
    return 2;
  }
  const size_t count = std::strtoull(argv[2], nullptr, 10);
  std::mt19937_64 rng(std::strtoull(argv[3], nullptr, 10));
  std::vector<netreduce::wire::PcapRecord> recs;
  std::vector<uint8_t> payload;
  netreduce::wire::RoceFrameSpec spec;
  while (recs.size() < count) {
    netreduce::testing::random_spec(rng, spec, payload);
    netreduce::wire::PcapRecord r;
    r.data.resize(netreduce::wire::frame_size(spec));
    if (netreduce::wire::build_frame(spec, r.data.data(), r.data.size()) != r.data.size()) {
      std::fprintf(stderr, "builder refused a valid spec (opcode 0x%02x)\n", spec.opcode);
      return 1;
    }
    recs.push_back(std::move(r));
  }
  std::string err;
  if (!netreduce::wire::pcap_write(argv[1], recs, err)) {
    std::fprintf(stderr, "%s\n", err.c_str());
    return 1;
  }
  return 0;
}
