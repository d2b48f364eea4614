// Unit tests of the wire layer: byte order, PSN arithmetic, the opcode table,
// the builder/parser round trip, and every parser error status on a
// hand-damaged frame.
#include <catch2/catch.hpp>
#include <cstring>
#include <random>
#include <vector>

#include "support/random_frames.h"
#include "wire/build.h"
#include "wire/icrc.h"
#include "wire/ina.h"
#include "wire/parse.h"
#include "wire/psn.h"

using namespace netreduce::wire;

namespace {
std::vector<uint8_t> build(const RoceFrameSpec& s) {
  std::vector<uint8_t> f(frame_size(s));
  REQUIRE(!f.empty());
  REQUIRE(build_frame(s, f.data(), f.size()) == f.size());
  return f;
}

RoceFrameSpec write_first_spec(std::vector<uint8_t>& payload) {
  RoceFrameSpec s;
  s.src_ip = 0x0A000001;
  s.dst_ip = 0x0A000002;
  s.opcode = static_cast<uint8_t>(Opcode::kWriteFirst);
  s.dest_qp = 0x123456;
  s.psn = 0xFFFFFE;
  s.va = 0x1122334455667788ull;
  s.rkey = 0xCAFEBABE;
  s.dma_length = 4096;
  payload.assign(1001, 0x5A);
  s.payload = payload.data();
  s.payload_len = payload.size();
  return s;
}

// Sets the IPv4 header checksum and ICRC of a hand-edited frame.
void refresh(std::vector<uint8_t>& f, size_t l3 = 14) {
  auto* ip = reinterpret_cast<Ipv4Hdr*>(f.data() + l3);
  ip->checksum.set(0);
  ip->checksum.set(internet_checksum(f.data() + l3, ip->ihl_bytes()));
}

ParseStatus parse(const std::vector<uint8_t>& f) {
  ParsedFrame p;
  return parse_frame(f.data(), f.size(), p);
}
}  // namespace

TEST_CASE("big-endian types store network order", "[wire][endian]") {
  be32 v = be32::from_host(0x01020304);
  unsigned char bytes[4];
  std::memcpy(bytes, &v, 4);
  CHECK(bytes[0] == 1);
  CHECK(bytes[3] == 4);
  CHECK(v.host() == 0x01020304u);
  Be24 p = Be24::from_host(0xABCDEF);
  std::memcpy(bytes, &p, 3);
  CHECK(bytes[0] == 0xAB);
  CHECK(bytes[2] == 0xEF);
  CHECK(p.host() == 0xABCDEFu);
  CHECK(be64::from_host(0x0102030405060708ull).host() == 0x0102030405060708ull);
}

TEST_CASE("PSN arithmetic wraps modulo 2^24", "[wire][psn]") {
  CHECK(psn_add(0xFFFFFF, 1) == 0);
  CHECK(psn_add(0xFFFFF0, 0x20) == 0x10);
  CHECK(psn_sub(0, 1) == 0xFFFFFF);
  CHECK(psn_distance(0xFFFFFE, 2) == 4);
  CHECK(psn_before(0xFFFFFE, 1));
  CHECK_FALSE(psn_before(1, 0xFFFFFE));
  CHECK_FALSE(psn_before(5, 5));
  CHECK(psn_in_range(1, 0xFFFFFE, 4));
  CHECK_FALSE(psn_in_range(2, 0xFFFFFE, 4));
  CHECK_FALSE(psn_in_range(0xFFFFFD, 0xFFFFFE, 4));
  CHECK(msg_before(0xFFFFFFFF, 0));
  CHECK_FALSE(msg_before(0, 0xFFFFFFFF));
}

TEST_CASE("opcode table matches the IBA extension-header layout", "[wire][opcode]") {
  struct Row {
    uint8_t op;
    uint8_t ext;
    bool payload;
  };
  // IBA vol.1 9.2: RETH 16, AETH 4, ImmDt 4, IETH 4, AtomicETH 28, AtomicAckETH 8.
  const Row rows[] = {{0x00, 0, true},  {0x03, 4, true},   {0x05, 4, true},   {0x06, 16, true},
                      {0x07, 0, true},  {0x08, 0, true},   {0x09, 4, true},   {0x0A, 16, true},
                      {0x0B, 20, true}, {0x0C, 16, false}, {0x0D, 4, true},   {0x0E, 0, true},
                      {0x10, 4, true},  {0x11, 4, false},  {0x12, 12, false}, {0x14, 28, false},
                      {0x17, 4, true},  {0x81, 0, true}};
  for (const Row& r : rows) {
    INFO("opcode 0x" << std::hex << int(r.op));
    CHECK(opcode_info(r.op).known());
    CHECK(opcode_info(r.op).ext_bytes == r.ext);
    CHECK(opcode_info(r.op).has(kHasPayload) == r.payload);
  }
  CHECK(is_write_first(0x06));
  CHECK(is_write_first(0x0B));
  CHECK_FALSE(is_write_first(0x07));
  CHECK(is_write_last(0x09));
  CHECK_FALSE(is_write_last(0x06));
  CHECK_FALSE(opcode_info(0x15).known());
  CHECK_FALSE(opcode_info(0x20).known());
}

