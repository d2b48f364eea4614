// Element-wise reduction kernels: the sum (or min/max) of the payloads of P
// packets, one per worker rank. Every result is a deterministic function of
// the inputs and their rank order: the same bytes on every ISA variant
// (scalar, AVX2, AVX-512) and in accumulate mode (init(x_0), add(x_1), ...,
// finish()), for every input including NaN, inf, -0, subnormals and integer
// overflow. The tests check this bit for bit.
//
// Example, P = 3, one element each:
//   fp32 sum of 1e8, 1, -1e8: (1e8 + 1) rounds to 1e8, then + -1e8 = 0.
//     Strictly in rank order (srcs[0] first); the order is part of the result.
//   fp16 sum of 2048, 1, 1: widened to fp32 (exact), 2050, rounded once to
//     fp16: 2050 (adding in fp16 would give 2048).
//   fp32 min of +0, -0, NaN: NaN, written as the canonical 0x7FC00000.
// Rules:
// - sum: IEEE add, one rounding per add, no FMA, no reassociation (the
//   kernels build with -ffp-contract=off, never -ffast-math); int32/int64
//   wrap. fp16/bf16 reduce in fp32 and round once, to nearest even.
// - min/max: IEEE 754-2019 minimum/maximum: NaN propagates, -0 < +0, so
//   non-NaN inputs give the same result in any order; integers signed.
// - Every NaN produced is the canonical positive quiet NaN (0x7FC00000,
//   0x7FF8000000000000, 0x7E00 fp16, 0x7FC0 bf16), whatever the inputs'.
//
// Contracts:
// - Caller: the default floating-point environment (round to nearest, no
//   FTZ/DAZ, as the C runtime and DPDK set it). srcs and dst may be
//   unaligned; dst may equal one src (every element is read from all srcs
//   before it is written), no other overlap.
// - Kernels: any thread; no allocation, lock, log or throw; a few KB of
//   stack. Up to 4 ranks go straight into dst, more through an L1-resident
//   accumulator block, 4 ranks per pass (kernels_impl.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "wire/ina.h"

namespace netreduce::reduce {

enum class Isa : uint8_t { scalar, avx2, avx512 };
std::string_view to_string(Isa isa) noexcept;
// Runtime CPU check. scalar: always. avx2: AVX2 + F16C. avx512: AVX-512
// F/BW/VL/DQ. False for a variant not compiled in (non-x86 builds).
bool isa_supported(Isa isa) noexcept;
// The best supported ISA.
Isa best_isa() noexcept;

// dst[i] = op over srcs[0][i], ..., srcs[n-1][i] in that order (see above).
// n >= 1 (n == 0 leaves dst untouched). elems may be 0.
using ReduceFn = void (*)(const uint8_t* const* srcs, unsigned n, uint8_t* dst, size_t elems);

// Accumulate mode (reduce on arrival). acc is a caller buffer of
// accum_bytes(dtype, elems) bytes, aligned to 8 bytes, not overlapping src
// or dst. Its contents between calls are the fp32 (fp16/bf16) or native
// accumulator values.
using AccInitFn = void (*)(void* acc, const uint8_t* src, size_t elems);  // acc = widen(src)
using AccAddFn = void (*)(void* acc, const uint8_t* src,
                          size_t elems);  // acc[i] = op(acc[i], widen(src[i]))
using AccFinishFn = void (*)(const void* acc, uint8_t* dst,
                             size_t elems);  // dst = narrow(acc), RNE for 16-bit

struct Kernels {
  ReduceFn reduce = nullptr;
  AccInitFn init = nullptr;
  AccAddFn add = nullptr;
  AccFinishFn finish = nullptr;
};

// The kernels of one ISA for a dtype and op. An unsupported Isa gives the
// scalar kernels; an invalid dtype or op (not a wire value) gives a Kernels
// whose members are all null.
const Kernels& kernels(Isa isa, wire::Dtype dtype, wire::ReduceOp op) noexcept;

// Bytes of the accumulate-mode buffer: 4 * elems for fp16/bf16, otherwise
// elems * dtype_size(dtype) (0 for an invalid dtype).
size_t accum_bytes(wire::Dtype dtype, size_t elems) noexcept;

// Scalar conversions (bit-identical to what the kernels of every ISA do), for
// tests and for the host library's reference.
// Widening is exact and keeps NaN sign and payload; an fp16 NaN is made quiet
// (as F16C's vcvtph2ps does), a bf16 is simply shifted (a signaling NaN stays
// signaling). Narrowing rounds to nearest, ties to even; overflow gives inf;
// fp16 has subnormals; a NaN stays NaN with its sign and the top payload bits
// and is made quiet (as F16C's vcvtps2ph does). The kernels additionally
// canonicalize NaN results (see above); these functions do not.
float bf16_to_float(uint16_t h) noexcept;
uint16_t float_to_bf16(float f) noexcept;
float fp16_to_float(uint16_t h) noexcept;
uint16_t float_to_fp16(float f) noexcept;

}  // namespace netreduce::reduce
