#include "common/http_client.h"

#include <curl/curl.h>

#include <algorithm>
#include <cctype>
#include <mutex>

namespace netreduce {

namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

size_t on_body(char* data, size_t size, size_t n, void* user) {
  static_cast<std::string*>(user)->append(data, size * n);
  return size * n;
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
  if (!c->curl_) {
    why = "libcurl could not make a handle";
    return nullptr;
  }
  return c;
}

HttpClient::HttpClient(std::string base) : base_(std::move(base)), curl_(curl_easy_init()) {}

HttpClient::~HttpClient() {
  if (curl_) curl_easy_cleanup(static_cast<CURL*>(curl_));
}

HttpReply HttpClient::call(const std::string& method, const std::string& path,
                           const std::string& body, int timeout_ms,
                           const std::vector<std::string>& headers) {
  HttpReply r;
  CURL* c = static_cast<CURL*>(curl_);
  curl_easy_reset(c);  // keeps the connection cache: the next call reuses it
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
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &r.body);
  curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(c, CURLOPT_HEADERDATA, &r.headers);
  if (method == "GET") {
    curl_easy_setopt(c, CURLOPT_HTTPGET, 1L);
  } else {
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method.c_str());
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, body.c_str());
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
  }
  const CURLcode rc = curl_easy_perform(c);
  curl_slist_free_all(list);
  if (rc != CURLE_OK) {
    r.error = err[0] ? err : curl_easy_strerror(rc);
    if (rc == CURLE_OPERATION_TIMEDOUT)
      r.error = "timed out after " + std::to_string(timeout_ms) + " ms (" + r.error + ")";
    r.body.clear();
    r.headers.clear();
    return r;
  }
  long status = 0;
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
  r.status = static_cast<int>(status);
  return r;
}

}  // namespace netreduce
