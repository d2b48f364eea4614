// The data plane's YAML configuration loader: the shipped example, defaults,
// every key, every validation rule (each error names the dotted key and the
// problem), and a randomized robustness test over mutations of the example.
#include "dataplane/config.h"

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

using namespace netreduce;
using namespace netreduce::dataplane;

namespace {

const char* const kPorts = "ports:\n  - name: net_ring0\n  - name: net_ring1\n";

std::string example_path() {
  const char* p = std::getenv("NETREDUCE_CONFIG_EXAMPLE");
  return p != nullptr ? p : "config/dataplane.yaml";
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in.good());
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct Parsed {
  Status status;
  DataplaneConfig cfg;
};

Parsed parse(const std::string& text) {
  Parsed p;
  p.status = parse_config(text, "config.yaml", p.cfg);
  return p;
}

// The minimal valid file plus `extra` lines.
Parsed parse_with(const std::string& extra) { return parse(std::string(kPorts) + extra); }

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

void check_error(const Parsed& p, const std::string& field, const std::string& part) {
  INFO("status: " << p.status.to_string());
  CHECK_FALSE(p.status.ok());
  CHECK(p.status.code() != StatusCode::ok);
  CHECK(p.status.field() == field);
  CHECK(contains(p.status.message(), part));
}

}  // namespace

TEST_CASE("the example configuration loads", "[dataplane][config]") {
  DataplaneConfig cfg;
  const Status st = load_config(example_path(), cfg);
  INFO(st.to_string());
  REQUIRE(st.ok());
  CHECK(cfg.eal_args == std::vector<std::string>{"-l", "0-1", "--no-huge", "-m", "1024", "--no-pci",
                                                 "--vdev", "net_ring0", "--vdev", "net_ring1"});
  REQUIRE(cfg.ports.size() == 2);
  CHECK(cfg.ports[0].name == "net_ring0");
  CHECK(cfg.ports[1].name == "net_ring1");
  CHECK(cfg.mtu == 4200);
  CHECK(cfg.rx_desc == 1024);
  CHECK(cfg.tx_desc == 1024);
  CHECK(cfg.burst == 32);
  CHECK(cfg.idle_sleep_max_us == 300);
  CHECK(cfg.idle_after_us == 1000);
  CHECK(cfg.mode == Mode::aggregate);
  CHECK(cfg.workers == std::vector<unsigned>{1});
  CHECK(cfg.mbufs == 32768);
  CHECK(cfg.mbuf_cache == 256);
  CHECK(cfg.engine_memory == 256ull << 20);
  CHECK(cfg.reduce_mode == engine::ReduceMode::deterministic);
  CHECK(cfg.icrc_fixup == engine::IcrcFixup::linear);
  CHECK(cfg.verify_icrc);
  CHECK(cfg.max_rings == 64);
  CHECK(cfg.clt_capacity == 4096);
  CHECK(cfg.stall_timeout_ms == 1000);
  CHECK(cfg.control_socket == "/run/netreduce/dataplane.sock");
  CHECK(cfg.control_socket == DataplaneConfig{}.control_socket);  // the example shows the default
  CHECK(cfg.retire_grace_ms == 60000);
  CHECK(cfg.stalled_forward_ms == 250);
  CHECK(cfg.control_max_clients == 64);
  CHECK(cfg.control_group.empty());
  CHECK(cfg.command_timeout_ms == 1000);
  CHECK(cfg.command_timeout_ms == DataplaneConfig{}.command_timeout_ms);
  // The example shows fault injection off, with the defaults.
  CHECK_FALSE(cfg.faults_enabled);
  CHECK(cfg.faults_max_duration_ms == 600000);
  CHECK(cfg.faults_seed == 1);
  CHECK(cfg.faults_enabled == DataplaneConfig{}.faults_enabled);
  CHECK(cfg.faults_max_duration_ms == DataplaneConfig{}.faults_max_duration_ms);
  CHECK(cfg.faults_seed == DataplaneConfig{}.faults_seed);

  // parse_config on the same text gives the same result.
  DataplaneConfig again;
  REQUIRE(parse_config(read_file(example_path()), "dataplane.yaml", again).ok());
  CHECK(again.eal_args == cfg.eal_args);
  CHECK(again.control_socket == cfg.control_socket);
}

