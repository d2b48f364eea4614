// Striped communicators (Options::rings = R): every tensor cut into R
// element-aligned stripes, stripe i on ring i, through the loopback
// transport (the INA path through a real engine::Engine with R rings
// installed). Results are checked against the independent references of
// fixture.h; the stripe rule is written out here on its own (not taken from
// plan.cc): stripe i holds count / R elements, one more for i < count % R,
// stripes in order.
//   - INA path: the box reduces each stripe in rank order on its ring, so
//     the result is the rank-order reduction of the whole tensor and equals
//     an unstriped (R = 1) communicator's, bit for bit;
//   - ring path: each stripe is an independent ring all-reduce, so the
//     result is the ring-order reference applied stripe by stripe; for
//     integers and min/max that is also the rank order and the unstriped
//     result.
#include <catch2/catch.hpp>
#include <regex>
#include <set>
#include <thread>

#include "host-lib/collective.h"
#include "host-lib/fixture.h"
#include "host-lib/plan.h"
#include "netreduce/netreduce.h"

using namespace netreduce;
using namespace netreduce::host;
using namespace netreduce::host::testing;

namespace {

// The stripe rule, written out independently of plan.cc.
struct Span {
  size_t first, count;
};
std::vector<Span> stripes_of(size_t count, unsigned R) {
  std::vector<Span> s;
  size_t at = 0;
  for (unsigned i = 0; i < R; ++i) {
    const size_t n = count / R + (i < count % R ? 1 : 0);
    s.push_back({at, n});
    at += n;
  }
  return s;
}

// The ring path's result for R stripes: ring_order_reference on each stripe.
std::vector<uint8_t> striped_ring_reference(const std::vector<std::vector<uint8_t>>& in, DataType t,
                                            Op op, size_t seg_max, unsigned R) {
  const size_t es = element_size(t), count = in[0].size() / es;
  std::vector<uint8_t> out(in[0].size());
  for (const Span& s : stripes_of(count, R)) {
    if (s.count == 0) continue;
    std::vector<std::vector<uint8_t>> part;
    for (const auto& v : in)
      part.emplace_back(v.begin() + s.first * es, v.begin() + (s.first + s.count) * es);
    const auto r = ring_order_reference(part, t, op, seg_max);
    std::memcpy(out.data() + s.first * es, r.data(), r.size());
  }
  return out;
}

// Sizes around every stripe boundary (0, 1, R - 1, R, R + 1) and around
// each stripe's packet and message boundaries: R x (elements of a first
// packet, of a message, of two messages) -1, 0, +1, and one more element
// for only the first R - 1 stripes.
std::vector<size_t> sizes(unsigned R, size_t per_packet, size_t per_msg) {
  std::set<size_t> s{0, 1, R - 1, R, R + 1};
  for (size_t unit : {per_packet, per_msg, 2 * per_msg}) {
    s.insert(R * unit - 1);
    s.insert(R * unit);
    s.insert(R * unit + 1);
  }
  s.insert(R * per_msg + R - 1);
  return {s.begin(), s.end()};
}

constexpr uint16_t kMsgLen = 2, kPmtu = 256, kWindow = 2;

LoopbackConfig striped_box(unsigned P, unsigned R) {
  LoopbackConfig c = box_fabric(P, kMsgLen, kWindow, kPmtu);
  c.rings = R;
  return c;
}

}  // namespace

TEST_CASE("stripes: floor/ceil, in order, tiling the tensor", "[hostlib][stripe]") {
  for (unsigned R = 1; R <= kMaxRings; ++R)
    for (size_t count :
         {size_t{0}, size_t{1}, size_t{R - 1}, size_t{R}, size_t{R + 1}, size_t{1000003}}) {
      const auto want = stripes_of(count, R);
      for (unsigned i = 0; i < R; ++i) {
        const StripeRange s = stripe(count, R, i);
        REQUIRE(s.first == want[i].first);
        REQUIRE(s.count == want[i].count);
      }
    }
  CHECK(check_rings(0).message.find("rings: 0 is outside 1..8") == 0);
  CHECK(check_rings(9).code == ErrorCode::invalid_argument);
  CHECK(check_rings(1).ok());
  CHECK(check_rings(8).ok());
}

