#include "control/etcd.h"

#include <openssl/evp.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string_view>

#include "common/http_client.h"

namespace netreduce::control {

namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;
using EventsFn = std::function<void(const std::vector<EtcdEvent>&, int64_t)>;

std::string b64(const std::string& in) {
  std::string out(4 * ((in.size() + 2) / 3) + 1, '\0');
  const int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(in.data()),
                                static_cast<int>(in.size()));
  out.resize(static_cast<size_t>(n));
  return out;
}

// EVP_DecodeBlock decodes whole quads and counts the padding's zero bytes
// in its length: they are taken off here.
std::string unb64(const std::string& in) {
  if (in.size() % 4 != 0)
    throw std::invalid_argument("base64 of length " + std::to_string(in.size()));
  std::string out(in.size() / 4 * 3, '\0');
  const int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(in.data()),
                                static_cast<int>(in.size()));
  if (n < 0) throw std::invalid_argument("not base64: " + in.substr(0, 40));
  const size_t padding = in.ends_with("==") ? 2 : in.ends_with("=") ? 1 : 0;
  if (static_cast<size_t>(n) < padding) throw std::invalid_argument("not base64: " + in);
  out.resize(static_cast<size_t>(n) - padding);
  return out;
}

// The end of the key range that holds every key starting with `prefix`
// (etcd's rule): the prefix with its last byte below 0xff incremented and
// what follows it dropped; "\0" (every key from `prefix` on) when there is
// no such byte.
std::string prefix_end(std::string prefix) {
  while (!prefix.empty() && static_cast<unsigned char>(prefix.back()) == 0xff) prefix.pop_back();
  if (prefix.empty()) return std::string(1, '\0');
  prefix.back() = static_cast<char>(static_cast<unsigned char>(prefix.back()) + 1);
  return prefix;
}

// An int64 field of the gateway's JSON: a decimal string, absent when 0.
int64_t num(const json& j, const char* name) {
  const auto it = j.find(name);
  if (it == j.end()) return 0;
  return it->is_string() ? std::stoll(it->get<std::string>()) : it->get<int64_t>();
}

EtcdKv kv_of(const json& j) {
  EtcdKv kv;
  kv.key = unb64(j.value("key", ""));
  kv.value = unb64(j.value("value", ""));
  kv.create_revision = num(j, "create_revision");
  kv.mod_revision = num(j, "mod_revision");
  kv.lease = num(j, "lease");
  return kv;
}

std::string snippet(const std::string& s) { return s.size() <= 200 ? s : s.substr(0, 200) + "..."; }

// etcd's error in the gateway's JSON: {"error": "...", "code": N} for a
// call, {"error": {"grpc_code": N, "message": "..."}} for a stream. gRPC's
// NOT_FOUND (5: no such lease) is not_found, UNAVAILABLE (14: a member
// stopping, no leader) unavailable, anything else internal.
struct EtcdError {
  StatusCode code;
  std::string message;
};

EtcdError etcd_error(const json& answer) {
  const json& e = answer.at("error");
  const json& message = e.is_object() ? e.value("message", json()) : e;
  const json& code = e.is_object() ? e.value("grpc_code", json()) : answer.value("code", json());
  return {code == 5    ? StatusCode::not_found
          : code == 14 ? StatusCode::unavailable
                       : StatusCode::internal,
          message.is_string() ? message.get<std::string>() : e.dump()};
}

Status etcd_status(const std::string& path, const json& answer) {
  EtcdError e = etcd_error(answer);
  return {e.code, "", "etcd " + path + ": " + e.message};
}

// A 4xx's answer: etcd's error if it is one, else the status and body.
Status refusal(const std::string& path, const std::string& endpoint, const HttpReply& r) {
  const json answer = json::parse(r.body, nullptr, false);
  if (answer.is_object() && answer.contains("error")) return etcd_status(path, answer);
  return {StatusCode::internal, "",
          "etcd " + path + " at " + endpoint + ": HTTP " + std::to_string(r.status) + " " +
              snippet(r.body)};
}

