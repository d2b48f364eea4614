// Every fate a packet can meet in the engine, declared once (VPP-style
// X-macro): forwarded untouched, taken into a cell, emitted, or dropped for a
// named reason. Each has a counter; the data plane exports them all.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace netreduce::engine {

enum class Fate : uint8_t { forward, aggregate, drop };

// X(name, fate, description)
#define NETREDUCE_REASONS(X)                                                                 \
  X(fwd_not_roce, forward, "not RoCEv2 (not IPv4 / UDP 4791): forwarded untouched")          \
  X(fwd_unparsed, forward,                                                                   \
    "RoCEv2 the box does not aggregate (UC/UD, IP options, fragments, "                      \
    "malformed headers): forwarded untouched")                                               \
  X(fwd_not_write, forward, "RoCE opcode other than RDMA WRITE (ACK, NAK, SEND, READ, CNP)") \
  X(fwd_no_ina, forward, "RDMA WRITE that is not part of an INA message")                    \
  X(fwd_not_ring_link, forward,                                                              \
    "RDMA WRITE FIRST/ONLY with the INA magic between hosts that "                           \
    "are not adjacent members of any installed or retired ring")                             \
  X(held, aggregate, "packet held in an aggregator cell")                                    \
  X(served_from_cell, aggregate,                                                             \
    "retransmission after completion answered with the stored "                              \
    "result")                                                                                \
  X(bad_icrc, drop, "ICRC verification failed (corrupted packet never reaches a sum)")       \
  X(first_packet_lost, drop, "no recorded message of the connection contains the PSN")       \
  X(duplicate, drop, "duplicate of a packet already held in its cell")                       \
  X(stale_message, drop, "retransmission into a cell already reused by a newer message")     \
  X(message_incomplete, drop,                                                                \
    "a message's last packet while an earlier cell of the message is not complete here: "    \
    "never released unsealed (its sender resends it, served sealed)")                        \
  X(unknown_ring, drop, "INA header names a ring that is not installed")                     \
  X(rank_address_mismatch, drop, "source address is not the registered address of the rank") \
  X(bad_ina_header, drop, "INA header invalid (version, dtype, op, rank or message length)") \
  X(dtype_mismatch, drop, "dtype/op not allowed by the ring or different from the cell's")   \
  X(qpn_mismatch, drop,                                                                      \
    "INA first packet on a QP other than the one the ring's spec names (qpns) for its "      \
    "receiver")                                                                              \
  X(length_mismatch, drop, "payload length differs from the cell's or exceeds the ring's")   \
  X(malformed, drop, "INA packet inconsistent with its message (opcode/offset/alignment)")   \
  X(evicted_incomplete, drop,                                                                \
    "held packet dropped: a worker broke the window rule and reused "                        \
    "its cell")                                                                              \
  X(ring_removed, drop, "held packet released because its ring was removed")                 \
  X(ring_retired, drop,                                                                      \
    "WRITE on a removed ring's connection or link during its grace period "                  \
    "(its job fails; it never receives unreduced data)")                                     \
  X(clt_full, drop, "connection table full: a new INA connection cannot be tracked")         \
  X(alloc_failed, drop,                                                                      \
    "no buffer to build a released packet (accumulate mode) or a box-to-box frame")          \
  X(fwd_b2b_transit, forward, "box-to-box frame for another box: forwarded untouched")       \
  X(partial_taken, aggregate, "partial from a child box taken into its cell (tree)")         \
  X(partial_answered, aggregate,                                                             \
    "partial for a complete cell: the result sent to that child box again (tree)")           \
  X(result_taken, aggregate,                                                                 \
    "result from the parent delivered to the held packets and child boxes (tree)")           \
  X(duplicate_resent_partial, drop,                                                          \
    "duplicate packet or partial for a cell awaiting its parent's result: the partial is "   \
    "sent up again, the duplicate dropped (tree)")                                           \
  X(b2b_stale_epoch, drop,                                                                   \
    "box-to-box frame from another installation of the tree (its epoch is not this one's)")  \
  X(b2b_bad_mac, drop,                                                                       \
    "box-to-box frame whose keyed MAC does not match the tree's key (corrupted or forged)")  \
  X(b2b_seal_failed, drop,                                                                   \
    "box-to-box frame not sent: its MAC could not be computed (OpenSSL failed)")             \
  X(b2b_malformed, drop,                                                                     \
    "box-to-box frame for this box malformed (cut short, IPv4 options or fragments, "        \
    "IPv4/UDP lengths, short header, magic, version, kind, dtype, op, length or position: "  \
    "wire/b2b.h)")                                                                           \
  X(b2b_unknown_tree, drop, "box-to-box frame for a tree this box does not have")            \
  X(b2b_unknown_box, drop,                                                                   \
    "box-to-box frame from an address that is not the child box (partial, final) or the "    \
    "parent (result, query) it claims")                                                      \
  X(b2b_result_unexpected, drop,                                                             \
    "result or final for a cell not awaiting one (a late or repeated copy: already "         \
    "delivered)")                                                                            \
  X(duplicate_queried, drop,                                                                 \
    "a child box's partial again while its cell still collects: the child boxes missing "    \
    "from the cell are queried (tree: a parent that lost its cells)")                        \
  X(query_answered, aggregate,                                                               \
    "query from the parent answered with this box's partial (cell awaiting) or the final "   \
    "result (cell complete) (tree)")                                                         \
  X(query_unanswerable, drop,                                                                \
    "query from the parent for a cell holding neither this box's partial nor the result "    \
    "of that message (its children have not all arrived, or it moved on) (tree)")            \
  X(final_taken, aggregate,                                                                  \
    "final result from a child box (a query's answer) delivered to the held packets and "    \
    "child boxes (tree)")                                                                    \
  X(fwd_unmatched, forward,                                                                  \
    "later packet of no recorded message, resent after it was dropped as first_packet_lost " \
    "(its first packet passed while the box was bypassed or before it started): forwarded "  \
    "untouched (an INA message then fails its seal at the receiver)")                        \
  X(fwd_stalled, forward,                                                                    \
    "resent packet of a message that waited forward_stalled_after here without completing "  \
    "(its other ranks' packets passed while the box was bypassed or before it started, or "  \
    "a rank is that late): forwarded untouched (the message fails its seal at the receiver)")

