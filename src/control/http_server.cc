// The HTTP front end (theory of operation in http_server.h).
#include "control/http_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "common/ring_json.h"
#include "control/http_stream.h"

namespace netreduce::control {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

namespace {

constexpr size_t kMaxHead = 16 << 10;    // request line + headers
constexpr size_t kMaxPath = 1024;        // longer paths: 414 (no route is that long)
constexpr size_t kDrainBytes = 1 << 20;  // discarded after an error answer, at most
constexpr auto kDrainTime = std::chrono::seconds(1);

bool iequals(const std::string& a, const char* b) { return ::strcasecmp(a.c_str(), b) == 0; }

// The gate's own answers (httplib's status texts are not exported).
std::string status_line(int http) {
  const char* text = http == 408   ? "Request Timeout"
                     : http == 431 ? "Request Header Fields Too Large"
                                   : "Service Unavailable";
  return "HTTP/1.1 " + std::to_string(http) + " " + text + "\r\n";
}

// A whole response for the gate to write on its own (the connection is closed after it).
std::string canned(int http, const std::string& code, const std::string& field,
                   const std::string& message) {
  const std::string body = error_body(code, field, message);
  return status_line(http) +
         "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
         "\r\nConnection: close\r\n\r\n" + body;
}

// What the worker serving a request and the httplib callbacks it runs share.
// Set by serve() for the duration of one process_request() on that thread.
struct RequestState {
  ConnStream* stream = nullptr;
  bool last = false;       // the connection closes after this request
  bool routed = false;     // pre_route ran (the head parsed)
  bool has_body = false;   // the request declared a body
  bool body_done = false;  // ... and it was read whole
  bool refused = false;    // refused in a way that leaves the stream unusable
};
thread_local RequestState* tls_request = nullptr;

// Gives a slot of a bounded count (data plane calls, body reads) back when
// its holder leaves the scope.
struct SlotRelease {
  std::atomic<unsigned>& taken;
  ~SlotRelease() { taken.fetch_sub(1); }
};

}  // namespace

const char* to_string(Refusal r) noexcept {
  switch (r) {
#define NETREDUCE_X(name, what) \
  case Refusal::name:           \
    return #name;
    NETREDUCE_HTTP_REFUSALS(NETREDUCE_X)
#undef NETREDUCE_X
  }
  return "unknown";
}

std::string error_body(const std::string& code, const std::string& field,
                       const std::string& message) {
  return dump_json(json{{"error", {{"code", code}, {"field", field}, {"message", message}}}}) +
         "\n";
}

HttpServer::HttpServer(HttpLimits limits, Authorize authorize)
    : limits_(limits), authorize_(std::move(authorize)) {
  set_keep_alive_max_count(limits_.keepalive_requests);
  set_keep_alive_timeout(std::max<time_t>(
      1, std::chrono::duration_cast<std::chrono::seconds>(limits_.header_timeout).count()));
  set_payload_max_length(limits_.max_body);
  set_pre_routing_handler(
      [this](const httplib::Request& req, httplib::Response& res) { return pre_route(req, res); });
  set_expect_100_continue_handler([this](const httplib::Request& req, httplib::Response& res) {
    return pre_route(req, res) == HandlerResponse::Handled ? res.status : 100;
  });
  set_post_routing_handler(
      [this](const httplib::Request& req, httplib::Response& res) { finish_response(req, res); });
  // httplib's own refusals (unparsable request line or headers, bad ranges)
  // come with an empty body: give them the API's error body.
  set_error_handler([](const httplib::Request&, httplib::Response& res) {
    if (!res.body.empty()) return;
    res.set_content(error_body(res.status == 404 ? "not_found" : "invalid_argument", "",
                               "request refused (HTTP " + std::to_string(res.status) + ")"),
                    "application/json");
  });
  set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unexpected error";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    res.status = 500;
    res.set_content(error_body("internal", "", what), "application/json");
  });
}