// Reads `answer` (a 2xx's body) with `read`; an answer that is not the
// gateway's JSON of the expected shape is internal.
template <typename Read>
Status read_answer(const std::string& path, const std::string& answer, Read&& read) {
  try {
    const json j = json::parse(answer);
    if (j.contains("error")) return etcd_status(path, j);
    read(j);
    return {};
  } catch (const std::exception& e) {
    return {StatusCode::internal, "",
            "etcd " + path + ": unexpected answer (" + e.what() + "): " + snippet(answer)};
  }
}

}  // namespace

bool etcd_endpoint_ok(const std::string& url) {
  const std::string scheme = "http://";
  if (url.rfind(scheme, 0) != 0) return false;
  const std::string rest = url.substr(scheme.size());
  const size_t colon = rest.rfind(':');
  if (colon == 0 || colon == std::string::npos ||
      rest.find_first_of("/?#@ \t\r\n") != std::string::npos)
    return false;
  const std::string port = rest.substr(colon + 1);
  if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos)
    return false;
  const int p = std::stoi(port);
  return p >= 1 && p <= 65535;
}

namespace {

// Each member's failure, "; " between them.
std::string joined(const std::vector<std::string>& failures) {
  std::string all;
  for (const std::string& f : failures) all += (all.empty() ? "" : "; ") + f;
  return all.empty() ? "none tried" : all;
}

int ms_until(Clock::time_point t) {
  return static_cast<int>(
      std::chrono::duration_cast<std::chrono::milliseconds>(t - Clock::now()).count());
}

// One watch stream's answer, read line by line (newline-delimited JSON) as
// its pieces arrive: first {"result": {"created": true}}, then batches of
// events, until the caller's window ends. feed() returns false once the
// outcome is known: compacted, an error, or no "created" by `created_by`.
class WatchReader {
 public:
  WatchReader(const EventsFn& on_events, Clock::time_point created_by, int64_t start_revision)
      : on_events_(on_events), created_by_(created_by), start_revision_(start_revision) {}

  bool feed(std::string_view piece) {
    buf_.append(piece);
    for (size_t nl; !done_ && (nl = buf_.find('\n')) != std::string::npos;) {
      line(buf_.substr(0, nl));
      buf_.erase(0, nl + 1);
    }
    if (!created && Clock::now() > created_by_) late = done_ = true;
    return !done_;
  }

  // The answer's last line when it had no newline (an error's body).
  void finish() {
    if (!done_ && buf_.find_first_not_of(" \t\r\n") != std::string::npos) line(buf_);
  }

  // Whether the member answered the watch (a stream, etcd's refusal, or an
  // answer that is not the gateway's), once stream `r` is over.
  bool answered(const HttpReply& r) const { return created || (r.ok() && r.status < 500 && !late); }

  // The watch call's end once stream `r` from `where` is over; none when
  // that member did not answer (`why`), so the next one may.
  std::optional<Status> outcome(const HttpReply& r, const std::string& where,
                                std::string& why) const {
    const std::string at = "etcd /v3/watch at " + where + ": ";
    const bool failed = fail_code_ != StatusCode::ok;
    if (compact_revision > 0)
      return Status(StatusCode::not_found, "",
                    at + "the start revision is compacted away (compact revision " +
                        std::to_string(compact_revision) + ")");
    if (created) {  // the stream was this call's, however it ended
      const bool window_ended = r.ok() && !r.error.empty() && !failed;  // "timed out", status kept
      if (window_ended) return Status();
      const std::string reason = failed             ? fail_reason_
                                 : !r.error.empty() ? r.error
                                                    : "closed by the member";
      return Status(failed ? fail_code_ : StatusCode::unavailable, "",
                    at + "the stream ended early (" + reason + ")");
    }
    if (answered(r))  // etcd refused the watch, or the answer is not the gateway's
      return Status(
          failed ? fail_code_ : StatusCode::internal, "",
          at + (failed ? fail_reason_ : "HTTP " + std::to_string(r.status) + " without a watch"));
    if (!r.ok())
      why = r.error;
    else if (late)
      why = "no watch created within timeout_ms";
    else
      why = "HTTP " + std::to_string(r.status) + (failed ? ": " + fail_reason_ : "");
    return std::nullopt;
  }

