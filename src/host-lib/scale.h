// The element-wise scaling around a sum that makes Op::avg and the
// pre-multiplied sum (allreduce_premul, reduce_scatter_premul): the wire op
// stays sum (the box knows only sum, min and max), and the communicator
// scales on the rank, inside the call's job on the progress thread.
// - avg: the sum exactly as Op::sum computes it (the box's rank order or
//   the ring's order), then every element divided by the world P.
// - premul: every element of this rank's input multiplied by the factor
//   into a scratch buffer (or recv), then the sum of those.
// Each element is computed in its type's arithmetic and rounded once to
// nearest even where it is a float:
//   fp64        x / P, x * f in double
//   fp32        x / P, x * float(f) in float (f first rounded to float)
//   fp16, bf16  widened to float (exact), then as fp32, then rounded to
//               the type (reduce.h's conversions: a second rounding)
//   int32/64    x / P truncated toward zero (C's division of the sum,
//               which wraps as the sum does); x * f modulo 2^32 / 2^64
//               (wraps as the sum does); f must be an integer of the type
// A factor must be usable in the element's arithmetic: a NaN, an infinity,
// a float factor past float's range (fp32, fp16, bf16) or an integer factor
// that is fractional or past the type's range is refused (check_factor), so
// no call multiplies by a value other than the one given.
//
// Example, P = 3, fp16, inputs 1, 1, 2 (one element each):
//   avg: sum 4 (exact), then 4 / 3 = 1.3333334f in float, rounded to fp16
//     1.333 (0x3D55) on every rank.
//   premul f = 0.1: 0.1 rounds to 0.1f; each rank's 1 x 0.1f = 0.1f,
//     rounded to fp16 0.09998 (0x2E66); 2 x 0.1f to 0.2 (0x3266); the sum of
//     0x2E66, 0x2E66, 0x3266 as Op::sum adds them.
//   int32 avg of -7 and 0 (P = 2): -7 / 2 = -3.
// Threads: any; no allocation, no lock.
#pragma once

#include <cstddef>

#include "netreduce/netreduce.hpp"

namespace netreduce::host {

// Whether factor multiplies elements of type t as given (see above); the
// error names the factor and the type. t must be a valid type.
Error check_factor(double factor, DataType t);

// buf[i] /= world, for count elements of type t (a valid type; world >= 1).
void divide_elements(void* buf, size_t count, DataType t, unsigned world) noexcept;

// dst[i] = src[i] x factor, for count elements of type t (a valid type and a
// factor check_factor accepts). dst may equal src; no other overlap.
void multiply_elements(const void* src, void* dst, size_t count, DataType t,
                       double factor) noexcept;

}  // namespace netreduce::host