HttpServer::~HttpServer() {
  stop();
  for (auto& t : workers_)
    if (t.joinable()) t.join();
  for (auto& [fd, c] : conns_) ::close(fd);
  for (int fd : {listen_fd_, epoll_fd_, wake_fd_})
    if (fd >= 0) ::close(fd);
}

// ---- routes ---------------------------------------------------------------

const char* to_string(HttpMethod m) noexcept {
  static constexpr const char* kNames[] = {"GET", "POST", "PUT", "DELETE"};
  return kNames[static_cast<size_t>(m)];
}

void HttpServer::add_routes(const std::vector<HttpRoute>& table) {
  for (const HttpRoute& r : table) add_route(r);
}

void HttpServer::add_route(const HttpRoute& r) {
  const bool body = r.method == HttpMethod::kPost;
  routes_.push_back({to_string(r.method), std::regex(r.pattern), r.flags, body});
  const unsigned flags = r.flags;
  if (body) {
    Server::Post(r.pattern,
                 [this, flags, h = r.handler](const httplib::Request& req, httplib::Response& res,
                                              const httplib::ContentReader& reader) {
                   std::string text;
                   if (read_body(reader, res, text)) call(flags, res, [&] { h(req, res, text); });
                 });
    return;
  }
  Server::Handler serve = [this, flags, h = r.handler](const httplib::Request& req,
                                                       httplib::Response& res) {
    call(flags, res, [&] { h(req, res, std::string()); });
  };
  if (r.method == HttpMethod::kGet)
    Server::Get(r.pattern, std::move(serve));
  else if (r.method == HttpMethod::kPut)
    Server::Put(r.pattern, std::move(serve));
  else if (r.method == HttpMethod::kDelete)
    Server::Delete(r.pattern, std::move(serve));
}

bool HttpServer::read_body(const httplib::ContentReader& reader, httplib::Response& res,
                           std::string& body) {
  RequestState& st = *tls_request;
  // A body may arrive slowly: at most body_slots() are read at once (then
  // 503 busy, the body unread), so slow senders and data plane calls
  // together always leave a worker for the rest.
  if (body_reads_.fetch_add(1) >= body_slots()) {
    body_reads_.fetch_sub(1);
    st.refused = true;
    refuse(res, Refusal::busy, 503, "busy", "listen.threads",
           std::to_string(body_slots()) +
               " requests are sending their bodies (listen.threads less "
               "listen.dataplane_concurrency and one); retry in 1 s");
    return false;
  }
  const SlotRelease release{body_reads_};
  bool too_large = false;
  const bool ok = reader([&](const char* data, size_t n) {
    if (body.size() + n > limits_.max_body) {
      too_large = true;
      return false;
    }
    body.append(data, n);
    return true;
  });
  if (ok) {
    st.body_done = true;
    return true;
  }
  st.refused = true;
  if (too_large || st.stream->over_budget())
    refuse(res, Refusal::body_too_large, 413, "too_large", "body",
           "the body is over listen.max_body (" + std::to_string(limits_.max_body) + " bytes)");
  else if (st.stream->read_timed_out())
    refuse(res, Refusal::body_timeout, 408, "timeout", "body",
           "the body did not arrive within listen.body_timeout_ms (" +
               std::to_string(limits_.body_timeout.count()) + " ms)");
  else
    refuse(res, Refusal::body_malformed, 400, "invalid_argument", "body",
           "the body could not be read: bad chunked framing, or the connection closed before "
           "its end");
  return false;
}

unsigned HttpServer::body_slots() const noexcept {
  const unsigned free = limits_.threads - std::min(limits_.threads, limits_.dataplane_concurrency);
  return free > 1 ? free - 1 : 1;
}

