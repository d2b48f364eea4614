// What the host-library tests share: random inputs, the independent
// references (tests/engine/reference.h, written apart from src/reduce), and a
// job of P loopback communicators driven together through the async API.
#pragma once

#include <catch2/catch.hpp>
#include <cstring>
#include <limits>
#include <random>
#include <thread>
#include <vector>

#include "engine/reference.h"
#include "host-lib/cost_model.h"
#include "host-lib/loopback.h"
#include "netreduce/netreduce.hpp"

namespace netreduce::host::testing {

inline constexpr DataType kTypes[] = {DataType::fp32,  DataType::fp16,  DataType::bf16,
                                      DataType::int32, DataType::int64, DataType::fp64};
inline constexpr Op kOps[] = {Op::sum, Op::min, Op::max};

inline wire::Dtype wd(DataType t) { return static_cast<wire::Dtype>(t); }
inline wire::ReduceOp wo(Op o) { return static_cast<wire::ReduceOp>(o); }

// Random elements; `exact` keeps values small integers (order-free float sums).
inline std::vector<uint8_t> make_input(std::mt19937_64& rng, DataType t, size_t count, bool exact) {
  const size_t es = element_size(t);
  std::vector<uint8_t> d(count * es);
  std::uniform_real_distribution<double> u(-1000.0, 1000.0);
  for (size_t i = 0; i < count; ++i) {
    double v = exact ? static_cast<double>(static_cast<int>(rng() % 64) - 32) : u(rng);
    if (!exact) {
      const unsigned pick = rng() % 200;
      if (pick == 0) v = std::numeric_limits<double>::quiet_NaN();
      if (pick == 1) v = std::numeric_limits<double>::infinity();
      if (pick == 2) v = -0.0;
      if (pick == 3) v = 0.0;
    }
    uint8_t* p = d.data() + i * es;
    switch (t) {
      case DataType::fp32: {
        const float f = static_cast<float>(v);
        std::memcpy(p, &f, 4);
        break;
      }
      case DataType::fp64:
        std::memcpy(p, &v, 8);
        break;
      case DataType::fp16: {
        const uint16_t h = ref::fp16_narrow(static_cast<float>(exact ? v : v / 16));
        std::memcpy(p, &h, 2);
        break;
      }
      case DataType::bf16: {
        const uint16_t h = ref::bf16_narrow(static_cast<float>(v));
        std::memcpy(p, &h, 2);
        break;
      }
      case DataType::int32: {
        const int32_t x = exact ? static_cast<int32_t>(v) : static_cast<int32_t>(rng());
        std::memcpy(p, &x, 4);
        break;
      }
      case DataType::int64: {
        const int64_t x = exact ? static_cast<int64_t>(v) : static_cast<int64_t>(rng());
        std::memcpy(p, &x, 8);
        break;
      }
    }
  }
  return d;
}

inline std::vector<uint8_t> rank_order_reference(const std::vector<std::vector<uint8_t>>& in,
                                                 DataType t, Op op) {
  std::vector<const uint8_t*> ptrs;
  for (const auto& v : in) ptrs.push_back(v.data());
  std::vector<uint8_t> out(in[0].size());
  if (!out.empty()) ref::reduce(wd(t), wo(op), ptrs, out.size(), out.data());
  return out;
}

// The ring's order, written out independently of plan.cc: segments of
// seg_max elements, chunk c of a segment of n elements is
// [c * (n / P) + min(c, n % P), + n / P + (c < n % P)), folded from rank c.
inline std::vector<uint8_t> ring_order_reference(const std::vector<std::vector<uint8_t>>& in,
                                                 DataType t, Op op, size_t seg_max) {
  const size_t P = in.size(), es = element_size(t), count = in[0].size() / es;
  std::vector<uint8_t> out(in[0].size());
  for (size_t seg = 0; seg < count; seg += seg_max) {
    const size_t n = std::min(seg_max, count - seg);
    for (size_t c = 0; c < P; ++c) {
      const size_t first = seg + c * (n / P) + std::min(c, n % P);
      const size_t len = (n / P + (c < n % P ? 1 : 0)) * es;
      if (len == 0) continue;
      std::vector<uint8_t> acc(in[c].begin() + first * es, in[c].begin() + first * es + len);
      for (size_t k = 1; k < P; ++k) {
        std::vector<uint8_t> next(len);
        ref::reduce(wd(t), wo(op), {acc.data(), in[(c + k) % P].data() + first * es}, len,
                    next.data());
        acc = next;
      }
      std::memcpy(out.data() + first * es, acc.data(), len);
    }
  }
  return out;
}

// Every rank's call succeeded (the failing rank's message shown).
inline void require_ok(const std::vector<Error>& errs) {
  for (size_t r = 0; r < errs.size(); ++r) {
    INFO("rank " << r << ": " << errs[r].message);
    REQUIRE(errs[r].ok());
  }
}

struct Job {
  LoopbackFabric fabric;
  std::vector<std::unique_ptr<Communicator>> comms;
  // With local ranks (cfg.local_size > 1) the job has world x local_size
  // ranks, created at once (a host's local ranks wait for each other).
  // Calls take the communicator's path (the box's when there is one)
  // unless `choose` keeps o.path_choice: the tests of the INA path's
  // mechanics pin it; path_choice_test.cc tests the choice.
  Job(const LoopbackConfig& cfg, Options o, bool choose = false)
      : fabric(cfg), comms(size_t{cfg.world} * cfg.local_size) {
    if (!choose) o.path_choice = PathChoice::ina;
    std::vector<Error> errs(comms.size());
    if (cfg.local_size <= 1) {
      for (unsigned r = 0; r < comms.size(); ++r)
        errs[r] = make_loopback_communicator(fabric, r, o, comms[r]);
    } else {
      std::vector<std::thread> th;
      for (unsigned r = 0; r < comms.size(); ++r)
        th.emplace_back([&, r] { errs[r] = make_loopback_communicator(fabric, r, o, comms[r]); });
      for (auto& x : th) x.join();
    }
    for (const Error& e : errs) {
      INFO(e.message);
      REQUIRE(e.ok());
    }
  }
  // Every rank leaves at once, as a job's processes do: a communicator's
  // close waits for its peers' (Collective::close).
  ~Job() {
    std::vector<std::thread> th;
    for (auto& c : comms) th.emplace_back([&c] { c.reset(); });
    for (auto& x : th) x.join();
  }
  // Every rank at once: start(rank, its communicator, handle) starts one
  // asynchronous collective; then each is waited for.
  template <typename Start>
  std::vector<Error> run_all(Start start) {
    std::vector<AllreduceHandle> h(comms.size());
    std::vector<Error> errs(comms.size());
    for (unsigned r = 0; r < comms.size(); ++r) errs[r] = start(r, *comms[r], h[r]);
    for (unsigned r = 0; r < comms.size(); ++r)
      if (errs[r].ok()) errs[r] = h[r].wait();
    return errs;
  }
  // All ranks (or those in `ranks`) at once, through the async API.
  std::vector<Error> run(const std::vector<std::vector<uint8_t>>& in,
                         std::vector<std::vector<uint8_t>>& out, size_t count, DataType t, Op op,
                         int timeout_ms = 20000, std::vector<unsigned> ranks = {}) {
    if (ranks.empty())
      for (unsigned r = 0; r < comms.size(); ++r) ranks.push_back(r);
    out.assign(comms.size(), {});
    std::vector<AllreduceHandle> h(comms.size());
    std::vector<Error> errs(comms.size());
    for (unsigned r : ranks) {
      out[r].assign(in[r].size(), 0xEE);
      errs[r] =
          comms[r]->allreduce_async(in[r].data(), out[r].data(), count, t, op, h[r], timeout_ms);
    }
    for (unsigned r : ranks)
      if (errs[r].ok()) errs[r] = h[r].wait();
    return errs;
  }
};

// The ring path's part of an INA communicator's receive region: what its
// window's INA slots (rounded up to 64 bytes) leave.
inline size_t ring_region(size_t recv_bytes, unsigned window, unsigned msg_len, unsigned pmtu) {
  return recv_bytes - (size_t{window} * msg_len * pmtu + 63) / 64 * 64;
}

// The cost model's parameters as communicator c has them (its link figures
// and window; msg_len and pmtu its fabric's).
inline cost::Params model_params(const Communicator& c, uint16_t msg_len, uint16_t pmtu) {
  cost::Params p;
  p.alpha_s = c.links().alpha_us * 1e-6;
  p.bandwidth_Bps = c.links().gbps * 1e9 / 8;
  p.box_s = c.links().box_us * 1e-6;
  p.msg_len = msg_len;
  p.payload_bytes = pmtu;
  p.window = c.window();
  return p;
}

inline LoopbackConfig ring_fabric(unsigned P, size_t recv_bytes) {
  LoopbackConfig c;
  c.world = P;
  c.recv_bytes = recv_bytes;
  return c;
}

inline LoopbackConfig box_fabric(unsigned P, uint16_t msg_len, uint16_t window, uint16_t pmtu) {
  LoopbackConfig c;
  c.world = P;
  c.box = true;
  c.ring.ring_id = 7;
  c.ring.msg_len = msg_len;
  c.ring.window = window;
  c.ring.payload_bytes = pmtu;
  c.recv_bytes = size_t{window} * msg_len * pmtu + 4096;  // the INA slots, then the ring's
  return c;
}

}  // namespace netreduce::host::testing
