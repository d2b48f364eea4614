// netreduced's HTTP front end: cpp-httplib's request parser, router and
// response writer, behind a connection layer of our own that no client can
// wedge. The API: docs/api.md#the-routes; the listen.* limits:
// docs/operations.md#configuration-keys.
//
//   accept -> gate (1 thread, epoll) --whole head--> workers (listen.threads)
//               ^ sockets without a whole head yet     | one request each,
//               +------------- keep-alive -------------+ then back
//
// Example, listen.threads = 4, listen.dataplane_concurrency = 2:
//  1. Client A sends a header line every 2 s. The gate peeks (MSG_PEEK) and
//     holds the socket; no worker is used. At header_timeout_ms after the
//     accept (an absolute deadline) A gets 408 and the connection closes.
//  2. Client B POSTs a ring with Content-Length over max_body. A worker
//     refuses it with 413 before reading a body byte; the gate half-closes
//     the socket and discards up to 1 MiB or 1 s of what B still sends, so
//     B reads the answer, not a reset.
//  3. Three clients call data plane routes (kDataplane) at once: two run,
//     the third gets 503 with Retry-After: 1 at once, and /metrics and
//     /health still find a free worker. Likewise for bodies: at most
//     threads - dataplane_concurrency - 1 (here 1) are read at once, so
//     clients sending theirs a byte a second hold one worker, not all.
// Also refused before the body: unknown routes (404/405), callers
// authorize() refuses (401), heads over 16 KiB (431), a connection over
// max_connections (503). Bodies must arrive within body_timeout_ms and
// responses leave within write_timeout_ms, both absolute deadlines, kept by
// the stream a worker serves a request over (control/http_stream.h).
//
// Threads:
// - Gate (run()): owns the listening socket (no SO_REUSEPORT) and the
//   connection table; starts the workers.
// - Workers: serve one request per hand-off, then hand the connection back
//   through `returned_` (mutex) and the gate's eventfd.
// - Any thread: stop() (wakes the gate through the eventfd); reads counters
//   (atomics).
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
#include "control/auth.h"

namespace netreduce::control {

// Who a request is (Role, control/auth.h): authorize() maps a request to
// one; routes flagged kAuth refuse kAnonymous (401) before their body is
// read.

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
  X(busy, "data plane calls or body reads filled their share of the workers")   \
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

enum class HttpMethod { kGet, kPost, kPut, kDelete };
const char* to_string(HttpMethod m) noexcept;

// A route: `pattern` a regex the whole path must match (its groups in
// req.matches), `flags` kAuth and kDataplane. A POST takes a body: the
// handler gets it whole, already capped at max_body. The other methods take
// none (a request with one is refused before the handler) and get "". HEAD
// is served as GET.
struct HttpRoute {
  HttpMethod method;
  std::string pattern;
  unsigned flags = 0;
  std::function<void(const httplib::Request&, httplib::Response&, const std::string& body)> handler;
};

// The API's error body {"error": {"code", "field", "message"}}, serialized so
// that no input (invalid UTF-8 included) can make it throw.
std::string error_body(const std::string& code, const std::string& field,
                       const std::string& message);

class HttpServer : private httplib::Server {
 public:
  using Authorize = std::function<Role(const httplib::Request&)>;

  HttpServer(HttpLimits limits, Authorize authorize);
  ~HttpServer() override;

  // Serves the routes of `table` (after those added before; all before
  // run()): a request is served by the first route whose method and
  // pattern match it.
  void add_routes(const std::vector<HttpRoute>& table);

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

  void add_route(const HttpRoute& r);
  httplib::Server::HandlerResponse pre_route(const httplib::Request& req, httplib::Response& res);
  // Reads a POST's body whole into `body`, at most body_slots() at once;
  // false after answering its refusal (busy, too large, too slow, malformed).
  bool read_body(const httplib::ContentReader& reader, httplib::Response& res, std::string& body);
  void call(unsigned flags, httplib::Response& res, const std::function<void()>& fn);
  // Bodies read at once: listen.threads - dataplane_concurrency - 1, at least 1.
  unsigned body_slots() const noexcept;
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
  std::atomic<unsigned> body_reads_{0};
  std::atomic<uint64_t> refused_[kRefusalCount] = {};
  std::atomic<uint64_t> accepted_{0};
  std::atomic<uint64_t> open_{0};
};

}  // namespace netreduce::control
