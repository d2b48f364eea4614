// Element-wise reduction kernels: the sum (or min/max) of the payloads of P
// packets, one per worker rank.
//
// Theory of operation
// -------------------
// Every result is a deterministic function of the inputs and their rank order:
// the same bytes come out on every ISA variant (scalar, AVX2, AVX-512), in
// reduce mode and in accumulate mode, for every input including NaN, inf, -0,
// subnormals and integer overflow. The tests check this bit for bit.
//
// Order. reduce() computes, for each element i,
//     dst[i] = op(...op(op(x_0[i], x_1[i]), x_2[i])..., x_{n-1}[i])
// strictly in rank order (srcs[0] first). Floating-point sums are not
// associative, so the order is part of the result. Accumulate mode gives the
// same bytes when fed init(x_0), add(x_1), ..., add(x_{n-1}), finish().
//
// Widening. fp16 and bf16 elements are widened to fp32 (exact), reduced in fp32
// in rank order, and rounded once to fp16/bf16 at the end, round to nearest,
// ties to even. The other dtypes are reduced in their own type.
//
// sum. Floating point: IEEE add in rank order, one rounding per add (round to
//   nearest even), no FMA and no reassociation (the kernels are compiled with
//   -ffp-contract=off, never -ffast-math). int32/int64 wrap modulo 2^32/2^64.
//
// min/max (floating point): IEEE 754-2019 minimum/maximum:
//   - if either operand is NaN the result is NaN (NaN propagates, it is never
//     dropped);
//   - -0 is less than +0: min(+0, -0) = min(-0, +0) = -0 and
//     max(+0, -0) = max(-0, +0) = +0;
//   - otherwise the smaller (larger) value.
//   So min/max of non-NaN values do not depend on rank order at all.
// min/max (int32/int64): the signed minimum/maximum.
// For fp16/bf16, min/max is taken over the widened values and narrowed
// (exact, since widening is exact).
//
// NaN results. Every NaN the reduction produces (from a NaN input or from
// inf - inf) is written as the canonical positive quiet NaN: 0x7FC00000
// (fp32), 0x7FF8000000000000 (fp64), 0x7E00 (fp16), 0x7FC0 (bf16). The sign
// and payload of input NaNs are not propagated; this keeps the result
// independent of which operand order the hardware or the compiler picks.
//
// Environment. The caller's floating-point environment must be the default
// one (round to nearest, no FTZ/DAZ), as the C runtime and DPDK set it.
//
// Memory. srcs and dst may be unaligned (they point into packets). dst may
// be the very same pointer as one of the srcs (in place): every element is
// read from all srcs before it is written. Any other overlap is not allowed.
// The kernels do not allocate, lock, log or throw; reduce() uses a few KB of
// stack.
//
// Speed. Up to 4 ranks are reduced in one pass straight into dst; more ranks
// go through an L1-resident fp32 (fp16/bf16) or native accumulator block, 4
// ranks per pass (see kernels_impl.h). fp16/bf16 use F16C / AVX-512
// conversions on the AVX2 and AVX-512 variants; the scalar variant converts
// with integer code and is much slower for fp16.
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
