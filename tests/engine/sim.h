// A simulator of P RoCE RC endpoints in a ring, talking through the engine.
//
// Faithful to what the box relies on: each worker has a sender QP to its
// successor and a receiver QP from its predecessor; PSNs are 24-bit and
// start anywhere (near the wrap on purpose); the receiver accepts only the
// expected PSN, ACKs it, NAKs (sequence error) the first out-of-order packet
// and re-ACKs duplicates; the sender goes back N on a NAK or a retransmission
// timeout; a message's completion at the receiver is its RDMA WRITE WITH
// IMMEDIATE last packet arriving in order. Workers obey the host window rule
// W: message m is sent only when m-N is done (result received and own write
// acknowledged). Every frame, data and ACK, crosses the engine, over
// channels that drop, duplicate, reorder and corrupt on both sides. The
// receiver verifies the ICRC like rxe does.
//
// A worker accepts a message only when its last packet's immediate is the
// box's seal of what it received (msg_id ^ crc32 of the data, zlib's CRC:
// src/engine/digest.h), as the host library does; a message that fails it
// is rejected and the worker stops, as a host's call fails.
// At the end each worker's received data must equal a reference reduction
// computed independently (tests/engine/reference.h) in rank order:
// bit-identical in deterministic mode; in accumulate mode identical across
// workers and exact for integers and min/max, within rounding for float sums.
// When the ring is removed mid-run (SimParams::remove_at), the box is
// bypassed for a while (bypass_at: frames go from sender to receiver
// untouched, as a bypass relay or a withdrawn steering rule does) or the box
// restarts (restart_at: a fresh engine that forwards everything until the
// ring is installed again), workers may never finish: the run ends once
// nothing progressed for kStuckTicks and counts as the expected outcome, but
// every message a worker accepted must still hold the reference result: a
// fault may fail a job, never corrupt it.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "engine/engine.h"

namespace netreduce::sim {

struct SimParams {
  uint64_t seed = 1;
  unsigned ranks = 4;
  unsigned messages = 4;  // per worker
  uint16_t pmtu = 256;
  uint16_t msg_len = 4;  // ring's packets per message
  uint16_t window = 2;   // N
  wire::Dtype dtype = wire::Dtype::fp32;
  wire::ReduceOp op = wire::ReduceOp::sum;
  engine::ReduceMode mode = engine::ReduceMode::deterministic;
  engine::IcrcFixup fixup = engine::IcrcFixup::linear;
  reduce::Isa isa = reduce::Isa::scalar;
  double drop_in = 0, dup_in = 0, reorder_in = 0, corrupt_in = 0;      // workers -> box
  double drop_out = 0, dup_out = 0, reorder_out = 0, corrupt_out = 0;  // box -> workers
  uint32_t psn_base = 0;  // worker r starts at psn_base + r * 7919 (mod 2^24)
  unsigned burst = 4;     // packets a sender may emit per tick
  unsigned rto = 40;      // ticks without ACK progress before going back N
  uint64_t max_ticks = 400000;
  bool violate_window = false;  // rank 0 ignores rule W (for the regression test)
  // Ring lifecycle: the ring is removed at this tick (0: never) and, if
  // reinstall_at is not 0, installed again with the same spec at that tick.
  // The workers keep their QPs: the job carries on or gets stuck.
  uint64_t remove_at = 0;
  uint64_t reinstall_at = 0;
  // The box is bypassed for ticks [bypass_at, bypass_until) (0: never).
  uint64_t bypass_at = 0;
  uint64_t bypass_until = 0;
  // The box restarts at this tick (0: never): its engine and every cell,
  // connection and history are gone; the ring is installed again at
  // reinstall_after_restart (0: never), frames forwarded untouched until then.
  uint64_t restart_at = 0;
  uint64_t reinstall_after_restart = 0;
};

// Random parameters for a seed: P 2..16, every dtype x op by turn, loss,
// duplication and reordering up to 5% each, corruption up to 1%. One seed in
// eight removes the ring at a random tick, half of those re-install it; one
// in eight bypasses the box for a while (a flap of 1-3 ticks in a third of
// those), one in eight restarts it.
SimParams random_params(uint64_t seed, bool allow_accumulate = true);

struct SimResult {
  bool ok = false;
  // The ring was removed and the workers could not finish (no progress for
  // a long while): the expected outcome of a removal, not a failure, as long
  // as every message a worker did complete holds the reference result.
  bool stuck_after_fault = false;  // or after a bypass or restart
  bool removed = false;            // the removal happened before the run ended
  bool faulted = false;            // a removal, bypass or restart happened before the run ended
  uint64_t rejected = 0;           // messages workers rejected (their seal did not match)
  std::string error;               // first problem found (names seed, worker, message)
  uint64_t ticks = 0;
  uint64_t frames = 0;  // frames handed to the engine
  engine::ReasonCounters counters{};
  engine::RingCounters ring{};
};

SimResult run_sim(const SimParams& params);
std::string describe(const SimParams& params);

}  // namespace netreduce::sim
