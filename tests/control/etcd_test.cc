// The etcd client (control/etcd.h) against real etcd processes this test
// starts itself (/usr/bin/etcd on free loopback ports, a temporary data
// directory), and HttpClient's cancel flag and streams (common/
// http_client.h) against small fake servers. Golden facts come from etcd
// itself: what the client wrote is read back with etcdctl (a gRPC client,
// not the JSON gateway), and what the client must read or watch is written
// with etcdctl. Timing bounds are loose: this runs on slow machines and
// under ASan.
#include "control/etcd.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/http_client.h"

using namespace netreduce;
using namespace netreduce::control;
using nlohmann::json;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

namespace {

constexpr const char* kEtcd = "/usr/bin/etcd";
constexpr const char* kEtcdctl = "/usr/bin/etcdctl";

int64_t ms_since(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t).count();
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// A loopback port nothing listens on (bound, then released).
int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  REQUIRE(getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  close(fd);
  return ntohs(a.sin_port);
}

std::string loopback_url(int port) { return "http://127.0.0.1:" + std::to_string(port); }

// execv's arguments (pointing into `argv`), made before fork(): the child
// of a threaded program may only make async-signal-safe calls.
std::vector<char*> exec_args(const std::vector<std::string>& argv) {
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  return args;
}

// Runs `argv` with `input` on its stdin; its stdout and stderr together.
int run(const std::vector<std::string>& argv, const std::string& input, std::string& output) {
  int in[2], out[2];
  if (pipe(in) != 0 || pipe(out) != 0) return -1;
  std::vector<char*> args = exec_args(argv);
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(in[0], 0);
    dup2(out[1], 1);
    dup2(out[1], 2);
    close(in[0]);
    close(in[1]);
    close(out[0]);
    close(out[1]);
    execv(args[0], args.data());
    _exit(127);
  }
  close(in[0]);
  close(out[1]);
  if (!input.empty() && write(in[1], input.data(), input.size()) < 0) output = "write failed; ";
  close(in[1]);
  char buf[4096];
  for (ssize_t n; (n = read(out[0], buf, sizeof buf)) > 0;)
    output.append(buf, static_cast<size_t>(n));
  close(out[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// Go's %q quoting undone (etcdctl's "fields" output): \xNN and the short escapes.
std::string go_unquote(const std::string& q) {
  REQUIRE(q.size() >= 2);
  REQUIRE(q.front() == '"');
  REQUIRE(q.back() == '"');
  std::string out;
  for (size_t i = 1; i + 1 < q.size(); ++i) {
    if (q[i] != '\\') {
      out += q[i];
      continue;
    }
    const char e = q[++i];
    switch (e) {
      case 'x':
        out += static_cast<char>(std::stoi(q.substr(i + 1, 2), nullptr, 16));
        i += 2;
        break;
      case 'n':
        out += '\n';
        break;
      case 't':
        out += '\t';
        break;
      case 'r':
        out += '\r';
        break;
      case '\\':
      case '"':
        out += e;
        break;
      default:
        FAIL("etcdctl quoted a value with \\" << e << ": " << q);
    }
  }
  return out;
}

std::string hex(int64_t id) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%llx", static_cast<unsigned long long>(id));
  return buf;
}

// One etcd member on free loopback ports, with a data directory of its own;
// killed and reaped, its directory removed, when the test program ends.
class EtcdServer {
 public:
  EtcdServer() {
    if (access(kEtcd, X_OK) != 0 || access(kEtcdctl, X_OK) != 0)
      FAIL(kEtcd << " or " << kEtcdctl << " is missing: this test needs etcd 3.4 "
                 << "(Debian packages etcd-server and etcd-client; scripts/install-deps.sh test)");
    dir_ = (std::filesystem::temp_directory_path() /
            ("netreduce-etcd-test-" + std::to_string(getpid()) + "-" + std::to_string(count_++)))
               .string();
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    url_ = loopback_url(free_port());
    const std::string peer = loopback_url(free_port());
    std::vector<std::string> argv = {kEtcd, "--name", "default", "--data-dir", dir_ + "/data"};
    for (const char* flag : {"--listen-client-urls", "--advertise-client-urls"})
      argv.insert(argv.end(), {flag, url_});
    for (const char* flag : {"--listen-peer-urls", "--initial-advertise-peer-urls"})
      argv.insert(argv.end(), {flag, peer});
    argv.insert(argv.end(), {"--initial-cluster", "default=" + peer});
    std::vector<char*> args = exec_args(argv);
    const std::string log = dir_ + "/etcd.log";
    pid_ = fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {  // only async-signal-safe calls from here: other threads may hold locks
      prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlives the test
      const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(fd, 1);
      dup2(fd, 2);
      execv(kEtcd, args.data());
      _exit(127);
    }
    wait_ready();
  }

  ~EtcdServer() { stop(); }

  // Ends the member (SIGTERM, then SIGKILL after 5 s) and removes its data.
  void stop() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      int status = 0;
      const auto deadline = Clock::now() + 5s;
      while (waitpid(pid_, &status, WNOHANG) == 0) {
        if (Clock::now() > deadline) {
          kill(pid_, SIGKILL);
          waitpid(pid_, &status, 0);
          break;
        }
        std::this_thread::sleep_for(20ms);
      }
      pid_ = -1;
    }
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
    dir_.clear();
  }