// Defines, in the enclosing namespace, everything a reason list gives from
// an X-macro LIST(X) with X(name, fate, description): enum class Reason,
// kReasonCount, index(), to_string(), describe() and fate_of(). The engine's
// list (above) and the data plane's (dataplane/reasons.h) both use it.
#define NETREDUCE_REASON_ENUM_(name, fate, desc) name,
#define NETREDUCE_REASON_COUNT_(name, fate, desc) +1
#define NETREDUCE_REASON_NAME_(name, fate, desc) \
  case Reason::name:                             \
    return #name;
#define NETREDUCE_REASON_DESC_(name, fate, desc) \
  case Reason::name:                             \
    return desc;
#define NETREDUCE_REASON_FATE_(name, fate, desc) \
  case Reason::name:                             \
    return ::netreduce::engine::Fate::fate;
#define NETREDUCE_DEFINE_REASONS(LIST)                                         \
  enum class Reason : uint8_t { LIST(NETREDUCE_REASON_ENUM_) };                \
  inline constexpr size_t kReasonCount = 0 LIST(NETREDUCE_REASON_COUNT_);      \
  constexpr size_t index(Reason r) noexcept { return static_cast<size_t>(r); } \
  constexpr std::string_view to_string(Reason r) noexcept {                    \
    switch (r) { LIST(NETREDUCE_REASON_NAME_) }                                \
    return "invalid";                                                          \
  }                                                                            \
  constexpr std::string_view describe(Reason r) noexcept {                     \
    switch (r) { LIST(NETREDUCE_REASON_DESC_) }                                \
    return "invalid";                                                          \
  }                                                                            \
  constexpr ::netreduce::engine::Fate fate_of(Reason r) noexcept {             \
    switch (r) { LIST(NETREDUCE_REASON_FATE_) }                                \
    return ::netreduce::engine::Fate::drop;                                    \
  }

NETREDUCE_DEFINE_REASONS(NETREDUCE_REASONS)

using ReasonCounters = std::array<uint64_t, kReasonCount>;

}  // namespace netreduce::engine
