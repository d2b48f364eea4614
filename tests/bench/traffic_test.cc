// The loopback benchmark's traffic model, checked against the real engine:
// every frame the engine releases for model traffic must be judged good, and
// a released frame with any byte changed, or an unreduced frame presented as
// a result, must never be.
#include "bench/loopback/traffic.h"

#include <catch2/catch.hpp>
#include <set>
#include <tuple>

#include "engine/box_harness.h"

using namespace netreduce;
using bench::Traffic;
using bench::TrafficSpec;

namespace {

// Feeds `messages` messages of every rank in the generator's order and
// returns what the engine transmitted.
std::vector<std::vector<uint8_t>> run_through_engine(const Traffic& t, uint64_t messages,
                                                     engine::ReduceMode mode) {
  engine::EngineConfig cfg;
  cfg.mode = mode;
  testing::Harness h(cfg);
  engine::RingSpec ring;
  ring.ring_id = t.spec().ring_id;
  ring.members = t.members();
  ring.msg_len = t.spec().msg_len;
  ring.window = t.spec().window;
  ring.payload_bytes = t.spec().pmtu;
  REQUIRE(h.e->install_ring(ring).ok());
  std::vector<uint8_t> buf(t.max_frame());
  for (uint64_t n = 0; n < messages; ++n)
    for (uint32_t k = 0; k < t.packets_per_message(); ++k)
      for (unsigned r = 0; r < t.spec().ranks; ++r) {
        const size_t len = t.build(r, n, k, buf.data(), buf.size());
        REQUIRE(len > 0);
        const auto o = h.feed({buf.begin(), buf.begin() + static_cast<long>(len)});
        REQUIRE((o.verdict == engine::Verdict::held || o.verdict == engine::Verdict::emit ||
                 o.verdict == engine::Verdict::consumed));
      }
  REQUIRE(h.live.empty());
  return h.take_sent();
}

}  // namespace

TEST_CASE("model traffic reduced by the engine is judged good, and only then") {
  const auto dtype = GENERATE(wire::Dtype::fp32, wire::Dtype::bf16, wire::Dtype::fp16,
                              wire::Dtype::int32, wire::Dtype::int64, wire::Dtype::fp64);
  const unsigned ranks = GENERATE(2u, 5u, 16u);
  const uint16_t pmtu = GENERATE(uint16_t{256}, uint16_t{1024});
  TrafficSpec s;
  s.ranks = ranks;
  s.pmtu = pmtu;
  s.msg_len = 3;
  s.dtype = dtype;
  s.window = 4;
  s.msg_id0 = 0xFFFFFFF0u;  // message ids wrap too
  REQUIRE(bench::check(s).empty());
  const Traffic t(s);
  const uint64_t messages = 2 * Traffic::kTemplates + 3;
  const auto mode = GENERATE(engine::ReduceMode::deterministic, engine::ReduceMode::accumulate);
  const auto out = run_through_engine(t, messages, mode);
  REQUIRE(out.size() == messages * s.msg_len * ranks);

  std::vector<uint8_t> scratch(t.max_frame());
  std::set<std::tuple<unsigned, uint64_t, uint32_t>> seen;
  for (const auto& f : out) {
    Traffic::Id id;
    REQUIRE(t.check_frame(f.data(), f.size(), true, 0, messages, id, scratch.data()) ==
            Traffic::Verdict::good);
    REQUIRE(seen.insert({id.rank, id.n, id.k}).second);
    // Judged against the unreduced data, a result is wrong.
    REQUIRE(t.check_frame(f.data(), f.size(), false, 0, messages, id, scratch.data()) ==
            Traffic::Verdict::bad);
    // Outside the window it was sent in, it is unknown.
    REQUIRE(t.check_frame(f.data(), f.size(), true, messages, messages, id, scratch.data()) ==
            Traffic::Verdict::unknown);
  }
  // Any single changed byte from the IP header on makes a frame bad or unknown.
  const auto& f = out[out.size() / 2];
  for (size_t i = 14; i < f.size(); i += 7) {
    auto g = f;
    g[i] ^= 0x10;
    Traffic::Id id;
    CAPTURE(i);
    REQUIRE(t.check_frame(g.data(), g.size(), true, 0, messages, id, scratch.data()) !=
            Traffic::Verdict::good);
  }
}

TEST_CASE("unmodified model frames are good as forwarded traffic") {
  TrafficSpec s;
  s.ranks = 4;
  const Traffic t(s);
  std::vector<uint8_t> f(t.max_frame()), scratch(t.max_frame());
  for (uint64_t n = 0; n < 20; ++n)
    for (unsigned r = 0; r < s.ranks; ++r)
      for (uint32_t k = 0; k < s.msg_len; ++k) {
        const size_t len = t.build(r, n, k, f.data(), f.size());
        Traffic::Id id;
        REQUIRE(t.check_frame(f.data(), len, false, 0, 20, id, scratch.data()) ==
                Traffic::Verdict::good);
        REQUIRE((id.rank == r && id.n == n && id.k == k));
        REQUIRE(t.check_frame(f.data(), len, true, 0, 20, id, scratch.data()) ==
                Traffic::Verdict::bad);
      }
}

TEST_CASE("traffic specs are checked") {
  TrafficSpec s;
  s.ranks = 1;
  REQUIRE(bench::check(s).starts_with("ranks"));
  s.ranks = 17;
  REQUIRE(bench::check(s).starts_with("ranks"));
  s.ranks = 4;
  s.pmtu = 1000;
  REQUIRE(bench::check(s).starts_with("payload"));
  s.pmtu = 4096;
  s.msg_len = 0;
  REQUIRE(bench::check(s).starts_with("msg_len"));
}