TEST_CASE("omitted keys keep the defaults of config.h", "[dataplane][config]") {
  const DataplaneConfig def;
  for (const std::string& text :
       {std::string(kPorts), std::string(kPorts) + "memory:\nengine:\ncontrol:\neal:\nworkers:\n",
        std::string(kPorts) + "memory: {}\nengine: {}\ncontrol: {}\neal: []\nworkers: []\n"}) {
    INFO(text);
    const Parsed p = parse(text);
    INFO(p.status.to_string());
    REQUIRE(p.status.ok());
    const DataplaneConfig& c = p.cfg;
    CHECK(c.eal_args.empty());
    REQUIRE(c.ports.size() == 2);
    CHECK(c.ports[0].name == "net_ring0");
    CHECK(c.ports[1].name == "net_ring1");
    CHECK(c.mtu == def.mtu);
    CHECK(c.rx_desc == def.rx_desc);
    CHECK(c.tx_desc == def.tx_desc);
    CHECK(c.burst == def.burst);
    CHECK(c.idle_sleep_max_us == def.idle_sleep_max_us);
    CHECK(c.idle_after_us == def.idle_after_us);
    CHECK(c.mode == def.mode);
    CHECK(c.workers.empty());
    CHECK(c.mbufs == def.mbufs);
    CHECK(c.mbuf_cache == def.mbuf_cache);
    CHECK(c.engine_memory == def.engine_memory);
    CHECK(c.reduce_mode == def.reduce_mode);
    CHECK(c.icrc_fixup == def.icrc_fixup);
    CHECK(c.verify_icrc == def.verify_icrc);
    CHECK(c.max_rings == def.max_rings);
    CHECK(c.clt_capacity == def.clt_capacity);
    CHECK(c.stall_timeout_ms == def.stall_timeout_ms);
    CHECK(c.control_socket == def.control_socket);
    CHECK(c.retire_grace_ms == def.retire_grace_ms);
    CHECK(c.control_max_clients == def.control_max_clients);
    CHECK(c.control_group == def.control_group);
    CHECK(c.command_timeout_ms == def.command_timeout_ms);
    CHECK(c.faults_enabled == def.faults_enabled);
    CHECK(c.faults_max_duration_ms == def.faults_max_duration_ms);
    CHECK(c.faults_seed == def.faults_seed);
  }
}

TEST_CASE("every key's value ends in the struct", "[dataplane][config]") {
  const Parsed p = parse(R"(
eal: ["-l", "2-5", "-a", "0000:3b:00.0", "-m", 512]
ports:
  - name: "0000:3b:00.0"
  - name: '0000:3b:00.1'
mtu: 9000
rx_desc: 4096
tx_desc: 64
burst: 256
idle_sleep_max_us: 0
idle_after_us: 250
mode: forward
workers: [3, 2, 5]
memory:
  mbufs: 65536
  mbuf_cache: 512
  engine: 2GiB
engine:
  reduce_mode: accumulate
  icrc_fixup: full
  verify_icrc: false
  max_rings: 1024
  clt_capacity: 16
  stall_timeout_ms: 3600000
rings:
  retire_grace_ms: 86400000
  stalled_forward_ms: 5
control:
  socket: /var/run/nr.sock
  max_clients: 4096
  group: netreduce
  command_timeout_ms: 600000
faults:
  enabled: true
  max_duration_ms: 86400000
  seed: 9223372036854775807
)");
  INFO(p.status.to_string());
  REQUIRE(p.status.ok());
  const DataplaneConfig& c = p.cfg;
  CHECK(c.eal_args == std::vector<std::string>{"-l", "2-5", "-a", "0000:3b:00.0", "-m", "512"});
  REQUIRE(c.ports.size() == 2);
  CHECK(c.ports[0].name == "0000:3b:00.0");
  CHECK(c.ports[1].name == "0000:3b:00.1");
  CHECK(c.mtu == 9000);
  CHECK(c.rx_desc == 4096);
  CHECK(c.tx_desc == 64);
  CHECK(c.burst == 256);
  CHECK(c.idle_sleep_max_us == 0);
  CHECK(c.idle_after_us == 250);
  CHECK(c.mode == Mode::forward);
  CHECK(c.workers == std::vector<unsigned>{3, 2, 5});
  CHECK(c.mbufs == 65536);
  CHECK(c.mbuf_cache == 512);
  CHECK(c.engine_memory == 2ull << 30);
  CHECK(c.reduce_mode == engine::ReduceMode::accumulate);
  CHECK(c.icrc_fixup == engine::IcrcFixup::full);
  CHECK_FALSE(c.verify_icrc);
  CHECK(c.max_rings == 1024);
  CHECK(c.clt_capacity == 16);
  CHECK(c.stall_timeout_ms == 3600000);
  CHECK(c.control_socket == "/var/run/nr.sock");
  CHECK(c.retire_grace_ms == 86400000);
  CHECK(c.stalled_forward_ms == 5);
  CHECK(c.control_max_clients == 4096);
  CHECK(c.control_group == "netreduce");
  CHECK(c.command_timeout_ms == 600000);
  CHECK(c.faults_enabled);
  CHECK(c.faults_max_duration_ms == 86400000);
  CHECK(c.faults_seed == 9223372036854775807ull);

  // The other enumerators, and the range ends.
  const Parsed q = parse_with(
      "mode: aggregate\nmtu: 1500\nburst: 1\nworkers: [0, 1023]\n"
      "memory: {mbufs: 1024, mbuf_cache: 0, engine: 1}\n"
      "rings: {retire_grace_ms: 1000}\n"
      "engine: {reduce_mode: deterministic, icrc_fixup: linear, verify_icrc: true, max_rings: 1,"
      " clt_capacity: 1048576, stall_timeout_ms: 1}\n");
  INFO(q.status.to_string());
  REQUIRE(q.status.ok());
  CHECK(q.cfg.mode == Mode::aggregate);
  CHECK(q.cfg.mtu == 1500);
  CHECK(q.cfg.burst == 1);
  CHECK(q.cfg.workers == std::vector<unsigned>{0, 1023});
  CHECK(q.cfg.mbufs == 1024);
  CHECK(q.cfg.mbuf_cache == 0);
  CHECK(q.cfg.engine_memory == 1);
  CHECK(q.cfg.reduce_mode == engine::ReduceMode::deterministic);
  CHECK(q.cfg.icrc_fixup == engine::IcrcFixup::linear);
  CHECK(q.cfg.verify_icrc);
  CHECK(q.cfg.max_rings == 1);
  CHECK(q.cfg.clt_capacity == 1048576);
  CHECK(q.cfg.stall_timeout_ms == 1);
  CHECK(q.cfg.retire_grace_ms == 1000);
}

