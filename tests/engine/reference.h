// Reference reduction for the simulator and tests, written independently of
// src/reduce: plain loops, the compiler's _Float16 for fp16, a textbook
// round-to-nearest-even for bf16, IEEE 754-2019 minimum/maximum, rank order,
// canonical quiet NaN results (the semantics documented in reduce/reduce.h).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "wire/ina.h"

namespace netreduce::ref {

inline float bf16_widen(uint16_t h) {
  const uint32_t u = uint32_t{h} << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint16_t bf16_narrow(float f) {
  if (std::isnan(f)) return 0x7FC0;
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t lsb = (u >> 16) & 1;
  return static_cast<uint16_t>((u + 0x7FFF + lsb) >> 16);
}
inline float fp16_widen(uint16_t h) {
  _Float16 x;
  std::memcpy(&x, &h, 2);
  return static_cast<float>(x);
}
inline uint16_t fp16_narrow(float f) {
  if (std::isnan(f)) return 0x7E00;
  const _Float16 x = static_cast<_Float16>(f);
  uint16_t h;
  std::memcpy(&h, &x, 2);
  return h;
}

template <typename T>
T fop(wire::ReduceOp op, T a, T b) {
  if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<T>::quiet_NaN();
  switch (op) {
    case wire::ReduceOp::sum:
      return a + b;
    case wire::ReduceOp::min:
      if (a == b) return std::signbit(a) ? a : b;
      return a < b ? a : b;
    case wire::ReduceOp::max:
      if (a == b) return std::signbit(a) ? b : a;
      return a > b ? a : b;
  }
  return a;
}
template <typename T>
T iop(wire::ReduceOp op, T a, T b) {
  using U = std::make_unsigned_t<T>;
  switch (op) {
    case wire::ReduceOp::sum:
      return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
    case wire::ReduceOp::min:
      return a < b ? a : b;
    case wire::ReduceOp::max:
      return a > b ? a : b;
  }
  return a;
}
template <typename T>
T canon(T v) {
  return std::isnan(v) ? std::numeric_limits<T>::quiet_NaN() : v;
}

// out = reduction of inputs[0..n) in rank order; every input has `bytes` bytes.
inline void reduce(wire::Dtype dt, wire::ReduceOp op, const std::vector<const uint8_t*>& in,
                   size_t bytes, uint8_t* out) {
  const size_t es = wire::dtype_size(dt);
  for (size_t i = 0; i < bytes / es; ++i) {
    auto load = [&](size_t r, auto& v) { std::memcpy(&v, in[r] + i * es, sizeof(v)); };
    auto store = [&](auto v) { std::memcpy(out + i * es, &v, sizeof(v)); };
    switch (dt) {
      case wire::Dtype::fp32: {
        float a, b;
        load(0, a);
        for (size_t r = 1; r < in.size(); ++r) load(r, b), a = fop(op, a, b);
        store(canon(a));
        break;
      }
      case wire::Dtype::fp64: {
        double a, b;
        load(0, a);
        for (size_t r = 1; r < in.size(); ++r) load(r, b), a = fop(op, a, b);
        store(canon(a));
        break;
      }
      case wire::Dtype::fp16:
      case wire::Dtype::bf16: {
        const bool half = dt == wire::Dtype::fp16;
        uint16_t h;
        load(0, h);
        float a = half ? fp16_widen(h) : bf16_widen(h);
        for (size_t r = 1; r < in.size(); ++r)
          load(r, h), a = fop(op, a, half ? fp16_widen(h) : bf16_widen(h));
        store(half ? fp16_narrow(a) : bf16_narrow(a));
        break;
      }
      case wire::Dtype::int32: {
        int32_t a, b;
        load(0, a);
        for (size_t r = 1; r < in.size(); ++r) load(r, b), a = iop(op, a, b);
        store(a);
        break;
      }
      case wire::Dtype::int64: {
        int64_t a, b;
        load(0, a);
        for (size_t r = 1; r < in.size(); ++r) load(r, b), a = iop(op, a, b);
        store(a);
        break;
      }
    }
  }
}

}  // namespace netreduce::ref
