// Microbenchmark of the aggregation engine's per-packet cost: classify,
// CLT lookup, ICRC verification, hold, reduce at completion, write the result
// into every packet and fix its ICRC, for P ranks. Messages are 8 packets
// (FIRST, 6 MIDDLE, LAST WITH IMM); all frames are built before timing and
// restored between rounds, and fed as the data plane does: classify a burst
// of 32, one process_burst call. Reported per packet (items_per_second
// inverted in the "ns/pkt" counter). Reference points in the same process:
// the engine's forwarding path (an ACK: parse + classify), one CRC-32 of the
// payload (BM_Crc32), and the floor (BM_Floor: the bytes a packet must
// touch, hot). After the table, a summary gives the engine's ns/packet over
// the floor and over the CRC for P=4 fp32, and the result digest's share of
// it (BM_Digest).
//
//   engine-bench --benchmark_filter=... (Google Benchmark flags)
//   engine-bench --benchmark_filter='BM_Floor|BM_Crc32|BM_Aggregate/P:4/payload:(1024|4096)/bf16:0'
//       --benchmark_repetitions=5   (the summary takes the least of the repetitions)
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "engine/engine.h"
#include "engine/icrc_fixup.h"
#include "reduce/reduce.h"
#include "tests/support/ring_traffic.h"
#include "wire/b2b.h"
#include "wire/b2b_mac.h"
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

  // Appends packet k of message m of rank r of ring `ring` (addressed by
  // `a`, PSNs from r * 1000) carrying `data`.
  void add(uint32_t ring, const testing::RingAddressing& a, unsigned r, wire::Dtype dt, uint32_t m,
           uint32_t k, const std::vector<uint8_t>& data, uint16_t pmtu) {
    const wire::InaMessage msg =
        a.message(r, ring, m, dt, wire::ReduceOp::sum, wire::psn_add(r * 1000, m * kMsgPackets),
                  data.data(), data.size(), pmtu);
    std::vector<uint8_t> f(pmtu + 128);
    f.resize(wire::build_message_packet(msg, k, f.data(), f.size()));
    pristine.push_back(std::move(f));
  }
  // The working copies and the feed order, once every packet is added.
  void seal() {
    live = pristine;
    for (auto& f : live) order.push_back({f.data(), static_cast<uint16_t>(f.size()), &f});
  }
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
        fr.add(1, testing::RingAddressing{ranks}, r, dt, m, k, data, pmtu);
      }
  fr.seal();
  return fr;
}

// What the data plane does with an RX burst: classify every frame once, then
// one process_burst call (again while the sink needs draining). Returns the
// packets released.
constexpr unsigned kBurst = 32;
uint64_t run_bursts(engine::Engine& e, const std::vector<engine::Pkt>& pkts, engine::Frame* frames,
                    engine::Outcome* outcomes, engine::Sink& sink) {
  uint64_t released = 0;
  for (size_t at = 0; at < pkts.size(); at += kBurst) {
    const auto n = static_cast<unsigned>(std::min<size_t>(kBurst, pkts.size() - at));
    for (unsigned i = 0; i < n; ++i) engine::Engine::classify(pkts[at + i], frames[i]);
    for (unsigned done = 0; done < n;) {
      done += e.process_burst(frames + done, n - done, 0, outcomes + done, sink);
      released += sink.ntx;
      sink.clear();
    }
  }
  return released;
}

engine::RingSpec spec(unsigned ranks, uint16_t pmtu) {
  return testing::RingAddressing{ranks}.spec(1, kMsgPackets, kMessages / 2, pmtu);
}