TEST_CASE("striped INA path: every dtype x op, P = 2..4, R = 1..4, rank order = unstriped",
          "[hostlib][stripe][ina]") {
  std::mt19937_64 rng(1601);
  for (unsigned P : {2u, 3u, 4u}) {
    Options o;
    o.window = kWindow;
    Job flat(striped_box(P, 1), o);  // the unstriped communicator, for comparison
    for (unsigned R = 1; R <= 4; ++R) {
      Job job(striped_box(P, R), o);
      REQUIRE(job.comms[0]->path() == Path::ina);
      REQUIRE(job.comms[0]->rings() == static_cast<int>(R));
      for (unsigned g = 0; g < R; ++g) REQUIRE(job.comms[P - 1]->ring_id(g) == 7 + g);
      std::vector<uint64_t> stripe_bytes(R), stripe_msgs(R);
      for (DataType t : kTypes) {
        const size_t es = element_size(t);
        const size_t per_packet = (kPmtu - kInaHeaderBytes) / es;
        const size_t per_msg = (size_t{kMsgLen} * kPmtu - kInaHeaderBytes) / es;
        for (Op op : kOps) {
          for (size_t count : sizes(R, per_packet, per_msg)) {
            INFO("P=" << P << " R=" << R << " " << to_string(t) << " " << to_string(op)
                      << " count=" << count);
            std::vector<std::vector<uint8_t>> in, out, out_flat;
            for (unsigned r = 0; r < P; ++r) in.push_back(make_input(rng, t, count, false));
            require_ok(job.run(in, out, count, t, op));
            const auto want = rank_order_reference(in, t, op);
            for (unsigned r = 0; r < P; ++r) REQUIRE(out[r] == want);
            if (R > 1) {
              require_ok(flat.run(in, out_flat, count, t, op));
              for (unsigned r = 0; r < P; ++r) REQUIRE(out[r] == out_flat[r]);
            }
            const auto sp = stripes_of(count, R);
            for (unsigned g = 0; g < R; ++g) {
              stripe_bytes[g] += sp[g].count * es;
              stripe_msgs[g] += (sp[g].count + per_msg - 1) / per_msg;
            }
          }
        }
      }
      // R rings really are R ring ids at the box, each carrying its stripes'
      // bytes (P copies), and nothing else; none dropped, no connection
      // taken over by another ring (distinct QPNs per ring).
      uint64_t packets = 0;
      for (unsigned g = 0; g < R; ++g) {
        INFO("ring " << g);
        const auto info = job.fabric.box_ring(g);
        REQUIRE(info);
        CHECK(info->spec.ring_id == 7 + g);
        CHECK(info->counters.bytes_aggregated == P * stripe_bytes[g]);
        CHECK(info->counters.messages_completed == stripe_msgs[g]);
        CHECK(info->counters.connections_rebound == 0);
        packets += info->counters.packets_aggregated;
      }
      CHECK(!job.fabric.box_ring(R));
      CHECK(packets == job.fabric.packets_into_box());
      CHECK(job.fabric.packets_dropped_by_box() == 0);
    }
  }
}

TEST_CASE("striped ring path: every dtype x op, P = 2..4, R = 1..4, per-stripe ring order",
          "[hostlib][stripe][ring]") {
  std::mt19937_64 rng(1602);
  for (unsigned P : {2u, 3u, 4u}) {
    // A small receive region per ring: several segments per stripe.
    const size_t recv_bytes = 2048;
    const size_t stride = recv_bytes / (4 * (P - 1)) / 64 * 64;
    Job flat(ring_fabric(P, recv_bytes), Options{});
    for (unsigned R = 1; R <= 4; ++R) {
      LoopbackConfig cfg = ring_fabric(P, recv_bytes);
      cfg.rings = R;
      Job job(cfg, Options{});
      REQUIRE(job.comms[0]->path() == Path::ring);
      REQUIRE(job.comms[1]->rings() == static_cast<int>(R));
      for (DataType t : kTypes) {
        const size_t seg_max = P * (stride / element_size(t));
        for (Op op : kOps) {
          for (size_t count : sizes(R, P, seg_max)) {
            INFO("P=" << P << " R=" << R << " " << to_string(t) << " " << to_string(op)
                      << " count=" << count);
            std::vector<std::vector<uint8_t>> in, out, out_flat;
            for (unsigned r = 0; r < P; ++r) in.push_back(make_input(rng, t, count, false));
            require_ok(job.run(in, out, count, t, op));
            const auto want = striped_ring_reference(in, t, op, seg_max, R);
            for (unsigned r = 0; r < P; ++r) REQUIRE(out[r] == want);
            const bool order_free = op != Op::sum || t == DataType::int32 || t == DataType::int64;
            if (order_free) {
              REQUIRE(want == rank_order_reference(in, t, op));
              require_ok(flat.run(in, out_flat, count, t, op));
              REQUIRE(out[0] == out_flat[0]);
            }
          }
        }
      }
      // Exactly representable float sums do not depend on the order either.
      for (DataType t : kTypes) {
        const size_t count = 3 * R * P + 1;
        std::vector<std::vector<uint8_t>> in, out;
        for (unsigned r = 0; r < P; ++r) in.push_back(make_input(rng, t, count, true));
        require_ok(job.run(in, out, count, t, Op::sum));
        for (unsigned r = 0; r < P; ++r) REQUIRE(out[r] == rank_order_reference(in, t, Op::sum));
      }
    }
  }
}

