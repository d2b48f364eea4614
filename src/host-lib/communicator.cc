// The public C++ API over Communicator::Impl (comm_impl.h).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <optional>

#include "host-lib/comm_impl.h"
#include "host-lib/cost_model.h"
#include "host-lib/scale.h"
#include "wire/ina.h"

namespace netreduce {

size_t element_size(DataType t) noexcept { return wire::dtype_size(static_cast<uint8_t>(t)); }

const char* to_string(DataType t) noexcept {
  if (!wire::is_valid_dtype(static_cast<uint8_t>(t))) return "invalid";
  return wire::to_string(static_cast<wire::Dtype>(t)).data();  // literals: NUL-terminated
}
const char* to_string(Op o) noexcept {
  if (o == Op::avg) return "avg";
  if (!wire::is_valid_op(static_cast<uint8_t>(o))) return "invalid";
  return wire::to_string(static_cast<wire::ReduceOp>(o)).data();
}
const char* to_string(Path p) noexcept { return p == Path::ina ? "ina" : "ring"; }
const char* to_string(CallKind k) noexcept {
  switch (k) {
    case CallKind::all_reduce:
      return "all_reduce";
    case CallKind::broadcast:
      return "broadcast";
    case CallKind::all_gather:
      return "all_gather";
    case CallKind::reduce_scatter:
      return "reduce_scatter";
    case CallKind::reduce:
      return "reduce";
    case CallKind::barrier:
      return "barrier";
  }
  return "invalid";
}
const char* to_string(PathChoice c) noexcept {
  switch (c) {
    case PathChoice::model:
      return "model";
    case PathChoice::ina:
      return "ina";
    case PathChoice::ring:
      return "ring";
  }
  return "invalid";
}
const char* to_string(ErrorCode c) noexcept {
  switch (c) {
    case ErrorCode::ok:
      return "ok";
    case ErrorCode::invalid_argument:
      return "invalid_argument";
    case ErrorCode::no_device:
      return "no_device";
    case ErrorCode::timeout:
      return "timeout";
    case ErrorCode::transport:
      return "transport";
    case ErrorCode::bootstrap:
      return "bootstrap";
    case ErrorCode::internal:
      return "internal";
  }
  return "unknown";
}

Communicator::Impl::Impl(std::unique_ptr<host::Transport> t, std::unique_ptr<host::Collective> c,
                         const Options& o, std::shared_ptr<void> k)
    : options(o), keepalive(std::move(k)), transport(std::move(t)), collective(std::move(c)) {
  thread_ = std::thread([this] { run(); });
}

Communicator::Impl::~Impl() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();  // queued calls finish first; each has a deadline
  rina.reset();    // its communicators close with their members'
  // A rank that lost its last result to a box that left may need ours. It
  // may learn of the loss only at its call's deadline and then agrees
  // within as long again: wait for it twice the calls' timeout.
  if (collective)
    (void)collective->close(host::Clock::now() +
                            2 * std::chrono::milliseconds(std::max(options.op_timeout_ms, 1)));
  if (close_barrier) close_barrier();  // every rank done: no write of a peer still needs our QPs
  local.reset();                       // unmaps (and unlinks, if still named) the segment
  owned_rings.clear();                 // then the rings are deleted: nothing of ours is in flight
  collective.reset();
  transport.reset();
}