  const std::string& url() const { return url_; }

  // etcdctl against this member; its output (it must succeed).
  std::string ctl(std::vector<std::string> args, const std::string& input = "") const {
    std::string out;
    const int rc = try_ctl(std::move(args), input, out);
    INFO("etcdctl: " << out);
    REQUIRE(rc == 0);
    return out;
  }
  int try_ctl(std::vector<std::string> args, const std::string& input, std::string& out) const {
    args.insert(args.begin(), {kEtcdctl, "--endpoints", url_});
    return run(args, input, out);
  }

  // A put (the value on stdin: any bytes); the revision of its write.
  int64_t put(const std::string& key, const std::string& value) const {
    return json::parse(ctl({"put", key, "-w", "json"}, value))["header"]["revision"];
  }
  int64_t revision() const {
    return json::parse(ctl({"get", "/", "-w", "json"}))["header"]["revision"];
  }
  // What etcd holds under `prefix` (key order), read with etcdctl.
  std::vector<EtcdKv> get_prefix(const std::string& prefix) const {
    std::vector<EtcdKv> kvs;
    std::istringstream lines(ctl({"get", prefix, "--prefix", "-w", "fields"}));
    for (std::string line; std::getline(lines, line);) {
      const size_t sep = line.find("\" : ");
      if (line.empty() || line[0] != '"' || sep == std::string::npos) continue;
      const std::string name = line.substr(1, sep - 1), value = line.substr(sep + 4);
      if (name == "Key") kvs.emplace_back().key = go_unquote(value);
      if (kvs.empty()) continue;
      if (name == "Value") kvs.back().value = go_unquote(value);
      if (name == "CreateRevision") kvs.back().create_revision = std::stoll(value);
      if (name == "ModRevision") kvs.back().mod_revision = std::stoll(value);
      if (name == "Lease") kvs.back().lease = std::stoll(value);
    }
    return kvs;
  }

 private:
  void wait_ready() {
    std::string why;
    auto cli = HttpClient::make(url_, why);
    REQUIRE(cli);
    const auto deadline = Clock::now() + 30s;
    while (Clock::now() < deadline) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        FAIL("etcd exited before it answered: " << log_tail());
      }
      const HttpReply r = cli->call("GET", "/health", "", 500);
      if (r.status == 200 && contains(r.body, "true")) return;
      std::this_thread::sleep_for(100ms);
    }
    const std::string log = log_tail();
    stop();
    FAIL("etcd did not answer /health within 30 s: " << log);
  }

  std::string log_tail() const {
    std::ifstream f(dir_ + "/etcd.log");
    std::string all((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    return all.size() > 2000 ? all.substr(all.size() - 2000) : all;
  }

  static inline int count_ = 0;
  pid_t pid_ = -1;
  std::string dir_;
  std::string url_;
};

// The member every test shares (each under a key prefix of its own).
EtcdServer& server() {
  static EtcdServer s;
  return s;
}

// A loopback HTTP server that runs `handler` on each connection in a
// thread of its own (the handler returns when the peer closes or `stop`).
class FakeServer {
 public:
  using Handler = std::function<void(int fd, const std::atomic<bool>& stop)>;

  explicit FakeServer(Handler handler) : handler_(std::move(handler)) {
    listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    REQUIRE(bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len) == 0);
    REQUIRE(listen(listen_fd_, 16) == 0);
    url_ = loopback_url(ntohs(a.sin_port));
    accepter_ = std::thread([this] { accept_loop(); });
  }

  ~FakeServer() {
    stop_ = true;
    accepter_.join();
    for (std::thread& t : connections_) t.join();
    close(listen_fd_);
  }

  const std::string& url() const { return url_; }
  int accepted() const { return accepted_; }

 private:
  void accept_loop() {
    while (!stop_) {
      pollfd p{listen_fd_, POLLIN, 0};
      if (poll(&p, 1, 20) <= 0) continue;
      const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      ++accepted_;
      connections_.emplace_back([this, fd] {
        handler_(fd, stop_);
        close(fd);
      });
    }
  }

  Handler handler_;
  int listen_fd_ = -1;
  std::string url_;
  std::atomic<bool> stop_{false};
  std::atomic<int> accepted_{0};
  std::thread accepter_;
  std::vector<std::thread> connections_;  // the accepter's alone until it is joined
};

