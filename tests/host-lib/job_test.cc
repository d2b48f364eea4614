// The verbs communicator's job plan (host-lib/job.h) without RDMA hardware:
// the bootstrap messages, locality into rings, the ring-id rule, the path
// decision. Expected values are written out by hand from the rules in
// job.h / local.h, not computed by the code under test.
#include "host-lib/job.h"

#include <catch2/catch.hpp>

using namespace netreduce;
using namespace netreduce::host;

namespace {

std::vector<LocalityClaim> via_bootstrap(const std::vector<LocalityClaim>& claims) {
  // What every rank reads back from the allgather.
  std::vector<LocalityClaim> out(claims.size());
  for (unsigned r = 0; r < claims.size(); ++r)
    REQUIRE(decode_claim(encode_claim(claims[r]), r, out[r]).ok());
  return out;
}

}  // namespace

TEST_CASE("job plan: the job header and the locality claims round-trip", "[hostlib][job]") {
  JobHeader h;
  REQUIRE(decode_job_header(encode_job_header({3, 0xDEADBEEF01234567ull, {}}), h).ok());
  CHECK(h.stripes == 3);
  CHECK(h.nonce == 0xDEADBEEF01234567ull);
  CHECK(h.racks.empty());
  CHECK(encode_job_header({1, 0x2A, {}}) == "1 000000000000002a");
  // With the fabric's racks, as the daemon writes them.
  const std::vector<FabricRack> racks = {{"leaf0", {{0x0A000100, 24}, {0x0A000905, 32}}},
                                         {"leaf-1.b", {{0x0A000200, 24}}}};
  const std::string text = encode_job_header({2, 7, racks});
  CHECK(text ==
        "2 0000000000000007 [{\"leaf\":\"leaf0\",\"workers\":[\"10.0.1.0/24\","
        "\"10.0.9.5/32\"]},{\"leaf\":\"leaf-1.b\",\"workers\":[\"10.0.2.0/24\"]}]");
  REQUIRE(decode_job_header(text, h).ok());
  CHECK((h.stripes == 2 && h.nonce == 7 && h.racks == racks));
  for (const char* bad : {"", "2", "2 ", " 2 1", "x 1", "2 zz", "-1 5", "2 1 3", "2 1 ", "2 1 []",
                          "2 1 [{\"leaf\":\"a b\",\"workers\":[]}]",
                          "2 1 [{\"leaf\":\"a\",\"workers\":[\"10.0.1.1/24\"]}]",
                          "2 1 [{\"leaf\":\"a\",\"workers\":[\"10.0.1.0/33\"]}]",
                          "2 1 [{\"leaf\":\"a\",\"workers\":[\"10.0.1/24\"]}]",
                          "2 1 [{\"leaf\":\"a\"}]", "2 1 [{\"leaf\":\"a\",\"workers\":"}) {
    INFO(bad);
    const Error e = decode_job_header(bad, h);
    CHECK(e.code == ErrorCode::bootstrap);
    CHECK(e.message.find("malformed job header from rank 0") != std::string::npos);
  }

  LocalityClaim c{"boot-id/host with spaces", -1, -1, "", ""}, back;
  REQUIRE(decode_claim(encode_claim(c), 4, back).ok());
  CHECK(back.host_id == "boot-id/host with spaces");
  CHECK(back.local_rank == -1);
  CHECK(back.local_size == -1);
  c = {"h", 1, 2, "", ""};
  REQUIRE(decode_claim(encode_claim(c), 4, back).ok());
  CHECK((back.host_id == "h" && back.local_rank == 1 && back.local_size == 2));
  for (const char* bad : {"", "1 2", "1 2 ", "a 2 h", "1 -2 h", "1  h"}) {
    INFO(bad);
    const Error e = decode_claim(bad, 4, back);
    CHECK(e.code == ErrorCode::bootstrap);
    CHECK(e.message == "bootstrap: rank 4 sent a malformed locality claim");
  }
}

