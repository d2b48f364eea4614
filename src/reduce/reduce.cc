// ISA dispatch, buffer sizes and the public scalar conversions.
#include "reduce/reduce.h"

#include "reduce/convert_impl.h"
#include "reduce/detail.h"

namespace netreduce::reduce {

std::string_view to_string(Isa isa) noexcept {
  switch (isa) {
    case Isa::scalar:
      return "scalar";
    case Isa::avx2:
      return "avx2";
    case Isa::avx512:
      return "avx512";
  }
  return "invalid";
}

bool isa_supported(Isa isa) noexcept {
  switch (isa) {
    case Isa::scalar:
      return true;
    case Isa::avx2:
#if NETREDUCE_REDUCE_X86
      __builtin_cpu_init();
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
#else
      return false;
#endif
    case Isa::avx512:
#if NETREDUCE_REDUCE_X86
      __builtin_cpu_init();
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
#else
      return false;
#endif
  }
  return false;
}

Isa best_isa() noexcept {
  if (isa_supported(Isa::avx512)) return Isa::avx512;
  if (isa_supported(Isa::avx2)) return Isa::avx2;
  return Isa::scalar;
}

const Kernels& kernels(Isa isa, wire::Dtype dtype, wire::ReduceOp op) noexcept {
  static constexpr Kernels kNone{};
  const size_t d = static_cast<size_t>(dtype) - 1;
  const size_t o = static_cast<size_t>(op) - 1;
  if (d >= detail::kNumDtypes || o >= detail::kNumOps) return kNone;
  const detail::KernelTable* t = &detail::isa_scalar::table();
#if NETREDUCE_REDUCE_X86
  if (isa == Isa::avx512 && isa_supported(Isa::avx512)) t = &detail::isa_avx512::table();
  if (isa == Isa::avx2 && isa_supported(Isa::avx2)) t = &detail::isa_avx2::table();
#else
  (void)isa;
#endif
  return t->k[d][o];
}

size_t accum_bytes(wire::Dtype dtype, size_t elems) noexcept {
  if (dtype == wire::Dtype::fp16 || dtype == wire::Dtype::bf16) return 4 * elems;
  return wire::dtype_size(dtype) * elems;
}

float bf16_to_float(uint16_t h) noexcept { return detail::bf16_widen(h); }
uint16_t float_to_bf16(float f) noexcept { return detail::bf16_narrow(f); }
float fp16_to_float(uint16_t h) noexcept { return detail::fp16_widen(h); }
uint16_t float_to_fp16(float f) noexcept { return detail::fp16_narrow(f); }

}  // namespace netreduce::reduce
