// The linear ICRC fix-up against a full recompute (wire::icrc_compute, which
// the wire tests check against scapy): head CRC from verification, result
// CRC once, shift cache hits and misses.
#include "engine/icrc_fixup.h"

#include <catch2/catch.hpp>
#include <random>
#include <vector>

#include "wire/message.h"

using namespace netreduce;
using namespace netreduce::engine;
using namespace netreduce::engine::detail;

namespace {

struct Packet {
  std::vector<uint8_t> f;
  wire::ParsedFrame p;
  uint16_t data_off = 0, data_len = 0;
};

// Packet k of a message of `bytes` data bytes (pads when not a multiple of 4).
Packet make(std::mt19937& rng, size_t bytes, uint32_t k, bool vlan) {
  std::vector<uint8_t> data(bytes);
  for (auto& b : data) b = static_cast<uint8_t>(rng());
  wire::InaMessage m;
  m.base.src_ip = 0x0A000001;
  m.base.dst_ip = 0x0A000002;
  m.base.dest_qp = rng() & 0xFFFFFF;
  m.base.vlan = vlan;
  m.psn0 = rng() & 0xFFFFFF;
  m.data = data.data();
  m.data_bytes = bytes;
  m.pmtu = 256;
  Packet pk;
  pk.f.resize(512);
  pk.f.resize(wire::build_message_packet(m, k, pk.f.data(), pk.f.size()));
  REQUIRE(!pk.f.empty());
  REQUIRE(wire::parse_frame(pk.f.data(), pk.f.size(), pk.p) == wire::ParseStatus::ok);
  const size_t ina = wire::is_write_first(pk.p.opcode) ? sizeof(wire::InaHdr) : 0;
  pk.data_off = static_cast<uint16_t>(pk.p.payload + ina);
  pk.data_len = static_cast<uint16_t>(pk.p.payload_len - ina);
  return pk;
}

}  // namespace

TEST_CASE("icrc_verify_head verifies like icrc_verify and gives icrc_head", "[icrc_fixup]") {
  std::mt19937 rng(5);
  for (int i = 0; i < 200; ++i) {
    // ONLY packets of any size, or the second packet of a longer message.
    const uint32_t k = rng() % 2;
    Packet pk = make(rng, k ? 256 - 24 + 1 + rng() % 500 : 1 + rng() % 700, k, rng() % 2);
    uint32_t head = 0;
    CHECK(wire::icrc_verify_head(pk.f.data(), pk.p, pk.data_off, head));
    CHECK(head == wire::icrc_head(pk.f.data(), pk.p, pk.data_off));
    pk.f[pk.data_off + rng() % pk.data_len] ^= static_cast<uint8_t>(1 + rng() % 255);
    CHECK_FALSE(wire::icrc_verify_head(pk.f.data(), pk.p, pk.data_off, head));
    CHECK_FALSE(wire::icrc_verify(pk.f.data(), pk.p));
  }
}

TEST_CASE("linear fix-up with the verified head equals a full recompute", "[icrc_fixup]") {
  std::mt19937 rng(9);
  ShiftCache shifts;
  shifts.entries.resize(ShiftCache::kEntries);
  for (int i = 0; i < 300; ++i) {
    // FIRST, MIDDLE and LAST packets of messages whose sizes give pads 0-3.
    const size_t bytes = 3 * 256 - 24 - rng() % 8;
    Packet pk = make(rng, bytes, rng() % 3, rng() % 2);
    uint32_t head = 0;
    REQUIRE(wire::icrc_verify_head(pk.f.data(), pk.p, pk.data_off, head));
    std::vector<uint8_t> result(pk.data_len);
    for (auto& b : result) b = static_cast<uint8_t>(rng());
    std::memcpy(pk.f.data() + pk.data_off, result.data(), result.size());
    fix_icrc<IcrcFixup::linear>(shifts, pk.f.data(), pk.p, pk.data_off, pk.data_len,
                                wire::crc32(0, result.data(), pk.data_len), head);
    CHECK(wire::icrc_load(pk.f.data(), pk.p) == wire::icrc_compute(pk.f.data(), pk.p));
    // Without verification the head is computed at fix-up: same bytes.
    std::vector<uint8_t> again = pk.f;
    wire::icrc_store(again.data(), pk.p, 0);
    fix_icrc<IcrcFixup::linear>(shifts, again.data(), pk.p, pk.data_off, pk.data_len,
                                wire::crc32(0, result.data(), pk.data_len),
                                head_crc<IcrcFixup::linear>(again.data(), pk.p, pk.data_off));
    CHECK(again == pk.f);
    // The full variant recomputes.
    wire::icrc_store(again.data(), pk.p, 0);
    fix_icrc<IcrcFixup::full>(shifts, again.data(), pk.p, pk.data_off, pk.data_len, 0, 0);
    CHECK(again == pk.f);
  }
}

TEST_CASE("the shift cache hits on known lengths and rebuilds round-robin", "[icrc_fixup]") {
  ShiftCache c;
  c.entries.resize(ShiftCache::kEntries);
  for (uint32_t len = 100; len < 100 + ShiftCache::kEntries; ++len) c.get(len);
  CHECK(c.misses == ShiftCache::kEntries);
  for (int round = 0; round < 3; ++round)
    for (uint32_t len = 100; len < 100 + ShiftCache::kEntries; ++len)
      CHECK(c.get(len).len() == len);
  CHECK(c.misses == ShiftCache::kEntries);  // all hits
  CHECK(c.get(7).len() == 7);               // a new length replaces the oldest (100)
  CHECK(c.misses == ShiftCache::kEntries + 1);
  c.get(101);
  CHECK(c.misses == ShiftCache::kEntries + 1);
  c.get(100);
  CHECK(c.misses == ShiftCache::kEntries + 2);
  // A cached table combines like the slow path.
  CHECK(c.get(7).combine(0x12345678, 0x9ABCDEF0) == wire::crc32_combine(0x12345678, 0x9ABCDEF0, 7));
}
