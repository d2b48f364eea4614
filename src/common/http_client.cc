#include "common/http_client.h"

#include <curl/curl.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <mutex>

namespace netreduce {

namespace {

using Clock = std::chrono::steady_clock;

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

// One header line of the answer; a new status line (a redirect, a 100
// Continue) starts the set again.
size_t on_header(char* data, size_t size, size_t n, void* user) {
  auto& headers = *static_cast<std::map<std::string, std::string>*>(user);
  std::string line(data, size * n);
  if (line.rfind("HTTP/", 0) == 0) {
    headers.clear();
    return size * n;
  }
  const auto colon = line.find(':');
  if (colon == std::string::npos) return size * n;
  std::string value = line.substr(colon + 1);
  const auto b = value.find_first_not_of(" \t");
  const auto e = value.find_last_not_of(" \t\r\n");
  value = b == std::string::npos ? "" : value.substr(b, e - b + 1);
  headers[lower(line.substr(0, colon))] = value;
  return size * n;
}

// What libcurl's callbacks share with perform() during one request.
struct Transfer {
  std::string* body = nullptr;                                     // call(): collects the answer
  const std::function<bool(std::string_view)>* on_data = nullptr;  // stream(): takes each piece
  const std::atomic<bool>* cancel = nullptr;
  Clock::time_point first_byte_by = Clock::time_point::max();
  bool got_body = false;
  bool stopped = false;    // on_data returned false
  bool cancelled = false;  // the cancel flag ended the request
  bool silent = false;     // no body by first_byte_by
};

// A piece of the answer's body; returning less than given ends the transfer.
size_t on_body(char* data, size_t size, size_t n, void* user) {
  auto& t = *static_cast<Transfer*>(user);
  t.got_body = true;
  if (t.body) {
    t.body->append(data, size * n);
  } else if (!(*t.on_data)(std::string_view(data, size * n))) {
    t.stopped = true;
    return 0;
  }
  return size * n;
}

// libcurl's progress callback, run on every wake of the request loop:
// non-zero ends the request.
int on_progress(void* user, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  auto& t = *static_cast<Transfer*>(user);
  t.cancelled = t.cancel && t.cancel->load();
  t.silent = !t.got_body && Clock::now() > t.first_byte_by;
  return t.cancelled || t.silent ? 1 : 0;
}

// Runs transfer `c` through `m` to its end: progress as far as the sockets
// allow, then sleep until one is ready or kWakeMs has passed (libcurl runs
// on_progress on each pass). `err`: libcurl's error buffer.
CURLcode drive(CURLM* m, CURL* c, char* err) {
  if (curl_multi_add_handle(m, c) != CURLM_OK) return CURLE_FAILED_INIT;
  CURLcode rc = CURLE_OK;
  for (int running = 1; running;) {
    CURLMcode mc = curl_multi_perform(m, &running);
    if (mc == CURLM_OK && running)
      mc = curl_multi_poll(m, nullptr, 0, HttpClient::kWakeMs, nullptr);
    if (mc != CURLM_OK) {
      std::snprintf(err, CURL_ERROR_SIZE, "%s", curl_multi_strerror(mc));
      rc = CURLE_RECV_ERROR;
      break;
    }
  }
  int queued = 0;
  while (CURLMsg* msg = curl_multi_info_read(m, &queued))
    if (msg->msg == CURLMSG_DONE && rc == CURLE_OK) rc = msg->data.result;
  curl_multi_remove_handle(m, c);
  return rc;
}

}  // namespace

std::string HttpReply::header(const std::string& name) const {
  const auto it = headers.find(lower(name));
  return it == headers.end() ? "" : it->second;
}

std::unique_ptr<HttpClient> HttpClient::make(const std::string& base_url, std::string& why) {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  std::string base = base_url;
  while (!base.empty() && base.back() == '/') base.pop_back();
  const std::string scheme = "http://";
  const std::string host = base.rfind(scheme, 0) == 0 ? base.substr(scheme.size()) : "";
  if (host.empty() || host.find_first_of("/?# \t\r\n") != std::string::npos) {
    why = "URL '" + base_url + "' is not valid (expected http://host:port)";
    return nullptr;
  }
  std::unique_ptr<HttpClient> c(new HttpClient(base));
  if (!c->curl_ || !c->multi_) {
    why = "libcurl could not make a handle";
    return nullptr;
  }
  return c;
}

HttpClient::HttpClient(std::string base)
    : base_(std::move(base)), curl_(curl_easy_init()), multi_(curl_multi_init()) {}

HttpClient::~HttpClient() {
  if (curl_) curl_easy_cleanup(static_cast<CURL*>(curl_));
  if (multi_) curl_multi_cleanup(static_cast<CURLM*>(multi_));  // closes the kept connection
}

HttpReply HttpClient::call(const std::string& method, const std::string& path,
                           const std::string& body, int timeout_ms,
                           const std::vector<std::string>& headers) {
  return perform(method, path, body, timeout_ms, headers, nullptr, 0);
}

HttpReply HttpClient::stream(const std::string& method, const std::string& path,
                             const std::string& body, int timeout_ms,
                             const std::function<bool(std::string_view)>& on_data,
                             int first_byte_ms, const std::vector<std::string>& headers) {
  return perform(method, path, body, timeout_ms, headers, &on_data, first_byte_ms);
}

HttpReply HttpClient::perform(const std::string& method, const std::string& path,
                              const std::string& body, int timeout_ms,
                              const std::vector<std::string>& headers,
                              const std::function<bool(std::string_view)>* on_data,
                              int first_byte_ms) {
  HttpReply r;
  if (cancel_ && cancel_->load()) {
    r.error = "cancelled";
    return r;
  }
  Transfer t;
  t.body = on_data ? nullptr : &r.body;
  t.on_data = on_data;
  t.cancel = cancel_;
  if (first_byte_ms > 0) t.first_byte_by = Clock::now() + std::chrono::milliseconds(first_byte_ms);
  CURL* c = static_cast<CURL*>(curl_);
  CURLM* m = static_cast<CURLM*>(multi_);
  curl_easy_reset(c);  // the connection stays in multi_'s cache: the next call reuses it
  const std::string url = base_ + path;
  curl_slist* list = nullptr;
  for (const std::string& h : headers) list = curl_slist_append(list, h.c_str());
  if (!bearer_.empty())
    list = curl_slist_append(list, ("Authorization: Bearer " + bearer_).c_str());
  // An empty body goes without a type (not curl's default form type).
  list = curl_slist_append(list, body.empty() ? "Content-Type:" : "Content-Type: application/json");
  list = curl_slist_append(list, "Expect:");  // no 100-continue round trip
  char err[CURL_ERROR_SIZE] = {};
  curl_easy_setopt(c, CURLOPT_URL, url.c_str());
  curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http");
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, static_cast<long>(std::max(timeout_ms, 1)));
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(std::max(timeout_ms, 1)));
  curl_easy_setopt(c, CURLOPT_TCP_NODELAY, 1L);
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, list);
  curl_easy_setopt(c, CURLOPT_ERRORBUFFER, err);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &t);
  curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(c, CURLOPT_HEADERDATA, &r.headers);
  curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
  curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, on_progress);
  curl_easy_setopt(c, CURLOPT_XFERINFODATA, &t);
  if (method == "GET") {
    curl_easy_setopt(c, CURLOPT_HTTPGET, 1L);
  } else {
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method.c_str());
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, body.c_str());
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
  }

  const CURLcode rc = drive(m, c, err);
  curl_slist_free_all(list);

  long status = 0;
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
  if (rc == CURLE_OK || (rc == CURLE_WRITE_ERROR && t.stopped)) {
    r.status = static_cast<int>(status);
    return r;
  }
  r.error = err[0] ? err : curl_easy_strerror(rc);
  if (t.cancelled)
    r.error = "cancelled";
  else if (t.silent)
    r.error = "no answer within " + std::to_string(first_byte_ms) + " ms";
  if (rc == CURLE_OPERATION_TIMEDOUT) {
    r.error = "timed out after " + std::to_string(timeout_ms) + " ms (" + r.error + ")";
    if (t.on_data && status != 0) {  // a stream that was answering: its window ended
      r.status = static_cast<int>(status);
      return r;
    }
  }
  r.body.clear();
  r.headers.clear();
  return r;
}

}  // namespace netreduce
