// Internal: the reduction loops, compiled once per ISA. kernels_<isa>.cc
// defines NETREDUCE_REDUCE_NS (isa_scalar, isa_avx2, isa_avx512) and includes
// this file; the -m flags of that file decide the vector width. Everything
// but table() has internal linkage (see convert_impl.h for why).
//
// Loop structure: the rank loop is outside the element loop and unrolled at
// compile time over groups of up to kGroup = 4 ranks. Up to 4 ranks: one pass,
// dst[i] = op(op(op(x0[i], x1[i]), x2[i]), x3[i]). More ranks: per block of
// kBlock elements, an accumulator array on the stack (2-4 KB, stays in L1) is
// set from ranks 0-3, combined with 4 more ranks per pass in rank order, and
// the last 1-4 ranks are folded in while narrowing into dst. Every element
// loop walks memory with a unit stride, so the compiler emits plain
// (unaligned) vector loads: no gathers, which a loop over a run-time number of
// ranks innermost would produce. Elements are loaded and stored through
// memcpy (unaligned, no aliasing UB).
#ifndef NETREDUCE_REDUCE_NS
#error "define NETREDUCE_REDUCE_NS before including reduce/kernels_impl.h"
#endif

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

#if defined(__AVX512F__) || (defined(__F16C__) && defined(__AVX2__))
#include <immintrin.h>
#endif

#include "reduce/convert_impl.h"
#include "reduce/detail.h"
#include "reduce/reduce.h"