// Runs a route's handler; one flagged kDataplane only in a free data plane
// slot (at most dataplane_concurrency at once), else 503 at once.
void HttpServer::call(unsigned flags, httplib::Response& res, const std::function<void()>& fn) {
  if (!(flags & kDataplane)) return fn();
  if (dataplane_calls_.fetch_add(1) >= limits_.dataplane_concurrency) {
    dataplane_calls_.fetch_sub(1);
    return refuse(res, Refusal::busy, 503, "busy", "listen.dataplane_concurrency",
                  std::to_string(limits_.dataplane_concurrency) +
                      " data plane calls are running (listen.dataplane_concurrency); retry in 1 s");
  }
  const SlotRelease release{dataplane_calls_};
  fn();
}

void HttpServer::refuse(httplib::Response& res, Refusal why, int http, const std::string& code,
                        const std::string& field, const std::string& message) {
  ++refused_[static_cast<size_t>(why)];
  res.status = http;
  res.set_content(error_body(code, field, message), "application/json");
  if (why == Refusal::unauthorized) res.set_header("WWW-Authenticate", "Bearer");
  if (why == Refusal::busy) res.set_header("Retry-After", "1");
}

// Runs after the head is parsed and before any body byte is read.
httplib::Server::HandlerResponse HttpServer::pre_route(const httplib::Request& req,
                                                       httplib::Response& res) {
  RequestState& st = *tls_request;
  st.routed = true;
  const std::string te = req.get_header_value("Transfer-Encoding");
  const bool has_length = req.has_header("Content-Length");
  const std::string length = req.get_header_value("Content-Length");
  st.has_body = !te.empty() || (has_length && length != "0");
  auto plain = [&](int http, const std::string& code, const std::string& field,
                   const std::string& message) {
    res.status = http;
    res.set_content(error_body(code, field, message), "application/json");
    return HandlerResponse::Handled;
  };
  auto refused = [&](Refusal why, int http, const std::string& code, const std::string& field,
                     const std::string& message) {
    refuse(res, why, http, code, field, message);
    return HandlerResponse::Handled;
  };

  if (req.path.size() > kMaxPath)
    return plain(414, "invalid_argument", "path",
                 "the path is over " + std::to_string(kMaxPath) + " bytes");
  const std::string method = req.method == "HEAD" ? "GET" : req.method;
  const Route* route = nullptr;
  std::string allow;
  for (const Route& r : routes_) {
    if (!std::regex_match(req.path, r.pattern)) continue;
    if (r.method == method) {
      route = &r;
      break;
    }
    allow += (allow.empty() ? "" : ", ") + r.method;
  }
  if (!route) {
    if (allow.empty())
      return plain(404, "not_found", "", "no such endpoint: " + req.method + " " + req.path);
    res.set_header("Allow", allow);
    return plain(405, "method_not_allowed", "",
                 req.method + " " + req.path + " is not served; it takes " + allow);
  }
  if ((route->flags & kAuth) && authorize_(req) == Role::kAnonymous) {
    const std::string h = req.get_header_value("Authorization");
    return refused(
        Refusal::unauthorized, 401, "unauthorized", "Authorization",
        h.empty() ? "this call needs 'Authorization: Bearer <token>'" : "bad bearer token");
  }
  if (st.has_body && !route->body)
    return refused(Refusal::body_not_allowed, 413, "too_large", "body",
                   req.method + " " + req.path + " takes no body; send none");
  if (!route->body) return HandlerResponse::Unhandled;

  if (req.get_header_value_count("Transfer-Encoding") > 1 ||
      req.get_header_value_count("Content-Length") > 1)
    return refused(Refusal::body_malformed, 400, "invalid_argument", "Content-Length",
                   "give one Content-Length or one 'Transfer-Encoding: chunked' header");
  if (!te.empty() && !iequals(te, "chunked"))
    return refused(Refusal::body_malformed, 501, "unsupported", "Transfer-Encoding",
                   "only 'Transfer-Encoding: chunked' is supported");
  if (!te.empty() && has_length)
    return refused(Refusal::body_malformed, 400, "invalid_argument", "Content-Length",
                   "give Content-Length or 'Transfer-Encoding: chunked', not both");
  if (has_length) {
    const bool digits = !length.empty() && length.size() <= 18 &&
                        length.find_first_not_of("0123456789") == std::string::npos;
    if (!digits)
      return refused(Refusal::body_malformed, 400, "invalid_argument", "Content-Length",
                     "Content-Length must be a decimal number of bytes");
    if (std::stoull(length) > limits_.max_body)
      return refused(Refusal::body_too_large, 413, "too_large", "body",
                     "the body (" + length + " bytes) is over listen.max_body (" +
                         std::to_string(limits_.max_body) + " bytes)");
  } else if (te.empty()) {
    return refused(Refusal::body_malformed, 411, "invalid_argument", "Content-Length",
                   "send the body with Content-Length or 'Transfer-Encoding: chunked'");
  }
  const std::string encoding = req.get_header_value("Content-Encoding");
  if (!encoding.empty() && !iequals(encoding, "identity"))
    return refused(Refusal::body_malformed, 415, "unsupported", "Content-Encoding",
                   "send the body uncompressed (no Content-Encoding)");
  if (req.get_header_value("Content-Type").rfind("multipart/", 0) == 0 ||
      req.is_multipart_form_data())
    return refused(Refusal::body_malformed, 415, "unsupported", "Content-Type",
                   "send the body as application/json");
  return HandlerResponse::Unhandled;
}

