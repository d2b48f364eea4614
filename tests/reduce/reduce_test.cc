// Reduction kernels against an independent reference written here with plain
// loops (no library code): every dtype x op x available ISA x rank count x
// length, on random inputs full of special values (NaN, inf, -0, subnormals,
// overflowing magnitudes, INT_MIN/INT_MAX), with unaligned sources and
// destination. Every ISA must give the reference's bytes, accumulate mode fed
// in rank order must give the same bytes as reduce, and in-place reduction
// (dst == a source) must too. Bytes around dst must stay untouched.
#include "reduce/reduce.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <vector>

using netreduce::wire::Dtype;
using netreduce::wire::ReduceOp;
namespace nr = netreduce::reduce;

namespace {

constexpr Dtype kDtypes[] = {Dtype::fp32,  Dtype::fp16,  Dtype::bf16,
                             Dtype::int32, Dtype::int64, Dtype::fp64};
constexpr ReduceOp kOps[] = {ReduceOp::sum, ReduceOp::min, ReduceOp::max};
constexpr nr::Isa kIsas[] = {nr::Isa::scalar, nr::Isa::avx2, nr::Isa::avx512};
// The brief's 1, 2, 3, 4, 8, 16, 64, plus every remainder of the kernels'
// groups of 4 ranks (5, 6, 7, 9, 13).
constexpr unsigned kRanks[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 16, 64};
constexpr size_t kElems[] = {0, 1, 7, 8, 9, 255, 256, 257, 1024, 2048};

// ---- independent reference -------------------------------------------------

template <class T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <class T>
void store(uint8_t* p, T v) {
  std::memcpy(p, &v, sizeof v);
}

// Decodes a binary16/bfloat16 pattern from its fields.
float decode16(uint16_t h, int mbits, int ebits) {
  const int bias = (1 << (ebits - 1)) - 1;
  const int e = (h >> mbits) & ((1 << ebits) - 1);
  const int m = h & ((1 << mbits) - 1);
  const bool neg = (h >> (mbits + ebits)) & 1;
  double v;
  if (e == (1 << ebits) - 1)
    v = m ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  else if (e == 0)
    v = std::ldexp(static_cast<double>(m), 1 - bias - mbits);
  else
    v = std::ldexp(static_cast<double>((1 << mbits) + m), e - bias - mbits);
  return static_cast<float>(neg ? -v : v);
}

// Rounds a float to binary16/bfloat16, nearest even, in double arithmetic:
// scale so the kept significand is an integer, std::nearbyint (the default
// rounding mode is to nearest even), rebuild. NaN -> the canonical quiet NaN.
uint16_t encode16(float f, int mbits, int ebits) {
  const int bias = (1 << (ebits - 1)) - 1;
  const uint16_t exp_all = static_cast<uint16_t>(((1 << ebits) - 1) << mbits);
  if (std::isnan(f)) return static_cast<uint16_t>(exp_all | (1 << (mbits - 1)));
  const uint16_t sign = std::signbit(f) ? static_cast<uint16_t>(1u << (mbits + ebits)) : 0;
  const double x = std::fabs(static_cast<double>(f));
  if (std::isinf(x)) return sign | exp_all;
  if (x == 0) return sign;
  int e = std::ilogb(x);
  if (e < 1 - bias) e = 1 - bias;
  double q = std::nearbyint(std::ldexp(x, mbits - e));
  if (q >= std::ldexp(1.0, mbits + 1)) {
    q /= 2;
    ++e;
  }
  if (e > bias) return sign | exp_all;
  const auto qi = static_cast<uint32_t>(q);
  if (qi < (1u << mbits)) return static_cast<uint16_t>(sign | qi);  // subnormal
  return static_cast<uint16_t>(sign | ((e + bias) << mbits) | (qi - (1u << mbits)));
}

// IEEE 754-2019 minimum/maximum, spelled out.
template <class T>
T ref_min(T a, T b) {
  if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<T>::quiet_NaN();
  if (a == 0 && b == 0) return (std::signbit(a) || std::signbit(b)) ? T(-0.0) : T(0.0);
  return a < b ? a : b;
}
template <class T>
T ref_max(T a, T b) {
  if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<T>::quiet_NaN();
  if (a == 0 && b == 0) return (std::signbit(a) && std::signbit(b)) ? T(-0.0) : T(0.0);
  return a > b ? a : b;
}
template <class T>
T ref_float_op(ReduceOp op, T a, T b) {
  switch (op) {
    case ReduceOp::sum:
      return a + b;
    case ReduceOp::min:
      return ref_min(a, b);
    case ReduceOp::max:
      return ref_max(a, b);
  }
  return a;
}
template <class I>
I ref_int_op(ReduceOp op, I a, I b) {
  using U = std::make_unsigned_t<I>;
  switch (op) {
    case ReduceOp::sum:
      return static_cast<I>(static_cast<U>(a) + static_cast<U>(b));
    case ReduceOp::min:
      return b < a ? b : a;
    case ReduceOp::max:
      return b > a ? b : a;
  }
  return a;
}

// Reference reduction of element i over the ranks, written to out.
void ref_element(Dtype dt, ReduceOp op, const std::vector<const uint8_t*>& srcs, size_t i,
                 uint8_t* out) {
  const size_t sz = netreduce::wire::dtype_size(dt);
  switch (dt) {
    case Dtype::fp32: {
      float acc = load<float>(srcs[0] + i * sz);
      for (size_t r = 1; r < srcs.size(); ++r)
        acc = ref_float_op(op, acc, load<float>(srcs[r] + i * sz));
      if (std::isnan(acc)) return store<uint32_t>(out, 0x7FC00000u);
      return store(out, acc);
    }
    case Dtype::fp64: {
      double acc = load<double>(srcs[0] + i * sz);
      for (size_t r = 1; r < srcs.size(); ++r)
        acc = ref_float_op(op, acc, load<double>(srcs[r] + i * sz));
      if (std::isnan(acc)) return store<uint64_t>(out, 0x7FF8000000000000ull);
      return store(out, acc);
    }
    case Dtype::fp16:
    case Dtype::bf16: {
      const int mbits = dt == Dtype::fp16 ? 10 : 7;
      const int ebits = dt == Dtype::fp16 ? 5 : 8;
      float acc = decode16(load<uint16_t>(srcs[0] + i * sz), mbits, ebits);
      for (size_t r = 1; r < srcs.size(); ++r)
        acc = ref_float_op(op, acc, decode16(load<uint16_t>(srcs[r] + i * sz), mbits, ebits));
      return store(out, encode16(acc, mbits, ebits));
    }
    case Dtype::int32: {
      int32_t acc = load<int32_t>(srcs[0] + i * sz);
      for (size_t r = 1; r < srcs.size(); ++r)
        acc = ref_int_op(op, acc, load<int32_t>(srcs[r] + i * sz));
      return store(out, acc);
    }
    case Dtype::int64: {
      int64_t acc = load<int64_t>(srcs[0] + i * sz);
      for (size_t r = 1; r < srcs.size(); ++r)
        acc = ref_int_op(op, acc, load<int64_t>(srcs[r] + i * sz));
      return store(out, acc);
    }
  }
}

// ---- inputs ----------------------------------------------------------------

// Bit patterns of the special values of each dtype.
std::vector<uint64_t> specials(Dtype dt) {
  switch (dt) {
    case Dtype::fp32:
      return {
          0x00000000, 0x80000000, 0x7F800000, 0xFF800000,  // +-0, +-inf
          0x7FC00000, 0xFFC00000, 0x7FC12345, 0x7F800001,  // NaNs (quiet, -, payload, signaling)
          0x00000001, 0x807FFFFF, 0x00800000,              // subnormals, min normal
          0x7F7FFFFF, 0xFF7FFFFF, 0x7F000000, 0xFEFFFFFF,  // huge: sums overflow
          0x3F800000, 0xBF800000, 0x33800000};
    case Dtype::fp64:
      return {0x0000000000000000, 0x8000000000000000, 0x7FF0000000000000, 0xFFF0000000000000,
              0x7FF8000000000000, 0xFFF8000000000000, 0x7FF8000012345678, 0x7FF0000000000001,
              0x0000000000000001, 0x800FFFFFFFFFFFFF, 0x0010000000000000, 0x7FEFFFFFFFFFFFFF,
              0xFFEFFFFFFFFFFFFF, 0x7FE0000000000000, 0x3FF0000000000000, 0xBFF0000000000000};
    case Dtype::fp16:
      return {0x0000, 0x8000, 0x7C00, 0xFC00, 0x7E00, 0xFE00, 0x7E55, 0x7C01,  // 0, inf, NaN
              0x0001, 0x83FF, 0x0200, 0x0400, 0x8400,           // subnormal, min normal
              0x7BFF, 0xFBFF, 0x7800, 0x3C00, 0xBC00, 0x1400};  // max, 1, 2^-10
    case Dtype::bf16:
      return {0x0000, 0x8000, 0x7F80, 0xFF80, 0x7FC0, 0xFFC0, 0x7FD5, 0x7F81,  // 0, inf, NaN
              0x0001, 0x807F, 0x0080,  // subnormal, min normal
              0x7F7F, 0xFF7F, 0x7F00, 0x3F80, 0xBF80, 0x3B80};
    case Dtype::int32:
      return {0x80000000, 0x7FFFFFFF, 0xFFFFFFFF, 0, 1, 0x80000001, 0x7FFFFFFE};
    case Dtype::int64:
      return {0x8000000000000000, 0x7FFFFFFFFFFFFFFF, 0xFFFFFFFFFFFFFFFF, 0, 1, 0x8000000000000001};
  }
  return {};
}

// A value of moderate magnitude, so that sums round and cancel.
uint64_t moderate(Dtype dt, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  std::uniform_int_distribution<int> ex(-12, 12);
  const double v = std::ldexp(u(rng), ex(rng));
  switch (dt) {
    case Dtype::fp32: {
      const auto f = static_cast<float>(v * 1000);
      uint32_t b;
      std::memcpy(&b, &f, 4);
      return b;
    }
    case Dtype::fp64: {
      uint64_t b;
      std::memcpy(&b, &v, 8);
      return b;
    }
    case Dtype::fp16:
      return encode16(static_cast<float>(v * 8), 10, 5);
    case Dtype::bf16:
      return encode16(static_cast<float>(v * 8), 7, 8);
    case Dtype::int32:
    case Dtype::int64:
      return static_cast<uint64_t>(static_cast<int64_t>(v * 100000));
  }
  return 0;
}

// A value near or in the subnormal range of the dtype (fp16/bf16 results
// that round in the subnormal range; fp32/fp64 sums of subnormals).
uint64_t tiny(Dtype dt, std::mt19937_64& rng) {
  const uint64_t r = rng();
  const uint64_t sign = r >> 63;
  switch (dt) {
    case Dtype::fp32:
      return (sign << 31) | (r & 0x00FFFFFF);  // exponent field 0 or 1
    case Dtype::fp64:
      return (sign << 63) | (r & 0x001FFFFFFFFFFFFF);
    case Dtype::fp16:
      return (sign << 15) | (r & 0x07FF);  // exponent field 0, 1
    case Dtype::bf16:
      return (sign << 15) | (r & 0x00FF);
    case Dtype::int32:
    case Dtype::int64:
      return r % 16;
  }
  return 0;
}

// Fills elems elements: specials with probability p_special (scaled down for
// many ranks so that not every column is NaN), values from a small pool shared
// by all ranks (equal values and +-0 ties for min/max), random bit patterns,
// tiny values (subnormal results) and moderate values.
void fill(Dtype dt, std::mt19937_64& rng, uint8_t* p, size_t elems, double p_special,
          const std::vector<uint64_t>& pool) {
  const size_t sz = netreduce::wire::dtype_size(dt);
  const std::vector<uint64_t> sp = specials(dt);
  std::uniform_real_distribution<double> u(0, 1);
  for (size_t i = 0; i < elems; ++i) {
    const double c = u(rng);
    uint64_t bits;
    if (c < p_special)
      bits = sp[rng() % sp.size()];
    else if (c < p_special + 0.2)
      bits = pool[rng() % pool.size()];
    else if (c < p_special + 0.3)
      bits = rng();
    else if (c < p_special + 0.4)
      bits = tiny(dt, rng);
    else
      bits = moderate(dt, rng);
    std::memcpy(p + i * sz, &bits, sz);  // little endian: the low sz bytes
  }
}

// A buffer whose data() is `offset` bytes past a 64-byte boundary, with
// guard bytes around it.
struct Buf {
  static constexpr size_t kGuard = 64;
  std::vector<uint8_t> mem;
  size_t off, len;
  Buf(size_t len_, size_t offset) : mem(len_ + 2 * kGuard + 128, 0xA5), len(len_) {
    const auto base = reinterpret_cast<uintptr_t>(mem.data());
    const uintptr_t aligned = (base + kGuard + 63) & ~uintptr_t{63};
    off = aligned - base + offset;
  }
  uint8_t* data() { return mem.data() + off; }
  bool guards_intact() const {
    for (size_t i = 0; i < mem.size(); ++i)
      if ((i < off || i >= off + len) && mem[i] != 0xA5) return false;
    return true;
  }
};

std::string hex(const uint8_t* p, size_t n) {
  static const char* d = "0123456789abcdef";
  std::string s;
  for (size_t i = n; i-- > 0;) {  // little endian -> most significant first
    s += d[p[i] >> 4];
    s += d[p[i] & 15];
  }
  return s;
}

// First differing element, or SIZE_MAX.
size_t first_diff(const uint8_t* a, const uint8_t* b, size_t elems, size_t sz) {
  if (std::memcmp(a, b, elems * sz) == 0) return SIZE_MAX;
  for (size_t i = 0; i < elems; ++i)
    if (std::memcmp(a + i * sz, b + i * sz, sz) != 0) return i;
  return SIZE_MAX;
}

std::vector<nr::Isa> available_isas() {
  std::vector<nr::Isa> v;
  for (nr::Isa isa : kIsas)
    if (nr::isa_supported(isa)) v.push_back(isa);
  return v;
}

}  // namespace

