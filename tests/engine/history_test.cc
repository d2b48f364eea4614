// A rank's message history: record_message's monotonic update and
// find_message's bounded lookup, against a linear scan over every recorded
// message as the model.
#include "engine/history.h"

#include <catch2/catch.hpp>
#include <random>
#include <vector>

#include "wire/psn.h"

using namespace netreduce;
using namespace netreduce::engine::detail;

namespace {

struct Row {
  uint32_t slots;
  std::vector<HistEntry> h;
  RankConn rc;
  engine::TableStats stats;
  explicit Row(uint32_t s) : slots(s), h(s) {}
  Recorded add(uint32_t m, uint32_t psn0, uint16_t len) {
    return record_message(h.data(), slots, rc, HistEntry{m, psn0, len, 0, 0, true});
  }
  const HistEntry* find(uint32_t psn) { return find_message(h.data(), slots, rc, psn, stats); }
  // The model: every recorded entry of the last S message ids, scanned (an
  // older message still in its slot, whose successor there never arrived,
  // is out of the window rule W allows and need not be found).
  const HistEntry* scan(uint32_t psn) const {
    for (const HistEntry& e : h)
      if (e.valid && rc.newest - e.msg_id < slots && wire::psn_in_range(psn, e.psn0, e.len))
        return &e;
    return nullptr;
  }
};

}  // namespace

TEST_CASE("record_message keeps newer history and flags a changed message", "[history]") {
  Row r(8);
  CHECK(r.add(10, 100, 4) == Recorded::added);
  CHECK(r.rc.newest == 10);
  CHECK(r.add(10, 100, 4) == Recorded::same);
  CHECK(r.add(10, 101, 4) == Recorded::changed);
  CHECK(r.add(18, 132, 4) == Recorded::added);  // same slot, newer: replaces
  CHECK(r.add(10, 100, 4) == Recorded::stale);  // delayed duplicate of the old first packet
  CHECK(r.h[18 % 8].msg_id == 18);
  CHECK(r.add(12, 108, 4) == Recorded::added);  // an older message in another slot
  CHECK(r.rc.newest == 18);                     // newest never goes back
}

TEST_CASE("find_message over msg_id and PSN wrap, with holes, within the probe budget",
          "[history]") {
  std::mt19937 rng(11);
  for (const uint32_t slots : {2u, 16u, 2048u}) {
    for (int round = 0; round < 20; ++round) {
      Row r(slots);
      // Messages up to just past the msg_id wrap, PSNs crossing 2^24; some
      // first packets never arrive (holes), lengths vary.
      uint32_t m = 0xFFFFFFFFu - slots / 2 - rng() % 4;
      uint32_t psn = 0xFFFFFF - rng() % (4 * slots);
      std::vector<std::pair<uint32_t, uint16_t>> sent;  // psn0, len of every message
      for (uint32_t i = 0; i < slots + slots / 2; ++i, ++m) {
        const auto len = static_cast<uint16_t>(1 + rng() % 5);
        if (rng() % 4 != 0) r.add(m, psn, len);
        sent.emplace_back(psn, len);
        psn = wire::psn_add(psn, len);
      }
      // Every PSN of the last slots + a few messages, and PSNs before and after.
      for (size_t i = sent.size() > slots + 2 ? sent.size() - slots - 2 : 0; i < sent.size(); ++i)
        for (uint32_t d = 0; d < sent[i].second; ++d) {
          const uint32_t q = wire::psn_add(sent[i].first, d);
          const HistEntry* want = r.scan(q);
          const uint64_t before = r.stats.history_probes;
          const HistEntry* got = r.find(q);
          // Only a spent budget gives up on a message; none finds a wrong one.
          if (got) CHECK(got == want);
          if (!got && want) CHECK(r.stats.history_probes - before == kHistoryProbeBudget);
          if (want && want->msg_id == r.rc.newest) CHECK(got == want);
        }
      CHECK(r.find(psn) == nullptr);  // just after every message
      CHECK(r.stats.history_probes_max <= kHistoryProbeBudget);
    }
  }
}

TEST_CASE("find_message walks a go-back-N resend through the hint", "[history]") {
  Row r(16);
  for (uint32_t m = 0; m < 16; ++m) r.add(m, m * 10, 10);
  // Message 3 replayed packet by packet: after the first lookup, each costs
  // two reads (newest, hint).
  REQUIRE(r.find(30) != nullptr);
  const uint64_t probes = r.stats.history_probes;
  for (uint32_t q = 31; q < 40; ++q) CHECK(r.find(q)->msg_id == 3);
  CHECK(r.stats.history_probes - probes == 9 * 2);
}