TEST_CASE("memory.engine sizes", "[dataplane][config]") {
  const std::pair<const char*, uint64_t> cases[] = {
      {"1", 1},
      {"4096", 4096},
      {"4K", 4ull << 10},
      {"4KiB", 4ull << 10},
      {"3M", 3ull << 20},
      {"3MiB", 3ull << 20},
      {"2G", 2ull << 30},
      {"2GiB", 2ull << 30},
      {"16 MiB", 16ull << 20},
      {"\"64MiB\"", 64ull << 20},
      {"17179869183G", 17179869183ull << 30},
  };
  for (const auto& [text, bytes] : cases) {
    INFO(text);
    const Parsed p = parse_with(std::string("memory:\n  engine: ") + text + "\n");
    INFO(p.status.to_string());
    REQUIRE(p.status.ok());
    CHECK(p.cfg.engine_memory == bytes);
  }
}

TEST_CASE("every rule names the dotted key and the problem", "[dataplane][config]") {
  struct Case {
    const char* extra;  // appended to the two valid ports
    const char* field;
    const char* part;  // must appear in the message
  };
  const Case cases[] = {
      // Unknown keys, at every level, with the known ones listed.
      {"mtus: 4200\n", "mtus", "unknown key (known: eal, ports, mtu,"},
      {"mtus: 4200\n", "mtus", "did you mean 'mtu'"},
      {"engine:\n  reduse_mode: deterministic\n", "engine.reduse_mode",
       "unknown key (known: reduce_mode, icrc_fixup, verify_icrc, max_rings, clt_capacity, "
       "stall_timeout_ms)"},
      {"engine:\n  reduse_mode: deterministic\n", "engine.reduse_mode",
       "did you mean 'reduce_mode'"},
      {"memory:\n  pool: 5\n", "memory.pool", "unknown key (known: mbufs, mbuf_cache, engine)"},
      {"control:\n  path: /x\n", "control.path",
       "unknown key (known: socket, max_clients, group, command_timeout_ms)"},
      {"control:\n  command_timeout_ms: 5\n", "control.command_timeout_ms", "10"},
      {"faults:\n  enable: true\n", "faults.enable",
       "unknown key (known: enabled, max_duration_ms, seed)"},
      {"faults:\n  enabled: yes\n", "faults.enabled", "true or false"},
      {"faults:\n  max_duration_ms: 0\n", "faults.max_duration_ms", "1..86400000"},
      {"faults:\n  max_duration_ms: 86400001\n", "faults.max_duration_ms", "1..86400000"},
      {"faults:\n  seed: -1\n", "faults.seed", "must be"},
      {"faults: on\n", "faults", "must be a mapping"},
      {"mtu: 4200\nmtu: 9000\n", "mtu", "given twice"},
      {"engine:\n  max_rings: 4\n  max_rings: 5\n", "engine.max_rings", "given twice"},
      {"[a]: 1\n", "", "keys must be plain names"},
      // Wrong types.
      {"mtu: big\n", "mtu", "must be an integer, got 'big'"},
      {"mtu: 4200.5\n", "mtu", "must be an integer"},
      {"mtu: 0x1068\n", "mtu", "must be an integer"},
      {"mtu: [4200]\n", "mtu", "got a list"},
      {"mtu:\n", "mtu", "got nothing"},
      {"burst: {a: 1}\n", "burst", "got a mapping"},
      {"rx_desc: many\n", "rx_desc", "must be an integer"},
      {"mode: fast\n", "mode", "must be aggregate or forward, got 'fast'"},
      {"idle_sleep_max_us: -1\n", "idle_sleep_max_us", "0..100000"},
      {"idle_sleep_max_us: 100001\n", "idle_sleep_max_us", "0..100000"},
      {"idle_sleep_max_us: soon\n", "idle_sleep_max_us", "must be an integer"},
      {"idle_after_us: 10000001\n", "idle_after_us", "0..10000000"},
      {"mode: [aggregate]\n", "mode", "aggregate or forward"},
      {"workers: 1\n", "workers", "must be a list of lcore ids"},
      {"workers: [one]\n", "workers[0]", "must be an integer, got 'one'"},
      {"eal: -l 0-1\n", "eal", "must be a list"},
      {"eal: [\"-l\", [0, 1]]\n", "eal[1]", "got a list"},
      {"eal: [\"a\\0b\"]\n", "eal[0]", "NUL"},
      {"memory: 5\n", "memory", "must be a mapping"},
      {"memory:\n  mbufs: lots\n", "memory.mbufs", "must be an integer"},
      {"memory:\n  mbuf_cache: []\n", "memory.mbuf_cache", "got a list"},
      {"engine: deterministic\n", "engine", "must be a mapping"},
      {"engine:\n  reduce_mode: fast\n", "engine.reduce_mode",
       "must be deterministic or accumulate, got 'fast'"},
      {"engine:\n  icrc_fixup: partial\n", "engine.icrc_fixup",
       "must be linear or full, got 'partial'"},
      {"engine:\n  verify_icrc: maybe\n", "engine.verify_icrc",
       "must be true or false, got 'maybe'"},
      {"engine:\n  verify_icrc: 1\n", "engine.verify_icrc", "must be true or false"},
      {"engine:\n  max_rings: x\n", "engine.max_rings", "must be an integer"},
      {"engine:\n  clt_capacity: 1.5\n", "engine.clt_capacity", "must be an integer"},
      {"engine:\n  stall_timeout_ms: soon\n", "engine.stall_timeout_ms", "must be an integer"},
      {"control:\n  socket: [a]\n", "control.socket", "got a list"},
      {"control: /tmp/x.sock\n", "control", "must be a mapping"},
      // Out of range: the message names the range.
      {"mtu: 1499\n", "mtu", "must be in 1500..9600, got 1499"},
      {"mtu: 9601\n", "mtu", "must be in 1500..9600, got 9601"},
      {"mtu: -1\n", "mtu", "must be in 1500..9600, got -1"},
      {"mtu: 99999999999999999999999\n", "mtu", "must be in 1500..9600"},
      {"rx_desc: 1000\n", "rx_desc", "must be a power of two in 64..16384, got 1000"},
      {"rx_desc: 32\n", "rx_desc", "must be in 64..16384, got 32"},
      {"tx_desc: 32768\n", "tx_desc", "must be in 64..16384, got 32768"},
      {"tx_desc: 96\n", "tx_desc", "must be a power of two in 64..16384"},
      {"burst: 0\n", "burst", "must be in 1..256, got 0"},
      {"burst: 257\n", "burst", "must be in 1..256, got 257"},
      {"workers: [1, 1024]\n", "workers[1]", "must be in 0..1023, got 1024"},
      {"workers: [-1]\n", "workers[0]", "must be in 0..1023, got -1"},
      {"workers: [1, 2, 1]\n", "workers[2]", "duplicate lcore 1 (also workers[0])"},
      {"memory:\n  mbufs: 1023\n", "memory.mbufs", "must be in 1024..4294967295, got 1023"},
      {"memory:\n  mbufs: 4294967296\n", "memory.mbufs", "must be in 1024..4294967295"},
      {"memory:\n  mbuf_cache: 513\n", "memory.mbuf_cache", "must be in 0..512, got 513"},
      {"memory:\n  mbufs: 2048\n  mbuf_cache: 513\n", "memory.mbuf_cache", "0..512"},
      {"memory:\n  mbufs: 2048\n  mbuf_cache: 600\n", "memory.mbuf_cache", "0..512"},
      {"memory:\n  mbufs: 2000\n  mbuf_cache: 501\n", "memory.mbuf_cache",
       "must be at most memory.mbufs / 4 (500)"},
      {"memory:\n  mbufs: 1024\n  mbuf_cache: 257\n", "memory.mbuf_cache",
       "must be at most memory.mbufs / 4 (256), got 257"},
      {"memory:\n  engine: 0\n", "memory.engine", "must be greater than 0"},
      {"memory:\n  engine: 0MiB\n", "memory.engine", "must be greater than 0"},
      {"memory:\n  engine: -5MiB\n", "memory.engine", "must be greater than 0"},
      {"memory:\n  engine: 256MB\n", "memory.engine", "unknown size suffix 'MB'"},
      {"memory:\n  engine: 256mib\n", "memory.engine", "unknown size suffix 'mib'"},
      {"memory:\n  engine: 1TiB\n", "memory.engine", "unknown size suffix"},
      {"memory:\n  engine: 1.5GiB\n", "memory.engine", "unknown size suffix"},
      {"memory:\n  engine: lots\n", "memory.engine", "must be a size in bytes"},
      {"memory:\n  engine: 17179869184GiB\n", "memory.engine", "too large"},
      {"memory:\n  engine: 99999999999999999999999\n", "memory.engine", "too large"},
      {"memory:\n  engine: [1]\n", "memory.engine", "got a list"},
      {"engine:\n  max_rings: 0\n", "engine.max_rings", "must be in 1..1024, got 0"},
      {"engine:\n  max_rings: 1025\n", "engine.max_rings", "must be in 1..1024, got 1025"},
      {"engine:\n  clt_capacity: 15\n", "engine.clt_capacity", "must be in 16..1048576, got 15"},
      {"engine:\n  clt_capacity: 1048577\n", "engine.clt_capacity", "must be in 16..1048576"},
      {"engine:\n  stall_timeout_ms: 0\n", "engine.stall_timeout_ms",
       "must be in 1..3600000, got 0"},
      {"engine:\n  stall_timeout_ms: 3600001\n", "engine.stall_timeout_ms",
       "must be in 1..3600000"},
      {"control:\n  socket: run/x.sock\n", "control.socket",
       "must be an absolute path, got 'run/x.sock'"},
      {"control:\n  socket: \"\"\n", "control.socket", "empty"},
      {"control:\n  socket:\n", "control.socket", "got nothing"},
      {"control:\n  socket: "
       "/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
       "aaaaaaaaaaaaaaaaa\n",
       "control.socket", "at most 107 bytes"},
      {"rings:\n  grace: 5\n", "rings.grace",
       "unknown key (known: retire_grace_ms, stalled_forward_ms)"},
      {"rings:\n  retire_grace_ms: -1\n", "rings.retire_grace_ms", "must be in 1000..86400000"},
      {"rings:\n  retire_grace_ms: 0\n", "rings.retire_grace_ms",
       "must be in 1000..86400000, got 0"},
      {"rings:\n  retire_grace_ms: 999\n", "rings.retire_grace_ms", "must be in 1000..86400000"},
      {"rings:\n  retire_grace_ms: 86400001\n", "rings.retire_grace_ms",
       "must be in 1000..86400000"},
      {"control:\n  max_clients: 0\n", "control.max_clients", "must be in 1..4096, got 0"},
      {"control:\n  max_clients: 4097\n", "control.max_clients", "must be in 1..4096"},
      {"control:\n  group: \"\"\n", "control.group", "empty"},
      {"control:\n  group: [a]\n", "control.group", "got a list"},
      {"control:\n  group: \"a b\"\n", "control.group", "a group name or a numeric gid"},
      {"control:\n  group: 99999999999\n", "control.group", "numeric gid out of range"},
  };
  for (const auto& c : cases) {
    INFO("extra: " << c.extra);
    check_error(parse_with(c.extra), c.field, c.part);
  }
}