TEST_CASE("striped: all rings in flight at once, window N per ring", "[hostlib][stripe][ina]") {
  // Rank 2 never calls: nothing completes, so every ring fills its own
  // window and stops there. A loop running the stripes one after another
  // would never have reached ring 1; a window shared by the rings would hold
  // N messages in all, not N per ring.
  std::mt19937_64 rng(1603);
  const unsigned P = 3, R = 3;
  Options o;
  o.window = kWindow;
  Job job(striped_box(P, R), o);
  const size_t per_msg = (size_t{kMsgLen} * kPmtu - kInaHeaderBytes) / 4;
  const size_t count = R * 10 * per_msg;  // 10 full messages per stripe
  std::vector<std::vector<uint8_t>> in, out;
  for (unsigned r = 0; r < P; ++r) in.push_back(make_input(rng, DataType::fp32, count, false));
  const auto errs = job.run(in, out, count, DataType::fp32, Op::sum, 300, {0, 1});
  for (unsigned g = 0; g < R; ++g) {
    INFO("ring " << g);
    const auto info = job.fabric.box_ring(g);
    REQUIRE(info);
    // Ranks 0 and 1, N messages each of kMsgLen packets, all held.
    CHECK(info->held_packets == 2 * kWindow * kMsgLen);
    CHECK(info->counters.packets_aggregated == 2 * kWindow * kMsgLen);
    CHECK(info->counters.messages_completed == 0);
  }
  // The error names every ring that did not finish: index, id, stripe bytes.
  for (unsigned r : {0u, 1u}) {
    INFO(errs[r].message);
    REQUIRE(errs[r].code == ErrorCode::timeout);
    CHECK(errs[r].message.find("rank " + std::to_string(r) +
                               ": all-reduce (ina path, 3 rings) timed out after") == 0);
    const size_t b = count / R * 4;
    CHECK(errs[r].message.find("ring 0 of 3 (id 7, stripe bytes [0, " + std::to_string(b) +
                               ")) at message 0 of 10: result of message id 0 not received") !=
          std::string::npos);
    CHECK(errs[r].message.find("ring 1 of 3 (id 8, stripe bytes [" + std::to_string(b) + ", " +
                               std::to_string(2 * b) + "))") != std::string::npos);
    CHECK(errs[r].message.find("ring 2 of 3 (id 9, ") != std::string::npos);
  }
  CHECK(errs[0].message.find("not received from predecessor rank 2") != std::string::npos);
}

TEST_CASE("striped ring path: a silent rank is named per ring", "[hostlib][stripe][ring]") {
  std::mt19937_64 rng(1604);
  const unsigned P = 3, R = 2;
  LoopbackConfig cfg = ring_fabric(P, 1 << 14);
  cfg.rings = R;
  Job job(cfg, Options{});
  const size_t count = 1001;
  std::vector<std::vector<uint8_t>> in, out;
  for (unsigned r = 0; r < P; ++r) in.push_back(make_input(rng, DataType::int64, count, false));
  const auto errs = job.run(in, out, count, DataType::int64, Op::sum, 300, {0, 1});
  INFO(errs[0].message);
  REQUIRE(errs[0].code == ErrorCode::timeout);
  CHECK(errs[0].message.find("rank 0: all-reduce (ring path, 2 rings) timed out after") == 0);
  CHECK(errs[0].message.find("ring 0 of 2 (stripe bytes [0, 4008)) at message id 0x0 (segment 0, "
                             "step 0 of 4, reduce-scatter): chunk 2 not received from "
                             "predecessor rank 2") != std::string::npos);
  CHECK(errs[0].message.find("ring 1 of 2 (stripe bytes [4008, 8008)) at message id 0x0") !=
        std::string::npos);
}

