#include "host-lib/bootstrap.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/sha.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>
#include <vector>

namespace netreduce::host {

namespace {

constexpr uint32_t kHelloMagic = 0x4E524232;  // "NRB2": hello with the job tag
constexpr uint32_t kMaxFrame = 16u << 20;
// A connection's time to say its hello: a silent stranger is dropped after
// it, while the ranks' hellos are read beside it.
constexpr auto kHelloTime = std::chrono::seconds(5);
// Rank 0's verdict on a hello, one byte back.
constexpr uint8_t kAccepted = 1;
constexpr uint8_t kOtherJob = 2;

// magic, rank, world (big-endian), the job tag.
struct Hello {
  uint32_t magic, rank, world;
  JobTag job;
};
static_assert(sizeof(Hello) == 28);

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

// The dotted IPv4 address of `sa` ("" if it has none).
std::string ip_text(const sockaddr_in& sa) {
  char ip[INET_ADDRSTRLEN] = "";
  ::inet_ntop(AF_INET, &sa.sin_addr, ip, sizeof ip);
  return ip;
}

std::string peer_name(int fd) {
  sockaddr_in sa{};
  socklen_t len = sizeof sa;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&sa), &len) != 0) return "?";
  return ip_text(sa) + ":" + std::to_string(ntohs(sa.sin_port));
}

}  // namespace

JobTag job_tag(const std::string& key) {
  JobTag t{};
  if (key.empty()) return t;
  const std::string in = "netreduce bootstrap job " + key;
  unsigned char md[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(in.data()), in.size(), md);
  std::memcpy(t.data(), md, t.size());
  return t;
}

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
                        const std::string& job_key, Clock::time_point deadline,
                        std::unique_ptr<Bootstrap>& out) {
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
    if (Error e = b->bind_listen(sa)) return e;
    if (Error e = b->accept(job_key, deadline)) return e;
  } else {
    if (Error e = b->hello(sa, job_tag(job_key), deadline)) return e;
  }
  out = std::move(b);
  return {};
}

Error Bootstrap::listen(unsigned world, const std::string& ip, std::unique_ptr<Bootstrap>& out) {
  sockaddr_in sa{};
  std::string error;
  if (!resolve(ip, 0, sa, error)) return berr(error);
  std::unique_ptr<Bootstrap> b(new Bootstrap(0, world, ip + ":0"));
  if (world > 1) {
    if (Error e = b->bind_listen(sa)) return e;
    socklen_t len = sizeof sa;
    if (::getsockname(b->listen_fd_, reinterpret_cast<sockaddr*>(&sa), &len) != 0)
      return berr(std::string("getsockname: ") + std::strerror(errno));
    b->address_ = ip + ":" + std::to_string(ntohs(sa.sin_port));
  }
  out = std::move(b);
  return {};
}

std::unique_ptr<Bootstrap> Bootstrap::over(unsigned rank, unsigned world, const Rendezvous& rv,
                                           std::string ip) {
  std::unique_ptr<Bootstrap> b(new Bootstrap(rank, world, rv.name));
  b->rendezvous_ = rv.allgather;
  b->listen_ip_ = std::move(ip);
  return b;
}

Error Bootstrap::bind_listen(const sockaddr_in& sa) {
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  const int one = 1;
  ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (listen_fd_ < 0 ||
      ::bind(listen_fd_, reinterpret_cast<const sockaddr*>(&sa), sizeof sa) != 0 ||
      ::listen(listen_fd_, static_cast<int>(std::max(world_, 128u))) != 0)
    return berr("rank 0 cannot listen at " + address_ + ": " + std::strerror(errno));
  listen_ip_ = ip_text(sa);
  return {};
}

Error Bootstrap::accept(const std::string& job_key, Clock::time_point deadline) {
  if (world_ == 1) return {};
  peers_.assign(world_, -1);
  if (Error e = join(job_tag(job_key), deadline)) return e;
  // Every rank is in: later connections (a leftover of another run) are
  // refused by the kernel at once instead of waiting for a verdict.
  ::close(listen_fd_);
  listen_fd_ = -1;
  return {};
}

std::string Bootstrap::local_ip() const {
  if (rank_ == 0 || rendezvous_) return listen_ip_;
  if (peers_.empty()) return "";
  sockaddr_in sa{};
  socklen_t len = sizeof sa;
  if (::getsockname(peers_[0], reinterpret_cast<sockaddr*>(&sa), &len) != 0) return "";
  return ip_text(sa);
}

