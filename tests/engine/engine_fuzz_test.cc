// Randomized robustness test of the engine: arbitrary sequences of valid,
// mutated, re-sealed (ICRC fixed after mutation, so the damage reaches the
// CLT and cell logic) and truncated packets for two rings, with rings
// removed (retired for a grace period) and reinstalled midway. After every call:
//   - a completion releases exactly one packet per rank of its ring (no cell
//     completes with a missing rank), each parsing cleanly with a valid ICRC;
//   - every buffer the engine holds is handed back exactly once;
//   - held bytes stay within the ring's reserved memory.
// At the end, removing the rings returns every held buffer.
//   usage: engine-fuzz-test [ITERATIONS] [SEED]
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <vector>

#include "engine/engine.h"
#include "support/ring_traffic.h"
#include "wire/icrc.h"
#include "wire/message.h"
#include "wire/parse.h"
#include "wire/psn.h"

using namespace netreduce;

namespace {
uint64_t g_seed, g_iter;
[[noreturn]] void fail(const char* what) {
  std::fflush(stdout);
  std::fprintf(
      stderr, "engine fuzz: %s at iteration %" PRIu64 " (replay: engine-fuzz-test N %" PRIu64 ")\n",
      what, g_iter, g_seed);
  std::abort();
}
#define ENSURE(c)       \
  do {                  \
    if (!(c)) fail(#c); \
  } while (0)

struct RingDef {
  uint32_t id;
  unsigned ranks;
  unsigned ip0;
};
const RingDef kRings[] = {{1, 3, 0}, {2, 2, 10}};
testing::RingAddressing addr(const RingDef& d) {
  return testing::RingAddressing::at(d.ranks, d.ip0);
}
uint32_t ip(unsigned i) { return testing::RingAddressing::kIp0 + i; }

engine::RingSpec spec_of(const RingDef& d) { return addr(d).spec(d.id, 3, 1, 256); }

struct Buf {
  std::vector<uint8_t> b;
  uint32_t ring = 0;
};

struct State {
  std::set<Buf*> held;
  int64_t outstanding = 0;
  static engine::Pkt alloc(void* ctx, uint16_t len) {
    auto* st = static_cast<State*>(ctx);
    auto* b = new Buf;
    b->b.resize(len);
    ++st->outstanding;
    return {b->b.data(), len, b};
  }
  Buf* make(const std::vector<uint8_t>& f) {
    ++outstanding;
    return new Buf{f};
  }
  void free(Buf* b) {
    --outstanding;
    delete b;
  }
};

void run(engine::ReduceMode mode, uint64_t iterations, std::mt19937_64& rng) {
  State st;
  engine::EngineConfig cfg;
  cfg.mode = mode;
  cfg.icrc_fixup = rng() & 1 ? engine::IcrcFixup::linear : engine::IcrcFixup::full;
  cfg.allocator = {&State::alloc, &st};
  // Removed rings stay retired for a while, so removal, re-install over a
  // tombstone and expiry all happen under the random traffic.
  cfg.retire_grace = 500;
  engine::Engine e(cfg);
  for (const RingDef& d : kRings)
    if (!e.install_ring(spec_of(d)).ok()) fail("install");

  // Corpus: 6 messages per rank of both rings, all dtypes/ops by turn, plus ACKs.
  // corpus[m] holds every packet of message m of every rank of both rings.
  // Every rank's message m has the same length, as in a job (all ranks reduce
  // the same tensor); length disagreements come from the mutations below. With
  // a length drawn per rank, some seeds made every message unmatchable and the
  // run degenerated into zero completions.
  std::vector<std::vector<std::vector<uint8_t>>> corpus(6);
  for (const RingDef& d : kRings) {
    size_t bytes[6];
    for (size_t& b : bytes) b = 8 * (1 + rng() % 80);
    for (unsigned r = 0; r < d.ranks; ++r) {
      uint32_t psn = 0xFFFFF0 + r;
      for (uint32_t m = 0; m < 6; ++m) {
        std::vector<uint8_t> data(bytes[m]);
        for (auto& x : data) x = static_cast<uint8_t>(rng());
        const wire::InaMessage msg = addr(d).message(
            r, d.id, m, static_cast<wire::Dtype>(1 + m % 6),
            static_cast<wire::ReduceOp>(1 + (m / 2) % 3), psn, data.data(), data.size(), 256);
        const uint32_t n = wire::message_packets(data.size(), 256);
        for (uint32_t k = 0; k < n; ++k) {
          std::vector<uint8_t> f(400);
          f.resize(wire::build_message_packet(msg, k, f.data(), f.size()));
          corpus[m].push_back(std::move(f));
        }
        psn = wire::psn_add(psn, n);
      }
    }
  }

  std::map<uint32_t, std::set<uint32_t>> members;
  for (const RingDef& d : kRings)
    for (unsigned r = 0; r < d.ranks; ++r) members[d.id].insert(ip(d.ip0 + r));

  engine::Sink sink;
  uint64_t completions = 0;
  for (g_iter = 0; g_iter < iterations; ++g_iter) {
    // Control-plane churn: a new job (both rings reinstalled) each time the
    // message cursor wraps, and now and then one ring removed mid-traffic.
    const bool new_job = g_iter % 1800 == 0 && g_iter;
    if (new_job || rng() % 4000 == 0) {
      for (const RingDef& d : kRings) {
        if (!new_job && rng() % 2) continue;
        std::vector<engine::Pkt> rel;
        if (e.remove_ring(d.id, g_iter, rel).ok()) {
          for (const auto& pk : rel) {
            auto* b = static_cast<Buf*>(pk.handle);
            ENSURE(st.held.erase(b) == 1);
            st.free(b);
          }
        }
        if (!e.install_ring(spec_of(d)).ok()) fail("reinstall");
      }
    }
    e.expire_retired(g_iter);
    // Traffic moves through the messages like a job does (a window around a
    // cursor), with stragglers from anywhere.
    const uint64_t cur = (g_iter / 300) % 6;
    const uint64_t m = rng() % 10 == 0 ? rng() % 6 : std::min<uint64_t>(5, cur + rng() % 2);
    std::vector<uint8_t> f = corpus[m][rng() % corpus[m].size()];
    wire::ParsedFrame p;
    switch (rng() % 8) {
      case 0:
      case 1:
      case 2:
        break;  // valid, in random order (loss, duplication, reordering)
      case 3:
      case 4: {  // damage a header or INA field, then re-seal the ICRC
        if (wire::parse_frame(f.data(), f.size(), p) == wire::ParseStatus::ok) {
          const size_t lim = std::min<size_t>(f.size() - 4, p.payload + 24u);
          f[p.l3 + rng() % (lim - p.l3)] ^= static_cast<uint8_t>(1u << (rng() % 8));
          if (wire::parse_frame(f.data(), f.size(), p) == wire::ParseStatus::ok)
            wire::icrc_update(f.data(), p);
        }
        break;
      }
      case 5:  // any bit anywhere, ICRC left stale
        f[rng() % f.size()] ^= static_cast<uint8_t>(1u << (rng() % 8));
        break;
      case 6:  // truncate
        f.resize(rng() % f.size());
        break;
      default: {  // payload bytes changed and re-sealed: a "retransmission" with different data
        if (wire::parse_frame(f.data(), f.size(), p) == wire::ParseStatus::ok &&
            p.payload_len > 24) {
          f[p.payload + 24 + rng() % (p.payload_len - 24)] ^= 0x5A;
          wire::icrc_update(f.data(), p);
        }
      }
    }
    Buf* in = st.make(f);
    sink.clear();
    const engine::Outcome o =
        e.process({in->b.data(), static_cast<uint16_t>(in->b.size()), in}, g_iter, sink);
    bool in_released = false;
    std::set<uint32_t> srcs;
    uint32_t ring_of_release = 0;
    for (unsigned i = 0; i < sink.ntx; ++i) {
      auto* b = static_cast<Buf*>(sink.tx[i].handle);
      if (b == in) {
        in_released = true;
      } else if (mode == engine::ReduceMode::deterministic) {
        ENSURE(st.held.erase(b) == 1);
      }
      ENSURE(wire::parse_frame(b->b.data(), sink.tx[i].len, p) == wire::ParseStatus::ok);
      ENSURE(wire::icrc_verify(b->b.data(), p));
      srcs.insert(reinterpret_cast<const wire::Ipv4Hdr*>(b->b.data() + p.l3)->src.host());
      auto ina = wire::ina_decode(b->b.data() + p.payload, p.payload_len);
      if (wire::is_write_first(p.opcode) && ina) ring_of_release = ina->ring_id;
      if (b != in) st.free(b);
    }
    if (sink.ntx) {
      ++completions;
      ENSURE(o.verdict == engine::Verdict::held && in_released);
      // One packet per rank of one ring, from exactly the ring's members.
      bool match = false;
      for (const auto& [id, m] : members)
        if (srcs == m && sink.ntx == m.size() && (ring_of_release == 0 || ring_of_release == id))
          match = true;
      ENSURE(match);
    }
    for (unsigned i = 0; i < sink.ndrop; ++i) {
      auto* b = static_cast<Buf*>(sink.drop[i].handle);
      ENSURE(st.held.erase(b) == 1);
      st.free(b);
    }
    switch (o.verdict) {
      case engine::Verdict::held:
        if (!in_released)
          ENSURE(st.held.insert(in).second);
        else
          st.free(in);
        break;
      default:
        st.free(in);
    }
    uint64_t held_total = 0;
    for (const RingDef& d : kRings) {
      auto info = e.ring_info(d.id);
      ENSURE(info && info->held_bytes <= info->memory_bytes);
      held_total += info->held_packets;
      // The open-cell count the state machine keeps: in deterministic mode
      // every arrival but a cell's last is held, so a ring has open cells
      // exactly when it holds packets, at least one and at most P - 1 per cell.
      if (mode == engine::ReduceMode::deterministic) {
        ENSURE((info->open_cells == 0) == (info->held_packets == 0));
        ENSURE(info->open_cells <= info->held_packets);
        ENSURE(info->held_packets <= uint64_t{info->open_cells} * (d.ranks - 1));
      }
    }
    ENSURE(held_total == st.held.size());
  }
  for (const RingDef& d : kRings) {
    std::vector<engine::Pkt> rel;
    if (!e.remove_ring(d.id, g_iter, rel).ok()) fail("remove");
    for (const auto& p : rel) {
      auto* b = static_cast<Buf*>(p.handle);
      ENSURE(st.held.erase(b) == 1);
      st.free(b);
    }
  }
  ENSURE(st.held.empty());
  ENSURE(st.outstanding == 0);
  std::printf("  %s mode: %" PRIu64 " packets, %" PRIu64 " completions, reasons:",
              mode == engine::ReduceMode::deterministic ? "deterministic" : "accumulate",
              iterations, completions);
  for (size_t i = 0; i < engine::kReasonCount; ++i)
    if (e.counters()[i])
      std::printf(" %s=%" PRIu64,
                  std::string(engine::to_string(static_cast<engine::Reason>(i))).c_str(),
                  e.counters()[i]);
  std::printf("\n");
  // Guards against a degenerate mutation mix (hundreds are typical).
  ENSURE(completions > iterations / 10000);
}
}  // namespace

int main(int argc, char** argv) {
  const uint64_t iterations = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 200000;
  g_seed = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : std::random_device{}();
  std::printf("engine fuzz: %" PRIu64 " packets per mode, seed %" PRIu64 "\n", iterations, g_seed);
  std::mt19937_64 rng(g_seed);
  run(engine::ReduceMode::deterministic, iterations, rng);
  run(engine::ReduceMode::accumulate, iterations, rng);
  std::printf("engine fuzz: no invariant violated\n");
  return 0;
}
