// netreduced: the control daemon. HTTP/1.1 + JSON API under /v1 (contract in
// docs/api.md#the-routes), Prometheus /metrics, persistence and the
// data plane reconciler (control/daemon.h). The HTTP front end
// (control/http_server.h) authenticates before any body is read, caps
// bodies, keeps slow clients off the worker threads and bounds data plane
// calls; the routes' handlers (control/api_routes.h) only parse and call
// Daemon.
//
//   netreduced -c config/netreduced.yaml
//
// Exit status: 0 after SIGINT/SIGTERM, 2 when it cannot start (bad config,
// unreadable token or state file, the state file locked by another
// netreduced, address in use); the message names the config key to fix.
#include <signal.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include "common/fatal_signal.h"
#include "control/api_routes.h"
#include "control/daemon.h"
#include "control/http_server.h"

using namespace netreduce;
using namespace netreduce::control;

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
  const Tokens tokens{
      read_token(cfg.token_file),
      cfg.job_token_file.empty() ? "" : read_token(cfg.job_token_file, "auth.job_token_file")};
  if (!tokens.job_token.empty() && same_secret(tokens.job_token, tokens.operator_token))
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

  // Who a request is (control/auth.h).
  auto authorize = [&](const httplib::Request& req) {
    return role_of(req.get_header_value("Authorization"), tokens);
  };
  HttpServer svr(
      HttpLimits{cfg.threads, cfg.max_connections, std::chrono::milliseconds(cfg.header_timeout_ms),
                 std::chrono::milliseconds(cfg.body_timeout_ms),
                 std::chrono::milliseconds(cfg.write_timeout_ms), cfg.keepalive_requests,
                 static_cast<size_t>(cfg.max_body), cfg.dataplane_concurrency},
      authorize);

  // The API (control/api_routes.h): each route's rules, then its handler.
  svr.add_routes(api_routes(daemon, svr, authorize));

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