// The engine's prefetch switches (EngineConfig) by number: 0 none, 1 tables
// only, 2 tables and frames (the default), 3 frames only.
void set_prefetch(engine::EngineConfig& cfg, int64_t v) {
  cfg.prefetch_tables = v == 1 || v == 2;
  cfg.prefetch_frames = v == 2 || v == 3;
}
const char* prefetch_name(int64_t v) {
  return v == 0 ? "no prefetch" : v == 1 ? "tables" : v == 2 ? "tables+frames" : "frames";
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
  // NETREDUCE_PREFETCH=0..3: the prefetch switches as in BM_ColdTables (A/B only).
  if (const char* pf = std::getenv("NETREDUCE_PREFETCH")) set_prefetch(cfg, std::atoi(pf));
  Frames fr = make_frames(ranks, pmtu, dt);
  engine::Sink sink;
  engine::Frame frames[kBurst];
  engine::Outcome outcomes[kBurst];
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
    released += run_bursts(e, fr.order, frames, outcomes, sink);
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

// Cold tables: G rings of 16 ranks (disjoint members), 2 messages of 8
// packets each, 1 KB fp32, fed with the ring innermost (message, packet,
// rank, ring), so consecutive packets of a burst belong to different rings
// and each finds its CLT slot, history row, cell, held records and result
// line where the previous visit to that ring left them, G - 1 packets ago:
// with 64 rings (about 16 MB of frames and 1 MB of results between two
// visits) they are cold, as on a box serving many jobs. Run with the
// engine's prefetches off (0), tables only (1), tables and frames (2, the
// box's setting) and frames only (3) to decide whether the prefetching pays.
constexpr unsigned kColdRanks = 16;
constexpr uint16_t kColdPmtu = 1024;
constexpr uint32_t kColdMessages = 2;

// Ring g at 10.0.g.1: disjoint members (and connections) per ring.
testing::RingAddressing cold_addr(unsigned g) {
  return testing::RingAddressing::at(kColdRanks, g << 8);
}
engine::RingSpec cold_spec(unsigned g) {
  return cold_addr(g).spec(1 + g, kMsgPackets, 1 /* 2 message slots */, kColdPmtu);
}

Frames make_cold_frames(unsigned rings) {
  Frames fr;
  std::mt19937 rng(3);
  const size_t bytes = wire::message_capacity(kMsgPackets, kColdPmtu);
  std::vector<uint8_t> data(bytes);
  for (uint32_t m = 0; m < kColdMessages; ++m)
    for (uint32_t k = 0; k < kMsgPackets; ++k)
      for (unsigned r = 0; r < kColdRanks; ++r)
        for (unsigned g = 0; g < rings; ++g) {
          for (size_t i = 0; i + 4 <= bytes; i += 4) {
            const float v = static_cast<float>(rng() % 1000) / 8.0f;
            std::memcpy(&data[i], &v, 4);
          }
          fr.add(1 + g, cold_addr(g), r, wire::Dtype::fp32, m, k, data, kColdPmtu);
        }
  fr.seal();
  return fr;
}

void BM_ColdTables(benchmark::State& state) {
  const auto rings = static_cast<unsigned>(state.range(0));
  const auto prefetch = state.range(1);
  engine::EngineConfig cfg;
  cfg.retire_grace = 0;
  cfg.max_rings = std::max(64u, rings);
  set_prefetch(cfg, prefetch);
  Frames fr = make_cold_frames(rings);
  engine::Sink sink;
  engine::Frame frames[kBurst];
  engine::Outcome outcomes[kBurst];
  uint64_t packets = 0, released = 0;
  engine::Engine e(cfg);
  std::vector<engine::Pkt> leftover;
  for (auto _ : state) {
    state.PauseTiming();
    for (unsigned g = 0; g < rings; ++g) {
      (void)e.remove_ring(1 + g, 0, leftover);
      e.expire_retired(0);
      if (!e.install_ring(cold_spec(g)).ok()) state.SkipWithError("install");
    }
    // Restored in feed order: the first frames fed are the coldest.
    for (size_t i = 0; i < fr.live.size(); ++i)
      std::memcpy(fr.live[i].data(), fr.pristine[i].data(), fr.live[i].size());
    state.ResumeTiming();
    released += run_bursts(e, fr.order, frames, outcomes, sink);
    packets += fr.order.size();
  }
  if (released != packets) state.SkipWithError("not every packet was released");
  state.SetItemsProcessed(static_cast<int64_t>(packets));
  state.counters["ns/pkt"] = benchmark::Counter(
      static_cast<double>(packets), benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.SetLabel(prefetch_name(prefetch));
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
// lookup budget, not by S (not a scan of all S slots).
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
    const wire::InaMessage msg = testing::RingAddressing{2}.message(
        r, 1, m, wire::Dtype::fp32, wire::ReduceOp::sum, wire::psn_add(0x400000, m * 2),
        data.data(), data.size(), 256);
    std::vector<uint8_t> f(256 + 128);
    f.resize(wire::build_message_packet(msg, k, f.data(), f.size()));
    return f;
  };
  engine::Sink sink;
  // The engine holds rank 0's packet until rank 1's completes its cell, and
  // then reads it: every frame lives until the end of the benchmark.
  std::vector<std::vector<uint8_t>> recorded;
  recorded.reserve(size_t{slots} * 4);
  for (uint32_t m = 0; m < slots; ++m)  // S complete messages recorded for both ranks
    for (uint32_t k = 0; k < 2; ++k)
      for (unsigned r = 0; r < 2; ++r) {
        auto& f = recorded.emplace_back(build(r, m, k));
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

// A box-to-box frame's keyed MAC (wire/b2b.h): verifying one frame of N data
// bytes, as a box does for each partial or result it receives (sealing a
// frame it sends costs the same hash). A leaf with P local ranks seals one
// partial and verifies one result per cell of P packets.
void BM_B2bMac(benchmark::State& state) {
  const auto n = static_cast<size_t>(state.range(0));
  std::vector<uint8_t> data(n, 0x5A);
  wire::B2bKey key{};
  key.fill(0x42);
  wire::B2bMac mac(key);
  wire::B2bFrameSpec s;
  s.src_ip = 0x0A090001;
  s.dst_ip = 0x0A090009;
  s.info.msg_len = 4;
  s.info.dtype = static_cast<uint8_t>(wire::Dtype::fp32);
  s.info.op = static_cast<uint8_t>(wire::ReduceOp::sum);
  s.data = data.data();
  s.data_len = n;
  s.mac = &mac;
  std::vector<uint8_t> frame(wire::b2b_frame_size(n));
  wire::B2bFrame b;
  if (wire::build_b2b(s, frame.data(), frame.size()) != frame.size() ||
      wire::parse_b2b(frame.data(), frame.size(), b) != wire::B2bStatus::ok)
    state.SkipWithError("frame");
  for (auto _ : state)
    if (!mac.verify(frame.data() + b.hdr, b.data_len)) state.SkipWithError("mac");
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * state.range(0));
}

// Reference point for the host's side of the digest: copying N bytes out of
// the receive region. The host copies each result into a private buffer,
// CRCs that (BM_Crc32/N), then copies it to the caller: check = one CRC and
// one more copy, both hot.
void BM_Memcpy(benchmark::State& state) {
  std::vector<uint8_t> from(static_cast<size_t>(state.range(0)), 0x5A), to(from.size());
  for (auto _ : state) {
    std::memcpy(to.data(), from.data(), from.size());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * state.range(0));
}

// The floor: the bytes a packet must touch, hot, back to back, for one cell
// of P middle packets (full payload): verify each frame's ICRC, reduce the P
// payloads once, copy the result into each packet, CRC the result once.
// Per packet that is one frame CRC + 1/P of the reduction + one result copy
// + 1/P of the result CRC: what no implementation of the box can skip.
void BM_Floor(benchmark::State& state) {
  const unsigned ranks = static_cast<unsigned>(state.range(0));
  const uint16_t pmtu = static_cast<uint16_t>(state.range(1));
  Frames fr = make_frames(ranks, pmtu, wire::Dtype::fp32);
  std::vector<uint8_t*> frame(ranks);
  std::vector<wire::ParsedFrame> parsed(ranks);
  std::vector<const uint8_t*> srcs(ranks);
  for (unsigned r = 0; r < ranks; ++r) {
    auto& f = fr.live[size_t{1} * ranks + r];  // message 0, packet 1: a MIDDLE packet
    frame[r] = f.data();
    if (wire::parse_frame(f.data(), f.size(), parsed[r]) != wire::ParseStatus::ok ||
        parsed[r].payload_len != pmtu)
      state.SkipWithError("frame");
    srcs[r] = f.data() + parsed[r].payload;
  }
  const auto& kern = reduce::kernels(reduce::best_isa(), wire::Dtype::fp32, wire::ReduceOp::sum);
  std::vector<uint8_t> result(pmtu);
  for (auto _ : state) {
    for (unsigned r = 0; r < ranks; ++r)
      benchmark::DoNotOptimize(wire::icrc_verify(frame[r], parsed[r]));
    kern.reduce(srcs.data(), ranks, result.data(), pmtu / 4);
    for (unsigned r = 0; r < ranks; ++r)
      std::memcpy(frame[r] + parsed[r].payload, result.data(), pmtu);
    benchmark::DoNotOptimize(wire::crc32(0, result.data(), pmtu));
    benchmark::ClobberMemory();
  }
  const auto packets = static_cast<double>(state.iterations()) * ranks;
  state.SetItemsProcessed(static_cast<int64_t>(packets));
  state.counters["ns/pkt"] =
      benchmark::Counter(packets, benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

// The result digest's own work per packet (docs/design.md#result-digests),
// from the primitives the engine uses, for one message of kMsgPackets cells
// of P packets: each cell's result CRC (full fix-up only: linear computes it
// anyway), the chain of combines that makes the message's CRC, and the
// seal of the P last packets (their ImmDt, and for linear their head CRC
// again). BM_Aggregate includes the same work; the summary states it as a
// share of BM_Aggregate's time.
void BM_Digest(benchmark::State& state) {
  const unsigned ranks = static_cast<unsigned>(state.range(0));
  const uint16_t pmtu = static_cast<uint16_t>(state.range(1));
  const bool linear = state.range(2) != 0;
  Frames fr = make_frames(ranks, pmtu, wire::Dtype::fp32);
  std::vector<wire::ParsedFrame> last(ranks);
  std::vector<uint8_t*> frame(ranks);
  for (unsigned r = 0; r < ranks; ++r) {
    auto& f = fr.live[size_t{kMsgPackets - 1} * ranks + r];  // message 0's LAST WITH IMMEDIATE
    frame[r] = f.data();
    if (wire::parse_frame(f.data(), f.size(), last[r]) != wire::ParseStatus::ok || !last[r].immdt)
      state.SkipWithError("frame");
  }
  std::vector<uint8_t> results(size_t{kMsgPackets} * pmtu, 0x5A);
  std::vector<uint32_t> cell_crc(kMsgPackets);
  for (unsigned k = 0; k < kMsgPackets; ++k)
    cell_crc[k] = wire::crc32(0, results.data() + size_t{k} * pmtu, pmtu);
  engine::detail::ShiftCache shifts;
  shifts.entries.resize(engine::detail::ShiftCache::kEntries);
  const auto data_off = static_cast<uint16_t>(last[0].payload);
  for (auto _ : state) {
    if (!linear)
      for (unsigned k = 0; k < kMsgPackets; ++k)
        benchmark::DoNotOptimize(cell_crc[k] =
                                     wire::crc32(0, results.data() + size_t{k} * pmtu, pmtu));
    uint32_t d = cell_crc[0];
    for (unsigned k = 1; k < kMsgPackets; ++k) d = shifts.get(pmtu).combine(d, cell_crc[k]);
    for (unsigned r = 0; r < ranks; ++r) {
      reinterpret_cast<wire::ImmDt*>(frame[r] + last[r].immdt)->imm.set(d);
      if (linear) benchmark::DoNotOptimize(wire::icrc_head(frame[r], last[r], data_off));
    }
    benchmark::ClobberMemory();
  }
  const auto packets = static_cast<double>(state.iterations()) * kMsgPackets * ranks;
  state.SetItemsProcessed(static_cast<int64_t>(packets));
  state.counters["ns/pkt"] =
      benchmark::Counter(packets, benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

// Prints, after the usual table, the figures the project's targets are stated
// in: the engine's ns/packet over the floor and over one CRC-32 of the
// payload, for P=4 fp32 (all from this run; with --benchmark_repetitions,
// the least of each).
class FloorReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& r : runs) {
      if (r.run_type != Run::RT_Iteration || r.error_occurred) continue;
      const std::string name = r.run_name.str();
      const auto it = r.counters.find("ns/pkt");
      const double ns = it != r.counters.end()
                            ? it->second.value * 1e9
                            : r.GetAdjustedCPUTime();  // ns (BM_Crc32, BM_B2bMac)
      // The least over --benchmark_repetitions: on a shared machine the
      // interference only ever adds time.
      const auto [at, fresh] = ns_.try_emplace(name, ns);
      if (!fresh) at->second = std::min(at->second, ns);
    }
    ConsoleReporter::ReportRuns(runs);
  }
  void Finalize() override {
    ConsoleReporter::Finalize();
    auto get = [&](const std::string& n) {
      const auto it = ns_.find(n);
      return it == ns_.end() ? 0.0 : it->second;
    };
    std::printf("\nP=4 fp32, ns/packet (engine: classify + process_burst of %u)\n", kBurst);
    std::printf("%-8s %10s %10s %12s %12s %12s %12s\n", "payload", "crc32", "floor", "full",
                "full/floor", "linear", "lin/floor");
    for (const int pl : {1024, 4096}) {
      const std::string args = "/P:4/payload:" + std::to_string(pl);
      const double crc = get("BM_Crc32/" + std::to_string(pl));
      const double floor = get("BM_Floor" + args);
      const double full = get("BM_Aggregate" + args + "/bf16:0/linear:0");
      const double lin = get("BM_Aggregate" + args + "/bf16:0/linear:1");
      if (!crc || !floor || !(full || lin)) continue;
      std::printf("%-8d %10.1f %10.1f %12.1f %11.2fx %12.1f %11.2fx\n", pl, crc, floor, full,
                  full / floor, lin, lin / floor);
      std::printf("%-8s %10s %10.2fx %12.2fx %12s %12.2fx   (in units of crc32)\n", "", "",
                  floor / crc, full / crc, "", lin / crc);
    }
    std::printf("\nP=4 fp32, the result digest's share of the engine's ns/packet\n");
    std::printf("%-8s %12s %12s %8s %12s %12s %8s\n", "payload", "digest full", "engine full",
                "share", "digest lin", "engine lin", "share");
    for (const int pl : {1024, 4096}) {
      const std::string args = "/P:4/payload:" + std::to_string(pl);
      const double df = get("BM_Digest" + args + "/linear:0");
      const double dl = get("BM_Digest" + args + "/linear:1");
      const double full = get("BM_Aggregate" + args + "/bf16:0/linear:0");
      const double lin = get("BM_Aggregate" + args + "/bf16:0/linear:1");
      if (!full || !lin || !df || !dl) continue;
      std::printf("%-8d %12.1f %12.1f %7.1f%% %12.1f %12.1f %7.1f%%\n", pl, df, full,
                  100 * df / full, dl, lin, 100 * dl / lin);
    }
    std::printf(
        "\nBox-to-box MAC (AES(Poly1305)) per frame; a leaf with P=4 local ranks seals\n"
        "one partial and verifies one result per cell of 4 packets\n");
    std::printf("%-8s %10s %10s %10s %14s %12s\n", "payload", "mac ns", "crc32 ns", "mac/crc",
                "mac ns/pkt", "share full");
    for (const int pl : {1024, 4096}) {
      const double mac = get("BM_B2bMac/" + std::to_string(pl));
      const double crc = get("BM_Crc32/" + std::to_string(pl));
      const double full =
          get("BM_Aggregate/P:4/payload:" + std::to_string(pl) + "/bf16:0/linear:0");
      if (!mac || !crc || !full) continue;
      std::printf("%-8d %10.1f %10.1f %9.2fx %14.1f %11.1f%%\n", pl, mac, crc, mac / crc,
                  2 * mac / 4, 100 * (2 * mac / 4) / full);
    }
    std::printf("\nThe host's check of a result (crc32 before the copy-out), hot buffers\n");
    std::printf("%-8s %10s %10s %10s %14s\n", "bytes", "crc32 ns", "memcpy ns", "crc/copy",
                "crc ns/byte");
    for (const int n : {4096, 65536}) {
      const double crc = get("BM_Crc32/" + std::to_string(n));
      const double cp = get("BM_Memcpy/" + std::to_string(n));
      if (!crc || !cp) continue;
      std::printf("%-8d %10.1f %10.1f %9.2fx %14.4f\n", n, crc, cp, crc / cp, crc / n);
    }
  }

 private:
  std::map<std::string, double> ns_;
};

}  // namespace

BENCHMARK(BM_Floor)->ArgNames({"P", "payload"})->ArgsProduct({{4}, {1024, 4096}});
BENCHMARK(BM_Crc32)->Arg(1024)->Arg(4096)->Arg(65536);
BENCHMARK(BM_B2bMac)->Arg(1024)->Arg(4096);
BENCHMARK(BM_Memcpy)->Arg(4096)->Arg(65536);
BENCHMARK(BM_Digest)
    ->ArgNames({"P", "payload", "linear"})
    ->ArgsProduct({{4}, {1024, 4096}, {0, 1}});
BENCHMARK(BM_ForwardBaseline);
BENCHMARK(BM_BogusPsn)->ArgName("window")->Arg(8)->Arg(1024);  // S = 16 and S = 2048
BENCHMARK(BM_ColdTables)
    ->ArgNames({"rings", "prefetch"})
    ->ArgsProduct({{4, 64}, {0, 1, 2, 3}})
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Aggregate)
    ->ArgNames({"P", "payload", "bf16", "linear"})
    ->ArgsProduct({{2, 4, 8, 16}, {1024, 4096}, {0, 1}, {0, 1}})
    ->Unit(benchmark::kMicrosecond);

int main(int argc, char** argv) {
  // The summary goes with the console table; --benchmark_format=json/csv
  // gets Google Benchmark's own reporter, untouched.
  bool console = true;
  for (int i = 1; i < argc; ++i)
    if (std::string_view(argv[i]).starts_with("--benchmark_format=") &&
        std::string_view(argv[i]) != "--benchmark_format=console")
      console = false;
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  FloorReporter reporter;
  if (console)
    benchmark::RunSpecifiedBenchmarks(&reporter);
  else
    benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
