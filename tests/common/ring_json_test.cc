// The JSON codec of ring specs: round trip, both member forms, and a named
// field for every kind of bad input (the data plane's control socket and the
// daemon's API answer with these).
#include "common/ring_json.h"

#include <catch2/catch.hpp>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "wire/ina.h"

using namespace netreduce;
using nlohmann::json;

TEST_CASE("ring spec round trip through JSON", "[common][json]") {
  RingSpec s;
  s.ring_id = 4000000000u;
  s.members = {0x0A000001, 0xC0A80102, 0x01020304};
  s.msg_len = 64;
  s.window = 8;
  s.payload_bytes = 4096;
  s.dtype_mask = (1u << static_cast<unsigned>(wire::Dtype::bf16)) |
                 (1u << static_cast<unsigned>(wire::Dtype::fp32));
  s.op_mask = 1u << static_cast<unsigned>(wire::ReduceOp::max);
  s.memory_quota = 1ull << 40;
  const json j = ring_to_json(s);
  CHECK(j["members"][1] == "192.168.1.2");
  CHECK(j["dtypes"] == json::array({"fp32", "bf16"}));
  RingSpec back;
  REQUIRE(ring_from_json(j, back).ok());
  CHECK(back == s);
}

TEST_CASE("qpns: optional, one 24-bit QP number per member, round trip", "[common][json]") {
  json j = json::parse(R"({"id": 1, "msg_len": 4, "window": 2, "payload_bytes": 1024,
    "members": ["10.0.0.1", "10.0.0.2", "10.0.0.3"]})");
  RingSpec s;
  REQUIRE(ring_from_json(j, s).ok());
  CHECK(s.qpns.empty());
  CHECK(!ring_to_json(s).contains("qpns"));  // absent when not given
  j["qpns"] = {17, 16777215, 0};
  REQUIRE(ring_from_json(j, s).ok());
  CHECK(s.qpns == std::vector<uint32_t>{17, 16777215, 0});
  RingSpec back;
  REQUIRE(ring_from_json(ring_to_json(s), back).ok());
  CHECK(back.qpns == s.qpns);
  const std::vector<std::pair<json, std::string>> bad = {
      {json{17, 18}, "qpns"},               // one per member
      {json{17, 18, 16777216}, "qpns[2]"},  // 24 bits
      {json{17, -1, 3}, "qpns[1]"},
      {json{17, "18", 3}, "qpns[1]"},
      {json("17"), "qpns"}};
  for (const auto& [q, field] : bad) {
    j["qpns"] = q;
    const Status st = ring_from_json(j, s);
    INFO(q.dump());
    CHECK(!st.ok());
    CHECK(st.field() == field);
  }
}

TEST_CASE("members as rank/address objects, in any order", "[common][json]") {
  const json j = json::parse(R"({"id": 1, "msg_len": 4, "window": 2, "payload_bytes": 1024,
    "members": [{"rank": 2, "address": "10.0.0.3"}, {"rank": 0, "address": "10.0.0.1"},
                {"rank": 1, "address": "10.0.0.2"}]})");
  RingSpec s;
  REQUIRE(ring_from_json(j, s).ok());
  CHECK(s.members == std::vector<uint32_t>{0x0A000001, 0x0A000002, 0x0A000003});
  CHECK(s.dtype_mask == 0);  // omitted: all allowed
}

TEST_CASE("bad ring JSON names the field", "[common][json]") {
  const json good = json::parse(R"({"id": 1, "msg_len": 4, "window": 2, "payload_bytes": 1024,
                                    "members": ["10.0.0.1", "10.0.0.2"]})");
  struct Case {
    std::function<void(json&)> edit;
    std::string field;
  };
  const std::vector<Case> cases = {
      {[](json& j) { j.erase("id"); }, "id"},
      {[](json& j) { j["id"] = "one"; }, "id"},
      {[](json& j) { j["id"] = 1ull << 33; }, "id"},
      {[](json& j) { j["msg_len"] = -4; }, "msg_len"},
      {[](json& j) { j["msg_len"] = 0; }, "msg_len"},
      {[](json& j) { j["window"] = 3.5; }, "window"},
      {[](json& j) { j["payload_bytes"] = 4097; }, "payload_bytes"},
      {[](json& j) { j["members"] = "10.0.0.1"; }, "members"},
      {[](json& j) { j["members"] = json::array({"10.0.0.1"}); }, "members"},
      {[](json& j) { j["members"][1] = "10.0.0"; }, "members[1]"},
      {[](json& j) { j["members"][1] = 42; }, "members[1]"},
      {[](json& j) { j["members"][1] = "224.0.0.1"; }, "members[1]"},
      {[](json& j) { j["members"][1] = "10.0.0.1"; }, "members[1]"},
      {[](json& j) {
         j["members"] = json::parse(
             R"([{"rank": 1, "address": "10.0.0.1"}, {"rank": 1, "address": "10.0.0.2"}])");
       },
       "members[1].rank"},
      {[](json& j) {
         j["members"] = json::parse(
             R"([{"rank": 5, "address": "10.0.0.1"}, {"rank": 0, "address": "10.0.0.2"}])");
       },
       "members[0].rank"},
      {[](json& j) { j["dtypes"] = json::array({"fp8"}); }, "dtypes"},
      {[](json& j) { j["dtypes"] = "fp32"; }, "dtypes"},
      {[](json& j) { j["ops"] = json::array(); }, "ops"},
      {[](json& j) { j["ops"] = json::array({"avg"}); }, "ops"},
      {[](json& j) { j["memory_quota"] = -5; }, "memory_quota"},
      {[](json& j) { j["memory_quota"] = "5"; }, "memory_quota"},
      {[](json& j) { j["extra"] = true; }, "extra"},
  };
  for (const Case& c : cases) {
    json j = good;
    c.edit(j);
    RingSpec s;
    const Status st = ring_from_json(j, s);
    INFO(j.dump() << " -> " << st.to_string());
    CHECK_FALSE(st.ok());
    CHECK(st.field() == c.field);
    CHECK(!st.message().empty());
  }
  RingSpec s;
  CHECK(ring_from_json(json::array(), s).field().empty());
  CHECK_FALSE(ring_from_json(json::array(), s).ok());
}