TEST_CASE("every kernel on every ISA matches the reference, bit for bit", "[reduce]") {
  const std::vector<nr::Isa> isas = available_isas();
  std::mt19937_64 rng(20261122);
  size_t combos = 0, elements = 0;
  for (Dtype dt : kDtypes) {
    const size_t sz = netreduce::wire::dtype_size(dt);
    for (ReduceOp op : kOps) {
      for (unsigned n : kRanks) {
        for (size_t elems : kElems) {
          CAPTURE(to_string(dt), to_string(op), n, elems);
          // Pool shared by all ranks: a few moderate values, +-0 and specials.
          std::vector<uint64_t> pool;
          const std::vector<uint64_t> sp = specials(dt);
          for (int k = 0; k < 3; ++k) pool.push_back(moderate(dt, rng));
          pool.push_back(sp[0]);
          pool.push_back(sp[1]);
          pool.push_back(sp[rng() % sp.size()]);
          const double p_special = 0.2 / n + 0.005;

          std::vector<Buf> in;
          std::vector<const uint8_t*> srcs;
          in.reserve(n);
          for (unsigned r = 0; r < n; ++r) {
            in.emplace_back(elems * sz, rng() % 8);
            fill(dt, rng, in.back().data(), elems, p_special, pool);
          }
          for (auto& b : in) srcs.push_back(b.data());

          std::vector<uint8_t> expect(elems * sz + 1);
          for (size_t i = 0; i < elems; ++i) ref_element(dt, op, srcs, i, expect.data() + i * sz);

          for (nr::Isa isa : isas) {
            CAPTURE(to_string(isa));
            const nr::Kernels& k = nr::kernels(isa, dt, op);
            REQUIRE(k.reduce != nullptr);

            // reduce, unaligned dst
            Buf out(elems * sz, 1 + rng() % 7);
            k.reduce(srcs.data(), n, out.data(), elems);
            size_t bad = first_diff(out.data(), expect.data(), elems, sz);
            if (bad != SIZE_MAX) {
              std::string inputs;
              for (unsigned r = 0; r < n && r < 16; ++r)
                inputs += hex(srcs[r] + bad * sz, sz) + " ";
              FAIL_CHECK("reduce: element " << bad << " got " << hex(out.data() + bad * sz, sz)
                                            << " want " << hex(expect.data() + bad * sz, sz)
                                            << " inputs " << inputs);
            }
            CHECK(out.guards_intact());

            // accumulate mode, in rank order
            std::vector<uint64_t> acc((nr::accum_bytes(dt, elems) + 7) / 8 + 1);
            Buf out2(elems * sz, rng() % 8);
            k.init(acc.data(), srcs[0], elems);
            for (unsigned r = 1; r < n; ++r) k.add(acc.data(), srcs[r], elems);
            k.finish(acc.data(), out2.data(), elems);
            bad = first_diff(out2.data(), expect.data(), elems, sz);
            if (bad != SIZE_MAX)
              FAIL_CHECK("accumulate: element " << bad << " got " << hex(out2.data() + bad * sz, sz)
                                                << " want " << hex(expect.data() + bad * sz, sz));
            CHECK(out2.guards_intact());

            // in place: dst is the first or the last source
            const unsigned victim = (combos & 1) ? n - 1 : 0;
            Buf inplace(elems * sz, in[victim].off % 8);
            if (elems) std::memcpy(inplace.data(), srcs[victim], elems * sz);
            std::vector<const uint8_t*> srcs2 = srcs;
            srcs2[victim] = inplace.data();
            k.reduce(srcs2.data(), n, inplace.data(), elems);
            bad = first_diff(inplace.data(), expect.data(), elems, sz);
            if (bad != SIZE_MAX) FAIL_CHECK("in place (rank " << victim << "): element " << bad);
          }
          ++combos;
          elements += elems * n;
        }
      }
    }
  }
  CHECK(combos == std::size(kDtypes) * std::size(kOps) * std::size(kRanks) * std::size(kElems));
  WARN(combos << " dtype/op/ranks/length cases on " << isas.size() << " ISAs, " << elements
              << " input elements each");
}

