// Named regression tests of the aggregation engine: each scenario of
// docs/design.md#tables, docs/design.md#cells-and-the-window-rule and
// docs/design.md#icrc-fix-up as a hand-written packet sequence, checked
// against an independent reference reduction (tests/engine/reference.h).
#include <catch2/catch.hpp>
#include <random>

#include "engine/box_harness.h"
#include "engine/reference.h"
#include "wire/headers.h"
#include "wire/psn.h"

using namespace netreduce;
using namespace netreduce::testing;
using engine::Reason;
using engine::Verdict;

namespace {

std::vector<uint8_t> fp_data(std::mt19937& rng, size_t bytes) {
  std::vector<uint8_t> d(bytes);
  for (size_t i = 0; i < bytes; i += 4) {
    const float v = static_cast<float>(static_cast<int>(rng() % 20001) - 10000) / 64.0f;
    std::memcpy(d.data() + i, &v, 4);
  }
  return d;
}

// Reference result of one message for all ranks, rank order.
std::vector<uint8_t> reference(const std::vector<std::vector<uint8_t>>& per_rank,
                               wire::Dtype dt = wire::Dtype::fp32,
                               wire::ReduceOp op = wire::ReduceOp::sum) {
  std::vector<const uint8_t*> in;
  for (const auto& d : per_rank) in.push_back(d.data());
  std::vector<uint8_t> out(per_rank[0].size());
  ref::reduce(dt, op, in, out.size(), out.data());
  return out;
}

// Expected data of packet k of a message whose data is `d`.
// Byte strings in memcmp order, element by element: std::vector's own
// operator< trips GCC 12's -Wstringop-overread at -O3 inside std::sort.
bool bytes_less(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  const size_t n = std::min(a.size(), b.size());
  for (size_t i = 0; i < n; ++i)
    if (a[i] != b[i]) return a[i] < b[i];
  return a.size() < b.size();
}

std::vector<uint8_t> slice(const std::vector<uint8_t>& d, uint32_t k, uint16_t pmtu) {
  const size_t off = wire::packet_data_offset(k, pmtu);
  const size_t room = k == 0 ? pmtu - sizeof(wire::InaHdr) : pmtu;
  const size_t n = std::min(room, d.size() - std::min(off, d.size()));
  return {d.begin() + static_cast<long>(off), d.begin() + static_cast<long>(off + n)};
}

uint64_t reason(const Harness& h, Reason r) { return h.e->counters()[static_cast<size_t>(r)]; }

struct Fixture {
  Harness h;
  RingTraffic t;
  std::mt19937 rng{7};
  std::vector<std::vector<std::vector<uint8_t>>> msgs;  // [msg][rank] data
  std::vector<std::vector<uint32_t>> psn0;              // [msg][rank]

  explicit Fixture(unsigned ranks = 3, uint16_t window = 2, engine::EngineConfig cfg = {})
      : h(cfg) {
    t.ranks = ranks;
    REQUIRE(h.e->install_ring(ring_spec(t.ring_id, ranks, 4, window)).ok());
  }
  // Adds message m (3 packets of 256 B per rank) with contiguous PSNs per rank.
  void add_message(size_t bytes = 3 * 256 - 24, uint32_t base = 1000) {
    std::vector<std::vector<uint8_t>> d;
    std::vector<uint32_t> p;
    for (unsigned r = 0; r < t.ranks; ++r) {
      d.push_back(fp_data(rng, bytes));
      uint32_t start = base + r * 100000;
      if (!msgs.empty())
        start = wire::psn_add(psn0.back()[r], wire::message_packets(msgs.back()[r].size(), t.pmtu));
      p.push_back(start);
    }
    msgs.push_back(std::move(d));
    psn0.push_back(std::move(p));
  }
  std::vector<uint8_t> pkt(unsigned rank, uint32_t m, uint32_t k) const {
    return t.packet(rank, m, msgs[m][rank], psn0[m][rank], k);
  }
  uint32_t packets(uint32_t m) const { return wire::message_packets(msgs[m][0].size(), t.pmtu); }
  // Checks that `out` holds the P released packets of (m, k), all with the reference data.
  void expect_released(const std::vector<std::vector<uint8_t>>& out, uint32_t m, uint32_t k) const {
    REQUIRE(out.size() == t.ranks);
    const auto want = slice(reference(msgs[m]), k, t.pmtu);
    for (const auto& f : out) {
      CHECK(data_of(f) == want);
      CHECK(icrc_ok(f));
    }
  }
};

}  // namespace

TEST_CASE("a complete cell releases every rank's packet with the rank-order sum", "[engine]") {
  Fixture x(4);
  x.add_message();
  for (uint32_t k = 0; k < x.packets(0); ++k) {
    for (unsigned r = 0; r < 4; ++r) {
      const auto o = x.h.feed(x.pkt(r, 0, k));
      CHECK(o.verdict == Verdict::held);
      if (r < 3) CHECK(x.h.sent.empty());
    }
    const auto out = x.h.take_sent();
    x.expect_released(out, 0, k);
    if (k == 0) {
      // The INA header of each first packet is the sender's own, untouched.
      std::set<uint16_t> ranks;
      for (const auto& f : out) {
        wire::ParsedFrame p;
        REQUIRE(wire::parse_frame(f.data(), f.size(), p) == wire::ParseStatus::ok);
        auto ina = wire::ina_decode(f.data() + p.payload, p.payload_len);
        REQUIRE(ina);
        ranks.insert(ina->rank);
        const auto* ip = reinterpret_cast<const wire::Ipv4Hdr*>(f.data() + p.l3);
        CHECK(ip->src.host() == rank_ip(ina->rank));
      }
      CHECK(ranks.size() == 4);
    }
  }
  auto info = x.h.e->ring_info(1);
  REQUIRE(info);
  CHECK(info->counters.messages_completed == 1);
  CHECK(info->counters.cells_completed == 3);
  CHECK(info->held_packets == 0);
  CHECK(x.h.live.empty());
}

TEST_CASE("first packet lost: later packets are dropped until it is resent",
          "[engine][regression]") {
  Fixture x;
  x.add_message();
  // Rank 1's first packet never reaches the box; its next packet cannot be placed.
  CHECK(x.h.feed(x.pkt(1, 0, 1)).reason == Reason::first_packet_lost);
  CHECK(x.h.feed(x.pkt(1, 0, 2)).reason == Reason::first_packet_lost);
  for (unsigned r : {0u, 2u}) x.h.feed(x.pkt(r, 0, 0));
  // Go-back-N from the first packet.
  for (uint32_t k = 0; k < 3; ++k) x.h.feed(x.pkt(1, 0, k));
  x.expect_released(x.h.take_sent(), 0, 0);
  for (uint32_t k = 1; k < 3; ++k) {
    for (unsigned r : {0u, 2u}) x.h.feed(x.pkt(r, 0, k));
    x.expect_released(x.h.take_sent(), 0, k);
  }
  CHECK(reason(x.h, Reason::first_packet_lost) == 2);
}