TEST_CASE("random JSON never throws out of the decoder", "[common][json]") {
  std::mt19937 rng(3);
  const std::vector<json> atoms = {json(nullptr),    json(true),    json(-1),  json(0),
                                   json(1ull << 40), json(2.5),     json("x"), json("10.0.0.1"),
                                   json::array(),    json::object()};
  for (int i = 0; i < 20000; ++i) {
    json j = json::object();
    for (const char* k :
         {"id", "msg_len", "window", "payload_bytes", "members", "dtypes", "ops", "memory_quota"}) {
      if (rng() % 4 == 0) continue;
      if (rng() % 3 == 0) {
        json a = json::array();
        for (unsigned n = rng() % 4; n; --n) a.push_back(atoms[rng() % atoms.size()]);
        j[k] = a;
      } else {
        j[k] = atoms[rng() % atoms.size()];
      }
    }
    RingSpec s;
    Status st;
    REQUIRE_NOTHROW(st = ring_from_json(j, s));
    if (!st.ok()) CHECK(!st.message().empty());
  }
}

TEST_CASE("member addresses: only a strict dotted quad, the whole string", "[common][json]") {
  // Golden answers from Python's ipaddress.IPv4Address (3.11), independent of
  // this parser: it accepts exactly the good list (with these values) and
  // raises ValueError on every bad one.
  const std::vector<std::pair<std::string, uint32_t>> good = {
      {"10.1.0.1", 0x0A010001},    {"0.0.0.0", 0},          {"255.255.255.255", 0xFFFFFFFF},
      {"192.168.1.2", 0xC0A80102}, {"1.2.3.4", 0x01020304}, {"100.64.10.200", 0x64400AC8}};
  for (const auto& [text, want] : good) {
    uint32_t got = 1;
    INFO(text);
    CHECK(ipv4_from_string(text, got));
    CHECK(got == want);
  }
  using namespace std::string_literals;
  const std::vector<std::string> bad = {"10.1.0.1\0x"s,
                                        "10.1.0.1\0"s,
                                        "\0"s
                                        "10.1.0.1",
                                        "010.1.0.1",
                                        "10.1.0.01",
                                        "10.1.0.00",
                                        "10.1.0.1 ",
                                        " 10.1.0.1",
                                        "10.1.0.1\n",
                                        "10.1.0",
                                        "10.1.0.1.5",
                                        "10.1.0.256",
                                        "10.1.0.1000",
                                        "1e1.0.0.1",
                                        "+10.1.0.1",
                                        "10.-1.0.1",
                                        "10..0.1",
                                        "0x0a.1.0.1",
                                        "167837697",
                                        "10.1.0.1/24",
                                        "",
                                        ".10.1.0.1",
                                        "10.1.0.1.",
                                        "\xef\xbc\x91"
                                        "0.1.0.1"};
  for (const std::string& text : bad) {
    uint32_t got = 7;
    INFO(json(text).dump(-1, ' ', true, json::error_handler_t::replace));
    CHECK_FALSE(ipv4_from_string(text, got));
    CHECK(got == 7);  // untouched on refusal
  }
}

TEST_CASE("a member with a NUL and trailing bytes is refused, naming members[2]",
          "[common][json]") {
  // The finding: "10.1.0.1\u0000x" was accepted as 10.1.0.1 (inet_pton on
  // c_str() stops at the NUL).
  const json j = json::parse(R"({"id": 1, "msg_len": 4, "window": 2, "payload_bytes": 1024,
    "members": ["10.1.0.3", "10.1.0.2", "10.1.0.1\u0000x"]})");
  REQUIRE(j["members"][2].get<std::string>().size() == 10);
  RingSpec s;
  const Status st = ring_from_json(j, s);
  CHECK_FALSE(st.ok());
  CHECK(st.field() == "members[2]");
  // The message shows the bytes escaped, never a raw NUL.
  CHECK(st.message().find("'10.1.0.1\\x00x'") != std::string::npos);
  CHECK(st.message().find('\0') == std::string::npos);

  json k = j;
  k["members"][2] = "10.1.0.010";
  CHECK(ring_from_json(k, s).field() == "members[2]");
  k["members"][2] = json::parse(R"({"rank": 2, "address": "10.1.0.1\u0000"})");
  k["members"][0] = json::parse(R"({"rank": 0, "address": "10.1.0.3"})");
  k["members"][1] = json::parse(R"({"rank": 1, "address": "10.1.0.2"})");
  CHECK(ring_from_json(k, s).field() == "members[2]");
}
