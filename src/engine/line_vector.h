// LineVector: a std::vector whose storage owns whole cache lines.
//
// Every table the packet path writes (CLT slots, ring cells, histories,
// held records, results, the shift cache, the ring slots) is allocated per
// Engine, and an Engine belongs to one worker. With plain operator new two
// workers' tables may meet inside one 64-byte line (the end of one
// allocation, the start of the next), and the line would bounce between
// their cores although no datum is shared. LineAllocator starts every
// allocation on a line boundary and rounds its size up to whole lines, so a
// line of a LineVector holds that vector's elements and nothing else.
#pragma once

#include <cstddef>
#include <new>
#include <vector>

namespace netreduce::engine::detail {

inline constexpr size_t kCacheLine = 64;

template <class T>
struct LineAllocator {
  using value_type = T;
  LineAllocator() noexcept = default;
  template <class U>
  LineAllocator(const LineAllocator<U>&) noexcept {}
  static size_t bytes(size_t n) noexcept {
    return (n * sizeof(T) + kCacheLine - 1) & ~(kCacheLine - 1);
  }
  T* allocate(size_t n) {
    return static_cast<T*>(::operator new (bytes(n), std::align_val_t{kCacheLine}));
  }
  void deallocate(T* p, size_t n) noexcept {
    ::operator delete (p, bytes(n), std::align_val_t{kCacheLine});
  }
  template <class U>
  bool operator==(const LineAllocator<U>&) const noexcept {
    return true;
  }
};

template <class T>
using LineVector = std::vector<T, LineAllocator<T>>;

}  // namespace netreduce::engine::detail
