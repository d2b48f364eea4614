// The loopback benchmark's traffic model: P synthetic workers of one ring,
// each writing INA messages to its successor over an RC connection, and the
// check that every frame the box releases is exactly right. No DPDK here, so
// the model is unit-tested against the engine in the sanitizer build.
//
// Theory of operation
// -------------------
// Worker r is 10.77.<ring>.<r+1>; its connection goes to worker r+1 mod P
// (UDP source port 0xC000 + r, destination QP 0x100 + successor, first PSN
// near the 2^24 wrap). Message n (INA msg_id n0 + n) of every worker carries
// `msg_len` full packets; packet k of it has PSN psn0 + n*msg_len + k.
//
// Data. Element e of worker r's message n is the small integer
// (5r + 3(n mod K) + e) mod 16, stored as the ring's dtype. Any sum of up to
// 16 such values is at most 240, which fp32 and bf16 (and every other dtype)
// hold exactly, so the expected reduction is computed with integer adds,
// independently of the code under test, and does not depend on the order in
// which anything adds it. K templates are precomputed per worker.
//
// Order. A round sends messages in order, each message's packet k of every
// worker before packet k+1. On an in-order lossless path the box completes
// message n before message n+1 begins, so the generator needs neither RC
// reliability nor the host window rule. It implements neither: a lost or
// reordered frame shows up as missing or wrong, never as good.
//
// Checking. The box must release, for every packet it received, one frame
// that is byte-identical to the frame built from the same headers with the
// expected payload (the sum in aggregate mode, the worker's own data when
// forwarding) and a freshly computed ICRC. Anything else is `bad`; frames
// that match no sent packet are `unknown`, repeats are `duplicate`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "tests/support/ring_traffic.h"
#include "wire/ina.h"
#include "wire/message.h"

namespace netreduce::bench {

struct TrafficSpec {
  uint32_t ring_id = 1;
  unsigned ranks = 4;
  uint16_t pmtu = 1024;  // RoCE payload bytes per packet
  uint16_t msg_len = 4;  // packets per message
  wire::Dtype dtype = wire::Dtype::fp32;
  uint16_t window = 16;
  uint32_t msg_id0 = 1;
  // Members come from this id's low byte (0: from ring_id's): the stripes of
  // one job share their members and differ in QPs (qpn0).
  uint32_t members_of = 0;
  uint32_t qpn0 = testing::RingAddressing::kQpn0;  // rank r receives on qpn0 + r
};

// Names the first bad field of a spec, or "" if it is usable.
std::string check(const TrafficSpec& s);

class Traffic {
 public:
  static constexpr unsigned kTemplates = 8;
  static constexpr unsigned kMaxRanks = 16;

  explicit Traffic(const TrafficSpec& spec);

  const TrafficSpec& spec() const { return spec_; }
  testing::RingAddressing addressing() const;  // the shared fixture (tests/support)
  uint32_t member(unsigned rank) const;        // IPv4, host order
  std::vector<uint32_t> members() const;
  size_t data_bytes() const { return data_bytes_; }  // tensor bytes per message
  size_t max_frame() const { return max_frame_; }
  uint32_t packets_per_message() const { return spec_.msg_len; }

  // Builds worker `rank`'s packet k of message n into out[0, cap); returns
  // the frame length (0 if it does not fit).
  size_t build(unsigned rank, uint64_t n, uint32_t k, uint8_t* out, size_t cap) const;

  // Where a released frame belongs: its connection's rank, message and packet.
  struct Id {
    unsigned rank = 0;
    uint64_t n = 0;  // message index relative to `base`
    uint32_t k = 0;
  };
  enum class Verdict { good, bad, unknown };
  // Checks one released frame against what the box must emit for it, given
  // that it belongs to a message in [base, base + count). `scratch` holds at
  // least max_frame() bytes.
  Verdict check_frame(const uint8_t* frame, size_t len, bool aggregated, uint64_t base,
                      uint64_t count, Id& id, uint8_t* scratch) const;

 private:
  size_t build_with(unsigned rank, uint64_t n, uint32_t k, const uint8_t* data, uint32_t imm,
                    uint8_t* out, size_t cap) const;
  const uint8_t* data_of(unsigned rank, uint64_t n) const;
  const uint8_t* sum_of(uint64_t n) const;
  uint32_t psn0(unsigned rank) const;

  TrafficSpec spec_;
  size_t data_bytes_ = 0;
  size_t max_frame_ = 0;
  std::vector<uint8_t> data_;          // [rank][template][data_bytes]
  std::vector<uint8_t> sum_;           // [template][data_bytes]
  uint32_t sum_crc_[kTemplates] = {};  // crc32 of each sum: the seals of reduced messages
};

}  // namespace netreduce::bench
