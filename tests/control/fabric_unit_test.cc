// The fabric section of netreduced.yaml (every error names its key) and the
// tree computation (control/fabric.h): each involved box's tree JSON against
// the expected JSON written out by hand here.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "common/ring_json.h"
#include "control/config.h"
#include "control/fabric.h"
#include "control/state.h"
#include "engine/engine_json.h"

using namespace netreduce;
using namespace netreduce::control;
using nlohmann::json;

namespace {

// spine (root, a rack of its own) -> leafA, leafB, inner -> leafC.
const std::string kFabric = R"(
auth: {token_file: /tmp/t}
fabric:
  self: leafA
  etcd: {endpoints: ["http://10.0.0.100:2379", "http://etcd-b:2379"], timeout_ms: 700}
  boxes:
    - {name: spine, daemon: "http://10.0.0.9:7470", b2b_ip: 10.8.0.9, b2b_mac: "02:00:00:00:08:09",
       parent: none, ports: {leafA: a, leafB: b, inner: b}}
    - {name: leafA, daemon: "http://10.0.0.1:7470", b2b_ip: 10.8.0.1, b2b_mac: "02:00:00:00:08:01",
       parent: spine, port_to_parent: b}
    - {name: leafB, daemon: "http://10.0.0.2:7470", b2b_ip: 10.8.0.2, b2b_mac: "02:00:00:00:08:02",
       parent: spine, port_to_parent: a}
    - {name: inner, daemon: "http://10.0.0.4:7470", b2b_ip: 10.8.0.4, b2b_mac: "02:00:00:00:08:04",
       parent: spine, port_to_parent: b, ports: {leafC: a}}
    - {name: leafC, daemon: "http://10.0.0.3:7470", b2b_ip: 10.8.0.3, b2b_mac: "02:00:00:00:08:03",
       parent: inner, port_to_parent: b}
  racks:
    - {leaf: leafA, workers: [10.1.0.0/24]}
    - {leaf: leafB, workers: [10.2.0.0/24, 10.22.0.0/16]}
    - {leaf: leafC, workers: [10.3.0.0/24]}
    - {leaf: spine, workers: [10.9.0.0/24]}
)";

FabricConfig fabric() {
  DaemonConfig cfg;
  const Status s = parse_daemon_config(kFabric, "test.yaml", cfg);
  INFO(s.to_string());
  REQUIRE(s.ok());
  REQUIRE(cfg.fabric.has_value());
  return *cfg.fabric;
}

std::string error_of(const std::string& yaml) {
  DaemonConfig cfg;
  const Status s = parse_daemon_config(yaml, "test.yaml", cfg);
  REQUIRE_FALSE(s.ok());
  return s.to_string();
}

std::string replaced(std::string s, const std::string& from, const std::string& to) {
  const size_t at = s.find(from);
  REQUIRE(at != std::string::npos);
  return s.replace(at, from.size(), to);
}

engine::RingSpec ring(std::initializer_list<const char*> members) {
  json j = {{"id", 7},
            {"members", json::array()},
            {"msg_len", 4},
            {"window", 4},
            {"payload_bytes", 1024}};
  for (const char* m : members) j["members"].push_back(m);
  engine::RingSpec spec;
  REQUIRE(ring_from_json(j, spec).ok());
  return spec;
}

TreeSecret secret() {
  TreeSecret t;
  t.epoch = 0xE90C4;
  for (size_t i = 0; i < t.key.size(); ++i) t.key[i] = static_cast<uint8_t>(0xA0 + i);
  return t;
}

