// Element-wise scaling of avg and the pre-multiplied sum (scale.h).
#include "host-lib/scale.h"

#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "reduce/reduce.h"

namespace netreduce::host {
namespace {

// Applies f to each of count elements of type T (unaligned buffers).
template <typename T, typename F>
void each(const void* src, void* dst, size_t count, F f) noexcept {
  const auto* s = static_cast<const uint8_t*>(src);
  auto* d = static_cast<uint8_t*>(dst);
  for (size_t i = 0; i < count; ++i) {
    T x;
    std::memcpy(&x, s + i * sizeof(T), sizeof(T));
    x = f(x);
    std::memcpy(d + i * sizeof(T), &x, sizeof(T));
  }
}

// The same for fp16/bf16, through float: widen, f in float, round back.
template <typename F>
void each_half(const void* src, void* dst, size_t count, DataType t, F f) noexcept {
  const bool fp16 = t == DataType::fp16;
  each<uint16_t>(src, dst, count, [&](uint16_t h) {
    const float x = fp16 ? reduce::fp16_to_float(h) : reduce::bf16_to_float(h);
    return fp16 ? reduce::float_to_fp16(f(x)) : reduce::float_to_bf16(f(x));
  });
}

// x * f modulo 2^bits (the sum wraps the same way).
template <typename T>
T wrapping_multiply(T x, T f) noexcept {
  using U = std::make_unsigned_t<T>;
  return static_cast<T>(static_cast<U>(static_cast<U>(x) * static_cast<U>(f)));
}

// The least magnitude a double rounds up to a float infinity from: FLT_MAX
// plus half its ulp (a tie, rounded to the even infinity).
constexpr double kFloatOverflow = 0x1.ffffffp127;

template <typename T>
bool integer_of(double f) {
  // [-2^(bits-1), 2^(bits-1)): both ends exact in double.
  const double lo = static_cast<double>(std::numeric_limits<T>::min());
  return f == std::trunc(f) && f >= lo && f < -lo;
}

}  // namespace

Error check_factor(double factor, DataType t) {
  const auto refuse = [&](const char* why) {
    return Error::make(ErrorCode::invalid_argument, fmt::format("factor: {} {}", factor, why));
  };
  if (!std::isfinite(factor)) return refuse("is not a finite number");
  switch (t) {
    case DataType::fp64:
      return {};
    case DataType::fp32:
    case DataType::fp16:
    case DataType::bf16:  // multiplied in float
      if (std::fabs(factor) >= kFloatOverflow)
        return refuse("is past float's range (the type multiplies in float)");
      return {};
    case DataType::int32:
      if (!integer_of<int32_t>(factor)) return refuse("is not an integer of int32");
      return {};
    case DataType::int64:
      if (!integer_of<int64_t>(factor)) return refuse("is not an integer of int64");
      return {};
  }
  return Error::make(ErrorCode::invalid_argument, "dtype: not a data type");
}

void divide_elements(void* buf, size_t count, DataType t, unsigned world) noexcept {
  switch (t) {
    case DataType::fp64:
      return each<double>(buf, buf, count, [p = double(world)](double x) { return x / p; });
    case DataType::fp32:
      return each<float>(buf, buf, count, [p = float(world)](float x) { return x / p; });
    case DataType::fp16:
    case DataType::bf16:
      return each_half(buf, buf, count, t, [p = float(world)](float x) { return x / p; });
    case DataType::int32:
      return each<int32_t>(buf, buf, count, [p = int32_t(world)](int32_t x) { return x / p; });
    case DataType::int64:
      return each<int64_t>(buf, buf, count, [p = int64_t(world)](int64_t x) { return x / p; });
  }
}

void multiply_elements(const void* src, void* dst, size_t count, DataType t,
                       double factor) noexcept {
  switch (t) {
    case DataType::fp64:
      return each<double>(src, dst, count, [factor](double x) { return x * factor; });
    case DataType::fp32:
      return each<float>(src, dst, count, [f = float(factor)](float x) { return x * f; });
    case DataType::fp16:
    case DataType::bf16:
      return each_half(src, dst, count, t, [f = float(factor)](float x) { return x * f; });
    case DataType::int32:
      return each<int32_t>(src, dst, count,
                           [f = int32_t(factor)](int32_t x) { return wrapping_multiply(x, f); });
    case DataType::int64:
      return each<int64_t>(src, dst, count,
                           [f = int64_t(factor)](int64_t x) { return wrapping_multiply(x, f); });
  }
}

}  // namespace netreduce::host
