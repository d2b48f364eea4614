// Op::avg and the pre-multiplied sums (src/host-lib/scale.h) through the
// loopback transport, on the INA path (the real engine as the box, rank
// order), on the ring path, striped, and with local ranks. The expected
// values are written here from the definitions: the sum of
// tests/engine/reference.h, then each element divided by P (avg) in the
// element's arithmetic, or each rank's input multiplied by the factor
// (premul) first; fp16/bf16 through reference.h's conversions (written apart
// from src/reduce). Where the sum's order is not rank order (the ring, local
// ranks) the inputs are small integers whose sums are exact in any order.
#include <cmath>
#include <cstring>

#include "fixture.h"
#include "host-lib/plan.h"
#include "host-lib/scale.h"

using namespace netreduce;
using namespace netreduce::host;
using namespace netreduce::host::testing;

namespace {

constexpr uint16_t kMsgLen = 2, kPmtu = 256, kWindow = 2;

struct Fabric {
  const char* name;
  LoopbackConfig cfg;
  bool rank_order;  // the sum is the rank-order one for any input
};

std::vector<Fabric> fabrics(unsigned P) {
  LoopbackConfig striped = box_fabric(P, kMsgLen, kWindow, kPmtu);
  striped.rings = 2;
  LoopbackConfig local = box_fabric(P, kMsgLen, kWindow, kPmtu);
  local.local_size = 2;  // P hosts of 2 local ranks: 2P ranks
  return {{"ina", box_fabric(P, kMsgLen, kWindow, kPmtu), true},
          {"ring", ring_fabric(P, 8192), false},
          {"ina 2 rings", striped, true},
          {"ina local", local, false}};
}

Options options() {
  Options o;
  o.window = kWindow;
  o.ring_buffer_bytes = 4096;
  return o;
}

// Odd counts around the box's message: 1, 3, one less and one more than a
// message, several messages and windows.
std::vector<size_t> counts(DataType t) {
  MessagePlan plan;
  REQUIRE(make_plan(1, t, kMsgLen, kPmtu, plan).ok());
  return {1, 3, plan.elems_per_msg - 1, plan.elems_per_msg + 1, 5 * plan.elems_per_msg + 3};
}

// Every element of v (type t) through the reference arithmetic: fd for
// fp64, ff for fp32 and (widened, then narrowed) fp16/bf16, fi for ints.
template <typename D, typename F, typename I>
std::vector<uint8_t> each(std::vector<uint8_t> v, DataType t, D fd, F ff, I fi) {
  const size_t es = element_size(t);
  for (uint8_t* p = v.data(); p < v.data() + v.size(); p += es) {
    switch (t) {
      case DataType::fp64: {
        double x;
        std::memcpy(&x, p, 8);
        x = fd(x);
        std::memcpy(p, &x, 8);
        break;
      }
      case DataType::fp32: {
        float x;
        std::memcpy(&x, p, 4);
        x = ff(x);
        std::memcpy(p, &x, 4);
        break;
      }
      case DataType::fp16:
      case DataType::bf16: {
        uint16_t h;
        std::memcpy(&h, p, 2);
        const bool fp16 = t == DataType::fp16;
        const float x = ff(fp16 ? ref::fp16_widen(h) : ref::bf16_widen(h));
        h = fp16 ? ref::fp16_narrow(x) : ref::bf16_narrow(x);
        std::memcpy(p, &h, 2);
        break;
      }
      case DataType::int32: {
        int32_t x;
        std::memcpy(&x, p, 4);
        x = static_cast<int32_t>(fi(x, 32));
        std::memcpy(p, &x, 4);
        break;
      }
      case DataType::int64: {
        int64_t x;
        std::memcpy(&x, p, 8);
        x = fi(x, 64);
        std::memcpy(p, &x, 8);
        break;
      }
    }
  }
  return v;
}

// avg's definition: the sum, each element / P (ints: C's truncation).
std::vector<uint8_t> averaged(std::vector<uint8_t> sum, DataType t, unsigned P) {
  return each(
      std::move(sum), t, [P](double x) { return x / P; },
      [P](float x) { return x / static_cast<float>(P); },
      [P](int64_t x, int) { return x / static_cast<int64_t>(P); });
}

// premul's scaling of one rank's input: x * factor (floats: the factor
// rounded to float first, except fp64; ints modulo 2^bits).
std::vector<uint8_t> scaled(std::vector<uint8_t> in, DataType t, double factor) {
  return each(
      std::move(in), t, [factor](double x) { return x * factor; },
      [f = static_cast<float>(factor)](float x) { return x * f; },
      [factor](int64_t x, int bits) {
        const uint64_t p = static_cast<uint64_t>(x) * static_cast<uint64_t>(int64_t(factor));
        return bits == 32 ? int64_t{static_cast<int32_t>(static_cast<uint32_t>(p))}
                          : static_cast<int64_t>(p);
      });
}

std::vector<uint8_t> part(const std::vector<uint8_t>& v, size_t first, size_t n) {
  return {v.begin() + static_cast<std::ptrdiff_t>(first),
          v.begin() + static_cast<std::ptrdiff_t>(first + n)};
}

}  // namespace