// box name -> its "tree" JSON (null: a plain ring), without the
// installation's epoch and key, checked here to be the secret's on every box.
json trees_of(const engine::RingSpec& spec) {
  std::vector<FabricEntry> entries;
  const Status s = compute_fabric_entries(spec, fabric(), secret(), entries);
  INFO(s.to_string());
  REQUIRE(s.ok());
  json out = json::object();
  for (const FabricEntry& e : entries) {
    const json j = fabric_entry_json(spec, e);
    out[e.box] = j.contains("tree") ? j["tree"] : json();
    if (j.contains("tree")) {
      CHECK(e.tree->epoch == secret().epoch);
      CHECK(e.tree->key == secret().key);
      CHECK(out[e.box]["epoch"] == secret().epoch);
      CHECK(out[e.box]["key"] ==
            "a0a1a2a3a4a5a6a7a8a9aaabacadaeafb0b1b2b3b4b5b6b7b8b9babbbcbdbebf");
      out[e.box].erase("epoch");
      out[e.box].erase("key");
    }
    json rest = j;
    rest.erase("tree");
    CHECK(rest == ring_to_json(spec));
  }
  return out;
}

}  // namespace

TEST_CASE("fabric config: the boxes, racks and self as written", "[control][fabric]") {
  const FabricConfig fc = fabric();
  CHECK(fc.self == "leafA");
  CHECK(fc.etcd_endpoints ==
        std::vector<std::string>{"http://10.0.0.100:2379", "http://etcd-b:2379"});
  CHECK(fc.etcd_timeout_ms == 700);
  CHECK(fc.etcd_prefix == "/netreduce/");  // the default
  REQUIRE(fc.boxes.size() == 5);
  CHECK(fc.boxes[0].parent.empty());
  CHECK(fc.boxes[0].daemon == "http://10.0.0.9:7470");
  CHECK(fc.boxes[3].ports == std::vector<std::pair<std::string, std::string>>{{"leafC", "a"}});
  REQUIRE(fc.racks.size() == 4);
  CHECK(fc.racks[1].workers.size() == 2);
  DaemonConfig plain;
  REQUIRE(parse_daemon_config("auth: {token_file: /tmp/t}\n", "t.yaml", plain).ok());
  CHECK_FALSE(plain.fabric.has_value());  // no section: a single box, as always
}

