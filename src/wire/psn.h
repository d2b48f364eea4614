// Sequence-number arithmetic.
//
// RoCE PSNs are 24-bit and wrap: every comparison and difference is modulo
// 2^24, with "a is before b" meaning b - a lies in (0, 2^23) (serial-number
// arithmetic, RFC 1982). INA message ids are 32-bit and use the same rule
// modulo 2^32.
#pragma once

#include <cstdint>

namespace netreduce::wire {

inline constexpr uint32_t kPsnBits = 24;
inline constexpr uint32_t kPsnMask = (1u << kPsnBits) - 1;

constexpr uint32_t psn_add(uint32_t psn, uint32_t n) noexcept { return (psn + n) & kPsnMask; }
constexpr uint32_t psn_sub(uint32_t psn, uint32_t n) noexcept { return (psn - n) & kPsnMask; }
// Distance from `from` forward to `to`, in [0, 2^24).
constexpr uint32_t psn_distance(uint32_t from, uint32_t to) noexcept {
  return (to - from) & kPsnMask;
}
// True if `a` comes strictly before `b` in serial order.
constexpr bool psn_before(uint32_t a, uint32_t b) noexcept {
  uint32_t d = psn_distance(a, b);
  return d != 0 && d < (1u << (kPsnBits - 1));
}
// True if `psn` lies in [first, first + len) modulo 2^24.
constexpr bool psn_in_range(uint32_t psn, uint32_t first, uint32_t len) noexcept {
  return psn_distance(first, psn) < len;
}

// Serial comparison of 32-bit message ids: true if `a` is strictly before `b`.
constexpr bool msg_before(uint32_t a, uint32_t b) noexcept {
  return static_cast<int32_t>(a - b) < 0;
}

}  // namespace netreduce::wire
