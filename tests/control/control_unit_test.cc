// The daemon's pieces without HTTP: the configuration loader (the shipped
// example and named errors), the state file (round trip, atomic replace,
// refusals), the metrics rendering (naming conventions) and the data plane
// client's reconnect rule against a scripted socket peer.
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "common/dataplane_protocol.h"
#include "common/ring_json.h"
#include "control/auth.h"
#include "control/config.h"
#include "control/metrics.h"
#include "control/state.h"
#include "dataplane/reasons.h"

using namespace netreduce;
using namespace netreduce::control;
using nlohmann::json;

namespace {

std::string error_of(const std::string& yaml) {
  DaemonConfig cfg;
  const Status s = parse_daemon_config(yaml, "test.yaml", cfg);
  REQUIRE_FALSE(s.ok());
  return s.to_string();
}

std::filesystem::path temp_dir() {
  char tmpl[] = "/tmp/nrctl-unit-XXXXXX";
  REQUIRE(::mkdtemp(tmpl) != nullptr);
  return tmpl;
}

}  // namespace

TEST_CASE("the shipped netreduced.yaml loads with its documented values", "[control][config]") {
  const char* path = std::getenv("NETREDUCE_DAEMON_CONFIG_EXAMPLE");
  REQUIRE(path != nullptr);
  DaemonConfig cfg;
  const Status s = load_daemon_config(path, cfg);
  INFO(s.to_string());
  REQUIRE(s.ok());
  CHECK(cfg.bind_address == "127.0.0.1");
  CHECK(cfg.port == 7470);
  CHECK(cfg.token_file == "/etc/netreduce/token");
  CHECK(cfg.state_file == "/var/lib/netreduce/state.json");
  CHECK(cfg.dataplane_socket == "/run/netreduce/dataplane.sock");
  CHECK(cfg.max_rings == 64);
  CHECK(cfg.job_token_file.empty());  // commented out in the example: one token
  CHECK(cfg.max_lease_ms == 3600000);
  CHECK(cfg.max_memory == (1ull << 30));
  CHECK_FALSE(cfg.require_dataplane);
  CHECK(cfg.threads == 8);
  CHECK(cfg.max_connections == 256);
  CHECK(cfg.header_timeout_ms == 5000);
  CHECK(cfg.body_timeout_ms == 10000);
  CHECK(cfg.write_timeout_ms == 10000);
  CHECK(cfg.keepalive_requests == 100);
  CHECK(cfg.max_body == (1u << 20));
  CHECK(cfg.dataplane_concurrency == 2);
  CHECK(cfg.metrics_refresh_ms == 1000);
}

TEST_CASE("the HTTP front end's limits: ranges and the free-thread rule", "[control][config]") {
  CHECK(error_of("listen: {threads: 1}").rfind("listen.threads: must be in 2..256", 0) == 0);
  {
    // Not given, the limit follows listen.threads: a config without the key
    // and with threads: 2 starts.
    DaemonConfig c;
    REQUIRE(parse_daemon_config("listen: {threads: 2}\nauth: {token_file: /t}", "test", c).ok());
    CHECK(c.dataplane_concurrency == 1);
    REQUIRE(parse_daemon_config("listen: {threads: 8}\nauth: {token_file: /t}", "test", c).ok());
    CHECK(c.dataplane_concurrency == 2);
  }
  CHECK(error_of("listen: {threads: 4, dataplane_concurrency: 4}")
            .rfind("listen.dataplane_concurrency: must be less than listen.threads (4)", 0) == 0);
  CHECK(error_of("listen: {dataplane_concurrency: 8}")
            .rfind("listen.dataplane_concurrency: must be less than listen.threads (8)", 0) == 0);
  CHECK(error_of("listen: {max_connections: 5000}").rfind("listen.max_connections:", 0) == 0);
  CHECK(error_of("listen: {header_timeout_ms: 10}").rfind("listen.header_timeout_ms:", 0) == 0);
  CHECK(error_of("listen: {body_timeout_ms: 0}").rfind("listen.body_timeout_ms:", 0) == 0);
  CHECK(error_of("listen: {write_timeout_ms: -1}").rfind("listen.write_timeout_ms:", 0) == 0);
  CHECK(error_of("listen: {keepalive_requests: 0}").rfind("listen.keepalive_requests:", 0) == 0);
  CHECK(error_of("listen: {max_body: 100}").rfind("listen.max_body: must be in 1KiB..64MiB", 0) ==
        0);
  CHECK(error_of("listen: {max_body: 1GiB}").rfind("listen.max_body: must be in 1KiB..64MiB", 0) ==
        0);
  CHECK(error_of("metrics: {refresh_interval_ms: 5}").rfind("metrics.refresh_interval_ms:", 0) ==
        0);
  CHECK(error_of("metrics: {refresh: 5}").rfind("metrics.refresh: unknown key", 0) == 0);
  DaemonConfig cfg;
  REQUIRE(parse_daemon_config("listen: {threads: 2, dataplane_concurrency: 1, max_body: 64KiB, "
                              "max_connections: 16}\nmetrics: {refresh_interval_ms: 250}",
                              "t", cfg)
              .ok());
  CHECK(cfg.threads == 2);
  CHECK(cfg.dataplane_concurrency == 1);
  CHECK(cfg.max_body == 64u << 10);
  CHECK(cfg.max_connections == 16);
  CHECK(cfg.metrics_refresh_ms == 250);
}

