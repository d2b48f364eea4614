#include "host-lib/daemon.h"

#include <httplib.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include "common/ring_json.h"

namespace netreduce::host {

namespace {

std::string trim(std::string s) {
  const auto b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return {};
  const auto e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}

std::string describe_error(const httplib::Result& res) {
  if (!res) return "no answer (" + httplib::to_string(res.error()) + ")";
  std::string m = "HTTP " + std::to_string(res->status);
  try {
    const auto j = nlohmann::json::parse(res->body);
    if (j.contains("error") && j["error"].is_object()) {
      const auto& e = j["error"];
      m += " " + e.value("code", std::string{});
      const std::string field = e.value("field", std::string{});
      if (!field.empty()) m += " (" + field + ")";
      m += ": " + e.value("message", std::string{});
    }
  } catch (const std::exception&) {
  }
  return m;
}

}  // namespace

DaemonTarget daemon_target(const Options& o) {
  DaemonTarget t;
  t.url = o.daemon;
  if (t.url.empty())
    if (const char* v = std::getenv("NETREDUCE_DAEMON")) t.url = trim(v);
  t.token = o.token;
  if (t.token.empty()) {
    if (const char* v = std::getenv("NETREDUCE_TOKEN")) {
      t.token = trim(v);
    } else if (const char* f = std::getenv("NETREDUCE_TOKEN_FILE")) {
      std::ifstream in(f);
      if (!in) {
        t.error = std::string("NETREDUCE_TOKEN_FILE: cannot read ") + f;
      } else {
        std::stringstream ss;
        ss << in.rdbuf();
        t.token = trim(ss.str());
      }
    }
  }
  return t;
}

Registration register_ring(const DaemonTarget& target, const engine::RingSpec& spec,
                           int timeout_ms) {
  Registration reg;
  if (target.url.empty()) {
    reg.reason = "no box configured (NETREDUCE_DAEMON unset)";
    return reg;
  }
  if (!target.error.empty()) {
    reg.reason = target.error;
    return reg;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  try {
    httplib::Client cli(target.url);
    if (!cli.is_valid()) {
      reg.reason = "daemon URL '" + target.url + "' is not valid (expected http://host:port)";
      return reg;
    }
    const auto to = std::chrono::milliseconds(std::max(timeout_ms, 1));
    cli.set_connection_timeout(to);
    cli.set_read_timeout(to);
    cli.set_write_timeout(to);
    if (!target.token.empty()) cli.set_bearer_token_auth(target.token);
    const std::string path = "/v1/rings/" + std::to_string(spec.ring_id);
    // A ring with this id can be left over from an earlier run of the same
    // job (same bootstrap address and members, so the same derived id). Its
    // cells still hold that run's message ids, newer than this run's, and
    // the box would drop this run's messages as stale. Removing it first
    // gives this run fresh cells; the answer (204, 404, an error the POST
    // will also get) changes nothing else.
    auto del = cli.Delete(path);
    const bool replaced = del && del->status == 204;
    const std::string body = ring_to_json(spec).dump();
    auto res = cli.Post("/v1/rings", body, "application/json");
    if (!res || (res->status != 200 && res->status != 201)) {
      reg.reason = "daemon at " + target.url + " refused ring " + std::to_string(spec.ring_id) +
                   ": " + describe_error(res);
      return reg;
    }
    for (;;) {
      auto g = cli.Get(path);
      if (g && g->status == 200) {
        try {
          const auto j = nlohmann::json::parse(g->body);
          if (j.value("installed", false)) {
            reg.installed = true;
            reg.reason = "ring " + std::to_string(spec.ring_id) + " installed by the daemon at " +
                         target.url +
                         (replaced ? " (replacing the ring an earlier run left there)" : "");
            return reg;
          }
        } catch (const std::exception&) {
        }
      }
      if (std::chrono::steady_clock::now() + std::chrono::milliseconds(100) >= deadline) {
        reg.reason = "daemon at " + target.url + " accepted ring " + std::to_string(spec.ring_id) +
                     " but the data plane did not install it within " + std::to_string(timeout_ms) +
                     " ms (" +
                     (g && g->status == 200 ? std::string("installed: false") : describe_error(g)) +
                     ")";
        return reg;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  } catch (const std::exception& e) {
    reg.reason = std::string("daemon registration failed: ") + e.what();
  }
  return reg;
}

}  // namespace netreduce::host
