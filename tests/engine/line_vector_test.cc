// LineVector (src/engine/line_vector.h): every allocation starts on a cache
// line and owns whole lines, for any element size and count, so two
// engines' tables never share a line.
#include "engine/line_vector.h"

#include <catch2/catch.hpp>
#include <cstdint>
#include <vector>

#include "engine/cells.h"
#include "engine/clt.h"

using namespace netreduce::engine::detail;

namespace {
template <class T>
void check_lines(size_t n) {
  LineVector<T> v(n);
  const auto at = reinterpret_cast<uintptr_t>(v.data());
  CHECK(at % 64 == 0);
  CHECK(LineAllocator<T>::bytes(n) % 64 == 0);
  CHECK(LineAllocator<T>::bytes(n) >= n * sizeof(T));
  CHECK(LineAllocator<T>::bytes(n) < n * sizeof(T) + 64);
}
}  // namespace

TEST_CASE("LineVector allocations start on a line and own whole lines", "[line_vector]") {
  for (size_t n : {1, 3, 7, 63, 64, 65, 1000}) {
    check_lines<uint8_t>(n);
    check_lines<uint32_t>(n);
    check_lines<Cell>(n);
    check_lines<Clt::Slot>(n);
  }
  // Two vectors allocated back to back never share a line.
  LineVector<uint8_t> a(1), b(1);
  CHECK(reinterpret_cast<uintptr_t>(a.data()) / 64 != reinterpret_cast<uintptr_t>(b.data()) / 64);
  // Growth keeps the alignment, and the contents.
  LineVector<uint32_t> g;
  for (uint32_t i = 0; i < 1000; ++i) g.push_back(i);
  CHECK(reinterpret_cast<uintptr_t>(g.data()) % 64 == 0);
  for (uint32_t i = 0; i < 1000; ++i) REQUIRE(g[i] == i);
}