TEST_CASE("state file lock: one holder, the second told the first's pid", "[control][state]") {
  const auto dir = temp_dir();
  const std::string path = (dir / "state.json").string();
  {
    StateFile first(path);
    REQUIRE(first.lock().ok());
    CHECK(first.lock().ok());  // idempotent for the holder
    std::ifstream pid(path + ".lock");
    std::string text;
    std::getline(pid, text);
    CHECK(text == std::to_string(::getpid()));
    StateFile second(path);
    const Status s = second.lock();
    REQUIRE_FALSE(s.ok());
    CHECK(s.field() == "state.file");
    CHECK(s.message().find(path + " is in use by another netreduced (pid " +
                           std::to_string(::getpid()) + ", lock " + path + ".lock)") !=
          std::string::npos);
  }
  // Released with its holder (the kernel releases it with the process too).
  StateFile third(path);
  CHECK(third.lock().ok());
  StateFile nowhere((dir / "missing" / "state.json").string());
  CHECK(nowhere.lock().field() == "state.file");
  std::filesystem::remove_all(dir);
}

TEST_CASE("daemon config errors name the key", "[control][config]") {
  CHECK(error_of("listen: {prot: 80}").rfind("listen.prot: unknown key", 0) == 0);
  CHECK(error_of("listen: {prot: 80}").find("did you mean 'port'") != std::string::npos);
  CHECK(error_of("listen: {port: 0}").rfind("listen.port: must be in 1..65535", 0) == 0);
  CHECK(error_of("listen: {port: 0x10}").rfind("listen.port: must be an integer", 0) == 0);
  CHECK(error_of("listen: {address: localhost}").rfind("listen.address:", 0) == 0);
  CHECK(
      error_of("auth: {token_file: token}").rfind("auth.token_file: must be an absolute path", 0) ==
      0);
  CHECK(error_of("state: {file: ''}").rfind("state.file:", 0) == 0);
  CHECK(error_of("dataplane: {socket: /" + std::string(200, 'x') + "}")
            .rfind("dataplane.socket:", 0) == 0);
  CHECK(error_of("dataplane: {require: maybe}")
            .rfind("dataplane.require: must be true or false", 0) == 0);
  CHECK(error_of("quotas: {max_memory: 10XB}").rfind("quotas.max_memory: unknown size suffix", 0) ==
        0);
  CHECK(error_of("quotas: {max_lease_ms: 999}").rfind("quotas.max_lease_ms: must be in", 0) == 0);
  CHECK(error_of("auth: {job_token_file: jobs}")
            .rfind("auth.job_token_file: must be an absolute path", 0) == 0);
  CHECK(error_of("listen: {address: 127.0.0.01}").rfind("listen.address:", 0) == 0);
  CHECK(error_of("quotas: [1, 2]").rfind("quotas: must be a mapping", 0) == 0);
  CHECK(error_of("a: 1\n---\nb: 2").find("content after the end of the document") !=
        std::string::npos);
  DaemonConfig cfg;
  REQUIRE(parse_daemon_config("quotas: {max_memory: 64MiB, max_rings: 3, max_lease_ms: 5000}\n"
                              "dataplane: {require: true}\nauth: {job_token_file: /etc/jobs}",
                              "t", cfg)
              .ok());
  CHECK(cfg.max_lease_ms == 5000);
  CHECK(cfg.job_token_file == "/etc/jobs");
  CHECK(cfg.max_memory == 64ull << 20);
  CHECK(cfg.max_rings == 3);
  CHECK(cfg.require_dataplane);
}

