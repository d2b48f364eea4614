// The avx2 build of the reduction kernels (flags in meson.build).
#define NETREDUCE_REDUCE_NS isa_avx2
#include "reduce/kernels_impl.h"
