// Randomized robustness test of the parser and ICRC over mutated frames.
//
// Seeds are valid frames from the builder (every opcode, VLAN or not, payloads
// up to 4 KB); each iteration damages one: bit flips, header bytes set to
// boundary values, length fields rewritten, truncation, extension, splices of
// two frames. Each input is copied into a heap buffer of exactly its length,
// so under ASan any read past the end is fatal. For every input the status
// must be a defined one; when it is `ok` the offsets must satisfy every
// ParsedFrame invariant, re-derived here from the raw bytes, and computing the
// ICRC must stay inside the buffer.
//
//   usage: parse-fuzz-test [ITERATIONS] [SEED]   (a failure prints its seed)
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "support/random_frames.h"
#include "wire/icrc.h"
#include "wire/parse.h"

using namespace netreduce::wire;

namespace {
uint64_t g_seed = 0;
uint64_t g_iter = 0;

[[noreturn]] void fail(const char* what) {
  std::fflush(stdout);
  std::fprintf(stderr,
               "parse fuzz: invariant violated at iteration %" PRIu64 " (seed %" PRIu64 "): %s\n",
               g_iter, g_seed, what);
  std::abort();
}
#define ENSURE(cond)          \
  do {                        \
    if (!(cond)) fail(#cond); \
  } while (0)

uint16_t rd16(const uint8_t* p) { return static_cast<uint16_t>((p[0] << 8) | p[1]); }

void check(const uint8_t* data, size_t len, size_t& ok_count, std::vector<size_t>& hist) {
  ParsedFrame p;
  const ParseStatus st = parse_frame(data, len, p);
  ENSURE(static_cast<size_t>(st) < kParseStatusCount);
  ++hist[static_cast<size_t>(st)];
  ParsedFrame again;
  ENSURE(parse_frame(data, len, again) == st);  // deterministic
  if (st != ParseStatus::ok) return;
  ++ok_count;
  ENSURE(std::memcmp(&p, &again, sizeof(p)) == 0);
  // Structural invariants, from the raw bytes rather than the parser's view.
  ENSURE(p.l3 == 14 + 4 * p.vlans);
  ENSURE(p.l4 == p.l3 + 20 && p.bth == p.l4 + 8);
  ENSURE(data[p.l3] == 0x45);
  ENSURE(data[p.l3 + 9] == 17);
  ENSURE(rd16(data + p.l4 + 2) == 4791);
  const size_t ip_total = rd16(data + p.l3 + 2);
  ENSURE(p.end == p.l3 + ip_total);
  ENSURE(p.end <= len);
  ENSURE(rd16(data + p.l4 + 4) == ip_total - 20);
  const OpcodeInfo& info = opcode_info(data[p.bth]);
  ENSURE(info.known() && p.opcode == data[p.bth]);
  ENSURE(p.payload == p.bth + 12 + info.ext_bytes);
  ENSURE(size_t{p.payload} + p.payload_len + p.pad + kIcrcBytes == p.end);
  ENSURE(p.pad == ((data[p.bth + 1] >> 4) & 3));
  ENSURE((p.reth != 0) == info.has(kExtReth));
  ENSURE((p.immdt != 0) == info.has(kExtImmDt));
  ENSURE((p.aeth != 0) == info.has(kExtAeth));
  if (!info.has(kHasPayload)) ENSURE(p.payload_len == 0 && p.pad == 0);
  (void)icrc_verify(data, p);  // must stay in bounds
}
}  // namespace

int main(int argc, char** argv) {
  const uint64_t iterations = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 1000000;
  g_seed = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : std::random_device{}();
  std::printf("parse fuzz: %" PRIu64 " iterations, seed %" PRIu64 "\n", iterations, g_seed);
  std::mt19937_64 rng(g_seed);
  auto u = [&](uint64_t lo, uint64_t hi) {
    return std::uniform_int_distribution<uint64_t>(lo, hi)(rng);
  };

  // Seed corpus.
  std::vector<std::vector<uint8_t>> corpus;
  RoceFrameSpec spec;
  std::vector<uint8_t> payload;
  for (int i = 0; i < 512; ++i) {
    netreduce::testing::random_spec(rng, spec, payload, i % 4 == 0 ? 4096 : 64);
    std::vector<uint8_t> f(frame_size(spec));
    if (build_frame(spec, f.data(), f.size()) != f.size()) fail("builder refused a seed");
    corpus.push_back(std::move(f));
  }

  size_t ok_count = 0;
  std::vector<size_t> hist(kParseStatusCount);
  std::vector<uint8_t> work;
  static const uint8_t kBoundary[] = {0x00, 0x01, 0x04, 0x05, 0x06, 0x0F, 0x11, 0x12, 0x45,
                                      0x46, 0x7F, 0x80, 0x81, 0x88, 0xA8, 0xFE, 0xFF};
  for (g_iter = 0; g_iter < iterations; ++g_iter) {
    work = corpus[u(0, corpus.size() - 1)];
    const int mutations = static_cast<int>(u(1, 4));
    for (int m = 0; m < mutations && !work.empty(); ++m) {
      const size_t hdr = std::min<size_t>(work.size(), 90);
      switch (u(0, 7)) {
        case 0:  // bit flips anywhere
          for (uint64_t k = u(1, 8); k; --k)
            work[u(0, work.size() - 1)] ^= static_cast<uint8_t>(1u << u(0, 7));
          break;
        case 1:  // a header byte to a boundary value
          work[u(0, hdr - 1)] = kBoundary[u(0, sizeof(kBoundary) - 1)];
          break;
        case 2:  // a header byte to anything
          work[u(0, hdr - 1)] = static_cast<uint8_t>(rng());
          break;
        case 3: {  // rewrite a 16-bit length field (IP total, UDP length) near its true value
          const size_t vl = (work.size() > 13 && work[12] == 0x81) ? 4 : 0;
          const size_t at = u(0, 1) ? 16 + vl : 38 + vl;
          if (at + 1 < work.size()) {
            const int v = (work[at] << 8 | work[at + 1]) + static_cast<int>(u(0, 16)) - 8;
            work[at] = static_cast<uint8_t>(v >> 8);
            work[at + 1] = static_cast<uint8_t>(v);
          }
          break;
        }
        case 4:  // truncate
          work.resize(u(0, work.size()));
          break;
        case 5:  // extend with junk
          for (uint64_t k = u(1, 64); k; --k) work.push_back(static_cast<uint8_t>(rng()));
          break;
        case 6: {  // splice the tail of another frame
          const auto& other = corpus[u(0, corpus.size() - 1)];
          const size_t cut = u(0, work.size());
          const size_t from = u(0, other.size());
          work.resize(cut);
          work.insert(work.end(), other.begin() + static_cast<long>(from), other.end());
          break;
        }
        default: {  // BTH opcode / flags to anything
          const size_t bth = 42 + ((work.size() > 13 && work[12] == 0x81) ? 4 : 0);
          if (bth + 1 < work.size()) work[bth + u(0, 1)] = static_cast<uint8_t>(rng());
          break;
        }
      }
    }
    // Exact-size heap copy: one byte past the end is a heap overflow to ASan.
    std::unique_ptr<uint8_t[]> exact(new uint8_t[work.size() ? work.size() : 1]);
    if (!work.empty()) std::memcpy(exact.get(), work.data(), work.size());
    check(work.empty() ? nullptr : exact.get(), work.size(), ok_count, hist);
  }

  std::printf("parse fuzz: %" PRIu64 " inputs, %zu parsed ok, no invariant violated\n", iterations,
              ok_count);
  for (size_t s = 0; s < hist.size(); ++s)
    if (hist[s])
      std::printf("  %-20s %zu\n", std::string(to_string(static_cast<ParseStatus>(s))).c_str(),
                  hist[s]);
  // The mutations must reach both outcomes in bulk, or the test tests nothing.
  if (ok_count < iterations / 50 || ok_count > iterations - iterations / 50)
    fail("mutation mix degenerate");
  return 0;
}
