// libnetreduce unit tests. The all-reduce results are checked against
// tests/engine/reference.h, written independently of src/reduce:
//   - INA path (through a real engine::Engine in the loopback box, which
//     reduces in rank order): every rank's result equals the rank-order
//     reduction of all inputs, bit for bit;
//   - ring path: every rank's result equals the reduction in the ring's
//     order (chunk c: x[c], x[c+1], ..., x[c-1], rounded after each hop),
//     bit for bit; for integers and min/max this is the same as rank order,
//     which is checked too, and so are float sums of exactly representable
//     values.
#include <infiniband/verbs.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <random>
#include <thread>

#include "engine/reference.h"
#include "host-lib/collective.h"
#include "host-lib/fixture.h"
#include "host-lib/loopback.h"
#include "host-lib/plan.h"
#include "wire/headers.h"
#include "wire/ina.h"
#include "wire/message.h"

using namespace netreduce;
using namespace netreduce::host;
using namespace netreduce::host::testing;

TEST_CASE("chunking: messages of msg_len packets, header in packet 0", "[hostlib][plan]") {
  MessagePlan p;
  REQUIRE(make_plan(1000, DataType::fp32, 4, 256, p).ok());
  // 4 * 256 - 24 = 1000 bytes = 250 floats per message.
  CHECK(p.elems_per_msg == 250);
  CHECK(p.messages == 4);
  CHECK(p.slot_bytes() == 1024);
  REQUIRE(make_plan(1001, DataType::fp32, 4, 256, p).ok());
  CHECK(p.messages == 5);
  CHECK(p.elems(4) == 1);
  CHECK(p.packets(4) == 1);  // 24 + 4 bytes
  CHECK(p.packets(0) == 4);
  REQUIRE(make_plan(0, DataType::fp64, 1, 4096, p).ok());
  CHECK(p.messages == 0);
  CHECK(p.elems(0) == 0);

  std::mt19937_64 rng(3);
  for (int iter = 0; iter < 2000; ++iter) {
    const DataType t = kTypes[rng() % 6];
    const uint16_t pmtu = static_cast<uint16_t>(256u << (rng() % 5));
    const uint16_t len = static_cast<uint16_t>(1 + rng() % 16);
    const size_t count = rng() % 50000;
    REQUIRE(make_plan(count, t, len, pmtu, p).ok());
    size_t total = 0;
    for (size_t i = 0; i < p.messages; ++i) {
      REQUIRE(p.first_elem(i) == total);
      REQUIRE(p.elems(i) > 0);
      total += p.elems(i);
      // Every message fits its slot and the ring's msg_len, and agrees with
      // the wire layer's packetizer about its packet count.
      REQUIRE(kInaHeaderBytes + p.data_bytes(i) <= p.slot_bytes());
      REQUIRE(p.packets(i) <= len);
      REQUIRE(p.packets(i) == wire::message_packets(p.data_bytes(i), pmtu));
      if (i + 1 < p.messages) REQUIRE(p.elems(i) == p.elems_per_msg);
    }
    REQUIRE(total == count);
    // A full message leaves less than one element of its slot unused.
    REQUIRE(p.slot_bytes() - kInaHeaderBytes - p.elems_per_msg * p.esize < p.esize);
  }
}

TEST_CASE("chunking: bad arguments are named", "[hostlib][plan]") {
  MessagePlan p;
  Error e = make_plan(10, static_cast<DataType>(9), 4, 1024, p);
  CHECK(e.code == ErrorCode::invalid_argument);
  CHECK(e.message.find("dtype") != std::string::npos);
  e = make_plan(10, DataType::fp32, 4, 1000, p);
  CHECK(e.message.find("payload_bytes") != std::string::npos);
  e = make_plan(10, DataType::fp32, 0, 1024, p);
  CHECK(e.message.find("msg_len") != std::string::npos);
  e = make_plan(10, DataType::fp32, 1025, 1024, p);
  CHECK(e.message.find("msg_len") != std::string::npos);
}

TEST_CASE("INA header: the bytes the host writes, by hand", "[hostlib][header]") {
  // Fields of docs/design.md#wire-format + reserved word, big-endian.
  wire::InaInfo info;
  info.dtype = static_cast<uint8_t>(DataType::bf16);
  info.op = static_cast<uint8_t>(Op::max);
  info.ring_id = 0x01020304;
  info.rank = 0x0506;
  info.msg_len = 0x0708;
  info.msg_id = 0xA0B0C0D0;
  uint8_t b[24];
  std::memset(b, 0xCC, sizeof b);
  wire::ina_encode(info, b);
  const uint8_t expect[24] = {'I', 'N', 'E', 'T', 1,    3,    3,    0,    1, 2, 3, 4,
                              5,   6,   7,   8,   0xA0, 0xB0, 0xC0, 0xD0, 0, 0, 0, 0};
  CHECK(std::memcmp(b, expect, 24) == 0);
  const auto d = wire::ina_decode(b, sizeof b);
  REQUIRE(d);
  CHECK(d->msg_id == 0xA0B0C0D0);
  CHECK(d->rank == 0x0506);
  b[0] = 'X';
  CHECK(!wire::ina_decode(b, sizeof b));
  CHECK(!wire::ina_decode(expect, 23));
}

