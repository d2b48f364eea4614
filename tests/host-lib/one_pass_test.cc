// Broadcast, all-gather, reduce-scatter, reduce and barrier
// (src/host-lib/one_pass.h) through the loopback transport, on the INA path
// (the real engine as the box) and on the ring path. The expected results
// come from the definitions, not from the library: broadcast is the root's
// bytes, all-gather the ranks' bytes side by side, reduce-scatter and reduce
// the rank-order reduction of tests/engine/reference.h (on the ring path
// with inputs whose sums are exact in any order).
#include <array>
#include <cstring>

#include "fixture.h"
#include "host-lib/plan.h"

using namespace netreduce;
using namespace netreduce::host;
using namespace netreduce::host::testing;

namespace {

constexpr uint16_t kMsgLen = 2, kPmtu = 256, kWindow = 2;

// Every bit pattern is as likely as any other: NaNs with payloads, -0.0,
// infinities and denormals of every float type among them.
std::vector<uint8_t> random_bytes(std::mt19937_64& rng, size_t n) {
  std::vector<uint8_t> d(n);
  for (auto& b : d) b = static_cast<uint8_t>(rng());
  return d;
}

// The special values of a type, as bit patterns, written over the first
// elements of d: -0.0, a signalling NaN with a payload, a negative quiet NaN
// with a payload, the smallest denormal, -inf.
void plant_specials(std::vector<uint8_t>& d, DataType t) {
  std::vector<uint64_t> bits;
  switch (t) {
    case DataType::fp32:
      bits = {0x80000000, 0x7F800001, 0xFFC12345, 0x00000001, 0xFF800000};
      break;
    case DataType::fp64:
      bits = {0x8000000000000000, 0x7FF0000000000001, 0xFFF8123456789ABC, 1, 0xFFF0000000000000};
      break;
    case DataType::fp16:
      bits = {0x8000, 0x7C01, 0xFE55, 0x0001, 0xFC00};
      break;
    case DataType::bf16:
      bits = {0x8000, 0x7F81, 0xFFD5, 0x0001, 0xFF80};
      break;
    default:
      bits = {0x80000000, 0xFFFFFFFF, 0x7FFFFFFF, 1, 0};
  }
  const size_t es = element_size(t);
  for (size_t i = 0; i < bits.size() && (i + 1) * es <= d.size(); ++i)
    std::memcpy(d.data() + i * es, &bits[i], es);  // little-endian: the low bytes
}

struct Fabric {
  const char* name;
  LoopbackConfig cfg;
  Path path;
};

Options small_window() {
  Options o;
  o.window = kWindow;
  return o;
}

std::vector<Fabric> both_paths(unsigned P) {
  return {{"ina", box_fabric(P, kMsgLen, kWindow, kPmtu), Path::ina},
          {"ring", ring_fabric(P, 8192), Path::ring}};
}

// Element counts around the boundaries: one element, one message of the
// box (msg_len x pmtu less the header), several messages and windows, and
// an odd number of 2-byte elements (a byte count that is no multiple of 4).
std::vector<size_t> counts(DataType t) {
  MessagePlan plan;
  REQUIRE(make_plan(1, t, kMsgLen, kPmtu, plan).ok());
  const size_t epm = plan.elems_per_msg;
  return {1, 3, epm - 1, epm + 1, 5 * epm + 3};
}

}  // namespace

TEST_CASE("broadcast: the root's bytes on every rank, bit-exact for every dtype",
          "[hostlib][collectives]") {
  std::mt19937_64 rng(20261125);
  for (unsigned P : {2u, 3u, 5u}) {
    for (const Fabric& f : both_paths(P)) {
      Job job(f.cfg, small_window());
      REQUIRE(job.comms[0]->path() == f.path);
      for (DataType t : kTypes) {
        for (size_t count : counts(t)) {
          const int root = static_cast<int>((count + P) % P);
          INFO(f.name << " P=" << P << " " << to_string(t) << " count=" << count << " root "
                      << root);
          const size_t n = count * element_size(t);
          std::vector<std::vector<uint8_t>> buf;
          for (unsigned r = 0; r < P; ++r) buf.push_back(random_bytes(rng, n));
          plant_specials(buf[root], t);
          const std::vector<uint8_t> want = buf[root];
          require_ok(job.run_all([&](unsigned r, Communicator& c, AllreduceHandle& h) {
            return c.broadcast_async(buf[r].data(), count, t, root, h);
          }));
          for (unsigned r = 0; r < P; ++r) REQUIRE(buf[r] == want);
          REQUIRE(job.comms[0]->path() == f.path);
        }
      }
    }
  }
}

