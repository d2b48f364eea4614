// The control socket's transport; the theory of operation is in
// control_socket.h. Control thread only.
#include "dataplane/control_socket.h"

#include <fcntl.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#ifndef SO_PEERGROUPS
#define SO_PEERGROUPS 59  // Linux 4.13; older headers lack the name
#endif

namespace netreduce::dataplane {

namespace {

std::string errno_text(int e) { return std::strerror(e); }

// The one error line a refused peer gets. Built by hand: it must not throw.
std::string error_line(const Status& s) {
  std::string msg;
  for (char ch : s.message()) {  // our own ASCII text; keep JSON valid regardless
    if (ch == '"' || ch == '\\') msg += '\\';
    msg +=
        (static_cast<unsigned char>(ch) < 0x20 || static_cast<unsigned char>(ch) > 0x7e) ? '?' : ch;
  }
  return std::string("{\"ok\":false,\"error\":{\"code\":\"") + to_string(s.code()) +
         "\",\"field\":\"" + s.field() + "\",\"message\":\"" + msg + "\"}}\n";
}

}  // namespace

Status ControlSocket::open(const ControlSocketOptions& opts) {
  close();
  opts_ = opts;
  const std::string& path = opts_.path;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(addr.sun_path))
    return Status::invalid(
        "control.socket",
        "must be a path of 1.." + std::to_string(sizeof(addr.sun_path) - 1) + " bytes");
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);

  std::error_code ec;
  const auto dir = std::filesystem::path(path).parent_path();
  if (!dir.empty()) std::filesystem::create_directories(dir, ec);
  if (ec)
    return {StatusCode::unavailable, "control.socket",
            "cannot create the directory " + dir.string() + ": " + ec.message()};

  // What is at the path already: a live box keeps it; a stale socket goes;
  // anything else is not ours to delete.
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode))
      return {StatusCode::conflict, "control.socket",
              path + " exists and is not a socket: remove it or choose another path"};
    const int probe = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    const bool live =
        probe >= 0 && (::connect(probe, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 ||
                       errno == EAGAIN);
    if (probe >= 0) ::close(probe);
    if (live)
      return {StatusCode::conflict, "control.socket",
              "another process answers on " + path +
                  " (a second data plane?): stop it or choose another path"};
    ::unlink(path.c_str());
  }

  listen_fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (listen_fd_ < 0)
    return {StatusCode::unavailable, "control.socket", "socket: " + errno_text(errno)};
  // The file gets its final mode from bind(): rw for owner and group, nothing
  // for others, whatever the process umask was. umask is process-wide; no
  // other thread of this process creates files at this point.
  const mode_t old_mask = ::umask(0117);
  const int brc = ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  const int berr = errno;
  ::umask(old_mask);
  if (brc != 0) {
    const std::string e = errno_text(berr);
    ::close(listen_fd_);
    listen_fd_ = -1;
    return {StatusCode::unavailable, "control.socket", "bind " + path + ": " + e};
  }
  created_ = true;
  if (opts_.group >= 0 &&
      ::chown(path.c_str(), static_cast<uid_t>(-1), static_cast<gid_t>(opts_.group)) != 0) {
    const std::string e = errno_text(errno);
    close();
    return {StatusCode::unavailable, "control.group",
            "cannot give " + path + " to group " + std::to_string(opts_.group) + ": " + e +
                " (run the box as root or as a member of that group)"};
  }
  if (::listen(listen_fd_, SOMAXCONN) != 0) {
    const std::string e = errno_text(errno);
    close();
    return {StatusCode::unavailable, "control.socket", "listen: " + e};
  }
  return {};
}