TEST_CASE("ports: required, exactly two, each a non-empty distinct name", "[dataplane][config]") {
  check_error(parse("mtu: 4200\n"), "ports", "required key missing");
  check_error(parse("ports:\n  - name: a\n"), "ports", "exactly 2 ports");
  check_error(parse("ports:\n  - name: a\n  - name: b\n  - name: c\n"), "ports", "exactly 2 ports");
  CHECK(
      contains(parse("ports:\n  - name: a\n  - name: b\n  - name: c\n").status.message(), "got 3"));
  check_error(parse("ports: []\n"), "ports", "got 0");
  check_error(parse("ports:\n"), "ports", "got nothing");
  check_error(parse("ports: net_ring0\n"), "ports", "must be a list");
  check_error(parse("ports:\n  - net_ring0\n  - net_ring1\n"), "ports[0]",
              "must be a mapping with 'name'");
  check_error(parse("ports:\n  - name: a\n  - {}\n"), "ports[1].name", "required key missing");
  check_error(parse("ports:\n  - name: a\n  - name: \"\"\n"), "ports[1].name", "empty");
  check_error(parse("ports:\n  - name: a\n  - name:\n"), "ports[1].name", "got nothing");
  check_error(parse("ports:\n  - name: a\n  - name: [b]\n"), "ports[1].name", "got a list");
  check_error(parse("ports:\n  - name: a\n  - name: b\n    speed: 100G\n"), "ports[1].speed",
              "unknown key (known: name)");
  check_error(parse("ports:\n  - name: a\n  - name: a\n"), "ports[1].name",
              "same device as ports[0]");
}