TEST_CASE("a later packet whose first packet passed around the box goes on when resent",
          "[engine][regression]") {
  engine::EngineConfig cfg;
  cfg.forward_unmatched_after = 10;
  Fixture x(3, 2, cfg);
  x.add_message();
  // Rank 1's packet 0 passed while the box was bypassed (or before it
  // started): only packets 1 and 2 are resent, for as long as rank 1 tries.
  CHECK(x.h.feed(x.pkt(1, 0, 1)).reason == Reason::first_packet_lost);
  CHECK(x.h.feed(x.pkt(1, 0, 2)).reason == Reason::first_packet_lost);
  CHECK(x.h.feed(x.pkt(1, 0, 1)).reason == Reason::first_packet_lost);  // too soon: reordering
  x.h.now += 10;
  CHECK(x.h.feed(x.pkt(1, 0, 1)).reason == Reason::fwd_unmatched);
  CHECK(x.h.feed(x.pkt(1, 0, 2)).reason == Reason::fwd_unmatched);  // the packet after it
  const auto sent = x.h.take_sent();
  REQUIRE(sent.size() == 2);
  CHECK(sent[0] == x.pkt(1, 0, 1));  // untouched: the receiver's seal check rejects the message
  CHECK(sent[1] == x.pkt(1, 0, 2));
  CHECK(reason(x.h, Reason::first_packet_lost) == 3);

  // Unset (the default), the box drops such packets however late they come.
  Fixture y;
  y.add_message();
  CHECK(y.h.feed(y.pkt(1, 0, 1)).reason == Reason::first_packet_lost);
  y.h.now += 1000000;
  CHECK(y.h.feed(y.pkt(1, 0, 1)).reason == Reason::first_packet_lost);
}

TEST_CASE("a bypass leaves every connection of a big ring stuck: each gets through",
          "[engine][regression]") {
  // 64 ranks, so 64 connections stuck at once, many sharing a set of the
  // engine's record table: each resend must not restart another's wait.
  engine::EngineConfig cfg;
  cfg.forward_unmatched_after = 10;
  Fixture x(64, 2, cfg);
  x.add_message();
  for (unsigned r = 0; r < 64; ++r)
    CHECK(x.h.feed(x.pkt(r, 0, 1)).reason == Reason::first_packet_lost);
  x.h.now += 10;
  for (unsigned r = 0; r < 64; ++r) {
    INFO("rank " << r);
    CHECK(x.h.feed(x.pkt(r, 0, 1)).reason == Reason::fwd_unmatched);
  }
}

TEST_CASE("a resend of a message that stalled in the box goes on; the sum still comes",
          "[engine][regression]") {
  engine::EngineConfig cfg;
  cfg.forward_stalled_after = 10;
  Fixture x(3, 2, cfg);
  x.add_message();
  // Rank 0's packet 0 is held; ranks 1 and 2 sent theirs while the box was
  // bypassed, so the cell never fills and rank 0 resends.
  CHECK(x.h.feed(x.pkt(0, 0, 0)).reason == Reason::held);
  CHECK(x.h.feed(x.pkt(0, 0, 0)).reason == Reason::duplicate);
  x.h.now += 10;
  CHECK(x.h.feed(x.pkt(0, 0, 0)).reason == Reason::fwd_stalled);
  auto sent = x.h.take_sent();
  REQUIRE(sent.size() == 1);
  CHECK(sent[0] == x.pkt(0, 0, 0));  // untouched
  // The held packet stays: if the others' packets do come, the sum goes out.
  for (unsigned r : {1u, 2u}) x.h.feed(x.pkt(r, 0, 0));
  x.expect_released(x.h.take_sent(), 0, 0);

  // A last packet whose message cannot be sealed here (cell 1 never fills)
  // is dropped, then forwarded once the message has waited long enough.
  CHECK(x.h.feed(x.pkt(0, 0, 1)).reason == Reason::held);
  for (unsigned r : {0u, 1u, 2u}) CHECK(x.h.feed(x.pkt(r, 0, 2)).reason != Reason::fwd_stalled);
  CHECK(x.h.take_sent().empty());
  CHECK(x.h.feed(x.pkt(0, 0, 2)).reason == Reason::message_incomplete);
  x.h.now += 10;
  CHECK(x.h.feed(x.pkt(0, 0, 2)).reason == Reason::fwd_stalled);
  sent = x.h.take_sent();
  REQUIRE(sent.size() == 1);
  CHECK(sent[0] == x.pkt(0, 0, 2));  // unsealed: its immediate is the sender's
}

TEST_CASE("go-back-N resends into message m-1 after m's first packet passed",
          "[engine][regression]") {
  Fixture x;
  x.add_message();
  x.add_message();
  // Message 0: rank 2's packet 2 is lost on the way to the box.
  for (uint32_t k = 0; k < 3; ++k)
    for (unsigned r = 0; r < 3; ++r)
      if (!(r == 2 && k == 2)) x.h.feed(x.pkt(r, 0, k));
  x.h.take_sent();
  // Everybody's message 1 first packet passes (rank 2 pipelines past its loss).
  for (unsigned r = 0; r < 3; ++r) x.h.feed(x.pkt(r, 1, 0));
  x.expect_released(x.h.take_sent(), 1, 0);
  // The resend of message 0 packet 2 must still find message 0.
  CHECK(x.h.feed(x.pkt(2, 0, 2)).verdict == Verdict::held);
  x.expect_released(x.h.take_sent(), 0, 2);
  // ... and so must the rest of rank 2's go-back-N: message 1's first packet again.
  CHECK(x.h.feed(x.pkt(2, 1, 0)).reason == Reason::served_from_cell);
}

TEST_CASE("a delayed duplicate of an old first packet never rewrites newer history",
          "[engine][regression]") {
  Fixture x(2, /*window=*/1);  // S = 2 message slots
  for (int m = 0; m < 4; ++m) x.add_message();
  auto run_message = [&](uint32_t m) {
    for (uint32_t k = 0; k < x.packets(m); ++k) {
      for (unsigned r = 0; r < 2; ++r) x.h.feed(x.pkt(r, m, k));
      x.expect_released(x.h.take_sent(), m, k);
    }
  };
  run_message(0);
  const auto old_first = x.pkt(0, 0, 0);
  run_message(1);
  // Message 2 has begun (its first packets passed), reusing message 0's slot.
  for (unsigned r = 0; r < 2; ++r) x.h.feed(x.pkt(r, 2, 0));
  x.h.take_sent();
  // The old duplicate shows up: it must be refused, not re-recorded.
  CHECK(x.h.feed(old_first).reason == Reason::stale_message);
  // Message 2 continues normally: its later packets still find message 2.
  for (uint32_t k = 1; k < x.packets(2); ++k) {
    for (unsigned r = 0; r < 2; ++r) CHECK(x.h.feed(x.pkt(r, 2, k)).verdict == Verdict::held);
    x.expect_released(x.h.take_sent(), 2, k);
  }
}

