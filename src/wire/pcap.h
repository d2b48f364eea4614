// Classic libpcap capture files (LINKTYPE_ETHERNET), read and written without
// libpcap: the tests exchange golden frames with scapy and tshark through
// them, and the tools decode captures taken on the box's ports.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace netreduce::wire {

struct PcapRecord {
  uint64_t ts_ns = 0;
  std::vector<uint8_t> data;
};

// Reads every record of a pcap file (microsecond or nanosecond timestamps,
// either byte order). On failure returns false and sets `error`.
bool pcap_read(const std::string& path, std::vector<PcapRecord>& out, std::string& error);

// Writes the records as a microsecond-resolution, little-endian pcap file.
bool pcap_write(const std::string& path, const std::vector<PcapRecord>& records,
                std::string& error);

}  // namespace netreduce::wire