TEST_CASE("semantics spelled out on hand-picked values", "[reduce]") {
  const auto run = [](Dtype dt, ReduceOp op, std::vector<std::vector<uint8_t>> ranks) {
    std::vector<const uint8_t*> srcs;
    for (auto& r : ranks) srcs.push_back(r.data());
    const size_t elems = ranks[0].size() / netreduce::wire::dtype_size(dt);
    std::vector<std::vector<uint8_t>> outs;
    for (nr::Isa isa : available_isas()) {
      std::vector<uint8_t> out(ranks[0].size());
      nr::kernels(isa, dt, op)
          .reduce(srcs.data(), static_cast<unsigned>(srcs.size()), out.data(), elems);
      outs.push_back(out);
    }
    for (auto& o : outs) CHECK(o == outs[0]);
    return outs[0];
  };
  const auto f32 = [](std::initializer_list<float> v) {
    std::vector<uint8_t> b(v.size() * 4);
    std::memcpy(b.data(), v.begin(), b.size());
    return b;
  };
  const auto bits32 = [](const std::vector<uint8_t>& b, size_t i) {
    return load<uint32_t>(b.data() + i * 4);
  };
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();

  // Rank order is kept: (1e8 + 1) - 1e8 = 0 in fp32, (1e8 - 1e8) + 1 = 1.
  auto s =
      run(Dtype::fp32, ReduceOp::sum, {f32({1e8f, 1e8f}), f32({1.f, -1e8f}), f32({-1e8f, 1.f})});
  CHECK(bits32(s, 0) == 0x00000000u);
  CHECK(bits32(s, 1) == 0x3F800000u);
  s = run(Dtype::fp32, ReduceOp::sum, {f32({1.f, inf, -nan}), f32({1e-8f, -inf, 1.f})});
  CHECK(bits32(s, 0) == 0x3F800000u);
  CHECK(bits32(s, 1) == 0x7FC00000u);  // inf - inf: canonical NaN
  CHECK(bits32(s, 2) == 0x7FC00000u);  // -NaN input: canonical (positive) NaN

  // min/max: NaN from any rank propagates; -0 < +0 in either order.
  auto m = run(Dtype::fp32, ReduceOp::min,
               {f32({1.f, 0.f, -0.f, 3.f}), f32({2.f, -0.f, 0.f, nan}), f32({nan, 0.f, 0.f, 1.f})});
  CHECK(bits32(m, 0) == 0x7FC00000u);
  CHECK(bits32(m, 1) == 0x80000000u);
  CHECK(bits32(m, 2) == 0x80000000u);
  CHECK(bits32(m, 3) == 0x7FC00000u);
  m = run(Dtype::fp32, ReduceOp::max, {f32({1.f, 0.f, -0.f, -0.f}), f32({2.f, -0.f, 0.f, -0.f})});
  CHECK(bits32(m, 0) == 0x40000000u);
  CHECK(bits32(m, 1) == 0x00000000u);
  CHECK(bits32(m, 2) == 0x00000000u);
  CHECK(bits32(m, 3) == 0x80000000u);

  // Integers wrap.
  std::vector<uint8_t> a(4), b(4);
  store<int32_t>(a.data(), std::numeric_limits<int32_t>::max());
  store<int32_t>(b.data(), 1);
  CHECK(load<int32_t>(run(Dtype::int32, ReduceOp::sum, {a, b}).data()) ==
        std::numeric_limits<int32_t>::min());

  // fp16: reduced in fp32, rounded once: 2048 + 1 + 1 = 2050 (rounding after
  // every add would give 2048, since 2049 is a tie that rounds to even).
  std::vector<uint8_t> h0(2), h1(2);
  store<uint16_t>(h0.data(), 0x6800);  // 2048
  store<uint16_t>(h1.data(), 0x3C00);  // 1
  CHECK(load<uint16_t>(run(Dtype::fp16, ReduceOp::sum, {h0, h1, h1}).data()) == 0x6801);
  CHECK(load<uint16_t>(run(Dtype::fp16, ReduceOp::sum, {h0, h1}).data()) == 0x6800);  // tie -> even
  store<uint16_t>(h0.data(), 0x7BFF);  // 65504 + 65504 overflows to inf
  CHECK(load<uint16_t>(run(Dtype::fp16, ReduceOp::sum, {h0, h0}).data()) == 0x7C00);
}