namespace netreduce::reduce::detail::NETREDUCE_REDUCE_NS {
namespace {  // NOLINT(google-build-namespaces): one private copy per ISA

constexpr size_t kBlock = 512;

template <class T>
inline T load(const uint8_t* p) {
  T v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}
template <class T>
inline void store(uint8_t* p, T v) {
  __builtin_memcpy(p, &v, sizeof v);
}

// The canonical quiet NaN replaces every NaN result.
inline float canon(float a) { return a != a ? f32_from_bits(0x7FC00000u) : a; }
inline double canon(double a) { return a != a ? f64_from_bits(0x7FF8000000000000ull) : a; }

// fp16 and bf16 on AVX2/AVX-512: explicit vectors (GCC vector extensions).
// fp16 is converted by vcvtph2ps / vcvtps2ph (round to nearest even from the
// immediate, not MXCSR), one instruction per vector instead of the ~25 of the
// integer conversions. They give the same bits as fp16_widen and
// fp16_narrow for every input (tests/reduce/convert_golden_test.cc checks all
// 65536 halves and ~2M floats against the hardware). bf16 is widened by a
// zero-extend and shift and narrowed by bf16_round_bits, the same template
// as the scalar code. The ops below are written once for scalars and these
// vectors, so both compute the same selects and adds; element tails use the
// scalar code.
#if defined(__AVX512F__)  // vcvtph2ps/vcvtps2ph on zmm are AVX-512F
#define NETREDUCE_REDUCE_VEC_LANES 16
typedef float VecF __attribute__((vector_size(64)));
typedef uint32_t VecU __attribute__((vector_size(64)));
inline VecF vec_widen_fp16(const uint8_t* p) {
  // The all-lanes maskz forms: the plain ones use _mm512_undefined_*, which
  // g++ 12 reports as maybe-uninitialized.
  return (VecF)_mm512_maskz_cvtph_ps(0xFFFF,
                                     _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline void vec_narrow_fp16(uint8_t* p, VecF v) {
  _mm256_storeu_si256(
      reinterpret_cast<__m256i*>(p),
      _mm512_maskz_cvtps_ph(0xFFFF, (__m512)v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
#elif defined(__F16C__) && defined(__AVX2__)
#define NETREDUCE_REDUCE_VEC_LANES 8
typedef float VecF __attribute__((vector_size(32)));
typedef uint32_t VecU __attribute__((vector_size(32)));
inline VecF vec_widen_fp16(const uint8_t* p) {
  return (VecF)_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline void vec_narrow_fp16(uint8_t* p, VecF v) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                   _mm256_cvtps_ph((__m256)v, _MM_FROUND_TO_NEAREST_INT));
}
#endif

#ifdef NETREDUCE_REDUCE_VEC_LANES
#if NETREDUCE_REDUCE_VEC_LANES == 16
inline VecU vec_load_u16(const uint8_t* p) {  // zero-extends: vpmovzxwd
  return (VecU)_mm512_maskz_cvtepu16_epi32(0xFFFF,
                                           _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline void vec_store_u16(uint8_t* p, VecU v) {  // keeps the low halves: vpmovdw
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                      _mm512_maskz_cvtepi32_epi16(0xFFFF, (__m512i)v));
}
#else
inline VecU vec_load_u16(const uint8_t* p) {  // zero-extends: vpmovzxwd
  return (VecU)_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline void vec_store_u16(uint8_t* p, VecU v) {  // keeps the low halves, all < 2^16
  // vpackusdw works per 128-bit lane: [v0-3 v0-3 | v4-7 v4-7]; take qwords 0, 2.
  const __m256i packed = _mm256_packus_epi32((__m256i)v, (__m256i)v);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                   _mm256_castsi256_si128(_mm256_permute4x64_epi64(packed, 0x08)));
}
#endif
inline VecF vec_canon(VecF a) {
  const VecF nan = __builtin_bit_cast(VecF, VecU{} + 0x7FC00000u);
  return a != a ? nan : a;
}
inline VecF vec_load(const float* p) {
  VecF v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}
inline void vec_store(float* p, VecF v) { __builtin_memcpy(p, &v, sizeof v); }
inline VecF vec_widen_bf16(const uint8_t* p) {
  return __builtin_bit_cast(VecF, vec_load_u16(p) << 16);
}
inline void vec_narrow_bf16(uint8_t* p, VecF v) {
  vec_store_u16(p, bf16_round_bits(__builtin_bit_cast(VecU, v)));  // v is canonical
}
#endif

// Dtype traits: element size, accumulator type, widen (load) and narrow
// (store, NaN canonicalized); kLanes != 0 adds the explicit-vector versions
// (fp16 and bf16 on AVX2/AVX-512).
struct Fp32 {
  using Acc = float;
  static constexpr size_t kSize = 4, kLanes = 0;
  static Acc widen(const uint8_t* p) { return load<float>(p); }
  static void narrow(uint8_t* p, Acc a) { store<float>(p, canon(a)); }
};
struct Fp64 {
  using Acc = double;
  static constexpr size_t kSize = 8, kLanes = 0;
  static Acc widen(const uint8_t* p) { return load<double>(p); }
  static void narrow(uint8_t* p, Acc a) { store<double>(p, canon(a)); }
};
struct Fp16 {
  using Acc = float;
  static constexpr size_t kSize = 2;
  static Acc widen(const uint8_t* p) { return fp16_widen(load<uint16_t>(p)); }
  static void narrow(uint8_t* p, Acc a) { store<uint16_t>(p, fp16_narrow(canon(a))); }
#ifdef NETREDUCE_REDUCE_VEC_LANES
  static constexpr size_t kLanes = NETREDUCE_REDUCE_VEC_LANES;
  static VecF vwiden(const uint8_t* p) { return vec_widen_fp16(p); }
  static void vnarrow(uint8_t* p, VecF a) { vec_narrow_fp16(p, vec_canon(a)); }
#else
  static constexpr size_t kLanes = 0;
#endif
};
struct Bf16 {
  using Acc = float;
  static constexpr size_t kSize = 2;
  static Acc widen(const uint8_t* p) { return bf16_widen(load<uint16_t>(p)); }
  static void narrow(uint8_t* p, Acc a) {
    store<uint16_t>(p, static_cast<uint16_t>(bf16_round_bits(f32_bits(canon(a)))));
  }
#ifdef NETREDUCE_REDUCE_VEC_LANES
  static constexpr size_t kLanes = NETREDUCE_REDUCE_VEC_LANES;
  static VecF vwiden(const uint8_t* p) { return vec_widen_bf16(p); }
  static void vnarrow(uint8_t* p, VecF a) { vec_narrow_bf16(p, vec_canon(a)); }
#else
  static constexpr size_t kLanes = 0;
#endif
};
struct Int32 {
  using Acc = int32_t;
  static constexpr size_t kSize = 4, kLanes = 0;
  static Acc widen(const uint8_t* p) { return load<int32_t>(p); }
  static void narrow(uint8_t* p, Acc a) { store<int32_t>(p, a); }
};
struct Int64 {
  using Acc = int64_t;
  static constexpr size_t kSize = 8, kLanes = 0;
  static Acc widen(const uint8_t* p) { return load<int64_t>(p); }
  static void narrow(uint8_t* p, Acc a) { store<int64_t>(p, a); }
};

// Floating-point scalars and vectors, and their bit-pattern types.
template <class A>
constexpr bool kIsFloat = std::is_floating_point_v<A>;
template <class A>
struct BitsOf {
  using type = std::conditional_t<sizeof(A) == 4, uint32_t, uint64_t>;
};
#ifdef NETREDUCE_REDUCE_VEC_LANES
template <>
constexpr bool kIsFloat<VecF> = true;
template <>
struct BitsOf<VecF> {
  using type = VecU;
};
#endif
template <class A>
using Bits = typename BitsOf<A>::type;

// Ops: a is the running value, b the next rank's value.
struct Sum {
  template <class A>
  static A apply(A a, A b) {
    if constexpr (kIsFloat<A>) {
      return a + b;
    } else {
      using U = std::make_unsigned_t<A>;  // wraps, no signed-overflow UB
      return static_cast<A>(static_cast<U>(a) + static_cast<U>(b));
    }
  }
};
// Floating point: NaN if either is NaN; for a == b the bitwise OR (min) or
// AND (max) of the two, which is the value itself, or -0 (min) / +0 (max) for
// a pair of zeros of different signs.
struct Min {
  template <class A>
  static A apply(A a, A b) {
    if constexpr (kIsFloat<A>) {
      A r = b < a ? b : a;  // a if a is NaN
      const A z =
          __builtin_bit_cast(A, __builtin_bit_cast(Bits<A>, a) | __builtin_bit_cast(Bits<A>, b));
      r = a == b ? z : r;
      return b != b ? b : r;
    } else {
      return b < a ? b : a;
    }
  }
};
struct Max {
  template <class A>
  static A apply(A a, A b) {
    if constexpr (kIsFloat<A>) {
      A r = b > a ? b : a;
      const A z =
          __builtin_bit_cast(A, __builtin_bit_cast(Bits<A>, a) & __builtin_bit_cast(Bits<A>, b));
      r = a == b ? z : r;
      return b != b ? b : r;
    } else {
      return b > a ? b : a;
    }
  }
};

// One element (kVec false) or one vector of D::kLanes elements (kVec true).
template <class D, bool kVec>
inline auto elem(const uint8_t* p) {
  if constexpr (kVec)
    return D::vwiden(p);
  else
    return D::widen(p);
}

// Left fold of the op over element(s) `off` of the ranks q[0], q[1], ...,
// starting from a: op(...op(op(a, x_0), x_1)..., x_{K-1}), in that order.
template <class D, class O, bool kVec, class A, size_t... R>
inline A fold(A a, const uint8_t* const* q, size_t off, std::index_sequence<R...>) {
  ((a = O::apply(a, elem<D, kVec>(q[R] + off))), ...);
  return a;
}

// The passes, each over K <= kGroup ranks with the rank count a compile-time
// constant, so the rank loop is unrolled and the element loop vectorizes with
// plain loads. The source pointers are copied to a local array first so the
// compiler sees they do not change in the loop. acc never aliases packet
// memory; dst may be one of the sources (in place): the auto-vectorized loops
// then take the scalar path of the compiler's run-time overlap check, and the
// explicit vector loops load each vector's elements before storing it. Each
// pass starts with the explicit vector loop if the dtype has one
// (kLanes != 0); the scalar loop does the rest.
constexpr unsigned kGroup = 4;

// dst = op over all K ranks; no accumulator.
template <class D, class O, unsigned K>
void pass_direct(const uint8_t* const* srcs, uint8_t* dst, size_t m) {
  const uint8_t* q[K];
  for (unsigned k = 0; k < K; ++k) q[k] = srcs[k];
  size_t i = 0;
  if constexpr (D::kLanes != 0) {
    for (; i + D::kLanes <= m; i += D::kLanes) {
      const size_t off = i * D::kSize;
      D::vnarrow(dst + off, fold<D, O, true>(D::vwiden(q[0] + off), q + 1, off,
                                             std::make_index_sequence<K - 1>{}));
    }
  }
  for (; i < m; ++i) {
    const size_t off = i * D::kSize;
    D::narrow(dst + off, fold<D, O, false>(D::widen(q[0] + off), q + 1, off,
                                           std::make_index_sequence<K - 1>{}));
  }
}
// acc = op over K ranks.
template <class D, class O, unsigned K>
void pass_init(typename D::Acc* __restrict acc, const uint8_t* const* srcs, size_t base, size_t m) {
  const uint8_t* q[K];
  for (unsigned k = 0; k < K; ++k) q[k] = srcs[k] + base;
  size_t i = 0;
  if constexpr (D::kLanes != 0) {
    for (; i + D::kLanes <= m; i += D::kLanes) {
      const size_t off = i * D::kSize;
      vec_store(acc + i, fold<D, O, true>(D::vwiden(q[0] + off), q + 1, off,
                                          std::make_index_sequence<K - 1>{}));
    }
  }
  for (; i < m; ++i) {
    const size_t off = i * D::kSize;
    acc[i] = fold<D, O, false>(D::widen(q[0] + off), q + 1, off, std::make_index_sequence<K - 1>{});
  }
}
// acc = op(acc, K more ranks).
template <class D, class O, unsigned K>
void pass_add(typename D::Acc* __restrict acc, const uint8_t* const* srcs, size_t base, size_t m) {
  const uint8_t* q[K];
  for (unsigned k = 0; k < K; ++k) q[k] = srcs[k] + base;
  size_t i = 0;
  if constexpr (D::kLanes != 0) {
    for (; i + D::kLanes <= m; i += D::kLanes)
      vec_store(acc + i, fold<D, O, true>(vec_load(acc + i), q, i * D::kSize,
                                          std::make_index_sequence<K>{}));
  }
  for (; i < m; ++i)
    acc[i] = fold<D, O, false>(acc[i], q, i * D::kSize, std::make_index_sequence<K>{});
}
// dst = narrow(op(acc, the last K ranks)).
template <class D, class O, unsigned K>
void pass_add_finish(const typename D::Acc* __restrict acc, const uint8_t* const* srcs, size_t base,
                     uint8_t* dst, size_t m) {
  const uint8_t* q[K];
  for (unsigned k = 0; k < K; ++k) q[k] = srcs[k] + base;
  size_t i = 0;
  if constexpr (D::kLanes != 0) {
    for (; i + D::kLanes <= m; i += D::kLanes) {
      const size_t off = i * D::kSize;
      D::vnarrow(dst + off,
                 fold<D, O, true>(vec_load(acc + i), q, off, std::make_index_sequence<K>{}));
    }
  }
  for (; i < m; ++i) {
    const size_t off = i * D::kSize;
    D::narrow(dst + off, fold<D, O, false>(acc[i], q, off, std::make_index_sequence<K>{}));
  }
}
// dst = narrow(acc).
template <class D>
void pass_finish(const typename D::Acc* __restrict acc, uint8_t* dst, size_t m) {
  size_t i = 0;
  if constexpr (D::kLanes != 0) {
    for (; i + D::kLanes <= m; i += D::kLanes) D::vnarrow(dst + i * D::kSize, vec_load(acc + i));
  }
  for (; i < m; ++i) D::narrow(dst + i * D::kSize, acc[i]);
}

// n <= kGroup: one pass straight into dst. More ranks: per block of kBlock
// elements, acc = the first kGroup ranks, then kGroup more per pass, and the
// last 1..kGroup ranks are folded in while narrowing into dst.
template <class D, class O>
void reduce_ranks(const uint8_t* const* srcs, unsigned n, uint8_t* dst, size_t elems) {
  static_assert(kGroup == 4);
  switch (n) {
    case 0:
      return;
    case 1:
      return pass_direct<D, O, 1>(srcs, dst, elems);
    case 2:
      return pass_direct<D, O, 2>(srcs, dst, elems);
    case 3:
      return pass_direct<D, O, 3>(srcs, dst, elems);
    case 4:
      return pass_direct<D, O, 4>(srcs, dst, elems);
    default:
      break;
  }
  alignas(64) typename D::Acc acc[kBlock];
  for (size_t base = 0; base < elems; base += kBlock) {
    const size_t m = elems - base < kBlock ? elems - base : kBlock;
    const size_t off = base * D::kSize;
    pass_init<D, O, kGroup>(acc, srcs, off, m);
    unsigned r = kGroup;
    for (; n - r > kGroup; r += kGroup) pass_add<D, O, kGroup>(acc, srcs + r, off, m);
    switch (n - r) {
      case 1:
        pass_add_finish<D, O, 1>(acc, srcs + r, off, dst + off, m);
        break;
      case 2:
        pass_add_finish<D, O, 2>(acc, srcs + r, off, dst + off, m);
        break;
      case 3:
        pass_add_finish<D, O, 3>(acc, srcs + r, off, dst + off, m);
        break;
      default:
        pass_add_finish<D, O, 4>(acc, srcs + r, off, dst + off, m);
        break;
    }
  }
}

template <class D, class O>
void acc_init(void* acc, const uint8_t* src, size_t elems) {
  pass_init<D, O, 1>(static_cast<typename D::Acc*>(acc), &src, 0, elems);
}
template <class D, class O>
void acc_add(void* acc, const uint8_t* src, size_t elems) {
  pass_add<D, O, 1>(static_cast<typename D::Acc*>(acc), &src, 0, elems);
}
template <class D>
void acc_finish(const void* acc, uint8_t* dst, size_t elems) {
  pass_finish<D>(static_cast<const typename D::Acc*>(acc), dst, elems);
}

template <class D, class O>
constexpr Kernels make() {
  return Kernels{&reduce_ranks<D, O>, &acc_init<D, O>, &acc_add<D, O>, &acc_finish<D>};
}
template <class D>
constexpr auto row() {
  // Op wire values: sum 1, min 2, max 3.
  static_assert(static_cast<int>(wire::ReduceOp::sum) == 1 &&
                static_cast<int>(wire::ReduceOp::min) == 2 &&
                static_cast<int>(wire::ReduceOp::max) == 3);
  struct Row {
    Kernels k[kNumOps];
  };
  return Row{{make<D, Sum>(), make<D, Min>(), make<D, Max>()}};
}

constexpr KernelTable make_table() {
  // Dtype wire values: fp32 1, fp16 2, bf16 3, int32 4, int64 5, fp64 6.
  static_assert(
      static_cast<int>(wire::Dtype::fp32) == 1 && static_cast<int>(wire::Dtype::fp16) == 2 &&
      static_cast<int>(wire::Dtype::bf16) == 3 && static_cast<int>(wire::Dtype::int32) == 4 &&
      static_cast<int>(wire::Dtype::int64) == 5 && static_cast<int>(wire::Dtype::fp64) == 6);
  KernelTable t{};
  const auto set = [&t](size_t d, const auto& r) {
    for (size_t o = 0; o < kNumOps; ++o) t.k[d][o] = r.k[o];
  };
  set(0, row<Fp32>());
  set(1, row<Fp16>());
  set(2, row<Bf16>());
  set(3, row<Int32>());
  set(4, row<Int64>());
  set(5, row<Fp64>());
  return t;
}

constexpr KernelTable kTable = make_table();

}  // namespace

const KernelTable& table() noexcept { return kTable; }

}  // namespace netreduce::reduce::detail::NETREDUCE_REDUCE_NS
