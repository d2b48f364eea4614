#include "host-lib/bootstrap.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

namespace netreduce::host {

namespace {

constexpr uint32_t kHelloMagic = 0x4E524253;  // "NRBS"
constexpr uint32_t kMaxFrame = 16u << 20;

int ms_left(Clock::time_point deadline) {
  const auto d = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return d.count() < 0 ? 0 : static_cast<int>(std::min<long long>(d.count(), 1 << 30));
}

Error berr(const std::string& m) { return Error::make(ErrorCode::bootstrap, "bootstrap: " + m); }

bool wait_fd(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, ms_left(deadline));
    if (r > 0) return true;
    if (r == 0) return false;
    if (errno != EINTR) return false;
  }
}

// Sends all bytes or fails at the deadline.
bool send_all(int fd, const void* buf, size_t len, Clock::time_point deadline) {
  const auto* p = static_cast<const uint8_t*>(buf);
  while (len > 0) {
    const ssize_t n = ::send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      len -= static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return false;
    if (!wait_fd(fd, POLLOUT, deadline)) return false;
  }
  return true;
}

bool recv_all(int fd, void* buf, size_t len, Clock::time_point deadline) {
  auto* p = static_cast<uint8_t*>(buf);
  while (len > 0) {
    const ssize_t n = ::recv(fd, p, len, MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      len -= static_cast<size_t>(n);
      continue;
    }
    if (n == 0) return false;  // peer closed
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return false;
    if (!wait_fd(fd, POLLIN, deadline)) return false;
  }
  return true;
}

bool send_frame(int fd, const std::string& s, Clock::time_point deadline) {
  const uint32_t len = htonl(static_cast<uint32_t>(s.size()));
  return send_all(fd, &len, 4, deadline) && send_all(fd, s.data(), s.size(), deadline);
}

bool recv_frame(int fd, std::string& s, Clock::time_point deadline) {
  uint32_t len = 0;
  if (!recv_all(fd, &len, 4, deadline)) return false;
  len = ntohl(len);
  if (len > kMaxFrame) return false;
  s.resize(len);
  return recv_all(fd, s.data(), len, deadline);
}

bool resolve(const std::string& host, uint16_t port, sockaddr_in& out, std::string& error) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0 || !res) {
    error = "cannot resolve '" + host + "': " + gai_strerror(rc);
    return false;
  }
  std::memcpy(&out, res->ai_addr, sizeof out);
  out.sin_port = htons(port);
  ::freeaddrinfo(res);
  return true;
}

}  // namespace

bool parse_host_port(const std::string& s, std::string& host, uint16_t& port, std::string& error) {
  const size_t colon = s.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == s.size()) {
    error = "bootstrap: '" + s + "' is not host:port";
    return false;
  }
  host = s.substr(0, colon);
  const std::string p = s.substr(colon + 1);
  unsigned long v = 0;
  for (char c : p) {
    if (c < '0' || c > '9' || v > 65535) {
      error = "bootstrap: port '" + p + "' is not a number in 1..65535";
      return false;
    }
    v = v * 10 + static_cast<unsigned long>(c - '0');
  }
  if (v == 0 || v > 65535) {
    error = "bootstrap: port '" + p + "' is not a number in 1..65535";
    return false;
  }
  port = static_cast<uint16_t>(v);
  return true;
}

Bootstrap::~Bootstrap() {
  for (int fd : peers_)
    if (fd >= 0) ::close(fd);
  if (listen_fd_ >= 0) ::close(listen_fd_);
}

