// The classic ring reduce-scatter and all-gather (Collective::
// ring_reduce_scatter, ring_all_gather in src/host-lib/collective.h) on P
// loopback ranks, every dtype and op, one and three rings, calls that span
// several segments; the per-call record (Collective::last_call) of both
// paths; and the one-pass collectives choosing them on the ring path
// (src/host-lib/one_pass.h). The expected values are written out here: the
// reduce-scatter's shard c folded from rank c + 1 round to rank c with plain
// loops over tests/engine/reference.h's two-input reduction, the
// all-gather's the ranks' bytes side by side.
#include <cstring>
#include <functional>
#include <thread>

#include "fixture.h"
#include "host-lib/collective.h"
#include "host-lib/one_pass.h"

using namespace netreduce;
using namespace netreduce::host;
using namespace netreduce::host::testing;

namespace {

// P Collectives over one loopback fabric, every call made by all ranks at
// once (one thread each).
struct Ring {
  LoopbackFabric fabric;
  std::vector<std::unique_ptr<Transport>> ts;
  std::vector<std::unique_ptr<Collective>> cs;
  Ring(const LoopbackConfig& cfg, const CollectiveConfig& cc)
      : fabric(cfg), ts(cfg.world), cs(cfg.world) {
    for (unsigned r = 0; r < cfg.world; ++r) {
      REQUIRE(fabric.transport(r, ts[r]).ok());
      const Error e = Collective::create(*ts[r], cc, cs[r]);
      INFO(e.message);
      REQUIRE(e.ok());
    }
  }
  void all(const std::function<Error(unsigned r, Collective& c)>& call) {
    std::vector<Error> errs(cs.size());
    std::vector<std::thread> th;
    for (unsigned r = 0; r < cs.size(); ++r) th.emplace_back([&, r] { errs[r] = call(r, *cs[r]); });
    for (auto& x : th) x.join();
    for (unsigned r = 0; r < cs.size(); ++r) {
      INFO("rank " << r << ": " << errs[r].message);
      REQUIRE(errs[r].ok());
    }
  }
};

Clock::time_point soon() { return Clock::now() + std::chrono::seconds(20); }

// A receive region that gives the ring path slots of 256 bytes: segments of
// 256 / esize elements per chunk, so the calls below span several.
constexpr size_t kSlot = 256;
LoopbackConfig small_ring(unsigned P, unsigned R) {
  LoopbackConfig c = ring_fabric(P, kSlot * 4 * (P - 1));
  c.rings = R;
  return c;
}

// Shard c of the reduce-scatter: elements [c n, (c + 1) n) of each rank's
// input, folded op(op(x[c + 1], x[c + 2]), ...) ending with x[c].
std::vector<uint8_t> ring_shard(const std::vector<std::vector<uint8_t>>& in, DataType t, Op op,
                                size_t n, unsigned c) {
  const size_t P = in.size(), es = element_size(t), at = c * n * es, len = n * es;
  const auto part = [&](size_t rank) { return in[rank % P].data() + at; };
  std::vector<uint8_t> acc(part(c + 1), part(c + 1) + len), next(len);
  for (size_t k = 2; k <= P; ++k) {
    ref::reduce(wd(t), wo(op), {acc.data(), part(c + k)}, len, next.data());
    acc.swap(next);
  }
  return acc;
}

std::vector<uint8_t> random_bytes(std::mt19937_64& rng, size_t n) {
  std::vector<uint8_t> d(n);
  for (auto& b : d) b = static_cast<uint8_t>(rng());
  return d;
}

// -0.0, NaNs with payloads, the smallest denormal and -inf over the first
// elements of d (the other bytes are random: any bit pattern).
void plant_specials(std::vector<uint8_t>& d, DataType t) {
  std::vector<uint64_t> bits = {0x8000000000000000, 0x7FF0000000000001, 0xFFF8123456789ABC, 1};
  if (t == DataType::fp32) bits = {0x80000000, 0x7F800001, 0xFFC12345, 1, 0xFF800000};
  if (t == DataType::fp16) bits = {0x8000, 0x7C01, 0xFE55, 1, 0xFC00};
  if (t == DataType::bf16) bits = {0x8000, 0x7F81, 0xFFD5, 1, 0xFF80};
  const size_t es = element_size(t);
  for (size_t i = 0; i < bits.size() && (i + 1) * es <= d.size(); ++i)
    std::memcpy(d.data() + i * es, &bits[i], es);
}

// Per-rank element counts: one, odd ones, around a segment's chunk (kSlot
// bytes) and around three of them (one per ring with R = 3).
std::vector<size_t> counts(DataType t) {
  const size_t seg = kSlot / element_size(t);
  return {1, 7, seg - 1, seg, seg + 1, 3 * seg - 1, 3 * seg + 2};
}

void check_record(const Collective& c, Path path, unsigned steps, uint64_t bytes) {
  const Collective::CallRecord& k = c.last_call();
  CHECK(k.path == path);
  CHECK(k.dependent_steps == steps);
  CHECK(k.bytes_sent == bytes);
}

}  // namespace