TEST_CASE("a result packet lost after completion is served from the cell", "[engine][regression]") {
  Fixture x;
  x.add_message();
  for (unsigned r = 0; r < 3; ++r) x.h.feed(x.pkt(r, 0, 0));
  const auto released = x.h.take_sent();
  // Rank 1's result was lost on the way to rank 2: rank 1 retransmits.
  const auto o = x.h.feed(x.pkt(1, 0, 0));
  CHECK(o.verdict == Verdict::emit);
  CHECK(o.reason == Reason::served_from_cell);
  const auto again = x.h.take_sent();
  REQUIRE(again.size() == 1);
  CHECK(icrc_ok(again[0]));
  // Byte for byte the packet the box released the first time for rank 1.
  bool same = false;
  for (const auto& f : released) same |= f == again[0];
  CHECK(same);
  CHECK(x.h.e->ring_info(1)->counters.retransmissions_served == 1);
}

TEST_CASE("a worker breaking rule W cannot corrupt a sum", "[engine][regression]") {
  Fixture x(3, /*window=*/1);  // S = 2
  for (int m = 0; m < 3; ++m) x.add_message();
  // Message 0 completes for packet 0 only; packets 1, 2 are still collecting.
  for (unsigned r = 0; r < 3; ++r) x.h.feed(x.pkt(r, 0, 0));
  x.h.take_sent();
  for (unsigned r = 0; r < 2; ++r) x.h.feed(x.pkt(r, 0, 1));
  SECTION("retransmission into a cell reused by a newer message is stale") {
    // Everybody (wrongly) moves on to message 2, which reuses message 0's slot.
    for (unsigned r = 0; r < 3; ++r) x.h.feed(x.pkt(r, 2, 0));
    x.expect_released(x.h.take_sent(), 2, 0);
    // Rank 0 retransmits message 0's first packet: dropped, nothing released.
    CHECK(x.h.feed(x.pkt(0, 0, 0)).reason == Reason::stale_message);
    CHECK(x.h.sent.empty());
  }
  SECTION("reusing a collecting cell evicts its held packets with a reason") {
    // Rank 0 jumps to message 2 and sends packet 1: the cell of (0, 1) holds
    // ranks 0 and 1. The box frees them, counted, and never mixes them in.
    x.h.feed(x.pkt(0, 2, 0));
    CHECK(x.h.feed(x.pkt(0, 2, 1)).verdict == Verdict::held);
    CHECK(x.h.freed == 2);
    CHECK(reason(x.h, Reason::evicted_incomplete) == 2);
    for (unsigned r = 1; r < 3; ++r) x.h.feed(x.pkt(r, 2, 0));
    x.h.take_sent();
    for (unsigned r = 1; r < 3; ++r) x.h.feed(x.pkt(r, 2, 1));
    x.expect_released(x.h.take_sent(), 2, 1);
    // Rank 2's late message-0 packet 1: its history slot now records message
    // 2, so the packet cannot be placed at all. Dropped, nothing released.
    CHECK(x.h.feed(x.pkt(2, 0, 1)).reason == Reason::first_packet_lost);
    CHECK(x.h.sent.empty());
  }
}

TEST_CASE("a duplicate of a held packet is dropped", "[engine][regression]") {
  Fixture x;
  x.add_message();
  CHECK(x.h.feed(x.pkt(0, 0, 0)).verdict == Verdict::held);
  CHECK(x.h.feed(x.pkt(0, 0, 0)).reason == Reason::duplicate);
  for (unsigned r = 1; r < 3; ++r) x.h.feed(x.pkt(r, 0, 0));
  x.expect_released(x.h.take_sent(), 0, 0);
}

TEST_CASE("PSN wrap-around inside a message", "[engine][regression]") {
  Fixture x;
  x.add_message(3 * 256 - 24, wire::kPsnMask - 1);  // rank 0: 0xFFFFFE, 0xFFFFFF, 0x000000
  for (unsigned r = 0; r < 3; ++r)
    x.psn0[0][r] = wire::psn_sub(0, 1 + r);  // every rank wraps inside
  for (uint32_t k = 0; k < 3; ++k) {
    for (unsigned r = 0; r < 3; ++r) CHECK(x.h.feed(x.pkt(r, 0, k)).verdict == Verdict::held);
    x.expect_released(x.h.take_sent(), 0, k);
  }
}

TEST_CASE("two rings interleaved", "[engine][regression]") {
  Harness h;
  RingTraffic a, b;
  a.ring_id = 10;
  a.ranks = 2;
  b.ring_id = 20;
  b.ranks = 3;
  b.ip_offset = 10;
  b.dtype = wire::Dtype::int32;
  b.op = wire::ReduceOp::max;
  REQUIRE(h.e->install_ring(ring_spec(10, 2)).ok());
  REQUIRE(h.e->install_ring(ring_spec(20, 3, 4, 2, 256, 10)).ok());
  std::mt19937 rng(3);
  std::vector<std::vector<uint8_t>> da, db;
  for (unsigned r = 0; r < 2; ++r) da.push_back(fp_data(rng, 700));
  for (unsigned r = 0; r < 3; ++r) {
    db.emplace_back(700);
    for (auto& byte : db.back()) byte = static_cast<uint8_t>(rng());
  }
  const auto want_a = reference(da);
  const auto want_b = reference(db, wire::Dtype::int32, wire::ReduceOp::max);
  for (uint32_t k = 0; k < 3; ++k) {
    h.feed(a.packet(0, 0, da[0], 50, k));
    h.feed(b.packet(0, 0, db[0], 70, k));
    h.feed(b.packet(1, 0, db[1], 80, k));
    h.feed(a.packet(1, 0, da[1], 60, k));
    h.feed(b.packet(2, 0, db[2], 90, k));
    const auto out = h.take_sent();
    REQUIRE(out.size() == 5);
    for (size_t i = 0; i < out.size(); ++i) {
      CHECK(icrc_ok(out[i]));
      // First released: ring a (2 packets, completed by a's rank 1), then ring b.
      CHECK(data_of(out[i]) == slice(i < 2 ? want_a : want_b, k, 256));
    }
  }
}

