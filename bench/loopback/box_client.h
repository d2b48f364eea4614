// A client for the data plane's control socket (JSON lines, see
// src/dataplane/control.cc): connect, one request -> one reply, every wait
// bounded by a deadline. Used by the loopback benchmark to install its rings,
// switch the box between aggregate and forward-only mode, and read counters.
#pragma once

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <thread>

namespace netreduce::bench {

class BoxClient {
 public:
  // Connects, retrying until `wait` has passed (the box may still be starting).
  BoxClient(const std::string& path, std::chrono::milliseconds wait) {
    const auto until = std::chrono::steady_clock::now() + wait;
    for (;;) {
      fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_un a{};
      a.sun_family = AF_UNIX;
      std::strncpy(a.sun_path, path.c_str(), sizeof(a.sun_path) - 1);
      if (fd_ >= 0 && ::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) return;
      const int err = errno;
      if (fd_ >= 0) ::close(fd_);
      fd_ = -1;
      if (std::chrono::steady_clock::now() >= until)
        throw std::runtime_error("cannot connect to the data plane's control socket " + path +
                                 ": " + std::strerror(err));
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  ~BoxClient() {
    if (fd_ >= 0) ::close(fd_);
  }
  BoxClient(const BoxClient&) = delete;
  BoxClient& operator=(const BoxClient&) = delete;

  // Sends one request; returns the reply. Throws on I/O errors, a timeout,
  // or (if `must_succeed`) a reply with "ok": false, naming the box's error.
  nlohmann::json call(const nlohmann::json& req, bool must_succeed = true,
                      std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    const std::string line = req.dump() + "\n";
    if (::send(fd_, line.data(), line.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(line.size()))
      throw std::runtime_error("control socket: send failed");
    const auto until = std::chrono::steady_clock::now() + timeout;
    size_t nl;
    while ((nl = buf_.find('\n')) == std::string::npos) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          until - std::chrono::steady_clock::now());
      pollfd p{fd_, POLLIN, 0};
      if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) <= 0)
        throw std::runtime_error("control socket: no reply to " + req.value("cmd", "?") +
                                 " within " + std::to_string(timeout.count()) + " ms");
      char chunk[65536];
      const ssize_t n = ::read(fd_, chunk, sizeof(chunk));
      if (n <= 0) throw std::runtime_error("control socket: the data plane closed the connection");
      buf_.append(chunk, static_cast<size_t>(n));
    }
    nlohmann::json reply = nlohmann::json::parse(buf_.substr(0, nl));
    buf_.erase(0, nl + 1);
    if (must_succeed && !reply.value("ok", false))
      throw std::runtime_error("data plane refused " + req.value("cmd", "?") + ": " +
                               reply.value("error", nlohmann::json::object()).dump());
    return reply;
  }

 private:
  int fd_ = -1;
  std::string buf_;
};

}  // namespace netreduce::bench
