// Collectives made of one all-reduce (one_pass.h).
#include "host-lib/one_pass.h"

#include <cstring>
#include <string>

#include "host-lib/collective.h"

namespace netreduce::host {
namespace {

// A scratch buffer larger than this is freed after its call.
constexpr size_t kKeepScratchBytes = size_t{64} << 20;

Error invalid(std::string m) { return Error::make(ErrorCode::invalid_argument, std::move(m)); }

bool overlap(const void* a, size_t an, const void* b, size_t bn) {
  const auto* x = static_cast<const uint8_t*>(a);
  const auto* y = static_cast<const uint8_t*>(b);
  return an > 0 && bn > 0 && x < y + bn && y < x + an;
}

}  // namespace

uint8_t* OnePass::scratch(size_t n) {
  if (scratch_.size() < n) scratch_.resize(n);
  return scratch_.data();
}

Error OnePass::finish(const char* what, size_t count, DataType t, Error e) {
  if (scratch_.capacity() > kKeepScratchBytes) std::vector<uint8_t>().swap(scratch_);
  if (!e.ok())
    e.message =
        std::string(what) + " of " + std::to_string(count) + " " + to_string(t) + ": " + e.message;
  return e;
}

Error OnePass::check_root(int root) const {
  if (root < 0 || static_cast<unsigned>(root) >= world_)
    return invalid("root: " + std::to_string(root) + " is not a rank (world " +
                   std::to_string(world_) + ")");
  return {};
}

Error OnePass::bytes_of(size_t count, DataType t, unsigned ranks, size_t& out) const {
  if (Error e = Collective::check_dtype(t)) return e;
  const size_t es = element_size(t);
  if (count > kMaxCallBytes / es / ranks)
    return invalid("count: " + std::to_string(count) + " elements" +
                   (ranks > 1 ? " x " + std::to_string(ranks) + " ranks" : std::string()) +
                   " is too large");
  out = count * es * ranks;
  return {};
}

Error OnePass::raw_sum(uint8_t* buf, size_t n, Clock::time_point deadline) {
  if (n % 4 == 0) return allreduce_(buf, buf, n / 4, DataType::int32, Op::sum, deadline);
  const size_t padded = n + (4 - n % 4);
  uint8_t* s = scratch(padded);
  std::memcpy(s, buf, n);
  std::memset(s + n, 0, padded - n);
  if (Error e = allreduce_(s, s, padded / 4, DataType::int32, Op::sum, deadline)) return e;
  std::memcpy(buf, s, n);
  return {};
}

Error OnePass::broadcast(void* buf, size_t count, DataType t, int root,
                         Clock::time_point deadline) {
  return finish("broadcast", count, t, [&]() -> Error {
    size_t n = 0;
    if (Error e = bytes_of(count, t, 1, n)) return e;
    if (Error e = check_root(root)) return e;
    if (n > 0 && buf == nullptr) return invalid("buf: null buffer");
    if (n > 0 && rank_ != static_cast<unsigned>(root)) std::memset(buf, 0, n);
    return raw_sum(static_cast<uint8_t*>(buf), n, deadline);
  }());
}

Error OnePass::all_gather(const void* send, void* recv, size_t count, DataType t,
                          Clock::time_point deadline) {
  return finish("all-gather", count, t, [&]() -> Error {
    size_t n = 0, all = 0;
    if (Error e = bytes_of(count, t, 1, n)) return e;
    if (Error e = bytes_of(count, t, world_, all)) return e;
    if (n > 0 && (send == nullptr || recv == nullptr))
      return invalid(std::string(send == nullptr ? "send" : "recv") + ": null buffer");
    auto* out = static_cast<uint8_t*>(recv);
    uint8_t* mine = n > 0 ? out + rank_ * n : out;
    if (send != mine && overlap(send, n, recv, all))
      return invalid("send: overlaps recv other than at this rank's part (in place is recv + " +
                     std::to_string(rank_) + " x count elements)");
    if (classic()) return ring_.all_gather(send, recv, count, t, deadline);
    if (n > 0) {
      std::memset(out, 0, rank_ * n);
      std::memset(mine + n, 0, all - (rank_ + 1) * n);
      if (send != mine) std::memcpy(mine, send, n);
    }
    return raw_sum(out, all, deadline);
  }());
}

Error OnePass::reduce_scatter(const void* send, void* recv, size_t recv_count, DataType t, Op op,
                              Clock::time_point deadline) {
  return finish("reduce-scatter", recv_count, t, [&]() -> Error {
    size_t n = 0, all = 0;
    if (Error e = bytes_of(recv_count, t, 1, n)) return e;
    if (Error e = bytes_of(recv_count, t, world_, all)) return e;
    if (Error e = Collective::check_op(op)) return e;
    if (n > 0 && (send == nullptr || recv == nullptr))
      return invalid(std::string(send == nullptr ? "send" : "recv") + ": null buffer");
    if (classic()) {
      // recv inside send other than as its own shard: through the scratch.
      const uint8_t* own = static_cast<const uint8_t*>(send) + rank_ * n;
      if (recv == own || !overlap(send, all, recv, n))
        return ring_.reduce_scatter(send, recv, recv_count, t, op, deadline);
      if (Error e = ring_.reduce_scatter(send, scratch(n), recv_count, t, op, deadline)) return e;
      std::memcpy(recv, scratch_.data(), n);
      return {};
    }
    uint8_t* s = scratch(all);
    if (Error e = allreduce_(send, s, recv_count * world_, t, op, deadline)) return e;
    if (n > 0) std::memcpy(recv, s + rank_ * n, n);  // recv may be send's own part
    return {};
  }());
}

Error OnePass::reduce(const void* send, void* recv, size_t count, DataType t, Op op, int root,
                      Clock::time_point deadline) {
  return finish("reduce", count, t, [&]() -> Error {
    size_t n = 0;
    if (Error e = bytes_of(count, t, 1, n)) return e;
    if (Error e = check_root(root)) return e;
    if (Error e = Collective::check_op(op)) return e;
    // Only the root's recv is written: elsewhere it may be the input itself.
    void* out = rank_ == static_cast<unsigned>(root) ? recv : scratch(n);
    return allreduce_(send, out, count, t, op, deadline);
  }());
}

Error OnePass::barrier(Clock::time_point deadline) {
  const int32_t one = 1;
  int32_t sum = 0;
  if (Error e = allreduce_(&one, &sum, 1, DataType::int32, Op::sum, deadline))
    return finish("barrier", 1, DataType::int32, std::move(e));
  if (sum != static_cast<int32_t>(world_))
    return Error::make(ErrorCode::internal, "barrier: the ranks' sum is " + std::to_string(sum) +
                                                ", not the world " + std::to_string(world_) +
                                                " (a rank made another call)");
  return {};
}

}  // namespace netreduce::host
