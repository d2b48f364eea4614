// Communicator::Impl: a Transport, the Collective on it, and the progress
// thread that runs the calls in order (blocking calls are async + wait).
// Every collective is queued as a job that runs all-reduces through
// allreduce_now (the one-pass collectives: one_pass.h).
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "host-lib/collective.h"
#include "host-lib/daemon.h"
#include "host-lib/local.h"
#include "host-lib/one_pass.h"
#include "host-lib/rina_job.h"
#include "host-lib/transport.h"
#include "netreduce/netreduce.hpp"

namespace netreduce {

struct AllreduceHandle::State {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  Error result;
  Path path = Path::ring;
  CallRecord record;  // set with done, when the call succeeded
};

// invalid_argument unless c is one of PathChoice's values.
Error check_path_choice(PathChoice c);

struct Communicator::Impl {
  // Owns whatever keeps the transport alive (verbs context, bootstrap).
  Impl(std::unique_ptr<host::Transport> transport, std::unique_ptr<host::Collective> collective,
       const Options& options, std::shared_ptr<void> keepalive = nullptr);
  ~Impl();

  // Queues `call` for the progress thread; its deadline is timeout_ms (< 0:
  // Options::op_timeout_ms) from when it starts, not from when it was queued.
  // kind and bytes (per rank, cost_model.h's meaning) choose its path
  // under `choice` (choose), which call_path holds while it runs; a call
  // that succeeds is recorded (record) and counted.
  Error submit(int timeout_ms, CallKind kind, uint64_t bytes, PathChoice choice,
               std::function<Error(host::Clock::time_point)> call,
               std::shared_ptr<AllreduceHandle::State>& out);
  // One all-reduce of the job (the local stage first with local ranks), on
  // call_path; progress thread only.
  Error allreduce_now(const void* send, void* recv, size_t count, DataType t, Op op,
                      host::Clock::time_point deadline);
  // The path of a call of kind k, `bytes` per rank (cost_model.h's
  // meaning): the communicator's path() without a box, after a failover and
  // with local ranks unless `choice` is ring; else what `choice` says (the
  // call's own, or Options::path_choice), for model the model's choice from
  // `links` (progress thread only: it reads the collective's path).
  Path choose(CallKind k, uint64_t bytes, PathChoice choice) const;
  // The job's rank and world (global with local ranks).
  int rank() const noexcept;
  int world() const noexcept;
  // The one-pass collectives (progress thread only), made on first use.
  host::OnePass& one_pass();
  // The pre-multiplied reduce-scatter's scaled copy of its input: bytes of
  // scratch (progress thread only), reused from call to call; 0 ends a
  // call (a buffer past 64 MiB is freed) and returns null.
  uint8_t* scaled_input(size_t bytes);

  Options options;
  // The cost model's figures (link_figures.h): measured at create, or
  // configured.
  LinkFigures links;
  // Calls finished, per kind and path (kind x 2 + path).
  std::array<std::atomic<uint64_t>, kCallKinds * 2> finished{};
  mutable std::mutex last_mu;
  CallRecord last;  // the last call that finished without an error
  // The path of the call running on the progress thread (choose's answer).
  Path call_path = Path::ina;
  std::shared_ptr<void> keepalive;
  std::unique_ptr<host::Transport> transport;
  std::unique_ptr<host::Collective> collective;
  // Rina mode (rina_job.h): every all-reduce runs on its communicators;
  // `collective` is the job's ring (the other collectives). Null otherwise.
  std::unique_ptr<host::RinaJob> rina;
  // Parallel NetReduce (local_size > 1): the host's shared segment; then
  // `collective` is this local rank's ring across the hosts (its rank the
  // host index, its world the host count) and the global rank and world
  // below are the job's. Null and -1 otherwise (the transport's are).
  std::unique_ptr<host::LocalGroup> local;
  int global_rank = -1, global_world = -1;
  // The ring visits the ranks in rank order (Options::ring_order, rack:
  // ring_order.h). Otherwise the transport's rank is the ring's place, the
  // global rank above the job's, and the classic ring forms are off.
  bool ring_in_rank_order = true;
  unsigned host = 0;
  // Rank 0 of an INA communicator: its rings at the daemon, one per stripe
  // (lease renewals; deleted with their credentials once the queued calls
  // are done). Empty otherwise.
  std::vector<std::unique_ptr<host::OwnedRing>> owned_rings;
  // Verbs communicators: a barrier over the bootstrap connection, run at
  // close before the QPs (and rank 0's ring) go. Without it a rank that has
  // finished destroys its QPs while its predecessor's last write may still
  // wait for an ACK that was lost: that write's retransmissions then reach
  // no QP and the predecessor fails with "transport retry counter exceeded"
  // after completing every call. Bounded by op_timeout_ms; a peer that is
  // gone ends it at once (its socket closes).
  std::function<void()> close_barrier;

 private:
  // The record of the call that just succeeded, counted in `finished`.
  CallRecord record(CallKind kind);
  bool rina_call_ = false;  // the call that just ran went through `rina`
  std::unique_ptr<host::OnePass> one_pass_;
  std::vector<uint8_t> scaled_;
  void run();
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace netreduce