TEST_CASE("window: rule W, message i only once i - N is done", "[hostlib][window]") {
  Window w(2);
  w.reset(5);
  CHECK(w.can_send(0));
  CHECK(w.can_send(1));
  CHECK(!w.can_send(2));
  REQUIRE(w.sent(0));
  REQUIRE(!w.sent(2));  // out of order
  REQUIRE(w.sent(1));
  CHECK(!w.can_send(2));
  // The result alone is not enough: the own write must be acknowledged too.
  REQUIRE(w.result_received(0));
  CHECK(!w.can_send(2));
  REQUIRE(!w.write_completed(1));  // completions come in order
  REQUIRE(w.write_completed(0));
  CHECK(w.done() == 1);
  CHECK(w.can_send(2));
  CHECK(!w.can_send(3));
  // And the write alone is not enough either.
  REQUIRE(w.write_completed(1));
  CHECK(!w.can_send(3));
  REQUIRE(!w.result_received(2));  // not sent: an error
  REQUIRE(w.result_received(1));
  CHECK(w.can_send(3));
  for (size_t i = 2; i < 5; ++i) {
    REQUIRE(w.sent(i));
    REQUIRE(w.write_completed(i));
    REQUIRE(w.result_received(i));
  }
  CHECK(w.finished());
  CHECK(!w.can_send(5));
}

TEST_CASE("window: bandwidth-delay estimate", "[hostlib][window]") {
  // 25 Gb/s * 10 us = 31250 bytes; 4 KiB messages -> 8.
  CHECK(window_from_bdp(25, 10, 4096) == 8);
  CHECK(window_from_bdp(100, 10, 4096) == 31);
  CHECK(window_from_bdp(1, 1, 4096) == 2);       // at least 2
  CHECK(window_from_bdp(400, 100, 1024) == 64);  // at most 64
  CHECK(window_from_bdp(0, 10, 4096) == 2);
}

TEST_CASE("ring schedule: every rank receives what its predecessor sends", "[hostlib][ring]") {
  for (unsigned P = 2; P <= 9; ++P) {
    // Track which ranks' contributions each rank's copy of each chunk holds.
    std::vector<std::vector<uint64_t>> has(P, std::vector<uint64_t>(P));
    for (unsigned r = 0; r < P; ++r)
      for (unsigned c = 0; c < P; ++c) has[r][c] = uint64_t{1} << r;
    for (unsigned s = 0; s < ring_steps(P); ++s) {
      auto next = has;
      for (unsigned r = 0; r < P; ++r) {
        const RingStep me = ring_step(r, P, s);
        const RingStep pred = ring_step((r + P - 1) % P, P, s);
        REQUIRE(me.recv_chunk == pred.send_chunk);
        const uint64_t got = has[(r + P - 1) % P][pred.send_chunk];
        if (me.reduce) {
          REQUIRE((has[r][me.recv_chunk] & got) == 0);  // never counted twice
          next[r][me.recv_chunk] |= got;
        } else {
          next[r][me.recv_chunk] = got;
        }
      }
      has = next;
    }
    for (unsigned r = 0; r < P; ++r)
      for (unsigned c = 0; c < P; ++c) REQUIRE(has[r][c] == (uint64_t{1} << P) - 1);
    // Chunks tile the segment for any n.
    for (size_t n : {size_t{0}, size_t{1}, size_t{P - 1}, size_t{P}, size_t{7 * P + 3}}) {
      size_t next = 0;
      for (unsigned c = 0; c < P; ++c) {
        const ChunkRange cr = ring_chunk(n, P, c);
        REQUIRE(cr.first == next);
        next += cr.count;
      }
      REQUIRE(next == n);
    }
  }
}

TEST_CASE("ring fallback: every dtype x op against the ring-order reference", "[hostlib][ring]") {
  std::mt19937_64 rng(20261122);
  for (unsigned P : {2u, 3u, 5u}) {
    // A small receive region forces several segments per call.
    const size_t recv_bytes = 8192;
    Options o;
    Job job(ring_fabric(P, recv_bytes), o);
    REQUIRE(job.comms[0]->path() == Path::ring);
    const size_t stride = recv_bytes / (4 * (P - 1)) / 64 * 64;
    for (DataType t : kTypes) {
      const size_t seg_max = P * (stride / element_size(t));
      for (Op op : kOps) {
        for (size_t count : {size_t{1}, size_t{P - 1}, size_t{P}, size_t{13}, seg_max - 1,
                             seg_max + 1, 3 * seg_max + 7, size_t{4099}}) {
          INFO("P=" << P << " " << to_string(t) << " " << to_string(op) << " count=" << count);
          std::vector<std::vector<uint8_t>> in, out;
          for (unsigned r = 0; r < P; ++r) in.push_back(make_input(rng, t, count, false));
          const auto errs = job.run(in, out, count, t, op);
          for (unsigned r = 0; r < P; ++r) {
            INFO("rank " << r << ": " << errs[r].message);
            REQUIRE(errs[r].ok());
          }
          const auto want = ring_order_reference(in, t, op, seg_max);
          for (unsigned r = 0; r < P; ++r) REQUIRE(out[r] == want);
          // Integers and min/max do not depend on the order at all.
          const bool order_free = op != Op::sum || t == DataType::int32 || t == DataType::int64;
          if (order_free) REQUIRE(want == rank_order_reference(in, t, op));
        }
      }
    }
  }
}

TEST_CASE("ring fallback: exactly representable sums equal the rank order", "[hostlib][ring]") {
  std::mt19937_64 rng(5);
  const unsigned P = 4;
  Job job(ring_fabric(P, 1 << 16), Options{});
  for (DataType t : kTypes) {
    const size_t count = 5003;
    std::vector<std::vector<uint8_t>> in, out;
    for (unsigned r = 0; r < P; ++r) in.push_back(make_input(rng, t, count, true));
    const auto errs = job.run(in, out, count, t, Op::sum);
    for (unsigned r = 0; r < P; ++r) {
      REQUIRE(errs[r].ok());
      REQUIRE(out[r] == rank_order_reference(in, t, Op::sum));
    }
  }
}