TEST_CASE("all-gather: every rank's bytes side by side, bit-exact, in place too",
          "[hostlib][collectives]") {
  std::mt19937_64 rng(7);
  for (unsigned P : {2u, 3u, 4u}) {
    for (const Fabric& f : both_paths(P)) {
      Job job(f.cfg, small_window());
      for (DataType t : kTypes) {
        for (size_t count : counts(t)) {
          for (bool in_place : {false, true}) {
            INFO(f.name << " P=" << P << " " << to_string(t) << " count=" << count
                        << (in_place ? " in place" : ""));
            const size_t n = count * element_size(t);
            std::vector<std::vector<uint8_t>> send, recv;
            std::vector<uint8_t> want;
            for (unsigned r = 0; r < P; ++r) {
              send.push_back(random_bytes(rng, n));
              plant_specials(send[r], t);
              want.insert(want.end(), send[r].begin(), send[r].end());
              recv.push_back(random_bytes(rng, P * n));  // whatever was there before
              if (in_place) std::memcpy(recv[r].data() + r * n, send[r].data(), n);
            }
            require_ok(job.run_all([&](unsigned r, Communicator& c, AllreduceHandle& h) {
              const void* s = in_place ? recv[r].data() + r * n : send[r].data();
              return c.all_gather_async(s, recv[r].data(), count, t, h);
            }));
            for (unsigned r = 0; r < P; ++r) REQUIRE(recv[r] == want);
          }
        }
      }
    }
  }
}

TEST_CASE("reduce-scatter and reduce: the rank-order reduction, each rank its shard",
          "[hostlib][collectives]") {
  std::mt19937_64 rng(11);
  for (unsigned P : {2u, 3u, 5u}) {
    for (const Fabric& f : both_paths(P)) {
      Job job(f.cfg, small_window());
      // The box sums in rank order; the ring in its own order, so there the
      // inputs are small integers whose float sums are exact in any order.
      const bool exact = f.path == Path::ring;
      for (DataType t : kTypes) {
        const size_t es = element_size(t);
        for (Op op : kOps) {
          for (size_t count : {size_t{1}, size_t{61}, size_t{700}}) {
            INFO(f.name << " P=" << P << " " << to_string(t) << " " << to_string(op)
                        << " count=" << count);
            std::vector<std::vector<uint8_t>> in, shard(P), reduced(P);
            for (unsigned r = 0; r < P; ++r) in.push_back(make_input(rng, t, P * count, exact));
            const auto want = rank_order_reference(in, t, op);
            require_ok(job.run_all([&](unsigned r, Communicator& c, AllreduceHandle& h) {
              shard[r].assign(count * es, 0xEE);
              return c.reduce_scatter_async(in[r].data(), shard[r].data(), count, t, op, h);
            }));
            for (unsigned r = 0; r < P; ++r)
              REQUIRE(shard[r] == std::vector<uint8_t>(want.begin() + r * count * es,
                                                       want.begin() + (r + 1) * count * es));
            const int root = static_cast<int>(count % P);
            require_ok(job.run_all([&](unsigned r, Communicator& c, AllreduceHandle& h) {
              // Only the root has a result buffer.
              if (r == static_cast<unsigned>(root)) reduced[r].assign(P * count * es, 0xEE);
              return c.reduce_async(in[r].data(), reduced[r].empty() ? nullptr : reduced[r].data(),
                                    P * count, t, op, root, h);
            }));
            REQUIRE(reduced[root] == want);
          }
        }
      }
    }
  }
}