TEST_CASE("16-bit conversions match the independent encoder and decoder", "[reduce][convert]") {
  // Widening: all 65536 patterns. NaN sign and payload are kept; an fp16 NaN
  // becomes quiet (as F16C does), a bf16 NaN is kept bit for bit.
  for (uint32_t h = 0; h < 65536; ++h) {
    const auto h16 = static_cast<uint16_t>(h);
    const float want16 = decode16(h16, 10, 5), got16 = nr::fp16_to_float(h16);
    const float wantb = decode16(h16, 7, 8), gotb = nr::bf16_to_float(h16);
    uint32_t g16, w16, gb, wb;
    std::memcpy(&g16, &got16, 4);
    std::memcpy(&w16, &want16, 4);
    std::memcpy(&gb, &gotb, 4);
    std::memcpy(&wb, &wantb, 4);
    if (std::isnan(want16)) w16 = ((h & 0x8000u) << 16) | 0x7FC00000u | ((h & 0x3FFu) << 13);
    if (std::isnan(wantb)) wb = h << 16;
    if (g16 != w16) FAIL("fp16 " << h << " -> " << g16 << " want " << w16);
    if (gb != wb) FAIL("bf16 " << h << " -> " << gb << " want " << wb);
  }
  // Narrowing: the neighbourhood of every 16-bit value and its ties, plus
  // random patterns. NaN keeps sign and top payload and becomes quiet.
  std::vector<uint32_t> inputs;
  for (uint32_t h = 0; h < 0x7C00; ++h) {
    const float v = decode16(static_cast<uint16_t>(h), 10, 5);
    const float nxt = decode16(static_cast<uint16_t>(h + 1), 10, 5);
    const auto mid = static_cast<float>((static_cast<double>(v) + nxt) / 2);
    for (float x : {v, mid}) {
      uint32_t b;
      std::memcpy(&b, &x, 4);
      for (uint32_t d : {b - 1, b, b + 1}) inputs.push_back(d);
    }
  }
  for (uint32_t b = 0; b < 0x7F80; ++b)
    for (uint32_t d : {(b << 16) - 1, b << 16, (b << 16) | 0x8000u, ((b << 16) | 0x8000u) + 1})
      inputs.push_back(d);
  std::mt19937 rng(7);
  for (int i = 0; i < 100000; ++i) inputs.push_back(static_cast<uint32_t>(rng()));
  for (uint32_t b : inputs) {
    for (uint32_t x : {b, b ^ 0x80000000u}) {
      float f;
      std::memcpy(&f, &x, 4);
      const bool nan = std::isnan(f);
      const uint32_t w16 =
          nan ? ((x >> 16) & 0x8000u) | 0x7E00u | ((x >> 13) & 0x3FFu) : encode16(f, 10, 5);
      const uint32_t wb = nan ? (x >> 16) | 0x0040u : encode16(f, 7, 8);
      if (nr::float_to_fp16(f) != w16)
        FAIL("fp32 " << x << " -> fp16 " << nr::float_to_fp16(f) << " want " << w16);
      if (nr::float_to_bf16(f) != wb)
        FAIL("fp32 " << x << " -> bf16 " << nr::float_to_bf16(f) << " want " << wb);
    }
  }
}