TEST_CASE("ring reduce-scatter: rank r gets shard r, folded from rank r + 1 round to r",
          "[hostlib][ring-forms]") {
  std::mt19937_64 rng(20261125);
  for (unsigned R : {1u, 3u}) {
    for (unsigned P = 2; P <= 6; ++P) {
      Ring ring(small_ring(P, R), CollectiveConfig{});
      for (DataType t : kTypes) {
        const size_t es = element_size(t);
        for (Op op : kOps) {
          for (size_t n : counts(t)) {
            INFO("R=" << R << " P=" << P << " " << to_string(t) << " " << to_string(op)
                      << " n=" << n);
            std::vector<std::vector<uint8_t>> in, out(P);
            // Arbitrary floats (NaN, inf, -0.0 among them): the order shows.
            for (unsigned r = 0; r < P; ++r) in.push_back(make_input(rng, t, P * n, false));
            std::vector<std::vector<uint8_t>> send = in;  // in stays the reference's
            const bool in_place = n % 2 == 1;             // recv = send's own shard
            ring.all([&](unsigned r, Collective& c) {
              out[r].assign(n * es, 0xEE);
              void* recv = in_place ? send[r].data() + r * n * es : out[r].data();
              return c.ring_reduce_scatter(send[r].data(), recv, n, t, op, soon());
            });
            for (unsigned r = 0; r < P; ++r) {
              const uint8_t* got = in_place ? send[r].data() + r * n * es : out[r].data();
              REQUIRE(std::vector<uint8_t>(got, got + n * es) == ring_shard(in, t, op, n, r));
              check_record(*ring.cs[r], Path::ring, P - 1, uint64_t{P - 1} * n * es);
            }
          }
        }
      }
    }
  }
}

TEST_CASE("ring all-gather: every rank's bytes side by side, bit-exact, in place too",
          "[hostlib][ring-forms]") {
  std::mt19937_64 rng(7);
  for (unsigned R : {1u, 3u}) {
    for (unsigned P = 2; P <= 6; ++P) {
      Ring ring(small_ring(P, R), CollectiveConfig{});
      for (DataType t : kTypes) {
        const size_t es = element_size(t);
        for (size_t n : counts(t)) {
          for (bool in_place : {false, true}) {
            INFO("R=" << R << " P=" << P << " " << to_string(t) << " n=" << n
                      << (in_place ? " in place" : ""));
            std::vector<std::vector<uint8_t>> send, recv;
            std::vector<uint8_t> want;
            for (unsigned r = 0; r < P; ++r) {
              send.push_back(random_bytes(rng, n * es));
              plant_specials(send[r], t);
              want.insert(want.end(), send[r].begin(), send[r].end());
              recv.push_back(random_bytes(rng, P * n * es));  // whatever was there before
              if (in_place) std::memcpy(recv[r].data() + r * n * es, send[r].data(), n * es);
            }
            ring.all([&](unsigned r, Collective& c) {
              const void* s = in_place ? recv[r].data() + r * n * es : send[r].data();
              return c.ring_all_gather(s, recv[r].data(), n, t, soon());
            });
            for (unsigned r = 0; r < P; ++r) {
              REQUIRE(recv[r] == want);
              check_record(*ring.cs[r], Path::ring, P - 1, uint64_t{P - 1} * n * es);
            }
          }
        }
      }
    }
  }
}

TEST_CASE("ring forms and all-reduce interleaved: each call's result and record",
          "[hostlib][ring-forms]") {
  // The forms share the segment tags and receive halves with all-reduce:
  // calls of each kind one after the other stay in step.
  std::mt19937_64 rng(3);
  const unsigned P = 4;
  const DataType t = DataType::int32;
  Ring ring(small_ring(P, 1), CollectiveConfig{});
  for (size_t n : {size_t{5}, size_t{200}}) {
    INFO("n=" << n);
    std::vector<std::vector<uint8_t>> in, shard(P), sum(P), gathered(P);
    for (unsigned r = 0; r < P; ++r) in.push_back(make_input(rng, t, P * n, false));
    ring.all([&](unsigned r, Collective& c) {
      shard[r].assign(n * 4, 0xEE);
      sum[r].assign(P * n * 4, 0xEE);
      gathered[r].assign(P * n * 4, 0xEE);
      if (Error e = c.ring_reduce_scatter(in[r].data(), shard[r].data(), n, t, Op::sum, soon()))
        return e;
      if (Error e = c.ring_allreduce(in[r].data(), sum[r].data(), P * n, t, Op::sum, soon()))
        return e;
      return c.ring_all_gather(shard[r].data(), gathered[r].data(), n, t, soon());
    });
    const auto want = rank_order_reference(in, t, Op::sum);  // int32: any order
    for (unsigned r = 0; r < P; ++r) {
      REQUIRE(sum[r] == want);
      REQUIRE(gathered[r] == want);
      check_record(*ring.cs[r], Path::ring, P - 1, uint64_t{P - 1} * n * 4);
    }
  }
  // An all-reduce within one segment: 2(P - 1) steps of P * 8 / P elements.
  std::vector<std::vector<int32_t>> x(P, std::vector<int32_t>(P * 8, 1)), y = x;
  ring.all([&](unsigned r, Collective& c) {
    return c.ring_allreduce(x[r].data(), y[r].data(), P * 8, t, Op::sum, soon());
  });
  for (unsigned r = 0; r < P; ++r) {
    CHECK(y[r] == std::vector<int32_t>(P * 8, P));
    check_record(*ring.cs[r], Path::ring, 2 * (P - 1), uint64_t{2} * (P - 1) * 8 * 4);
  }
}