TEST_CASE("collectives: zero elements, and a non-root's reduce buffer left alone",
          "[hostlib][collectives]") {
  const unsigned P = 3;
  for (const Fabric& f : both_paths(P)) {
    INFO(f.name);
    Job job(f.cfg, small_window());
    std::vector<std::vector<uint8_t>> a(P, std::vector<uint8_t>(16, 0x5A)), b = a;
    require_ok(job.run_all([&](unsigned r, Communicator& c, AllreduceHandle& h) {
      return c.broadcast_async(a[r].data(), 0, DataType::fp16, 1, h);
    }));
    require_ok(job.run_all([&](unsigned r, Communicator& c, AllreduceHandle& h) {
      return c.all_gather_async(a[r].data(), b[r].data(), 0, DataType::fp64, h);
    }));
    require_ok(job.run_all([&](unsigned r, Communicator& c, AllreduceHandle& h) {
      return c.reduce_scatter_async(a[r].data(), b[r].data(), 0, DataType::int32, Op::max, h);
    }));
    for (unsigned r = 0; r < P; ++r)
      CHECK((a[r] == std::vector<uint8_t>(16, 0x5A) && b[r] == a[r]));
    // reduce: every rank passes a recv; only the root's is written.
    std::vector<std::vector<int32_t>> in(P), out(P, std::vector<int32_t>(4, -7));
    for (unsigned r = 0; r < P; ++r) in[r] = {int32_t(r), 1, 2, 3};
    require_ok(job.run_all([&](unsigned r, Communicator& c, AllreduceHandle& h) {
      return c.reduce_async(in[r].data(), out[r].data(), 4, DataType::int32, Op::sum, 2, h);
    }));
    CHECK(out[2] == std::vector<int32_t>{0 + 1 + 2, 3, 6, 9});
    CHECK(out[0] == std::vector<int32_t>(4, -7));
    CHECK(out[1] == std::vector<int32_t>(4, -7));
  }
}

TEST_CASE("collectives: a deadline names the collective, its count and type",
          "[hostlib][collectives]") {
  // Rank 2 never calls: ranks 0 and 1 time out in the all-reduce under
  // their broadcast, and say which call of theirs it was.
  const unsigned P = 3;
  Job job(box_fabric(P, kMsgLen, kWindow, kPmtu), small_window());
  std::vector<std::vector<uint16_t>> buf(P, std::vector<uint16_t>(5));
  std::vector<AllreduceHandle> h(P);
  for (unsigned r = 0; r < 2; ++r)
    REQUIRE(job.comms[r]->broadcast_async(buf[r].data(), 5, DataType::fp16, 0, h[r], 300).ok());
  for (unsigned r = 0; r < 2; ++r) {
    const Error e = h[r].wait();
    INFO(e.message);
    CHECK(e.code == ErrorCode::timeout);
    CHECK(e.message.rfind("broadcast of 5 fp16: ", 0) == 0);
  }
}

TEST_CASE("reduce-scatter: the result may land inside the input", "[hostlib][collectives]") {
  std::mt19937_64 rng(12);
  const unsigned P = 3;
  const size_t count = 333;
  Job job(box_fabric(P, kMsgLen, kWindow, kPmtu), small_window());
  std::vector<std::vector<uint8_t>> in;
  for (unsigned r = 0; r < P; ++r) in.push_back(make_input(rng, DataType::int64, P * count, false));
  const auto want = rank_order_reference(in, DataType::int64, Op::sum);
  require_ok(job.run_all([&](unsigned r, Communicator& c, AllreduceHandle& h) {
    uint8_t* own = in[r].data() + r * count * 8;
    return c.reduce_scatter_async(in[r].data(), own, count, DataType::int64, Op::sum, h);
  }));
  for (unsigned r = 0; r < P; ++r)
    REQUIRE(std::memcmp(in[r].data() + r * count * 8, want.data() + r * count * 8, count * 8) == 0);
}

TEST_CASE("barrier: every rank returns; a rank in another call is caught",
          "[hostlib][collectives]") {
  const unsigned P = 4;
  for (const Fabric& f : both_paths(P)) {
    INFO(f.name);
    Job job(f.cfg, small_window());
    for (int i = 0; i < 3; ++i)
      require_ok(job.run_all(
          [&](unsigned, Communicator& c, AllreduceHandle& h) { return c.barrier_async(h); }));
    // Rank 0 enters a barrier while the others all-reduce one int32 0: the
    // sum rank 0 sees is 1, not 4, and it says so instead of returning.
    std::array<int32_t, P> zero{}, out{};
    const auto errs = job.run_all([&](unsigned r, Communicator& c, AllreduceHandle& h) {
      if (r == 0) return c.barrier_async(h);
      return c.allreduce_async(&zero[r], &out[r], 1, DataType::int32, Op::sum, h);
    });
    REQUIRE(errs[0].code == ErrorCode::internal);
    CHECK(errs[0].message.find("sum is 1, not the world 4") != std::string::npos);
    for (unsigned r = 1; r < P; ++r) CHECK(out[r] == 1);
  }
}