TEST_CASE("fabric config errors name the key", "[control][fabric]") {
  const std::string f = kFabric;
  CHECK_THAT(error_of(replaced(f, "self: leafA", "self: leafZ")),
             Catch::Contains("fabric.self") && Catch::Contains("leafZ"));
  CHECK_THAT(error_of(replaced(f, "self: leafA", "self: leafA\n  colour: red")),
             Catch::Contains("fabric.colour") && Catch::Contains("unknown key"));
  // The daemons share their rings through etcd: its section is required, and the token of
  // daemon-to-daemon calls is refused by name.
  const std::string etcd_line =
      "  etcd: {endpoints: [\"http://10.0.0.100:2379\", \"http://etcd-b:2379\"], timeout_ms: "
      "700}\n";
  CHECK_THAT(error_of(replaced(f, etcd_line, "")), Catch::Contains("fabric.etcd"));
  CHECK_THAT(error_of(replaced(f, etcd_line, etcd_line + "  token_file: /tmp/fabric-token\n")),
             Catch::Contains("fabric.token_file") && Catch::Contains("etcd"));
  CHECK_THAT(error_of(replaced(f, "\"http://etcd-b:2379\"", "\"etcd-b:2379\"")),
             Catch::Contains("fabric.etcd.endpoints[1]"));
  CHECK_THAT(error_of(replaced(f, etcd_line, "  etcd: {endpoints: []}\n")),
             Catch::Contains("fabric.etcd.endpoints"));
  CHECK_THAT(error_of(replaced(f, "timeout_ms: 700", "timeout_ms: 10")),
             Catch::Contains("fabric.etcd.timeout_ms"));
  CHECK_THAT(error_of(replaced(f, "timeout_ms: 700", "timeout_ms: 700, prefix: netreduce")),
             Catch::Contains("fabric.etcd.prefix"));
  CHECK_THAT(error_of(replaced(f, "name: leafC", "name: leaf/C")),
             Catch::Contains("fabric.boxes[4].name") && Catch::Contains("letters"));
  CHECK_THAT(error_of(replaced(f, "parent: spine, port_to_parent: b}",
                               "parent: spin, port_to_parent: b}")),
             Catch::Contains("fabric.boxes[1].parent") && Catch::Contains("spin"));
  // Two roots; no root (a cycle spine -> leafA -> spine).
  CHECK_THAT(error_of(replaced(f, "parent: spine, port_to_parent: a}", "parent: none}")),
             Catch::Contains("fabric.boxes[2].parent") && Catch::Contains("root"));
  CHECK_THAT(
      error_of(replaced(f, "parent: none, ports:", "parent: leafA, port_to_parent: a, ports:")),
      Catch::Contains("fabric.boxes[0].parent") && Catch::Contains("cycle"));
  CHECK_THAT(
      error_of(replaced(f, "parent: none, ports:", "parent: spine, port_to_parent: a, ports:")),
      Catch::Contains("fabric.boxes[0].parent") && Catch::Contains("own parent"));
  CHECK_THAT(error_of(replaced(f, "ports: {leafC: a}", "ports: {}")),
             Catch::Contains("fabric.boxes[3].ports") && Catch::Contains("leafC"));
  CHECK_THAT(error_of(replaced(f, "ports: {leafC: a}", "ports: {leafC: a, leafA: b}")),
             Catch::Contains("fabric.boxes[3].ports.leafA") && Catch::Contains("not a child"));
  CHECK_THAT(error_of(replaced(f, "ports: {leafC: a}", "ports: {leafC: c}")),
             Catch::Contains("fabric.boxes[3].ports.leafC"));
  CHECK_THAT(error_of(replaced(f, "parent: inner, port_to_parent: b}", "parent: inner}")),
             Catch::Contains("fabric.boxes[4].port_to_parent"));
  CHECK_THAT(error_of(replaced(f, "daemon: \"http://10.0.0.3:7470\"", "daemon: \"10.0.0.3:7470\"")),
             Catch::Contains("fabric.boxes[4].daemon"));
  CHECK_THAT(error_of(replaced(f, "\"02:00:00:00:08:03\"", "\"02:00:00:00:08\"")),
             Catch::Contains("fabric.boxes[4].b2b_mac"));
  CHECK_THAT(error_of(replaced(f, "b2b_ip: 10.8.0.3", "b2b_ip: 10.8.0.300")),
             Catch::Contains("fabric.boxes[4].b2b_ip"));
  CHECK_THAT(error_of(replaced(f, "b2b_ip: 10.8.0.3", "b2b_ip: 10.8.0.1")),
             Catch::Contains("fabric.boxes[4].b2b_ip"));
  CHECK_THAT(error_of(replaced(f, "name: leafC", "name: leafA")),
             Catch::Contains("fabric.boxes[4].name"));
  CHECK_THAT(error_of(replaced(f, "{leaf: leafC,", "{leaf: leafD,")),
             Catch::Contains("fabric.racks[2].leaf") && Catch::Contains("leafD"));
  CHECK_THAT(error_of(replaced(f, "{leaf: leafC,", "{leaf: leafA,")),
             Catch::Contains("fabric.racks[2].leaf"));
  CHECK_THAT(error_of(replaced(f, "[10.3.0.0/24]", "[10.2.0.128/25]")),
             Catch::Contains("fabric.racks[2].workers[0]") && Catch::Contains("overlaps"));
  CHECK_THAT(error_of(replaced(f, "[10.3.0.0/24]", "[10.0.0.0/8]")),
             Catch::Contains("fabric.racks[2].workers[0]") && Catch::Contains("overlaps"));
  CHECK_THAT(error_of(replaced(f, "[10.3.0.0/24]", "[10.3.0.1/24]")),
             Catch::Contains("fabric.racks[2].workers[0]") && Catch::Contains("host bits"));
  CHECK_THAT(error_of(replaced(f, "[10.3.0.0/24]", "[10.3.0.0/33]")),
             Catch::Contains("fabric.racks[2].workers[0]"));
  CHECK_THAT(error_of(replaced(f, "[10.3.0.0/24]", "[]")),
             Catch::Contains("fabric.racks[2].workers"));
  CHECK_THAT(error_of(replaced(f, "parent: inner, port_to_parent: b}", "port_to_parent: b}")),
             Catch::Contains("fabric.boxes[4].parent"));
}

