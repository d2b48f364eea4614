// A rank's message history (docs/design.md#tables): the (msg_id, psn0, len) of
// its last S messages, indexed by msg_id mod S, so that a later packet of a
// message finds its offset k = psn - psn0 even when go-back-N resends of
// message m-1 arrive after m's first packet.
//
// record_message is the first packet's update (never lets an older message
// replace newer history); find_message is the later packet's lookup, bounded
// to kHistoryProbeBudget reads whatever S is. Both work on one rank's row of
// S entries (Ring::hist, ring_state.h) and its RankConn. Engine thread only.
#pragma once

#include <cstdint>

#include "engine/clt.h"
#include "engine/engine.h"

namespace netreduce::engine::detail {

struct HistEntry {
  uint32_t msg_id = 0;
  uint32_t psn0 = 0;
  uint16_t len = 0;  // packets
  uint8_t dtype = 0;
  uint8_t op = 0;
  bool valid = false;
};

// A rank's connection and its lookup state. Written by first packets
// (record_message) and later packets (find_message's hint).
struct RankConn {
  ConnKey key;
  bool bound = false;
  bool has_newest = false;
  uint32_t newest = 0;  // newest recorded msg_id
  uint32_t hint = 0;    // msg_id the last later packet found (history lookup step 2)
};

// History reads a later packet may cost at most (find_message): newest +
// hint + a binary search over S <= 2048 slots (11) leaves room for skipping
// a few unrecorded slots.
inline constexpr unsigned kHistoryProbeBudget = 24;

enum class Recorded : uint8_t {
  added,    // a new message (or a newer one over an older one in its slot)
  same,     // the message was recorded already with the same shape
  changed,  // the same msg_id with another PSN, length, dtype or op: malformed
  stale,    // older than the message its slot holds: never replaces it
};

// Records message m in the rank's row `row` (S = slots entries).
Recorded record_message(HistEntry* row, uint32_t slots, RankConn& rc, const HistEntry& m) noexcept;

// The recorded message of the row whose PSN range contains `psn`, or nullptr;
// counts its reads into `stats`. See history.cc for the search.
const HistEntry* find_message(const HistEntry* row, uint32_t slots, RankConn& rc, uint32_t psn,
                              TableStats& stats) noexcept;

}  // namespace netreduce::engine::detail
