// The data plane's control protocol: names, builders and the client; the
// theory of operation is in dataplane_protocol.h.
#include "common/dataplane_protocol.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "common/ring_json.h"

namespace netreduce {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

int ms_left(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return left.count() > 0 ? static_cast<int>(left.count()) : 0;
}

}  // namespace

namespace dpcmd {

bool is_read_only(std::string_view cmd) noexcept {
  return cmd == kPing || cmd == kStatus || cmd == kStats || cmd == kListRings || cmd == kGetRing ||
         cmd == kListFaults;
}

json ping() { return {{"cmd", kPing}}; }
json status() { return {{"cmd", kStatus}}; }
json stats() { return {{"cmd", kStats}}; }
json list_rings() { return {{"cmd", kListRings}}; }
json get_ring(uint32_t id) { return {{"cmd", kGetRing}, {"id", id}}; }
json install_ring(const RingSpec& spec) {
  return {{"cmd", kInstallRing}, {"ring", ring_to_json(spec)}};
}
json remove_ring(uint32_t id) { return {{"cmd", kRemoveRing}, {"id", id}}; }
json set_mode(std::string_view mode) { return {{"cmd", kSetMode}, {"mode", std::string(mode)}}; }
json set_polling(bool enabled) { return {{"cmd", kSetPolling}, {"enabled", enabled}}; }
json shutdown() { return {{"cmd", kShutdown}}; }
json set_fault(std::optional<uint32_t> ring, std::string_view kind, double fraction,
               uint32_t duration_ms) {
  return {{"cmd", kSetFault},
          {"ring", ring ? json(*ring) : json("all")},
          {"kind", std::string(kind)},
          {"fraction", fraction},
          {"duration_ms", duration_ms}};
}
json clear_faults(std::optional<uint32_t> ring) {
  json j = {{"cmd", kClearFaults}};
  if (ring) j["ring"] = *ring;
  return j;
}
json list_faults() { return {{"cmd", kListFaults}}; }

}  // namespace dpcmd

StatusCode status_code_from_string(std::string_view name) noexcept {
  for (StatusCode c :
       {StatusCode::ok, StatusCode::invalid_argument, StatusCode::not_found,
        StatusCode::already_exists, StatusCode::conflict, StatusCode::resource_exhausted,
        StatusCode::unavailable, StatusCode::unimplemented, StatusCode::internal})
    if (name == to_string(c)) return c;
  return StatusCode::internal;
}

DataplaneClient::DataplaneClient(std::string socket_path, std::chrono::milliseconds timeout)
    : path_(std::move(socket_path)),
      timeout_(timeout),
      cancel_fd_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {}

DataplaneClient::~DataplaneClient() {
  std::lock_guard lock(mu_);
  close_locked();
  if (cancel_fd_ >= 0) ::close(cancel_fd_);
}

void DataplaneClient::cancel() noexcept {
  cancelled_ = true;
  const uint64_t one = 1;
  if (cancel_fd_ >= 0) (void)!::write(cancel_fd_, &one, sizeof one);
}

Status DataplaneClient::cancelled() const {
  return {StatusCode::unavailable, "", "data plane at " + path_ + ": call cancelled (stopping)"};
}

bool DataplaneClient::wait_locked(int fd, short events, Clock::time_point deadline) const {
  for (;;) {
    if (cancelled_) return false;
    pollfd p[2] = {{fd, events, 0}, {cancel_fd_, POLLIN, 0}};
    const int n = ::poll(p, cancel_fd_ >= 0 ? 2 : 1, ms_left(deadline));
    if (n > 0) return !cancelled_ && (p[0].revents & (events | POLLHUP | POLLERR)) != 0;
    if (n == 0) return false;
    if (errno != EINTR) return false;
  }
}

void DataplaneClient::close_locked() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  buf_.clear();
  fd_open_ = false;
}

Status DataplaneClient::connect_locked(Clock::time_point deadline) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path_.size() >= sizeof(addr.sun_path))
    return {StatusCode::unavailable, "", "data plane socket path too long: " + path_};
  std::memcpy(addr.sun_path, path_.data(), path_.size());
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return {StatusCode::unavailable, "", std::string("socket: ") + std::strerror(errno)};
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    const int err = errno;
    bool ok = false;
    if (err == EINPROGRESS) {  // AF_UNIX EAGAIN: backlog full, not connecting
      int so = 0;
      socklen_t len = sizeof(so);
      ok = wait_locked(fd, POLLOUT, deadline) &&
           ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &so, &len) == 0 && so == 0;
    }
    if (!ok) {
      ::close(fd);
      return {StatusCode::unavailable, "",
              "cannot connect to the data plane at " + path_ + ": " + std::strerror(err)};
    }
  }
  fd_ = fd;
  fd_open_ = true;
  ++connects_;
  return {};
}