TEST_CASE("fabric trees: two racks and a spine", "[control][fabric]") {
  // Ranks spread over the racks: each leaf's children in rank order.
  const json got = trees_of(ring({"10.1.0.1", "10.2.0.1", "10.1.0.2", "10.22.5.5"}));
  const json want = json::parse(R"({
    "leafA": {"self": {"ip": "10.8.0.1", "mac": "02:00:00:00:08:01"},
              "children": [{"rank": 0}, {"rank": 2}], "boxes": [],
              "parent": {"ip": "10.8.0.9", "mac": "02:00:00:00:08:09", "port": "b"},
              "index_at_parent": 0},
    "leafB": {"self": {"ip": "10.8.0.2", "mac": "02:00:00:00:08:02"},
              "children": [{"rank": 1}, {"rank": 3}], "boxes": [],
              "parent": {"ip": "10.8.0.9", "mac": "02:00:00:00:08:09", "port": "a"},
              "index_at_parent": 1},
    "spine": {"self": {"ip": "10.8.0.9", "mac": "02:00:00:00:08:09"},
              "children": [{"box": 0}, {"box": 1}],
              "boxes": [{"ip": "10.8.0.1", "mac": "02:00:00:00:08:01", "port": "a"},
                        {"ip": "10.8.0.2", "mac": "02:00:00:00:08:02", "port": "b"}]}})");
  // tree_to_json's form (absent parent / empty boxes) is the engine's; compare node by node.
  REQUIRE(got.size() == 3);
  for (const char* box : {"leafA", "leafB", "spine"}) {
    INFO(box << ": " << got[box].dump());
    json g = got[box];
    json w = want[box];
    if (!g.contains("boxes")) g["boxes"] = json::array();
    if (!w.contains("parent")) {
      CHECK_FALSE(g.contains("parent"));
      g.erase("index_at_parent");
      g.erase("parent");
    }
    CHECK(g == w);
  }
}

TEST_CASE("fabric trees: three levels, a rack on the spine, only boxes on the paths",
          "[control][fabric]") {
  // leafC (under inner) and the spine's own rack: leafA and leafB are not involved.
  json got = trees_of(ring({"10.3.0.1", "10.9.0.1", "10.3.0.2"}));
  REQUIRE(got.size() == 3);
  CHECK(got["leafC"]["children"] == json::parse(R"([{"rank": 0}, {"rank": 2}])"));
  CHECK(got["leafC"]["parent"] ==
        json::parse(R"({"ip": "10.8.0.4", "mac": "02:00:00:00:08:04", "port": "b"})"));
  CHECK(got["leafC"]["index_at_parent"] == 0);
  CHECK(got["inner"]["children"] == json::parse(R"([{"box": 0}])"));
  CHECK(got["inner"]["boxes"] ==
        json::parse(R"([{"ip": "10.8.0.3", "mac": "02:00:00:00:08:03", "port": "a"}])"));
  CHECK(got["inner"]["parent"] ==
        json::parse(R"({"ip": "10.8.0.9", "mac": "02:00:00:00:08:09", "port": "b"})"));
  CHECK(got["inner"]["index_at_parent"] == 0);
  // The spine: its own rank first, then its one involved child box (inner).
  CHECK(got["spine"]["children"] == json::parse(R"([{"rank": 1}, {"box": 0}])"));
  CHECK(got["spine"]["boxes"] ==
        json::parse(R"([{"ip": "10.8.0.4", "mac": "02:00:00:00:08:04", "port": "b"}])"));
  CHECK_FALSE(got["spine"].contains("parent"));

  // Below the spine: leafC and leafB meet at the spine; inner on the path.
  got = trees_of(ring({"10.2.0.1", "10.3.0.1"}));
  REQUIRE(got.size() == 4);
  CHECK(got["spine"]["children"] == json::parse(R"([{"box": 0}, {"box": 1}])"));
  CHECK(got["spine"]["boxes"][0]["ip"] == "10.8.0.2");  // fabric order: leafB before inner
  CHECK(got["spine"]["boxes"][1]["ip"] == "10.8.0.4");
  CHECK(got["inner"]["index_at_parent"] == 1);
  CHECK(got["leafB"]["index_at_parent"] == 0);
}