TEST_CASE("classification: what is forwarded untouched and what is dropped", "[engine]") {
  Fixture x;
  x.add_message();
  SECTION("ACK and other opcodes pass") {
    wire::RoceFrameSpec s;
    s.src_ip = rank_ip(1);
    s.dst_ip = rank_ip(0);
    s.opcode = 0x11;
    std::vector<uint8_t> f(wire::frame_size(s));
    wire::build_frame(s, f.data(), f.size());
    CHECK(x.h.feed(f).reason == Reason::fwd_not_write);
    CHECK(x.h.take_sent().at(0) == f);
  }
  SECTION("non-INA writes: forwarded off ring links, tracked on them") {
    wire::InaMessage m = x.t.message(0, 0, x.msgs[0][0], 5000);
    std::vector<uint8_t> first(600), middle(600);
    m.base.src_ip = rank_ip(7);  // not a ring link
    first.resize(wire::build_message_packet(m, 0, first.data(), first.size()));
    first[first.size() - 4 - 256 + 24] ^= 0;  // (payload untouched)
    // Strip the INA magic: an ordinary RDMA WRITE.
    wire::ParsedFrame p;
    REQUIRE(wire::parse_frame(first.data(), first.size(), p) == wire::ParseStatus::ok);
    first[p.payload] ^= 0xFF;
    wire::icrc_update(first.data(), p);
    CHECK(x.h.feed(first).reason == Reason::fwd_no_ina);
    middle.resize(wire::build_message_packet(m, 1, middle.data(), middle.size()));
    CHECK(x.h.feed(middle).reason == Reason::fwd_no_ina);
    // On a ring link: a middle packet with no known first packet is held back...
    m.base.src_ip = rank_ip(0);
    middle.resize(600);
    middle.resize(wire::build_message_packet(m, 1, middle.data(), middle.size()));
    CHECK(x.h.feed(middle).reason == Reason::first_packet_lost);
    // ... until its (non-INA) first packet passes; then the message flows.
    first.resize(600);
    first.resize(wire::build_message_packet(m, 0, first.data(), first.size()));
    REQUIRE(wire::parse_frame(first.data(), first.size(), p) == wire::ParseStatus::ok);
    first[p.payload] ^= 0xFF;
    wire::icrc_update(first.data(), p);
    CHECK(x.h.feed(first).reason == Reason::fwd_no_ina);
    CHECK(x.h.feed(middle).reason == Reason::fwd_no_ina);
    const auto out = x.h.take_sent();
    CHECK(out.back() == middle);
  }
  SECTION("INA packets that are not the ring's are dropped") {
    RingTraffic other = x.t;
    other.ring_id = 99;
    CHECK(x.h.feed(other.packet(0, 0, x.msgs[0][0], 1000, 0)).reason == Reason::unknown_ring);
    auto spoof = x.pkt(0, 0, 0);  // rank 0's header on rank 1's link (1 -> 2)
    wire::ParsedFrame p;
    REQUIRE(wire::parse_frame(spoof.data(), spoof.size(), p) == wire::ParseStatus::ok);
    reinterpret_cast<wire::Ipv4Hdr*>(spoof.data() + p.l3)->src.set(rank_ip(1));
    reinterpret_cast<wire::Ipv4Hdr*>(spoof.data() + p.l3)->dst.set(rank_ip(2));
    wire::icrc_update(spoof.data(), p);
    CHECK(x.h.feed(spoof).reason == Reason::rank_address_mismatch);
    auto corrupt = x.pkt(0, 0, 0);
    corrupt[corrupt.size() - 10] ^= 4;
    CHECK(x.h.feed(corrupt).reason == Reason::bad_icrc);
    RingTraffic bad = x.t;
    bad.dtype = static_cast<wire::Dtype>(9);
    CHECK(x.h.feed(bad.packet(0, 0, x.msgs[0][0], 1000, 0)).reason == Reason::bad_ina_header);
    bad = x.t;
    bad.pmtu = 512;  // bigger than the ring's payload size
    CHECK(x.h.feed(bad.packet(0, 0, x.msgs[0][0], 1000, 0)).reason == Reason::length_mismatch);
    CHECK(x.h.sent.empty());
  }
  SECTION("a ring restricted to fp32 refuses int32") {
    engine::RingSpec s = ring_spec(5, 2, 4, 2, 256, 20);
    s.dtype_mask = 1u << static_cast<unsigned>(wire::Dtype::fp32);
    REQUIRE(x.h.e->install_ring(s).ok());
    RingTraffic t;
    t.ring_id = 5;
    t.ranks = 2;
    t.ip_offset = 20;
    t.dtype = wire::Dtype::int32;
    CHECK(x.h.feed(t.packet(0, 0, x.msgs[0][0], 1000, 0)).reason == Reason::dtype_mismatch);
  }
}

TEST_CASE("ring installation: validation, quotas, idempotency, removal", "[engine][control]") {
  engine::EngineConfig cfg;
  cfg.memory_budget = 64ull << 20;
  Harness h(cfg);
  auto s = ring_spec(1, 3);
  CHECK(h.e->install_ring(s).ok());
  CHECK(h.e->install_ring(s).ok());  // same spec: no-op
  auto other = s;
  other.window = 4;
  auto st = h.e->install_ring(other);
  CHECK(st.code() == StatusCode::conflict);
  CHECK(st.field() == "id");  // the ring JSON's name for it, as everywhere

  auto bad = ring_spec(2, 1);
  CHECK(h.e->install_ring(bad).field() == "members");
  bad = ring_spec(2, 3);
  bad.members[2] = bad.members[0];
  CHECK(h.e->install_ring(bad).field() == "members[2]");
  bad = ring_spec(2, 3);
  bad.payload_bytes = 1000;
  CHECK(h.e->install_ring(bad).field() == "payload_bytes");
  bad = ring_spec(2, 3);
  bad.window = 0;
  CHECK(h.e->install_ring(bad).field() == "window");
  bad = ring_spec(2, 3);
  bad.memory_quota = 1000;
  st = h.e->install_ring(bad);
  CHECK(st.code() == StatusCode::resource_exhausted);
  CHECK(st.field() == "memory_quota");
  bad = ring_spec(2, 64, 64, 64, 4096, 100);  // far over the 64 MiB budget
  st = h.e->install_ring(bad);
  CHECK(st.code() == StatusCode::resource_exhausted);
  CHECK(st.field() == "memory");
  CHECK(h.e->ring_ids() == std::vector<uint32_t>{1});

  // Removal hands back what the ring held.
  RingTraffic t;
  std::vector<uint8_t> d(700, 1);
  h.feed(t.packet(0, 0, d, 10, 0));
  h.feed(t.packet(1, 0, d, 20, 0));
  REQUIRE(h.live.size() == 2);
  // A cell waiting on a rank is reported stalled once older than the asked timeout.
  auto info = h.e->ring_info(1, h.now + 5, 100);
  REQUIRE(info);
  CHECK(info->open_cells == 1);
  CHECK(info->stalled_cells == 0);
  info = h.e->ring_info(1, h.now + 500, 100);
  CHECK(info->stalled_cells == 1);
  CHECK(info->held_packets == 2);
  std::vector<engine::Pkt> released;
  CHECK(h.e->remove_ring(1, h.now, released).ok());
  CHECK(released.size() == 2);
  CHECK(h.e->remove_ring(1, h.now, released).code() == StatusCode::not_found);
  CHECK(h.e->memory_in_use() == 0);
  CHECK(h.e->ring_count() == 0);
  CHECK(h.e->retired_count() == 1);
  // After removal its links stay retired: nothing on them is aggregated or forwarded raw.
  CHECK(h.feed(t.packet(2, 0, d, 30, 0)).reason == Reason::ring_retired);
  CHECK(h.feed(t.packet(2, 0, d, 30, 1)).reason == Reason::ring_retired);
  CHECK(h.sent.empty());
}