// Waits up to `ms` for the peer to send something; false when it closed.
bool peer_open(int fd, int ms) {
  pollfd p{fd, POLLIN, 0};
  if (poll(&p, 1, ms) <= 0) return true;
  char c;
  return recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) > 0;
}

// Reads one request (head and Content-Length body); false when the peer closed.
bool read_request(int fd, const std::atomic<bool>& stop) {
  std::string got;
  size_t head_end = std::string::npos, need = 0;
  while (!stop) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 20) <= 0) continue;
    char buf[4096];
    const ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) return false;
    got.append(buf, static_cast<size_t>(n));
    if (head_end == std::string::npos && (head_end = got.find("\r\n\r\n")) != std::string::npos) {
      const size_t cl = got.find("Content-Length: ");
      need = head_end + 4 + (cl < head_end ? std::stoul(got.substr(cl + 16)) : 0);
    }
    if (head_end != std::string::npos && got.size() >= need) return true;
  }
  return false;
}

bool send_all(int fd, const std::string& s) {
  return send(fd, s.data(), s.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(s.size());
}

// Accepts, and answers one byte every 200 ms (a status line that never ends).
void drip(int fd, const std::atomic<bool>& stop) {
  const std::string answer = "HTTP/1.1 200 OK\r\nX-Drip: " + std::string(10000, 'a');
  for (size_t i = 0; !stop && i < answer.size() && send_all(fd, answer.substr(i, 1)); ++i)
    std::this_thread::sleep_for(200ms);
}

// Accepts, and says nothing.
void silent(int fd, const std::atomic<bool>& stop) {
  while (!stop && peer_open(fd, 20)) std::this_thread::sleep_for(20ms);
}

EtcdConfig config(std::vector<std::string> endpoints, int timeout_ms = 2000) {
  EtcdConfig cfg;
  cfg.endpoints = std::move(endpoints);
  cfg.timeout_ms = timeout_ms;
  return cfg;
}

struct Watched {
  std::vector<EtcdEvent> events;
  std::vector<int64_t> batch_revisions;
  Status status;
};

// One watch window, its events flattened.
Watched watch_once(Etcd& etcd, const std::string& prefix, int64_t from, int window_ms) {
  Watched w;
  w.status = etcd.watch(prefix, from, window_ms,
                        [&](const std::vector<EtcdEvent>& batch, int64_t revision) {
                          w.events.insert(w.events.end(), batch.begin(), batch.end());
                          w.batch_revisions.push_back(revision);
                        });
  return w;
}

// Windows of `window_ms`, each from the revision after the last event
// seen (as the daemon's watchers do), until `want` events or 20 s.
std::vector<EtcdEvent> watch_for(Etcd& etcd, const std::string& prefix, int64_t from, size_t want,
                                 int window_ms = 1000) {
  std::vector<EtcdEvent> events;
  const auto deadline = Clock::now() + 20s;
  while (events.size() < want && Clock::now() < deadline) {
    const Watched w = watch_once(etcd, prefix, from, window_ms);
    INFO(w.status.to_string());
    REQUIRE(w.status.ok());
    events.insert(events.end(), w.events.begin(), w.events.end());
    if (!events.empty()) from = events.back().kv.mod_revision + 1;
  }
  return events;
}

}  // namespace

TEST_CASE("HttpClient stream: the body piece by piece, ended by the callback or the window") {
  // Three chunks 100 ms apart, then the connection stays open.
  FakeServer chunks([](int fd, const std::atomic<bool>& stop) {
    if (!read_request(fd, stop)) return;
    send_all(fd,
             "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n");
    for (const char* piece : {"one\n", "two\n", "six\n"}) {
      std::this_thread::sleep_for(100ms);
      send_all(fd, "4\r\n" + std::string(piece) + "\r\n");
    }
    silent(fd, stop);
  });
  std::string why;
  auto cli = HttpClient::make(chunks.url(), why);
  REQUIRE(cli);

  SECTION("the window ends a stream that was answering: status kept, error 'timed out'") {
    std::vector<std::string> pieces;
    const auto t0 = Clock::now();
    const HttpReply r = cli->stream("POST", "/s", "{}", 1000, [&](std::string_view p) {
      pieces.emplace_back(p);
      return true;
    });
    CHECK(ms_since(t0) >= 900);
    CHECK(r.status == 200);
    CHECK(contains(r.error, "timed out after 1000 ms"));
    CHECK(r.body.empty());
    CHECK(r.header("content-type") == "text/plain");
    std::string all;
    for (const std::string& p : pieces) all += p;
    CHECK(all == "one\ntwo\nsix\n");
    CHECK(pieces.size() >= 2);  // they came apart, as sent
  }
  SECTION("on_data returning false ends the transfer, which is no error") {
    std::string seen;
    const auto t0 = Clock::now();
    const HttpReply r = cli->stream("POST", "/s", "{}", 5000, [&](std::string_view p) {
      seen += p;
      return seen.find("two\n") == std::string::npos;
    });
    CHECK(ms_since(t0) < 2000);
    CHECK(r.status == 200);
    CHECK(r.error.empty());
    CHECK(seen == "one\ntwo\n");
  }
}

