// netreduced's HTTP API (docs/api.md#the-routes) as one table: each route's
// method, path, who may call it, whether it calls the data plane, and its
// handler, which parses the request's id or body, calls Daemon
// (control/daemon.h) and writes the Reply as JSON. The front end
// (control/http_server.h) applies a route's rules before its handler runs.
//
// Example: DELETE /v1/rings/7 with the jobs' token and the ring's credential.
//  1. The server matches the route (a token needed, a data plane call) and
//     finds the token good: no 401.
//  2. A data plane slot is free (else 503 busy), and the handler runs: "7"
//     is a ring id (else 400, field id), and Daemon::delete_ring checks the
//     credential (403 if it is missing or another) and answers 204.
//
// Who may call a route:
// - anyone: the reads, /v1/health and /metrics;
// - a token, the operator's (auth.token_file) or the jobs'
//   (auth.job_token_file): 401 without one, before a body is read; Daemon
//   lets a job's token change only the rings whose credential it presents;
// - the operator's token alone: fault injection, so that no job can break
//   other jobs' rings (403 with the jobs' token).
//
// Threads: handlers run on the server's workers, several at once. They share
// Daemon (which has its own locks), the server's counters (atomics) and the
// authorize function (read-only).
#pragma once

#include <vector>

#include "control/daemon.h"
#include "control/http_server.h"

namespace netreduce::control {

// The API's routes, served by `server` (whose counters /metrics reports),
// answered by `daemon`; `authorize` tells the operator from a job.
std::vector<HttpRoute> api_routes(Daemon& daemon, const HttpServer& server,
                                  HttpServer::Authorize authorize);

}  // namespace netreduce::control