TEST_CASE("ring fallback: in place, P = 1, empty tensors", "[hostlib][ring]") {
  std::mt19937_64 rng(9);
  {
    const unsigned P = 3;
    Job job(ring_fabric(P, 1 << 15), Options{});
    std::vector<std::vector<uint8_t>> in;
    for (unsigned r = 0; r < P; ++r) in.push_back(make_input(rng, DataType::int32, 1000, false));
    const auto want = rank_order_reference(in, DataType::int32, Op::sum);
    std::vector<AllreduceHandle> h(P);
    for (unsigned r = 0; r < P; ++r)
      REQUIRE(
          job.comms[r]
              ->allreduce_async(in[r].data(), in[r].data(), 1000, DataType::int32, Op::sum, h[r])
              .ok());
    for (unsigned r = 0; r < P; ++r) REQUIRE(h[r].wait().ok());
    for (unsigned r = 0; r < P; ++r) REQUIRE(in[r] == want);
    std::vector<std::vector<uint8_t>> out;
    for (auto& e : job.run(in, out, 0, DataType::fp32, Op::sum)) REQUIRE(e.ok());
  }
  {
    Job solo(ring_fabric(1, 1 << 12), Options{});
    std::vector<std::vector<uint8_t>> in{make_input(rng, DataType::fp64, 77, false)}, out;
    REQUIRE(solo.run(in, out, 77, DataType::fp64, Op::max)[0].ok());
    REQUIRE(out[0] == in[0]);
  }
}

TEST_CASE("INA path through the loopback box (real engine): rank order, every dtype x op",
          "[hostlib][ina]") {
  std::mt19937_64 rng(77);
  for (unsigned P : {2u, 3u, 4u}) {
    LoopbackConfig cfg = box_fabric(P, 4, 3, 256);
    Options o;
    o.window = 3;
    Job job(cfg, o);
    REQUIRE(job.comms[0]->path() == Path::ina);
    REQUIRE(job.comms[1]->ring_id() == 7);
    size_t messages = 0;
    for (DataType t : kTypes) {
      for (Op op : kOps) {
        MessagePlan plan;
        REQUIRE(make_plan(1, t, 4, 256, plan).ok());
        const size_t epm = plan.elems_per_msg;
        for (size_t count : {size_t{1}, epm - 1, epm, epm + 1, 7 * epm + 5}) {
          INFO("P=" << P << " " << to_string(t) << " " << to_string(op) << " count=" << count);
          std::vector<std::vector<uint8_t>> in, out;
          for (unsigned r = 0; r < P; ++r) in.push_back(make_input(rng, t, count, false));
          const auto errs = job.run(in, out, count, t, op);
          for (unsigned r = 0; r < P; ++r) {
            INFO("rank " << r << ": " << errs[r].message);
            REQUIRE(errs[r].ok());
          }
          const auto want = rank_order_reference(in, t, op);
          for (unsigned r = 0; r < P; ++r) REQUIRE(out[r] == want);
          messages += (count + epm - 1) / epm;
        }
      }
    }
    // Everything went through the box as INA messages: P copies of each
    // message completed there, none dropped.
    const auto info = job.fabric.box_ring();
    REQUIRE(info);
    CHECK(info->counters.messages_completed == messages);
    CHECK(job.fabric.packets_dropped_by_box() == 0);
    CHECK(info->counters.packets_aggregated == job.fabric.packets_into_box());
  }
}

TEST_CASE("INA path: message ids continue across calls and wrap the window", "[hostlib][ina]") {
  std::mt19937_64 rng(78);
  const unsigned P = 3;
  LoopbackConfig cfg = box_fabric(P, 2, 2, 512);
  Options o;
  o.window = 2;
  Job job(cfg, o);
  for (int call = 0; call < 20; ++call) {
    const size_t count = 1 + rng() % 3000;
    std::vector<std::vector<uint8_t>> in, out;
    for (unsigned r = 0; r < P; ++r) in.push_back(make_input(rng, DataType::bf16, count, false));
    for (auto& e : job.run(in, out, count, DataType::bf16, Op::sum)) REQUIRE(e.ok());
    const auto want = rank_order_reference(in, DataType::bf16, Op::sum);
    for (unsigned r = 0; r < P; ++r) REQUIRE(out[r] == want);
  }
  CHECK(job.fabric.packets_dropped_by_box() == 0);
}