TEST_CASE("HttpClient stream: a server that never starts its body costs first_byte_ms") {
  FakeServer quiet(silent);
  FakeServer slow(drip);
  for (const std::string& url : {quiet.url(), slow.url()}) {
    INFO(url);
    std::string why;
    auto cli = HttpClient::make(url, why);
    REQUIRE(cli);
    bool called = false;
    const auto t0 = Clock::now();
    const HttpReply r = cli->stream(
        "POST", "/s", "{}", 5000,
        [&](std::string_view) {
          called = true;
          return true;
        },
        300);
    const int64_t took = ms_since(t0);
    CHECK(took >= 250);
    CHECK(took < 1500);
    CHECK(r.status == 0);
    CHECK(r.error == "no answer within 300 ms");
    CHECK_FALSE(called);
  }
}

TEST_CASE("HttpClient cancel flag: a call in progress ends within kWakeMs, later ones at once") {
  FakeServer quiet(silent);
  std::string why;
  auto cli = HttpClient::make(quiet.url(), why);
  REQUIRE(cli);
  std::atomic<bool> cancel{false};
  cli->set_cancel(&cancel);
  std::thread canceller([&] {
    std::this_thread::sleep_for(200ms);
    cancel = true;
  });
  const auto t0 = Clock::now();
  const HttpReply r = cli->call("POST", "/x", "{}", 10000);
  const int64_t took = ms_since(t0);
  canceller.join();
  CHECK(took >= 150);
  CHECK(took < 700);
  CHECK(r.status == 0);
  CHECK(r.error == "cancelled");

  const auto t1 = Clock::now();
  const HttpReply again =
      cli->stream("POST", "/x", "{}", 10000, [](std::string_view) { return true; });
  CHECK(ms_since(t1) < 100);
  CHECK(again.error == "cancelled");
  CHECK(quiet.accepted() == 1);  // the second never connected
}

