// The simulators' network pieces, shared by the ring simulator (sim.cc) and
// the tree simulator (sim_tree.cc): frames owned by one place at a time, a
// pool that counts the live ones (a leak is a non-zero count at the end),
// a one-way lossy link, and random tensors of every dtype.
//
// Channel: each frame sent is dropped, duplicated (the copy faces the same
// fate independently), corrupted (one bit, position recorded in
// Frame::corrupt_at) and delayed by one tick, or more when reordered
// (mostly a little; one in ten very late, past the cells' reuse distance).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <queue>
#include <random>
#include <vector>

#include "engine/engine.h"
#include "engine/reference.h"
#include "wire/ina.h"

namespace netreduce::sim {

// The seeds a simulator binary runs: argv[1] seeds (default 1000) from
// argv[2] (default 1); NETREDUCE_SIM_SEED=S replays seed S alone.
struct SeedRange {
  uint64_t first = 1;
  uint64_t count = 1000;
  bool replay = false;
};
inline SeedRange seed_range(int argc, char** argv) {
  SeedRange r;
  if (argc > 1) r.count = std::strtoull(argv[1], nullptr, 10);
  if (argc > 2) r.first = std::strtoull(argv[2], nullptr, 10);
  if (const char* s = std::getenv("NETREDUCE_SIM_SEED")) {
    r.first = std::strtoull(s, nullptr, 10);
    r.count = 1;
    r.replay = true;
  }
  return r;
}

// A frame in flight, owned by exactly one place at a time: a channel, an
// engine (held), or a worker while it handles it.
struct Frame {
  std::vector<uint8_t> b;
  // Written by Channel when it flips a bit (the byte's offset; the last
  // flip if several), read by the tree simulator's checks. -1: intact.
  int corrupt_at = -1;
};

struct Pool {
  int64_t live = 0;
  Frame* make(size_t n) {
    ++live;
    auto* f = new Frame;
    f->b.resize(n);
    return f;
  }
  Frame* copy(const Frame& o) {
    ++live;
    return new Frame(o);
  }
  void free(Frame* f) {
    --live;
    delete f;
  }
};

inline engine::Pkt as_pkt(Frame* f) {
  return engine::Pkt{f->b.data(), static_cast<uint16_t>(f->b.size()), f};
}
inline Frame* of(const engine::Pkt& p) { return static_cast<Frame*>(p.handle); }

struct InFlight {
  uint64_t at;
  uint64_t seq;
  Frame* f;
  bool operator>(const InFlight& o) const { return at != o.at ? at > o.at : seq > o.seq; }
};

class Channel {
 public:
  Channel(double drop, double dup, double reorder, double corrupt, std::mt19937_64& rng, Pool& pool)
      : drop_(drop), dup_(dup), reorder_(reorder), corrupt_(corrupt), rng_(rng), pool_(pool) {}
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;
  ~Channel() {
    while (!q_.empty()) {
      pool_.free(q_.top().f);
      q_.pop();
    }
  }
  void send(Frame* f, uint64_t now) {
    if (chance(drop_)) {
      pool_.free(f);
      return;
    }
    if (chance(dup_)) enqueue(pool_.copy(*f), now);
    enqueue(f, now);
  }
  // Pops the next frame due at or before `now`.
  Frame* next(uint64_t now) {
    if (q_.empty() || q_.top().at > now) return nullptr;
    Frame* f = q_.top().f;
    q_.pop();
    return f;
  }
  bool empty() const { return q_.empty(); }

 private:
  bool chance(double p) { return p > 0 && std::uniform_real_distribution<double>(0, 1)(rng_) < p; }
  void enqueue(Frame* f, uint64_t now) {
    if (chance(corrupt_) && !f->b.empty()) {
      // The bit first, then the byte: the order `b[rng() % n] ^= 1 << rng() % 8`
      // evaluates them in (C++17), which the seeds were recorded with.
      const auto bit = static_cast<uint8_t>(1u << (rng_() % 8));
      const size_t at = rng_() % f->b.size();
      f->b[at] ^= bit;
      f->corrupt_at = static_cast<int>(at);
    }
    // Reordered frames are mostly a little late; one in ten is very late, so
    // duplicates older than the cells' reuse distance (2N messages) occur.
    uint64_t delay = 1;
    if (chance(reorder_)) delay += rng_() % 10 == 0 ? 50 + rng_() % 400 : 1 + rng_() % 12;
    q_.push({now + delay, seq_++, f});
  }
  double drop_, dup_, reorder_, corrupt_;
  std::mt19937_64& rng_;
  Pool& pool_;
  std::priority_queue<InFlight, std::vector<InFlight>, std::greater<>> q_;
  uint64_t seq_ = 0;
};

// `elems` random elements of `dt` into t: floats of modest magnitude over a
// range of exponents (sums stay finite, rounding happens), any integers.
inline void fill_tensor(wire::Dtype dt, std::mt19937_64& rng, uint8_t* t, size_t elems) {
  const size_t es = wire::dtype_size(dt);
  auto small = [&] { return static_cast<int>(rng() % 2001) - 1000; };
  auto expo = [&](int lo, int hi) {
    return lo + static_cast<int>(rng() % static_cast<unsigned>(hi - lo + 1));
  };
  for (size_t i = 0; i < elems; ++i) {
    uint8_t* d = t + i * es;
    switch (dt) {
      case wire::Dtype::fp32: {
        float v = std::ldexp(static_cast<float>(small()), expo(-12, 12));
        std::memcpy(d, &v, 4);
        break;
      }
      case wire::Dtype::fp64: {
        double v = std::ldexp(static_cast<double>(small()) + 1e-3 * small(), expo(-40, 40));
        std::memcpy(d, &v, 8);
        break;
      }
      case wire::Dtype::fp16: {
        uint16_t h = ref::fp16_narrow(std::ldexp(static_cast<float>(small()), expo(-14, 2)));
        std::memcpy(d, &h, 2);
        break;
      }
      case wire::Dtype::bf16: {
        uint16_t h = ref::bf16_narrow(std::ldexp(static_cast<float>(small()), expo(-20, 20)));
        std::memcpy(d, &h, 2);
        break;
      }
      case wire::Dtype::int32: {
        uint32_t v = static_cast<uint32_t>(rng());
        std::memcpy(d, &v, 4);
        break;
      }
      case wire::Dtype::int64: {
        uint64_t v = rng();
        std::memcpy(d, &v, 8);
        break;
      }
    }
  }
}

}  // namespace netreduce::sim
