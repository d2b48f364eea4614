// The 16-bit conversions against numpy (tests/tools/fp16_golden.py, build step
// fp16_golden.bin): the scalar functions and the vectorized kernels of every
// ISA, in both directions. numpy's float32 -> float16 is IEEE round to nearest
// even with subnormals; the bf16 reference is computed in plain Python
// integers. Where the machine has F16C, the hardware conversion is a third
// opinion.
//
// Documented difference: converting a signaling NaN, numpy keeps the quiet
// bit clear (narrowing, it only forces the payload non-zero); netreduce, like
// F16C, sets it. Narrowing such inputs is compared as "both NaN, same sign";
// widening as numpy's result with the quiet bit set.
#include <immintrin.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <vector>

#include "reduce/reduce.h"

using netreduce::wire::Dtype;
using netreduce::wire::ReduceOp;
namespace nr = netreduce::reduce;

namespace {

struct Golden {
  std::vector<uint32_t> f32;
  std::vector<uint16_t> fp16, bf16;
  std::vector<uint32_t> w16, wbf;  // 65536 each
};

template <class T>
void take(const std::vector<char>& raw, size_t& pos, std::vector<T>& out, size_t n) {
  REQUIRE(pos + n * sizeof(T) <= raw.size());
  out.resize(n);
  std::memcpy(out.data(), raw.data() + pos, n * sizeof(T));
  pos += n * sizeof(T);
}

const Golden& golden() {
  static const Golden g = [] {
    Golden out;
    const char* path = std::getenv("NETREDUCE_FP16_GOLDEN");
    if (!path) FAIL("NETREDUCE_FP16_GOLDEN not set (run via meson test)");
    std::ifstream in(path, std::ios::binary);
    REQUIRE(in);
    in.seekg(0, std::ios::end);
    std::vector<char> raw(static_cast<size_t>(in.tellg()));
    in.seekg(0);
    in.read(raw.data(), static_cast<std::streamsize>(raw.size()));
    REQUIRE(in);
    REQUIRE(raw.size() >= 12);
    REQUIRE(std::memcmp(raw.data(), "NRF16G01", 8) == 0);
    uint32_t n;
    std::memcpy(&n, raw.data() + 8, 4);
    size_t pos = 12;
    take(raw, pos, out.f32, n);
    take(raw, pos, out.fp16, n);
    take(raw, pos, out.bf16, n);
    take(raw, pos, out.w16, 65536);
    take(raw, pos, out.wbf, 65536);
    REQUIRE(pos == raw.size());
    return out;
  }();
  return g;
}

float as_float(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}
uint32_t bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}
bool is_nan32(uint32_t b) { return (b & 0x7FFFFFFFu) > 0x7F800000u; }
bool is_snan32(uint32_t b) { return is_nan32(b) && !(b & 0x00400000u); }
bool is_nan16(uint16_t h) { return (h & 0x7FFFu) > 0x7C00u; }
bool is_snan16(uint32_t h) { return is_nan16(static_cast<uint16_t>(h)) && !(h & 0x0200u); }

// numpy's fp16 -> fp32 keeps a signaling NaN signaling; netreduce (and F16C)
// sets the quiet bit. Sign and payload agree.
uint32_t expected_widen16(const Golden& g, uint32_t h) {
  return g.w16[h] | (is_snan16(h) ? 0x00400000u : 0u);
}

// fp16 narrowing result vs numpy, with the signaling-NaN exception.
bool fp16_matches(uint32_t in, uint16_t got, uint16_t numpy) {
  if (is_snan32(in)) return is_nan16(got) && is_nan16(numpy) && (got & 0x8000) == (numpy & 0x8000);
  return got == numpy;
}

__attribute__((target("f16c"))) uint16_t hw_narrow(float f) {
  return static_cast<uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
}
__attribute__((target("f16c"))) float hw_widen(uint16_t h) { return _cvtsh_ss(h); }

}  // namespace