// Rank 0: accepts connections until every rank said its hello. Hellos are
// read side by side, each within kHelloTime of its connection: a stranger
// that stays silent or talks nonsense is dropped and counted, and another
// job's rank (a different job tag) is told so and dropped; neither holds up
// the job. A rank of this job that is out of range, or claimed twice, fails
// the bootstrap (two processes think they are one rank).
Error Bootstrap::join(const JobTag& job, Clock::time_point deadline) {
  struct Pending {
    int fd;
    std::string from;
    Clock::time_point until;
    Hello hello;
    size_t got = 0;
  };
  std::vector<Pending> pending;
  struct CloseLeft {  // whatever is still pending when join returns
    std::vector<Pending>& v;
    ~CloseLeft() {
      for (Pending& p : v)
        if (p.fd >= 0) ::close(p.fd);
    }
  } close_left{pending};
  std::vector<std::string> from(world_);
  unsigned joined = 0, refused = 0;
  std::string last_refusal;
  auto refuse = [&](Pending& p, const std::string& why) {
    ::close(p.fd);
    p.fd = -1;
    ++refused;
    last_refusal = p.from + ": " + why;
  };
  // A whole hello: accepted (p.fd moves to peers_), refused, or the end.
  auto admit = [&](Pending& p) -> Error {
    const uint32_t r = ntohl(p.hello.rank), w = ntohl(p.hello.world);
    if (ntohl(p.hello.magic) != kHelloMagic) {
      refuse(p, "not a netreduce hello");
    } else if (p.hello.job != job) {
      (void)::send(p.fd, &kOtherJob, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
      refuse(p, "rank " + std::to_string(r) + " of another job (its job key differs)");
    } else if (w != world_ || r == 0 || r >= world_) {
      return berr("rank 0 at " + address_ + ": a peer at " + p.from + " says it is rank " +
                  std::to_string(r) + " of " + std::to_string(w) + ", expected a rank in 1.." +
                  std::to_string(world_ - 1) + " of " + std::to_string(world_));
    } else if (peers_[r] >= 0) {
      return berr("rank 0 at " + address_ + ": rank " + std::to_string(r) + " claimed twice, by " +
                  from[r] + " and by " + p.from + " (two processes were given the same rank)");
    } else if (::send(p.fd, &kAccepted, 1, MSG_NOSIGNAL | MSG_DONTWAIT) != 1) {
      refuse(p, "rank " + std::to_string(r) + " left before it was accepted");
    } else {
      const int one = 1;
      ::setsockopt(p.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      peers_[r] = p.fd;
      from[r] = p.from;
      p.fd = -1;
      ++joined;
    }
    return {};
  };
  while (joined < world_ - 1) {
    if (Clock::now() >= deadline) {
      std::string missing;
      for (unsigned r = 1; r < world_; ++r)
        if (peers_[r] < 0) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      return Error::make(ErrorCode::timeout,
                         "bootstrap: rank 0 at " + address_ + ": ranks " + missing +
                             " did not connect in time" +
                             (refused ? " (" + std::to_string(refused) +
                                            " connection(s) refused, the last " + last_refusal + ")"
                                      : ""));
    }
    auto until = deadline;
    std::vector<pollfd> fds{{listen_fd_, POLLIN, 0}};
    for (const Pending& p : pending) {
      fds.push_back({p.fd, POLLIN, 0});
      until = std::min(until, p.until);
    }
    if (::poll(fds.data(), fds.size(), ms_left(until)) < 0 && errno != EINTR)
      return berr(std::string("rank 0: poll: ") + std::strerror(errno));
    for (size_t i = 1; i < fds.size(); ++i) {
      Pending& p = pending[i - 1];
      if (fds[i].revents) {
        const ssize_t n = ::recv(p.fd, reinterpret_cast<uint8_t*>(&p.hello) + p.got,
                                 sizeof(Hello) - p.got, MSG_DONTWAIT);
        if (n > 0) p.got += static_cast<size_t>(n);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
          refuse(p, "closed before its hello");
          continue;
        }
      }
      if (p.got == sizeof(Hello)) {
        if (Error e = admit(p)) return e;
      } else if (Clock::now() >= p.until) {
        refuse(p, "no hello within " + std::to_string(kHelloTime.count()) + " s");
      }
    }
    std::erase_if(pending, [](const Pending& p) { return p.fd < 0; });
    if (fds[0].revents & POLLIN) {
      for (;;) {
        const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) break;
        pending.push_back({fd, peer_name(fd), std::min(deadline, Clock::now() + kHelloTime), {}});
      }
    }
  }
  return {};
}

// Any other rank: connects to rank 0 (retrying while it is not up yet, or is
// another job's rank 0 at this address) and says its hello, until rank 0
// accepts it or the deadline.
Error Bootstrap::hello(const sockaddr_in& sa, const JobTag& job, Clock::time_point deadline) {
  const Hello h{htonl(kHelloMagic), htonl(rank_), htonl(world_), job};
  std::string last = "no attempt";
  unsigned other_job = 0;  // times a rank 0 of another job answered here
  for (;;) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return berr(std::string("socket: ") + std::strerror(errno));
    int rc = ::connect(fd, reinterpret_cast<const sockaddr*>(&sa), sizeof sa);
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
    uint8_t verdict = 0;
    if (rc != 0) {
      last = std::strerror(errno);
    } else if (!send_all(fd, &h, sizeof h, deadline) || !recv_all(fd, &verdict, 1, deadline)) {
      last = "rank 0 did not accept this rank (it closed the connection, or did not answer)";
    } else if (verdict == kAccepted) {
      const int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      peers_.push_back(fd);
      return {};
    } else {
      last = "rank 0 refused this rank";
      if (verdict == kOtherJob) ++other_job;
    }
    ::close(fd);
    if (Clock::now() >= deadline)
      return Error::make(
          ErrorCode::timeout,
          "bootstrap: rank " + std::to_string(rank_) + " cannot reach rank 0 at " + address_ +
              " in time (" + last + ")" +
              (other_job ? "; a rank 0 of another job (a different job key) answered there " +
                               std::to_string(other_job) + " time(s)"
                         : ""));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

Error Bootstrap::allgather(const std::string& mine, std::vector<std::string>& all,
                           Clock::time_point deadline) {
  if (rendezvous_) {
    all.clear();
    if (Error e = rendezvous_(mine, all, deadline)) return e;
    if (all.size() != world_ || all[rank_] != mine)
      return berr("the rendezvous gave " + std::to_string(all.size()) + " blobs for " +
                  std::to_string(world_) + " ranks, or not this rank's own");
    return {};
  }
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
  if (rendezvous_) {
    std::vector<std::string> all;
    if (Error e = allgather(rank_ == 0 ? blob : std::string(), all, deadline)) return e;
    blob = all[0];
    return {};
  }
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