// Runs on every answer just before it is written: decides whether the
// connection outlives it, and says so in the headers.
void HttpServer::finish_response(const httplib::Request&, httplib::Response& res) {
  RequestState& st = *tls_request;
  if (!st.routed || st.refused || (st.has_body && !st.body_done)) st.last = true;
  if (!st.last) return;
  res.headers.erase("Keep-Alive");
  res.headers.erase("Connection");
  res.headers.emplace("Connection", "close");
}

// ---- listening socket and gate --------------------------------------------

Status HttpServer::listen(const std::string& address, uint16_t port) {
  auto fail = [&](const char* what) {
    const Status s(StatusCode::unavailable, "listen.port",
                   "cannot listen on " + address + ":" + std::to_string(port) + ": " + what + ": " +
                       std::strerror(errno));
    if (listen_fd_ >= 0) ::close(listen_fd_);
    listen_fd_ = -1;
    return s;
  };
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  if (::inet_pton(AF_INET, address.c_str(), &a.sin_addr) != 1) {
    errno = EINVAL;
    return fail("address");
  }
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (listen_fd_ < 0) return fail("socket");
  // SO_REUSEADDR (restart while old connections sit in TIME_WAIT), never
  // SO_REUSEPORT: a second daemon on the same port must fail here.
  const int yes = 1;
  if (::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes)) != 0)
    return fail("SO_REUSEADDR");
  if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) return fail("bind");
  if (::listen(listen_fd_, 128) != 0) return fail("listen");
  epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (epoll_fd_ < 0 || wake_fd_ < 0) return fail("epoll");
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = listen_fd_;
  if (::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, listen_fd_, &ev) != 0) return fail("epoll_ctl");
  ev.data.fd = wake_fd_;
  if (::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &ev) != 0) return fail("epoll_ctl");
  return {};
}

void HttpServer::stop() {
  stopping_ = true;
  if (wake_fd_ >= 0) {
    const uint64_t one = 1;
    (void)!::write(wake_fd_, &one, sizeof(one));
  }
}

void HttpServer::run() {
  for (unsigned i = 0; i < limits_.threads; ++i) workers_.emplace_back([this] { worker_main(); });
  gate_main();
  {
    std::lock_guard lock(work_mu_);
    work_closed_ = true;
  }
  work_cv_.notify_all();
  for (auto& t : workers_) t.join();
  workers_.clear();
  std::lock_guard lock(returned_mu_);
  for (Conn& c : returned_) ::close(c.fd);
  returned_.clear();
}

