// A request's stream, with its deadlines (theory of operation in
// http_stream.h).
#include "control/http_stream.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

namespace netreduce::control {

using Clock = std::chrono::steady_clock;

namespace {

constexpr size_t kFramingAllowance = 64 << 10;  // chunked framing on top of max_body

// Waits for `events` on fd until the deadline; false on timeout or error.
bool wait_for(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    const int ms = ms_left(deadline);
    if (ms == 0) return false;
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, ms);
    if (n > 0) return true;  // readable, writable, or an error the next call reports
    if (n == 0) return false;
    if (errno != EINTR) return false;
  }
}

// `fn` (getpeername or getsockname) of `fd` as an IPv4 address and port;
// empty and 0 for anything else.
template <typename Fn>
void address(Fn fn, int fd, std::string& ip, int& port) {
  sockaddr_in a{};
  socklen_t len = sizeof(a);
  ip.clear();
  port = 0;
  if (fn(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0 || a.sin_family != AF_INET) return;
  char buf[INET_ADDRSTRLEN] = {};
  if (::inet_ntop(AF_INET, &a.sin_addr, buf, sizeof(buf))) ip = buf;
  port = ntohs(a.sin_port);
}

}  // namespace

int ms_left(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return left.count() > 0 ? static_cast<int>(std::min<int64_t>(left.count(), 1 << 30)) : 0;
}

ConnStream::ConnStream(int fd, std::string head, const HttpLimits& limits)
    : fd_(fd),
      head_(std::move(head)),
      read_deadline_(Clock::now() + limits.body_timeout),
      write_timeout_(limits.write_timeout),
      wire_budget_(limits.max_body + kFramingAllowance) {}

bool ConnStream::is_readable() const {
  return pos_ < head_.size() || wait_for(fd_, POLLIN, read_deadline_);
}

bool ConnStream::is_writable() const {
  return wait_for(fd_, POLLOUT, write_started_ ? write_deadline_ : Clock::now() + write_timeout_);
}

ssize_t ConnStream::read(char* ptr, size_t size) {
  if (pos_ < head_.size()) {
    const size_t n = std::min(size, head_.size() - pos_);
    std::memcpy(ptr, head_.data() + pos_, n);
    pos_ += n;
    return static_cast<ssize_t>(n);
  }
  if (body_read_ >= wire_budget_) {
    over_budget_ = true;
    return -1;
  }
  size = std::min(size, wire_budget_ - body_read_);
  for (;;) {
    const ssize_t n = ::recv(fd_, ptr, size, MSG_DONTWAIT);
    if (n >= 0) {
      body_read_ += static_cast<size_t>(n);
      return n;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return -1;
    if (!wait_for(fd_, POLLIN, read_deadline_)) {
      read_timed_out_ = Clock::now() >= read_deadline_;
      return -1;
    }
  }
}

ssize_t ConnStream::write(const char* ptr, size_t size) {
  if (!write_started_) {
    write_started_ = true;
    write_deadline_ = Clock::now() + write_timeout_;
  }
  for (;;) {
    const ssize_t n = ::send(fd_, ptr, size, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n >= 0) return n;
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return -1;
    if (!wait_for(fd_, POLLOUT, write_deadline_)) {
      write_timed_out_ = true;
      return -1;
    }
  }
}

void ConnStream::get_remote_ip_and_port(std::string& ip, int& port) const {
  address(::getpeername, fd_, ip, port);
}

void ConnStream::get_local_ip_and_port(std::string& ip, int& port) const {
  address(::getsockname, fd_, ip, port);
}

}  // namespace netreduce::control
