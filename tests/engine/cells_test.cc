// The cell state machine's decision (cases 1-5 of
// docs/design.md#cells-and-the-window-rule) and accumulate mode's header
// store.
#include "engine/cells.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <vector>

#include "wire/message.h"

using namespace netreduce;
using namespace netreduce::engine::detail;

TEST_CASE("cell_case: the five cases, msg_id wrap included", "[cells]") {
  Cell c;
  CHECK(cell_case(c, 7, 1u << 0) == CellCase::take);  // empty
  c.state = CellState::collecting;
  c.tag = 7;
  c.arrived = 0b01;
  CHECK(cell_case(c, 7, 0b10) == CellCase::take);       // 3: a new rank
  CHECK(cell_case(c, 7, 0b01) == CellCase::duplicate);  // 2
  CHECK(cell_case(c, 8, 0b01) == CellCase::reset);      // 4: an older tag
  CHECK(cell_case(c, 6, 0b10) == CellCase::stale);      // 5: a newer tag
  c.state = CellState::complete;
  c.arrived = 0b11;
  CHECK(cell_case(c, 7, 0b01) == CellCase::serve);  // 1
  CHECK(cell_case(c, 7, 0b10) == CellCase::serve);
  c.tag = 0xFFFFFFFFu;  // serial-number order across the wrap
  CHECK(cell_case(c, 0, 0b01) == CellCase::reset);
  c.tag = 1;
  CHECK(cell_case(c, 0xFFFFFFFFu, 0b01) == CellCase::stale);
}

TEST_CASE("the header store holds the largest WRITE headers and rebuilds the frame", "[cells]") {
  // WRITE ONLY WITH IMMEDIATE (RETH + ImmDt) behind two VLAN tags, with pad:
  // the most bytes before the data that parse_frame accepts.
  std::vector<uint8_t> data(37, 0x5A);
  wire::InaMessage m;
  m.base.vlan = true;
  m.base.src_ip = 0x0A000001;
  m.base.dst_ip = 0x0A000002;
  m.data = data.data();
  m.data_bytes = data.size();
  m.pmtu = 256;
  m.with_imm = true;
  std::vector<uint8_t> f(512);
  f.resize(wire::build_message_packet(m, 0, f.data(), f.size()));
  REQUIRE(!f.empty());
  // A second (outer, QinQ) tag before the builder's one; the ICRC does not cover L2.
  const uint8_t outer[4] = {0x88, 0xA8, 0x00, 0x07};
  f.insert(f.begin() + 12, outer, outer + 4);
  wire::ParsedFrame p;
  REQUIRE(wire::parse_frame(f.data(), f.size(), p) == wire::ParseStatus::ok);
  REQUIRE(p.opcode == 0x0B);
  REQUIRE(p.pad > 0);
  const auto data_off = static_cast<uint16_t>(p.payload + sizeof(wire::InaHdr));
  const auto data_len = static_cast<uint16_t>(p.payload_len - sizeof(wire::InaHdr));
  CHECK(data_off == kMaxDataOffset);  // the bound is exact, not a guess
  StoredHdr sh;
  store_header(sh, {f.data(), static_cast<uint16_t>(f.size()), nullptr, 9}, p, data_off, data_len,
               0x1234);
  CHECK(sh.frame_len == p.end);
  CHECK(sh.meta == 9);
  std::vector<uint8_t> out(sh.frame_len, 0);
  rebuild_header(sh, data_len, out.data());
  std::memcpy(out.data() + data_off, f.data() + data_off, data_len);
  std::memcpy(out.data() + p.icrc(), f.data() + p.icrc(), wire::kIcrcBytes);
  CHECK(out == std::vector<uint8_t>(f.begin(), f.begin() + p.end));
}