TEST_CASE("linear ICRC fix-up releases the same bytes as a full recompute", "[engine][icrc]") {
  std::mt19937 rng(11);
  for (uint16_t pmtu : {256, 1024, 4096}) {
    for (size_t bytes : {size_t{8}, size_t{100}, size_t{pmtu} - 24, size_t{pmtu} * 2 - 24 + 4,
                         size_t{pmtu} * 3 - 28}) {
      std::vector<std::vector<uint8_t>> outs[2];
      for (int method = 0; method < 2; ++method) {
        engine::EngineConfig cfg;
        cfg.icrc_fixup = method ? engine::IcrcFixup::linear : engine::IcrcFixup::full;
        Harness h(cfg);
        REQUIRE(h.e->install_ring(ring_spec(1, 3, 4, 2, pmtu)).ok());
        RingTraffic t;
        t.pmtu = pmtu;
        std::mt19937 r2(static_cast<unsigned>(bytes));
        std::vector<std::vector<uint8_t>> d;
        for (unsigned r = 0; r < 3; ++r) d.push_back(fp_data(r2, bytes));
        for (uint32_t k = 0; k < wire::message_packets(bytes, pmtu); ++k)
          for (unsigned r = 0; r < 3; ++r) h.feed(t.packet(r, 0, d[r], 100 + r, k));
        outs[method] = h.take_sent();
      }
      INFO("pmtu " << pmtu << " bytes " << bytes);
      REQUIRE(!outs[0].empty());
      CHECK(outs[0] == outs[1]);
      for (const auto& f : outs[1]) CHECK(icrc_ok(f));
    }
  }
  (void)rng;
}

TEST_CASE("accumulate mode releases what deterministic mode releases (order-free ops)",
          "[engine][accumulate]") {
  for (auto op : {wire::ReduceOp::sum, wire::ReduceOp::max}) {
    std::vector<std::vector<uint8_t>> outs[2];
    for (int mode = 0; mode < 2; ++mode) {
      engine::EngineConfig cfg;
      cfg.mode = mode ? engine::ReduceMode::accumulate : engine::ReduceMode::deterministic;
      Harness h(cfg);
      REQUIRE(h.e->install_ring(ring_spec(1, 4)).ok());
      RingTraffic t;
      t.ranks = 4;
      t.dtype = wire::Dtype::int64;
      t.op = op;
      std::mt19937 rng(5);
      std::vector<std::vector<uint8_t>> d(4, std::vector<uint8_t>(3 * 256 - 24));
      for (auto& v : d)
        for (auto& b : v) b = static_cast<uint8_t>(rng());
      // Arrival order differs from rank order.
      for (uint32_t k = 0; k < 3; ++k)
        for (unsigned r : {2u, 0u, 3u, 1u}) h.feed(t.packet(r, 0, d[r], 100 + r * 10, k));
      // A retransmission after completion is served from the cell in both modes.
      CHECK(h.feed(t.packet(3, 0, d[3], 130, 1)).reason == Reason::served_from_cell);
      outs[mode] = h.take_sent();
      CHECK(h.live.empty());
      const auto want = reference(d, wire::Dtype::int64, op);
      for (size_t i = 0; i < 12; ++i)
        CHECK(data_of(outs[mode][i]) == slice(want, static_cast<uint32_t>(i / 4), 256));
    }
    // Same packets, same bytes (release order within a cell is rank order in both).
    CHECK(outs[0] == outs[1]);
  }
}

// ---- ring lifecycle: a removed ring's job fails, it never gets unreduced data ----

namespace {

constexpr size_t kFourPackets = 4 * 256 - 24;  // data bytes of a 4-packet message at PMTU 256

// 3 ranks, 4-packet messages, positions 0 and 1 of message 0 complete.
struct Removal : Fixture {
  explicit Removal(engine::EngineConfig cfg = {}) : Fixture(3, 2, cfg) {
    add_message(kFourPackets);
    add_message(kFourPackets);
    for (uint32_t k = 0; k < 2; ++k) {
      for (unsigned r = 0; r < 3; ++r) REQUIRE(h.feed(pkt(r, 0, k)).verdict == Verdict::held);
      expect_released(h.take_sent(), 0, k);
    }
  }
  void remove() {
    std::vector<engine::Pkt> released;
    REQUIRE(h.e->remove_ring(t.ring_id, h.now, released).ok());
    for (const auto& p : released) REQUIRE(h.live.erase(p.handle) == 1);
  }
};

}  // namespace

TEST_CASE("a ring removed mid-message: no later packet of the message leaves the box",
          "[engine][lifecycle]") {
  Removal x;
  x.remove();
  CHECK(x.h.e->retired_count() == 1);
  for (uint32_t k = 2; k < 4; ++k)
    for (unsigned r = 0; r < 3; ++r) CHECK(x.h.feed(x.pkt(r, 0, k)).reason == Reason::ring_retired);
  // The next message's first packets (and their successors) neither bind nor pass.
  for (unsigned r = 0; r < 3; ++r) {
    CHECK(x.h.feed(x.pkt(r, 1, 0)).reason == Reason::ring_retired);
    CHECK(x.h.feed(x.pkt(r, 1, 1)).reason == Reason::ring_retired);
  }
  CHECK(x.h.sent.empty());
  CHECK(reason(x.h, Reason::ring_retired) == 12);
  CHECK(x.h.live.empty());
}

TEST_CASE("a ring removed mid-retransmission: go-back-N resends of held packets are dropped",
          "[engine][lifecycle]") {
  Removal x;
  // Position 2: ranks 0 and 1 are held, rank 2's packet is lost on the way.
  for (unsigned r = 0; r < 2; ++r) CHECK(x.h.feed(x.pkt(r, 0, 2)).verdict == Verdict::held);
  x.remove();
  CHECK(x.h.live.empty());  // the held packets came back (ring_removed)
  CHECK(reason(x.h, Reason::ring_removed) == 2);
  // Every rank times out and goes back N from position 2; rank 1 even from position 0.
  for (unsigned r = 0; r < 3; ++r)
    for (uint32_t k = 2; k < 4; ++k) CHECK(x.h.feed(x.pkt(r, 0, k)).reason == Reason::ring_retired);
  for (uint32_t k = 0; k < 4; ++k) CHECK(x.h.feed(x.pkt(1, 0, k)).reason == Reason::ring_retired);
  CHECK(x.h.sent.empty());
}

TEST_CASE("re-installing a removed ring id: the new run aggregates, the old run's packets drop",
          "[engine][lifecycle]") {
  Removal x;
  for (unsigned r = 0; r < 2; ++r) x.h.feed(x.pkt(r, 0, 2));
  x.remove();
  REQUIRE(x.h.e->install_ring(ring_spec(x.t.ring_id, 3, 4, 2)).ok());
  // The new run of the job: new QPs, message ids from 0 again, different data.
  RingTraffic fresh = x.t;
  fresh.qpn_offset = 0x1000;
  std::vector<std::vector<uint8_t>> d;
  for (unsigned r = 0; r < 3; ++r) d.push_back(fp_data(x.rng, kFourPackets));
  const auto want = reference(d);
  for (uint32_t k = 0; k < 4; ++k) {
    for (unsigned r = 0; r < 3; ++r) {
      CHECK(x.h.feed(fresh.packet(r, 0, d[r], 5000 + r * 1000, k)).verdict == Verdict::held);
      // Interleaved: the old run's late packets and go-back-N resends, first packets included.
      CHECK(x.h.feed(x.pkt(r, 0, k)).reason == Reason::ring_retired);
      CHECK(x.h.feed(x.pkt(r, 1, k)).reason == Reason::ring_retired);
    }
    const auto out = x.h.take_sent();
    REQUIRE(out.size() == 3);
    for (const auto& f : out) {
      CHECK(data_of(f) == slice(want, k, 256));
      CHECK(icrc_ok(f));
    }
  }
  CHECK(x.h.e->ring_info(x.t.ring_id)->counters.messages_completed == 1);
  CHECK(x.h.e->ring_info(x.t.ring_id)->counters.connections_rebound == 0);
}