TEST_CASE("syntax errors report origin, line and column", "[dataplane][config]") {
  // Line 3 opens a flow sequence that is never closed; yaml-cpp notices on
  // line 4.
  Parsed p = parse("mtu: 4200\nports:\n  - name: [a\n  - name: b\n");
  INFO(p.status.to_string());
  CHECK_FALSE(p.status.ok());
  CHECK(p.status.field().empty());
  CHECK(p.status.message().rfind("config.yaml:4:9: ", 0) == 0);
  CHECK(contains(p.status.message(), "end of sequence flow not found"));

  // A bad indentation on line 4.
  p = parse("mtu: 4200\nports:\n  - name: a\n - name: b\n");
  INFO(p.status.to_string());
  CHECK_FALSE(p.status.ok());
  CHECK(p.status.field().empty());
  CHECK(p.status.message().rfind("config.yaml:4:", 0) == 0);

  // A stray comma after the document (yaml-cpp 0.7 would loop on it).
  p = parse("ports:\n  - name: a\n  - name: b\n,\n");
  INFO(p.status.to_string());
  CHECK_FALSE(p.status.ok());
  CHECK(p.status.message().rfind("config.yaml:4:1:", 0) == 0);

  // A value indented under a scalar on line 3.
  p = parse("mtu: 4200\nburst: 32\n  x: 1\n");
  INFO(p.status.to_string());
  CHECK_FALSE(p.status.ok());
  CHECK(p.status.message().rfind("config.yaml:3:", 0) == 0);

  // The origin is whatever the caller names.
  DataplaneConfig cfg;
  const Status st = parse_config("a: [\n", "/etc/netreduce/dataplane.yaml", cfg);
  CHECK(st.message().rfind("/etc/netreduce/dataplane.yaml:", 0) == 0);
}