void HttpServer::gate_close(int fd) {
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
  conns_.erase(fd);
  ::close(fd);
  --open_;
}

// Writes a short answer (best effort: it fits any socket buffer), half-closes
// and lets the connection drain.
void HttpServer::gate_answer_and_close(int fd, const std::string& response) {
  (void)!::send(fd, response.data(), response.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  ::shutdown(fd, SHUT_WR);
  auto it = conns_.find(fd);
  if (it == conns_.end()) return;
  it->second.draining = true;
  it->second.drained = 0;
  it->second.deadline = Clock::now() + kDrainTime;
  gate_readable(it->second);
}

void HttpServer::gate_accept() {
  for (;;) {
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      return;  // EAGAIN, or out of descriptors: the next readiness retries
    }
    ++accepted_;
    // httplib refuses sockets >= FD_SETSIZE (it uses select); so do we, politely.
    if (open_.load() >= limits_.max_connections || fd >= FD_SETSIZE) {
      ++refused_[static_cast<size_t>(Refusal::connection_cap)];
      static const std::string full =
          canned(503, "busy", "listen.max_connections",
                 "too many open connections (listen.max_connections); retry later");
      (void)!::send(fd, full.data(), full.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
      ::close(fd);
      continue;
    }
    ++open_;
    // Headers and body go out in two writes: without TCP_NODELAY every
    // answer on a kept-alive connection would wait for the client's delayed
    // ACK (about 40 ms).
    const int one = 1;
    (void)::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    Conn c;
    c.fd = fd;
    c.deadline = Clock::now() + limits_.header_timeout;
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP | EPOLLET;
    ev.data.fd = fd;
    if (::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
      ::close(fd);
      --open_;
      continue;
    }
    conns_.emplace(fd, c);
  }
}

// New bytes (or an end) on a connection the gate holds.
void HttpServer::gate_readable(Conn& c) {
  const int fd = c.fd;
  if (c.draining) {
    char buf[16384];
    for (;;) {
      const ssize_t n = ::recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
      if (n > 0) {
        c.drained += static_cast<size_t>(n);
        if (c.drained > kDrainBytes) return gate_close(fd);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      return gate_close(fd);  // end of stream or error
    }
  }
  char buf[kMaxHead];
  ssize_t n;
  do {
    n = ::recv(fd, buf, sizeof(buf), MSG_PEEK | MSG_DONTWAIT);
  } while (n < 0 && errno == EINTR);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
  if (n <= 0) return gate_close(fd);
  const size_t have = static_cast<size_t>(n);
  const std::string_view view(buf, have);
  const size_t from = c.scanned >= 3 ? c.scanned - 3 : 0;
  const size_t end = view.find("\r\n\r\n", from);
  if (end == std::string_view::npos) {
    c.scanned = have;
    if (have < kMaxHead) return;
    ++refused_[static_cast<size_t>(Refusal::head_too_large)];
    static const std::string too_large =
        canned(431, "too_large", "headers", "the request line and headers are over 16 KiB");
    return gate_answer_and_close(fd, too_large);
  }
  // A whole head: hand the connection to a worker.
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
  Conn ready = c;
  ready.head_len = end + 4;
  conns_.erase(fd);
  {
    std::lock_guard lock(work_mu_);
    work_.push_back(ready);
  }
  work_cv_.notify_one();
}

void HttpServer::gate_main() {
  epoll_event events[64];
  while (!stopping_) {
    // Sleep until the nearest deadline (at most 1 s).
    auto next = Clock::now() + std::chrono::seconds(1);
    for (const auto& [fd, c] : conns_) next = std::min(next, c.deadline);
    const int n = ::epoll_wait(epoll_fd_, events, 64, std::max(1, ms_left(next)));
    for (int i = 0; i < n; ++i) {
      const int fd = events[i].data.fd;
      if (fd == listen_fd_) {
        gate_accept();
      } else if (fd == wake_fd_) {
        uint64_t v;
        (void)!::read(wake_fd_, &v, sizeof(v));
        std::vector<Conn> back;
        {
          std::lock_guard lock(returned_mu_);
          back.swap(returned_);
        }
        for (Conn& c : back) {
          epoll_event ev{};
          ev.events = EPOLLIN | EPOLLRDHUP | EPOLLET;
          ev.data.fd = c.fd;
          if (::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, c.fd, &ev) != 0) {
            ::close(c.fd);
            --open_;
            continue;
          }
          conns_[c.fd] = c;
          // Bytes that came during the request (a pipelined head) raise no new edge.
          gate_readable(conns_[c.fd]);
        }
      } else if (auto it = conns_.find(fd); it != conns_.end()) {
        gate_readable(it->second);
      }
    }
    // Deadlines.
    const auto now = Clock::now();
    std::vector<int> late;
    for (const auto& [fd, c] : conns_)
      if (c.deadline <= now) late.push_back(fd);
    for (int fd : late) {
      Conn& c = conns_[fd];
      if (c.draining || (c.scanned == 0 && c.requests > 0)) {
        gate_close(fd);  // drained long enough, or an idle keep-alive connection
        continue;
      }
      ++refused_[static_cast<size_t>(Refusal::head_timeout)];
      static const std::string timeout =
          canned(408, "timeout", "headers",
                 "the request head did not arrive whole in time (listen.header_timeout_ms)");
      gate_answer_and_close(fd, timeout);
    }
  }
  for (auto& [fd, c] : conns_) {
    ::close(fd);
    --open_;
  }
  conns_.clear();
  ::close(listen_fd_);
  listen_fd_ = -1;
}

// ---- workers --------------------------------------------------------------

void HttpServer::hand_back(Conn c) {
  if (stopping_) {
    ::close(c.fd);
    --open_;
    return;
  }
  {
    std::lock_guard lock(returned_mu_);
    returned_.push_back(c);
  }
  const uint64_t one = 1;
  (void)!::write(wake_fd_, &one, sizeof(one));
}

void HttpServer::worker_main() {
  for (;;) {
    Conn c;
    {
      std::unique_lock lock(work_mu_);
      work_cv_.wait(lock, [this] { return work_closed_ || !work_.empty(); });
      if (work_.empty()) return;
      c = work_.front();
      work_.pop_front();
    }
    serve(c);
  }
}

void HttpServer::serve(Conn c) {
  // The head is in the socket (the gate peeked at it): take exactly it.
  std::string head(c.head_len, '\0');
  size_t got = 0;
  while (got < head.size()) {
    const ssize_t n = ::recv(c.fd, head.data() + got, head.size() - got, MSG_DONTWAIT);
    if (n > 0) {
      got += static_cast<size_t>(n);
    } else if (!(n < 0 && errno == EINTR)) {
      ::close(c.fd);
      --open_;
      return;
    }
  }
  ConnStream strm(c.fd, std::move(head), limits_);
  RequestState st;
  st.stream = &strm;
  st.last = ++c.requests >= limits_.keepalive_requests || stopping_;
  tls_request = &st;
  bool client_closes = false;
  bool ok = false;
  try {
    ok = process_request(strm, st.last, client_closes, nullptr);
  } catch (...) {
    ok = false;
  }
  tls_request = nullptr;
  if (strm.write_timed_out()) ++refused_[static_cast<size_t>(Refusal::write_timeout)];
  if (!ok || strm.write_timed_out()) {
    ::close(c.fd);
    --open_;
    return;
  }
  if (st.last || client_closes) {
    // Half-close so the client reads the answer; the gate discards the rest.
    ::shutdown(c.fd, SHUT_WR);
    c.draining = true;
    c.drained = 0;
    c.deadline = Clock::now() + kDrainTime;
  } else {
    c.scanned = 0;
    c.head_len = 0;
    c.deadline = Clock::now() + limits_.header_timeout;
  }
  hand_back(c);
}

}  // namespace netreduce::control