TEST_CASE("state file: round trip, atomic replace, refusals", "[control][state]") {
  const auto dir = temp_dir();
  StateFile st((dir / "state.json").string());
  RingMap rings;
  REQUIRE(st.load(rings).ok());  // no file yet: empty
  CHECK(rings.empty());

  engine::RingSpec a;
  REQUIRE(ring_from_json(json{{"id", 7},
                              {"members", {"10.0.0.1", "10.0.0.2"}},
                              {"msg_len", 4},
                              {"window", 2},
                              {"payload_bytes", 1024},
                              {"dtypes", {"bf16"}}},
                         a)
              .ok());
  engine::RingSpec b = a;
  b.ring_id = 4000000000u;
  b.members = {0x0A000003, 0x0A000004, 0x0A000005};
  const std::string cred(32, 'a');
  RingRecord ra, rb;
  ra.spec = a;
  ra.credential = cred;
  ra.lease_ms = 30000;
  rb.spec = b;
  rings = {{a.ring_id, ra}, {b.ring_id, rb}};
  REQUIRE(st.save(rings).ok());
  CHECK_FALSE(std::filesystem::exists(dir / "state.json.tmp"));
  RingMap back;
  REQUIRE(st.load(back).ok());
  REQUIRE(back.size() == 2);
  for (const auto& [id, rec] : rings) {  // omitted ops come back as the full list: the same ring
    CHECK(ring_to_json(back.at(id).spec) == ring_to_json(rec.spec));
    CHECK(back.at(id).credential == rec.credential);
    CHECK(back.at(id).lease_ms == rec.lease_ms);
  }

  // The file is plain JSON a person can read; it holds credentials: 0600.
  std::ifstream in(dir / "state.json");
  const json j = json::parse(in);
  CHECK(j["version"] == 2);
  CHECK(j["rings"][0]["id"] == 7);
  CHECK(j["rings"][0]["credential"] == cred);
  CHECK(j["rings"][0]["lease_ms"] == 30000);
  CHECK_FALSE(j["rings"][1].contains("credential"));
  CHECK_FALSE(j["rings"][1].contains("lease_ms"));
  CHECK((std::filesystem::status(dir / "state.json").permissions() & std::filesystem::perms::all) ==
        (std::filesystem::perms::owner_read | std::filesystem::perms::owner_write));
  // A temp file a crash left with a wider mode does not widen the new state.
  std::ofstream(dir / "state.json.tmp") << "junk";
  std::filesystem::permissions(dir / "state.json.tmp", std::filesystem::perms::all);
  REQUIRE(st.save(rings).ok());
  CHECK((std::filesystem::status(dir / "state.json").permissions() & std::filesystem::perms::all) ==
        (std::filesystem::perms::owner_read | std::filesystem::perms::owner_write));

  auto write = [&](const std::string& text) { std::ofstream(dir / "state.json") << text; };
  write(
      "{\"rings\": [{\"id\": 1, \"members\": [\"10.0.0.1\"], \"msg_len\": 1, \"window\": 1, "
      "\"payload_bytes\": 256}]}");
  Status s = st.load(back);
  CHECK(s.field() == "members");
  CHECK(s.message().find("rings[0]") != std::string::npos);
  // A memory quota below what the ring needs: refused at load, as at registration
  // (before, decoding checked it; the data plane would refuse the ring forever).
  json small = ring_to_json(a);
  small["memory_quota"] = 10;
  write("{\"version\": 2, \"rings\": [" + small.dump() + "]}");
  s = st.load(back);
  CHECK(s.field() == "memory_quota");
  CHECK(s.message().find("rings[0]") != std::string::npos);
  write("[]");
  CHECK_FALSE(st.load(back).ok());
  // Version 1 (before rings had owners): loads, no credential, no lease.
  write("{\"version\": 1, \"rings\": [" + ring_to_json(a).dump() + "]}");
  REQUIRE(st.load(back).ok());
  CHECK(back.at(7).credential.empty());
  CHECK(back.at(7).lease_ms == 0);
  json with_cred = ring_to_json(a);
  with_cred["credential"] = "not-hex";
  write("{\"version\": 2, \"rings\": [" + with_cred.dump() + "]}");
  CHECK(st.load(back).field() == "credential");
  with_cred["credential"] = cred;
  write("{\"version\": 1, \"rings\": [" + with_cred.dump() + "]}");
  CHECK(st.load(back).field() == "credential");  // version 1 has no such field
  with_cred["lease_ms"] = -5;
  write("{\"version\": 2, \"rings\": [" + with_cred.dump() + "]}");
  CHECK(st.load(back).field() == "lease_ms");
  write("{\"version\": 3, \"rings\": []}");
  CHECK(st.load(back).field() == "version");
  write("{\"rings\": [");
  CHECK(st.load(back).message().find("not JSON") != std::string::npos);
  const std::string two = ring_to_json(a).dump();
  write("{\"rings\": [" + two + "," + two + "]}");
  CHECK(st.load(back).message().find("given twice") != std::string::npos);
  // Fields of the wrong type are refusals naming the field, never an
  // exception (the daemon would abort instead of exiting 2).
  for (const auto& [fabric, what] : std::vector<std::pair<json, std::string>>{
           {{{"entry", cred}, {"origin", 5}}, "origin"},
           {{{"entry", cred}, {"local", "no"}}, "local"},
           {{{"entry", cred}, {"peers", {{"box", "b"}}}}, "peers"},
           {{{"entry", json::array()}}, "entry"}}) {
    json r = ring_to_json(a);
    r["fabric"] = fabric;
    write("{\"version\": 2, \"rings\": [" + r.dump() + "]}");
    s = st.load(back);
    INFO(s.to_string());
    CHECK(s.field() == "fabric");
    CHECK(s.message().find(what) != std::string::npos);
  }

  // A state file that is a link to nothing is refused, naming it (read as
  // empty, the daemon would remove every ring from a running box and the
  // first save would replace the link); so are links at the temp and lock
  // files' names (a save or lock would write through them).
  const auto link = dir / "linked.json";
  std::filesystem::create_symlink(dir / "gone.json", link);
  StateFile linked(link.string());
  s = linked.load(back);
  CHECK_FALSE(s.ok());
  CHECK(s.message().find(link.string()) != std::string::npos);
  CHECK(s.message().find("symbolic link") != std::string::npos);
  std::filesystem::create_symlink(dir / "elsewhere", dir / "state.json.tmp");
  s = st.save(rings);
  CHECK(s.message().find("symbolic link") != std::string::npos);
  CHECK_FALSE(std::filesystem::exists(dir / "elsewhere"));
  StateFile locked((dir / "other.json").string());
  std::filesystem::create_symlink(dir / "elsewhere", dir / "other.json.lock");
  s = locked.lock();
  CHECK(s.message().find("symbolic link") != std::string::npos);
  CHECK_FALSE(std::filesystem::exists(dir / "elsewhere"));

  // A directory that does not exist: an error, never a crash.
  StateFile nowhere((dir / "missing" / "state.json").string());
  CHECK(nowhere.save(rings).code() == StatusCode::internal);
  std::filesystem::remove_all(dir);
}

