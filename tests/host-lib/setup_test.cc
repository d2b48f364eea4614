// Connection set-up pieces: the TCP bootstrap (real sockets on localhost)
// and the daemon registration against a stub HTTP server speaking the API
// contract (the real daemon is tested in its own suite).
#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "common/ring_json.h"
#include "host-lib/bootstrap.h"
#include "host-lib/daemon.h"

using namespace netreduce;
using namespace netreduce::host;

namespace {

// A free localhost port (bound, then released).
uint16_t free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0);
  socklen_t len = sizeof sa;
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) == 0);
  ::close(fd);
  return ntohs(sa.sin_port);
}

Clock::time_point in_ms(int ms) { return Clock::now() + std::chrono::milliseconds(ms); }

engine::RingSpec spec3() {
  engine::RingSpec s;
  s.ring_id = 42;
  s.members = {0x0A000001, 0x0A000002, 0x0A000003};
  s.msg_len = 4;
  s.window = 8;
  s.payload_bytes = 1024;
  return s;
}

}  // namespace

TEST_CASE("bootstrap: allgather and broadcast over TCP", "[hostlib][bootstrap]") {
  const unsigned P = 4;
  const std::string addr = "127.0.0.1:" + std::to_string(free_port());
  std::vector<std::vector<std::string>> got(P);
  std::vector<std::string> bc(P);
  std::vector<Error> errs(P);
  std::vector<std::thread> th;
  for (unsigned r = 0; r < P; ++r)
    th.emplace_back([&, r] {
      std::unique_ptr<Bootstrap> b;
      errs[r] = Bootstrap::create(r, P, addr, in_ms(10000), b);
      if (!errs[r].ok()) return;
      errs[r] = b->allgather("rank" + std::to_string(r) + std::string(r * 100, 'x'), got[r],
                             in_ms(10000));
      if (!errs[r].ok()) return;
      bc[r] = r == 0 ? "decision" : "";
      errs[r] = b->broadcast(bc[r], in_ms(10000));
    });
  for (auto& t : th) t.join();
  for (unsigned r = 0; r < P; ++r) {
    INFO(errs[r].message);
    REQUIRE(errs[r].ok());
    REQUIRE(got[r].size() == P);
    for (unsigned k = 0; k < P; ++k)
      CHECK(got[r][k] == "rank" + std::to_string(k) + std::string(k * 100, 'x'));
    CHECK(bc[r] == "decision");
  }
}

TEST_CASE("bootstrap: deadlines name who is missing", "[hostlib][bootstrap]") {
  const std::string addr = "127.0.0.1:" + std::to_string(free_port());
  // Rank 0 of 3 with only rank 1 joining: the error names rank 2.
  Error e0, e1;
  std::thread t0([&] {
    std::unique_ptr<Bootstrap> b;
    e0 = Bootstrap::create(0, 3, addr, in_ms(700), b);
  });
  std::thread t1([&] {
    std::unique_ptr<Bootstrap> b;
    e1 = Bootstrap::create(1, 3, addr, in_ms(700), b);
    if (e1.ok()) {
      std::vector<std::string> all;
      e1 = b->allgather("x", all, in_ms(700));
    }
  });
  t0.join();
  t1.join();
  INFO(e0.message);
  CHECK(e0.code == ErrorCode::timeout);
  CHECK(e0.message.find("ranks 2 did not connect") != std::string::npos);
  CHECK(!e1.ok());

  // Nobody listening: a non-zero rank gives up at its deadline, naming rank 0's address.
  std::unique_ptr<Bootstrap> b;
  const Error e = Bootstrap::create(2, 3, addr, in_ms(300), b);
  CHECK(e.code == ErrorCode::timeout);
  CHECK(e.message.find("cannot reach rank 0 at " + addr) != std::string::npos);

  std::string h, err;
  uint16_t p = 0;
  CHECK(!parse_host_port("nohost", h, p, err));
  CHECK(!parse_host_port("h:0", h, p, err));
  CHECK(!parse_host_port("h:70000", h, p, err));
  CHECK(!parse_host_port(":80", h, p, err));
  CHECK(parse_host_port("node-1:29500", h, p, err));
  CHECK(h == "node-1");
  CHECK(p == 29500);
  CHECK(Bootstrap::create(0, 2, "bad", in_ms(10), b).code == ErrorCode::invalid_argument);
}