TEST_CASE("HttpClient keeps its connection between calls") {
  FakeServer keepalive([](int fd, const std::atomic<bool>& stop) {
    while (read_request(fd, stop) &&
           send_all(fd, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")) {
    }
  });
  std::string why;
  auto cli = HttpClient::make(keepalive.url(), why);
  REQUIRE(cli);
  for (int i = 0; i < 3; ++i) {
    const HttpReply r = cli->call("POST", "/k", "{\"i\":1}", 2000);
    CHECK(r.status == 200);
    CHECK(r.body == "ok");
  }
  CHECK(keepalive.accepted() == 1);
}

TEST_CASE("etcd: check names the field") {
  CHECK(Etcd::check(config({"http://127.0.0.1:2379", "http://[::1]:2379"})).ok());
  CHECK(Etcd::check(config({})).field() == "fabric.etcd.endpoints");
  for (const char* bad : {"https://h:2379", "http://h", "http://h:2379/v3", "http://:2379",
                          "http://h:0", "http://h:99999", "h:2379"}) {
    INFO(bad);
    const Status s = Etcd::check(config({"http://127.0.0.1:2379", bad}));
    CHECK(s.code() == StatusCode::invalid_argument);
    CHECK(s.field() == "fabric.etcd.endpoints");
    CHECK(contains(s.message(), "[1]"));
    CHECK(contains(s.message(), bad));
  }
  CHECK(Etcd::check(config({"http://127.0.0.1:2379"}, 0)).field() == "fabric.etcd.timeout_ms");
}

TEST_CASE("etcd: grant, keepalive and revoke a lease") {
  EtcdServer& e = server();
  Etcd etcd(config({e.url()}));
  int64_t id = 0;
  REQUIRE(etcd.grant(20, id).ok());
  REQUIRE(id != 0);
  CHECK(contains(e.ctl({"lease", "timetolive", hex(id)}), "granted with TTL(20s)"));

  int64_t ttl = -1;
  REQUIRE(etcd.keepalive(id, ttl).ok());
  CHECK(ttl == 20);
  REQUIRE(etcd.put("/t/lease/a", "1", id).ok());
  REQUIRE(etcd.put("/t/lease/b", "2", id).ok());
  const std::vector<EtcdKv> before = e.get_prefix("/t/lease/");
  REQUIRE(before.size() == 2);
  CHECK(before[0].lease == id);
  CHECK(before[1].lease == id);

  REQUIRE(etcd.revoke(id).ok());
  CHECK(contains(e.ctl({"lease", "timetolive", hex(id)}), "already expired"));
  CHECK(e.get_prefix("/t/lease/").empty());  // the lease's keys went with it
  REQUIRE(etcd.keepalive(id, ttl).ok());
  CHECK(ttl == 0);
  CHECK(etcd.revoke(id).ok());  // already gone: success

  const Status s = etcd.put("/t/lease/a", "1", id);
  CHECK(s.code() == StatusCode::not_found);
  CHECK(contains(s.message(), "lease not found"));
  bool created = true;
  std::vector<EtcdKv> held;
  CHECK(etcd.put_if_absent({{"/t/lease/a", "1"}}, id, created, held).code() ==
        StatusCode::not_found);
  CHECK_FALSE(created);
  CHECK(e.get_prefix("/t/lease/").empty());

  // A lease etcdctl granted renews through the client too.
  const std::string granted =
      e.ctl({"lease", "grant", "30"});  // "lease <hex> granted with TTL(30s)"
  const int64_t theirs = std::stoll(granted.substr(6, granted.find(' ', 6) - 6), nullptr, 16);
  REQUIRE(etcd.keepalive(theirs, ttl).ok());
  CHECK(ttl == 30);
  CHECK(etcd.revoke(theirs).ok());
}

TEST_CASE("etcd: put_if_absent creates every key or none, and lists those held") {
  EtcdServer& e = server();
  Etcd etcd(config({e.url()}));
  int64_t lease = 0;
  REQUIRE(etcd.grant(60, lease).ok());
  // Values of every length mod 3 (base64 padding), an empty one, and bytes
  // that are not text.
  const std::string binary("a\0\xff\"b", 5);
  const std::vector<std::pair<std::string, std::string>> kvs = {{"/t/pia/a", "1"},
                                                                {"/t/pia/b", "12"},
                                                                {"/t/pia/c", "123"},
                                                                {"/t/pia/d", ""},
                                                                {"/t/pia/e", binary}};
  bool created = false;
  std::vector<EtcdKv> held = {EtcdKv{}};
  REQUIRE(etcd.put_if_absent(kvs, lease, created, held).ok());
  CHECK(created);
  CHECK(held.empty());
  std::vector<EtcdKv> stored = e.get_prefix("/t/pia/");
  REQUIRE(stored.size() == kvs.size());
  for (size_t i = 0; i < kvs.size(); ++i) {
    CHECK(stored[i].key == kvs[i].first);
    CHECK(stored[i].value == kvs[i].second);
    CHECK(stored[i].lease == lease);
  }

  // /t/pia/b exists: nothing is written, /t/pia/b is listed as etcd holds it.
  REQUIRE(etcd.put_if_absent({{"/t/pia/z", "new"}, {"/t/pia/b", "other"}}, 0, created, held).ok());
  CHECK_FALSE(created);
  REQUIRE(held.size() == 1);
  CHECK(held[0].key == "/t/pia/b");
  CHECK(held[0].value == "12");
  CHECK(held[0].lease == lease);
  CHECK(held[0].create_revision == stored[1].create_revision);
  CHECK(held[0].mod_revision == stored[1].mod_revision);
  const std::vector<EtcdKv> after = e.get_prefix("/t/pia/");
  REQUIRE(after.size() == kvs.size());  // no /t/pia/z
  CHECK(after[1].value == "12");
  CHECK(after[1].mod_revision == stored[1].mod_revision);

  // Two held keys, one written by etcdctl.
  const int64_t rev = e.put("/t/pia/y", "etcdctl's");
  REQUIRE(etcd.put_if_absent({{"/t/pia/y", "1"}, {"/t/pia/e", "2"}}, 0, created, held).ok());
  CHECK_FALSE(created);
  REQUIRE(held.size() == 2);
  CHECK(held[0].key == "/t/pia/y");
  CHECK(held[0].value == "etcdctl's");
  CHECK(held[0].create_revision == rev);
  CHECK(held[0].lease == 0);
  CHECK(held[1].key == "/t/pia/e");
  CHECK(held[1].value == binary);
  REQUIRE(etcd.revoke(lease).ok());
}

TEST_CASE("etcd: range reads a prefix, not its siblings, in key order") {
  EtcdServer& e = server();
  Etcd etcd(config({e.url()}));
  e.put("/t/r/a/2", std::string("t\0\xffo", 4));
  e.put("/t/r/a/1", "one");
  e.put("/t/r/ab/1", "a sibling prefix");
  e.put("/t/r/a", "the prefix's parent");
  REQUIRE(etcd.put("/t/r/a/3", "three", 0).ok());
  const int64_t now = e.revision();

  std::vector<EtcdKv> kvs;
  int64_t revision = 0;
  REQUIRE(etcd.range("/t/r/a/", kvs, revision).ok());
  CHECK(revision == now);
  const std::vector<EtcdKv> golden = e.get_prefix("/t/r/a/");
  REQUIRE(golden.size() == 3);
  REQUIRE(kvs.size() == 3);
  for (size_t i = 0; i < 3; ++i) {
    CHECK(kvs[i].key == golden[i].key);
    CHECK(kvs[i].value == golden[i].value);
    CHECK(kvs[i].create_revision == golden[i].create_revision);
    CHECK(kvs[i].mod_revision == golden[i].mod_revision);
    CHECK(kvs[i].lease == 0);
  }
  CHECK(kvs[0].value == "one");
  CHECK(kvs[1].value == std::string("t\0\xffo", 4));
  CHECK(kvs[2].value == "three");

  REQUIRE(etcd.range("/t/r/none/", kvs, revision).ok());
  CHECK(kvs.empty());
  CHECK(revision == now);
}

TEST_CASE("etcd: calls from many threads at once") {
  EtcdServer& e = server();
  Etcd etcd(config({e.url()}));
  constexpr int kThreads = 4, kPuts = 25;
  std::atomic<int> failed{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPuts; ++i) {
        const std::string key = "/t/mt/" + std::to_string(t) + "/" + std::to_string(100 + i);
        std::vector<EtcdKv> kvs;
        int64_t revision = 0;
        if (!etcd.put(key, std::to_string(i), 0).ok() ||
            !etcd.range("/t/mt/" + std::to_string(t) + "/", kvs, revision).ok() ||
            kvs.size() != static_cast<size_t>(i + 1))
          ++failed;
      }
    });
  for (std::thread& t : threads) t.join();
  CHECK(failed == 0);
  CHECK(e.get_prefix("/t/mt/").size() == kThreads * kPuts);
}

