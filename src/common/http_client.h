// Outbound HTTP with a total deadline per request (libcurl).
//
// Who talks outbound: the host library to its daemon (register, status,
// renew, delete), the CLI to its daemon, and a daemon to etcd
// (control/etcd.h). Each must stay bounded by its own timeout whatever the
// other side does. A per-recv timeout is not enough: a server that answers
// one byte every second never trips it, and a call meant to take 3 s took
// 15 s and more. libcurl's CURLOPT_TIMEOUT_MS bounds the whole exchange
// (connect, send, every byte of the answer).
//
// One HttpClient holds one easy handle and the multi handle that drives it,
// so consecutive requests to the same server reuse the connection
// (keep-alive; the multi handle keeps it between requests); libcurl sets
// TCP_NODELAY, so a request on a kept-alive connection does not wait for a
// delayed ACK. The request loop wakes at least every kWakeMs even when the
// server is silent (curl_easy_perform would sleep up to a second), and each
// wake runs libcurl's progress callback, which ends the request once the
// cancel flag (set_cancel()) is true: a stopping caller waits for no timeout.
//
// call() collects the answer's body; stream() hands it over piece by piece
// as it arrives (a long-lived answer such as etcd's watch): the callback
// ends the transfer when it has seen enough, and the reply tells "the
// deadline ended a stream that was answering" (status set, error "timed
// out ...") from "no answer" (status 0).
//
// Example:
//   std::string why;
//   auto cli = HttpClient::make("http://10.0.0.9:7470", why);  // null: why
//   cli->set_bearer("s3cret");
//   HttpReply r = cli->call("POST", "/v1/rings", body, 3000);
//   if (!r.ok()) ...          // no answer: r.error says why ("timed out ...")
//   else if (r.status == 201) ... r.body, r.header("Retry-After") ...
//
// Threads: an HttpClient is used by one thread at a time; distinct clients
// are independent (no signals: CURLOPT_NOSIGNAL). The cancel flag may be set
// from any thread.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace netreduce {

struct HttpReply {
  int status = 0;     // 0: no answer (error says why)
  std::string error;  // transport failure: refused, timed out, cancelled, malformed answer
  std::string body;   // call() only
  std::map<std::string, std::string> headers;  // names in lower case

  bool ok() const { return status != 0; }
  // A header's value, "" when absent (name in any case).
  std::string header(const std::string& name) const;
};

class HttpClient {
 public:
  // The longest the request loop sleeps: how late a cancel flag is seen.
  static constexpr int kWakeMs = 20;

  // A client for `base_url` (http://host:port, no path); null with `why`
  // for anything else.
  static std::unique_ptr<HttpClient> make(const std::string& base_url, std::string& why);
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  void set_bearer(std::string token) { bearer_ = std::move(token); }
  // While `*flag` is true, a request in progress ends within kWakeMs and
  // every later one at once: no answer, error "cancelled". The flag must
  // outlive the client; null: none.
  void set_cancel(const std::atomic<bool>* flag) { cancel_ = flag; }
  const std::string& base_url() const { return base_; }

  // `method` `path` with `body` (sent as application/json when not empty)
  // and `headers` ("Name: value"), all of it within `timeout_ms`.
  HttpReply call(const std::string& method, const std::string& path, const std::string& body,
                 int timeout_ms, const std::vector<std::string>& headers = {});

  // Like call(), but each piece of the answer's body goes to `on_data` as it
  // arrives (reply.body stays empty); on_data returning false ends the
  // transfer, which is no error (the reply has the status, error empty);
  // it runs inside libcurl and must not throw.
  // `first_byte_ms` (0: timeout_ms) bounds the wait for the first piece of
  // body: a server that accepts and then drips or says nothing costs that
  // long, not all of timeout_ms. The whole stream ends at `timeout_ms`; if
  // the status line had arrived by then, the reply keeps its status with
  // error "timed out ..." (the window ended), else it is no answer.
  // `headers` as for call().
  HttpReply stream(const std::string& method, const std::string& path, const std::string& body,
                   int timeout_ms, const std::function<bool(std::string_view)>& on_data,
                   int first_byte_ms = 0, const std::vector<std::string>& headers = {});

 private:
  explicit HttpClient(std::string base);
  // The request itself, for call() (on_data null: the body is collected)
  // and stream(): sets the options, drives the transfer through multi_ and
  // turns libcurl's outcome into the reply.
  HttpReply perform(const std::string& method, const std::string& path, const std::string& body,
                    int timeout_ms, const std::vector<std::string>& headers,
                    const std::function<bool(std::string_view)>* on_data, int first_byte_ms);

  std::string base_;
  std::string bearer_;
  const std::atomic<bool>* cancel_ = nullptr;
  void* curl_ = nullptr;   // CURL*
  void* multi_ = nullptr;  // CURLM*: drives curl_, keeps its connection between requests
};

}  // namespace netreduce