TEST_CASE("INA path: a window the box has no room for is caught by the box, not mixed in",
          "[hostlib][ina]") {
  // Hosts that use a window of 4 against a ring installed with window 1 (two
  // slots) break rule W: the engine must drop, never mix, and the hosts time
  // out naming the message (no silent wrong result).
  std::mt19937_64 rng(79);
  const unsigned P = 2;
  LoopbackConfig cfg = box_fabric(P, 1, 1, 256);
  cfg.recv_bytes = 4 * 256 + 4096;  // the hosts' four slots, then the ring path's
  Options o;
  o.window = 4;
  Job job(cfg, o);
  const size_t count = 200 * 58;  // 200 one-packet messages of 58 floats
  std::vector<std::vector<uint8_t>> in, out;
  for (unsigned r = 0; r < P; ++r) in.push_back(make_input(rng, DataType::fp32, count, false));
  // Rank 1 starts late, so rank 0 runs 4 messages ahead into reused slots.
  std::vector<AllreduceHandle> h(P);
  out.assign(P, std::vector<uint8_t>(in[0].size()));
  REQUIRE(
      job.comms[0]
          ->allreduce_async(in[0].data(), out[0].data(), count, DataType::fp32, Op::sum, h[0], 1500)
          .ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  REQUIRE(
      job.comms[1]
          ->allreduce_async(in[1].data(), out[1].data(), count, DataType::fp32, Op::sum, h[1], 1500)
          .ok());
  const Error e0 = h[0].wait(), e1 = h[1].wait();
  const auto info = job.fabric.box_ring();
  REQUIRE(info);
  if (e0.ok() && e1.ok()) {
    // Only possible if the box never had to refuse anything.
    REQUIRE(out[0] == rank_order_reference(in, DataType::fp32, Op::sum));
  } else {
    CHECK(job.fabric.packets_dropped_by_box() > 0);
    const Error& e = e0.ok() ? e1 : e0;
    INFO(e.message);
    CHECK(e.code == ErrorCode::timeout);
    CHECK(e.message.find("message id") != std::string::npos);
  }
}

TEST_CASE("deadline: a rank that never sends is named, with the message id",
          "[hostlib][deadline]") {
  std::mt19937_64 rng(11);
  const unsigned P = 3;
  for (bool box : {false, true}) {
    INFO((box ? "ina" : "ring") << " path");
    LoopbackConfig cfg = box ? box_fabric(P, 4, 2, 256) : ring_fabric(P, 1 << 14);
    Options o;
    o.window = 2;
    Job job(cfg, o);
    const size_t count = 3000;
    std::vector<std::vector<uint8_t>> in, out;
    for (unsigned r = 0; r < P; ++r) in.push_back(make_input(rng, DataType::fp32, count, false));
    const auto t0 = Clock::now();
    // Rank 2 never calls.
    const auto errs = job.run(in, out, count, DataType::fp32, Op::sum, 300, {0, 1});
    const auto elapsed = Clock::now() - t0;
    CHECK(elapsed < std::chrono::seconds(30));  // returned, no hang
    for (unsigned r : {0u, 1u}) {
      INFO(errs[r].message);
      REQUIRE(errs[r].code == ErrorCode::timeout);
      CHECK(errs[r].message.find("rank " + std::to_string(r) + ":") == 0);
      CHECK(errs[r].message.find("message id") != std::string::npos);
      CHECK(errs[r].message.find("timed out after") != std::string::npos);
    }
    // Rank 0's predecessor is the silent rank 2: it is named.
    CHECK(errs[0].message.find("not received from predecessor rank 2") != std::string::npos);
    if (box) {
      // Nothing can complete at the box: message id 0 is the one missing.
      CHECK(errs[0].message.find("result of message id 0 ") != std::string::npos);
    } else {
      CHECK(errs[0].message.find("message id 0x0 (segment 0, step 0") != std::string::npos);
    }
    // The communicator refuses further calls with the first error.
    std::vector<uint8_t> buf(16);
    const Error again =
        job.comms[0]->allreduce(buf.data(), buf.data(), 4, DataType::fp32, Op::sum, 100);
    CHECK(again.code == ErrorCode::timeout);
    CHECK(again.message.find("unusable") != std::string::npos);
  }
}

TEST_CASE("bad arguments: error values, and the communicator stays usable", "[hostlib][args]") {
  const unsigned P = 2;
  Job job(ring_fabric(P, 1 << 14), Options{});
  std::vector<uint8_t> a(64), b(64);
  struct Case {
    const void* send;
    void* recv;
    size_t count;
    DataType t;
    Op op;
    const char* field;
  };
  const Case cases[] = {
      {nullptr, b.data(), 4, DataType::fp32, Op::sum, "send"},
      {a.data(), nullptr, 4, DataType::fp32, Op::sum, "recv"},
      {a.data(), b.data(), 4, static_cast<DataType>(0), Op::sum, "dtype"},
      {a.data(), b.data(), 4, static_cast<DataType>(200), Op::sum, "dtype"},
      {a.data(), b.data(), 4, DataType::fp32, static_cast<Op>(9), "op"},
      {a.data(), a.data() + 4, 4, DataType::fp32, Op::sum, "overlaps"},
      {a.data(), b.data(), size_t{1} << 62, DataType::fp32, Op::sum, "count"},
  };
  for (const Case& c : cases) {
    for (unsigned r = 0; r < P; ++r) {
      const Error e = job.comms[r]->allreduce(c.send, c.recv, c.count, c.t, c.op);
      INFO(e.message);
      CHECK(e.code == ErrorCode::invalid_argument);
      CHECK(e.message.find(c.field) != std::string::npos);
    }
  }
  std::vector<std::vector<uint8_t>> in(P, std::vector<uint8_t>(64, 1)), out;
  for (auto& e : job.run(in, out, 16, DataType::int32, Op::sum)) REQUIRE(e.ok());
  CHECK(out[0] == rank_order_reference(in, DataType::int32, Op::sum));

  AllreduceHandle none;
  CHECK(none.wait().code == ErrorCode::invalid_argument);
  Error r;
  CHECK(none.test(&r));
  CHECK(r.code == ErrorCode::invalid_argument);
}

TEST_CASE("async: test() and wait(timeout) report progress", "[hostlib][async]") {
  const unsigned P = 2;
  Job job(ring_fabric(P, 1 << 14), Options{});
  std::vector<int64_t> x(1000, 3), y(1000, 4), rx(1000), ry(1000);
  AllreduceHandle h0, h1;
  REQUIRE(
      job.comms[0]->allreduce_async(x.data(), rx.data(), 1000, DataType::int64, Op::sum, h0).ok());
  // Rank 1 has not started: rank 0 cannot finish.
  CHECK(!h0.test());
  CHECK(h0.wait(20).code == ErrorCode::timeout);
  REQUIRE(
      job.comms[1]->allreduce_async(y.data(), ry.data(), 1000, DataType::int64, Op::sum, h1).ok());
  REQUIRE(h0.wait().ok());
  REQUIRE(h1.wait().ok());
  Error e;
  CHECK(h0.test(&e));
  CHECK(e.ok());
  CHECK(h0.path() == Path::ring);
  CHECK(rx == std::vector<int64_t>(1000, 7));
  CHECK(ry == rx);
}

TEST_CASE("collective set-up refuses inconsistent options", "[hostlib][args]") {
  LoopbackConfig cfg = ring_fabric(4, 512);  // too small for 4 ranks' ring slots
  LoopbackFabric f(cfg);
  std::unique_ptr<Communicator> c;
  const Error e = make_loopback_communicator(f, 0, Options{}, c);
  CHECK(e.code == ErrorCode::invalid_argument);
  CHECK(e.message.find("ring_buffer_bytes") != std::string::npos);
  std::unique_ptr<Communicator> c2;
  CHECK(make_loopback_communicator(f, 9, Options{}, c2).code == ErrorCode::invalid_argument);
}

TEST_CASE("verbs: no RDMA device is a clear error, not a crash", "[hostlib][verbs]") {
  int ndev = 0;
  if (ibv_device** l = ibv_get_device_list(&ndev)) ibv_free_device_list(l);
  if (ndev > 0) {
    WARN("this machine has an RDMA device: the no-device path is not exercised");
    return;
  }
  std::unique_ptr<Communicator> c;
  const Error e = Communicator::create(0, 2, "", 0, "127.0.0.1:1", Options{}, c);
  INFO(e.message);
  CHECK(e.code == ErrorCode::no_device);
  CHECK(e.message.find("no RDMA device") != std::string::npos);
  CHECK(c == nullptr);
}

TEST_CASE("probe: the INA path is trusted only when the box is on the path", "[hostlib][probe]") {
  for (bool box : {true, false}) {
    INFO((box ? "with" : "without") << " a box");
    const unsigned P = 3;
    LoopbackConfig cfg = box ? box_fabric(P, 4, 2, 256) : ring_fabric(P, 1 << 14);
    LoopbackFabric fabric(cfg);
    std::vector<std::unique_ptr<Transport>> ts(P);
    std::vector<std::unique_ptr<Collective>> cs(P);
    CollectiveConfig cc;
    cc.path = Path::ina;  // what a daemon that accepted the ring would make us use
    cc.ring_ids = {7};
    cc.msg_len = 4;
    cc.pmtu = 256;
    cc.window = 2;
    for (unsigned r = 0; r < P; ++r) {
      REQUIRE(fabric.transport(r, ts[r]).ok());
      REQUIRE(Collective::create(*ts[r], cc, cs[r]).ok());
    }
    std::vector<Error> errs(P);
    std::vector<bool> ok(P);
    std::vector<std::string> why(P);
    std::vector<std::thread> th;
    for (unsigned r = 0; r < P; ++r)
      th.emplace_back([&, r] {
        bool confirmed = false;
        errs[r] =
            probe_box(*cs[r], r, P, Clock::now() + std::chrono::seconds(20), confirmed, why[r]);
        ok[r] = confirmed;
      });
    for (auto& t : th) t.join();
    for (unsigned r = 0; r < P; ++r) {
      INFO(errs[r].message << why[r]);
      REQUIRE(errs[r].ok());
      CHECK(ok[r] == box);
      if (!box) CHECK(why[r].find("fails the box's seal") != std::string::npos);
    }
  }
}

// What a call finished by failover must hold on every rank when messages
// [0, M) of its one stripe were sealed somewhere (the box's rank-order
// result) and the rest went round the ring (the ring's order over that tail).
std::vector<uint8_t> failover_reference(const std::vector<std::vector<uint8_t>>& in, DataType t,
                                        Op op, size_t split_elems, size_t seg_max) {
  const size_t es = element_size(t);
  std::vector<uint8_t> out = rank_order_reference(in, t, op);
  std::vector<std::vector<uint8_t>> tail;
  for (const auto& v : in) tail.emplace_back(v.begin() + split_elems * es, v.end());
  if (!tail[0].empty()) {
    const auto ring = ring_order_reference(tail, t, op, seg_max);
    std::copy(ring.begin(), ring.end(), out.begin() + split_elems * es);
  }
  return out;
}

TEST_CASE("a bypassed box: the call is finished on the ring path, or fails on every rank",
          "[hostlib][seal][failover]") {
  // The shapes of a box that leaves the path while a call runs (a bypass
  // relay, a withdrawn steering rule, a restart that forgot the ring): some
  // packets of the call reach their receivers as their senders wrote them.
  // P = 3, three messages (0-2) of 4 packets per call. Where every rank gets
  // raw data with its own writes delivered, every rank finishes the call on
  // the ring path: the messages some rank had sealed hold the box's result,
  // the rest the ring's, the same bytes everywhere. Where the box keeps
  // packets it can never complete (the loopback does not retransmit them
  // as RC would), ranks time out, and every rank fails the call; when the
  // threads' timing lets every packet through after all (seen under ASan),
  // every rank recovers instead. Never some ranks one way and some the other.
  struct Shape {
    const char* name;
    bool (*skips)(unsigned sender, uint32_t msg, uint32_t k);
    bool recovers;    // always; else usually not
    int split;        // messages of the box's result when known, else -1
    uint16_t window;  // 1: message 1 leaves only once message 0 came back (RC's order)
  };
  const Shape shapes[] = {
      {"the whole call bypasses the box", [](unsigned, uint32_t, uint32_t) { return true; }, true,
       0, 2},
      {"the box leaves after the first message",
       [](unsigned, uint32_t m, uint32_t) { return m >= 1; }, true, -1, 1},
      {"the box goes mid-message",
       [](unsigned, uint32_t m, uint32_t k) { return m == 2 && k >= 2; }, false, -1, 2},
      {"only the header packet goes through",
       [](unsigned, uint32_t m, uint32_t k) { return m == 2 && k >= 1; }, false, -1, 2},
      {"steering flaps for one packet",
       [](unsigned s, uint32_t m, uint32_t k) { return m == 2 && s == 0 && k == 1; }, false, -1, 2},
  };
  std::mt19937_64 rng(91);
  const unsigned P = 3;
  for (const Shape& shape : shapes) {
    INFO(shape.name);
    const Shape* armed = nullptr;
    uint32_t first_id = 0;
    LoopbackConfig cfg = box_fabric(P, 4, 2, 256);
    cfg.bypass = [&](unsigned sender, unsigned, uint32_t id, uint32_t k) {
      return armed && id >= first_id && armed->skips(sender, id - first_id, k);
    };
    Options o;
    o.window = shape.window;
    Job job(cfg, o);
    MessagePlan plan;
    REQUIRE(make_plan(1, DataType::fp32, 4, 256, plan).ok());
    const size_t count = 3 * plan.elems_per_msg;
    const size_t seg_max =
        P * (ring_region(cfg.recv_bytes, shape.window, 4, 256) / (4 * (P - 1)) / 64 * 64 / 4);
    std::vector<std::vector<uint8_t>> in, out;
    for (unsigned r = 0; r < P; ++r) in.push_back(make_input(rng, DataType::fp32, count, false));
    const auto want = rank_order_reference(in, DataType::fp32, Op::sum);
    for (const Error& e : job.run(in, out, count, DataType::fp32, Op::sum)) REQUIRE(e.ok());
    REQUIRE(out[0] == want);
    // Every message so far (the probe's and this call's) completed at the box:
    // the next call's ids follow.
    first_id = static_cast<uint32_t>(job.fabric.box_ring()->counters.messages_completed);
    armed = &shape;
    const auto errs = job.run(in, out, count, DataType::fp32, Op::sum, 600);
    unsigned ok = 0;
    std::string all;
    for (unsigned r = 0; r < P; ++r) {
      ok += errs[r].ok() ? 1 : 0;
      all += "\nrank " + std::to_string(r) + ": " + errs[r].message;
    }
    INFO(ok << " of " << P << " ranks finished the call:" << all);
    REQUIRE((ok == 0 || ok == P));
    if (shape.recovers || ok == P) {
      for (unsigned r = 0; r < P; ++r) {
        INFO("rank " << r << ": " << errs[r].message);
        REQUIRE(errs[r].ok());
        CHECK(out[r] == out[0]);
        CHECK(job.comms[r]->path() == Path::ring);
        CHECK(job.comms[r]->failovers() == 1);
        CHECK(job.comms[r]->path_reason().find("finished on the ring path") != std::string::npos);
        // A rank that stops tells its successor (a stop notice): none waits
        // for its deadline, so the first error is never a timeout.
        CHECK(job.comms[r]->path_reason().find("timed out") == std::string::npos);
      }
      // Messages 0..M-1 sealed somewhere, the rest round the ring: which M
      // the failure left is the bypass's doing, the bytes must match one.
      unsigned matches = 0;
      for (size_t m = 0; m <= 3; ++m)
        if (out[0] ==
            failover_reference(in, DataType::fp32, Op::sum, m * plan.elems_per_msg, seg_max))
          ++matches;
      CHECK(matches >= 1);
      if (shape.split >= 0)
        CHECK(out[0] == failover_reference(in, DataType::fp32, Op::sum,
                                           shape.split * plan.elems_per_msg, seg_max));
      // The communicator stays on the ring path: the next call is the ring's.
      for (auto& v : in) v = make_input(rng, DataType::fp32, count, false);
      for (const Error& e : job.run(in, out, count, DataType::fp32, Op::sum)) REQUIRE(e.ok());
      for (unsigned r = 0; r < P; ++r)
        CHECK(out[r] == ring_order_reference(in, DataType::fp32, Op::sum, seg_max));
      continue;
    }
    for (unsigned r = 0; r < P; ++r) {
      INFO("rank " << r << ": " << errs[r].message);
      REQUIRE(!errs[r].ok());
      CHECK((errs[r].code == ErrorCode::timeout || errs[r].code == ErrorCode::transport));
      CHECK(errs[r].message.find("not finished on the ring path") != std::string::npos);
      CHECK(job.comms[r]->failovers() == 0);
      // What was copied out before the failure is the box's result; the rest
      // is untouched (0xEE).
      for (size_t i = 0; i < out[r].size(); ++i)
        if (out[r][i] != 0xEE && out[r][i] != want[i]) {
          FAIL("byte " << i << " of the result is neither the reference nor untouched");
          break;
        }
    }
  }
}

TEST_CASE("failback: the ranks try the box again and return to the INA path",
          "[hostlib][failover]") {
  // failback_calls 4: call 2 meets a bypassed box (failover); call 6 tries
  // the box while it is still bypassed (the probe fails its seal: ring
  // path, next try 8 calls later); the bypass ends; call 14 tries again and
  // every rank is back on the INA path, with the box's rank-order results.
  const unsigned P = 3;
  bool bypassed = false;
  LoopbackConfig cfg = box_fabric(P, 4, 2, 256);
  cfg.bypass = [&](unsigned, unsigned, uint32_t, uint32_t) { return bypassed; };
  Options o;
  o.window = 2;
  o.failback_calls = 4;
  Job job(cfg, o);
  std::mt19937_64 rng(77);
  const size_t count = 700;
  const size_t seg_max = P * (ring_region(cfg.recv_bytes, 2, 4, 256) / (4 * (P - 1)) / 64 * 64 / 4);
  for (unsigned call = 1; call <= 16; ++call) {
    INFO("call " << call);
    bypassed = call >= 2 && call <= 6;
    std::vector<std::vector<uint8_t>> in, out;
    for (unsigned r = 0; r < P; ++r) in.push_back(make_input(rng, DataType::fp32, count, false));
    const auto errs = job.run(in, out, count, DataType::fp32, Op::sum, 2000);
    const bool ina = call == 1 || call >= 14;
    const auto want = ina ? rank_order_reference(in, DataType::fp32, Op::sum)
                          : ring_order_reference(in, DataType::fp32, Op::sum, seg_max);
    for (unsigned r = 0; r < P; ++r) {
      INFO("rank " << r << ": " << errs[r].message);
      REQUIRE(errs[r].ok());
      CHECK(job.comms[r]->path() == (ina ? Path::ina : Path::ring));
      CHECK(job.comms[r]->failovers() == (call == 1 ? 0 : 1));
      if (call != 2) CHECK(out[r] == want);  // call 2: box result or ring, as failover decides
      CHECK(out[r] == out[0]);
    }
  }
  CHECK(job.comms[0]->path_reason().find("sealed and right on every rank") != std::string::npos);
}

// Calls 2 and 3 of a P = 3 job whose call 1 ran exact, submitted
// asynchronously on every rank (fp32, three messages of 4 packets each);
// the tests of the boundary between two calls arm their fault between them.
struct TwoCalls {
  static constexpr unsigned P = 3;
  Job& job;
  size_t count = 0;
  std::vector<std::vector<uint8_t>> in2, in3, out2, out3;
  std::vector<AllreduceHandle> h2, h3;
  std::vector<Error> e2, e3;

  bool gather3 = false;  // call 3 is an all-gather of count elements per rank

  TwoCalls(Job& j, std::mt19937_64& rng, bool exact2, bool gather = false)
      : job(j), h2(P), h3(P), e2(P), e3(P), gather3(gather) {
    MessagePlan plan;
    REQUIRE(make_plan(1, DataType::fp32, 4, 256, plan).ok());
    count = 3 * plan.elems_per_msg;
    std::vector<std::vector<uint8_t>> in, out;
    for (unsigned r = 0; r < P; ++r) in.push_back(make_input(rng, DataType::fp32, count, true));
    for (const Error& e : job.run(in, out, count, DataType::fp32, Op::sum, 5000)) REQUIRE(e.ok());
    for (unsigned r = 0; r < P; ++r) {
      in2.push_back(make_input(rng, DataType::fp32, count, exact2));
      in3.push_back(make_input(rng, DataType::fp32, count, true));
      out2.emplace_back(in2[r].size(), 0xEE);
      out3.emplace_back(in3[r].size() * (gather3 ? P : 1), 0xEE);
    }
  }
  void submit(std::vector<std::vector<uint8_t>>& i, std::vector<std::vector<uint8_t>>& o,
              std::vector<AllreduceHandle>& h) {
    for (unsigned r = 0; r < P; ++r)
      REQUIRE(job.comms[r]
                  ->allreduce_async(i[r].data(), o[r].data(), count, DataType::fp32, Op::sum, h[r],
                                    5000)
                  .ok());
  }
  void submit2() { submit(in2, out2, h2); }
  void submit3() {
    if (!gather3) return submit(in3, out3, h3);
    for (unsigned r = 0; r < P; ++r)
      REQUIRE(
          job.comms[r]
              ->all_gather_async(in3[r].data(), out3[r].data(), count, DataType::fp32, h3[r], 5000)
              .ok());
  }
  // Every rank's end of both calls (e2 already waited for): exact (call 2
  // in the box's order, call 3's exact inputs in any), one failover, the
  // ring path, `reason` said.
  void check(const std::string& reason) {
    for (unsigned r = 0; r < P; ++r) e3[r] = h3[r].wait();
    const auto want2 = rank_order_reference(in2, DataType::fp32, Op::sum);
    std::vector<uint8_t> want3;
    if (gather3)
      for (const auto& x : in3) want3.insert(want3.end(), x.begin(), x.end());
    else
      want3 = rank_order_reference(in3, DataType::fp32, Op::sum);
    for (unsigned r = 0; r < P; ++r) {
      INFO("rank " << r << ": call 2: " << e2[r].message << "; call 3: " << e3[r].message);
      CHECK(e2[r].ok());
      CHECK(e3[r].ok());
      CHECK(out2[r] == want2);
      CHECK(out3[r] == want3);
      CHECK(job.comms[r]->failovers() == 1);
      CHECK(job.comms[r]->path() == Path::ring);
      CHECK(job.comms[r]->path_reason().find(reason) != std::string::npos);
    }
  }
};

TEST_CASE("failover: the next call's raw write, ahead of this call's last ACK, is the next call's",
          "[hostlib][failover]") {
  // P = 3, three messages per call, window 2. Rank 1's ACK for its last
  // write of call 2 is late: it comes after rank 0, done with call 2, sent
  // the first message of call 3, which the box, bypassed from call 3 on,
  // lets through raw. Rank 1 holds every result of call 2 (copied out
  // before call 3 starts) and completes it: the raw write is call 3's. Call
  // 3 then fails over on every rank alike. Before, rank 1 failed call 2 on
  // that write while ranks 0 and 2 had completed it, and no rank could
  // finish either call.
  std::atomic<bool> armed{false}, bypassed{false}, held{false};
  LoopbackConfig cfg = box_fabric(TwoCalls::P, 4, 2, 256);
  cfg.bypass = [&](unsigned, unsigned, uint32_t, uint32_t) { return bypassed.load(); };
  cfg.late_ack = [&](unsigned sender, unsigned, uint64_t wr_id) {
    if (!armed || sender != 1 || wr_id != 2) return false;
    armed = false;
    held = true;
    return true;
  };
  Options o;
  o.window = 2;
  Job job(cfg, o);
  std::mt19937_64 rng(5);
  TwoCalls calls(job, rng, true);
  armed = true;
  calls.submit2();
  // Ranks 0 and 2 complete call 2; rank 1 has polled (and copied out) every
  // result and waits for the held ACK.
  calls.e2[0] = calls.h2[0].wait();
  calls.e2[2] = calls.h2[2].wait();
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while ((!held || job.fabric.completions_queued(1) > 0) &&
         std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // its last copy-out
  REQUIRE(held);
  bypassed = true;
  calls.submit3();
  calls.e2[1] = calls.h2[1].wait();
  calls.check("all-reduce call 3 failed on the INA path");
}

namespace {

// P = 3, three messages per call, window 2. Rank 1 is slow to read the
// result of call 2's last message: ranks 0 and 2 complete call 2 and start
// call 3 through a box that is bypassed from then on, and rank 0's raw
// write of call 3 lands in rank 1's receive slot over that result before
// rank 1 reads it. Rank 1 fails call 2's seal while every other rank is in
// call 3. Ranks 0 and 2 keep the last window of call 2's result: rank 1
// completes call 2 with the box's bytes, and call 3 is finished on the ring
// path by every rank. Before, both calls failed on every rank ("the ranks
// cannot finish it together"). gather3: call 3 is an all-gather, which
// ranks 0 and 2 ran as its one all-reduce: rank 1, now on the ring path,
// must run it so too (not as the classic ring all-gather).
void lost_last_result(bool gather3) {
  std::atomic<bool> armed{false}, bypassed{false}, held{false};
  unsigned reads = 0;  // rank 1's receives since armed (under the fabric's lock)
  LoopbackConfig cfg = box_fabric(TwoCalls::P, 4, 2, 256);
  cfg.bypass = [&](unsigned, unsigned, uint32_t, uint32_t) { return bypassed.load(); };
  cfg.late_read = [&](unsigned receiver, unsigned, uint32_t) {
    if (!armed || receiver != 1 || ++reads < 3) return false;
    armed = false;
    held = true;
    return true;
  };
  Options o;
  o.window = 2;
  o.failback_calls = 1;  // call 4 tries the box again
  Job job(cfg, o);
  std::mt19937_64 rng(8);
  TwoCalls calls(job, rng, false, gather3);
  armed = true;
  calls.submit2();
  calls.e2[0] = calls.h2[0].wait();  // rank 1 still waits for its result
  calls.e2[2] = calls.h2[2].wait();
  REQUIRE(held);
  bypassed = true;
  calls.submit3();
  calls.e2[1] = calls.h2[1].wait();
  calls.check("call 2 was finished with the box's results");
  // Both sides of the switch took the same message ids and the same call
  // for the next try of the box: with the bypass over, call 4's probe
  // completes at the box on every rank, and call 4 runs there again, in
  // the box's order (inputs whose sum depends on the order).
  bypassed = false;
  std::vector<std::vector<uint8_t>> in, out;
  for (unsigned r = 0; r < TwoCalls::P; ++r)
    in.push_back(make_input(rng, DataType::fp32, calls.count, false));
  const auto errs = job.run(in, out, calls.count, DataType::fp32, Op::sum, 5000);
  for (unsigned r = 0; r < TwoCalls::P; ++r) {
    INFO("rank " << r << ": " << errs[r].message);
    REQUIRE(errs[r].ok());
    CHECK(job.comms[r]->path() == Path::ina);
    CHECK(out[r] == rank_order_reference(in, DataType::fp32, Op::sum));
  }
}

}  // namespace

TEST_CASE("failover: a rank that lost its last result to the next call's raw write gets it",
          "[hostlib][failover]") {
  lost_last_result(false);
}

TEST_CASE("failover: the rank behind runs the next call as the others ran it, an all-gather too",
          "[hostlib][failover]") {
  lost_last_result(true);
}

TEST_CASE("failover with two rings: every stripe finished on the ring path, exact",
          "[hostlib][failover]") {
  // A whole call bypassed on a striped communicator (R = 2): each ring's
  // stripe is finished on the ring path. Integer sums, max and exactly
  // representable float sums do not depend on the order: every rank must
  // hold the rank-order reference, bit for bit; then the calls stay on the
  // ring path.
  const unsigned P = 3;
  bool armed = false;
  LoopbackConfig cfg = box_fabric(P, 4, 2, 256);
  cfg.rings = 2;
  cfg.bypass = [&](unsigned, unsigned, uint32_t, uint32_t) { return armed; };
  Options o;
  o.window = 2;
  Job job(cfg, o);
  REQUIRE(job.comms[0]->rings() == 2);
  std::mt19937_64 rng(4242);
  struct Call {
    DataType t;
    Op op;
    bool exact;
  };
  const Call calls[] = {{DataType::int32, Op::sum, false},
                        {DataType::fp32, Op::max, false},
                        {DataType::fp32, Op::sum, true},
                        {DataType::int64, Op::min, false}};
  for (const Call& c : calls) {
    INFO(to_string(c.t) << " " << to_string(c.op));
    const size_t count = 2000;
    std::vector<std::vector<uint8_t>> in, out;
    for (unsigned r = 0; r < P; ++r) in.push_back(make_input(rng, c.t, count, c.exact));
    armed = &c == &calls[1];  // the second call meets the bypass
    const auto errs = job.run(in, out, count, c.t, c.op, 2000);
    const auto want = rank_order_reference(in, c.t, c.op);
    for (unsigned r = 0; r < P; ++r) {
      INFO("rank " << r << ": " << errs[r].message);
      REQUIRE(errs[r].ok());
      CHECK(out[r] == want);
      CHECK(job.comms[r]->path() == (&c == &calls[0] ? Path::ina : Path::ring));
      CHECK(job.comms[r]->failovers() == (&c == &calls[0] ? 0 : 1));
    }
  }
}
