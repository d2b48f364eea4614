// netreduced: the control daemon. HTTP/1.1 + JSON API under /v1 (contract in
// docs/api.md#the-routes), Prometheus /metrics, persistence and the
// data plane reconciler (control/daemon.h). The HTTP front end
// (control/http_server.h) authenticates before any body is read, caps
// bodies, keeps slow clients off the worker threads and bounds data plane
// calls; handlers only parse and call Daemon.
//
//   netreduced -c config/netreduced.yaml
//
// Exit status: 0 after SIGINT/SIGTERM, 2 when it cannot start (bad config,
// unreadable token or state file, the state file locked by another
// netreduced, address in use); the message names the config key to fix.
#include <signal.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <charconv>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <thread>

#include "common/fatal_signal.h"
#include "common/ring_json.h"
#include "control/daemon.h"
#include "control/http_server.h"

using namespace netreduce;
using namespace netreduce::control;
using nlohmann::json;

namespace {

[[noreturn]] void refuse(const std::string& key, const std::string& message) {
  std::cerr << "netreduced: " << (key.empty() ? "" : key + ": ") << message << "\n";
  std::exit(2);
}

std::string read_token(const std::string& path, const std::string& key = "auth.token_file") {
  std::ifstream in(path);
  if (!in) refuse(key, "cannot read " + path + ": " + std::strerror(errno));
  std::stringstream ss;
  ss << in.rdbuf();
  std::string t = ss.str();
  const auto ws = " \t\r\n";
  t.erase(t.find_last_not_of(ws) + 1);
  t.erase(0, t.find_first_not_of(ws));
  if (t.empty()) refuse(key, path + " is empty; put the bearer token in it");
  return t;
}

// Replies are serialized with invalid UTF-8 replaced: no input makes them throw.
void send(httplib::Response& res, const Reply& r) {
  res.status = r.http;
  if (r.http == 204) return;
  res.set_content(dump_json(r.body) + "\n", "application/json");
}

void send_error(httplib::Response& res, int http, const std::string& code, const std::string& field,
                const std::string& message) {
  res.status = http;
  res.set_content(error_body(code, field, message), "application/json");
}

// The {id} of /v1/rings/{id}: a decimal unsigned 32-bit integer.
// Parses a request body as JSON; false after answering 400.
bool json_body(const std::string& text, httplib::Response& res, json& out) {
  try {
    out = json::parse(text);
    return true;
  } catch (const std::exception& e) {
    send_error(res, 400, "invalid_argument", "",
               std::string("body is not JSON (UTF-8): ") + e.what());
    return false;
  }
}

bool ring_id(const httplib::Request& req, httplib::Response& res, uint32_t& id) {
  const std::string s = req.matches[1];
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), id);
  if (ec != std::errc() || end != s.data() + s.size()) {
    send_error(res, 400, "invalid_argument", "id",
               "'" + s.substr(0, 40) + "' is not a ring id (unsigned 32-bit integer)");
    return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"netreduced: the netreduce control daemon (HTTP API, persistence, metrics)"};
  std::string config_path = "/etc/netreduce/netreduced.yaml";
  bool check = false;
  app.add_option("-c,--config", config_path, "YAML configuration (see config/netreduced.yaml)");
  app.add_flag("--check", check, "validate the configuration and exit");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }

  DaemonConfig cfg;
  if (Status s = load_daemon_config(config_path, cfg); !s) refuse(s.field(), s.message());
  const std::string token = read_token(cfg.token_file);
  const std::string job_token =
      cfg.job_token_file.empty() ? "" : read_token(cfg.job_token_file, "auth.job_token_file");
  if (!job_token.empty() && same_secret(job_token, token))
    refuse("auth.job_token_file",
           "holds the same token as auth.token_file; the jobs' token must differ from the "
           "operator's");
  if (check) {
    std::cout << "netreduced: " << config_path << " is valid\n";
    return 0;
  }

  // Signals go to one thread that stops the server; block them everywhere else.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  signal(SIGPIPE, SIG_IGN);
  install_fatal_signal_report("netreduced");

  Daemon daemon(cfg);
  if (Status s = daemon.start(); !s) refuse("state.file", s.message());

  // Who a request is: the one place that decides. The operator token
  // (auth.token_file) may do everything; the jobs' token (auth.job_token_file,
  // when configured) may create rings and delete or renew those whose
  // credential it presents (Daemon checks the credential). Anything else is
  // anonymous: routes flagged kAuth answer 401 before reading a body byte.
  auto authorize = [&](const httplib::Request& req) {
    const std::string h = req.get_header_value("Authorization");
    const std::string prefix = "Bearer ";
    if (h.rfind(prefix, 0) == 0) {
      const std::string given = h.substr(prefix.size());
      if (same_secret(given, token)) return Role::kOperator;
      if (!job_token.empty() && same_secret(given, job_token)) return Role::kJob;
    }
    return Role::kAnonymous;
  };
  // What Daemon needs to check ownership (only called on kAuth routes).
  auto ring_auth = [&](const httplib::Request& req) {
    RingAuth a{authorize(req) == Role::kJob ? Caller::job_token : Caller::operator_token,
               std::nullopt};
    if (req.has_header(kCredentialHeader)) a.credential = req.get_header_value(kCredentialHeader);
    return a;
  };
  HttpServer svr(
      HttpLimits{cfg.threads, cfg.max_connections, std::chrono::milliseconds(cfg.header_timeout_ms),
                 std::chrono::milliseconds(cfg.body_timeout_ms),
                 std::chrono::milliseconds(cfg.write_timeout_ms), cfg.keepalive_requests,
                 static_cast<size_t>(cfg.max_body), cfg.dataplane_concurrency},
      authorize);

  // Routes flagged kAuth are refused (401) before their body is read; kDataplane
  // routes run at most listen.dataplane_concurrency at a time (503 beyond).
  svr.post("/v1/rings", kAuth | kDataplane,
           [&](const httplib::Request& req, httplib::Response& res, const std::string& text) {
             json body;
             if (json_body(text, res, body)) send(res, daemon.create_ring(body, ring_auth(req)));
           });
  svr.get("/v1/rings", kDataplane,
          [&](const httplib::Request&, httplib::Response& res) { send(res, daemon.list_rings()); });
  svr.get(R"(/v1/rings/([^/]+))", kDataplane,
          [&](const httplib::Request& req, httplib::Response& res) {
            uint32_t id;
            if (ring_id(req, res, id)) send(res, daemon.get_ring(id));
          });
  svr.del(R"(/v1/rings/([^/]+))", kAuth | kDataplane,
          [&](const httplib::Request& req, httplib::Response& res) {
            uint32_t id;
            if (ring_id(req, res, id)) send(res, daemon.delete_ring(id, ring_auth(req)));
          });
  svr.put(R"(/v1/rings/([^/]+)/lease)", kAuth,  // renewal never calls the data plane
          [&](const httplib::Request& req, httplib::Response& res) {
            uint32_t id;
            if (ring_id(req, res, id)) send(res, daemon.renew_lease(id, ring_auth(req)));
          });
  // Fault injection (operators' rehearsals): the operator token only, never
  // the jobs' (a job must not be able to break other jobs' rings).
  auto operator_only = [&](const httplib::Request& req, httplib::Response& res) {
    if (authorize(req) == Role::kOperator) return true;
    send(res, error_reply({StatusCode::permission_denied, "Authorization",
                           "fault injection needs the operator token (auth.token_file)"}));
    return false;
  };
  svr.post("/v1/faults", kAuth | kDataplane,
           [&](const httplib::Request& req, httplib::Response& res, const std::string& text) {
             json body;
             if (operator_only(req, res) && json_body(text, res, body))
               send(res, daemon.set_fault(body));
           });
  svr.get("/v1/faults", kDataplane, [&](const httplib::Request&, httplib::Response& res) {
    send(res, daemon.list_faults());
  });
  svr.del("/v1/faults", kAuth | kDataplane,
          [&](const httplib::Request& req, httplib::Response& res) {
            if (operator_only(req, res)) send(res, daemon.clear_faults(std::nullopt));
          });
  svr.del(R"(/v1/faults/([^/]+))", kAuth | kDataplane,
          [&](const httplib::Request& req, httplib::Response& res) {
            uint32_t id;
            if (operator_only(req, res) && ring_id(req, res, id))
              send(res, daemon.clear_faults(id));
          });
  svr.get("/v1/status", kDataplane,
          [&](const httplib::Request&, httplib::Response& res) { send(res, daemon.status()); });
  svr.get("/v1/stats", kDataplane,
          [&](const httplib::Request&, httplib::Response& res) { send(res, daemon.stats()); });
  // Health and metrics never call the data plane: atomics and a cache.
  svr.get("/v1/health", 0,
          [&](const httplib::Request&, httplib::Response& res) { send(res, daemon.health()); });
  svr.get("/metrics", 0, [&](const httplib::Request&, httplib::Response& res) {
    HttpStats http;
    http.open_connections = svr.open_connections();
    http.accepted = svr.accepted();
    for (size_t r = 0; r < kRefusalCount; ++r)
      http.refused.emplace_back(to_string(static_cast<Refusal>(r)),
                                svr.refused(static_cast<Refusal>(r)));
    res.set_content(daemon.metrics(http), "text/plain; version=0.0.4; charset=utf-8");
  });

  if (Status s = svr.listen(cfg.bind_address, cfg.port); !s) refuse(s.field(), s.message());
  spdlog::info("netreduced listening on http://{}:{} (data plane {}, state {})", cfg.bind_address,
               cfg.port, cfg.dataplane_socket, cfg.state_file);

  std::thread signals([&] {
    int sig = 0;
    sigwait(&sigs, &sig);
    spdlog::info("signal {}: stopping", sig);
    daemon.cancel_dataplane_calls();  // a slow data plane must not hold up the stop
    svr.stop();
  });
  svr.run();
  daemon.stop();
  // The signal thread is still waiting if the server stopped for another reason.
  if (signals.joinable()) {
    pthread_kill(signals.native_handle(), SIGTERM);
    signals.join();
  }
  spdlog::info("netreduced stopped");
  return 0;
}
