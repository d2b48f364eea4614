// Strong big-endian integer types for wire headers.
//
// A `Be<T>` stores the bytes exactly as they appear on the wire and has
// alignment 1, so a header struct made of them can be overlaid on any byte
// offset of a frame (no misaligned loads: every access goes through memcpy,
// which compiles to a single load + bswap). There is no implicit conversion
// to or from host integers: call `.host()` / `Be<T>::from_host()`.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace netreduce::wire {

template <typename T>
constexpr T byteswap(T v) noexcept {
  static_assert(std::is_unsigned_v<T>);
  if constexpr (sizeof(T) == 1) {
    return v;
  } else if constexpr (sizeof(T) == 2) {
    return static_cast<T>(__builtin_bswap16(v));
  } else if constexpr (sizeof(T) == 4) {
    return static_cast<T>(__builtin_bswap32(v));
  } else {
    static_assert(sizeof(T) == 8);
    return static_cast<T>(__builtin_bswap64(v));
  }
}

static_assert(std::endian::native == std::endian::little,
              "netreduce assumes a little-endian host (x86-64, aarch64)");

template <typename T>
class Be {
 public:
  static_assert(std::is_unsigned_v<T>);
  constexpr Be() noexcept = default;

  static Be from_host(T v) noexcept {
    Be b;
    b.set(v);
    return b;
  }
  T host() const noexcept {
    T raw;
    std::memcpy(&raw, bytes_, sizeof(T));
    return byteswap(raw);
  }
  void set(T v) noexcept {
    T raw = byteswap(v);
    std::memcpy(bytes_, &raw, sizeof(T));
  }
  friend bool operator==(const Be& a, const Be& b) noexcept {
    return std::memcmp(a.bytes_, b.bytes_, sizeof(T)) == 0;
  }

 private:
  unsigned char bytes_[sizeof(T)] = {};
};

// 24-bit big-endian field (BTH destination QP and PSN, AETH MSN).
class Be24 {
 public:
  constexpr Be24() noexcept = default;
  static Be24 from_host(uint32_t v) noexcept {
    Be24 b;
    b.set(v);
    return b;
  }
  uint32_t host() const noexcept {
    return (uint32_t{bytes_[0]} << 16) | (uint32_t{bytes_[1]} << 8) | bytes_[2];
  }
  void set(uint32_t v) noexcept {
    bytes_[0] = static_cast<unsigned char>(v >> 16);
    bytes_[1] = static_cast<unsigned char>(v >> 8);
    bytes_[2] = static_cast<unsigned char>(v);
  }

 private:
  unsigned char bytes_[3] = {};
};

using be16 = Be<uint16_t>;
using be32 = Be<uint32_t>;
using be64 = Be<uint64_t>;

static_assert(sizeof(be16) == 2 && alignof(be16) == 1);
static_assert(sizeof(be32) == 4 && alignof(be32) == 1);
static_assert(sizeof(be64) == 8 && alignof(be64) == 1);
static_assert(sizeof(Be24) == 3 && alignof(Be24) == 1);

}  // namespace netreduce::wire
