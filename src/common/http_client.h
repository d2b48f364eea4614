// Outbound HTTP with a total deadline per request (libcurl).
//
// Who talks outbound: the host library to its daemon (register, status,
// renew, delete) and a daemon to its fabric peers. Both must stay bounded
// by their own timeout whatever the other side does. A per-recv timeout is
// not enough: a server that answers one byte every second never trips it,
// and a call meant to take 3 s took 15 s and more. libcurl's
// CURLOPT_TIMEOUT_MS bounds the whole exchange (connect, send, every byte
// of the answer).
//
// One HttpClient holds one easy handle, so consecutive requests to the same
// server reuse the connection (keep-alive); libcurl sets TCP_NODELAY, so a
// request on a kept-alive connection does not wait for a delayed ACK.
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
// are independent (no signals: CURLOPT_NOSIGNAL).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace netreduce {

struct HttpReply {
  int status = 0;     // 0: no answer (error says why)
  std::string error;  // transport failure: refused, timed out, malformed answer
  std::string body;
  std::map<std::string, std::string> headers;  // names in lower case

  bool ok() const { return status != 0; }
  // A header's value, "" when absent (name in any case).
  std::string header(const std::string& name) const;
};

class HttpClient {
 public:
  // A client for `base_url` (http://host:port, no path); null with `why`
  // for anything else.
  static std::unique_ptr<HttpClient> make(const std::string& base_url, std::string& why);
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  void set_bearer(std::string token) { bearer_ = std::move(token); }
  const std::string& base_url() const { return base_; }

  // `method` `path` with `body` (sent as application/json when not empty)
  // and `headers` ("Name: value"), all of it within `timeout_ms`.
  HttpReply call(const std::string& method, const std::string& path, const std::string& body,
                 int timeout_ms, const std::vector<std::string>& headers = {});

 private:
  explicit HttpClient(std::string base);
  std::string base_;
  std::string bearer_;
  void* curl_ = nullptr;  // CURL*
};

}  // namespace netreduce