TEST_CASE("metrics follow the Prometheus naming conventions", "[control][metrics]") {
  MetricsInput in;
  in.dataplane_up = true;
  in.status = json::parse(R"({"memory": {"engine_reserved_bytes": 100, "engine_budget_bytes": 1000},
                              "mbufs": {"total": 8192, "in_use": 12}})");
  in.stats = json::parse(R"({"reasons": {"held": 36, "bad_icrc": 2},
      "workers": [{"lcore": 1, "busy_ratio": 0.25, "memory_bytes": 5,
                   "dataplane_reasons": {"tx_full": 3, "inbox_full": 6}}],
      "ports": [{"name": "p0", "rx_packets": 10, "tx_packets": 11, "rx_bytes": 1000, "tx_bytes": 1100,
                 "rx_missed": 3, "rx_errors": 0, "tx_errors": 0, "link_up": true,
                 "box_reasons": {"tx_full": 1}}]})");
  // Every data plane reason in the stats: each must come out as its own series.
  json dp_reasons = json::object();
  for (size_t r = 0; r < dataplane::kReasonCount; ++r)
    dp_reasons[std::string(dataplane::to_string(static_cast<dataplane::Reason>(r)))] = 100 + r;
  in.stats["dataplane_reasons"] = dp_reasons;
  in.rings = json::parse(R"([{"spec": {"id": 9, "members": ["10.0.0.1", "10.0.0.2"]},
      "counters": {"packets_aggregated": 36, "bytes_aggregated": 36648, "messages_completed": 3,
                   "drops": {"duplicate": 4}}, "held_bytes": 77}])");
  uint64_t value = 1000;  // each daemon counter its own value