TEST_CASE("job plan: 3 hosts x 2 local ranks, ranks interleaved, form two rings in host order",
          "[hostlib][job][local]") {
  // Global ranks 0..5 on hosts a, b, a, c, b, c (discovered local ranks:
  // global order within a host). Hosts by lowest rank: a = 0, b = 1, c = 2.
  const auto all = via_bootstrap({{"a", -1, -1, "", ""},
                                  {"b", -1, -1, "", ""},
                                  {"a", -1, 2, "", ""},
                                  {"c", -1, -1, "", ""},
                                  {"b", -1, -1, "", ""},
                                  {"c", -1, 2, "", ""}});
  const std::vector<std::vector<unsigned>> rings = {{0, 1, 3}, {2, 4, 5}};
  struct Want {
    unsigned host, local_rank;
  };
  const Want want[6] = {{0, 0}, {1, 0}, {0, 1}, {2, 0}, {1, 1}, {2, 1}};
  for (unsigned r = 0; r < 6; ++r) {
    INFO("rank " << r);
    Locality loc;
    REQUIRE(resolve_locality(all, r, loc).ok());
    CHECK(loc.local_size == 2);
    CHECK(loc.hosts == 3);
    CHECK(loc.host == want[r].host);
    CHECK(loc.local_rank == want[r].local_rank);
    CHECK(loc.rings == rings);
    CHECK(loc.ring == rings[want[r].local_rank]);
    CHECK(loc.ring[loc.host] == r);  // my position on my ring is my host index
  }
  // Explicit local ranks swap the rings' members.
  const auto given = via_bootstrap({{"a", 1, 2, "", ""},
                                    {"b", 0, 2, "", ""},
                                    {"a", 0, 2, "", ""},
                                    {"c", 1, 2, "", ""},
                                    {"b", 1, 2, "", ""},
                                    {"c", 0, 2, "", ""}});
  Locality loc;
  REQUIRE(resolve_locality(given, 0, loc).ok());
  CHECK(loc.rings == std::vector<std::vector<unsigned>>{{2, 1, 5}, {0, 4, 3}});
  CHECK(loc.local_rank == 1);
}

TEST_CASE("job plan: one rank per host is the plain communicator", "[hostlib][job][local]") {
  const auto all = via_bootstrap(
      {{"a", -1, -1, "", ""}, {"b", -1, -1, "", ""}, {"c", -1, 1, "", ""}, {"d", 0, -1, "", ""}});
  for (unsigned r = 0; r < 4; ++r) {
    Locality loc;
    REQUIRE(resolve_locality(all, r, loc).ok());
    CHECK(loc.local_size == 1);
    CHECK(loc.local_rank == 0);
    CHECK(loc.host == r);
    CHECK(loc.ring == std::vector<unsigned>{0, 1, 2, 3});
  }
  CHECK(lane_label(0, 1, 2) == "ring 2");  // without local ranks
  CHECK(lane_label(1, 2, 0) == "local rank 1's ring, stripe 0");
}

TEST_CASE("job plan: the path decision and each local rank's ring ids", "[hostlib][job]") {
  // The job's rings in order l R + s: with n = 2, R = 3, local rank 1 takes
  // ring indices 3, 4, 5.
  CHECK(job_ring_index(1, 3, 0) == 3);
  CHECK(job_ring_index(0, 3, 2) == 2);
  const std::vector<uint32_t> job = {70, 71, 72, 73, 74, 75};
  CHECK(my_ring_ids(job, 0, 3) == std::vector<uint32_t>{70, 71, 72});
  CHECK(my_ring_ids(job, 1, 3) == std::vector<uint32_t>{73, 74, 75});
  CHECK(my_ring_ids(job, 2, 3).empty());

  PathDecision d{true, job, "6 rings installed"};
  // One ring: rank 0 broadcasts "I<id>:<reason>" or "R0:<reason>".
  CHECK(encode_decision({true, {77}, "ring 77 installed by the daemon"}) ==
        "I77:ring 77 installed by the daemon");
  CHECK(encode_decision({false, {}, "ring forced by options"}) == "R0:ring forced by options");
  PathDecision back;
  REQUIRE(decode_decision(encode_decision(d), 6, back).ok());
  CHECK(back.ina);
  CHECK(back.ring_ids == job);
  CHECK(back.reason == "6 rings installed");
  REQUIRE(decode_decision("R0:no box: x:y", 6, back).ok());
  CHECK(!back.ina);
  CHECK(back.reason == "no box: x:y");
  CHECK(back.ring_ids.empty());

  const Error e = decode_decision(encode_decision(d), 4, back);
  CHECK(e.code == ErrorCode::bootstrap);
  CHECK(e.message == "bootstrap: rank 0 sent 6 ring ids for 4 rings");
  for (const char* bad : {"", "I", "X1:a", "I1,:a", "I1,x:a", "I0:a", "I4294967296:a"}) {
    INFO(bad);
    CHECK(decode_decision(bad, 1, back).code == ErrorCode::bootstrap);
  }
}