TEST_CASE("collectives: bad arguments are named, and the communicator stays usable",
          "[hostlib][collectives][args]") {
  const unsigned P = 3;
  Job job(box_fabric(P, kMsgLen, kWindow, kPmtu), small_window());
  std::vector<std::vector<uint8_t>> buf(P, std::vector<uint8_t>(4 * 64));
  struct Bad {
    const char* what;
    std::function<Error(unsigned r, Communicator& c, AllreduceHandle& h)> start;
  };
  const auto bad = std::vector<Bad>{
      {"root: -1 is not a rank (world 3)",
       [&](unsigned r, Communicator& c, AllreduceHandle& h) {
         return c.broadcast_async(buf[r].data(), 4, DataType::fp32, -1, h);
       }},
      {"root: 3 is not a rank (world 3)",
       [&](unsigned r, Communicator& c, AllreduceHandle& h) {
         return c.reduce_async(buf[r].data(), buf[r].data(), 4, DataType::fp32, Op::sum, 3, h);
       }},
      {"buf: null buffer",
       [&](unsigned, Communicator& c, AllreduceHandle& h) {
         return c.broadcast_async(nullptr, 4, DataType::fp32, 0, h);
       }},
      {"dtype: 9 is not a data type",
       [&](unsigned r, Communicator& c, AllreduceHandle& h) {
         return c.all_gather_async(buf[r].data(), buf[r].data() + 64, 4, DataType{9}, h);
       }},
      {"send: overlaps recv other than at this rank's part",
       [&](unsigned r, Communicator& c, AllreduceHandle& h) {
         // Rank r's part starts at r x 64 bytes; one element off it.
         return c.all_gather_async(buf[r].data() + r * 64 + 4, buf[r].data(), 16, DataType::fp32,
                                   h);
       }},
      {"elements x 3 ranks is too large",
       [&](unsigned r, Communicator& c, AllreduceHandle& h) {
         return c.reduce_scatter_async(buf[r].data(), buf[r].data(), size_t{1} << 38,
                                       DataType::fp32, Op::sum, h);
       }},
      {"op: 7 is not sum, min or max",
       [&](unsigned r, Communicator& c, AllreduceHandle& h) {
         return c.reduce_scatter_async(buf[r].data(), buf[r].data(), 4, DataType::fp32, Op{7}, h);
       }},
  };
  for (const Bad& b : bad) {
    INFO(b.what);
    for (const Error& e : job.run_all(b.start)) {
      INFO(e.message);
      CHECK(e.code == ErrorCode::invalid_argument);
      CHECK(e.message.find(b.what) != std::string::npos);
    }
  }
  std::vector<float> x(16);
  std::vector<std::vector<float>> v(P, x);
  v[1].assign(16, 2.5f);
  require_ok(job.run_all([&](unsigned r, Communicator& c, AllreduceHandle& h) {
    return c.broadcast_async(v[r].data(), 16, DataType::fp32, 1, h);
  }));
  for (unsigned r = 0; r < P; ++r) CHECK(v[r] == std::vector<float>(16, 2.5f));
  CHECK(job.comms[0]->path() == Path::ina);
}

