// Microbenchmark of the aggregation engine's per-packet cost: parse, CLT
// lookup, ICRC verification, hold, reduce at completion, write the result
// into every packet and fix its ICRC, for P ranks. Messages are 8 packets
// (FIRST, 6 MIDDLE, LAST WITH IMM); all frames are built before timing and
// restored between rounds. Reported per packet (items_per_second inverted
// in the "ns/pkt" counter). The baseline in the same process is the
// engine's forwarding path (an ACK: parse + classify).
//
//   engine-bench --benchmark_filter=... (Google Benchmark flags)
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "engine/engine.h"
#include "wire/icrc.h"
#include "wire/message.h"
#include "wire/parse.h"
#include "wire/psn.h"

using namespace netreduce;

namespace {

constexpr uint16_t kMsgPackets = 8;
constexpr uint32_t kMessages = 16;  // window 8: 16 slots; a round of 128*P frames stays in L2

struct Frames {
  std::vector<std::vector<uint8_t>> pristine, live;  // [m][k][r] flattened
  std::vector<engine::Pkt> order;                    // feed order
};

Frames make_frames(unsigned ranks, uint16_t pmtu, wire::Dtype dt) {
  Frames fr;
  std::mt19937 rng(1);
  const size_t bytes = wire::message_capacity(kMsgPackets, pmtu);
  for (uint32_t m = 0; m < kMessages; ++m)
    for (uint32_t k = 0; k < kMsgPackets; ++k)
      for (unsigned r = 0; r < ranks; ++r) {
        std::vector<uint8_t> data(bytes);
        for (size_t i = 0; i + 4 <= bytes; i += 4) {
          const float v = static_cast<float>(rng() % 1000) / 8.0f;
          if (dt == wire::Dtype::fp32)
            std::memcpy(&data[i], &v, 4);
          else {  // bf16 pairs: the top halves of two floats
            uint32_t u;
            std::memcpy(&u, &v, 4);
            const uint16_t h = static_cast<uint16_t>(u >> 16);
            std::memcpy(&data[i], &h, 2);
            std::memcpy(&data[i + 2], &h, 2);
          }
        }
        wire::InaMessage msg;
        msg.base.src_ip = 0x0A000001u + r;
        msg.base.dst_ip = 0x0A000001u + (r + 1) % ranks;
        msg.base.dest_qp = 0x100 + r;
        msg.ina.dtype = static_cast<uint8_t>(dt);
        msg.ina.op = static_cast<uint8_t>(wire::ReduceOp::sum);
        msg.ina.ring_id = 1;
        msg.ina.rank = static_cast<uint16_t>(r);
        msg.ina.msg_id = m;
        msg.psn0 = wire::psn_add(r * 1000, m * kMsgPackets);
        msg.data = data.data();
        msg.data_bytes = bytes;
        msg.pmtu = pmtu;
        std::vector<uint8_t> f(pmtu + 128);
        f.resize(wire::build_message_packet(msg, k, f.data(), f.size()));
        fr.pristine.push_back(f);
      }
  fr.live = fr.pristine;
  for (auto& f : fr.live) fr.order.push_back({f.data(), static_cast<uint16_t>(f.size()), &f});
  return fr;
}

engine::RingSpec spec(unsigned ranks, uint16_t pmtu) {
  engine::RingSpec s;
  s.ring_id = 1;
  for (unsigned r = 0; r < ranks; ++r) s.members.push_back(0x0A000001u + r);
  s.msg_len = kMsgPackets;
  s.window = kMessages / 2;
  s.payload_bytes = pmtu;
  return s;
}

void BM_Aggregate(benchmark::State& state) {
  const unsigned ranks = static_cast<unsigned>(state.range(0));
  const uint16_t pmtu = static_cast<uint16_t>(state.range(1));
  const auto dt = state.range(2) ? wire::Dtype::bf16 : wire::Dtype::fp32;
  const auto fix = state.range(3) ? engine::IcrcFixup::linear : engine::IcrcFixup::full;
  engine::EngineConfig cfg;
  cfg.icrc_fixup = fix;
  // Every iteration removes and re-installs the ring and replays the same
  // connections: with no grace their tombstones go at once (expire_retired
  // below), or the replayed connections would stay retired and be dropped.
  cfg.retire_grace = 0;
  if (const char* isa = std::getenv("NETREDUCE_ISA"))
    cfg.isa = static_cast<reduce::Isa>(std::atoi(isa));
  Frames fr = make_frames(ranks, pmtu, dt);
  engine::Sink sink;
  uint64_t packets = 0, released = 0;
  engine::Engine e(cfg);
  std::vector<engine::Pkt> leftover;
  for (auto _ : state) {
    // Untimed: a fresh ring (its message ids start over) and fresh frames.
    state.PauseTiming();
    (void)e.remove_ring(1, 0, leftover);
    e.expire_retired(0);
    if (!e.install_ring(spec(ranks, pmtu)).ok()) state.SkipWithError("install");
    for (size_t i = 0; i < fr.live.size(); ++i)
      std::memcpy(fr.live[i].data(), fr.pristine[i].data(), fr.live[i].size());
    state.ResumeTiming();
    for (const engine::Pkt& p : fr.order) {
      sink.clear();
      e.process(p, 0, sink);
      released += sink.ntx;
    }
    packets += fr.order.size();
  }
  if (released != packets) state.SkipWithError("not every packet was released");
  state.SetItemsProcessed(static_cast<int64_t>(packets));
  state.SetBytesProcessed(static_cast<int64_t>(packets) * pmtu);
  state.counters["ns/pkt"] = benchmark::Counter(
      static_cast<double>(packets), benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.SetLabel(std::string(wire::to_string(dt)) +
                 (fix == engine::IcrcFixup::linear ? " linear" : " full"));
}

void BM_ForwardBaseline(benchmark::State& state) {
  engine::Engine e({});
  wire::RoceFrameSpec s;
  s.src_ip = 0x0A000002;
  s.dst_ip = 0x0A000001;
  s.opcode = 0x11;
  std::vector<uint8_t> f(wire::frame_size(s));
  wire::build_frame(s, f.data(), f.size());
  engine::Sink sink;
  for (auto _ : state) {
    sink.clear();
    benchmark::DoNotOptimize(
        e.process({f.data(), static_cast<uint16_t>(f.size()), nullptr}, 0, sink));
  }
  state.SetItemsProcessed(state.iterations());
  state.counters["ns/pkt"] =
      benchmark::Counter(static_cast<double>(state.iterations()),
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

// A flood of later packets whose PSN no recorded message contains, on a
// bound connection whose history is full (S messages): the cost the box pays
// per bogus packet before dropping it as first_packet_lost. Bounded by the
// lookup budget, not by S (it used to scan all S slots).
void BM_BogusPsn(benchmark::State& state) {
  const auto window = static_cast<uint16_t>(state.range(0));
  const uint32_t slots = engine::slots_for_window(window);
  engine::Engine e({});
  engine::RingSpec s = spec(2, 256);
  s.msg_len = 2;
  s.window = window;
  if (!e.install_ring(s).ok()) state.SkipWithError("install");
  std::vector<uint8_t> data(2 * 256 - 24, 0);
  auto build = [&](unsigned r, uint32_t m, uint32_t k) {
    wire::InaMessage msg;
    msg.base.src_ip = 0x0A000001u + r;
    msg.base.dst_ip = 0x0A000001u + (r + 1) % 2;
    msg.base.dest_qp = 0x100 + r;
    msg.ina.dtype = static_cast<uint8_t>(wire::Dtype::fp32);
    msg.ina.op = static_cast<uint8_t>(wire::ReduceOp::sum);
    msg.ina.ring_id = 1;
    msg.ina.rank = static_cast<uint16_t>(r);
    msg.ina.msg_id = m;
    msg.psn0 = wire::psn_add(0x400000, m * 2);
    msg.data = data.data();
    msg.data_bytes = data.size();
    msg.pmtu = 256;
    std::vector<uint8_t> f(256 + 128);
    f.resize(wire::build_message_packet(msg, k, f.data(), f.size()));
    return f;
  };
  engine::Sink sink;
  for (uint32_t m = 0; m < slots; ++m)  // S complete messages recorded for both ranks
    for (uint32_t k = 0; k < 2; ++k)
      for (unsigned r = 0; r < 2; ++r) {
        auto f = build(r, m, k);
        sink.clear();
        e.process({f.data(), static_cast<uint16_t>(f.size()), nullptr}, 0, sink);
      }
  // Bogus PSNs before every recorded message (the old scan's worst case).
  std::mt19937 rng(5);
  std::vector<std::vector<uint8_t>> bogus;
  for (int i = 0; i < 1024; ++i) {
    auto f = build(0, slots - 1, 1);
    wire::ParsedFrame p;
    wire::parse_frame(f.data(), f.size(), p);
    reinterpret_cast<wire::Bth*>(f.data() + p.bth)->psn.set(0x400000 - 1 - rng() % 0x100000);
    bogus.push_back(std::move(f));
  }
  const auto lost = static_cast<size_t>(engine::Reason::first_packet_lost);
  const uint64_t lost0 = e.counters()[lost];
  size_t i = 0;
  for (auto _ : state) {
    auto& f = bogus[i++ & 1023];
    sink.clear();
    benchmark::DoNotOptimize(
        e.process({f.data(), static_cast<uint16_t>(f.size()), nullptr}, 0, sink));
  }
  if (e.counters()[lost] - lost0 != static_cast<uint64_t>(state.iterations()))
    state.SkipWithError("a bogus packet was not dropped as first_packet_lost");
  state.SetItemsProcessed(state.iterations());
  state.counters["ns/pkt"] =
      benchmark::Counter(static_cast<double>(state.iterations()),
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.SetLabel("S=" + std::to_string(slots));
}

// Reference point: one CRC-32 over a hot buffer of the payload size (the cost
// of one ICRC verification or full recompute).
void BM_Crc32(benchmark::State& state) {
  std::vector<uint8_t> buf(static_cast<size_t>(state.range(0)), 0x5A);
  uint32_t crc = 0;
  for (auto _ : state) benchmark::DoNotOptimize(crc = wire::crc32(crc, buf.data(), buf.size()));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * state.range(0));
}

}  // namespace

BENCHMARK(BM_Crc32)->Arg(1024)->Arg(4096);
BENCHMARK(BM_ForwardBaseline);
BENCHMARK(BM_BogusPsn)->ArgName("window")->Arg(8)->Arg(1024);  // S = 16 and S = 2048
BENCHMARK(BM_Aggregate)
    ->ArgNames({"P", "payload", "bf16", "linear"})
    ->ArgsProduct({{2, 4, 8, 16}, {1024, 4096}, {0, 1}, {0, 1}})
    ->Unit(benchmark::kMicrosecond);

BENCHMARK_MAIN();