#define NETREDUCE_X(name, series, help) in.counters.name = value++;
  NETREDUCE_DAEMON_COUNTERS(NETREDUCE_X)
#undef NETREDUCE_X
  const std::string text = render_metrics(in);
  std::istringstream lines(text);
  std::string line;
  int types = 0;
  while (std::getline(lines, line)) {
    if (line.rfind("# TYPE ", 0) != 0) continue;
    ++types;
    std::istringstream f(line.substr(7));
    std::string name, type;
    f >> name >> type;
    INFO(name);
    CHECK(name.rfind("netreduce_", 0) == 0);
    CHECK((type == "counter") == (name.size() > 6 && name.substr(name.size() - 6) == "_total"));
  }
  CHECK(types > 30);
  CHECK(text.find("netreduce_ring_aggregated_packets_total{ring=\"9\"} 36") != std::string::npos);
  CHECK(text.find("netreduce_ring_dropped_packets_total{reason=\"duplicate\",ring=\"9\"} 4") !=
        std::string::npos);
  CHECK(text.find("netreduce_port_dropped_packets_total{port=\"p0\",reason=\"tx_full\"} 1") !=
        std::string::npos);
  CHECK(text.find("netreduce_port_dropped_packets_total{port=\"p0\",reason=\"rx_missed\"} 3") !=
        std::string::npos);
  CHECK(text.find("netreduce_lcore_busy_ratio{lcore=\"1\"} 0.25") != std::string::npos);
  CHECK(text.find("netreduce_lcore_dispatch_dropped_packets_total{lcore=\"1\"} 6") !=
        std::string::npos);
  for (size_t r = 0; r < dataplane::kReasonCount; ++r) {
    const auto reason = static_cast<dataplane::Reason>(r);
    const std::string fate = dataplane::fate_of(reason) == engine::Fate::drop ? "drop" : "forward";
    const std::string series = "netreduce_dataplane_packets_total{fate=\"" + fate + "\",reason=\"" +
                               std::string(dataplane::to_string(reason)) + "\"} " +
                               std::to_string(100 + r);
    INFO(series);
    CHECK(text.find(series) != std::string::npos);
  }
  CHECK(text.find("netreduce_packets_total{fate=\"drop\",reason=\"bad_icrc\"} 2") !=
        std::string::npos);
  CHECK(text.find("netreduce_cell_memory_held_bytes 77") != std::string::npos);
  CHECK(text.find("netreduce_dataplane_up 1") != std::string::npos);
  value = 1000;
#define NETREDUCE_X(name, series, help) \
  CHECK(text.find(std::string(series) + " " + std::to_string(value++) + "\n") != std::string::npos);
  NETREDUCE_DAEMON_COUNTERS(NETREDUCE_X)
#undef NETREDUCE_X

  MetricsInput down;
  const std::string d = render_metrics(down);
  CHECK(d.find("netreduce_dataplane_up 0") != std::string::npos);
  CHECK(d.find("netreduce_ring_") == std::string::npos);
}