  bool created = false;
  bool late = false;             // no "created" by created_by
  int64_t compact_revision = 0;  // > 0: the start revision was compacted away
  std::exception_ptr callback_threw;

 private:
  void line(const std::string& text) {
    if (text.find_first_not_of(" \t\r") == std::string::npos) return;
    try {
      const json j = json::parse(text);
      if (j.contains("error")) {
        const EtcdError e = etcd_error(j);
        fail(e.code, e.message);
      } else {
        result(j.at("result"));
      }
    } catch (const std::exception& e) {
      fail(StatusCode::internal,
           std::string("unexpected answer (") + e.what() + "): " + snippet(text));
    }
  }

  void fail(StatusCode code, std::string reason) {
    fail_code_ = code;
    fail_reason_ = std::move(reason);
    done_ = true;
  }

  void result(const json& r) {
    const bool first = !created;
    created = created || r.value("created", false);
    if (!created)
      return fail(StatusCode::internal, "an answer before \"created\": " + snippet(r.dump()));
    // A store behind the revision asked for was recreated or restored: etcd
    // would wait for that revision silently, and the caller must read
    // everything again instead.
    if (first && start_revision_ > 0 && r.contains("header")) {
      const int64_t now = num(r["header"], "revision");
      if (now + 1 < start_revision_)
        return fail(StatusCode::not_found, "the store is at revision " + std::to_string(now) +
                                               ", behind " + std::to_string(start_revision_ - 1) +
                                               ": etcd was recreated or restored");
    }
    if (r.value("canceled", false)) {
      compact_revision = num(r, "compact_revision");
      if (compact_revision <= 0)
        fail(StatusCode::internal, "etcd cancelled the watch: " + r.value("cancel_reason", ""));
      done_ = true;
      return;
    }
    const auto events = r.find("events");
    if (events == r.end() || events->empty()) return;  // "created", a progress report
    std::vector<EtcdEvent> batch;
    for (const json& e : *events) {
      EtcdEvent ev;
      ev.deleted = e.value("type", "PUT") == "DELETE";
      ev.kv = kv_of(e.at("kv"));
      if (e.contains("prev_kv")) ev.prev = kv_of(e["prev_kv"]);
      batch.push_back(std::move(ev));
    }
    const int64_t revision = num(r.at("header"), "revision");
    try {
      on_events_(batch, revision);
    } catch (...) {  // through libcurl's C frames it must not go: rethrown after the stream
      callback_threw = std::current_exception();
      done_ = true;
    }
  }

  const EventsFn& on_events_;
  const Clock::time_point created_by_;
  const int64_t start_revision_;
  std::string buf_;  // an incomplete line
  bool done_ = false;
  StatusCode fail_code_ = StatusCode::ok;  // etcd's error, or an answer not the gateway's JSON
  std::string fail_reason_;
};

}  // namespace

Status Etcd::check(const EtcdConfig& cfg) {
  const std::string field = "fabric.etcd.endpoints";
  if (cfg.endpoints.empty())
    return Status::invalid(field,
                           "no endpoint: list the etcd members' client URLs (http://host:port)");
  for (size_t i = 0; i < cfg.endpoints.size(); ++i)
    if (!etcd_endpoint_ok(cfg.endpoints[i]))
      return Status::invalid(
          field, "[" + std::to_string(i) + "] '" + cfg.endpoints[i] + "' is not http://host:port");
  if (cfg.timeout_ms < 1) return Status::invalid("fabric.etcd.timeout_ms", "must be at least 1");
  return {};
}