TEST_CASE("empty and non-mapping documents are refused", "[dataplane][config]") {
  for (const char* text : {"", "\n\n", "# only a comment\n", "---\n", "~\n", "null\n"}) {
    INFO("text: " << text);
    const Parsed p = parse(text);
    CHECK_FALSE(p.status.ok());
    CHECK(contains(p.status.message(), "config.yaml"));
    CHECK(contains(p.status.message(), "empty"));
  }
  for (const char* text : {"- a\n- b\n", "hello\n", "42\n"}) {
    INFO("text: " << text);
    const Parsed p = parse(text);
    CHECK_FALSE(p.status.ok());
    CHECK(contains(p.status.message(), "top level must be a mapping"));
  }
  const Parsed two = parse(std::string(kPorts) + "---\n" + kPorts);
  CHECK_FALSE(two.status.ok());
  CHECK(two.status.message().rfind("config.yaml:4:1: content after the end of the document", 0) ==
        0);
  for (const char* text : {",\n", ",", "ports: [{name: a}, {name: b}]\n...\n,\n", "- a\n,\n"}) {
    INFO("text: " << text);
    const Parsed p = parse(text);
    CHECK_FALSE(p.status.ok());
    CHECK(contains(p.status.message(), "content after the end of the document"));
  }
}

TEST_CASE("load_config names the path of a file it cannot read", "[dataplane][config]") {
  DataplaneConfig cfg;
  const std::string missing = "/nonexistent-netreduce-dir/dataplane.yaml";
  Status st = load_config(missing, cfg);
  CHECK_FALSE(st.ok());
  CHECK(st.code() == StatusCode::not_found);
  CHECK(contains(st.message(), missing));
  CHECK(contains(st.message(), "No such file"));

  st = load_config("/", cfg);  // a directory: opens, cannot be read
  CHECK_FALSE(st.ok());
  CHECK(contains(st.message(), "/"));

  // Errors inside a file come with the key; syntax errors with the path.
  char tmpl[] = "/tmp/netreduce-config-test-XXXXXX";
  const int fd = mkstemp(tmpl);
  REQUIRE(fd >= 0);
  const std::string path = tmpl;
  {
    std::FILE* f = fdopen(fd, "w");
    REQUIRE(f != nullptr);
    std::fputs("ports:\n  - name: a\n  - name: b\nmtu: [\n", f);
    std::fclose(f);
  }
  st = load_config(path, cfg);
  std::remove(path.c_str());
  CHECK_FALSE(st.ok());
  CHECK(st.message().rfind(path + ":", 0) == 0);
}

TEST_CASE("a refused configuration leaves the output untouched", "[dataplane][config]") {
  DataplaneConfig cfg;
  cfg.mtu = 1234;
  cfg.control_socket = "/keep";
  const Status st = parse_config(std::string(kPorts) + "mtu: 9000\nburst: 0\n", "c.yaml", cfg);
  CHECK_FALSE(st.ok());
  CHECK(cfg.mtu == 1234);
  CHECK(cfg.control_socket == "/keep");
  CHECK(cfg.ports.empty());
}

