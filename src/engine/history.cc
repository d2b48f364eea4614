// Message history: record on first packets, bounded lookup on later ones
// (history.h).
#include "engine/history.h"

#include <algorithm>

#include "wire/psn.h"

namespace netreduce::engine::detail {

Recorded record_message(HistEntry* row, uint32_t slots, RankConn& rc, const HistEntry& m) noexcept {
  HistEntry& h = row[m.msg_id & (slots - 1)];
  if (h.valid && h.msg_id == m.msg_id)
    return h.psn0 != m.psn0 || h.len != m.len || h.dtype != m.dtype || h.op != m.op
               ? Recorded::changed
               : Recorded::same;
  if (h.valid && wire::msg_before(m.msg_id, h.msg_id)) return Recorded::stale;
  h = m;
  h.valid = true;
  if (!rc.has_newest || wire::msg_before(rc.newest, m.msg_id)) {
    rc.newest = m.msg_id;
    rc.has_newest = true;
  }
  return Recorded::added;
}

// In at most kHistoryProbeBudget history reads whatever S is:
// 1. the newest message (almost every packet), and a PSN after its range
//    belongs to no message at all (one read rejects half of random PSNs);
// 2. the message the rank's last later packet found (a go-back-N resend
//    walks one message packet by packet);
// 3. a binary search over the older messages: one QP's messages are
//    PSN-monotone in msg_id, so the search halves the msg_id range at each
//    recorded message; a slot that does not hold its message (first packet
//    not seen yet, or a newer message there) is skipped towards older ones.
// When the budget runs out the packet is dropped as first_packet_lost. That
// is always safe: a drop never reaches a receiver or a cell, and the
// sender's retransmission is found by step 2 or 1 once the first of it
// is (legitimate packets lie in the last N messages under rule W, where
// first packets have passed).
const HistEntry* find_message(const HistEntry* row, uint32_t slots, RankConn& rc, uint32_t psn,
                              TableStats& stats) noexcept {
  if (!rc.has_newest) return nullptr;
  const uint32_t mask = slots - 1;
  unsigned probes = 0;
  auto at = [&](uint32_t m) -> const HistEntry* {
    ++probes;
    const HistEntry& h = row[m & mask];
    return h.valid && h.msg_id == m ? &h : nullptr;
  };
  auto done = [&](const HistEntry* h) {
    ++stats.history_lookups;
    stats.history_probes += probes;
    stats.history_probes_max = std::max(stats.history_probes_max, probes);
    if (h) rc.hint = h->msg_id;
    return h;
  };
  const HistEntry* newest = at(rc.newest);
  if (newest) {
    if (wire::psn_in_range(psn, newest->psn0, newest->len)) return done(newest);
    if (!wire::psn_before(psn, newest->psn0)) return done(nullptr);  // after every message
  }
  if (rc.hint != rc.newest) {
    const HistEntry* h = at(rc.hint);
    if (h && wire::psn_in_range(psn, h->psn0, h->len)) return done(h);
  }
  // Offsets back from the newest message: [lo, hi], PSNs decrease as the offset grows.
  uint32_t lo = 1, hi = slots - 1;
  while (lo <= hi && probes < kHistoryProbeBudget) {
    const uint32_t mid = lo + (hi - lo) / 2;
    uint32_t j = mid;
    const HistEntry* h = at(rc.newest - j);
    while (!h && j < hi && probes < kHistoryProbeBudget) h = at(rc.newest - ++j);
    if (!h) {
      hi = mid - 1;  // [mid, hi] holds no recorded message
      continue;
    }
    if (wire::psn_in_range(psn, h->psn0, h->len)) return done(h);
    if (wire::psn_before(psn, h->psn0))
      lo = j + 1;  // an older message
    else
      hi = mid - 1;  // newer than j; (mid, j) are not recorded
  }
  return done(nullptr);
}

}  // namespace netreduce::engine::detail