TEST_CASE("etcd: watch streams puts and deletes in order, with prev values, and resumes") {
  EtcdServer& e = server();
  Etcd etcd(config({e.url()}));
  const int64_t start = e.revision() + 1;
  const int64_t r1 = e.put("/t/w/k", "1");  // before the window: replayed

  // During the window, from another process.
  std::vector<int64_t> revs;
  std::string writer_errors;
  std::thread writer([&] {
    std::this_thread::sleep_for(300ms);
    for (const auto& args : std::vector<std::vector<std::string>>{
             {"put", "/t/w/k", "-w", "json"},
             {"del", "/t/w/k", "-w", "json"},
             {"put", "/t/wx/k", "-w", "json"}}) {  // not under /t/w/
      std::string out;
      if (e.try_ctl(args, args[0] == "put" ? "2" : "", out) != 0)
        writer_errors += out;
      else
        revs.push_back(json::parse(out)["header"]["revision"]);
    }
  });
  const auto t0 = Clock::now();
  const Watched w = watch_once(etcd, "/t/w/", start, 3000);
  const int64_t took = ms_since(t0);
  writer.join();
  REQUIRE(writer_errors.empty());
  REQUIRE(revs.size() == 3);
  INFO(w.status.to_string());
  REQUIRE(w.status.ok());  // the window ended with the stream healthy
  CHECK(took >= 2900);
  CHECK(took < 4500);

  REQUIRE(w.events.size() == 3);
  CHECK_FALSE(w.events[0].deleted);
  CHECK(w.events[0].kv.key == "/t/w/k");
  CHECK(w.events[0].kv.value == "1");
  CHECK(w.events[0].kv.mod_revision == r1);
  CHECK(w.events[0].kv.create_revision == r1);
  CHECK_FALSE(w.events[0].prev.has_value());

  CHECK_FALSE(w.events[1].deleted);
  CHECK(w.events[1].kv.value == "2");
  CHECK(w.events[1].kv.mod_revision == revs[0]);
  CHECK(w.events[1].kv.create_revision == r1);
  REQUIRE(w.events[1].prev.has_value());
  CHECK(w.events[1].prev->value == "1");
  CHECK(w.events[1].prev->mod_revision == r1);

  CHECK(w.events[2].deleted);
  CHECK(w.events[2].kv.key == "/t/w/k");
  CHECK(w.events[2].kv.value.empty());
  CHECK(w.events[2].kv.mod_revision == revs[1]);
  REQUIRE(w.events[2].prev.has_value());
  CHECK(w.events[2].prev->value == "2");
  for (size_t i = 1; i < w.batch_revisions.size(); ++i)
    CHECK(w.batch_revisions[i] >= w.batch_revisions[i - 1]);
  CHECK(w.batch_revisions.back() >= revs[1]);

  // Written between two windows: the next one, from the last revision seen
  // + 1, has it (and nothing before it).
  const int64_t r4 = e.put("/t/w/k", "3");
  const Watched next = watch_once(etcd, "/t/w/", w.events.back().kv.mod_revision + 1, 500);
  INFO(next.status.to_string());
  REQUIRE(next.status.ok());
  REQUIRE(next.events.size() == 1);
  CHECK(next.events[0].kv.value == "3");
  CHECK(next.events[0].kv.mod_revision == r4);
  CHECK(next.events[0].kv.create_revision == r4);
  CHECK_FALSE(next.events[0].prev.has_value());
}