TEST_CASE("scale: the element arithmetic of avg and premul, rounding cases", "[hostlib][scaled]") {
  // fp16: 4 / 3 = 1.3333334f rounds to 0x3D55; 0.1f to 0x2E66.
  uint16_t h = 0x4400;  // 4.0
  divide_elements(&h, 1, DataType::fp16, 3);
  CHECK(h == 0x3D55);
  h = 0x3C00;  // 1.0
  multiply_elements(&h, &h, 1, DataType::fp16, 0.1);
  CHECK(h == 0x2E66);
  // bf16: 1 / 3 = 0.33333334f rounds to 0x3EAB (0.333984375).
  h = 0x3F80;
  divide_elements(&h, 1, DataType::bf16, 3);
  CHECK(h == 0x3EAB);
  // Integers truncate toward zero; products wrap.
  int32_t i[3] = {-7, 7, INT32_MIN};
  divide_elements(i, 3, DataType::int32, 2);
  CHECK((i[0] == -3 && i[1] == 3 && i[2] == INT32_MIN / 2));
  int32_t w = 0x40000000;
  multiply_elements(&w, &w, 1, DataType::int32, 4.0);
  CHECK(w == 0);
  int64_t l = -9;
  divide_elements(&l, 1, DataType::int64, 4);
  CHECK(l == -2);
  // fp32: the factor is rounded to float first: 1 x 0.1 is 0.1f, not 0.1.
  float f = 1.0f;
  multiply_elements(&f, &f, 1, DataType::fp32, 0.1);
  CHECK(f == 0.1f);
  double d = 1.0;
  multiply_elements(&d, &d, 1, DataType::fp64, 0.1);
  CHECK(d == 0.1);
}

TEST_CASE("avg: the sum divided by P on every rank, all-reduce, reduce-scatter, reduce",
          "[hostlib][scaled]") {
  std::mt19937_64 rng(20261125);
  for (unsigned P : {2u, 3u, 4u, 5u}) {
    for (const Fabric& f : fabrics(P)) {
      Job job(f.cfg, options());
      const unsigned N = static_cast<unsigned>(job.comms.size());
      for (DataType t : kTypes) {
        const size_t es = element_size(t);
        for (size_t count : counts(t)) {
          INFO(f.name << " P=" << P << " " << to_string(t) << " count=" << count);
          std::vector<std::vector<uint8_t>> in, out;
          for (unsigned r = 0; r < N; ++r)
            in.push_back(make_input(rng, t, N * count, !f.rank_order));
          const auto want = averaged(rank_order_reference(in, t, Op::sum), t, N);
          require_ok(job.run(in, out, N * count, t, Op::avg));
          for (unsigned r = 0; r < N; ++r) REQUIRE(out[r] == want);

          std::vector<std::vector<uint8_t>> shard(N, std::vector<uint8_t>(count * es, 0xEE));
          require_ok(job.run_all([&](unsigned r, Communicator& c, AllreduceHandle& h) {
            return c.reduce_scatter_async(in[r].data(), shard[r].data(), count, t, Op::avg, h);
          }));
          for (unsigned r = 0; r < N; ++r)
            REQUIRE(shard[r] == part(want, r * count * es, count * es));

          const unsigned root = static_cast<unsigned>(count % N);
          std::vector<uint8_t> at_root(N * count * es, 0xEE), elsewhere(16, 0x5A);
          require_ok(job.run_all([&](unsigned r, Communicator& c, AllreduceHandle& h) {
            void* recv = r == root ? at_root.data() : nullptr;
            return c.reduce_async(in[r].data(), recv, N * count, t, Op::avg, static_cast<int>(root),
                                  h);
          }));
          REQUIRE(at_root == want);
        }
      }
    }
  }
}