TEST_CASE("collectives with local ranks and two rings: the same bytes",
          "[hostlib][collectives][local]") {
  std::mt19937_64 rng(13);
  const unsigned hosts = 2, n = 2, P = hosts * n;
  LoopbackConfig cfg = box_fabric(hosts, kMsgLen, kWindow, kPmtu);
  cfg.local_size = n;
  cfg.rings = 2;
  Options o = small_window();
  o.ring_buffer_bytes = 4096;
  Job job(cfg, o);
  REQUIRE(job.comms[0]->path() == Path::ina);
  REQUIRE(job.comms[0]->world() == static_cast<int>(P));
  for (DataType t : {DataType::bf16, DataType::fp64}) {
    INFO(to_string(t));
    const size_t count = 901, bytes = count * element_size(t);
    std::vector<std::vector<uint8_t>> b, send, gathered(P);
    std::vector<uint8_t> want;
    for (unsigned r = 0; r < P; ++r) {
      b.push_back(random_bytes(rng, bytes));
      send.push_back(random_bytes(rng, bytes));
      want.insert(want.end(), send[r].begin(), send[r].end());
    }
    const std::vector<uint8_t> root = b[2];
    require_ok(job.run_all([&](unsigned r, Communicator& c, AllreduceHandle& h) {
      return c.broadcast_async(b[r].data(), count, t, 2, h);
    }));
    for (unsigned r = 0; r < P; ++r) REQUIRE(b[r] == root);
    require_ok(job.run_all([&](unsigned r, Communicator& c, AllreduceHandle& h) {
      gathered[r].assign(P * bytes, 0xEE);
      return c.all_gather_async(send[r].data(), gathered[r].data(), count, t, h);
    }));
    for (unsigned r = 0; r < P; ++r) REQUIRE(gathered[r] == want);
    std::vector<std::vector<uint8_t>> in, shard(P);
    for (unsigned r = 0; r < P; ++r) in.push_back(make_input(rng, t, P * count, true));
    const auto sum = rank_order_reference(in, t, Op::sum);
    require_ok(job.run_all([&](unsigned r, Communicator& c, AllreduceHandle& h) {
      shard[r].assign(bytes, 0xEE);
      return c.reduce_scatter_async(in[r].data(), shard[r].data(), count, t, Op::sum, h);
    }));
    for (unsigned r = 0; r < P; ++r)
      REQUIRE(shard[r] ==
              std::vector<uint8_t>(sum.begin() + r * bytes, sum.begin() + (r + 1) * bytes));
    std::vector<uint8_t> reduced(P * bytes, 0xEE);
    require_ok(job.run_all([&](unsigned r, Communicator& c, AllreduceHandle& h) {
      return c.reduce_async(in[r].data(), r == 3 ? reduced.data() : nullptr, P * count, t, Op::sum,
                            3, h);
    }));
    REQUIRE(reduced == sum);
    require_ok(job.run_all(
        [&](unsigned, Communicator& c, AllreduceHandle& h) { return c.barrier_async(h); }));
  }
}

TEST_CASE("broadcast through a bypassed box: finished on the ring path, still bit-exact",
          "[hostlib][collectives][failover]") {
  // The box leaves the path while the second broadcast runs: its messages
  // reach the ranks as their senders wrote them (zeros from all but the
  // root), fail their seals, and every rank finishes the call on the ring
  // path. The third broadcast runs on the ring path.
  std::mt19937_64 rng(14);
  const unsigned P = 3;
  bool bypassed = false;
  LoopbackConfig cfg = box_fabric(P, 4, kWindow, kPmtu);
  cfg.bypass = [&](unsigned, unsigned, uint32_t, uint32_t) { return bypassed; };
  Options o = small_window();
  o.failback_calls = 0;
  Job job(cfg, o);
  REQUIRE(job.comms[0]->path() == Path::ina);
  const size_t count = 1001;  // fp16: an odd byte count, padded
  for (int call = 0; call < 3; ++call) {
    INFO("call " << call);
    bypassed = call >= 1;
    std::vector<std::vector<uint8_t>> buf;
    for (unsigned r = 0; r < P; ++r) buf.push_back(random_bytes(rng, count * 2));
    plant_specials(buf[1], DataType::fp16);
    const std::vector<uint8_t> want = buf[1];
    require_ok(job.run_all([&](unsigned r, Communicator& c, AllreduceHandle& h) {
      return c.broadcast_async(buf[r].data(), count, DataType::fp16, 1, h, 5000);
    }));
    for (unsigned r = 0; r < P; ++r) {
      REQUIRE(buf[r] == want);
      CHECK(job.comms[r]->path() == (call == 0 ? Path::ina : Path::ring));
      CHECK(job.comms[r]->failovers() == (call == 0 ? 0 : 1));
    }
  }
}
