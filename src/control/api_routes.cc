// The API's route table and its handlers (theory of operation in
// api_routes.h).
#include "control/api_routes.h"

#include <charconv>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "common/ring_json.h"

namespace netreduce::control {

using nlohmann::json;

namespace {

// Who may call a route (api_routes.h): anyone, any token, or the operator's.
enum class Access { anyone, token, operator_token };

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

// The {id} of /v1/rings/{id}: a decimal unsigned 32-bit integer; false
// after answering 400.
bool ring_id(const httplib::Request& req, httplib::Response& res, uint32_t& id) {
  const std::string s = req.matches[1];
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), id);
  if (ec != std::errc() || end != s.data() + s.size()) {
    send_error(
        res, 400, "invalid_argument", "id",
        // Appends only: GCC 12 at -O3 warns falsely (-Wrestrict) on
        // `"literal" + std::string` here.
        std::string("'").append(s, 0, 40).append("' is not a ring id (unsigned 32-bit integer)"));
    return false;
  }
  return true;
}

// The handlers, one a route: each parses what its route takes, calls Daemon
// and sends the Reply.
class Api {
 public:
  using Handler = void (Api::*)(const httplib::Request&, httplib::Response&,
                                const std::string& body) const;

  Api(Daemon& daemon, const HttpServer& server, HttpServer::Authorize authorize)
      : daemon_(daemon), server_(server), authorize_(std::move(authorize)) {}

  // For Access::operator_token: true for the operator's token, else false
  // after answering 403.
  bool operator_only(const httplib::Request& req, httplib::Response& res) const {
    if (authorize_(req) == Role::kOperator) return true;
    send(res, error_reply({StatusCode::permission_denied, "Authorization",
                           "fault injection needs the operator token (auth.token_file)"}));
    return false;
  }

  void create_ring(const httplib::Request& req, httplib::Response& res,
                   const std::string& text) const {
    json body;
    if (json_body(text, res, body)) send(res, daemon_.create_ring(body, ring_auth(req)));
  }
  void list_rings(const httplib::Request&, httplib::Response& res, const std::string&) const {
    send(res, daemon_.list_rings());
  }
  void get_ring(const httplib::Request& req, httplib::Response& res, const std::string&) const {
    uint32_t id;
    if (ring_id(req, res, id)) send(res, daemon_.get_ring(id));
  }
  void delete_ring(const httplib::Request& req, httplib::Response& res, const std::string&) const {
    uint32_t id;
    if (ring_id(req, res, id)) send(res, daemon_.delete_ring(id, ring_auth(req)));
  }
  void renew_lease(const httplib::Request& req, httplib::Response& res, const std::string&) const {
    uint32_t id;
    if (ring_id(req, res, id)) send(res, daemon_.renew_lease(id, ring_auth(req)));
  }
  void set_fault(const httplib::Request&, httplib::Response& res, const std::string& text) const {
    json body;
    if (json_body(text, res, body)) send(res, daemon_.set_fault(body));
  }
  void list_faults(const httplib::Request&, httplib::Response& res, const std::string&) const {
    send(res, daemon_.list_faults());
  }
  void clear_faults(const httplib::Request&, httplib::Response& res, const std::string&) const {
    send(res, daemon_.clear_faults(std::nullopt));
  }
  void clear_ring_faults(const httplib::Request& req, httplib::Response& res,
                         const std::string&) const {
    uint32_t id;
    if (ring_id(req, res, id)) send(res, daemon_.clear_faults(id));
  }
  void status(const httplib::Request&, httplib::Response& res, const std::string&) const {
    send(res, daemon_.status());
  }
  void stats(const httplib::Request&, httplib::Response& res, const std::string&) const {
    send(res, daemon_.stats());
  }
  void health(const httplib::Request&, httplib::Response& res, const std::string&) const {
    send(res, daemon_.health());
  }
  void metrics(const httplib::Request&, httplib::Response& res, const std::string&) const {
    HttpStats http;
    http.open_connections = server_.open_connections();
    http.accepted = server_.accepted();
    for (size_t r = 0; r < kRefusalCount; ++r)
      http.refused.emplace_back(to_string(static_cast<Refusal>(r)),
                                server_.refused(static_cast<Refusal>(r)));
    res.set_content(daemon_.metrics(http), "text/plain; version=0.0.4; charset=utf-8");
  }

 private:
  // What Daemon needs to check ownership (only on routes that need a token).
  RingAuth ring_auth(const httplib::Request& req) const {
    RingAuth a{authorize_(req) == Role::kJob ? Caller::job_token : Caller::operator_token,
               std::nullopt};
    if (req.has_header(kCredentialHeader)) a.credential = req.get_header_value(kCredentialHeader);
    return a;
  }

  Daemon& daemon_;
  const HttpServer& server_;
  const HttpServer::Authorize authorize_;
};

struct Route {
  HttpMethod method;
  const char* pattern;
  Access access;
  bool dataplane;  // calls the data plane: at most listen.dataplane_concurrency at once
  Api::Handler handler;
};

// In the order they are tried: the first route that matches serves.
constexpr Route kRoutes[] = {
    {HttpMethod::kPost, "/v1/rings", Access::token, true, &Api::create_ring},
    {HttpMethod::kGet, "/v1/rings", Access::anyone, true, &Api::list_rings},
    {HttpMethod::kGet, R"(/v1/rings/([^/]+))", Access::anyone, true, &Api::get_ring},
    {HttpMethod::kDelete, R"(/v1/rings/([^/]+))", Access::token, true, &Api::delete_ring},
    // A renewal never calls the data plane.
    {HttpMethod::kPut, R"(/v1/rings/([^/]+)/lease)", Access::token, false, &Api::renew_lease},
    {HttpMethod::kPost, "/v1/faults", Access::operator_token, true, &Api::set_fault},
    {HttpMethod::kGet, "/v1/faults", Access::anyone, true, &Api::list_faults},
    {HttpMethod::kDelete, "/v1/faults", Access::operator_token, true, &Api::clear_faults},
    {HttpMethod::kDelete, R"(/v1/faults/([^/]+))", Access::operator_token, true,
     &Api::clear_ring_faults},
    {HttpMethod::kGet, "/v1/status", Access::anyone, true, &Api::status},
    {HttpMethod::kGet, "/v1/stats", Access::anyone, true, &Api::stats},
    // Health and metrics never call the data plane: atomics and a cache.
    {HttpMethod::kGet, "/v1/health", Access::anyone, false, &Api::health},
    {HttpMethod::kGet, "/metrics", Access::anyone, false, &Api::metrics},
};

}  // namespace

std::vector<HttpRoute> api_routes(Daemon& daemon, const HttpServer& server,
                                  HttpServer::Authorize authorize) {
  const auto api = std::make_shared<const Api>(daemon, server, std::move(authorize));
  std::vector<HttpRoute> table;
  for (const Route& r : kRoutes) {
    // The server refuses a request without a token (401) before its body is
    // read; the operator's token alone is checked here, in the handler.
    const unsigned flags =
        (r.access == Access::anyone ? 0 : kAuth) | (r.dataplane ? kDataplane : 0);
    table.push_back(
        {r.method, r.pattern, flags,
         [api, r](const httplib::Request& req, httplib::Response& res, const std::string& body) {
           if (r.access == Access::operator_token && !api->operator_only(req, res)) return;
           (api.get()->*r.handler)(req, res, body);
         }});
  }
  return table;
}

}  // namespace netreduce::control
