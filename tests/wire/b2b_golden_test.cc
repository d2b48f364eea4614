// The box-to-box protocol (src/wire/b2b.h) against an independent reference:
// tests/tools/b2b_golden.py builds frames with scapy from its own field
// description and seals them with its own rendering of the mac's
// construction (build step: b2b_golden.pcap/.jsonl). Every valid frame must parse to the recorded
// fields, its mac must verify under its key exactly when the script says
// so (a guessed mac, data altered after sealing: not), and netreduce's
// builder must produce the same bytes from those fields; every malformed
// frame must get the status the script names. Then single-bit flips and
// truncations of valid frames: never accepted, never read out of bounds.
#include <catch2/catch.hpp>
#include <cstddef>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "wire/b2b.h"
#include "wire/b2b_mac.h"
#include "wire/golden.h"
#include "wire/pcap.h"

using namespace netreduce::wire;
using json = nlohmann::json;

namespace {
using netreduce::testing::Golden;
using netreduce::testing::ip_of;

const Golden& golden() {
  static const Golden g =
      netreduce::testing::load_golden("NETREDUCE_B2B_PCAP", "NETREDUCE_B2B_MANIFEST");
  return g;
}

MacAddr mac_of(const std::string& s) {
  unsigned v[6];
  REQUIRE(std::sscanf(s.c_str(), "%x:%x:%x:%x:%x:%x", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5]) ==
          6);
  MacAddr m;
  for (int i = 0; i < 6; ++i) m[i] = static_cast<uint8_t>(v[i]);
  return m;
}

B2bInfo info_of(const json& m) {
  B2bInfo i;
  i.kind = static_cast<B2bKind>(m["kind"].get<int>());
  i.tree_id = m["tree_id"].get<uint32_t>();
  i.msg_id = m["msg_id"].get<uint32_t>();
  i.k = m["k"].get<uint16_t>();
  i.msg_len = m["msg_len"].get<uint16_t>();
  i.child = m["child"].get<uint16_t>();
  i.dtype = m["dtype"].get<uint8_t>();
  i.op = m["op"].get<uint8_t>();
  i.epoch = m["epoch"].get<uint32_t>();
  return i;
}

B2bKey key_of(const json& m) {
  const std::string s = m["key"].get<std::string>();
  REQUIRE(s.size() == 2 * kB2bKeyBytes);
  B2bKey k{};
  for (size_t i = 0; i < k.size(); ++i)
    k[i] = static_cast<uint8_t>(std::stoul(s.substr(2 * i, 2), nullptr, 16));
  return k;
}

std::string hex(const uint8_t* p, size_t n) {
  std::string s;
  char b[3];
  for (size_t i = 0; i < n; ++i) {
    std::snprintf(b, sizeof b, "%02x", p[i]);
    s += b;
  }
  return s;
}
}  // namespace

TEST_CASE("box-to-box frames agree with scapy: fields, mac, bytes, statuses",
          "[wire][b2b][golden]") {
  const Golden& g = golden();
  REQUIRE(g.frames.size() == g.manifest.size());
  size_t valid = 0, rebuilt = 0, bad = 0, forged = 0;
  for (size_t i = 0; i < g.frames.size(); ++i) {
    const auto& f = g.frames[i].data;
    const json& m = g.manifest[i];
    INFO("frame " << i << " " << m.dump());
    B2bFrame b;
    const B2bStatus st = parse_b2b(f.data(), f.size(), b);
    CHECK(to_string(st) == m["expect"].get<std::string>());
    if (m["expect"] != "ok") {
      ++bad;
      continue;
    }
    ++valid;
    REQUIRE(st == B2bStatus::ok);
    CHECK(b.info == info_of(m));
    CHECK(b.src_ip == ip_of(m["src_ip"]));
    CHECK(b.dst_ip == ip_of(m["dst_ip"]));
    CHECK(b.data_len == m["data_len"].get<size_t>());
    CHECK(b.data + b.data_len == f.size());
    const B2bKey key = key_of(m);
    B2bMac mac(key);
    REQUIRE(mac.ok());
    CHECK(mac.verify(f.data() + b.hdr, b.data_len) == m["mac_ok"].get<bool>());
    if (!m["mac_ok"].get<bool>()) {
      ++forged;
      continue;
    }
    std::vector<uint8_t> copy = f;
    REQUIRE(mac.seal(copy.data() + b.hdr, b.data_len));
    CHECK(hex(copy.data() + b.hdr + offsetof(B2bHdr, mac), kB2bMacBytes) ==
          m["mac"].get<std::string>());
    // Any other key rejects it.
    B2bKey other = key;
    other[key.size() - 1] ^= 1;
    CHECK_FALSE(B2bMac(other).verify(f.data() + b.hdr, b.data_len));
    if (m["vlan"] == 1) continue;  // the builder writes untagged frames
    B2bFrameSpec s;
    s.src_mac = mac_of(m["src_mac"]);
    s.dst_mac = mac_of(m["dst_mac"]);
    s.src_ip = b.src_ip;
    s.dst_ip = b.dst_ip;
    s.tos = m["tos"].get<uint8_t>();
    s.ttl = m["ttl"].get<uint8_t>();
    s.ip_id = m["ip_id"].get<uint16_t>();
    s.dont_fragment = m["df"] == 1;
    s.udp_src_port = m["sport"].get<uint16_t>();
    s.info = info_of(m);
    s.data = f.data() + b.data;
    s.data_len = b.data_len;
    std::vector<uint8_t> out(b2b_frame_size(s.data_len));
    CHECK(build_b2b(s, out.data(), out.size()) == 0);  // no key, no frame
    s.mac = &mac;
    REQUIRE(build_b2b(s, out.data(), out.size()) == f.size());
    CHECK(out == f);
    ++rebuilt;
  }
  CHECK(valid >= 500);
  CHECK(forged >= 100);
  CHECK(rebuilt >= 350);
  CHECK(bad >= 200);
}

