// The scalar build of the reduction kernels (flags in meson.build).
#define NETREDUCE_REDUCE_NS isa_scalar
#include "reduce/kernels_impl.h"
