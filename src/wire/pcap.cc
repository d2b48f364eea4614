#include "wire/pcap.h"

#include <cerrno>
#include <cstring>
#include <fstream>

namespace netreduce::wire {

namespace {
constexpr uint32_t kMagicUs = 0xA1B2C3D4;
constexpr uint32_t kMagicNs = 0xA1B23C4D;
constexpr uint32_t kLinkEthernet = 1;
constexpr uint32_t kMaxSnap = 262144;

uint32_t swap32(uint32_t v) { return __builtin_bswap32(v); }
}  // namespace

bool pcap_read(const std::string& path, std::vector<PcapRecord>& out, std::string& error) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    error = path + ": " + std::strerror(errno);
    return false;
  }
  uint32_t gh[6];
  if (!in.read(reinterpret_cast<char*>(gh), sizeof(gh))) {
    error = path + ": shorter than a pcap file header";
    return false;
  }
  bool swapped = false;
  bool nanos = false;
  if (gh[0] == kMagicUs || gh[0] == kMagicNs) {
    nanos = gh[0] == kMagicNs;
  } else if (swap32(gh[0]) == kMagicUs || swap32(gh[0]) == kMagicNs) {
    swapped = true;
    nanos = swap32(gh[0]) == kMagicNs;
  } else {
    error = path + ": not a pcap file (pcapng is not supported; convert with editcap -F pcap)";
    return false;
  }
  auto fix = [&](uint32_t v) { return swapped ? swap32(v) : v; };
  if (fix(gh[5]) != kLinkEthernet) {
    error = path + ": link type " + std::to_string(fix(gh[5])) + " is not Ethernet";
    return false;
  }
  for (;;) {
    uint32_t rh[4];
    if (!in.read(reinterpret_cast<char*>(rh), sizeof(rh))) {
      if (in.gcount() == 0) break;
      error = path + ": truncated record header after " + std::to_string(out.size()) + " records";
      return false;
    }
    const uint32_t caplen = fix(rh[2]);
    if (caplen > kMaxSnap) {
      error = path + ": record " + std::to_string(out.size()) + " claims " +
              std::to_string(caplen) + " bytes";
      return false;
    }
    PcapRecord r;
    r.ts_ns = uint64_t{fix(rh[0])} * 1000000000ull + uint64_t{fix(rh[1])} * (nanos ? 1 : 1000);
    r.data.resize(caplen);
    if (!in.read(reinterpret_cast<char*>(r.data.data()), caplen)) {
      error = path + ": truncated record " + std::to_string(out.size());
      return false;
    }
    out.push_back(std::move(r));
  }
  return true;
}

bool pcap_write(const std::string& path, const std::vector<PcapRecord>& records,
                std::string& error) {
  std::ofstream o(path, std::ios::binary | std::ios::trunc);
  if (!o) {
    error = path + ": " + std::strerror(errno);
    return false;
  }
  const uint32_t gh[6] = {kMagicUs, 0x00040002u /* v2.4 */, 0, 0, kMaxSnap, kLinkEthernet};
  o.write(reinterpret_cast<const char*>(gh), sizeof(gh));
  for (const PcapRecord& r : records) {
    const uint32_t len = static_cast<uint32_t>(r.data.size());
    const uint32_t rh[4] = {static_cast<uint32_t>(r.ts_ns / 1000000000ull),
                            static_cast<uint32_t>((r.ts_ns % 1000000000ull) / 1000), len, len};
    o.write(reinterpret_cast<const char*>(rh), sizeof(rh));
    o.write(reinterpret_cast<const char*>(r.data.data()), len);
  }
  o.flush();
  if (!o) {
    error = path + ": write failed";
    return false;
  }
  return true;
}

}  // namespace netreduce::wire
