// The public C++ API over Communicator::Impl (comm_impl.h).
#include <chrono>

#include "host-lib/comm_impl.h"
#include "wire/ina.h"

namespace netreduce {

size_t element_size(DataType t) noexcept { return wire::dtype_size(static_cast<uint8_t>(t)); }

const char* to_string(DataType t) noexcept {
  if (!wire::is_valid_dtype(static_cast<uint8_t>(t))) return "invalid";
  return wire::to_string(static_cast<wire::Dtype>(t)).data();  // literals: NUL-terminated
}
const char* to_string(Op o) noexcept {
  if (!wire::is_valid_op(static_cast<uint8_t>(o))) return "invalid";
  return wire::to_string(static_cast<wire::ReduceOp>(o)).data();
}
const char* to_string(Path p) noexcept { return p == Path::ina ? "ina" : "ring"; }
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
  thread_.join();                      // queued calls finish first; each has a deadline
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

Error Communicator::Impl::submit(const void* send, void* recv, size_t count, DataType t, Op op,
                                 int timeout_ms, std::shared_ptr<AllreduceHandle::State>& out) {
  auto st = std::make_shared<AllreduceHandle::State>();
  st->path = collective->path();
  const int ms = timeout_ms < 0 ? options.op_timeout_ms : timeout_ms;
  {
    std::lock_guard lk(mu_);
    if (stop_) return Error::make(ErrorCode::internal, "communicator is shutting down");
    queue_.push_back([this, st, send, recv, count, t, op, ms] {
      // The deadline runs from when the call starts, not from when it was queued.
      const auto deadline = host::Clock::now() + std::chrono::milliseconds(ms);
      Error e = local ? local->allreduce(*collective, send, recv, count, t, op, deadline)
                      : collective->allreduce(send, recv, count, t, op, deadline);
      std::lock_guard g(st->mu);
      st->result = std::move(e);
      st->done = true;
      st->cv.notify_all();
    });
  }
  cv_.notify_all();
  out = std::move(st);
  return {};
}

Communicator::Communicator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Communicator::~Communicator() = default;

Error Communicator::allreduce(const void* send, void* recv, size_t count, DataType t, Op op,
                              int timeout_ms) {
  AllreduceHandle h;
  if (Error e = allreduce_async(send, recv, count, t, op, h, timeout_ms)) return e;
  return h.wait(-1);
}

Error Communicator::allreduce_async(const void* send, void* recv, size_t count, DataType t, Op op,
                                    AllreduceHandle& handle, int timeout_ms) {
  std::shared_ptr<AllreduceHandle::State> st;
  if (Error e = impl_->submit(send, recv, count, t, op, timeout_ms, st)) return e;
  handle = AllreduceHandle(std::move(st));
  return {};
}

int Communicator::rank() const noexcept {
  return impl_->global_rank >= 0 ? impl_->global_rank : static_cast<int>(impl_->transport->rank());
}
int Communicator::world() const noexcept {
  return impl_->global_world >= 0 ? impl_->global_world
                                  : static_cast<int>(impl_->transport->world());
}
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
  return static_cast<int>(impl_->collective->failovers());
}
uint32_t Communicator::ring_id() const noexcept { return impl_->collective->config().ring_id(0); }
int Communicator::rings() const noexcept { return static_cast<int>(impl_->collective->rings()); }
uint32_t Communicator::ring_id(int ring) const noexcept {
  return ring < 0 ? 0 : impl_->collective->config().ring_id(static_cast<unsigned>(ring));
}
uint16_t Communicator::window() const noexcept { return impl_->collective->config().window; }

Error AllreduceHandle::wait(int timeout_ms) {
  if (!state_) return Error::make(ErrorCode::invalid_argument, "handle: no operation");
  std::unique_lock lk(state_->mu);
  if (timeout_ms < 0) {
    state_->cv.wait(lk, [&] { return state_->done; });
  } else if (!state_->cv.wait_for(lk, std::chrono::milliseconds(timeout_ms),
                                  [&] { return state_->done; })) {
    return Error::make(ErrorCode::timeout, "all-reduce still running after " +
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

}  // namespace netreduce
