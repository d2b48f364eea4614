// Connection set-up pieces: the TCP bootstrap (real sockets on localhost)
// and the daemon registration against a stub HTTP server speaking the API
// contract (the real daemon is tested in its own suite).
#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <set>
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
      errs[r] = Bootstrap::create(r, P, addr, "job-1", in_ms(10000), b);
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

namespace {

// The caller's rendezvous of the test: P threads meet at a generation
// counter, each leaving its blob; the last one in publishes the table.
struct Meeting {
  explicit Meeting(unsigned p) : P(p), slots(p) {}
  Error allgather(unsigned r, const std::string& mine, std::vector<std::string>& all) {
    std::unique_lock<std::mutex> lk(mu);
    const uint64_t gen = generation;
    slots[r] = mine;
    if (++arrived == P) {
      table = slots;
      arrived = 0;
      ++generation;
      cv.notify_all();
    } else {
      cv.wait(lk, [&] { return generation != gen; });
    }
    all = table;
    return {};
  }
  const unsigned P;
  std::mutex mu;
  std::condition_variable cv;
  unsigned arrived = 0;
  uint64_t generation = 0;
  std::vector<std::string> slots, table;
};

}  // namespace

TEST_CASE("bootstrap: over a caller's rendezvous", "[hostlib][bootstrap]") {
  const unsigned P = 3;
  Meeting m(P);
  std::vector<std::vector<std::string>> got(P);
  std::vector<std::string> bc(P), ip(P);
  std::vector<Error> errs(P);
  std::vector<std::thread> th;
  for (unsigned r = 0; r < P; ++r)
    th.emplace_back([&, r] {
      Rendezvous rv{[&, r](const std::string& mine, std::vector<std::string>& all,
                           Clock::time_point) { return m.allgather(r, mine, all); },
                    "test"};
      auto b = Bootstrap::over(r, P, rv, "10.0.0." + std::to_string(r + 1));
      ip[r] = b->local_ip();
      errs[r] = b->allgather(std::string(r + 1, char('a' + r)), got[r], in_ms(1000));
      if (!errs[r].ok()) return;
      bc[r] = r == 0 ? "decision" : "ignored";
      errs[r] = b->broadcast(bc[r], in_ms(1000));
    });
  for (auto& t : th) t.join();
  for (unsigned r = 0; r < P; ++r) {
    INFO(errs[r].message);
    REQUIRE(errs[r].ok());
    CHECK(got[r] == std::vector<std::string>{"a", "bb", "ccc"});
    CHECK(bc[r] == "decision");
    CHECK(ip[r] == "10.0.0." + std::to_string(r + 1));
  }

  // A rendezvous that fails, or hands back a table of the wrong shape, is
  // the bootstrap's error, never a short table.
  std::vector<std::string> all;
  Clock::time_point seen{};
  Rendezvous fails{[&seen](const std::string&, std::vector<std::string>&, Clock::time_point d) {
                     seen = d;
                     return Error::make(ErrorCode::transport, "MPI_Allgather: rank 2 is gone");
                   },
                   "test"};
  const Clock::time_point deadline = in_ms(1000);
  Error e = Bootstrap::over(0, 2, fails, "")->allgather("x", all, deadline);
  CHECK(seen == deadline);  // the exchange's own deadline reaches the rendezvous
  CHECK(e.message == "MPI_Allgather: rank 2 is gone");
  Rendezvous short_table{
      [](const std::string& mine, std::vector<std::string>& out, Clock::time_point) {
        out = {mine};
        return Error{};
      },
      "test"};
  e = Bootstrap::over(1, 2, short_table, "")->allgather("x", all, in_ms(1000));
  CHECK(e.code == ErrorCode::bootstrap);
  CHECK(e.message.find("1 blobs for 2 ranks") != std::string::npos);
  Rendezvous not_mine{[](const std::string&, std::vector<std::string>& out, Clock::time_point) {
                        out = {"a", "b"};
                        return Error{};
                      },
                      "test"};
  e = Bootstrap::over(1, 2, not_mine, "")->allgather("x", all, in_ms(1000));
  CHECK(e.code == ErrorCode::bootstrap);
}

