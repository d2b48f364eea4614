// The control channel's transport: a Unix stream socket carrying one request
// line and one reply line per request (the protocol is in control_api.cc;
// the commands: docs/dataplane.md#commands).
//
// Example: netreduced connects to /run/netreduce/dataplane.sock, writes
// {"cmd": "ping"}\n, and poll_once() reads the line, runs the handler and
// queues {"ok": true}\n, written as the socket takes it. Nothing a client
// does can block the control thread or stop the process:
//   - Creation: bind() under a umask gives the file its final mode (0660).
//     A socket file left by a dead process is replaced; one a live process
//     answers on is not (this box refuses to start, naming the path).
//   - Who: SO_PEERCRED root, the box's uid, or a member of control.group
//     (SO_PEERGROUPS); anyone else gets one error line and is closed.
//   - How many: control.max_clients; another one gets one error line.
//   - Input: non-blocking sockets, lines of 1 MiB at most, at most
//     kRequestsPerRound requests of a client per poll round, and no reading
//     while its complete requests wait.
//   - Output: a client whose queued replies exceed kMaxOutput (it sends and
//     never reads) is dropped. A handler that throws answers "internal".
//
// Threads:
// - The control thread (the main lcore's control loop) owns everything
//   here; nothing is shared with the workers. poll_once() waits at most its
//   timeout, so that loop sees a stop request (SIGTERM) within one round.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/status.h"

namespace netreduce::dataplane {

struct ControlSocketOptions {
  std::string path;
  unsigned max_clients = 64;
  // Group whose members may connect besides root and the box's own uid;
  // -1: none. The socket file is given to this group.
  long group = -1;
};

// Counted since open(); read on the control thread (status).
struct ControlSocketCounters {
  uint64_t accepted = 0;
  uint64_t requests = 0;
  uint64_t refused_credentials = 0;  // peer not root, not us, not in control.group
  uint64_t refused_full = 0;         // control.max_clients already connected
  uint64_t dropped_slow = 0;         // replies queued over kMaxOutput: never reads
  uint64_t dropped_long_line = 0;    // a line over kMaxLine
};

class ControlSocket {
 public:
  static constexpr size_t kMaxLine = size_t{1} << 20;
  static constexpr size_t kMaxOutput = size_t{4} << 20;
  static constexpr unsigned kRequestsPerRound = 16;

  // One request line (without its newline) -> one reply line (without it).
  using Handler = std::function<std::string(const std::string&)>;

  ControlSocket() = default;
  ~ControlSocket() { close(); }
  ControlSocket(const ControlSocket&) = delete;
  ControlSocket& operator=(const ControlSocket&) = delete;

  // Creates the socket file (mode 0660, group opts.group if given) and
  // listens. The Status names the control.* key at fault.
  Status open(const ControlSocketOptions& opts);
  // One round: waits up to `timeout` for activity, accepts, reads, answers
  // through `handler`, writes. Never throws.
  void poll_once(std::chrono::milliseconds timeout, const Handler& handler) noexcept;
  // Writes what each client can take without blocking, closes every client
  // and the socket, and removes the socket file.
  void close() noexcept;

  const ControlSocketCounters& counters() const { return counters_; }
  size_t clients() const { return clients_.size(); }
  const std::string& path() const { return opts_.path; }

 private:
  struct Client {
    int fd = -1;
    uid_t uid = 0;
    std::string in;      // bytes read, not yet answered
    size_t scanned = 0;  // in[0, scanned) holds no newline
    std::string out;     // replies not yet written, from out_at
    size_t out_at = 0;
    bool eof = false;  // the peer shut down its sending side
  };
  // A refused or over-limit peer: one error line, best effort, then close.
  void refuse(int fd, const Status& why) noexcept;
  bool peer_allowed(int fd, uid_t& uid) const noexcept;
  void accept_all() noexcept;
  // Reads once; false if the client is to be closed.
  bool read_from(Client& c) noexcept;
  // Answers up to kRequestsPerRound complete lines; false if closed.
  bool answer(Client& c, const Handler& handler) noexcept;
  // Writes what the socket takes; false if the client is to be closed.
  bool write_to(Client& c) noexcept;
  // Whether a complete request waits; remembers how far it looked.
  static bool has_line(Client& c) {
    if (c.in.find('\n', c.scanned) != std::string::npos) return true;
    c.scanned = c.in.size();
    return false;
  }
  void close_client(Client& c) noexcept;
  // Log lines about refusals: at most one a second per kind, with a count.
  void note(const char* what, uint64_t& since_last, std::chrono::steady_clock::time_point& last,
            const std::string& detail) noexcept;

  ControlSocketOptions opts_;
  int listen_fd_ = -1;
  bool created_ = false;  // the socket file is ours to remove
  std::vector<Client> clients_;
  std::chrono::steady_clock::time_point accept_paused_until_{};
  ControlSocketCounters counters_;
  uint64_t refused_unlogged_ = 0;
  std::chrono::steady_clock::time_point refused_logged_{};
};

}  // namespace netreduce::dataplane