TEST_CASE("premul: each rank's input times the factor, then the sum", "[hostlib][scaled]") {
  std::mt19937_64 rng(7);
  for (unsigned P : {2u, 3u, 4u, 5u}) {
    for (const Fabric& f : fabrics(P)) {
      Job job(f.cfg, options());
      const unsigned N = static_cast<unsigned>(job.comms.size());
      for (DataType t : kTypes) {
        const bool integer = t == DataType::int32 || t == DataType::int64;
        // Rank order: any value (0.1 is inexact in every float type); other
        // orders: small integers times -2 stay exact, in bf16's 8 bits too.
        const double factor = integer ? -3.0 : f.rank_order ? 0.1 : -2.0;
        const size_t es = element_size(t);
        for (size_t count : counts(t)) {
          INFO(f.name << " P=" << P << " " << to_string(t) << " count=" << count);
          std::vector<std::vector<uint8_t>> in, products, out(N), shard(N);
          for (unsigned r = 0; r < N; ++r) {
            in.push_back(make_input(rng, t, N * count, !f.rank_order));
            products.push_back(scaled(in[r], t, factor));
          }
          const auto want = rank_order_reference(products, t, Op::sum);
          std::vector<std::vector<uint8_t>> sent = in;
          require_ok(job.run_all([&](unsigned r, Communicator& c, AllreduceHandle& h) {
            out[r].assign(N * count * es, 0xEE);
            return c.allreduce_premul_async(in[r].data(), out[r].data(), N * count, t, factor, h);
          }));
          for (unsigned r = 0; r < N; ++r) {
            REQUIRE(out[r] == want);
            REQUIRE(in[r] == sent[r]);  // send is only read
          }
          require_ok(job.run_all([&](unsigned r, Communicator& c, AllreduceHandle& h) {
            shard[r].assign(count * es, 0xEE);
            return c.reduce_scatter_premul_async(in[r].data(), shard[r].data(), count, t, factor,
                                                 h);
          }));
          for (unsigned r = 0; r < N; ++r) {
            REQUIRE(shard[r] == part(want, r * count * es, count * es));
            REQUIRE(in[r] == sent[r]);
          }
          // In place: recv == send.
          require_ok(job.run_all([&](unsigned r, Communicator& c, AllreduceHandle& h) {
            return c.allreduce_premul_async(in[r].data(), in[r].data(), N * count, t, factor, h);
          }));
          for (unsigned r = 0; r < N; ++r) REQUIRE(in[r] == want);
        }
      }
    }
  }
}