TEST_CASE("call record: the INA path is one step and the call's data bytes",
          "[hostlib][ring-forms]") {
  const unsigned P = 3;
  CollectiveConfig cc;
  cc.path = Path::ina;
  cc.ring_ids = {7};
  cc.msg_len = 4;
  cc.pmtu = 256;
  cc.window = 2;
  Ring ring(box_fabric(P, cc.msg_len, cc.window, cc.pmtu), cc);
  const size_t n = 1001;  // several messages
  std::vector<std::vector<int64_t>> x(P, std::vector<int64_t>(n, 2)), y = x;
  ring.all([&](unsigned r, Collective& c) {
    return c.allreduce(x[r].data(), y[r].data(), n, DataType::int64, Op::sum, soon());
  });
  for (unsigned r = 0; r < P; ++r) {
    CHECK(y[r] == std::vector<int64_t>(n, 2 * P));
    check_record(*ring.cs[r], Path::ina, 1, n * 8);
  }
}

TEST_CASE("ring forms: bad arguments are named; one rank copies", "[hostlib][ring-forms][args]") {
  Ring ring(small_ring(3, 1), CollectiveConfig{});
  Collective& c = *ring.cs[1];
  std::vector<float> buf(64);
  const auto msg = [](const Error& e) { return e.message; };
  // recv one element past this rank's own shard of send.
  CHECK_THAT(msg(c.ring_reduce_scatter(buf.data(), buf.data() + 4 + 1, 4, DataType::fp32, Op::sum,
                                       soon())),
             Catch::Contains("recv: overlaps send other than at this rank's part"));
  CHECK_THAT(msg(c.ring_all_gather(buf.data() + 1, buf.data(), 4, DataType::fp32, soon())),
             Catch::Contains("send: overlaps recv other than at this rank's part"));
  CHECK_THAT(msg(c.ring_all_gather(nullptr, buf.data(), 4, DataType::fp32, soon())),
             Catch::Contains("send: null buffer"));
  CHECK_THAT(msg(c.ring_reduce_scatter(buf.data(), buf.data(), 4, DataType::fp32, Op{7}, soon())),
             Catch::Contains("op: 7 is not sum, min or max"));
  CHECK_THAT(
      msg(c.ring_all_gather(buf.data(), buf.data() + 8, size_t{1} << 39, DataType::fp32, soon())),
      Catch::Contains("x 3 ranks is too large"));

  LoopbackFabric one(ring_fabric(1, 4096));
  std::unique_ptr<Transport> t;
  std::unique_ptr<Collective> solo;
  REQUIRE(one.transport(0, t).ok());
  REQUIRE(Collective::create(*t, CollectiveConfig{}, solo).ok());
  std::vector<float> a = {1.5f, -0.0f}, b(2);
  REQUIRE(solo->ring_reduce_scatter(a.data(), b.data(), 2, DataType::fp32, Op::max, soon()).ok());
  CHECK(std::memcmp(a.data(), b.data(), 8) == 0);
  check_record(*solo, Path::ring, 0, 0);
}

