// The pass table (internal to src/engine/, docs/design.md#tables).
//
// PassTable: the PSN ranges of recent non-INA RDMA WRITE messages on ring
// links, so that their later packets are forwarded while a later packet that
// matches nothing is dropped (it may belong to an INA message whose first
// packet has not passed). Fixed size, set-associative with LRU eviction
// within a set: any amount of ordinary traffic can only evict ordinary
// entries, never an INA connection (those live in the Clt, clt.h).
//
// A fixed-capacity array sized at construction: no allocation on the packet
// path. Owned by the engine's thread; no sharing.
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>
#include <vector>

#include "engine/clt.h"
#include "engine/line_vector.h"
#include "wire/psn.h"

namespace netreduce::engine::detail {

// Why evicting a pass entry never produces a wrong result: the entry's only
// effect is to let later packets of a non-INA message on a ring link be
// forwarded. Without it those packets are dropped (first_packet_lost), the
// same fate as a packet whose INA first packet was lost: the box drops more,
// never forwards what it would not have, and never feeds a cell. The cost
// falls on that one ordinary message: its sender retransmits from the first
// dropped PSN, and since that resend is again a later packet with no entry,
// the message only gets through if the QP starts it over (RC retry limit:
// the connection errors out). LRU within a set makes the victim the entry
// idle longest, so this takes more concurrent ordinary connections on ring
// links than the table has entries (or a flood of new ones). The
// alternative, forwarding unmatched later packets, is not safe: the RC
// simulator shows a middle packet forwarded raw before its delayed INA first
// packet reaches the box is then accepted by the receiver after the reduced
// first packet.
class PassTable {
 public:
  static constexpr unsigned kWays = 8;
  static constexpr unsigned kRanges = 4;  // messages remembered per connection
  struct Range {
    uint32_t psn0 = 0;
    uint32_t len = 0;  // packets; 0 = unused
  };
  struct Entry {
    ConnKey key;
    uint8_t used = 0;
    uint8_t next = 0;    // range to overwrite next
    uint64_t stamp = 0;  // last use (LRU within the set)
    Range ranges[kRanges];
  };

  explicit PassTable(unsigned capacity)
      : sets_(std::bit_ceil(std::max(capacity, kWays) / kWays)), entries_(sets_ * kWays) {}

  // Records a message on the connection, evicting the set's least recently
  // used entry when the set is full.
  void add(const ConnKey& k, uint32_t psn0, uint32_t len) noexcept {
    Entry* set = &entries_[(hash_key(k) & (sets_ - 1)) * kWays];
    Entry* victim = set;
    for (unsigned w = 0; w < kWays; ++w) {
      Entry& e = set[w];
      if (e.used && e.key == k) {
        victim = &e;
        break;
      }
      if (!e.used) {
        if (victim->used) victim = &e;
      } else if (victim->used && e.stamp < victim->stamp) {
        victim = &e;
      }
    }
    if (!(victim->used && victim->key == k)) {
      if (victim->used) ++evictions_;
      *victim = Entry{};
      victim->key = k;
      victim->used = 1;
    }
    victim->stamp = ++clock_;
    victim->ranges[victim->next++ % kRanges] = {psn0, len};
  }
  // Whether a recorded message of the connection contains the PSN (a hit
  // refreshes the entry).
  bool contains(const ConnKey& k, uint32_t psn) noexcept {
    Entry* set = &entries_[(hash_key(k) & (sets_ - 1)) * kWays];
    for (unsigned w = 0; w < kWays; ++w) {
      Entry& e = set[w];
      if (!e.used || !(e.key == k)) continue;
      for (const Range& r : e.ranges)
        if (r.len && wire::psn_in_range(psn, r.psn0, r.len)) {
          e.stamp = ++clock_;
          return true;
        }
      return false;
    }
    return false;
  }
  uint64_t evictions() const noexcept { return evictions_; }
  size_t capacity() const noexcept { return entries_.size(); }

 private:
  size_t sets_;
  LineVector<Entry> entries_;
  uint64_t clock_ = 0;
  uint64_t evictions_ = 0;
};

}  // namespace netreduce::engine::detail