TEST_CASE("a key's public name is the start of its SHA-256", "[wire][b2b]") {
  // Python: hashlib.sha256(bytes(range(32))).hexdigest()[:16]
  B2bKey k{};
  for (size_t i = 0; i < k.size(); ++i) k[i] = static_cast<uint8_t>(i);
  CHECK(B2bMac::key_id(k) == "630dcd2966c43366");
}

TEST_CASE("a flipped bit or a cut is never accepted", "[wire][b2b]") {
  const Golden& g = golden();
  size_t tried = 0;
  for (size_t i = 0; i < g.frames.size() && tried < 40; ++i) {
    const json& m = g.manifest[i];
    if (m["expect"] != "ok" || m["vlan"] == 1 || !m["mac_ok"].get<bool>()) continue;
    ++tried;
    const auto& f = g.frames[i].data;
    B2bMac mac(key_of(m));
    B2bFrame b;
    REQUIRE(parse_b2b(f.data(), f.size(), b) == B2bStatus::ok);
    // Every bit of the header and the data: the magic and version have
    // their own status; past them the parser may take it (a field still in
    // range) but the mac never verifies.
    for (size_t byte = b.hdr; byte < f.size(); ++byte)
      for (int bit = 0; bit < 8; ++bit) {
        std::vector<uint8_t> c = f;
        c[byte] ^= static_cast<uint8_t>(1u << bit);
        B2bFrame x;
        const B2bStatus st = parse_b2b(c.data(), c.size(), x);
        INFO("frame " << i << " byte " << byte << " bit " << bit << ": " << to_string(st));
        if (byte < b.hdr + 2u)
          CHECK(st == B2bStatus::bad_magic);
        else if (byte == b.hdr + 2u)
          CHECK(st == B2bStatus::bad_version);
        else
          CHECK((st != B2bStatus::ok || !mac.verify(c.data() + x.hdr, x.data_len)));
      }
    // Every cut (a copy of exactly that size, so ASan sees any overread).
    for (size_t n = 0; n < f.size(); ++n) {
      std::vector<uint8_t> c(f.begin(), f.begin() + static_cast<long>(n));
      B2bFrame x;
      CHECK(parse_b2b(c.data(), c.size(), x) != B2bStatus::ok);
    }
  }
  CHECK(tried == 40);
}

TEST_CASE("the steering hint reads scapy's tree id and nothing past the frame", "[wire][b2b]") {
  const Golden& g = golden();
  size_t read = 0;
  for (size_t i = 0; i < g.frames.size(); ++i) {
    const json& m = g.manifest[i];
    if (m["expect"] != "ok") continue;
    const auto& f = g.frames[i].data;
    INFO("frame " << i << " " << m.dump());
    B2bFrame b;
    REQUIRE(parse_b2b(f.data(), f.size(), b) == B2bStatus::ok);
    const std::optional<uint32_t> id = b2b_tree_id_at(f.data(), f.size(), b.l3);
    REQUIRE(id.has_value());
    CHECK(*id == m["tree_id"].get<uint32_t>());
    ++read;
    // Short of a whole header: none (a copy of exactly that size, so ASan
    // sees any overread).
    for (size_t n = b.l3; n < b.hdr + sizeof(B2bHdr); ++n) {
      std::vector<uint8_t> c(f.begin(), f.begin() + static_cast<long>(n));
      CHECK_FALSE(b2b_tree_id_at(c.data(), c.size(), b.l3).has_value());
    }
    // Another UDP port (4793): none.
    std::vector<uint8_t> c = f;
    c[b.l4 + offsetof(UdpHdr, dst_port) + 1] ^= 1;
    CHECK_FALSE(b2b_tree_id_at(c.data(), c.size(), b.l3).has_value());
  }
  CHECK(read >= 500);
}
