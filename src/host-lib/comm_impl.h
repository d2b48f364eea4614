// Communicator::Impl: a Transport, the Collective on it, and the progress
// thread that runs the calls in order (blocking calls are async + wait).
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "host-lib/collective.h"
#include "host-lib/daemon.h"
#include "host-lib/transport.h"
#include "netreduce/netreduce.hpp"

namespace netreduce {

struct AllreduceHandle::State {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  Error result;
  Path path = Path::ring;
};

struct Communicator::Impl {
  // Owns whatever keeps the transport alive (verbs context, bootstrap).
  Impl(std::unique_ptr<host::Transport> transport, std::unique_ptr<host::Collective> collective,
       const Options& options, std::shared_ptr<void> keepalive = nullptr);
  ~Impl();

  Error submit(const void* send, void* recv, size_t count, DataType t, Op op, int timeout_ms,
               std::shared_ptr<AllreduceHandle::State>& out);

  Options options;
  std::shared_ptr<void> keepalive;
  std::unique_ptr<host::Transport> transport;
  std::unique_ptr<host::Collective> collective;
  // Rank 0 of an INA communicator: its ring at the daemon (lease renewals;
  // deleted with its credential once the queued calls are done). Null
  // otherwise.
  std::unique_ptr<host::OwnedRing> owned_ring;

 private:
  void run();
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace netreduce