TEST_CASE("aliases and odd YAML do not crash or loop", "[dataplane][config]") {
  const char* texts[] = {
      "ports: &p [*p, *p]\n",
      "ports:\n  - &a {name: *a}\n  - name: b\n",
      "workers: &w [*w]\nports: [{name: a}, {name: b}]\n",
      "memory: &m {mbufs: 2048}\nengine: *m\nports: [{name: a}, {name: b}]\n",
      "? [a, b]\n: c\n",
      "!!binary aGVsbG8=\n",
      "ports: [{name: a}, {name: b}]\nmtu: !!str 4200\n",
      "{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{\n",
  };
  for (const char* text : texts) {
    INFO(text);
    Parsed p;
    CHECK_NOTHROW(p = parse(text));
    CHECK((p.status.ok() || !p.status.message().empty()));
  }
  // Deep nesting is refused by yaml-cpp's depth guard, not by the stack.
  const std::string deep = "ports: " + std::string(5000, '[') + std::string(5000, ']') + "\n";
  Parsed p;
  CHECK_NOTHROW(p = parse(deep));
  CHECK_FALSE(p.status.ok());
}

namespace {

// Checks every rule on a configuration that was accepted.
bool valid(const DataplaneConfig& c) {
  if (c.ports.size() != 2 || c.ports[0].name.empty() || c.ports[1].name.empty()) return false;
  if (c.ports[0].name == c.ports[1].name) return false;
  if (c.mtu < 1500 || c.mtu > 9600) return false;
  for (const unsigned d : {unsigned{c.rx_desc}, unsigned{c.tx_desc}}) {
    if (d < 64 || d > 16384 || (d & (d - 1)) != 0) return false;
  }
  if (c.burst < 1 || c.burst > 256) return false;
  for (size_t i = 0; i < c.workers.size(); ++i) {
    if (c.workers[i] > 1023) return false;
    for (size_t j = 0; j < i; ++j) {
      if (c.workers[i] == c.workers[j]) return false;
    }
  }
  if (c.mbufs < 1024 || c.mbuf_cache > 512 || c.mbuf_cache > c.mbufs / 4) return false;
  if (c.engine_memory == 0) return false;
  if (c.max_rings < 1 || c.max_rings > 1024) return false;
  if (c.clt_capacity < 16 || c.clt_capacity > 1048576) return false;
  if (c.stall_timeout_ms < 1 || c.stall_timeout_ms > 3600000) return false;
  if (c.retire_grace_ms < kMinRetireGraceMs || c.retire_grace_ms > 86400000) return false;
  if (c.control_socket.empty() || c.control_socket[0] != '/') return false;
  if (c.control_max_clients < 1 || c.control_max_clients > 4096) return false;
  return true;
}

std::vector<std::string> split_lines(const std::string& s) {
  std::vector<std::string> lines;
  size_t at = 0;
  while (at < s.size()) {
    const size_t nl = s.find('\n', at);
    const size_t end = nl == std::string::npos ? s.size() : nl + 1;
    lines.push_back(s.substr(at, end - at));
    at = end;
  }
  return lines;
}

std::string join_lines(const std::vector<std::string>& lines) {
  std::string s;
  for (const auto& l : lines) s += l;
  return s;
}

std::string mutate(std::string text, std::mt19937_64& rng) {
  static const char kChars[] = ":-[]{}&*!|>\"'#%@`,?~ \t\n\r\\0123456789abcdefxyzKMGi.";
  static const char* const kTokens[] = {"0",
                                        "1",
                                        "-1",
                                        "64",
                                        "1023",
                                        "1024",
                                        "4096",
                                        "65536",
                                        "4294967295",
                                        "4294967296",
                                        "18446744073709551616",
                                        "99999999999999999999999999",
                                        "-9223372036854775808",
                                        "1.5",
                                        "1e9",
                                        "0x40",
                                        "0o17",
                                        "+7",
                                        "true",
                                        "false",
                                        "yes",
                                        "~",
                                        "null",
                                        "\"\"",
                                        "''",
                                        "[]",
                                        "{}",
                                        "[1, 1]",
                                        "[a, [b]]",
                                        "{a: 1}",
                                        "&a x",
                                        "*a",
                                        "*undefined",
                                        "!!str 5",
                                        "!!int x",
                                        "256MiB",
                                        "1GiB",
                                        "17179869184GiB",
                                        "0K",
                                        "5MB",
                                        "| \n  text",
                                        "> \n  folded",
                                        "\"\\0\"",
                                        "\"\\x00\"",
                                        "/abs/path",
                                        "rel/path",
                                        "aggregate",
                                        "forward",
                                        "accumulate",
                                        "full",
                                        "linear",
                                        "net_ring0",
                                        "\"0000:3b:00.0\"",
                                        "deterministic",
                                        "\xff\xfe",
                                        "\"\\u00e9\""};
  const int n = 1 + static_cast<int>(rng() % 4);
  for (int m = 0; m < n; ++m) {
    auto pick = [&](size_t bound) {
      return bound == 0 ? size_t{0} : static_cast<size_t>(rng() % bound);
    };
    switch (rng() % 9) {
      case 0:  // delete characters
        if (!text.empty()) {
          const size_t at = pick(text.size());
          text.erase(at, 1 + pick(4));
        }
        break;
      case 1:  // insert a character (sometimes an arbitrary byte)
        text.insert(
            pick(text.size() + 1), 1,
            rng() % 8 == 0 ? static_cast<char>(rng() % 256) : kChars[pick(sizeof kChars - 1)]);
        break;
      case 2:  // duplicate a run of characters
        if (!text.empty()) {
          const size_t at = pick(text.size());
          text.insert(at, text.substr(at, 1 + pick(16)));
        }
        break;
      case 3: {  // delete a line
        auto lines = split_lines(text);
        if (!lines.empty()) lines.erase(lines.begin() + static_cast<long>(pick(lines.size())));
        text = join_lines(lines);
        break;
      }
      case 4: {  // duplicate a line
        auto lines = split_lines(text);
        if (!lines.empty()) {
          const size_t i = pick(lines.size());
          lines.insert(lines.begin() + static_cast<long>(pick(lines.size() + 1)), lines[i]);
        }
        text = join_lines(lines);
        break;
      }
      case 5: {  // swap two lines
        auto lines = split_lines(text);
        if (lines.size() > 1) std::swap(lines[pick(lines.size())], lines[pick(lines.size())]);
        text = join_lines(lines);
        break;
      }
      case 6:
      case 7: {  // replace the value of a key (or a list item) with a token
        auto lines = split_lines(text);
        std::vector<size_t> with_value;
        for (size_t i = 0; i < lines.size(); ++i) {
          const auto colon = lines[i].find(": ");
          const auto first = lines[i].find_first_not_of(' ');
          if (colon != std::string::npos && lines[i][first] != '#') with_value.push_back(i);
        }
        if (!with_value.empty()) {
          std::string& l = lines[with_value[pick(with_value.size())]];
          const auto colon = l.find(": ");
          l = l.substr(0, colon + 2) + kTokens[pick(std::size(kTokens))] + "\n";
        }
        text = join_lines(lines);
        break;
      }
      case 8: {  // change a line's indentation
        auto lines = split_lines(text);
        if (!lines.empty()) {
          std::string& l = lines[pick(lines.size())];
          if (rng() % 2 == 0) {
            l.insert(0, 1 + pick(3), ' ');
          } else {
            l.erase(0, std::min(l.find_first_not_of(' '), 1 + pick(3)));
          }
        }
        text = join_lines(lines);
        break;
      }
    }
  }
  return text;
}

}  // namespace