Etcd::Etcd(EtcdConfig cfg) : cfg_(std::move(cfg)), pool_(cfg_.endpoints.size()) {}

Etcd::~Etcd() = default;

std::unique_ptr<HttpClient> Etcd::take(size_t endpoint) {
  {
    std::lock_guard<std::mutex> lock(pool_mu_);
    auto& idle = pool_[endpoint];
    if (!idle.empty()) {
      std::unique_ptr<HttpClient> c = std::move(idle.back());
      idle.pop_back();
      return c;
    }
  }
  std::string why;
  std::unique_ptr<HttpClient> c = HttpClient::make(cfg_.endpoints[endpoint], why);
  if (c) c->set_cancel(&cancelled_);
  return c;
}

void Etcd::give(size_t endpoint, std::unique_ptr<HttpClient> c) {
  if (!c) return;
  std::lock_guard<std::mutex> lock(pool_mu_);
  pool_[endpoint].push_back(std::move(c));
}

Status Etcd::each_member(const std::string& path, const char* none_did,
                         const std::function<bool()>& time_left, const Attempt& attempt) {
  const size_t n = cfg_.endpoints.size();
  const size_t first = preferred_.load();
  std::vector<std::string> failures;
  for (size_t k = 0; k < n && !cancelled_ && time_left(); ++k) {
    const size_t i = (first + k) % n;
    const std::string& endpoint = cfg_.endpoints[i];
    std::unique_ptr<HttpClient> c = take(i);
    if (!c) {
      failures.push_back(endpoint + ": not a valid URL");
      continue;
    }
    std::string why;
    std::optional<Status> end = attempt(i, *c, why);
    give(i, std::move(c));
    if (cancelled_) break;
    if (end) return *end;
    failures.push_back(endpoint + ": " + why);
  }
  if (cancelled_) return {StatusCode::unavailable, "", "etcd " + path + ": cancelled"};
  return {StatusCode::unavailable, "",
          "etcd " + path + ": " + none_did + " (" + joined(failures) + ")"};
}

Status Etcd::call(const std::string& path, const std::string& body, std::string& answer) {
  return each_member(
      path, "no member answered", [] { return true; },
      [&](size_t i, HttpClient& c, std::string& why) -> std::optional<Status> {
        HttpReply r = c.call("POST", path, body, cfg_.timeout_ms);
        if (!r.ok() || r.status >= 500) {  // no answer, or a member that cannot serve: the next
          why = r.ok() ? "HTTP " + std::to_string(r.status) + " " + snippet(r.body) : r.error;
          return std::nullopt;
        }
        preferred_ = i;
        if (r.status / 100 != 2) return refusal(path, cfg_.endpoints[i], r);
        answer = std::move(r.body);
        return Status();
      });
}

Status Etcd::grant(int64_t ttl_s, int64_t& id) {
  const std::string path = "/v3/lease/grant";
  std::string answer;
  Status s = call(path, json{{"TTL", std::to_string(ttl_s)}}.dump(), answer);
  if (!s) return s;
  return read_answer(path, answer, [&](const json& j) {
    id = num(j, "ID");
    if (id == 0) throw std::runtime_error("no lease ID");
  });
}

Status Etcd::keepalive(int64_t id, int64_t& ttl) {
  const std::string path = "/v3/lease/keepalive";
  std::string answer;
  Status s = call(path, json{{"ID", std::to_string(id)}}.dump(), answer);
  if (!s) return s;
  // A stream of one renewal: {"result": {"ID", "TTL"}}, no TTL for a lease etcd does not hold.
  return read_answer(path, answer, [&](const json& j) { ttl = num(j.at("result"), "TTL"); });
}

