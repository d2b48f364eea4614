// Golden frames written by the scapy scripts under tests/tools/: a pcap and
// a JSON-lines manifest (one record per frame, same order), their paths in
// two environment variables that meson sets. For Catch tests.
#pragma once

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "wire/pcap.h"

namespace netreduce::testing {

struct Golden {
  std::vector<wire::PcapRecord> frames;
  std::vector<nlohmann::json> manifest;
};

inline Golden load_golden(const char* pcap_env, const char* manifest_env) {
  Golden out;
  const char* pcap = std::getenv(pcap_env);
  const char* man = std::getenv(manifest_env);
  if (!pcap || !man) FAIL(pcap_env << " / " << manifest_env << " not set (run via meson test)");
  std::string err;
  if (!wire::pcap_read(pcap, out.frames, err)) FAIL(err);
  std::ifstream in(man);
  std::string line;
  while (std::getline(in, line)) out.manifest.push_back(nlohmann::json::parse(line));
  return out;
}

// "a.b.c.d" as a host-order IPv4 address.
inline uint32_t ip_of(const std::string& s) {
  unsigned a, b, c, d;
  REQUIRE(std::sscanf(s.c_str(), "%u.%u.%u.%u", &a, &b, &c, &d) == 4);
  return (a << 24) | (b << 16) | (c << 8) | d;
}

}  // namespace netreduce::testing