TEST_CASE("one-pass collectives take the classic ring forms on the ring path",
          "[hostlib][ring-forms][collectives]") {
  // OnePass over a ring's Collectives: with the ring path the all-gather and
  // the reduce-scatter run the classic forms (no all-reduce); with another
  // path they are one all-reduce, as broadcast is on any path.
  const unsigned P = 3, n = 10;
  Ring ring(small_ring(P, 1), CollectiveConfig{});
  for (Path path : {Path::ring, Path::ina}) {
    INFO(to_string(path));
    std::vector<unsigned> allreduces(P);
    std::vector<std::unique_ptr<OnePass>> ops;
    for (unsigned r = 0; r < P; ++r) {
      Collective* c = ring.cs[r].get();
      RingForms forms;
      forms.path = [path] { return path; };
      forms.reduce_scatter = [c](const void* s, void* d, size_t k, DataType t, Op op,
                                 Clock::time_point dl) {
        return c->ring_reduce_scatter(s, d, k, t, op, dl);
      };
      forms.all_gather = [c](const void* s, void* d, size_t k, DataType t, Clock::time_point dl) {
        return c->ring_all_gather(s, d, k, t, dl);
      };
      AllreduceFn ar = [c, &allreduces, r](const void* s, void* d, size_t k, DataType t, Op op,
                                           Clock::time_point dl) {
        ++allreduces[r];
        return c->ring_allreduce(s, d, k, t, op, dl);  // the ring stands in for the box
      };
      ops.push_back(std::make_unique<OnePass>(ar, r, P, forms));
    }
    std::vector<std::vector<int32_t>> in(P), shard(P, std::vector<int32_t>(n)),
        all(P, std::vector<int32_t>(P * n));
    for (unsigned r = 0; r < P; ++r)
      for (unsigned i = 0; i < P * n; ++i) in[r].push_back(static_cast<int32_t>(100 * r + i));
    ring.all([&](unsigned r, Collective&) {
      if (Error e = ops[r]->reduce_scatter(in[r].data(), shard[r].data(), n, DataType::int32,
                                           Op::max, soon()))
        return e;
      return ops[r]->all_gather(shard[r].data(), all[r].data(), n, DataType::int32, soon());
    });
    for (unsigned r = 0; r < P; ++r) {
      for (unsigned i = 0; i < P * n; ++i) CHECK(all[r][i] == static_cast<int32_t>(100 * 2 + i));
      CHECK(allreduces[r] == (path == Path::ring ? 0u : 2u));
      CHECK(ring.cs[r]->last_call().dependent_steps == (path == Path::ring ? P - 1 : 2 * (P - 1)));
    }
  }
}

TEST_CASE("communicator reduce-scatter on the ring path: the classic ring's order",
          "[hostlib][ring-forms][collectives]") {
  // Arbitrary fp32 values: the rank order the classic form folds in
  // (from rank r + 1 round to r) is not the ring all-reduce's, and shows in
  // the low bits.
  std::mt19937_64 rng(5);
  const unsigned P = 4;
  const size_t n = 300;
  Job job(small_ring(P, 1), Options{});
  REQUIRE(job.comms[0]->path() == Path::ring);
  std::vector<std::vector<uint8_t>> in, out(P);
  for (unsigned r = 0; r < P; ++r) in.push_back(make_input(rng, DataType::fp32, P * n, false));
  const auto errs = job.run_all([&](unsigned r, Communicator& c, AllreduceHandle& h) {
    out[r].assign(n * 4, 0xEE);
    return c.reduce_scatter_async(in[r].data(), out[r].data(), n, DataType::fp32, Op::sum, h);
  });
  for (unsigned r = 0; r < P; ++r) {
    INFO("rank " << r << ": " << errs[r].message);
    REQUIRE(errs[r].ok());
    REQUIRE(out[r] == ring_shard(in, DataType::fp32, Op::sum, n, r));
  }
}

TEST_CASE("ring forms: a rank that never calls; the error names the form and its step",
          "[hostlib][ring-forms]") {
  const unsigned P = 3;
  for (bool gather : {true, false}) {
    INFO((gather ? "all-gather" : "reduce-scatter"));
    Ring ring(small_ring(P, 1), CollectiveConfig{});
    std::vector<std::vector<float>> buf(P, std::vector<float>(P * 4));
    std::vector<Error> errs(2);
    std::vector<std::thread> th;
    for (unsigned r = 0; r < 2; ++r)  // rank 2 never calls
      th.emplace_back([&, r] {
        const auto d = Clock::now() + std::chrono::milliseconds(300);
        float* b = buf[r].data();
        errs[r] =
            gather ? ring.cs[r]->ring_all_gather(b + r * 4, b, 4, DataType::fp32, d)
                   : ring.cs[r]->ring_reduce_scatter(b, b + r * 4, 4, DataType::fp32, Op::sum, d);
      });
    for (auto& x : th) x.join();
    // Rank 0 waits for rank 2's write of step 0.
    INFO(errs[0].message);
    CHECK(errs[0].code == ErrorCode::timeout);
    const std::string form = gather ? "all-gather" : "reduce-scatter";
    CHECK_THAT(errs[0].message, Catch::Contains("rank 0: " + form + " (ring path) timed out"));
    CHECK_THAT(errs[0].message, Catch::Contains("step 0 of 2, " + form));
    CHECK_THAT(errs[0].message, Catch::Contains("not received from predecessor rank 2"));
  }
}