TEST_CASE("a retired connection never re-binds before its tombstone expires, then binds afresh",
          "[engine][lifecycle]") {
  engine::EngineConfig cfg;
  cfg.retire_grace = 1000;
  Removal x(cfg);
  x.remove();
  const uint64_t removed_at = x.h.now;
  REQUIRE(x.h.e->install_ring(ring_spec(x.t.ring_id, 3, 4, 2)).ok());
  // The old run on its old QPs goes back to its message 1: still retired,
  // even though the id it names is installed again.
  for (unsigned r = 0; r < 3; ++r) CHECK(x.h.feed(x.pkt(r, 1, 0)).reason == Reason::ring_retired);
  CHECK(x.h.sent.empty());
  REQUIRE(x.h.e->retired_rings().size() == 1);
  CHECK(x.h.e->retired_rings()[0].connections == 3);
  CHECK(x.h.e->retired_rings()[0].expires == removed_at + 1000);
  CHECK(x.h.e->expire_retired(removed_at + 1000) == 1);
  CHECK(x.h.e->retired_count() == 0);
  // After the grace the keys are ordinary keys: they bind the installed ring.
  for (uint32_t k = 0; k < 4; ++k) {
    for (unsigned r = 0; r < 3; ++r) CHECK(x.h.feed(x.pkt(r, 1, k)).verdict == Verdict::held);
    x.expect_released(x.h.take_sent(), 1, k);
  }
}

TEST_CASE("re-installed id: the old run's resend arriving first never enters the new run's cells",
          "[engine][lifecycle]") {
  // If a retired connection could bind again, the old run's go-back-N
  // resend of a first packet would bind the rank before the new run's first
  // packet, its data would go into cell (m, 0), and the new run's own packet
  // would be dropped as a duplicate: every rank would get a wrong sum.
  Removal x;
  x.remove();
  REQUIRE(x.h.e->install_ring(ring_spec(x.t.ring_id, 3, 4, 2)).ok());
  RingTraffic fresh = x.t;
  fresh.qpn_offset = 0x1000;
  std::vector<std::vector<uint8_t>> d;
  for (unsigned r = 0; r < 3; ++r) d.push_back(fp_data(x.rng, kFourPackets));
  const auto want = reference(d);
  for (uint32_t k = 0; k < 4; ++k) {
    for (unsigned r = 0; r < 3; ++r) {
      CHECK(x.h.feed(x.pkt(r, 0, k)).reason == Reason::ring_retired);  // old run first
      CHECK(x.h.feed(fresh.packet(r, 0, d[r], 5000 + r * 1000, k)).verdict == Verdict::held);
    }
    const auto out = x.h.take_sent();
    REQUIRE(out.size() == 3);
    for (const auto& f : out) CHECK(data_of(f) == slice(want, k, 256));
  }
}

TEST_CASE("a removed ring's tombstone expires after the grace, not before", "[engine][lifecycle]") {
  engine::EngineConfig cfg;
  cfg.retire_grace = 1000;
  Removal x(cfg);
  x.remove();
  const uint64_t removed_at = x.h.now;
  CHECK(x.h.e->expire_retired(removed_at + 999) == 0);
  CHECK(x.h.e->retired_count() == 1);
  CHECK(x.h.feed(x.pkt(0, 0, 2)).reason == Reason::ring_retired);
  CHECK(x.h.e->expire_retired(removed_at + 1000) == 1);
  CHECK(x.h.e->retired_count() == 0);
  CHECK(x.h.e->retired_rings().empty());
  // After the grace the hosts are ordinary hosts again: their WRITEs pass untouched.
  const auto late = x.pkt(0, 0, 3);
  CHECK(x.h.feed(late).reason == Reason::fwd_no_ina);
  CHECK(x.h.take_sent().at(0) == late);
}

TEST_CASE("a tombstone never points into a re-used ring slot", "[engine][lifecycle]") {
  engine::EngineConfig cfg;
  cfg.max_rings = 1;  // the next ring must take the removed ring's slot
  Removal x(cfg);
  x.remove();
  RingTraffic other;
  other.ring_id = 2;
  other.ranks = 2;
  other.ip_offset = 10;
  REQUIRE(x.h.e->install_ring(ring_spec(2, 2, 4, 2, 256, 10)).ok());
  std::vector<std::vector<uint8_t>> d;
  for (unsigned r = 0; r < 2; ++r) d.push_back(fp_data(x.rng, kFourPackets));
  for (unsigned r = 0; r < 2; ++r) x.h.feed(other.packet(r, 0, d[r], 100 + r, 0));
  CHECK(x.h.take_sent().size() == 2);
  // The old ring's connections stay retired: nothing of theirs reaches ring 2's cells.
  for (unsigned r = 0; r < 3; ++r)
    for (uint32_t k = 2; k < 4; ++k) CHECK(x.h.feed(x.pkt(r, 0, k)).reason == Reason::ring_retired);
  CHECK(x.h.sent.empty());
  CHECK(x.h.e->ring_info(2)->counters.packets_aggregated == 2);
}

