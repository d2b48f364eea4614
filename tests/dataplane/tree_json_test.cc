// The "tree" object of a ring spec (engine/engine_json.h): round trip, the
// port -> TreeBox::meta mapping, and a named field for every malformed or
// inconsistent field (the data plane's install_ring and --rings answer with
// these). DPDK-free: runs in the sanitizer build too.
#include <catch2/catch.hpp>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "common/ring_json.h"
#include "engine/engine_json.h"

using namespace netreduce;
using nlohmann::json;

namespace {

const char* const kKey = "000102030405060708090a0b0c0d0e0f101112131415161718191A1B1C1D1E1F";

const char* const kKeyId = "630dcd2966c43366";

json leaf_ring() {
  return {{"id", 9},
          {"members", {"10.1.0.1", "10.1.0.2", "10.2.0.1", "10.2.0.2"}},
          {"msg_len", 4},
          {"window", 2},
          {"payload_bytes", 1024},
          {"tree",
           {{"self", {{"ip", "10.9.0.1"}, {"mac", "02:00:00:00:09:01"}}},
            {"children", {{{"rank", 0}}, {{"rank", 1}}}},
            {"parent", {{"ip", "10.9.0.9"}, {"mac", "02:00:00:00:09:09"}, {"port", "b"}}},
            {"index_at_parent", 1},
            {"epoch", 4000000000u},
            {"key", kKey}}}};
}

json root_ring() {
  json j = leaf_ring();
  j["tree"] = {{"self", {{"ip", "10.9.0.9"}, {"mac", "02:00:00:00:09:09"}}},
               {"children", {{{"box", 0}}, {{"box", 1}}}},
               {"epoch", 0},
               {"key", kKey},
               {"boxes",
                {{{"ip", "10.9.0.1"}, {"mac", "02:00:00:00:09:01"}, {"port", "a"}},
                 {{"ip", "10.9.0.2"}, {"mac", "02:00:00:00:09:02"}, {"port", 1}}}}};
  return j;
}

}  // namespace

TEST_CASE("tree json: a leaf and a root, round trip", "[dataplane][tree_json]") {
  engine::RingSpec spec;
  std::optional<engine::TreeSpec> tree;
  REQUIRE(ring_tree_from_json(leaf_ring(), spec, tree).ok());
  REQUIRE(tree);
  CHECK(spec.ring_id == 9);
  CHECK(tree->self.ip == 0x0A090001);
  CHECK(tree->self.mac == wire::MacAddr{2, 0, 0, 0, 9, 1});
  CHECK(tree->children ==
        std::vector<engine::TreeChild>{engine::TreeSpec::rank(0), engine::TreeSpec::rank(1)});
  CHECK(tree->has_parent);
  CHECK(tree->parent.ip == 0x0A090009);
  // Port b (slot 1): transmit sends out of the port opposite meta, so meta is 0.
  CHECK(tree->parent.meta == 0);
  CHECK(tree->index_at_parent == 1);
  CHECK(tree->epoch == 4000000000u);
  for (size_t i = 0; i < tree->key.size(); ++i) CHECK(tree->key[i] == i);
  // The key only where it is asked for (a push, the state file), in lowercase.
  json back = ring_tree_to_json(spec, tree);
  json want = leaf_ring()["tree"];
  want["boxes"] = json::array();  // written out even when empty
  want.erase("key");
  want["key_id"] = back["tree"].value("key_id", "");
  CHECK(back["tree"] == want);
  // key_id: the first 8 bytes of SHA-256(key) (for the bytes 00..1f, from
  // Python's hashlib).
  CHECK(want["key_id"] == kKeyId);
  want.erase("key_id");
  back = ring_tree_to_json(spec, tree, KeyShown::included);
  want["key"] = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
  CHECK(back["tree"] == want);

  REQUIRE(ring_tree_from_json(root_ring(), spec, tree).ok());
  REQUIRE(tree);
  CHECK_FALSE(tree->has_parent);
  CHECK(tree->boxes.size() == 2);
  CHECK(tree->boxes[0].meta == 1);  // port a: leaves by slot 0
  CHECK(tree->boxes[1].meta == 0);  // port 1 = b
  const json rb = ring_tree_to_json(spec, tree, KeyShown::included);
  CHECK(rb["tree"]["boxes"][1]["port"] == "b");
  CHECK_FALSE(rb["tree"].contains("parent"));
  engine::RingSpec spec2;
  std::optional<engine::TreeSpec> tree2;
  REQUIRE(ring_tree_from_json(rb, spec2, tree2).ok());
  CHECK(tree2 == tree);

  // Without "tree": a plain ring, no tree.
  json plain = leaf_ring();
  plain.erase("tree");
  REQUIRE(ring_tree_from_json(plain, spec, tree).ok());
  CHECK_FALSE(tree);
  CHECK_FALSE(ring_tree_to_json(spec, tree).contains("tree"));
}