TEST_CASE("etcd: a watch from a compacted revision is not_found, at once") {
  EtcdServer& e = server();
  Etcd etcd(config({e.url()}));
  const int64_t r1 = e.put("/t/c/k", "a");
  const int64_t r2 = e.put("/t/c/k", "b");
  e.ctl({"compact", std::to_string(r2)});
  const auto t0 = Clock::now();
  const Watched w = watch_once(etcd, "/t/c/", r1, 5000);
  CHECK(ms_since(t0) < 2000);  // etcd leaves the stream open: the client ends it
  CHECK(w.status.code() == StatusCode::not_found);
  CHECK(contains(w.status.message(), std::to_string(r2)));
  CHECK(w.events.empty());
  // From the compact revision on, all is there.
  const Watched from_r2 = watch_once(etcd, "/t/c/", r2, 300);
  REQUIRE(from_r2.status.ok());
  REQUIRE(from_r2.events.size() == 1);
  CHECK(from_r2.events[0].kv.value == "b");
}

TEST_CASE("etcd: a lease's expiry is a DELETE event") {
  EtcdServer& e = server();
  Etcd etcd(config({e.url()}));
  int64_t lease = 0;
  REQUIRE(etcd.grant(1, lease).ok());  // etcd raises it to its minimum (2 s here)
  REQUIRE(etcd.put("/t/x/k", "v", lease).ok());
  const std::vector<EtcdKv> held = e.get_prefix("/t/x/");
  REQUIRE(held.size() == 1);
  const std::vector<EtcdEvent> events = watch_for(etcd, "/t/x/", held[0].mod_revision + 1, 1);
  REQUIRE(events.size() == 1);
  CHECK(events[0].deleted);
  CHECK(events[0].kv.key == "/t/x/k");
  REQUIRE(events[0].prev.has_value());
  CHECK(events[0].prev->value == "v");
  CHECK(events[0].prev->lease == lease);
  CHECK(e.get_prefix("/t/x/").empty());
  int64_t ttl = -1;
  REQUIRE(etcd.keepalive(lease, ttl).ok());
  CHECK(ttl == 0);
}