TEST_CASE("bootstrap: deadlines name who is missing", "[hostlib][bootstrap]") {
  const std::string addr = "127.0.0.1:" + std::to_string(free_port());
  // Rank 0 of 3 with only rank 1 joining: the error names rank 2.
  Error e0, e1;
  std::thread t0([&] {
    std::unique_ptr<Bootstrap> b;
    e0 = Bootstrap::create(0, 3, addr, "", in_ms(700), b);
  });
  std::thread t1([&] {
    std::unique_ptr<Bootstrap> b;
    e1 = Bootstrap::create(1, 3, addr, "", in_ms(700), b);
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
  const Error e = Bootstrap::create(2, 3, addr, "", in_ms(300), b);
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
  CHECK(Bootstrap::create(0, 2, "bad", "", in_ms(10), b).code == ErrorCode::invalid_argument);
}

namespace {

// A raw TCP client of rank 0's address: connects (retrying until rank 0
// listens), sends `bytes`, and keeps the connection open until closed.
int raw_connect(const std::string& addr, const std::string& bytes) {
  const auto port = static_cast<uint16_t>(std::stoi(addr.substr(addr.rfind(':') + 1)));
  for (int i = 0; i < 200; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    sa.sin_port = htons(port);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0) {
      if (!bytes.empty()) (void)::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
      return fd;
    }
    ::close(fd);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return -1;
}

// Ranks `ranks` of a job of `world` with `key` at `addr`, each in a thread,
// all within `ms`: their errors.
std::vector<Error> run_ranks(const std::string& addr, unsigned world, const std::string& key,
                             const std::vector<unsigned>& ranks, int ms) {
  std::vector<Error> errs(ranks.size());
  std::vector<std::thread> th;
  for (size_t i = 0; i < ranks.size(); ++i)
    th.emplace_back([&, i] {
      std::unique_ptr<Bootstrap> b;
      errs[i] = Bootstrap::create(ranks[i], world, addr, key, in_ms(ms), b);
      if (!errs[i].ok()) return;
      std::vector<std::string> all;
      errs[i] = b->allgather(key, all, in_ms(ms));
      for (const std::string& x : all)  // every rank in the table is of this job
        if (errs[i].ok() && x != key) errs[i] = Error::make(ErrorCode::internal, "mixed: " + x);
    });
  for (auto& t : th) t.join();
  return errs;
}

}  // namespace

TEST_CASE("bootstrap: another job's rank and strangers are refused, not waited for",
          "[hostlib][bootstrap]") {
  const std::string addr = "127.0.0.1:" + std::to_string(free_port());
  SECTION("a leftover rank 1 of another job reaches rank 0 first") {
    // Job B (key "B") starts at the address where job A's rank 1 (key "A")
    // is still retrying: B completes with its own ranks only; A's rank 1
    // hears "another job" and gives up at its deadline saying so.
    Error stale;
    std::thread a([&] { stale = run_ranks(addr, 3, "A", {1}, 1500)[0]; });
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // A's rank 1 is retrying
    const auto t0 = Clock::now();
    std::vector<Error> errs;
    std::thread b0([&] { errs = run_ranks(addr, 3, "B", {0}, 5000); });
    // B's own ranks come later: A's rank 1 meets B's rank 0 alone meanwhile.
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    const std::vector<Error> others = run_ranks(addr, 3, "B", {1, 2}, 5000);
    b0.join();
    a.join();
    errs.insert(errs.end(), others.begin(), others.end());
    for (const Error& e : errs) {
      INFO(e.message);
      CHECK(e.ok());
    }
    CHECK(Clock::now() - t0 < std::chrono::milliseconds(4000));
    INFO(stale.message);
    CHECK(stale.code == ErrorCode::timeout);
    CHECK(stale.message.find("another job") != std::string::npos);
  }
  SECTION("a silent stranger and a talking one do not hold up the job") {
    // Without the side-by-side reads, rank 0 sat on the silent connection
    // until its deadline and named a rank as missing.
    std::vector<Error> errs;
    std::thread job([&] { errs = run_ranks(addr, 3, "", {0}, 4000); });
    const int silent = raw_connect(addr, "");
    const int garbage = raw_connect(addr, std::string(28, 'G'));
    REQUIRE(silent >= 0);
    REQUIRE(garbage >= 0);
    const auto others = run_ranks(addr, 3, "", {1, 2}, 4000);
    job.join();
    for (const Error& e : errs) {
      INFO(e.message);
      CHECK(e.ok());
    }
    for (const Error& e : others) {
      INFO(e.message);
      CHECK(e.ok());
    }
    ::close(silent);
    ::close(garbage);
  }
  SECTION("refusals are counted in the timeout that follows") {
    std::vector<Error> errs;
    std::thread job([&] { errs = run_ranks(addr, 2, "B", {0}, 800); });
    const int garbage = raw_connect(addr, std::string(28, 'G'));
    job.join();
    INFO(errs[0].message);
    CHECK(errs[0].code == ErrorCode::timeout);
    CHECK(errs[0].message.find("ranks 1 did not connect in time (1 connection(s) refused, the "
                               "last 127.0.0.1:") != std::string::npos);
    CHECK(errs[0].message.find("not a netreduce hello") != std::string::npos);
    ::close(garbage);
  }
  SECTION("the same rank claimed twice fails, naming both") {
    const auto errs = run_ranks(addr, 3, "B", {0, 1, 1}, 2000);
    INFO(errs[0].message);
    CHECK(errs[0].code == ErrorCode::bootstrap);
    CHECK(errs[0].message.find("rank 1 claimed twice, by 127.0.0.1:") != std::string::npos);
    CHECK(errs[0].message.find(" and by 127.0.0.1:") != std::string::npos);
  }
}

namespace {

// A fake daemon speaking the API contract of src/control (docs/api.md#the-routes), with
// a ring table of its own: POST of a new id 201 with a credential, of a held
// id 409; GET installed (or not); PUT .../lease and DELETE only with the
// ring's credential (403 otherwise, 404 when absent).
// Every request is recorded, in order, with its credential header.
struct FakeDaemon {
  struct Call {
    std::string method, path, credential, auth, body;
  };
  struct Ring {
    std::string credential;
    uint32_t lease_ms = 0;
  };
  httplib::Server srv;
  std::thread th;
  int port = 0;
  bool installed = true;  // what GET reports
  int post_status = 0;    // non-zero: POST answers this, with an error body
  int busy_posts = 0;     // the first N POSTs answer 503 busy with Retry-After
  int workers = 2;        // GET /v1/status: dataplane.workers entries; < 0: data plane down
  // GET /v1/status: dataplane.capabilities and retire_grace_ms, as the real
  // data plane reports them (src/dataplane/control_api.cc, status).
  nlohmann::json capabilities = nlohmann::json::array({"result_digest"});
  nlohmann::json retire_grace_ms = 60000;
  nlohmann::json fabric;  // GET /v1/status: "fabric" unless null (as a fabric's daemon writes it)
  std::set<uint32_t> taken;  // ids held by "other jobs": POST -> 409
  std::map<uint32_t, Ring> rings;
  std::vector<Call> calls;
  unsigned next_cred = 1;
  std::mutex mu;

  static uint32_t id_of(const httplib::Request& req) {
    return static_cast<uint32_t>(std::stoul(req.matches[1].str()));
  }
  void record(const httplib::Request& req) {
    calls.push_back({req.method, req.path, req.get_header_value("X-Netreduce-Ring-Credential"),
                     req.get_header_value("Authorization"), req.body});
  }
  static void error(httplib::Response& res, int status, const std::string& code,
                    const std::string& field, const std::string& msg) {
    res.status = status;
    res.set_content(
        nlohmann::json{{"error", {{"code", code}, {"field", field}, {"message", msg}}}}.dump(),
        "application/json");
  }
  // The owner check of the real daemon: the credential must match.
  bool owner(const httplib::Request& req, httplib::Response& res, uint32_t id) {
    auto it = rings.find(id);
    if (it == rings.end()) {
      error(res, 404, "not_found", "id", "no ring " + std::to_string(id));
      return false;
    }
    if (req.get_header_value("X-Netreduce-Ring-Credential") != it->second.credential) {
      error(res, 403, "forbidden", "X-Netreduce-Ring-Credential", "wrong credential");
      return false;
    }
    return true;
  }

  FakeDaemon() {
    srv.Post("/v1/rings", [this](const httplib::Request& req, httplib::Response& res) {
      std::lock_guard lk(mu);
      record(req);
      auto j = nlohmann::json::parse(req.body);
      const uint32_t lease = j.value("lease_ms", 0u);
      j.erase("lease_ms");
      engine::RingSpec spec;
      if (!ring_from_json(j, spec).ok())  // no Catch2 macros off the test's thread
        return error(res, 400, "invalid_argument", "", "bad ring");
      if (busy_posts > 0) {
        --busy_posts;
        res.set_header("Retry-After", "1");
        return error(res, 503, "busy", "listen.dataplane_concurrency", "data plane calls busy");
      }
      if (post_status)
        return error(res, post_status, "quota", "quotas.max_rings", "the daemon is full");
      if (taken.count(spec.ring_id) || rings.count(spec.ring_id))
        return error(res, 409, "conflict", "id",
                     "ring " + std::to_string(spec.ring_id) + " is registered by another job");
      char cred[33];
      std::snprintf(cred, sizeof cred, "%032x", next_cred++);
      rings[spec.ring_id] = {cred, lease};
      nlohmann::json r = ring_to_json(spec);
      r["credential"] = cred;
      r["installed"] = installed;
      res.status = 201;
      res.set_content(nlohmann::json{{"ring", r}}.dump(), "application/json");
    });
    srv.Get("/v1/status", [this](const httplib::Request& req, httplib::Response& res) {
      std::lock_guard lk(mu);
      record(req);
      nlohmann::json dp = {{"connected", workers >= 0}};
      if (workers < 0) dp["error"] = "data plane control socket: connection refused";
      if (workers >= 0) {
        dp["capabilities"] = capabilities;
        dp["retire_grace_ms"] = retire_grace_ms;
        dp["workers"] = nlohmann::json::array();
        for (int w = 0; w < workers; ++w)
          dp["workers"].push_back({{"worker", w}, {"lcore", w + 1}});
      }
      nlohmann::json st{{"dataplane", dp}, {"rings", rings.size()}};
      if (!fabric.is_null()) st["fabric"] = fabric;
      res.set_content(st.dump(), "application/json");
    });
    srv.Get(R"(/v1/rings/(\d+))", [this](const httplib::Request& req, httplib::Response& res) {
      std::lock_guard lk(mu);
      record(req);
      if (!rings.count(id_of(req))) return error(res, 404, "not_found", "id", "no ring");
      res.set_content(nlohmann::json{{"id", id_of(req)}, {"installed", installed}}.dump(),
                      "application/json");
    });
    srv.Put(R"(/v1/rings/(\d+)/lease)",
            [this](const httplib::Request& req, httplib::Response& res) {
              std::lock_guard lk(mu);
              record(req);
              if (!owner(req, res, id_of(req))) return;
              res.set_content(nlohmann::json{{"id", id_of(req)}}.dump(), "application/json");
            });
    srv.Delete(R"(/v1/rings/(\d+))", [this](const httplib::Request& req, httplib::Response& res) {
      std::lock_guard lk(mu);
      record(req);
      if (!owner(req, res, id_of(req))) return;
      rings.erase(id_of(req));
      res.status = 204;
    });
    port = srv.bind_to_any_port("127.0.0.1");
    th = std::thread([this] { srv.listen_after_bind(); });
    while (!srv.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ~FakeDaemon() {
    srv.stop();
    th.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port); }
  std::vector<std::string> methods() {
    std::lock_guard lk(mu);
    std::vector<std::string> m;
    for (const Call& c : calls) m.push_back(c.method);
    return m;
  }
  std::vector<Call> calls_of(const std::string& method) {
    std::lock_guard lk(mu);
    std::vector<Call> out;
    for (const Call& c : calls)
      if (c.method == method) out.push_back(c);
    return out;
  }
};

Options opts_for(const FakeDaemon& d, uint32_t lease_ms = 0) {
  Options o;
  o.daemon = d.url();
  o.token = "s3cret";
  o.lease_ms = lease_ms;
  o.daemon_timeout_ms = 2000;
  return o;
}

}  // namespace

TEST_CASE("daemon: registration decides the path and says why", "[hostlib][daemon]") {
  SECTION("installed: ina path; the body is the ring JSON with the lease, bearer token") {
    FakeDaemon d;
    const Registration r = register_ring({d.url(), "s3cret", ""}, spec3(), 2000, 30000);
    INFO(r.reason);
    CHECK(r.installed);
    CHECK(r.ring_id == 42);
    CHECK(r.credential == "00000000000000000000000000000001");
    auto posts = d.calls_of("POST");
    REQUIRE(posts.size() == 1);
    CHECK(posts[0].auth == "Bearer s3cret");
    auto body = nlohmann::json::parse(posts[0].body);
    CHECK(body["lease_ms"] == 30000);
    body.erase("lease_ms");
    engine::RingSpec back;
    REQUIRE(ring_from_json(body, back).ok());
    CHECK(back.ring_id == 42);
    CHECK(back.members == spec3().members);
    CHECK(back.msg_len == 4);
    CHECK(back.window == 8);
    CHECK(back.payload_bytes == 1024);
    CHECK(back.allows_dtype(static_cast<uint8_t>(DataType::bf16)));
    CHECK(back.allows_op(static_cast<uint8_t>(Op::max)));
  }
  SECTION("503 busy with Retry-After is retried within the deadline, not taken as a refusal") {
    // The daemon answers `busy` before acting on a request when its data
    // plane calls are all taken; the ring path would be a needless fallback.
    FakeDaemon d;
    d.busy_posts = 2;
    const Registration r = register_ring({d.url(), "s3cret", ""}, spec3(), 2000, 30000);
    INFO(r.reason);
    CHECK(r.installed);
    CHECK(r.ring_id == 42);
    CHECK(d.calls_of("POST").size() == 3);
  }
  SECTION("503 busy until the deadline: ring path, saying busy") {
    FakeDaemon d;
    d.busy_posts = 1000;
    const Registration r = register_ring({d.url(), "s3cret", ""}, spec3(), 800, 30000);
    CHECK(!r.installed);
    CHECK(r.reason.find("HTTP 503 busy") != std::string::npos);
  }
  SECTION("no DELETE before the POST: a ring held by someone else is never removed") {
    // The finding: rank 0 deleted the id it derived before POSTing, which
    // removed a running job's ring that had the same id.
    FakeDaemon d;
    d.taken = {42};
    const Registration r = register_ring({d.url(), "s3cret", ""}, spec3(), 2000);
    CHECK(!r.installed);
    CHECK(d.calls_of("DELETE").empty());
    CHECK(d.methods() == std::vector<std::string>{"POST"});
  }
  SECTION("an explicit id another job holds: ring path with the daemon's reason") {
    FakeDaemon d;
    d.taken = {42};
    const Registration r = register_ring({d.url(), "", ""}, spec3(), 2000);
    CHECK(!r.installed);
    CHECK(r.reason.find("refused ring 42") != std::string::npos);
    CHECK(r.reason.find("HTTP 409 conflict (id): ring 42 is registered by another job") !=
          std::string::npos);
  }
  SECTION("a derived id another job holds: fresh ids, up to 3") {
    FakeDaemon d;
    d.taken = {42, 43};
    uint32_t next = 43;
    Registration r = register_ring({d.url(), "", ""}, spec3(), 2000, 0, [&] { return next++; });
    INFO(r.reason);
    CHECK(r.installed);
    CHECK(r.ring_id == 44);
    CHECK(r.reason.find("ring 44 installed") != std::string::npos);
    CHECK(r.reason.find("derived ids 42, 43 were registered by other jobs") != std::string::npos);
    CHECK(d.methods() == std::vector<std::string>{"POST", "POST", "POST", "GET"});
    // All three taken: the ring path, saying so; never a fourth try.
    FakeDaemon e;
    e.taken = {42, 43, 44, 45};
    next = 43;
    r = register_ring({e.url(), "", ""}, spec3(), 2000, 0, [&] { return next++; });
    CHECK(!r.installed);
    CHECK(r.reason.find("refused ring 44: HTTP 409") != std::string::npos);
    CHECK(r.reason.find("derived ids 42, 43 were also taken; 3 tried") != std::string::npos);
    CHECK(e.calls_of("POST").size() == 3);
  }
  SECTION("a 409 about something other than the id (e.g. placement): no fresh-id retry") {
    FakeDaemon d;
    d.post_status = 409;  // field quotas.max_rings: not an id collision
    uint32_t next = 43;
    const Registration r =
        register_ring({d.url(), "", ""}, spec3(), 2000, 0, [&] { return next++; });
    CHECK(!r.installed);
    CHECK(d.calls_of("POST").size() == 1);
    CHECK(r.reason.find("were also taken") == std::string::npos);
  }
  SECTION("refused for another reason: no retry, ring path with the daemon's error") {
    FakeDaemon d;
    d.post_status = 422;
    uint32_t next = 43;
    const Registration r =
        register_ring({d.url(), "", ""}, spec3(), 2000, 0, [&] { return next++; });
    CHECK(!r.installed);
    CHECK(r.reason.find("HTTP 422 quota (quotas.max_rings)") != std::string::npos);
    CHECK(d.calls_of("POST").size() == 1);
  }
  SECTION("accepted but never installed: ring path within the deadline, and our ring deleted") {
    FakeDaemon d;
    d.installed = false;
    const Registration r = register_ring({d.url(), "", ""}, spec3(), 400);
    CHECK(!r.installed);
    CHECK(r.reason.find("did not install it") != std::string::npos);
    const auto dels = d.calls_of("DELETE");
    REQUIRE(dels.size() == 1);
    CHECK(dels[0].path == "/v1/rings/42");
    CHECK(dels[0].credential == "00000000000000000000000000000001");
    std::lock_guard lk(d.mu);
    CHECK(d.rings.empty());
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

// A daemon that accepts every connection, reads the request and answers
// one byte every 100 ms (a status line promising a long body): a per-read
// timeout never fires against it, only a deadline on the whole call does.
struct DrippingDaemon {
  int lfd = -1;
  int port = 0;
  std::atomic<bool> stop{false};
  std::thread th;
  std::vector<std::thread> conns;

  DrippingDaemon() {
    lfd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(lfd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0);
    REQUIRE(::listen(lfd, 16) == 0);
    socklen_t len = sizeof sa;
    REQUIRE(::getsockname(lfd, reinterpret_cast<sockaddr*>(&sa), &len) == 0);
    port = ntohs(sa.sin_port);
    th = std::thread([this] {
      while (!stop) {
        pollfd p{lfd, POLLIN, 0};
        if (::poll(&p, 1, 50) <= 0) continue;
        const int fd = ::accept(lfd, nullptr, nullptr);
        if (fd >= 0) conns.emplace_back([this, fd] { drip(fd); });
      }
    });
  }
  void drip(int fd) {
    char buf[4096];
    (void)::recv(fd, buf, sizeof buf, 0);  // the request (small: one read)
    const std::string head = "HTTP/1.1 201 Created\r\nContent-Length: 100000\r\n\r\n";
    for (size_t i = 0; i < head.size() + 100000 && !stop; ++i) {
      const char c = i < head.size() ? head[i] : ' ';
      if (::send(fd, &c, 1, MSG_NOSIGNAL) != 1) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    ::close(fd);
  }
  ~DrippingDaemon() {
    stop = true;
    th.join();
    for (auto& t : conns) t.join();
    ::close(lfd);
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port); }
};

TEST_CASE("daemon: a daemon answering a byte at a time costs each call its timeout, no more",
          "[hostlib][daemon]") {
  // Per call: the registration (whole, however many requests it makes),
  // the status query, the lease renewal and the DELETE at release. With a
  // per-read timeout each of these waited for the whole drip (minutes).
  DrippingDaemon d;
  const DaemonTarget target{d.url(), "s3cret", ""};
  auto took_ms = [](auto&& f) {
    const auto t0 = Clock::now();
    f();
    return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
  };
  Registration r;
  auto ms = took_ms([&] { r = register_ring(target, spec3(), 800, 30000); });
  CHECK_FALSE(r.installed);
  CHECK(r.reason.find("timed out") != std::string::npos);
  CHECK(ms < 800 + 1500);
  std::string why;
  ms = took_ms([&] { CHECK(box_outline(target, 800, why).workers == 0); });
  CHECK(why.find("timed out") != std::string::npos);
  CHECK(ms < 800 + 1500);
  // Renewals every 100 ms (lease 300 ms), each stuck in the drip; release
  // joins the renewal thread, then deletes.
  std::string outcome;
  ms = took_ms([&] {
    OwnedRing owned(target, 42, std::string(32, 'c'), 300, 800);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    outcome = owned.release();
  });
  CHECK(outcome.find("not deleted") != std::string::npos);
  CHECK(outcome.find("timed out") != std::string::npos);
  CHECK(ms < 300 + 800 + 800 + 1500);
}

TEST_CASE("daemon: derived ids differ per run, same inputs", "[hostlib][daemon]") {
  const std::vector<uint32_t> m = spec3().members;
  CHECK(derive_ring_id("10.0.0.1:29500", m, 1) == derive_ring_id("10.0.0.1:29500", m, 1));
  std::set<uint32_t> ids;
  for (int i = 0; i < 1000; ++i) {
    const uint32_t id = derive_ring_id("10.0.0.1:29500", m, random_nonce());
    CHECK(id >= 1);
    CHECK(id <= 0x7FFFFFFFu);
    ids.insert(id);
  }
  CHECK(ids.size() >= 999);  // a collision among 1000 of 2^31 ids: p ~ 2e-4
}

TEST_CASE("daemon: rank 0's ring lifecycle against a fake daemon", "[hostlib][daemon]") {
  const std::string boot = "10.0.0.1:29500";
  SECTION("two communicators of one job at once: distinct ids, each deleted at its close") {
    FakeDaemon d;
    std::unique_ptr<OwnedRing> a, b;
    const Registration ra = setup_ring(opts_for(d), boot, spec3(), a);
    const Registration rb = setup_ring(opts_for(d), boot, spec3(), b);
    INFO(ra.reason << " / " << rb.reason);
    REQUIRE(ra.installed);
    REQUIRE(rb.installed);
    CHECK(ra.ring_id != rb.ring_id);
    CHECK(ra.ring_id != 42);  // spec3's id is replaced by a derived one
    REQUIRE(a);
    REQUIRE(b);
    CHECK(d.calls_of("DELETE").empty());  // nothing deleted while they live
    CHECK(a->release() == "deleted");
    {
      std::lock_guard lk(d.mu);
      CHECK(d.rings.count(ra.ring_id) == 0);
      CHECK(d.rings.count(rb.ring_id) == 1);  // the other communicator's ring is untouched
    }
    b.reset();  // the destructor releases too
    const auto dels = d.calls_of("DELETE");
    REQUIRE(dels.size() == 2);
    CHECK(dels[0].path == "/v1/rings/" + std::to_string(ra.ring_id));
    CHECK(dels[0].credential == ra.credential);
    CHECK(dels[1].path == "/v1/rings/" + std::to_string(rb.ring_id));
    CHECK(dels[1].credential == rb.credential);
    CHECK(dels[0].auth == "Bearer s3cret");
    CHECK(a->released() == "deleted");
    std::lock_guard lk(d.mu);
    CHECK(d.rings.empty());
  }
  SECTION("a relaunch never meets its own leftover: a fresh id, the leftover untouched") {
    FakeDaemon d;
    std::unique_ptr<OwnedRing> first, second;
    Options o = opts_for(d);
    o.delete_ring_at_close = false;  // the first run dies without deleting
    const Registration r1 = setup_ring(o, boot, spec3(), first);
    REQUIRE(r1.installed);
    CHECK(first->release() == "kept");
    const Registration r2 = setup_ring(opts_for(d), boot, spec3(), second);
    INFO(r2.reason);
    REQUIRE(r2.installed);
    CHECK(r2.ring_id != r1.ring_id);
    CHECK(d.calls_of("DELETE").empty());
    std::lock_guard lk(d.mu);
    CHECK(d.rings.count(r1.ring_id) == 1);
  }
  SECTION("an explicit Options::ring_id another job holds: the ring path, with the reason") {
    FakeDaemon d;
    d.taken = {7};
    Options o = opts_for(d);
    o.ring_id = 7;
    std::unique_ptr<OwnedRing> owned;
    const Registration r = setup_ring(o, boot, spec3(), owned);
    CHECK(!r.installed);
    CHECK(!owned);
    CHECK(r.ring_id == 7);
    CHECK(r.reason.find("refused ring 7: HTTP 409 conflict (id): ring 7 is registered by another "
                        "job") != std::string::npos);
    CHECK(d.calls_of("POST").size() == 1);  // an explicit id is never replaced
    CHECK(d.calls_of("DELETE").empty());
  }
  SECTION("the lease is renewed every lease/3 with the credential, and stops at close") {
    FakeDaemon d;
    std::unique_ptr<OwnedRing> owned;
    const Registration r = setup_ring(opts_for(d, 1200), boot, spec3(), owned);
    REQUIRE(r.installed);
    CHECK(nlohmann::json::parse(d.calls_of("POST").at(0).body)["lease_ms"] == 1200);
    // Renewals every 400 ms: wait (generously) for three.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (owned->renewals() < 3 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    CHECK(owned->renewals() >= 3);
    owned.reset();
    const auto puts = d.calls_of("PUT");
    REQUIRE(puts.size() >= 3);
    for (const auto& p : puts) {
      CHECK(p.path == "/v1/rings/" + std::to_string(r.ring_id) + "/lease");
      CHECK(p.credential == r.credential);
      CHECK(p.auth == "Bearer s3cret");
    }
    // Nothing after the DELETE: the renewal thread stopped before it.
    const auto m = d.methods();
    CHECK(m.back() == "DELETE");
    std::this_thread::sleep_for(std::chrono::milliseconds(600));
    CHECK(d.methods().size() == m.size());
  }
  SECTION("renewal failures never block and are kept quiet; release says why") {
    FakeDaemon d;
    std::unique_ptr<OwnedRing> owned;
    const Registration r = setup_ring(opts_for(d, 1000), boot, spec3(), owned);
    REQUIRE(r.installed);
    {
      std::lock_guard lk(d.mu);
      d.rings.clear();  // an operator removed it: renewals get 404
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(800));
    CHECK(owned->renewals() == 0);
    CHECK(owned->release() == "deleted");  // 404 at close: already gone, fine
  }
  SECTION("no lease: no renewals; still deleted at close") {
    FakeDaemon d;
    std::unique_ptr<OwnedRing> owned;
    const Registration r = setup_ring(opts_for(d, 0), boot, spec3(), owned);
    REQUIRE(r.installed);
    CHECK_FALSE(nlohmann::json::parse(d.calls_of("POST").at(0).body).contains("lease_ms"));
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    owned.reset();
    CHECK(d.methods() == std::vector<std::string>{"POST", "GET", "DELETE"});
  }
}

TEST_CASE("daemon: striped rings are registered all or nothing", "[hostlib][daemon][stripe]") {
  const std::string boot = "10.0.0.1:29500";
  SECTION("derived ids: one fresh id per ring, each owned and deleted with its credential") {
    FakeDaemon d;
    std::vector<std::unique_ptr<OwnedRing>> owned;
    const Registration r = setup_rings(opts_for(d), boot, spec3(), 3, owned);
    INFO(r.reason);
    REQUIRE(r.installed);
    REQUIRE(r.ring_ids.size() == 3);
    CHECK(std::set<uint32_t>(r.ring_ids.begin(), r.ring_ids.end()).size() == 3);
    CHECK(r.ring_id == r.ring_ids[0]);
    CHECK(r.reason.find("3 rings (ids ") == 0);
    REQUIRE(owned.size() == 3);
    for (unsigned g = 0; g < 3; ++g) CHECK(owned[g]->ring_id() == r.ring_ids[g]);
    const auto posts = d.calls_of("POST");
    REQUIRE(posts.size() == 3);
    for (unsigned g = 0; g < 3; ++g) {
      engine::RingSpec back;
      auto body = nlohmann::json::parse(posts[g].body);
      body.erase("lease_ms");
      REQUIRE(ring_from_json(body, back).ok());
      CHECK(back.ring_id == r.ring_ids[g]);
      CHECK(back.members == spec3().members);  // the same ranks on every ring
    }
    owned.clear();
    const auto dels = d.calls_of("DELETE");
    REQUIRE(dels.size() == 3);
    std::lock_guard lk(d.mu);
    CHECK(d.rings.empty());
  }
  SECTION("an explicit ring_id: ring i registers ring_id + i") {
    FakeDaemon d;
    Options o = opts_for(d);
    o.ring_id = 100;
    std::vector<std::unique_ptr<OwnedRing>> owned;
    const Registration r = setup_rings(o, boot, spec3(), 3, owned);
    INFO(r.reason);
    REQUIRE(r.installed);
    CHECK(r.ring_ids == std::vector<uint32_t>{100, 101, 102});
  }
  SECTION("one ring refused: the ones before it are deleted, the reason names it") {
    FakeDaemon d;
    d.taken = {101};
    Options o = opts_for(d);
    o.ring_id = 100;
    // Also when rings are normally left to their lease at close: a rolled
    // back ring is never used, so it is deleted all the same.
    o.delete_ring_at_close = GENERATE(true, false);
    std::vector<std::unique_ptr<OwnedRing>> owned;
    const Registration r = setup_rings(o, boot, spec3(), 3, owned);
    CHECK(!r.installed);
    CHECK(owned.empty());
    CHECK(r.reason.find("ring 1 of 3 (id 101): daemon at ") == 0);
    CHECK(r.reason.find("HTTP 409 conflict (id)") != std::string::npos);
    CHECK(d.calls_of("POST").size() == 2);  // ring 2 never tried
    const auto dels = d.calls_of("DELETE");
    REQUIRE(dels.size() == 1);
    CHECK(dels[0].path == "/v1/rings/100");
    std::lock_guard lk(d.mu);
    CHECK(d.rings.empty());
  }
  SECTION("one ring is setup_ring exactly") {
    FakeDaemon d;
    std::vector<std::unique_ptr<OwnedRing>> owned;
    const Registration r = setup_rings(opts_for(d), boot, spec3(), 1, owned);
    REQUIRE(r.installed);
    CHECK(r.reason.find("ring " + std::to_string(r.ring_id) + " installed by the daemon") == 0);
    CHECK(r.ring_ids == std::vector<uint32_t>{r.ring_id});
    CHECK(owned.size() == 1);
    CHECK(d.methods() == std::vector<std::string>{"POST", "GET"});
  }
}

TEST_CASE("daemon: a job with local ranks registers n x R rings in one call",
          "[hostlib][daemon][stripe][local]") {
  const std::string boot = "10.0.0.1:29500";
  // Ring l: local rank l of every host. Two hosts' NICs each carry two
  // local ranks here with their own addresses, so the specs differ.
  std::vector<engine::RingSpec> specs(2, spec3());
  specs[0].members = {0x0A000001, 0x0A000002};
  specs[1].members = {0x0A000011, 0x0A000012};
  SECTION("explicit ring_id: ring l R + s gets ring_id + l R + s, with ring l's members") {
    FakeDaemon d;
    Options o = opts_for(d);
    o.ring_id = 100;
    std::vector<std::unique_ptr<OwnedRing>> owned;
    const Registration r = setup_rings(o, boot, specs, 2, owned);
    INFO(r.reason);
    REQUIRE(r.installed);
    CHECK(r.ring_ids == std::vector<uint32_t>{100, 101, 102, 103});
    CHECK(r.reason.find("4 rings (ids 100, 101, 102, 103) installed") == 0);
    CHECK(r.reason.find("(2 local rings x 2 stripes)") != std::string::npos);
    REQUIRE(owned.size() == 4);
    const auto posts = d.calls_of("POST");
    REQUIRE(posts.size() == 4);
    for (unsigned g = 0; g < 4; ++g) {
      engine::RingSpec back;
      auto body = nlohmann::json::parse(posts[g].body);
      body.erase("lease_ms");
      REQUIRE(ring_from_json(body, back).ok());
      CHECK(back.ring_id == 100 + g);
      CHECK(back.members == specs[g / 2].members);
    }
    owned.clear();
    CHECK(d.calls_of("DELETE").size() == 4);
  }
  SECTION("a refusal names the local rank's ring and the stripe; nothing stays") {
    FakeDaemon d;
    d.taken = {103};
    Options o = opts_for(d);
    o.ring_id = 100;
    std::vector<std::unique_ptr<OwnedRing>> owned;
    const Registration r = setup_rings(o, boot, specs, 2, owned);
    CHECK(!r.installed);
    CHECK(owned.empty());
    CHECK(r.reason.find("ring 3 of 4 (local rank 1's ring, stripe 1, id 103): daemon at ") == 0);
    CHECK(d.calls_of("DELETE").size() == 3);
    std::lock_guard lk(d.mu);
    CHECK(d.rings.empty());
  }
  SECTION("one spec per ring: each ring's own qpns reach the daemon (placement by connection)") {
    FakeDaemon d;
    Options o = opts_for(d);
    o.ring_id = 100;
    std::vector<engine::RingSpec> per_ring;
    for (unsigned g = 0; g < 4; ++g) {
      per_ring.push_back(specs[g / 2]);
      per_ring.back().qpns = {0x100 + g, 0x200 + g};
    }
    std::vector<std::unique_ptr<OwnedRing>> owned;
    const Registration r = setup_job_rings(o, boot, per_ring, 2, owned);
    INFO(r.reason);
    REQUIRE(r.installed);
    CHECK(r.reason.find("(2 local rings x 2 stripes)") != std::string::npos);
    const auto posts = d.calls_of("POST");
    REQUIRE(posts.size() == 4);
    for (unsigned g = 0; g < 4; ++g) {
      const auto body = nlohmann::json::parse(posts[g].body);
      CHECK(body.at("qpns") == nlohmann::json{0x100 + g, 0x200 + g});
      CHECK(body.at("id") == 100 + g);
    }
  }
  SECTION("one spec is the striped registration exactly") {
    FakeDaemon d;
    Options o = opts_for(d);
    o.ring_id = 100;
    std::vector<std::unique_ptr<OwnedRing>> owned;
    const Registration r = setup_rings(o, boot, std::vector<engine::RingSpec>{spec3()}, 3, owned);
    CHECK(r.ring_ids == std::vector<uint32_t>{100, 101, 102});
    CHECK(r.reason.find("local") == std::string::npos);
  }
}

TEST_CASE("daemon: the box's worker count for rings 0", "[hostlib][daemon][stripe]") {
  FakeDaemon d;
  std::string why;
  d.workers = 3;
  CHECK(box_outline({d.url(), "s3cret", ""}, 2000, why).workers == 3);
  d.workers = 12;  // the caller clamps to kMaxRings
  CHECK(box_outline({d.url(), "", ""}, 2000, why).workers == 12);
  d.workers = -1;
  CHECK(box_outline({d.url(), "", ""}, 2000, why).workers == 0);
  CHECK(why.find("reports no data plane workers") != std::string::npos);
  CHECK(box_outline({"", "", ""}, 2000, why).workers == 0);
  CHECK(why.find("NETREDUCE_DAEMON unset") != std::string::npos);
  const std::string url = "http://127.0.0.1:" + std::to_string(free_port());
  CHECK(box_outline({url, "", ""}, 500, why).workers == 0);
  CHECK(why.find("no answer") != std::string::npos);
}

TEST_CASE("daemon: the fabric's racks from the box's status", "[hostlib][daemon][order]") {
  FakeDaemon d;
  std::string why;
  const DaemonTarget t{d.url(), "", ""};
  CHECK(box_outline(t, 2000, why).racks.empty());  // no fabric
  d.fabric = {{"self", "leaf1"},
              {"racks",
               {{{"leaf", "leaf0"}, {"workers", {"10.0.1.0/24", "192.168.7.9/32"}}},
                {{"leaf", "leaf1"}, {"workers", {"10.0.2.0/24"}}}}}};
  BoxOutline box = box_outline(t, 2000, why);
  CHECK(box.workers == 2);
  REQUIRE(box.racks.size() == 2);
  CHECK(box.racks[0] == FabricRack{"leaf0", {{0x0A000100, 24}, {0xC0A80709, 32}}});
  CHECK(box.racks[1] == FabricRack{"leaf1", {{0x0A000200, 24}}});
  CHECK(fabric_rack_of(0x0A000105, box.racks) == "leaf0");
  CHECK(fabric_rack_of(0xC0A80709, box.racks) == "leaf0");
  CHECK(fabric_rack_of(0x0A0002FE, box.racks) == "leaf1");
  CHECK(fabric_rack_of(0x0A000305, box.racks).empty());
  // A fabric the library cannot read orders nothing; the workers still count.
  d.fabric["racks"][1]["workers"][0] = "10.0.2.1/24";
  box = box_outline(t, 2000, why);
  CHECK(box.workers == 2);
  CHECK(box.racks.empty());
  d.fabric["racks"] = "leaf0";
  CHECK(box_outline(t, 2000, why).racks.empty());
}

TEST_CASE("daemon: a box that cannot carry the INA path is refused with why",
          "[hostlib][daemon][seal]") {
  FakeDaemon d;
  const DaemonTarget t{d.url(), "", ""};
  CHECK(box_unfit(t, 2000, 14) == "");
  // 7 x 4.096 us x 2^20 = 30,064 ms: under the default 60 s grace.
  CHECK(box_unfit(t, 2000, 20) == "");
  // 2^23: 240,518 ms, more than the box keeps a removed ring's connections.
  std::string why = box_unfit(t, 2000, 23);
  CHECK(why.find("after 60000 ms (rings.retire_grace_ms), sooner than this job's RC "
                 "retransmission budget of 240518 ms (7 x 4.096 us x 2^23, qp_timeout)") !=
        std::string::npos);
  d.retire_grace_ms = 0;  // resends of an ended job could enter a new ring
  CHECK(box_unfit(t, 2000, 14).find("after 0 ms") != std::string::npos);
  d.retire_grace_ms = "60000";
  CHECK(box_unfit(t, 2000, 14).find("after ? ms") != std::string::npos);
  d.retire_grace_ms = 60000;
  for (const auto& caps : {nlohmann::json::array(), nlohmann::json::array({"other"}),
                           nlohmann::json("result_digest"), nlohmann::json()}) {
    d.capabilities = caps;
    INFO(caps.dump());
    CHECK(box_unfit(t, 2000, 14).find("does not seal its results") != std::string::npos);
  }
  d.capabilities = nlohmann::json::array({"x", "result_digest"});
  CHECK(box_unfit(t, 2000, 14) == "");
  d.workers = -1;
  CHECK(box_unfit(t, 2000, 14).find("has no data plane connected (data plane control socket") !=
        std::string::npos);
  CHECK(box_unfit({"", "", ""}, 2000, 14).find("NETREDUCE_DAEMON unset") != std::string::npos);
}