TEST_CASE("scalar conversions match numpy", "[reduce][convert][golden]") {
  const Golden& g = golden();
  REQUIRE(g.f32.size() > 500000);
  size_t snans = 0;
  for (size_t i = 0; i < g.f32.size(); ++i) {
    const uint32_t x = g.f32[i];
    const uint16_t h = nr::float_to_fp16(as_float(x));
    if (!fp16_matches(x, h, g.fp16[i]))
      FAIL("fp32 " << x << ": fp16 got " << h << " numpy " << g.fp16[i]);
    if (nr::float_to_bf16(as_float(x)) != g.bf16[i])
      FAIL("fp32 " << x << ": bf16 got " << nr::float_to_bf16(as_float(x)) << " want "
                   << g.bf16[i]);
    snans += is_snan32(x);
  }
  CHECK(snans >= 4);
  for (uint32_t h = 0; h < 65536; ++h) {
    if (bits(nr::fp16_to_float(static_cast<uint16_t>(h))) != expected_widen16(g, h))
      FAIL("fp16 " << h);
    if (bits(nr::bf16_to_float(static_cast<uint16_t>(h))) != g.wbf[h]) FAIL("bf16 " << h);
  }
}

TEST_CASE("vectorized kernels convert like numpy on every ISA", "[reduce][convert][golden]") {
  const Golden& g = golden();
  const size_t n = g.f32.size();
  std::vector<uint16_t> all(65536);
  for (uint32_t h = 0; h < 65536; ++h) all[h] = static_cast<uint16_t>(h);
  for (nr::Isa isa : {nr::Isa::scalar, nr::Isa::avx2, nr::Isa::avx512}) {
    if (!nr::isa_supported(isa)) continue;
    CAPTURE(to_string(isa));
    for (Dtype dt : {Dtype::fp16, Dtype::bf16}) {
      CAPTURE(to_string(dt));
      const nr::Kernels& k = nr::kernels(isa, dt, ReduceOp::sum);
      // Narrowing: accumulator = the golden fp32 inputs, finish() rounds them.
      // The kernels canonicalize NaN results to 0x7E00 / 0x7FC0.
      std::vector<uint16_t> out(n);
      k.finish(g.f32.data(), reinterpret_cast<uint8_t*>(out.data()), n);
      for (size_t i = 0; i < n; ++i) {
        const uint32_t x = g.f32[i];
        const uint16_t want = dt == Dtype::fp16 ? g.fp16[i] : g.bf16[i];
        if (is_nan32(x)) {
          if (out[i] != (dt == Dtype::fp16 ? 0x7E00 : 0x7FC0))
            FAIL("NaN " << x << " -> " << out[i]);
        } else if (out[i] != want) {
          FAIL("input " << x << " got " << out[i] << " want " << want);
        }
      }
      // Widening: init() from every 16-bit pattern, NaN sign and payload kept.
      std::vector<uint32_t> acc(65536);
      k.init(acc.data(), reinterpret_cast<const uint8_t*>(all.data()), 65536);
      for (uint32_t h = 0; h < 65536; ++h) {
        const uint32_t want = dt == Dtype::fp16 ? expected_widen16(g, h) : g.wbf[h];
        if (acc[h] != want) FAIL("widen " << h << " got " << acc[h] << " want " << want);
      }
    }
  }
}

TEST_CASE("conversions agree with F16C hardware", "[reduce][convert][f16c]") {
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("f16c")) {
    WARN("no F16C on this CPU; skipped");
    return;
  }
  const Golden& g = golden();
  // Narrowing, NaN included (F16C sets the quiet bit too).
  for (uint32_t x : g.f32) {
    if (nr::float_to_fp16(as_float(x)) != hw_narrow(as_float(x))) FAIL("fp32 " << x);
  }
  // A sweep over the whole fp32 space.
  for (uint64_t x = 0; x < (uint64_t{1} << 32); x += 4093) {
    const auto f = as_float(static_cast<uint32_t>(x));
    if (nr::float_to_fp16(f) != hw_narrow(f)) FAIL("fp32 " << x);
  }
  // Widening, every pattern, NaN included.
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint32_t hw = bits(hw_widen(static_cast<uint16_t>(h)));
    const uint32_t got = bits(nr::fp16_to_float(static_cast<uint16_t>(h)));
    if (got != hw) FAIL("fp16 " << h << " got " << got << " F16C " << hw);
  }
}