bool ControlSocket::peer_allowed(int fd, uid_t& uid) const noexcept {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return false;
  uid = cred.uid;
  if (cred.uid == 0 || cred.uid == ::geteuid()) return true;
  if (opts_.group < 0) return false;
  const auto group = static_cast<gid_t>(opts_.group);
  if (cred.gid == group) return true;
  gid_t groups[256];
  socklen_t glen = sizeof(groups);
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups, &glen) != 0) {
    if (errno != ERANGE) return false;
    // More than 256 supplementary groups: ask again with room for them all.
    std::vector<gid_t> many(glen / sizeof(gid_t) + 1);
    glen = static_cast<socklen_t>(many.size() * sizeof(gid_t));
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, many.data(), &glen) != 0) return false;
    for (size_t i = 0; i < glen / sizeof(gid_t); ++i)
      if (many[i] == group) return true;
    return false;
  }
  for (size_t i = 0; i < glen / sizeof(gid_t); ++i)
    if (groups[i] == group) return true;
  return false;
}

void ControlSocket::note(const char* what, uint64_t& since_last,
                         std::chrono::steady_clock::time_point& last,
                         const std::string& detail) noexcept {
  ++since_last;
  const auto now = std::chrono::steady_clock::now();
  if (now - last < std::chrono::seconds(1)) return;
  try {
    spdlog::warn("control socket: {} ({}; {} such since the last message)", what, detail,
                 since_last);
  } catch (...) {
  }
  since_last = 0;
  last = now;
}

void ControlSocket::refuse(int fd, const Status& why) noexcept {
  try {
    const std::string line = error_line(why);
    (void)::send(fd, line.data(), line.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  } catch (...) {
  }
  ::close(fd);
}

void ControlSocket::accept_all() noexcept {
  for (;;) {
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        // Out of descriptors: the pending connection stays queued, and the
        // listener would wake every poll at once. Look again in 100 ms.
        accept_paused_until_ = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
        note("accept failed", refused_unlogged_, refused_logged_, errno_text(errno));
      }
      return;  // EAGAIN: all taken
    }
    uid_t uid = 0;
    if (!peer_allowed(fd, uid)) {
      ++counters_.refused_credentials;
      note("refused a client", refused_unlogged_, refused_logged_,
           "uid " + std::to_string(uid) +
               " is not root, not the box's uid and not in control.group");
      refuse(fd, {StatusCode::unavailable, "control.group",
                  "permission denied: only root, the box's own user and members of "
                  "control.group may use this socket"});
      continue;
    }
    if (clients_.size() >= opts_.max_clients) {
      ++counters_.refused_full;
      note("refused a client", refused_unlogged_, refused_logged_,
           std::to_string(clients_.size()) +
               " clients connected, control.max_clients=" + std::to_string(opts_.max_clients));
      refuse(fd, {StatusCode::resource_exhausted, "control.max_clients",
                  "too many control clients (" + std::to_string(opts_.max_clients) +
                      "): close idle connections or raise control.max_clients"});
      continue;
    }
    ++counters_.accepted;
    clients_.push_back({});
    clients_.back().fd = fd;
    clients_.back().uid = uid;
  }
}

bool ControlSocket::read_from(Client& c) noexcept {
  char chunk[65536];
  const ssize_t n = ::read(c.fd, chunk, sizeof(chunk));
  if (n == 0) {
    c.eof = true;  // answer what came, flush, then close
    return true;
  }
  if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
  try {
    c.in.append(chunk, static_cast<size_t>(n));
  } catch (...) {
    return false;
  }
  return true;
}

bool ControlSocket::answer(Client& c, const Handler& handler) noexcept {
  if (has_line(c)) {
    size_t at = 0;
    for (unsigned k = 0; k < kRequestsPerRound; ++k) {
      const size_t nl = c.in.find('\n', at);
      if (nl == std::string::npos) break;
      ++counters_.requests;
      try {
        c.out += handler(c.in.substr(at, nl - at));
        c.out += '\n';
      } catch (...) {
        try {
          c.out += error_line({StatusCode::internal, "", "the request could not be answered"});
        } catch (...) {
          return false;
        }
      }
      at = nl + 1;
      if (c.out.size() - c.out_at > kMaxOutput) {
        ++counters_.dropped_slow;
        try {
          spdlog::warn(
              "control socket: dropping a client (uid {}) that does not read its replies ({} "
              "bytes queued, at most {})",
              c.uid, c.out.size() - c.out_at, kMaxOutput);
        } catch (...) {
        }
        return false;
      }
    }
    c.in.erase(0, at);
    c.scanned = 0;
  }
  if (!has_line(c) && c.in.size() > kMaxLine) {
    ++counters_.dropped_long_line;
    try {
      c.out += error_line(Status::invalid("", "request line longer than 1 MiB"));
    } catch (...) {
    }
    (void)write_to(c);
    return false;
  }
  return true;
}