namespace {

// A stub daemon: POST /v1/rings answers `post_status`; GET /v1/rings/42
// reports `installed`.
struct StubDaemon {
  httplib::Server srv;
  std::thread th;
  int port = 0;
  int post_status = 201;
  bool installed = true;
  std::string seen_auth, seen_body;
  std::vector<std::string> calls;  // "DELETE", "POST" in order
  bool stale = false;              // a ring 42 from an earlier run is there
  std::mutex mu;
  explicit StubDaemon(int status, bool inst) : post_status(status), installed(inst) {
    srv.Delete("/v1/rings/42", [this](const httplib::Request&, httplib::Response& res) {
      std::lock_guard lk(mu);
      calls.push_back("DELETE");
      res.status = stale ? 204 : 404;
      stale = false;
    });
    srv.Post("/v1/rings", [this](const httplib::Request& req, httplib::Response& res) {
      std::lock_guard lk(mu);
      calls.push_back("POST");
      seen_auth = req.get_header_value("Authorization");
      seen_body = req.body;
      res.status = post_status;
      if (post_status >= 300)
        res.set_content(
            R"({"error":{"code":"conflict","field":"id","message":"ring 42 exists with another spec"}})",
            "application/json");
      else
        res.set_content(R"({"ring":)" + req.body + "}", "application/json");
    });
    srv.Get("/v1/rings/42", [this](const httplib::Request&, httplib::Response& res) {
      nlohmann::json j = ring_to_json(spec3());
      j["installed"] = installed;
      res.set_content(j.dump(), "application/json");
    });
    port = srv.bind_to_any_port("127.0.0.1");
    th = std::thread([this] { srv.listen_after_bind(); });
    while (!srv.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ~StubDaemon() {
    srv.stop();
    th.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port); }
};

}  // namespace

TEST_CASE("daemon: registration decides the path and says why", "[hostlib][daemon]") {
  SECTION("installed: ina path; the body is the ring JSON, with the bearer token") {
    StubDaemon d(201, true);
    const Registration r = register_ring({d.url(), "s3cret", ""}, spec3(), 2000);
    INFO(r.reason);
    CHECK(r.installed);
    std::lock_guard lk(d.mu);
    CHECK(d.seen_auth == "Bearer s3cret");
    engine::RingSpec back;
    REQUIRE(ring_from_json(nlohmann::json::parse(d.seen_body), back).ok());
    CHECK(back.ring_id == 42);
    CHECK(back.members == spec3().members);
    CHECK(back.msg_len == 4);
    CHECK(back.window == 8);
    CHECK(back.payload_bytes == 1024);
    CHECK(back.allows_dtype(static_cast<uint8_t>(DataType::bf16)));
    CHECK(back.allows_op(static_cast<uint8_t>(Op::max)));
  }
  SECTION("a ring left by an earlier run of the job is removed before the POST") {
    // Its cells would hold that run's (newer) message ids: the box would
    // drop this run's messages as stale.
    StubDaemon d(200, true);
    d.stale = true;
    const Registration r = register_ring({d.url(), "s3cret", ""}, spec3(), 2000);
    INFO(r.reason);
    CHECK(r.installed);
    CHECK(r.reason.find("replacing the ring an earlier run left there") != std::string::npos);
    std::lock_guard lk(d.mu);
    CHECK(d.calls == std::vector<std::string>{"DELETE", "POST"});
  }
  SECTION("refused: ring path with the daemon's error") {
    StubDaemon d(409, true);
    const Registration r = register_ring({d.url(), "", ""}, spec3(), 2000);
    CHECK(!r.installed);
    CHECK(r.reason.find("refused ring 42") != std::string::npos);
    CHECK(r.reason.find("HTTP 409 conflict (id)") != std::string::npos);
  }
  SECTION("accepted but never installed: ring path, within the deadline") {
    StubDaemon d(200, false);
    const Registration r = register_ring({d.url(), "", ""}, spec3(), 400);
    CHECK(!r.installed);
    CHECK(r.reason.find("did not install it") != std::string::npos);
  }
  SECTION("unreachable") {
    const std::string url = "http://127.0.0.1:" + std::to_string(free_port());
    const Registration r = register_ring({url, "", ""}, spec3(), 500);
    CHECK(!r.installed);
    CHECK(r.reason.find("refused ring 42: no answer") != std::string::npos);
  }
  SECTION("no daemon configured") {
    const Registration r = register_ring({"", "", ""}, spec3(), 500);
    CHECK(!r.installed);
    CHECK(r.reason.find("NETREDUCE_DAEMON unset") != std::string::npos);
  }
  SECTION("environment") {
    ::setenv("NETREDUCE_DAEMON", "http://10.1.2.3:7470", 1);
    ::unsetenv("NETREDUCE_TOKEN");
    ::setenv("NETREDUCE_TOKEN_FILE", "/nonexistent/token", 1);
    DaemonTarget t = daemon_target(Options{});
    CHECK(t.url == "http://10.1.2.3:7470");
    CHECK(t.error.find("NETREDUCE_TOKEN_FILE") != std::string::npos);
    CHECK(!register_ring(t, spec3(), 100).installed);
    ::setenv("NETREDUCE_TOKEN", " tok \n", 1);
    t = daemon_target(Options{});
    CHECK(t.token == "tok");
    Options o;
    o.daemon = "http://a:1";
    o.token = "x";
    t = daemon_target(o);
    CHECK(t.url == "http://a:1");
    CHECK(t.token == "x");
    ::unsetenv("NETREDUCE_DAEMON");
    ::unsetenv("NETREDUCE_TOKEN");
    ::unsetenv("NETREDUCE_TOKEN_FILE");
  }
}