TEST_CASE("an RDMA WRITE off ring links whose data begins with INET is forwarded byte-identical",
          "[engine][classification]") {
  Fixture x;  // ring 1: 10.0.0.1 -> .2 -> .3 -> .1
  x.add_message();
  // A text file carried over RoCE: its first bytes are the INA magic.
  std::string text = "INET6 fe80::1/64 scope link\n";
  while (text.size() < 256) text += "inetnum: 10.0.0.0 - 10.255.255.255\n";
  text.resize(256);
  auto write = [&](uint8_t opcode, uint32_t src, uint32_t dst) {
    wire::RoceFrameSpec s;
    s.src_ip = src;
    s.dst_ip = dst;
    s.opcode = opcode;
    s.dest_qp = 0x4242;
    s.psn = 77;
    s.va = 0x2000;
    s.rkey = 9;
    s.dma_length = opcode == 0x06 ? 3 * 256 : 256;
    s.payload = reinterpret_cast<const uint8_t*>(text.data());
    s.payload_len = text.size();
    std::vector<uint8_t> f(wire::frame_size(s));
    REQUIRE(wire::build_frame(s, f.data(), f.size()) == f.size());
    return f;
  };
  // Hosts in no ring; a member to a member that is not its successor (0 -> 2).
  for (auto [src, dst] : {std::pair{rank_ip(7), rank_ip(8)}, std::pair{rank_ip(0), rank_ip(2)}}) {
    for (uint8_t op : {uint8_t{0x06}, uint8_t{0x0A}}) {  // WRITE FIRST, WRITE ONLY
      const auto f = write(op, src, dst);
      REQUIRE(wire::ina_decode(f.data() + 70, 24));  // (it does look like an INA header)
      CHECK(x.h.feed(f).reason == Reason::fwd_not_ring_link);
      // Even with a broken ICRC: not the box's business, the receiver decides.
      auto bad = f;
      bad[bad.size() - 1] ^= 1;
      CHECK(x.h.feed(bad).reason == Reason::fwd_not_ring_link);
      const auto out = x.h.take_sent();
      REQUIRE(out.size() == 2);
      CHECK(out[0] == f);
      CHECK(out[1] == bad);
    }
  }
  CHECK(reason(x.h, Reason::fwd_not_ring_link) == 8);
  // On a ring link the same bytes are strict: no such ring.
  CHECK(x.h.feed(write(0x06, rank_ip(0), rank_ip(1))).reason == Reason::unknown_ring);
  // A removed ring's links stay strict too.
  std::vector<engine::Pkt> released;
  REQUIRE(x.h.e->remove_ring(1, x.h.now, released).ok());
  CHECK(x.h.feed(write(0x0A, rank_ip(1), rank_ip(2))).reason == Reason::ring_retired);
  CHECK(x.h.sent.empty());
}

// ---- tables that ordinary traffic cannot exhaust ----

TEST_CASE("thousands of ordinary connections on a ring link never starve an INA connection",
          "[engine][tables]") {
  Fixture x;
  x.add_message();
  // 6,000 distinct QPs write ordinary (non-INA) 2-packet messages on ring link 0 -> 1.
  std::vector<uint8_t> data(2 * 256, 0x11);
  auto write = [&](uint8_t opcode, uint32_t qpn, uint32_t psn) {
    wire::RoceFrameSpec s;
    s.src_ip = rank_ip(0);
    s.dst_ip = rank_ip(1);
    s.opcode = opcode;
    s.dest_qp = qpn;
    s.psn = psn;
    s.dma_length = 512;
    s.payload = data.data();
    s.payload_len = 256;
    std::vector<uint8_t> f(wire::frame_size(s));
    REQUIRE(wire::build_frame(s, f.data(), f.size()) == f.size());
    return f;
  };
  for (uint32_t q = 0; q < 6000; ++q) {
    CHECK(x.h.feed(write(0x06, 0x10000 + q, q * 2)).reason == Reason::fwd_no_ina);
    if (q % 2) CHECK(x.h.feed(write(0x08, 0x10000 + q, q * 2 + 1)).reason == Reason::fwd_no_ina);
  }
  const auto before = x.h.e->table_stats();
  CHECK(before.pass_evictions > 0);  // the table is full: it evicted, it did not refuse
  CHECK(before.clt_entries == 0);    // ordinary traffic takes no INA connection slot
  // The recently active ordinary connections still have their later packets forwarded.
  CHECK(x.h.feed(write(0x08, 0x10000 + 5998, 5998 * 2 + 1)).reason == Reason::fwd_no_ina);
  x.h.take_sent();
  // The job's INA connections bind and aggregate.
  for (uint32_t k = 0; k < x.packets(0); ++k) {
    for (unsigned r = 0; r < 3; ++r) CHECK(x.h.feed(x.pkt(r, 0, k)).verdict == Verdict::held);
    x.expect_released(x.h.take_sent(), 0, k);
  }
  CHECK(reason(x.h, Reason::clt_full) == 0);
  CHECK(x.h.e->table_stats().clt_entries == 3);
}

TEST_CASE("history lookup is bounded at S = 2048 and still finds every go-back-N resend",
          "[engine][tables]") {
  Fixture x(2, /*window=*/1024);  // S = 2048
  constexpr uint32_t kS = 2048, kN = 1024;
  const size_t bytes = 2 * 256 - 24;                                  // 2-packet messages
  auto hole = [](uint32_t m) { return m >= kS - kN && m % 5 == 2; };  // rank 0's first packet lost
  for (uint32_t m = 0; m < kS; ++m) {
    x.add_message(bytes);
    for (uint32_t k = 0; k < 2; ++k)
      for (unsigned r = 0; r < 2; ++r)
        if (!(r == 0 && hole(m))) x.h.feed(x.pkt(r, m, k));
  }
  x.h.take_sent();
  const auto lookups0 = x.h.e->table_stats().history_lookups;
  // Go-back-N resends of rank 0 within the window, in order and then in a random order.
  std::vector<uint32_t> order;
  for (uint32_t m = kS - kN; m < kS; ++m)
    if (!hole(m)) order.push_back(m);
  for (int pass = 0; pass < 2; ++pass) {
    if (pass) std::shuffle(order.begin(), order.end(), x.rng);
    for (uint32_t m : order) {
      INFO("message " << m);
      CHECK(x.h.feed(x.pkt(0, m, 1)).reason == Reason::served_from_cell);
    }
  }
  // A flood of bogus PSNs on rank 0's connection.
  std::mt19937 rng(99);
  auto bogus = x.pkt(0, kS - 1, 1);
  wire::ParsedFrame p;
  REQUIRE(wire::parse_frame(bogus.data(), bogus.size(), p) == wire::ParseStatus::ok);
  auto* bth = reinterpret_cast<wire::Bth*>(bogus.data() + p.bth);
  unsigned lost = 0;
  for (int i = 0; i < 50000; ++i) {
    bth->psn.set(rng() & wire::kPsnMask);
    lost += x.h.feed(bogus).reason == Reason::first_packet_lost;
  }
  CHECK(lost > 45000);
  const auto st = x.h.e->table_stats();
  INFO("lookups " << st.history_lookups - lookups0 << ", probes " << st.history_probes << ", worst "
                  << st.history_probes_max);
  CHECK(st.history_probes_max <= 24);  // the budget, against S = 2048 reads before
  CHECK(st.history_probes < 16 * st.history_lookups);
}