TEST_CASE("fabric trees: one rack is a plain ring on its leaf; a member in no rack is named",
          "[control][fabric]") {
  const json got = trees_of(ring({"10.3.0.1", "10.3.0.2", "10.3.0.3"}));
  CHECK(got == json::parse(R"({"leafC": null})"));  // no tree, no inner, no spine
  std::vector<FabricEntry> entries;
  const Status s = compute_fabric_entries(ring({"10.1.0.1", "10.2.0.1", "10.77.0.1"}), fabric(),
                                          secret(), entries);
  REQUIRE_FALSE(s.ok());
  CHECK(s.code() == StatusCode::invalid_argument);
  CHECK(s.field() == "members[2]");
  CHECK_THAT(s.message(), Catch::Contains("10.77.0.1") && Catch::Contains("no rack"));
}

TEST_CASE("state file: a fabric ring's entry, node, peers and pending removals round-trip",
          "[control][fabric][state]") {
  char tmpl[] = "/tmp/nrctl-fabric-XXXXXX";
  REQUIRE(::mkdtemp(tmpl) != nullptr);
  const std::string dir = tmpl;
  StateFile st(dir + "/state.json");
  const engine::RingSpec spec = ring({"10.1.0.1", "10.2.0.1"});
  std::vector<FabricEntry> entries;
  REQUIRE(compute_fabric_entries(spec, fabric(), secret(), entries).ok());
  REQUIRE(entries.size() == 3);  // leafA, leafB, spine (fabric order: spine first)
  RingMap rings;
  RingRecord origin;  // at leafA: its node and the other two boxes' entries
  origin.spec = spec;
  origin.credential = std::string(32, 'c');
  origin.lease_ms = 5000;
  origin.entry = std::string(32, 'e');
  origin.etcd_lease = 0x7E57000000000001;
  for (const FabricEntry& e : entries) {
    if (e.box == "leafA") {
      origin.tree = e.tree;
    } else {
      PeerEntry p;
      p.box = e.box;
      p.ring = fabric_entry_json(spec, e);
      p.installed = true;  // memory only: comes back false
      origin.peers.push_back(p);
    }
  }
  engine::RingSpec other = spec;
  other.ring_id = 8;
  RingRecord peer;  // an entry another box published for this one
  peer.spec = other;
  peer.entry = std::string(32, 'f');
  peer.origin = "spine";
  peer.etcd_lease = 42;
  RingRecord outside;  // an origin that holds no part
  outside.spec = other;
  outside.spec.ring_id = 9;
  outside.entry = std::string(32, 'a');
  outside.local = false;
  rings.emplace(7, origin);
  rings.emplace(8, peer);
  rings.emplace(9, outside);
  REQUIRE(st.save(rings).ok());
  RingMap back;
  const Status s = st.load(back);
  INFO(s.to_string());
  REQUIRE(s.ok());
  REQUIRE(back.size() == 3);
  const RingRecord& o = back.at(7);
  CHECK(o.entry == origin.entry);
  CHECK(o.origin.empty());
  CHECK(o.local);
  CHECK(o.tree == origin.tree);
  REQUIRE(o.peers.size() == 2);
  for (size_t i = 0; i < 2; ++i) {
    CHECK(o.peers[i].box == origin.peers[i].box);
    CHECK(o.peers[i].ring == origin.peers[i].ring);
    CHECK_FALSE(o.peers[i].installed);  // a restarted origin reads the acks again
  }
  CHECK(o.etcd_lease == origin.etcd_lease);
  CHECK(back.at(8).origin == "spine");
  CHECK(back.at(8).etcd_lease == 42);
  CHECK_FALSE(back.at(8).tree.has_value());
  CHECK(back.at(8).credential.empty());
  CHECK_FALSE(back.at(9).local);
  // A file from daemons that pushed entries to each other lists the removals
  // they still owed: read and ignored (etcd says what each box holds).
  {
    std::ifstream in(dir + "/state.json");
    json doc = json::parse(in);
    doc["fabric_deletes"] =
        json::array({{{"box", "leafB"}, {"id", 3}, {"entry", std::string(32, 'b')}}});
    std::ofstream(dir + "/state.json") << doc.dump();
  }
  RingMap old_file;
  REQUIRE(st.load(old_file).ok());
  CHECK(old_file.size() == 3);
  std::filesystem::remove_all(dir);
}