TEST_CASE("premul: a factor the type cannot use is refused at the call, by name",
          "[hostlib][scaled]") {
  const unsigned P = 2;
  Job job(ring_fabric(P, 8192), options());
  Communicator& c = *job.comms[0];
  const double inf = std::numeric_limits<double>::infinity();
  struct Bad {
    DataType t;
    double factor;
    const char* text;
  };
  const Bad bad[] = {
      {DataType::fp32, std::nan(""), "all-reduce premul of 4 fp32: factor: nan is not a finite"},
      {DataType::fp64, -inf, "factor: -inf is not a finite number"},
      {DataType::fp32, 1e39, "factor: 1e+39 is past float's range"},
      {DataType::fp16, 3.5e38, "is past float's range"},
      {DataType::bf16, -1e300, "is past float's range"},
      {DataType::int32, 2.5,
       "all-reduce premul of 4 int32: factor: 2.5 is not an integer of int32"},
      {DataType::int32, 2147483648.0, "is not an integer of int32"},
      {DataType::int64, 9223372036854775808.0, "is not an integer of int64"},
      {DataType::int64, std::nan(""), "is not a finite number"},
  };
  std::vector<uint8_t> buf(64);
  for (const Bad& b : bad) {
    INFO(to_string(b.t) << " " << b.factor);
    Error e = c.allreduce_premul(buf.data(), buf.data(), 4, b.t, b.factor);
    CHECK(e.code == ErrorCode::invalid_argument);
    CHECK_THAT(e.message, Catch::Contains(b.text));
    AllreduceHandle h;
    e = c.reduce_scatter_premul_async(buf.data(), buf.data(), 2, b.t, b.factor, h);
    CHECK(e.code == ErrorCode::invalid_argument);
    CHECK_THAT(e.message, Catch::StartsWith("reduce-scatter premul of 2 "));
    CHECK_FALSE(h.valid());  // nothing was queued
  }
  Error e = c.allreduce_premul(buf.data(), buf.data(), 4, static_cast<DataType>(9), 1.0);
  CHECK_THAT(e.message, Catch::Contains("dtype: 9 is not a data type"));
  // The edges that are usable: float's largest, int32's and int64's least.
  const double fmax = std::numeric_limits<float>::max();
  const int32_t in32[2] = {1, -1};
  const int64_t in64[2] = {1, 1};
  const float half[2] = {0.5f, -0.5f};
  std::vector<std::vector<int32_t>> o32(P, std::vector<int32_t>(2, 7));
  std::vector<std::vector<int64_t>> o64(P, std::vector<int64_t>(2, 7));
  std::vector<std::vector<float>> of(P, std::vector<float>(2));
  require_ok(job.run_all([&](unsigned r, Communicator& x, AllreduceHandle& h) {
    return x.allreduce_premul_async(in32, o32[r].data(), 2, DataType::int32, -2147483648.0, h);
  }));
  // 1 x INT32_MIN, and -1 x INT32_MIN wrapped to INT32_MIN; twice: 0.
  for (const auto& o : o32) CHECK(o == std::vector<int32_t>{0, 0});
  require_ok(job.run_all([&](unsigned r, Communicator& x, AllreduceHandle& h) {
    return x.allreduce_premul_async(in64, o64[r].data(), 2, DataType::int64, -9223372036854775808.0,
                                    h);
  }));
  for (const auto& o : o64) CHECK(o == std::vector<int64_t>{0, 0});
  require_ok(job.run_all([&](unsigned r, Communicator& x, AllreduceHandle& h) {
    return x.allreduce_premul_async(half, of[r].data(), 2, DataType::fp32, fmax, h);
  }));
  const float f = static_cast<float>(fmax);
  for (const auto& o : of) CHECK(o == std::vector<float>{f, -f});
}

TEST_CASE("avg and premul: bad buffers and a missing rank are errors, not hangs",
          "[hostlib][scaled]") {
  const unsigned P = 3;
  Options o = options();
  o.op_timeout_ms = 2000;  // the close after the missing rank waits twice this
  Job job(box_fabric(P, kMsgLen, kWindow, kPmtu), o);
  Communicator& c = *job.comms[0];
  float x[6] = {};
  Error e = c.allreduce(x, nullptr, 2, DataType::fp32, Op::avg);
  CHECK(e.code == ErrorCode::invalid_argument);
  CHECK_THAT(e.message, Catch::Contains("recv: null buffer"));
  e = c.allreduce_premul(x, x + 1, 2, DataType::fp32, 2.0);  // overlapping, not the same
  CHECK(e.code == ErrorCode::invalid_argument);
  CHECK_THAT(e.message, Catch::Contains("overlaps"));
  CHECK(x[1] == 0.0f);  // nothing was scaled into recv
  e = c.reduce_scatter_premul(nullptr, x, 2, DataType::fp32, 2.0);
  CHECK_THAT(e.message, Catch::Contains("reduce-scatter of 2 fp32: send: null buffer"));
  // Ranks 0 and 1 call, rank 2 does not: the deadline names the wait.
  std::vector<std::vector<uint8_t>> in(P, std::vector<uint8_t>(64)), out;
  const auto errs = job.run(in, out, 16, DataType::fp32, Op::avg, 300, {0, 1});
  for (unsigned r : {0u, 1u}) {
    INFO(errs[r].message);
    CHECK(errs[r].code == ErrorCode::timeout);
  }
}

TEST_CASE("avg: to_string and an op that is none", "[hostlib][scaled]") {
  CHECK(std::string(to_string(Op::avg)) == "avg");
  CHECK(std::string(to_string(static_cast<Op>(9))) == "invalid");
  Job job(ring_fabric(2, 8192), options());
  float x = 1;
  const Error e = job.comms[0]->allreduce(&x, &x, 1, DataType::fp32, static_cast<Op>(9));
  CHECK(e.code == ErrorCode::invalid_argument);
}
