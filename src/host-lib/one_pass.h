// Broadcast, all-gather, reduce-scatter, reduce and barrier, each made of
// exactly one all-reduce, so each takes the path all-reduce takes (the box's
// single pass, or the ring), with its deadline, seal checks, failover,
// striping and local ranks; except that on the ring path, without local
// ranks, all-gather and reduce-scatter run the classic ring algorithms
// (RingForms: Collective::ring_all_gather, ring_reduce_scatter).
// Design: docs/design.md#one-pass-collectives.
//
// The trick for data movement: a sum in which, at every byte position, at
// most one rank contributes non-zero bits is that rank's bits. Summed as
// int32 (the buffer padded with zeros to 4 bytes), no carry ever happens, so
// broadcast and all-gather are bit-exact for every dtype: -0.0, NaN
// payloads, infinities and denormals arrive as sent.
//
// Example: P = 3, rank 1, all_gather of 2 fp16 {a, b} (4 bytes each rank):
//  1. recv (12 bytes) = 00 00 00 00 | a b | 00 00 00 00: zeros, own part
//     at 1 x 4 bytes.
//  2. One all-reduce of those 3 int32 with sum: rank 0 contributes its
//     {x, y} in word 0, rank 2 its {u, v} in word 2.
//  3. recv = x y | a b | u v on every rank.
//  On the ring path without local ranks: the ring all-gather, 2 steps that
//  copy {a, b}, {x, y} and {u, v} as raw bytes, 4 bytes sent per step.
// - broadcast: the root keeps its buffer, the others zero theirs; one raw
//   sum as above.
// - reduce_scatter: the all-reduce of the P x count input into a scratch
//   buffer; rank r keeps elements [r count, (r + 1) count). Its values are
//   the all-reduce's (same order rule). The classic form: shard r folded
//   from rank r + 1 round to rank r (collective.h).
// - reduce: the all-reduce; the root keeps the result.
// - barrier: an int32 1 from every rank; the sum must be P, or the call
//   fails (a rank made another call).
// Wire cost: all-gather sends P x count elements per rank (the box's single
// pass instead of the ring's P - 1 dependent steps); the others send what
// their all-reduce sends; the classic forms (P - 1) x count in P - 1 steps.
// Broadcast and reduce stay all-reduces on the ring (rare in training), a
// barrier is 4 bytes either way. The path is read at the call's start: a
// call that fails over inside its all-reduce stays that all-reduce.
//
// A failed call leaves recv (and a non-root's broadcast buffer) undefined:
// they are zeroed before the all-reduce starts.
//
// Threads: an OnePass belongs to the communicator's progress thread (its
// scratch buffer is reused from call to call, up to 64 MiB).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "host-lib/transport.h"
#include "netreduce/netreduce.hpp"

namespace netreduce::host {

// One all-reduce on the communicator (local stage included).
using AllreduceFn = std::function<Error(const void* send, void* recv, size_t count, DataType t,
                                        Op op, Clock::time_point deadline)>;

// The classic ring algorithms of a communicator without local ranks
// (Collective::path, ring_reduce_scatter, ring_all_gather); empty members:
// none, every collective is one all-reduce.
struct RingForms {
  std::function<Path()> path;  // the path the next call takes
  std::function<Error(const void* send, void* recv, size_t recv_count, DataType t, Op op,
                      Clock::time_point deadline)>
      reduce_scatter;
  std::function<Error(const void* send, void* recv, size_t count, DataType t,
                      Clock::time_point deadline)>
      all_gather;
};

class OnePass {
 public:
  // rank and world: the job's (global) ones; ring: the classic forms, used
  // when the ring path is the path at a call's start.
  OnePass(AllreduceFn allreduce, unsigned rank, unsigned world, RingForms ring = {})
      : allreduce_(std::move(allreduce)), ring_(std::move(ring)), rank_(rank), world_(world) {}

  Error broadcast(void* buf, size_t count, DataType t, int root, Clock::time_point deadline);
  // recv: world x count elements. send may be recv's own part (in place).
  Error all_gather(const void* send, void* recv, size_t count, DataType t,
                   Clock::time_point deadline);
  // send: world x recv_count elements; recv: recv_count elements.
  Error reduce_scatter(const void* send, void* recv, size_t recv_count, DataType t, Op op,
                       Clock::time_point deadline);
  // recv: count elements at the root, unused (may be null) elsewhere.
  Error reduce(const void* send, void* recv, size_t count, DataType t, Op op, int root,
               Clock::time_point deadline);
  Error barrier(Clock::time_point deadline);

 private:
  // Sums bytes [0, n) of buf across the ranks as int32 (padded).
  Error raw_sum(uint8_t* buf, size_t n, Clock::time_point deadline);
  Error check_root(int root) const;
  // count x ranks x element size, or an error past the all-reduce's limit.
  Error bytes_of(size_t count, DataType t, unsigned ranks, size_t& out) const;
  uint8_t* scratch(size_t n);
  // The call's result, its error named after the collective ("broadcast of
  // 1001 fp16: ..."); frees a scratch buffer grown past what is kept.
  Error finish(const char* what, size_t count, DataType t, Error e);
  // The next call takes the ring path and the classic forms are there.
  bool classic() const { return ring_.path && ring_.path() == Path::ring; }

  AllreduceFn allreduce_;
  RingForms ring_;
  unsigned rank_, world_;
  std::vector<uint8_t> scratch_;
};

}  // namespace netreduce::host
