// netreduced's HTTP front end: cpp-httplib's request parser, router and
// response writer, behind a connection layer of our own that no client can
// wedge.
//
// Theory of operation
//
//   accept ──> gate (1 thread, epoll) ──complete head──> workers (listen.threads)
//                ^   holds every socket that has not        │ one request each,
//                │   sent a whole request head yet          │ then the socket goes
//                └──────────────── keep-alive ──────────────┘ back to the gate
//
// - The gate owns the listening socket (no SO_REUSEPORT: a second daemon on
//   the port fails with "address in use") and every connection between
//   requests. It peeks (MSG_PEEK) at each socket's bytes until they hold a
//   whole head (up to the blank line); only then is the socket handed to a
//   worker. A head must be complete within `header_timeout_ms` of the accept
//   or of the previous response: an absolute deadline, so a client sending a
//   header line every few seconds cannot stretch it, and it never holds a
//   worker. Heads over 16 KiB are refused (431). At `max_connections` open
//   connections (in any state) a new one is answered 503 and closed.
// - A worker gives httplib exactly the head bytes, then the socket for the
//   body, through ConnStream: the whole body must arrive within
//   `body_timeout_ms`, the whole response must leave within
//   `write_timeout_ms` (absolute deadlines, not per recv/send). One request
//   per hand-off, so every request passes the gate, and at most
//   `keepalive_requests` per connection.
// - Before any body byte is read, a pre-routing check refuses (and the
//   connection is closed after the answer, the body unread): unknown routes
//   (404/405), callers authorize() says may not call the route (401), bodies
//   on routes that take none (413), declared lengths over `max_body` (413),
//   bodies with neither length nor chunked framing (411), other transfer or
//   content encodings and multipart (501/415). Bodies are read by the route
//   wrapper with the cap applied to the decoded bytes and to the bytes on the
//   wire (chunked framing included): over it, 413 and the connection closed.
// - Routes flagged kDataplane (they call the data plane, which may be slow)
//   run at most `dataplane_concurrency` at a time; one more is answered 503
//   (Retry-After: 1) at once. So the other workers stay free for health and
//   metrics, whose handlers never wait for the data plane.
// - A connection closed after an error answer is not closed at once: the
//   gate half-closes it and discards what the client still sends (at most
//   1 MiB or 1 s), so the client reads the answer instead of a reset.
//
// Threads: run() runs the gate; workers are started by run(); stop() may be
// called from any thread (it wakes the gate through an eventfd). The
// connection table is the gate thread's alone; workers hand connections back
// through `returned_` (mutex) and the eventfd. Counters are atomics any
// thread may read.
#pragma once

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/status.h"

namespace netreduce::control {

// Who a request is. authorize() maps a request to one; routes flagged kAuth
// refuse kAnonymous (401) before their body is read.
enum class Role { kAnonymous, kOperator, kJob };

// Why the front end refused a connection or request, each with a counter
// (netreduce_http_refused_total{reason}).
#define NETREDUCE_HTTP_REFUSALS(X)                                              \
  X(connection_cap, "listen.max_connections connections were open")             \
  X(head_timeout, "the request head was not complete within header_timeout_ms") \
  X(head_too_large, "the request head was over 16 KiB")                         \
  X(unauthorized, "the route needs a token the request did not carry")          \
  X(body_not_allowed, "a body on a route that takes none")                      \
  X(body_too_large, "a body over listen.max_body")                              \
  X(body_malformed, "a body with bad framing, encoding or content type")        \
  X(body_timeout, "the body was not complete within body_timeout_ms")           \
  X(busy, "listen.dataplane_concurrency data plane calls were running")         \
  X(write_timeout, "the response could not be written within write_timeout_ms")

enum class Refusal : uint8_t {
#define NETREDUCE_X(name, what) name,
  NETREDUCE_HTTP_REFUSALS(NETREDUCE_X)
#undef NETREDUCE_X
};
inline constexpr size_t kRefusalCount = 0
#define NETREDUCE_X(name, what) +1
    NETREDUCE_HTTP_REFUSALS(NETREDUCE_X)
#undef NETREDUCE_X
    ;
const char* to_string(Refusal r) noexcept;

struct HttpLimits {
  unsigned threads = 8;
  unsigned max_connections = 256;
  std::chrono::milliseconds header_timeout{5000};
  std::chrono::milliseconds body_timeout{10000};
  std::chrono::milliseconds write_timeout{10000};
  unsigned keepalive_requests = 100;
  size_t max_body = 1u << 20;
  unsigned dataplane_concurrency = 2;
};

// Route flags.
inline constexpr unsigned kAuth = 1;       // needs a Role other than kAnonymous
inline constexpr unsigned kDataplane = 2;  // calls the data plane: bounded concurrency

// The API's error body {"error": {"code", "field", "message"}}, serialized so
// that no input (invalid UTF-8 included) can make it throw.
std::string error_body(const std::string& code, const std::string& field,
                       const std::string& message);

class HttpServer : private httplib::Server {
 public:
  using Handler = std::function<void(const httplib::Request&, httplib::Response&)>;
  // A route taking a body gets it whole, already capped at max_body.
  using BodyHandler =
      std::function<void(const httplib::Request&, httplib::Response&, const std::string& body)>;
  using Authorize = std::function<Role(const httplib::Request&)>;

