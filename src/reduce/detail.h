// Internal: the per-ISA kernel tables that reduce.cc dispatches between.
#pragma once

#include <cstddef>

#include "reduce/reduce.h"

namespace netreduce::reduce::detail {

inline constexpr size_t kNumDtypes = 6;  // wire values 1..6
inline constexpr size_t kNumOps = 3;     // wire values 1..3

// k[dtype wire value - 1][op wire value - 1]
struct KernelTable {
  Kernels k[kNumDtypes][kNumOps];
};

// One per kernel translation unit (kernels_<isa>.cc, kernels_impl.h).
namespace isa_scalar {
const KernelTable& table() noexcept;
}
namespace isa_avx2 {
const KernelTable& table() noexcept;
}
namespace isa_avx512 {
const KernelTable& table() noexcept;
}

}  // namespace netreduce::reduce::detail