Status Etcd::revoke(int64_t id) {
  std::string answer;
  Status s = call("/v3/lease/revoke", json{{"ID", std::to_string(id)}}.dump(), answer);
  if (s.code() == StatusCode::not_found) return {};  // already gone
  return s;
}

Status Etcd::put_if_absent(const std::vector<std::pair<std::string, std::string>>& kvs,
                           int64_t lease, bool& created, std::vector<EtcdKv>& held) {
  const std::string path = "/v3/kv/txn";
  created = false;
  held.clear();
  // If every key's create_revision is 0 (absent): put them all; else read them.
  json txn = {{"compare", json::array()}, {"success", json::array()}, {"failure", json::array()}};
  for (const auto& [key, value] : kvs) {
    txn["compare"].push_back(
        {{"key", b64(key)}, {"target", "CREATE"}, {"result", "EQUAL"}, {"create_revision", "0"}});
    json put = {{"key", b64(key)}, {"value", b64(value)}};
    if (lease) put["lease"] = std::to_string(lease);
    txn["success"].push_back({{"request_put", put}});
    txn["failure"].push_back({{"request_range", {{"key", b64(key)}}}});
  }
  std::string answer;
  Status s = call(path, txn.dump(), answer);
  if (!s) return s;
  return read_answer(path, answer, [&](const json& j) {
    created = j.value("succeeded", false);
    if (created) return;
    for (const json& r : j.value("responses", json::array()))
      for (const json& kv : r.at("response_range").value("kvs", json::array()))
        held.push_back(kv_of(kv));
  });
}

Status Etcd::put(const std::string& key, const std::string& value, int64_t lease) {
  json req = {{"key", b64(key)}, {"value", b64(value)}};
  if (lease) req["lease"] = std::to_string(lease);
  std::string answer;
  return call("/v3/kv/put", req.dump(), answer);
}

Status Etcd::range(const std::string& prefix, std::vector<EtcdKv>& out, int64_t& revision) {
  const std::string path = "/v3/kv/range";
  out.clear();
  std::string answer;
  Status s =
      call(path, json{{"key", b64(prefix)}, {"range_end", b64(prefix_end(prefix))}}.dump(), answer);
  if (!s) return s;
  return read_answer(path, answer, [&](const json& j) {
    revision = num(j.at("header"), "revision");
    for (const json& kv : j.value("kvs", json::array())) out.push_back(kv_of(kv));
  });
}

Status Etcd::watch(const std::string& prefix, int64_t start_revision, int window_ms,
                   const EventsFn& on_events) {
  const std::string path = "/v3/watch";
  json create = {{"key", b64(prefix)}, {"range_end", b64(prefix_end(prefix))}, {"prev_kv", true}};
  if (start_revision > 0) create["start_revision"] = std::to_string(start_revision);
  const std::string body = json{{"create_request", create}}.dump();
  const Clock::time_point window_end = Clock::now() + std::chrono::milliseconds(window_ms);

  // Until one endpoint answers "created", each gets timeout_ms (within what
  // is left of the window); that one's stream is the call's.
  return each_member(
      path, "no member streamed", [&] { return ms_until(window_end) > 0; },
      [&](size_t i, HttpClient& c, std::string& why) -> std::optional<Status> {
        const int left = ms_until(window_end);
        const int answer_ms = std::min(cfg_.timeout_ms, left);
        WatchReader reader(on_events, Clock::now() + std::chrono::milliseconds(answer_ms),
                           start_revision);
        // A member cut off from its cluster's leader refuses the watch
        // rather than stream nothing.
        HttpReply r = c.stream("POST", path, body, left,
                               [&](std::string_view piece) { return reader.feed(piece); },
                               answer_ms, {"Grpc-Metadata-hasleader: true"});
        reader.finish();
        if (reader.callback_threw) std::rethrow_exception(reader.callback_threw);
        if (reader.answered(r)) preferred_ = i;
        return reader.outcome(r, cfg_.endpoints[i], why);
      });
}

}  // namespace netreduce::control