TEST_CASE("striped: in place, and message ids continue per ring across calls",
          "[hostlib][stripe][ina]") {
  std::mt19937_64 rng(1605);
  const unsigned P = 2, R = 3;
  Options o;
  o.window = kWindow;
  Job job(striped_box(P, R), o);
  for (int call = 0; call < 12; ++call) {
    const size_t count = rng() % 2000;
    std::vector<std::vector<uint8_t>> in;
    for (unsigned r = 0; r < P; ++r) in.push_back(make_input(rng, DataType::bf16, count, false));
    const auto want = rank_order_reference(in, DataType::bf16, Op::max);
    std::vector<AllreduceHandle> h(P);
    for (unsigned r = 0; r < P; ++r)
      REQUIRE(
          job.comms[r]
              ->allreduce_async(in[r].data(), in[r].data(), count, DataType::bf16, Op::max, h[r])
              .ok());
    for (unsigned r = 0; r < P; ++r) REQUIRE(h[r].wait().ok());
    for (unsigned r = 0; r < P; ++r) REQUIRE(in[r] == want);
  }
  CHECK(job.fabric.packets_dropped_by_box() == 0);
}

TEST_CASE("striped: rings out of range or disagreeing are named", "[hostlib][stripe][args]") {
  LoopbackFabric f(striped_box(2, 3));
  std::unique_ptr<Communicator> c;
  for (unsigned bad : {9u, 100u}) {
    Options o;
    o.rings = bad;
    const Error e = make_loopback_communicator(f, 0, o, c);
    INFO(e.message);
    CHECK(e.code == ErrorCode::invalid_argument);
    CHECK(e.message.find("rings: " + std::to_string(bad) + " is outside 1..8") == 0);
  }
  Options two;
  two.rings = 2;
  two.window = kWindow;
  const Error e = make_loopback_communicator(f, 0, two, c);
  CHECK(e.message.find("rings: 2 where the loopback fabric has 3") == 0);
  two.rings = 3;
  const Error ok = make_loopback_communicator(f, 0, two, c);
  INFO(ok.message);
  REQUIRE(ok.ok());
  CHECK(c->rings() == 3);
  CHECK(c->ring_id() == 7);
  CHECK(c->ring_id(2) == 9);
  CHECK(c->ring_id(3) == 0);
  CHECK(c->ring_id(-1) == 0);

  // The verbs communicator checks the field before touching any device.
  Options nine;
  nine.rings = 9;
  std::unique_ptr<Communicator> v;
  const Error ev = Communicator::create(0, 2, "", 0, "127.0.0.1:1", nine, v);
  CHECK(ev.code == ErrorCode::invalid_argument);
  CHECK(ev.message.find("rings: 9") == 0);

  // C API: appended field, default 0; range checked the same way.
  nr_options co;
  nr_options_init(&co);
  CHECK(co.rings == 0);
  co.rings = 9;
  nr_comm* cc = nullptr;
  CHECK(nr_comm_create(0, 2, "", 0, "127.0.0.1:1", &co, &cc) == NR_ERR_INVALID_ARGUMENT);
  CHECK(std::string(nr_last_error()).find("rings: 9 is outside 1..8") == 0);
  CHECK(nr_comm_rings(nullptr) == -1);
}

TEST_CASE("one ring: errors read as before striping", "[hostlib][stripe]") {
  // The system test (tests/system/scenario_allreduce.py) matches these.
  std::mt19937_64 rng(1606);
  const unsigned P = 3;
  for (bool box : {true, false}) {
    Options o;
    o.window = kWindow;
    Job job(box ? striped_box(P, 1) : ring_fabric(P, 1 << 14), o);
    std::vector<std::vector<uint8_t>> in, out;
    for (unsigned r = 0; r < P; ++r) in.push_back(make_input(rng, DataType::fp32, 3000, false));
    const auto errs = job.run(in, out, 3000, DataType::fp32, Op::sum, 300, {0, 1});
    INFO(errs[0].message);
    const std::regex want(
        box ? R"(rank 0: all-reduce \(ina path, ring 7\) timed out after \d+ ms at message \d+ of )"
              R"(\d+: .*predecessor rank 2.*)"
            : R"(rank 0: all-reduce \(ring path\) timed out after \d+ ms at message id 0x0 )"
              R"(\(segment 0, step 0 of 4, reduce-scatter\): chunk 2 not received from )"
              R"(predecessor rank 2)");
    CHECK(std::regex_match(errs[0].message, want));
    CHECK(errs[0].message.find("stripe") == std::string::npos);
  }
}