// NETREDUCE_CONFIG_FUZZ_ITERATIONS and NETREDUCE_CONFIG_FUZZ_SEED override the
// defaults (20000, fixed seed) for longer runs by hand.
TEST_CASE("random mutations of the example (20000) never throw or crash", "[dataplane][config]") {
  const std::string base = read_file(example_path());
  const char* env_iterations = std::getenv("NETREDUCE_CONFIG_FUZZ_ITERATIONS");
  const char* env_seed = std::getenv("NETREDUCE_CONFIG_FUZZ_SEED");
  const long iterations = env_iterations != nullptr ? std::atol(env_iterations) : 20000;
  const unsigned long long seed =
      env_seed != nullptr ? std::strtoull(env_seed, nullptr, 10) : 20261122;
  std::mt19937_64 rng(seed);
  long accepted = 0;
  long refused = 0;
  for (long i = 0; i < iterations; ++i) {
    const std::string text = mutate(base, rng);
    DataplaneConfig cfg;
    Status st;
    try {
      st = parse_config(text, "dataplane.yaml", cfg);
    } catch (...) {
      INFO("seed " << seed << ", iteration " << i << ", text:\n" << text);
      FAIL("parse_config threw");
    }
    if (st.ok()) {
      ++accepted;
      if (!valid(cfg)) {
        INFO("seed " << seed << ", iteration " << i << ", text:\n" << text);
        FAIL("accepted a configuration that breaks a rule");
      }
    } else {
      ++refused;
      if (st.message().empty() || st.code() == StatusCode::internal) {
        INFO("seed " << seed << ", iteration " << i << ", status " << st.to_string() << ", text:\n"
                     << text);
        FAIL("refused without a message, or with an internal error");
      }
    }
  }
  // Both outcomes happen: the mutations are neither all harmless nor all fatal.
  INFO("accepted " << accepted << ", refused " << refused);
  CHECK(accepted > iterations / 20);
  CHECK(refused > iterations / 20);
}