TEST_CASE("process_burst releases what per-packet process releases, in every mode and fix-up",
          "[engine][burst]") {
  // Shuffled traffic of 4 ranks (each rank's packets in order, a few resent
  // and a few duplicated), fed once packet by packet and once in bursts of
  // random size into a sink drained only when process_burst stops early
  // (and at the end).
  // The per-packet run is the reference the tests above check; the burst
  // run must give the same verdicts and the same bytes in the same order.
  std::mt19937 rng(21);
  RingTraffic t;
  t.ranks = 4;
  std::vector<std::vector<uint8_t>> feed;
  {
    std::vector<std::vector<std::vector<uint8_t>>> per_rank(t.ranks);
    for (uint32_t m = 0; m < 24; ++m)  // more releases than a sink holds
      for (unsigned r = 0; r < t.ranks; ++r) {
        const auto d = fp_data(rng, 3 * 256 - 24);
        for (uint32_t k = 0; k < 3; ++k) {
          per_rank[r].push_back(t.packet(r, m, d, wire::psn_add(1000 + r * 5000, m * 3), k));
          if (rng() % 8 == 0) per_rank[r].push_back(per_rank[r].back());  // duplicate / resend
        }
      }
    std::vector<size_t> next(t.ranks, 0);
    for (size_t left = 0;;) {
      left = 0;
      for (unsigned r = 0; r < t.ranks; ++r) left += per_rank[r].size() - next[r];
      if (!left) break;
      const unsigned r = rng() % t.ranks;
      if (next[r] < per_rank[r].size()) feed.push_back(per_rank[r][next[r]++]);
    }
  }
  for (const auto mode : {engine::ReduceMode::deterministic, engine::ReduceMode::accumulate})
    for (const auto fix : {engine::IcrcFixup::full, engine::IcrcFixup::linear}) {
      engine::EngineConfig cfg;
      cfg.mode = mode;
      cfg.icrc_fixup = fix;
      Harness one(cfg), burst(cfg);
      REQUIRE(one.e->install_ring(ring_spec(1, t.ranks, 4, 4)).ok());
      REQUIRE(burst.e->install_ring(ring_spec(1, t.ranks, 4, 4)).ok());
      for (const auto& f : feed) one.feed(f);

      std::vector<std::vector<uint8_t>> sent;
      std::vector<engine::Outcome> outcomes;
      engine::Sink sink;
      size_t released = 0, tx = 0;  // Outcome::released against what the sink got
      auto drain = [&] {
        tx += sink.ntx;
        for (unsigned i = 0; i < sink.ntx; ++i) {
          const engine::Pkt& p = sink.tx[i];
          sent.emplace_back(p.data, p.data + p.len);
        }
        sink.clear();
      };
      unsigned stops = 0;
      for (size_t at = 0; at < feed.size();) {
        const auto n = static_cast<unsigned>(std::min<size_t>(1 + rng() % 40, feed.size() - at));
        std::vector<engine::Frame> frames(n);
        for (unsigned i = 0; i < n; ++i) {
          auto& b = burst.buffers.emplace_back(feed[at + i]);
          engine::Engine::classify({b.data(), static_cast<uint16_t>(b.size()), &b}, frames[i]);
        }
        std::vector<engine::Outcome> o(n);
        for (unsigned done = 0; done < n;) {
          const unsigned got = burst.e->process_burst(frames.data() + done, n - done, ++burst.now,
                                                      o.data() + done, sink);
          for (unsigned i = done; i < done + got; ++i) released += o[i].released;
          for (unsigned i = done; i < done + got; ++i)  // served from a complete cell
            if (o[i].verdict == engine::Verdict::emit)
              sent.emplace_back(frames[i].pkt.data, frames[i].pkt.data + frames[i].pkt.len);
          done += got;
          if (done < n) {
            CHECK(engine::Sink::kCapacity - sink.ntx < engine::kMaxRanks);  // only when nearly full
            ++stops;
            drain();
          }
        }
        outcomes.insert(outcomes.end(), o.begin(), o.end());
        at += n;
      }
      drain();
      INFO("mode " << int(mode) << " fix-up " << int(fix));
      REQUIRE(outcomes.size() == one.outcomes.size());
      for (size_t i = 0; i < outcomes.size(); ++i) {
        CHECK(outcomes[i].verdict == one.outcomes[i].verdict);
        CHECK(outcomes[i].reason == one.outcomes[i].reason);
      }
      // The same packets; the per-packet harness interleaves emitted input
      // packets with releases differently, so compare as multisets.
      auto want = one.sent;
      std::sort(want.begin(), want.end(), bytes_less);
      std::sort(sent.begin(), sent.end(), bytes_less);
      CHECK(sent == want);
      CHECK(released == tx);
      CHECK(stops > 0);
      CHECK(reason(one, Reason::served_from_cell) > 0);
    }
}

TEST_CASE("a message's last packets carry its digest; before the message completes, none leave",
          "[engine][digest]") {
  for (const auto mode : {engine::ReduceMode::deterministic, engine::ReduceMode::accumulate})
    for (const auto fixup : {engine::IcrcFixup::linear, engine::IcrcFixup::full}) {
      INFO("accumulate " << (mode == engine::ReduceMode::accumulate) << " full ICRC "
                         << (fixup == engine::IcrcFixup::full));
      engine::EngineConfig cfg;
      cfg.mode = mode;
      cfg.icrc_fixup = fixup;
      Fixture x(3, 2, cfg);
      x.add_message();
      x.add_message(2 * 256 + 40);
      const auto all_of = [&](uint32_t m, uint32_t k) {
        for (unsigned r = 0; r < 3; ++r) x.h.feed(x.pkt(r, m, k));
        return x.h.take_sent();
      };
      // Message 0 in order: only its last packets change their ImmDt, to
      // 0 ^ crc32(result), and their ICRC holds.
      for (uint32_t k = 0; k + 1 < x.packets(0); ++k)
        for (const auto& f : all_of(0, k)) CHECK(imm_of(f) == std::nullopt);
      const auto last0 = all_of(0, x.packets(0) - 1);
      x.expect_released(last0, 0, x.packets(0) - 1);
      for (const auto& f : last0) CHECK(imm_of(f) == expected_seal(0, reference(x.msgs[0])));

      // Message 1: rank 0's middle packet is lost before the box, so its last
      // cell completes while cell 1 is open: the last packets are dropped
      // (a copy with the senders' immediate must never reach a host).
      const uint32_t last = x.packets(1) - 1;
      REQUIRE(last == 2);
      all_of(1, 0);
      x.h.feed(x.pkt(1, 1, 1));
      x.h.feed(x.pkt(2, 1, 1));
      CHECK(x.h.take_sent().empty());
      CHECK(all_of(1, last).empty());
      CHECK(reason(x.h, Reason::message_incomplete) == 3);
      // Only cell 1's packets are held (deterministic mode holds them).
      CHECK(x.h.live.size() == (mode == engine::ReduceMode::deterministic ? 2u : 0u));
      // A resend of a last packet before the gap is filled: dropped too.
      CHECK(x.h.feed(x.pkt(1, 1, last)).reason == Reason::message_incomplete);
      // Rank 0 goes back: its middle packet completes cell 1, its last
      // packet is served from the cell, sealed now.
      x.h.feed(x.pkt(0, 1, 1));
      x.expect_released(x.h.take_sent(), 1, 1);
      CHECK(x.h.feed(x.pkt(0, 1, last)).verdict == Verdict::emit);
      const auto served = x.h.take_sent();
      REQUIRE(served.size() == 1);
      CHECK(icrc_ok(served[0]));
      CHECK(imm_of(served[0]) == expected_seal(1, reference(x.msgs[1])));
      const auto info = x.h.e->ring_info(1);
      REQUIRE(info);
      CHECK(info->counters.messages_sealed == 2);
      CHECK(info->counters.drops[static_cast<size_t>(Reason::message_incomplete)] == 4);
    }
}