Status DataplaneClient::call(const json& request, json& reply) {
  std::unique_lock lock(mu_, std::defer_lock);
  // One wait, not slices, so that waiters keep their place in the queue;
  // after cancel() the holder's poll ends at once, and each waiter in turn
  // returns as soon as it has the lock.
  if (!lock.try_lock_for(timeout_))
    return {StatusCode::unavailable, "dataplane.timeout_ms",
            "data plane at " + path_ + ": other requests held the connection for " +
                std::to_string(timeout_.count()) + " ms (dataplane.timeout_ms)"};
  if (cancelled_) return cancelled();
  const auto deadline = Clock::now() + timeout_;
  const bool reused = fd_ >= 0;
  bool delivered = false;
  Status s = attempt_locked(request, reply, deadline, delivered);
  // A kept-open connection can be dead without our knowing (the data plane
  // restarted, or closed it). Try once more on a fresh connection when the
  // request certainly did not reach the data plane, or when it changes
  // nothing (reads), whatever happened to it.
  if (!s && s.code() == StatusCode::unavailable && reused && fd_ < 0 && !cancelled_ &&
      (!delivered || (request.contains("cmd") && request["cmd"].is_string() &&
                      dpcmd::is_read_only(request["cmd"].get_ref<const std::string&>()))))
    s = attempt_locked(request, reply, deadline, delivered);
  return s;
}

Status DataplaneClient::wait_until_connected(std::chrono::milliseconds wait) {
  const auto until = Clock::now() + wait;
  for (;;) {
    if (cancelled_) return cancelled();
    {
      std::unique_lock lock(mu_, std::defer_lock);
      if (!lock.try_lock_until(until))
        return {StatusCode::unavailable, "", "data plane at " + path_ + ": busy"};
      if (fd_ >= 0) return {};
      const Status s = connect_locked(std::min(until, Clock::now() + timeout_));
      if (s || Clock::now() >= until) return s;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

Status DataplaneClient::attempt_locked(const json& request, json& reply, Clock::time_point deadline,
                                       bool& delivered) {
  delivered = false;
  if (fd_ < 0)
    if (Status s = connect_locked(deadline); !s) return s;
  auto lost = [&](const std::string& why) {
    close_locked();
    return Status(StatusCode::unavailable, "", "data plane at " + path_ + ": " + why);
  };
  const std::string line = request.dump() + "\n";
  size_t off = 0;
  while (off < line.size()) {
    const ssize_t n = ::send(fd_, line.data() + off, line.size() - off, MSG_NOSIGNAL);
    if (n > 0) {
      off += static_cast<size_t>(n);
    } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      if (!wait_locked(fd_, POLLOUT, deadline))
        return cancelled_ ? (close_locked(), cancelled()) : lost("request not accepted in time");
    } else {
      return lost(std::string("send: ") + std::strerror(errno));
    }
  }
  delivered = true;  // as far as we can tell: it was written to the socket
  size_t nl;
  while ((nl = buf_.find('\n')) == std::string::npos) {
    if (buf_.size() > kMaxReply) return lost("reply longer than 16 MiB");
    if (!wait_locked(fd_, POLLIN, deadline))
      return cancelled_ ? (close_locked(), cancelled()) : lost("no reply in time");
    char chunk[65536];
    const ssize_t n = ::recv(fd_, chunk, sizeof(chunk), 0);
    if (n == 0) return lost("connection closed");
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR) continue;
      return lost(std::string("recv: ") + std::strerror(errno));
    }
    buf_.append(chunk, static_cast<size_t>(n));
  }
  const std::string text = buf_.substr(0, nl);
  buf_.erase(0, nl + 1);
  try {
    reply = json::parse(text);
  } catch (const std::exception& e) {
    return lost(std::string("reply is not JSON: ") + e.what());
  }
  if (!reply.is_object()) return lost("reply is not a JSON object");
  if (reply.value("ok", false)) return {};
  try {
    const json& err = reply.at("error");
    return {status_code_from_string(err.at("code").get<std::string>()),
            err.value("field", std::string()),
            err.value("message", std::string("data plane error"))};
  } catch (const std::exception&) {
    return {StatusCode::internal, "", "data plane error without details: " + text.substr(0, 200)};
  }
}

}  // namespace netreduce