Error Bootstrap::create(unsigned rank, unsigned world, const std::string& address,
                        Clock::time_point deadline, std::unique_ptr<Bootstrap>& out) {
  std::string host, error;
  uint16_t port = 0;
  if (!parse_host_port(address, host, port, error))
    return Error::make(ErrorCode::invalid_argument, error);
  sockaddr_in sa{};
  if (!resolve(host, port, sa, error)) return berr(error);
  std::unique_ptr<Bootstrap> b(new Bootstrap(rank, world, address));
  if (world == 1) {
    out = std::move(b);
    return {};
  }
  if (rank == 0) {
    b->listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    const int one = 1;
    ::setsockopt(b->listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (b->listen_fd_ < 0 ||
        ::bind(b->listen_fd_, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0 ||
        ::listen(b->listen_fd_, static_cast<int>(world)) != 0)
      return berr("rank 0 cannot listen at " + address + ": " + std::strerror(errno));
    b->peers_.assign(world, -1);
    unsigned joined = 0;
    while (joined < world - 1) {
      if (!wait_fd(b->listen_fd_, POLLIN, deadline)) {
        std::string missing;
        for (unsigned r = 1; r < world; ++r)
          if (b->peers_[r] < 0) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
        return Error::make(ErrorCode::timeout, "bootstrap: rank 0 at " + address + ": ranks " +
                                                   missing + " did not connect in time");
      }
      const int fd = ::accept4(b->listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) continue;
      uint32_t hello[3];
      if (!recv_all(fd, hello, sizeof hello, deadline) || ntohl(hello[0]) != kHelloMagic) {
        ::close(fd);  // not one of ours: ignore it
        continue;
      }
      const uint32_t r = ntohl(hello[1]), w = ntohl(hello[2]);
      if (w != world || r == 0 || r >= world || b->peers_[r] >= 0) {
        ::close(fd);
        return berr("rank 0 at " + address + ": a peer says it is rank " + std::to_string(r) +
                    " of " + std::to_string(w) + ", expected a new rank of " +
                    std::to_string(world));
      }
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      b->peers_[r] = fd;
      ++joined;
    }
  } else {
    int fd = -1;
    std::string last = "no attempt";
    for (;;) {
      fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
      if (fd < 0) return berr(std::string("socket: ") + std::strerror(errno));
      int rc = ::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa);
      if (rc != 0 && errno == EINPROGRESS) {
        const auto step = std::min(deadline, Clock::now() + std::chrono::seconds(1));
        if (wait_fd(fd, POLLOUT, step)) {
          int err = 0;
          socklen_t len = sizeof err;
          ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
          rc = err == 0 ? 0 : -1;
          errno = err;
        } else {
          errno = ETIMEDOUT;
        }
      }
      if (rc == 0) break;
      last = std::strerror(errno);
      ::close(fd);
      fd = -1;
      if (Clock::now() >= deadline)
        return Error::make(ErrorCode::timeout, "bootstrap: rank " + std::to_string(rank) +
                                                   " cannot reach rank 0 at " + address +
                                                   " in time (" + last + ")");
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    b->peers_.push_back(fd);
    const uint32_t hello[3] = {htonl(kHelloMagic), htonl(rank), htonl(world)};
    if (!send_all(fd, hello, sizeof hello, deadline))
      return berr("rank " + std::to_string(rank) + ": hello to rank 0 at " + address + " failed");
  }
  out = std::move(b);
  return {};
}

Error Bootstrap::allgather(const std::string& mine, std::vector<std::string>& all,
                           Clock::time_point deadline) {
  all.assign(world_, {});
  all[rank_] = mine;
  if (world_ == 1) return {};
  if (rank_ == 0) {
    for (unsigned r = 1; r < world_; ++r)
      if (!recv_frame(peers_[r], all[r], deadline))
        return Error::make(ErrorCode::timeout,
                           "bootstrap: rank 0 did not get rank " + std::to_string(r) +
                               "'s connection information in time (or it left)");
    std::string table;
    for (const auto& s : all) {
      const uint32_t len = htonl(static_cast<uint32_t>(s.size()));
      table.append(reinterpret_cast<const char*>(&len), 4);
      table += s;
    }
    for (unsigned r = 1; r < world_; ++r)
      if (!send_frame(peers_[r], table, deadline))
        return berr("rank 0 could not send the table to rank " + std::to_string(r));
    return {};
  }
  std::string table;
  if (!send_frame(peers_[0], mine, deadline) || !recv_frame(peers_[0], table, deadline))
    return Error::make(ErrorCode::timeout, "bootstrap: rank " + std::to_string(rank_) +
                                               ": no table from rank 0 at " + address_ +
                                               " in time (a rank is missing, or rank 0 left)");
  size_t off = 0;
  for (unsigned r = 0; r < world_; ++r) {
    uint32_t len = 0;
    if (off + 4 > table.size()) return berr("truncated table from rank 0");
    std::memcpy(&len, table.data() + off, 4);
    len = ntohl(len);
    off += 4;
    if (off + len > table.size()) return berr("truncated table from rank 0");
    all[r] = table.substr(off, len);
    off += len;
  }
  return {};
}

Error Bootstrap::broadcast(std::string& blob, Clock::time_point deadline) {
  if (world_ == 1) return {};
  if (rank_ == 0) {
    for (unsigned r = 1; r < world_; ++r)
      if (!send_frame(peers_[r], blob, deadline))
        return berr("rank 0 could not send to rank " + std::to_string(r));
    return {};
  }
  if (!recv_frame(peers_[0], blob, deadline))
    return Error::make(ErrorCode::timeout, "bootstrap: rank " + std::to_string(rank_) +
                                               ": nothing from rank 0 at " + address_ + " in time");
  return {};
}

}  // namespace netreduce::host