void Communicator::Impl::run() {
  for (;;) {
    std::function<void()> job;
    {
      std::unique_lock lk(mu_);
      cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    job();
  }
}

Error Communicator::Impl::submit(int timeout_ms, CallKind kind, uint64_t bytes, PathChoice choice,
                                 std::function<Error(host::Clock::time_point)> call,
                                 std::shared_ptr<AllreduceHandle::State>& out) {
  auto st = std::make_shared<AllreduceHandle::State>();
  st->path = collective->path();
  const int ms = timeout_ms < 0 ? options.op_timeout_ms : timeout_ms;
  {
    std::lock_guard lk(mu_);
    if (stop_) return Error::make(ErrorCode::internal, "communicator is shutting down");
    queue_.push_back([this, st, ms, kind, bytes, choice, call = std::move(call)] {
      Error e;
      rina_call_ = false;  // set by this call if it goes through `rina`, failed or not
      call_path = choose(kind, bytes, choice);
      try {  // nothing may escape the progress thread (a scratch buffer's bad_alloc)
        e = call(host::Clock::now() + std::chrono::milliseconds(ms));
      } catch (const std::exception& x) {
        e = Error::make(ErrorCode::internal, std::string("call failed: ") + x.what());
      }
      CallRecord rec;
      if (e.ok()) rec = record(kind);
      std::lock_guard g(st->mu);
      st->result = std::move(e);
      st->record = rec;
      if (st->result.ok()) st->path = rec.path;
      st->done = true;
      st->cv.notify_all();
    });
  }
  cv_.notify_all();
  out = std::move(st);
  return {};
}

CallRecord Communicator::Impl::record(CallKind kind) {
  const host::Collective::CallRecord& r = collective->last_call();
  // Nothing on the wire (zero elements, one rank): the path it was given.
  CallRecord rec{r.dependent_steps ? r.path : call_path, r.dependent_steps, r.bytes_sent};
  if (rina_call_) {  // its rack stage's path; the rack's pass, the ring, the spread
    const host::RinaJob& j = *rina;
    const auto G = static_cast<unsigned>(j.plan.groups.size());
    rec = {j.rina->rack_path(), 2 * (G - 1) + (j.rack ? 2 : 0), 0};
  }
  finished[static_cast<size_t>(kind) * 2 + static_cast<size_t>(rec.path)].fetch_add(
      1, std::memory_order_relaxed);
  std::lock_guard lk(last_mu);
  last = rec;
  return rec;
}

Error Communicator::Impl::allreduce_now(const void* send, void* recv, size_t count, DataType t,
                                        Op op, host::Clock::time_point deadline) {
  // Each Rina stage gets its communicator's op_timeout_ms: a rack whose box
  // vanished finds out at its stage's deadline and finishes on its ring, and
  // the lanes must still have their own time after that.
  if (rina) {
    rina_call_ = true;
    return rina->rina->allreduce(send, recv, count, t, op, -1);
  }
  const bool on_ring = call_path == Path::ring && collective->path() == Path::ina;
  if (local) return local->allreduce(*collective, send, recv, count, t, op, deadline, on_ring);
  if (on_ring) return collective->ring_allreduce(send, recv, count, t, op, deadline);
  return collective->allreduce(send, recv, count, t, op, deadline);
}

Error check_path_choice(PathChoice c) {
  if (c == PathChoice::model || c == PathChoice::ina || c == PathChoice::ring) return {};
  return Error::make(
      ErrorCode::invalid_argument,
      fmt::format("path_choice: {} is not model (0), ina (1) or ring (2)", static_cast<int>(c)));
}

Path Communicator::Impl::choose(CallKind k, uint64_t bytes, PathChoice choice) const {
  // After a mixed failover the next call is the others' ring all-reduce:
  // "ina" here only means "not a ring form": allreduce() runs it on the
  // ring path, where the collective now is.
  if (collective->next_is_allreduce()) return Path::ina;
  const Path now = collective->path();
  // With local ranks only a forced ring is taken (the model does not
  // know the local stage).
  if (now == Path::ring || (local && choice != PathChoice::ring)) return now;
  switch (choice) {
    case PathChoice::ina:
      return Path::ina;
    case PathChoice::ring:
      return Path::ring;
    case PathChoice::model:
      break;
  }
  const host::CollectiveConfig& cc = collective->config();
  host::cost::Params p;
  p.alpha_s = links.alpha_us * 1e-6;
  p.bandwidth_Bps = links.gbps * 1e9 / 8;
  p.box_s = links.box_us * 1e-6;
  p.msg_len = cc.msg_len;
  p.payload_bytes = cc.pmtu;
  p.window = cc.window;
  const auto world_ranks = static_cast<unsigned>(world());
  if (host::cost::check(p, world_ranks)) return Path::ina;  // figures it cannot use: the box
  // Out of rank order the classic ring forms are off: an all-gather or a
  // reduce-scatter is one all-reduce of world x its bytes on either path.
  if (!ring_in_rank_order && (k == CallKind::all_gather || k == CallKind::reduce_scatter)) {
    k = CallKind::all_reduce;
    bytes *= world_ranks;
  }
  return host::cost::estimate(p, k, world_ranks, bytes).choice;
}

int Communicator::Impl::rank() const noexcept {
  return global_rank >= 0 ? global_rank : static_cast<int>(transport->rank());
}
int Communicator::Impl::world() const noexcept {
  return global_world >= 0 ? global_world : static_cast<int>(transport->world());
}

host::OnePass& Communicator::Impl::one_pass() {
  if (one_pass_) return *one_pass_;
  // With local ranks the classic ring forms do not apply (a host's ranks
  // meet in the local stage first), nor with a ring out of rank order (its
  // shards would follow the ring's places): every collective stays one
  // all-reduce.
  host::RingForms ring;
  if (!local && ring_in_rank_order) {
    host::Collective* c = collective.get();
    ring.path = [this] { return call_path; };
    ring.reduce_scatter = [c](const void* s, void* r, size_t n, DataType t, Op op,
                              host::Clock::time_point d) {
      return c->ring_reduce_scatter(s, r, n, t, op, d);
    };
    ring.all_gather = [c](const void* s, void* r, size_t n, DataType t, host::Clock::time_point d) {
      return c->ring_all_gather(s, r, n, t, d);
    };
  }
  one_pass_ = std::make_unique<host::OnePass>(
      [this](const void* s, void* r, size_t n, DataType t, Op op, host::Clock::time_point d) {
        return allreduce_now(s, r, n, t, op, d);
      },
      static_cast<unsigned>(rank()), static_cast<unsigned>(world()), std::move(ring));
  return *one_pass_;
}

uint8_t* Communicator::Impl::scaled_input(size_t bytes) {
  constexpr size_t kKeepBytes = size_t{64} << 20;  // larger ones are freed after their call
  if (bytes == 0) {
    if (scaled_.capacity() > kKeepBytes) std::vector<uint8_t>().swap(scaled_);
    return nullptr;
  }
  if (scaled_.size() < bytes) scaled_.resize(bytes);
  return scaled_.data();
}

Communicator::Communicator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Communicator::~Communicator() = default;

namespace {

// The blocking form of an async call: start it, then wait for its result.
template <typename Start>
Error run_blocking(Start&& start) {
  AllreduceHandle h;
  if (Error e = start(h)) return e;
  return h.wait(-1);
}

// Queues call(impl, deadline) on the progress thread; `handle` reports it.
// kind and bytes: what the path choice sees (Impl::choose); `choice`: the
// call's own, Options::path_choice when empty.
template <typename Call>
Error start(Communicator::Impl& impl, int timeout_ms, CallKind kind, uint64_t bytes, Call call,
            AllreduceHandle& handle, std::optional<PathChoice> choice = {}) {
  std::shared_ptr<AllreduceHandle::State> st;
  if (Error e = impl.submit(
          timeout_ms, kind, bytes, choice.value_or(impl.options.path_choice),
          [&impl, call](host::Clock::time_point d) { return call(impl, d); }, st))
    return e;
  handle = AllreduceHandle(std::move(st));
  return {};
}

// The reduction `op` of a call whose result is count elements at out (null:
// none on this rank): sum(the wire's op), then for avg every element divided
// by the world (scale.h).
template <typename Sum>
Error reduced(Communicator::Impl& impl, Op op, void* out, size_t count, DataType t, Sum sum) {
  if (Error e = sum(op == Op::avg ? Op::sum : op)) return e;
  if (op == Op::avg && out != nullptr)
    host::divide_elements(out, count, t, static_cast<unsigned>(impl.world()));
  return {};
}

// A pre-multiplied call's type and factor, checked when it is started; the
// error names the call ("all-reduce premul of 8 int32: factor: ...").
Error check_premul(const char* what, size_t count, DataType t, double factor) {
  Error e = host::Collective::check_dtype(t);
  if (e.ok()) e = host::check_factor(factor, t);
  if (!e.ok())
    e.message = fmt::format("{} premul of {} {}: {}", what, count, to_string(t), e.message);
  return e;
}

}  // namespace

Error Communicator::allreduce(const void* send, void* recv, size_t count, DataType t, Op op,
                              int timeout_ms) {
  return run_blocking(
      [&](AllreduceHandle& h) { return allreduce_async(send, recv, count, t, op, h, timeout_ms); });
}

Error Communicator::allreduce_async(const void* send, void* recv, size_t count, DataType t, Op op,
                                    AllreduceHandle& handle, int timeout_ms) {
  return start(
      *impl_, timeout_ms, CallKind::all_reduce, count * element_size(t),
      [=](Impl& i, auto d) {
        return reduced(i, op, recv, count, t,
                       [&](Op o) { return i.allreduce_now(send, recv, count, t, o, d); });
      },
      handle);
}

Error Communicator::broadcast(void* buf, size_t count, DataType t, int root, int timeout_ms) {
  return run_blocking(
      [&](AllreduceHandle& h) { return broadcast_async(buf, count, t, root, h, timeout_ms); });
}

Error Communicator::broadcast_async(void* buf, size_t count, DataType t, int root,
                                    AllreduceHandle& handle, int timeout_ms) {
  return start(
      *impl_, timeout_ms, CallKind::broadcast, count * element_size(t),
      [=](Impl& i, auto d) { return i.one_pass().broadcast(buf, count, t, root, d); }, handle);
}

Error Communicator::all_gather(const void* send, void* recv, size_t count, DataType t,
                               int timeout_ms) {
  return run_blocking(
      [&](AllreduceHandle& h) { return all_gather_async(send, recv, count, t, h, timeout_ms); });
}

Error Communicator::all_gather_async(const void* send, void* recv, size_t count, DataType t,
                                     AllreduceHandle& handle, int timeout_ms) {
  return start(
      *impl_, timeout_ms, CallKind::all_gather, count * element_size(t),
      [=](Impl& i, auto d) { return i.one_pass().all_gather(send, recv, count, t, d); }, handle);
}

Error Communicator::reduce_scatter(const void* send, void* recv, size_t recv_count, DataType t,
                                   Op op, int timeout_ms) {
  return run_blocking([&](AllreduceHandle& h) {
    return reduce_scatter_async(send, recv, recv_count, t, op, h, timeout_ms);
  });
}

Error Communicator::reduce_scatter_async(const void* send, void* recv, size_t recv_count,
                                         DataType t, Op op, AllreduceHandle& handle,
                                         int timeout_ms) {
  return start(
      *impl_, timeout_ms, CallKind::reduce_scatter, recv_count * element_size(t),
      [=](Impl& i, auto d) {
        return reduced(i, op, recv, recv_count, t, [&](Op o) {
          return i.one_pass().reduce_scatter(send, recv, recv_count, t, o, d);
        });
      },
      handle);
}

Error Communicator::reduce(const void* send, void* recv, size_t count, DataType t, Op op, int root,
                           int timeout_ms) {
  return run_blocking([&](AllreduceHandle& h) {
    return reduce_async(send, recv, count, t, op, root, h, timeout_ms);
  });
}

Error Communicator::reduce_async(const void* send, void* recv, size_t count, DataType t, Op op,
                                 int root, AllreduceHandle& handle, int timeout_ms) {
  return start(
      *impl_, timeout_ms, CallKind::reduce, count * element_size(t),
      [=](Impl& i, auto d) {
        return reduced(i, op, i.rank() == root ? recv : nullptr, count, t,
                       [&](Op o) { return i.one_pass().reduce(send, recv, count, t, o, root, d); });
      },
      handle);
}

Error Communicator::allreduce_premul(const void* send, void* recv, size_t count, DataType t,
                                     double factor, int timeout_ms) {
  return run_blocking([&](AllreduceHandle& h) {
    return allreduce_premul_async(send, recv, count, t, factor, h, timeout_ms);
  });
}

Error Communicator::allreduce_premul_async(const void* send, void* recv, size_t count, DataType t,
                                           double factor, AllreduceHandle& handle, int timeout_ms) {
  if (Error e = check_premul("all-reduce", count, t, factor)) return e;
  // recv is the scratch buffer: the scaled input, then the sum in place.
  return start(
      *impl_, timeout_ms, CallKind::all_reduce, count * element_size(t),
      [=](Impl& i, auto d) {
        if (Error e = host::Collective::check_args(send, recv, count, t, Op::sum)) return e;
        host::multiply_elements(send, recv, count, t, factor);
        return i.allreduce_now(recv, recv, count, t, Op::sum, d);
      },
      handle);
}

Error Communicator::reduce_scatter_premul(const void* send, void* recv, size_t recv_count,
                                          DataType t, double factor, int timeout_ms) {
  return run_blocking([&](AllreduceHandle& h) {
    return reduce_scatter_premul_async(send, recv, recv_count, t, factor, h, timeout_ms);
  });
}

Error Communicator::reduce_scatter_premul_async(const void* send, void* recv, size_t recv_count,
                                                DataType t, double factor, AllreduceHandle& handle,
                                                int timeout_ms) {
  if (Error e = check_premul("reduce-scatter", recv_count, t, factor)) return e;
  return start(
      *impl_, timeout_ms, CallKind::reduce_scatter, recv_count * element_size(t),
      [=](Impl& i, auto d) {
        const size_t world = static_cast<size_t>(i.world()), es = element_size(t);
        // A size or a buffer reduce_scatter refuses: its error, nothing scaled.
        if (recv_count > host::kMaxCallBytes / es / world ||
            (recv_count > 0 && (send == nullptr || recv == nullptr)))
          return i.one_pass().reduce_scatter(send, recv, recv_count, t, Op::sum, d);
        uint8_t* scaled = i.scaled_input(recv_count * world * es);
        host::multiply_elements(send, scaled, recv_count * world, t, factor);
        Error e = i.one_pass().reduce_scatter(scaled, recv, recv_count, t, Op::sum, d);
        i.scaled_input(0);
        return e;
      },
      handle);
}

Error Communicator::barrier(int timeout_ms) {
  return run_blocking([&](AllreduceHandle& h) { return barrier_async(h, timeout_ms); });
}

Error Communicator::barrier_async(AllreduceHandle& handle, int timeout_ms) {
  return start(
      *impl_, timeout_ms, CallKind::barrier, 4,
      [](Impl& i, auto d) { return i.one_pass().barrier(d); }, handle);
}

Error Communicator::barrier(PathChoice path, int timeout_ms) {
  return run_blocking([&](AllreduceHandle& h) { return barrier_async(path, h, timeout_ms); });
}

Error Communicator::barrier_async(PathChoice path, AllreduceHandle& handle, int timeout_ms) {
  if (Error e = check_path_choice(path)) {
    e.message = "barrier: " + e.message;
    return e;
  }
  return start(
      *impl_, timeout_ms, CallKind::barrier, 4,
      [](Impl& i, auto d) { return i.one_pass().barrier(d); }, handle, path);
}

int Communicator::rank() const noexcept { return impl_->rank(); }
int Communicator::world() const noexcept { return impl_->world(); }
int Communicator::local_rank() const noexcept {
  return impl_->local ? static_cast<int>(impl_->local->local_rank()) : 0;
}
int Communicator::local_size() const noexcept {
  return impl_->local ? static_cast<int>(impl_->local->local_size()) : 1;
}
int Communicator::host() const noexcept {
  return impl_->local ? static_cast<int>(impl_->host) : static_cast<int>(impl_->transport->rank());
}
Path Communicator::path() const noexcept { return impl_->collective->path(); }
const std::string& Communicator::path_reason() const noexcept {
  return impl_->collective->path_reason();
}
int Communicator::failovers() const noexcept {
  const host::RinaJob* r = impl_->rina.get();
  if (r) return r->rack ? r->rack->failovers() : 0;  // the rack stage's
  return static_cast<int>(impl_->collective->failovers());
}
uint32_t Communicator::ring_id() const noexcept { return impl_->collective->config().ring_id(0); }
int Communicator::rings() const noexcept { return static_cast<int>(impl_->collective->rings()); }
uint32_t Communicator::ring_id(int ring) const noexcept {
  return ring < 0 ? 0 : impl_->collective->config().ring_id(static_cast<unsigned>(ring));
}
uint16_t Communicator::window() const noexcept { return impl_->collective->config().window; }
const LinkFigures& Communicator::links() const noexcept { return impl_->links; }
uint64_t Communicator::calls(CallKind k, Path p) const noexcept {
  const auto i = static_cast<size_t>(k) * 2 + static_cast<size_t>(p);
  return i < impl_->finished.size() ? impl_->finished[i].load(std::memory_order_relaxed) : 0;
}
CallRecord Communicator::last_call() const noexcept {
  std::lock_guard lk(impl_->last_mu);
  return impl_->last;
}

Error AllreduceHandle::wait(int timeout_ms) {
  if (!state_) return Error::make(ErrorCode::invalid_argument, "handle: no operation");
  std::unique_lock lk(state_->mu);
  if (timeout_ms < 0) {
    state_->cv.wait(lk, [&] { return state_->done; });
  } else if (!state_->cv.wait_for(lk, std::chrono::milliseconds(timeout_ms),
                                  [&] { return state_->done; })) {
    return Error::make(ErrorCode::timeout, "the call is still running after " +
                                               std::to_string(timeout_ms) +
                                               " ms (it has its own deadline; wait again)");
  }
  return state_->result;
}

bool AllreduceHandle::test(Error* result) {
  if (!state_) {
    if (result) *result = Error::make(ErrorCode::invalid_argument, "handle: no operation");
    return true;
  }
  std::lock_guard lk(state_->mu);
  if (state_->done && result) *result = state_->result;
  return state_->done;
}

Path AllreduceHandle::path() const noexcept { return state_ ? state_->path : Path::ring; }

CallRecord AllreduceHandle::record() const noexcept {
  if (!state_) return {};
  std::lock_guard lk(state_->mu);
  return state_->done && state_->result.ok() ? state_->record : CallRecord{};
}

}  // namespace netreduce