  HttpServer(HttpLimits limits, Authorize authorize);
  ~HttpServer() override;

  void get(const std::string& pattern, unsigned flags, Handler h);
  void post(const std::string& pattern, unsigned flags, BodyHandler h);
  void del(const std::string& pattern, unsigned flags, Handler h);
  void put(const std::string& pattern, unsigned flags, Handler h);  // body-less PUT

  // Binds and listens (SO_REUSEADDR only). Error: the address is taken or
  // cannot be bound, with the system's reason.
  Status listen(const std::string& address, uint16_t port);
  // Serves until stop(); returns after the workers finished.
  void run();
  void stop();

  uint64_t refused(Refusal r) const noexcept { return refused_[static_cast<size_t>(r)].load(); }
  uint64_t accepted() const noexcept { return accepted_.load(); }
  uint64_t open_connections() const noexcept { return open_.load(); }

 private:
  struct Route {
    std::string method;
    std::regex pattern;
    unsigned flags;
    bool body;
  };
  struct Conn {
    int fd = -1;
    std::chrono::steady_clock::time_point deadline;
    unsigned requests = 0;  // served on this connection
    size_t scanned = 0;     // head bytes already searched for the blank line
    size_t head_len = 0;    // set when the head is complete
    bool draining = false;  // half-closed after an error answer: discard, then close
    size_t drained = 0;
  };

  httplib::Server::HandlerResponse pre_route(const httplib::Request& req, httplib::Response& res);
  void call(unsigned flags, httplib::Response& res, const std::function<void()>& fn);
  void finish_response(const httplib::Request& req, httplib::Response& res);
  void refuse(httplib::Response& res, Refusal why, int http, const std::string& code,
              const std::string& field, const std::string& message);

  void gate_main();
  void gate_accept();
  void gate_readable(Conn& c);
  void gate_close(int fd);
  void gate_answer_and_close(int fd, const std::string& response);
  void worker_main();
  void serve(Conn c);
  void hand_back(Conn c);

  const HttpLimits limits_;
  const Authorize authorize_;
  std::vector<Route> routes_;

  int listen_fd_ = -1;
  int epoll_fd_ = -1;
  int wake_fd_ = -1;  // eventfd: stop() and hand_back() wake the gate
  std::atomic<bool> stopping_{false};

  // Gate -> workers: connections with a complete head.
  std::mutex work_mu_;
  std::condition_variable work_cv_;
  std::deque<Conn> work_;
  bool work_closed_ = false;
  // Workers -> gate: connections kept alive or to drain.
  std::mutex returned_mu_;
  std::vector<Conn> returned_;

  std::unordered_map<int, Conn> conns_;  // gate thread only: connections between requests
  std::vector<std::thread> workers_;
  std::atomic<unsigned> dataplane_calls_{0};
  std::atomic<uint64_t> refused_[kRefusalCount] = {};
  std::atomic<uint64_t> accepted_{0};
  std::atomic<uint64_t> open_{0};
};

}  // namespace netreduce::control