bool ControlSocket::write_to(Client& c) noexcept {
  while (c.out_at < c.out.size()) {
    const ssize_t n =
        ::send(c.fd, c.out.data() + c.out_at, c.out.size() - c.out_at, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno == EAGAIN || errno == EWOULDBLOCK;
    }
    c.out_at += static_cast<size_t>(n);
  }
  c.out.clear();
  c.out_at = 0;
  return true;
}

void ControlSocket::close_client(Client& c) noexcept {
  if (c.fd >= 0) ::close(c.fd);
  c.fd = -1;
}

void ControlSocket::poll_once(std::chrono::milliseconds timeout, const Handler& handler) noexcept {
  if (listen_fd_ < 0) {
    ::poll(nullptr, 0, static_cast<int>(timeout.count()));
    return;
  }
  try {
    std::vector<pollfd> fds;
    fds.reserve(clients_.size() + 1);
    const bool accepting = std::chrono::steady_clock::now() >= accept_paused_until_;
    fds.push_back({accepting ? listen_fd_ : -1, POLLIN, 0});
    bool pending = false;  // complete requests left from the last round: do not wait
    for (Client& c : clients_) {
      const bool queued = has_line(c);
      pending = pending || queued || (c.eof && c.out_at == c.out.size());
      short ev = 0;
      if (!queued && !c.eof) ev |= POLLIN;  // read more only when all read is answered
      if (c.out_at < c.out.size()) ev |= POLLOUT;
      fds.push_back({c.fd, ev, 0});
    }
    const int rc = ::poll(fds.data(), fds.size(), pending ? 0 : static_cast<int>(timeout.count()));
    if (rc < 0) return;  // EINTR (a signal): the caller looks at its stop flag
    if (fds[0].revents & POLLIN) accept_all();  // appends to clients_: fds[i] stays clients_[i-1]
    for (size_t i = 1; i < fds.size(); ++i) {
      Client& c = clients_[i - 1];
      const short re = fds[i].revents;
      if (re & POLLNVAL) {  // closed under us (not by this code): forget it
        spdlog::warn("control client fd {} was closed by someone else; dropping it", c.fd);
        c.fd = -1;
        continue;
      }
      bool keep = true;
      if (re & (POLLIN | POLLHUP | POLLERR)) keep = read_from(c);
      if (keep) keep = answer(c, handler);
      if (keep && (re & (POLLOUT | POLLERR | POLLHUP) || c.out_at < c.out.size()))
        keep = write_to(c);
      // A peer that stopped sending is closed once everything it asked for
      // has been answered and written.
      if (keep && c.eof && !has_line(c) && c.out_at == c.out.size()) keep = false;
      if (!keep) close_client(c);
    }
    std::erase_if(clients_, [](const Client& c) { return c.fd < 0; });
  } catch (...) {
    // bad_alloc building the poll set: nothing was half-done; try next round.
  }
}

void ControlSocket::close() noexcept {
  for (Client& c : clients_) {
    (void)write_to(c);  // e.g. the reply to "shutdown"
    close_client(c);
  }
  clients_.clear();
  if (listen_fd_ >= 0) ::close(listen_fd_);
  listen_fd_ = -1;
  if (created_) ::unlink(opts_.path.c_str());
  created_ = false;
}

}  // namespace netreduce::dataplane