TEST_CASE("CRC-32 is the reflected gzip CRC", "[wire][icrc]") {
  const char* s = "123456789";
  CHECK(crc32(0, reinterpret_cast<const uint8_t*>(s), 9) == 0xCBF43926u);
  // Continuation: crc(a || b) from crc(a).
  CHECK(crc32(crc32(0, reinterpret_cast<const uint8_t*>(s), 4),
              reinterpret_cast<const uint8_t*>(s) + 4, 5) == 0xCBF43926u);
}

TEST_CASE("builder output parses back to the spec", "[wire][parse]") {
  std::mt19937_64 rng(42);
  RoceFrameSpec s;
  std::vector<uint8_t> payload;
  for (int i = 0; i < 2000; ++i) {
    netreduce::testing::random_spec(rng, s, payload);
    auto f = build(s);
    ParsedFrame p;
    REQUIRE(parse_frame(f.data(), f.size(), p) == ParseStatus::ok);
    INFO("opcode 0x" << std::hex << int(s.opcode));
    CHECK(p.opcode == s.opcode);
    CHECK(p.vlans == (s.vlan ? 1 : 0));
    CHECK(p.payload_len == s.payload_len);
    const size_t want_pad =
        opcode_info(s.opcode).has(kHasPayload) ? (4 - s.payload_len % 4) % 4 : 0;
    CHECK(p.pad == want_pad);
    CHECK(p.end == f.size());
    CHECK(std::memcmp(f.data() + p.payload, payload.data(), payload.size()) == 0);
    const auto* bth = reinterpret_cast<const Bth*>(f.data() + p.bth);
    CHECK(bth->psn.host() == s.psn);
    CHECK(bth->dest_qp.host() == s.dest_qp);
    if (p.reth)
      CHECK(reinterpret_cast<const Reth*>(f.data() + p.reth)->virtual_address.host() == s.va);
    if (p.immdt) CHECK(reinterpret_cast<const ImmDt*>(f.data() + p.immdt)->imm.host() == s.imm);
    if (p.aeth) CHECK(reinterpret_cast<const Aeth*>(f.data() + p.aeth)->msn.host() == s.msn);
    CHECK(icrc_verify(f.data(), p));
  }
}

TEST_CASE("builder refuses what cannot be encoded", "[wire][build]") {
  RoceFrameSpec s;
  uint8_t buf[64];
  s.opcode = 0x15;  // reserved
  CHECK(frame_size(s) == 0);
  s.opcode = static_cast<uint8_t>(Opcode::kAcknowledge);
  uint8_t one = 1;
  s.payload = &one;
  s.payload_len = 1;  // ACK carries no payload
  CHECK(frame_size(s) == 0);
  s.payload_len = 0;
  CHECK(build_frame(s, buf, 10) == 0);  // does not fit
  CHECK(build_frame(s, buf, sizeof(buf)) == frame_size(s));
}

