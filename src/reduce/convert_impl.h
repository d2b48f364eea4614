// Internal: fp16/bf16 <-> fp32 conversions in integer arithmetic, written
// branch-free (selects only) so the compiler vectorizes them and every ISA
// variant computes the same bits.
//
// Everything here has internal linkage on purpose: each kernel translation
// unit (scalar, AVX2, AVX-512) is compiled with different -m flags and must get
// its own copy; shared inline functions would let the linker pick, say, the
// AVX-512 copy for the scalar path. For the same reason these files use
// compiler builtins rather than std:: function templates.
#pragma once

#include <cstdint>

namespace netreduce::reduce::detail {
namespace {  // NOLINT(google-build-namespaces): see above

inline uint32_t f32_bits(float f) { return __builtin_bit_cast(uint32_t, f); }
inline float f32_from_bits(uint32_t u) { return __builtin_bit_cast(float, u); }
inline uint64_t f64_bits(double d) { return __builtin_bit_cast(uint64_t, d); }
inline double f64_from_bits(uint64_t u) { return __builtin_bit_cast(double, u); }

// bf16 is the top half of an fp32: exact, NaN payload kept.
inline float bf16_widen(uint32_t h) { return f32_from_bits(h << 16); }

// Round to nearest even on the bit pattern x of an fp32 (a uint32_t, or a
// vector of them: the kernels use this same code on GCC vectors; after they
// have canonicalized NaN to 0x7FC00000 they need only bf16_round_bits). The carry
// out of the mantissa bumps the exponent, and out of the largest finite value
// gives inf. NaN keeps its sign and top payload bits and gets the quiet bit.
// The bf16 is in the low 16 bits of the result.
template <class U>
inline U bf16_round_bits(U x) {  // not for NaN, except the canonical 0x7FC00000 -> 0x7FC0
  return (x + 0x7FFFu + ((x >> 16) & 1u)) >> 16;
}
template <class U>
inline U bf16_narrow_bits(U x) {
  const U nan = (x >> 16) | 0x0040u;
  return (x & 0x7FFFFFFFu) > 0x7F800000u ? nan : bf16_round_bits(x);
}
inline uint16_t bf16_narrow(float f) {
  return static_cast<uint16_t>(bf16_narrow_bits(f32_bits(f)));
}

// fp16 -> fp32, exact. Normal: rebias the exponent (15 -> 127). inf/NaN:
// exponent all ones, sign and payload kept, and a NaN is made quiet, as
// F16C's vcvtph2ps does. Subnormal m * 2^-24 (m = 1..1023): shift m
// left by k until its top bit is bit 10 (k = 1..10, found with four
// conditional shifts of 8, 4, 2, 1), then the value is 1.f * 2^(-14 - k).
// Integer only (a float conversion would not be if-converted and vectorized
// under -ftrapping-math, and would depend on FTZ/DAZ).
inline float fp16_widen(uint32_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t em = h & 0x7FFFu;
  const uint32_t normal = (em << 13) + 0x38000000u;  // (127 - 15) << 23
  const uint32_t special =                           // (255 - 31) << 23; a NaN gets the quiet bit
      ((em << 13) + 0x70000000u) | (em > 0x7C00u ? 0x00400000u : 0u);
  uint32_t t = em & 0x03FFu;
  uint32_t k = 0;
  const bool s8 = (t << 8) < 0x800u;
  t = s8 ? t << 8 : t;
  k += s8 ? 8u : 0u;
  const bool s4 = (t << 4) < 0x800u;
  t = s4 ? t << 4 : t;
  k += s4 ? 4u : 0u;
  const bool s2 = (t << 2) < 0x800u;
  t = s2 ? t << 2 : t;
  k += s2 ? 2u : 0u;
  const bool s1 = (t << 1) < 0x800u;
  t = s1 ? t << 1 : t;
  k += s1 ? 1u : 0u;
  const uint32_t sub = em == 0 ? 0u : ((113u - k) << 23) | ((t & 0x03FFu) << 13);
  const uint32_t mag = em >= 0x7C00u ? special : (em >= 0x0400u ? normal : sub);
  return f32_from_bits(mag | sign);
}

// fp32 -> fp16, round to nearest even.
//   |f| >= 65520 (half-way between 65504 and 2^16, a tie that rounds to the
//   even neighbour 2^16): inf.
//   2^-14 <= |f| < 65520: rebias and round the 13 dropped bits.
//   |f| < 2^-14: subnormal half = round(|f| / 2^-24); |f| = m * 2^(e-150)
//   with the 24-bit significand m, so that is m >> (126 - e) with RNE on the
//   dropped bits (shift clamped to 31: anything smaller than 2^-25 is 0). The
//   rounding may carry into 0x0400, the smallest normal, which is correct.
//   NaN: quiet bit set, top 9 payload bits kept.
inline uint16_t fp16_narrow(float f) {
  const uint32_t x = f32_bits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t a = x & 0x7FFFFFFFu;

  const uint32_t t = a - 0x38000000u;
  const uint32_t normal = (t + 0x0FFFu + ((t >> 13) & 1u)) >> 13;

  const uint32_t e = a >> 23;
  const uint32_t ec = e > 112u ? 112u : e;  // keeps the shift in [14, 31] in every lane
  const uint32_t sh0 = 126u - ec;
  const uint32_t shift = sh0 > 31u ? 31u : sh0;
  const uint32_t m = (a & 0x007FFFFFu) | 0x00800000u;
  const uint32_t q = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1u);
  const uint32_t up = static_cast<uint32_t>(rem > half) | (static_cast<uint32_t>(rem == half) & q);
  const uint32_t sub = q + (up & 1u);

  const uint32_t nan = 0x7E00u | ((a >> 13) & 0x03FFu);
  const uint32_t mag = a > 0x7F800000u    ? nan
                       : a >= 0x477FF000u ? 0x7C00u
                       : a >= 0x38800000u ? normal
                                          : sub;
  return static_cast<uint16_t>(sign | mag);
}

}  // namespace
}  // namespace netreduce::reduce::detail