TEST_CASE("dispatch, sizes and names", "[reduce]") {
  CHECK(nr::isa_supported(nr::Isa::scalar));
  CHECK(nr::isa_supported(nr::best_isa()));
  CHECK(nr::to_string(nr::Isa::scalar) == "scalar");
  CHECK(nr::to_string(nr::Isa::avx2) == "avx2");
  CHECK(nr::to_string(nr::Isa::avx512) == "avx512");
  if (nr::isa_supported(nr::Isa::avx512)) CHECK(nr::isa_supported(nr::Isa::avx2));
  WARN("best ISA: " << nr::to_string(nr::best_isa()));
  for (Dtype dt : kDtypes) {
    const size_t want =
        (dt == Dtype::fp16 || dt == Dtype::bf16) ? 4 : netreduce::wire::dtype_size(dt);
    CHECK(nr::accum_bytes(dt, 100) == 100 * want);
    for (ReduceOp op : kOps) {
      const nr::Kernels& s = nr::kernels(nr::Isa::scalar, dt, op);
      CHECK((s.reduce && s.init && s.add && s.finish));
      for (nr::Isa isa : kIsas) {
        const nr::Kernels& k = nr::kernels(isa, dt, op);
        if (!nr::isa_supported(isa)) CHECK(&k == &s);
        if (isa != nr::Isa::scalar && nr::isa_supported(isa)) CHECK(k.reduce != s.reduce);
      }
    }
  }
  const nr::Kernels& bad = nr::kernels(nr::Isa::scalar, static_cast<Dtype>(0), ReduceOp::sum);
  CHECK(bad.reduce == nullptr);
  CHECK(nr::kernels(nr::Isa::avx2, static_cast<Dtype>(7), ReduceOp::sum).reduce == nullptr);
  CHECK(nr::kernels(nr::Isa::avx2, Dtype::fp32, static_cast<ReduceOp>(4)).reduce == nullptr);
  CHECK(nr::accum_bytes(static_cast<Dtype>(9), 10) == 0);
}