TEST_CASE("parser names every malformation", "[wire][parse]") {
  std::vector<uint8_t> payload;
  const RoceFrameSpec spec = write_first_spec(payload);
  const std::vector<uint8_t> good = build(spec);
  REQUIRE(parse(good) == ParseStatus::ok);
  const size_t l3 = 14, l4 = 34, bth = 42;

  SECTION("every truncation is an error, never a read past the end") {
    for (size_t n = 0; n < good.size(); ++n) {
      std::vector<uint8_t> f(good.begin(), good.begin() + static_cast<long>(n));
      CHECK(parse(f) != ParseStatus::ok);
    }
    CHECK(parse(std::vector<uint8_t>(good.begin(), good.begin() + 10)) ==
          ParseStatus::truncated_l2);
    CHECK(parse(std::vector<uint8_t>(good.begin(), good.begin() + 30)) ==
          ParseStatus::truncated_ip);
    CHECK(parse(std::vector<uint8_t>(good.begin(), good.end() - 1)) ==
          ParseStatus::ip_total_length);
  }
  SECTION("Ethernet padding after the IP datagram is allowed") {
    auto f = good;
    f.resize(f.size() + 6, 0);
    ParsedFrame p;
    CHECK(parse_frame(f.data(), f.size(), p) == ParseStatus::ok);
    CHECK(p.end == good.size());
    CHECK(icrc_verify(f.data(), p));
  }
  SECTION("non-RoCE traffic is classified, not an error") {
    auto f = good;
    f[12] = 0x86;
    f[13] = 0xDD;  // IPv6
    CHECK(parse(f) == ParseStatus::not_ipv4);
    CHECK(is_not_roce(parse(f)));
    f = good;
    f[l3 + 9] = 6;  // TCP
    CHECK(parse(f) == ParseStatus::not_udp);
    f = good;
    f[l4 + 2] = 0x12;
    f[l4 + 3] = 0x34;
    CHECK(parse(f) == ParseStatus::not_roce_port);
  }
  SECTION("IP header damage") {
    auto f = good;
    f[l3] = 0x65;
    CHECK(parse(f) == ParseStatus::ip_version);
    f = good;
    f[l3] = 0x44;
    CHECK(parse(f) == ParseStatus::ip_header_length);
    f = good;
    f[l3 + 6] = 0x20;  // MF
    CHECK(parse(f) == ParseStatus::ip_fragment);
    f = good;
    f[l3 + 7] = 0x01;  // fragment offset
    CHECK(parse(f) == ParseStatus::ip_fragment);
    f = good;
    f[l3 + 2] = 0;
    f[l3 + 3] = 10;  // total length below the header
    CHECK(parse(f) == ParseStatus::ip_total_length);
  }
  SECTION("IP options on RoCE are refused by name") {
    // Insert 4 bytes of options (NOP NOP NOP EOL) and fix the lengths.
    auto f = good;
    f.insert(f.begin() + static_cast<long>(l3 + 20), {1, 1, 1, 0});
    f[l3] = 0x46;
    const uint16_t total = static_cast<uint16_t>(f.size() - l3);
    f[l3 + 2] = static_cast<uint8_t>(total >> 8);
    f[l3 + 3] = static_cast<uint8_t>(total);
    refresh(f);
    CHECK(parse(f) == ParseStatus::ip_options);
  }
  SECTION("UDP and BTH damage") {
    auto f = good;
    f[l4 + 5] ^= 1;
    CHECK(parse(f) == ParseStatus::udp_length);
    f = good;
    f[bth + 1] |= 0x01;  // TVer 1
    CHECK(parse(f) == ParseStatus::bth_version);
    f = good;
    f[bth] = 0x15;
    CHECK(parse(f) == ParseStatus::unknown_opcode);
    f = good;
    f[bth] = 0x11;  // ACK with a payload behind it
    CHECK(parse(f) == ParseStatus::unexpected_payload);
  }
  SECTION("short RoCE datagrams") {
    RoceFrameSpec s = spec;
    s.payload_len = 0;
    s.opcode = static_cast<uint8_t>(Opcode::kWriteMiddle);
    auto f = build(s);
    REQUIRE(parse(f) == ParseStatus::ok);
    f[bth + 1] |= 0x30;  // pad 3 on an empty payload
    CHECK(parse(f) == ParseStatus::bad_pad);
    f = build(s);
    f[bth] = 0x06;  // WRITE FIRST needs a RETH that is not there
    CHECK(parse(f) == ParseStatus::truncated_ext);
    // UDP payload too short for BTH + ICRC.
    f = build(s);
    f.resize(l4 + 8 + 12);
    const uint16_t total = static_cast<uint16_t>(f.size() - l3);
    f[l3 + 2] = static_cast<uint8_t>(total >> 8);
    f[l3 + 3] = static_cast<uint8_t>(total);
    f[l4 + 4] = 0;
    f[l4 + 5] = static_cast<uint8_t>(total - 20);
    CHECK(parse(f) == ParseStatus::truncated_bth);
  }
  SECTION("VLAN tags: one and two are parsed, three are refused") {
    RoceFrameSpec s = spec;
    s.vlan = true;
    s.vlan_tci = 0x6064;
    auto f = build(s);
    ParsedFrame p;
    REQUIRE(parse_frame(f.data(), f.size(), p) == ParseStatus::ok);
    CHECK(p.l3 == 18);
    CHECK(p.vlans == 1);
    CHECK(icrc_verify(f.data(), p));
    // Add an outer QinQ tag, then a third.
    f.insert(f.begin() + 12, {0x88, 0xA8, 0x00, 0x05});
    REQUIRE(parse_frame(f.data(), f.size(), p) == ParseStatus::ok);
    CHECK(p.vlans == 2);
    CHECK(p.l3 == 22);
    CHECK(icrc_verify(f.data(), p));
    f.insert(f.begin() + 12, {0x81, 0x00, 0x00, 0x07});
    CHECK(parse(f) == ParseStatus::too_many_vlans);
    // A tag header cut off in the middle.
    std::vector<uint8_t> cut(f.begin(), f.begin() + 16);
    CHECK(parse(cut) == ParseStatus::truncated_l2);
  }
}

