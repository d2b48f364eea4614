// A small harness around one Engine for hand-written packet sequences: owns
// the frame buffers, feeds frames, collects what the engine transmits, and
// checks at the end that every buffer came back exactly once.
#pragma once

#include <zlib.h>

#include <cstring>
#include <list>
#include <memory>
#include <optional>
#include <set>
#include <vector>

#include "engine/engine.h"
#include "support/ring_traffic.h"
#include "wire/b2b.h"
#include "wire/icrc.h"
#include "wire/message.h"
#include "wire/parse.h"

namespace netreduce::testing {

// Addresses and connections: RingAddressing (support/ring_traffic.h).
inline uint32_t rank_ip(unsigned r) { return RingAddressing::kIp0 + r; }

struct Harness {
  explicit Harness(engine::EngineConfig cfg = {}) {
    cfg.allocator = {&Harness::alloc_cb, this};
    e = std::make_unique<engine::Engine>(cfg);
  }

  std::unique_ptr<engine::Engine> e;
  std::list<std::vector<uint8_t>> buffers;  // every frame ever made
  std::set<const void*> live;               // frames owned by the engine
  std::vector<std::vector<uint8_t>> sent;   // copies of everything transmitted, in order
  std::vector<engine::Outcome> outcomes;
  uint64_t now = 0;
  unsigned freed = 0;

  static engine::Pkt alloc_cb(void* ctx, uint16_t len) {
    auto* h = static_cast<Harness*>(ctx);
    auto& b = h->buffers.emplace_back(len);
    h->live.insert(&b);
    return {b.data(), len, &b};
  }

  engine::Outcome feed(const std::vector<uint8_t>& frame) {
    auto& b = buffers.emplace_back(frame);
    engine::Sink sink;
    const engine::Outcome o =
        e->process({b.data(), static_cast<uint16_t>(b.size()), &b}, ++now, sink);
    outcomes.push_back(o);
    if (o.verdict == engine::Verdict::held) live.insert(&b);
    if (o.verdict == engine::Verdict::forward || o.verdict == engine::Verdict::emit)
      sent.push_back(b);
    for (unsigned i = 0; i < sink.ntx; ++i) {
      auto* v = static_cast<std::vector<uint8_t>*>(sink.tx[i].handle);
      REQUIRE(live.erase(v) == 1);  // released exactly once
      sent.emplace_back(v->begin(), v->begin() + sink.tx[i].len);
    }
    for (unsigned i = 0; i < sink.ndrop; ++i) {
      REQUIRE(live.erase(sink.drop[i].handle) == 1);
      ++freed;
    }
    return o;
  }
  std::vector<std::vector<uint8_t>> take_sent() { return std::exchange(sent, {}); }
};

// Builds the packets of INA messages for a ring whose rank r has address
// rank_ip(r) and sends to rank_ip(r+1).
struct RingTraffic {
  uint32_t ring_id = 1;
  unsigned ranks = 3;
  uint16_t pmtu = 256;
  wire::Dtype dtype = wire::Dtype::fp32;
  wire::ReduceOp op = wire::ReduceOp::sum;
  uint32_t psn_base = 1000;
  unsigned ip_offset = 0;                  // rank r uses rank_ip(ip_offset + r)
  uint32_t qpn_offset = 0;                 // a new run of the job: new QPs
  std::vector<std::vector<uint8_t>> data;  // per rank, per message data (same size for all ranks)

  wire::InaMessage message(unsigned rank, uint32_t msg_id, const std::vector<uint8_t>& d,
                           uint32_t psn0) const {
    RingAddressing a = RingAddressing::at(ranks, ip_offset);
    a.qpn0 += qpn_offset;
    wire::InaMessage m =
        a.message(rank, ring_id, msg_id, dtype, op, psn0, d.data(), d.size(), pmtu);
    m.va = 0x1000;
    return m;
  }
  std::vector<uint8_t> packet(unsigned rank, uint32_t msg_id, const std::vector<uint8_t>& d,
                              uint32_t psn0, uint32_t k) const {
    std::vector<uint8_t> f(4096 + 128);
    const wire::InaMessage m = message(rank, msg_id, d, psn0);
    f.resize(wire::build_message_packet(m, k, f.data(), f.size()));
    REQUIRE(!f.empty());
    return f;
  }
};

inline engine::RingSpec ring_spec(uint32_t id, unsigned ranks, uint16_t msg_len = 4,
                                  uint16_t window = 2, uint16_t pmtu = 256,
                                  unsigned ip_offset = 0) {
  return RingAddressing::at(ranks, ip_offset).spec(id, msg_len, window, pmtu);
}

// Data bytes of a released packet (after the INA header for first packets).
inline std::vector<uint8_t> data_of(const std::vector<uint8_t>& f) {
  wire::ParsedFrame p;
  REQUIRE(wire::parse_frame(f.data(), f.size(), p) == wire::ParseStatus::ok);
  const size_t skip = wire::is_write_first(p.opcode) ? sizeof(wire::InaHdr) : 0;
  return {f.begin() + p.payload + static_cast<long>(skip), f.begin() + p.payload + p.payload_len};
}

// The ImmDt a host accepts on a message's last packet (src/engine/digest.h):
// msg_id ^ crc32 of the message's result data, by zlib (not the wire layer
// under test).
inline uint32_t expected_seal(uint32_t msg_id, const std::vector<uint8_t>& message_data) {
  return msg_id ^ static_cast<uint32_t>(
                      ::crc32(0, message_data.data(), static_cast<uInt>(message_data.size())));
}

// A frame's ImmDt, if it has one.
inline std::optional<uint32_t> imm_of(const std::vector<uint8_t>& f) {
  wire::ParsedFrame p;
  REQUIRE(wire::parse_frame(f.data(), f.size(), p) == wire::ParseStatus::ok);
  if (!p.immdt) return std::nullopt;
  return reinterpret_cast<const wire::ImmDt*>(f.data() + p.immdt)->imm.host();
}

// A tree installation's epoch and key for tests (engine::TreeSpec): every
// box of one test tree holds these.
inline constexpr uint32_t kTreeEpoch = 0x5EED0001;
inline wire::B2bKey tree_key(uint8_t seed = 1) {
  wire::B2bKey k{};
  for (size_t i = 0; i < k.size(); ++i) k[i] = static_cast<uint8_t>(seed * 31 + i * 7 + 1);
  return k;
}

inline bool icrc_ok(const std::vector<uint8_t>& f) {
  wire::ParsedFrame p;
  return wire::parse_frame(f.data(), f.size(), p) == wire::ParseStatus::ok &&
         wire::icrc_verify(f.data(), p);
}

}  // namespace netreduce::testing