TEST_CASE("tree json: every bad field is named", "[dataplane][tree_json]") {
  struct Case {
    std::function<void(json&)> mutate;
    std::string field;
  };
  const std::vector<Case> cases = {
      {[](json& t) { t = json::array(); }, "tree"},
      {[](json& t) { t["colour"] = 1; }, "tree.colour"},
      {[](json& t) { t.erase("self"); }, "tree.self"},
      {[](json& t) { t.erase("epoch"); }, "tree.epoch"},
      {[](json& t) { t["epoch"] = -1; }, "tree.epoch"},
      {[](json& t) { t["epoch"] = 4294967296u; }, "tree.epoch"},
      {[](json& t) { t["epoch"] = "1"; }, "tree.epoch"},
      {[](json& t) { t.erase("key"); }, "tree.key"},
      {[](json& t) { t["key"] = 7; }, "tree.key"},
      {[](json& t) { t["key"] = std::string(kKey).substr(2); }, "tree.key"},
      {[](json& t) { t["key"] = std::string(kKey) + "00"; }, "tree.key"},
      {[](json& t) { t["key"] = "g" + std::string(kKey).substr(1); }, "tree.key"},
      {[](json& t) { t["key"] = std::string(64, '0'); }, "tree.key"},  // all zeros
      {[](json& t) { t["self"] = "10.9.0.1"; }, "tree.self"},
      {[](json& t) { t["self"].erase("ip"); }, "tree.self.ip"},
      {[](json& t) { t["self"]["ip"] = "10.9.0.01"; }, "tree.self.ip"},
      {[](json& t) { t["self"]["ip"] = 7; }, "tree.self.ip"},
      {[](json& t) { t["self"]["ip"] = "0.0.0.0"; }, "tree.self.ip"},
      {[](json& t) { t["self"]["mac"] = "02:00:00:00:09"; }, "tree.self.mac"},
      {[](json& t) { t["self"]["mac"] = "02:00:00:00:09:0g"; }, "tree.self.mac"},
      {[](json& t) { t["self"]["mac"] = "02-00-00-00-09-01"; }, "tree.self.mac"},
      {[](json& t) { t["self"]["port"] = "a"; }, "tree.self.port"},
      {[](json& t) { t.erase("children"); }, "tree.children"},
      {[](json& t) { t["children"] = json::object(); }, "tree.children"},
      {[](json& t) { t["children"] = json::array(); }, "tree.children"},
      {[](json& t) { t["children"][1] = 1; }, "tree.children[1]"},
      {[](json& t) {
         t["children"][1] = {{"rank", -1}};
       },
       "tree.children[1]"},
      {[](json& t) {
         t["children"][1] = {{"rank", 1}, {"box", 0}};
       },
       "tree.children[1]"},
      {[](json& t) {
         t["children"][1] = {{"rank", 4}};
       },
       "tree.children"},  // P = 4
      {[](json& t) {
         t["children"][1] = {{"rank", 0}};
       },
       "tree.children"},  // twice
      {[](json& t) {
         t["children"][1] = {{"box", 0}};
       },
       "tree.children"},  // no boxes
      {[](json& t) { t["boxes"] = "x"; }, "tree.boxes"},
      {[](json& t) {
         t["boxes"] = {{{"ip", "10.9.0.5"}, {"mac", "02:00:00:00:09:05"}}};
         t["children"].push_back({{"box", 0}});
       },
       "tree.boxes[0].port"},
      {[](json& t) {
         t["boxes"] = {{{"ip", "10.9.0.5"}, {"mac", "02:00:00:00:09:05"}, {"port", "c"}}};
         t["children"].push_back({{"box", 0}});
       },
       "tree.boxes[0].port"},
      {[](json& t) {
         t["boxes"] = {{{"ip", "10.9.0.5"}, {"mac", "02:00:00:00:09:05"}, {"port", 2}}};
         t["children"].push_back({{"box", 0}});
       },
       "tree.boxes[0].port"},
      {[](json& t) {
         t["boxes"] = {{{"ip", "10.9.0.1"}, {"mac", "02:00:00:00:09:05"}, {"port", "a"}}};
         t["children"].push_back({{"box", 0}});
       },
       "tree.boxes"},  // the box's own address
      {[](json& t) {
         t["boxes"] = {{{"ip", "10.9.0.5"}, {"mac", "02:00:00:00:09:05"}, {"port", "a"}}};
       },
       "tree.children"},  // a child box that is not a child
      {[](json& t) { t["parent"] = 3; }, "tree.parent"},
      {[](json& t) { t["parent"].erase("port"); }, "tree.parent.port"},
      {[](json& t) { t["parent"]["mac"] = 5; }, "tree.parent.mac"},
      {[](json& t) { t["parent"]["ip"] = "10.9.0.1"; }, "tree.parent"},  // self's address
      {[](json& t) {
         t.erase("parent");
         t.erase("index_at_parent");
       },
       "tree.parent"},  // a root with no child box
      {[](json& t) { t["index_at_parent"] = "0"; }, "tree.index_at_parent"},
      {[](json& t) { t["index_at_parent"] = 16; }, "tree.index_at_parent"},
      {[](json& t) {
         t.erase("parent");
         t["boxes"] = {{{"ip", "10.9.0.5"}, {"mac", "02:00:00:00:09:05"}, {"port", "a"}}};
         t["children"].push_back({{"box", 0}});
       },
       "tree.index_at_parent"},  // 1 without a parent
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    json j = leaf_ring();
    cases[i].mutate(j["tree"]);
    engine::RingSpec spec;
    std::optional<engine::TreeSpec> tree;
    const Status st = ring_tree_from_json(j, spec, tree);
    INFO("case " << i << ": " << j["tree"].dump() << " -> " << st.to_string());
    CHECK_FALSE(st.ok());
    CHECK(st.field() == cases[i].field);
    CHECK(st.code() == StatusCode::invalid_argument);
    CHECK_FALSE(tree);
  }
  // The ring's own fields are checked first, as without a tree.
  json j = leaf_ring();
  j["window"] = "x";
  engine::RingSpec spec;
  std::optional<engine::TreeSpec> tree;
  CHECK(ring_tree_from_json(j, spec, tree).field() == "window");
  // ring_from_json alone (daemon, host library) refuses a tree as unknown.
  CHECK(ring_from_json(leaf_ring(), spec).field() == "tree");
}

TEST_CASE("tree json: memory of a tree node", "[dataplane][tree_json]") {
  engine::RingSpec spec;
  std::optional<engine::TreeSpec> tree;
  REQUIRE(ring_tree_from_json(root_ring(), spec, tree).ok());
  // window 2 -> S = 4 slots, msg_len 4, 2 child boxes, 1024 bytes each.
  CHECK(engine::tree_memory_bytes(spec, *tree) == 4u * 4 * 2 * 1024);
  engine::Engine e(
      engine::EngineConfig{.allocator = {[](void*, uint16_t) { return engine::Pkt{}; }, nullptr}});
  REQUIRE(e.install_ring(spec, *tree).ok());
  CHECK(e.ring_info(spec.ring_id)->memory_bytes ==
        engine::ring_memory_bytes(spec, engine::ReduceMode::deterministic) +
            engine::tree_memory_bytes(spec, *tree));
}