TEST_CASE("state file: fabric trees saved without an epoch and key get an installation",
          "[control][fabric][state]") {
  char tmpl[] = "/tmp/nrctl-keyless-XXXXXX";
  REQUIRE(::mkdtemp(tmpl) != nullptr);
  const std::string dir = tmpl;
  const engine::RingSpec spec = ring({"10.1.0.1", "10.2.0.1"});
  std::vector<FabricEntry> entries;
  REQUIRE(compute_fabric_entries(spec, fabric(), secret(), entries).ok());
  // The file as a daemon wrote it before trees had an epoch and key: an
  // origin (ring 7: its node and two pushes) and a peer's copy (ring 8).
  auto keyless = [](json t) {
    t.erase("epoch");
    t.erase("key");
    return t;
  };
  json origin = ring_to_json(spec);
  origin["fabric"] = {{"entry", std::string(32, 'e')}, {"peers", json::array()}};
  for (const FabricEntry& e : entries) {
    json j = fabric_entry_json(spec, e);
    j["tree"] = keyless(j["tree"]);
    if (e.box == "leafA")
      origin["fabric"]["tree"] = j["tree"];
    else
      origin["fabric"]["peers"].push_back({{"box", e.box}, {"ring", j}});
  }
  json peer = ring_to_json(spec);
  peer["id"] = 8;
  peer["fabric"] = {{"entry", std::string(32, 'f')},
                    {"origin", "spine"},
                    {"tree", origin["fabric"]["peers"][0]["ring"]["tree"]}};
  {
    std::ofstream f(dir + "/state.json");
    f << json({{"version", 2}, {"rings", {origin, peer}}}).dump(2);
  }
  StateFile st(dir + "/state.json");
  RingMap back;
  const Status s = st.load(back);
  INFO(s.to_string());
  REQUIRE(s.ok());
  // The peer's copy is left out: etcd gives it back.
  REQUIRE(back.size() == 1);
  const RingRecord& o = back.at(7);
  REQUIRE(o.tree);
  CHECK(o.tree->key != wire::B2bKey{});
  // One installation for the node and both pushes.
  REQUIRE(o.peers.size() == 2);
  for (const PeerEntry& p : o.peers) {
    CHECK(p.ring["tree"]["epoch"] == o.tree->epoch);
    CHECK(p.ring["tree"]["key"] == key_to_hex(o.tree->key));
  }
  // Everything else as written.
  const auto leaf_a = std::find_if(entries.begin(), entries.end(),
                                   [](const FabricEntry& e) { return e.box == "leafA"; });
  REQUIRE(leaf_a != entries.end());
  engine::TreeSpec want = *leaf_a->tree;
  want.epoch = o.tree->epoch;
  want.key = o.tree->key;
  CHECK(*o.tree == want);
  // A second load draws another installation: the daemon saves the first.
  RingMap again;
  REQUIRE(st.load(again).ok());
  CHECK(again.at(7).tree->key != o.tree->key);
  std::filesystem::remove_all(dir);
}