TEST_CASE("etcd: endpoints fail over, and the one that answered is tried first") {
  EtcdServer& e = server();
  const std::string dead = loopback_url(free_port());

  SECTION("a dead member, then a live one") {
    Etcd etcd(config({dead, e.url()}));
    std::vector<EtcdKv> kvs;
    int64_t revision = 0;
    REQUIRE(etcd.range("/t/f/", kvs, revision).ok());
    REQUIRE(etcd.put("/t/f/dead", "1", 0).ok());
    REQUIRE(e.get_prefix("/t/f/dead").size() == 1);
  }
  SECTION("a dripping member costs one attempt, then none") {
    FakeServer slow(drip);
    Etcd etcd(config({slow.url(), e.url()}, 300));
    std::vector<EtcdKv> kvs;
    int64_t revision = 0;
    auto t0 = Clock::now();
    const Status first = etcd.range("/t/f/", kvs, revision);
    const int64_t took_first = ms_since(t0);
    INFO(first.to_string());
    REQUIRE(first.ok());
    CHECK(took_first >= 250);  // the dripping one first, for its whole attempt
    CHECK(took_first < 900);
    t0 = Clock::now();
    REQUIRE(etcd.range("/t/f/", kvs, revision).ok());
    CHECK(ms_since(t0) < 150);
    CHECK(slow.accepted() == 1);
  }
  SECTION("a watch past a dripping member") {
    FakeServer slow(drip);
    Etcd etcd(config({slow.url(), e.url()}, 300));
    const int64_t rev = e.put("/t/fw/k", "1");
    const auto t0 = Clock::now();
    const Watched w = watch_once(etcd, "/t/fw/", rev, 1500);
    INFO(w.status.to_string());
    REQUIRE(w.status.ok());
    CHECK(ms_since(t0) < 2500);
    REQUIRE(w.events.size() == 1);
    CHECK(w.events[0].kv.value == "1");
    // The next call goes to the member that streamed.
    std::vector<EtcdKv> kvs;
    int64_t revision = 0;
    const auto t1 = Clock::now();
    REQUIRE(etcd.range("/t/fw/", kvs, revision).ok());
    CHECK(ms_since(t1) < 150);
  }
  SECTION("no member answers: unavailable, naming each one's failure") {
    FakeServer slow(drip);
    const std::string dead2 = loopback_url(free_port());
    Etcd etcd(config({dead, slow.url(), dead2}, 300));
    std::vector<EtcdKv> kvs;
    int64_t revision = 0;
    const auto t0 = Clock::now();
    const Status s = etcd.range("/t/f/", kvs, revision);
    CHECK(ms_since(t0) < 3 * 300 + 600);
    CHECK(s.code() == StatusCode::unavailable);
    CHECK(contains(s.message(), dead));
    CHECK(contains(s.message(), dead2));
    CHECK(contains(s.message(), slow.url() + ": timed out after 300 ms"));
    const Watched w = watch_once(etcd, "/t/f/", 0, 1000);
    CHECK(w.status.code() == StatusCode::unavailable);
    CHECK(contains(w.status.message(), dead));
    CHECK(contains(w.status.message(), slow.url() + ": no answer within 300 ms"));
  }
}

TEST_CASE("etcd: a member that goes away mid-watch ends it: unavailable") {
  EtcdServer own;
  Etcd etcd(config({own.url()}));
  Watched w;
  std::thread watcher([&] { w = watch_once(etcd, "/t/gone/", 0, 20000); });
  std::this_thread::sleep_for(500ms);
  const auto t0 = Clock::now();
  own.stop();
  watcher.join();
  INFO(w.status.to_string());
  CHECK(ms_since(t0) < 6000);
  CHECK(w.status.code() == StatusCode::unavailable);
  CHECK(contains(w.status.message(), own.url() + ": the stream ended early"));
}

TEST_CASE("etcd: what on_events throws leaves watch() once the stream is closed") {
  EtcdServer& e = server();
  Etcd etcd(config({e.url()}));
  const int64_t rev = e.put("/t/throw/k", "1");
  const auto t0 = Clock::now();
  CHECK_THROWS_WITH(etcd.watch("/t/throw/", rev, 5000,
                               [](const std::vector<EtcdEvent>&, int64_t) {
                                 throw std::runtime_error("on_events failed");
                               }),
                    "on_events failed");
  CHECK(ms_since(t0) < 2000);
  const Watched w = watch_once(etcd, "/t/throw/", rev, 300);  // the client is still whole
  CHECK(w.status.ok());
  CHECK(w.events.size() == 1);
}

TEST_CASE("etcd: cancel ends a running watch and every later call") {
  EtcdServer& e = server();
  Etcd etcd(config({e.url()}));
  Watched w;
  std::thread watcher([&] { w = watch_once(etcd, "/t/cancel/", 0, 20000); });
  std::this_thread::sleep_for(500ms);
  const auto t0 = Clock::now();
  etcd.cancel();
  watcher.join();
  CHECK(ms_since(t0) < 500);
  CHECK(w.status.code() == StatusCode::unavailable);
  CHECK(contains(w.status.message(), "cancelled"));

  std::vector<EtcdKv> kvs;
  int64_t revision = 0;
  const auto t1 = Clock::now();
  CHECK(etcd.range("/t/cancel/", kvs, revision).code() == StatusCode::unavailable);
  CHECK(ms_since(t1) < 100);
}

TEST_CASE("etcd: cancel ends a call waiting on a silent member") {
  FakeServer quiet(silent);
  Etcd etcd(config({quiet.url()}, 10000));
  Status s;
  std::thread caller([&] {
    int64_t id = 0;
    s = etcd.grant(10, id);
  });
  std::this_thread::sleep_for(300ms);
  const auto t0 = Clock::now();
  etcd.cancel();
  caller.join();
  CHECK(ms_since(t0) < 500);
  CHECK(s.code() == StatusCode::unavailable);
  CHECK(contains(s.message(), "cancelled"));
}