namespace {

// A data plane stand-in on a Unix socket: for each accepted connection it
// reads requests line by line and follows the script: "reply" answers
// {"ok":true,"n":<count>}, "close" closes the connection without answering.
class ScriptedPeer {
 public:
  ScriptedPeer(std::string path, std::vector<std::string> script)
      : path_(std::move(path)), script_(std::move(script)) {
    lfd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strncpy(a.sun_path, path_.c_str(), sizeof(a.sun_path) - 1);
    REQUIRE(::bind(lfd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
    REQUIRE(::listen(lfd_, 4) == 0);
    thread_ = std::thread([this] { serve(); });
  }
  ~ScriptedPeer() {
    ::shutdown(lfd_, SHUT_RDWR);
    thread_.join();
    ::close(lfd_);
    ::unlink(path_.c_str());
  }
  int accepted() const { return accepted_; }
  int requests() const { return requests_; }

 private:
  void serve() {
    size_t step = 0;
    while (step < script_.size()) {
      const int c = ::accept(lfd_, nullptr, nullptr);
      if (c < 0) return;
      ++accepted_;
      std::string buf;
      char ch;
      while (step < script_.size() && ::read(c, &ch, 1) == 1) {
        if (ch != '\n') {
          buf += ch;
          continue;
        }
        ++requests_;
        buf.clear();
        if (script_[step++] == "close") break;
        const std::string r = "{\"ok\":true,\"n\":" + std::to_string(requests_) + "}\n";
        REQUIRE(::write(c, r.data(), r.size()) == static_cast<ssize_t>(r.size()));
      }
      ::close(c);
    }
  }
  std::string path_;
  std::vector<std::string> script_;
  int lfd_ = -1;
  std::thread thread_;
  int accepted_ = 0, requests_ = 0;
};

}  // namespace

TEST_CASE("data plane client: a dead kept-open connection is retried once for reads only",
          "[control][client]") {
  const auto dir = temp_dir();
  const std::string sock = (dir / "dp.sock").string();
  SECTION("a read after the peer dropped the connection succeeds on a new one") {
    // reply to the first request, drop the connection on the second (a
    // read: retried on a new connection, where it is answered).
    ScriptedPeer peer(sock, {"reply", "close", "reply"});
    DataplaneClient c(sock, std::chrono::milliseconds(2000));
    json r;
    REQUIRE(c.call(dpcmd::status(), r).ok());
    CHECK(r["n"] == 1);
    const Status s = c.call(dpcmd::stats(), r);
    INFO(s.to_string());
    REQUIRE(s.ok());
    CHECK(r["n"] == 3);
    CHECK(c.connects() == 2);
  }
  SECTION("a change that may have been applied is not sent twice") {
    ScriptedPeer peer(sock, {"reply", "close", "reply"});
    DataplaneClient c(sock, std::chrono::milliseconds(2000));
    json r;
    REQUIRE(c.call(dpcmd::status(), r).ok());
    const Status s = c.call(dpcmd::remove_ring(7), r);
    CHECK(s.code() == StatusCode::unavailable);
    CHECK(s.to_string().find("connection closed") != std::string::npos);
    CHECK(c.connects() == 1);
    // the next call connects again
    REQUIRE(c.call(dpcmd::status(), r).ok());
    CHECK(r["n"] == 3);
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("authorization: a request's role from its bearer token", "[control][auth]") {
  const Tokens both{"op-token-1", "job-token-2"};
  CHECK(role_of("Bearer op-token-1", both) == Role::kOperator);
  CHECK(role_of("Bearer job-token-2", both) == Role::kJob);
  // Not the token: a prefix, an extension, another case, a space too many.
  for (const char* h : {"Bearer op-token-", "Bearer op-token-12", "Bearer OP-TOKEN-1",
                        "Bearer  op-token-1", "Bearer op-token-1 ", "Bearer job-token-", ""})
    CHECK(role_of(h, both) == Role::kAnonymous);
  // Not the bearer scheme as sent.
  for (const char* h : {"bearer op-token-1", "Basic op-token-1", "op-token-1", "Bearer", "Bearer "})
    CHECK(role_of(h, both) == Role::kAnonymous);
  // No jobs' token configured: nothing is a job, an empty token included.
  const Tokens op_only{"op-token-1", ""};
  CHECK(role_of("Bearer op-token-1", op_only) == Role::kOperator);
  CHECK(role_of("Bearer job-token-2", op_only) == Role::kAnonymous);
  CHECK(role_of("Bearer ", op_only) == Role::kAnonymous);
}

TEST_CASE("same_secret: equal strings only, an empty want never", "[control][auth]") {
  CHECK(same_secret("abc", "abc"));
  CHECK_FALSE(same_secret("abd", "abc"));
  CHECK_FALSE(same_secret("ab", "abc"));
  CHECK_FALSE(same_secret("abcabc", "abc"));  // the comparison wraps around `want`
  CHECK_FALSE(same_secret("", "abc"));
  CHECK_FALSE(same_secret("", ""));
  CHECK_FALSE(same_secret("x", ""));
}