TEST_CASE("every parse status has a name and a description", "[wire][parse]") {
  for (size_t i = 0; i < kParseStatusCount; ++i) {
    auto s = static_cast<ParseStatus>(i);
    CHECK(to_string(s) != "invalid");
    CHECK(!describe(s).empty());
  }
}

TEST_CASE("INA header round trip and magic check", "[wire][ina]") {
  InaInfo in;
  in.dtype = static_cast<uint8_t>(Dtype::bf16);
  in.op = static_cast<uint8_t>(ReduceOp::max);
  in.ring_id = 0xDEADBEEF;
  in.rank = 15;
  in.msg_len = 64;
  in.msg_id = 0xFFFFFFFF;
  uint8_t buf[sizeof(InaHdr)];
  ina_encode(in, buf);
  CHECK(buf[0] == 'I');
  CHECK(buf[3] == 'T');
  auto out = ina_decode(buf, sizeof(buf));
  REQUIRE(out);
  CHECK(out->ring_id == in.ring_id);
  CHECK(out->rank == in.rank);
  CHECK(out->msg_len == in.msg_len);
  CHECK(out->msg_id == in.msg_id);
  CHECK(out->dtype == in.dtype);
  CHECK(out->op == in.op);
  CHECK_FALSE(ina_decode(buf, sizeof(buf) - 1));
  buf[0] ^= 1;
  CHECK_FALSE(ina_decode(buf, sizeof(buf)));
  CHECK(dtype_size(Dtype::fp64) == 8);
  CHECK(dtype_size(Dtype::bf16) == 2);
  CHECK(dtype_size(uint8_t{0}) == 0);
  CHECK(parse_dtype("int64") == Dtype::int64);
  CHECK_FALSE(parse_dtype("float"));
  CHECK(parse_op("min") == ReduceOp::min);
  CHECK_FALSE(is_valid_op(0));
}

TEST_CASE("CRC linearity: combined ICRC equals a full recompute for every opcode and size",
          "[wire][icrc]") {
  std::mt19937_64 rng(99);
  std::vector<uint8_t> payload;
  size_t checked = 0;
  for (uint8_t op : netreduce::testing::known_opcodes()) {
    if (!opcode_info(op).has(kHasPayload)) continue;
    for (size_t len = 0; len <= 4096; len += (len < 64 ? 1 : 61)) {
      RoceFrameSpec s;
      netreduce::testing::random_spec(rng, s, payload, 0);
      s.opcode = op;
      payload.resize(len);
      for (auto& b : payload) b = static_cast<uint8_t>(rng());
      s.payload = payload.data();
      s.payload_len = len;
      auto f = build(s);
      ParsedFrame p;
      REQUIRE(parse_frame(f.data(), f.size(), p) == ParseStatus::ok);
      // Split anywhere between the BTH and the ICRC: head + tail == whole.
      const size_t split = p.bth + 12 + rng() % (p.icrc() - p.bth - 12 + 1);
      const uint32_t head = icrc_head(f.data(), p, split);
      const uint32_t tail = crc32(0, f.data() + split, p.icrc() - split);
      CHECK(crc32_combine(head, tail, p.icrc() - split) == icrc_compute(f.data(), p));
      CHECK(crc32_combine_shifted(head, tail, crc32_shift(p.icrc() - split)) ==
            icrc_load(f.data(), p));
      ++checked;
    }
  }
  CHECK(checked > 1000);
  // crc32_combine against the CRC of the concatenation, for random buffers.
  for (int i = 0; i < 200; ++i) {
    std::vector<uint8_t> a(rng() % 300), b(rng() % 5000);
    for (auto& x : a) x = static_cast<uint8_t>(rng());
    for (auto& x : b) x = static_cast<uint8_t>(rng());
    std::vector<uint8_t> ab(a);
    ab.insert(ab.end(), b.begin(), b.end());
    CHECK(crc32_combine(crc32(0, a.data(), a.size()), crc32(0, b.data(), b.size()), b.size()) ==
          crc32(0, ab.data(), ab.size()));
  }
}
