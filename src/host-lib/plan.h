// How a tensor is cut up, for both all-reduce paths, and the INA window.
//
// INA path. A tensor of `count` elements becomes messages of up to msg_len
// packets of pmtu payload bytes each. A message occupies one slot of
// msg_len * pmtu bytes: the 24-byte INA header, then up to
// msg_len * pmtu - 24 data bytes (wire/message.h: packet 0 = header + pmtu -
// 24 data bytes, later packets pmtu bytes). Elements never straddle
// messages; only the last message is short (fewer packets). Message i of
// a call has id base + i (32-bit, wraps: wire/psn.h serial arithmetic).
//
// Window (rule W, docs/design.md#cells-and-the-window-rule). Message i may
// be sent only when message i - N is done for this rank: its result arrived
// and its own write completed. Completions of both kinds arrive in order (RC), so "done" is
// a prefix of the messages and the rule is `i < done + N`.
//
// Ring path. A segment of `n` elements is split into P chunks, chunk c
// holding n / P elements plus one if c < n % P. Step s of 2(P - 1):
// reduce-scatter (s < P - 1): send chunk r - s, receive chunk r - s - 1
// and reduce it as op(received, own); all-gather (t = s - P + 1): send
// chunk r + 1 - t, receive chunk r - t and store it (indices mod P). After
// the reduce-scatter rank r holds chunk r + 1 reduced in the ring order
// x[c], x[c+1], ..., x[c-1] (c the chunk; ring_order_reference in
// tests/host-lib/fixture.h computes it independently).
//
// Stripes (Options::rings = R). A tensor of `count` elements is cut into R
// stripes, element-aligned: stripe i holds count / R elements plus one if
// i < count % R (so the first count % R stripes get the ceiling, the rest
// the floor), in order: stripe i starts where stripe i - 1 ends. Stripe i
// runs on ring i with its own plan, window and message ids (INA path) or its
// own segments (ring path); a stripe of 0 elements sends nothing. R = 1 is
// the whole tensor on one ring.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "netreduce/netreduce.hpp"

namespace netreduce::host {

inline constexpr size_t kInaHeaderBytes = 24;

// Rings one communicator may run side by side (Options::rings). A ring is
// one box worker's throughput; each costs every rank two QPs and a receive
// region of ring_buffer_bytes, and the box a ring (its memory quota): 8
// covers the boxes this is built for (up to 8 workers per job) while
// bounding a rank's receive memory at 8 x ring_buffer_bytes.
inline constexpr unsigned kMaxRings = 8;

// Checks Options::rings once resolved (1..kMaxRings); the error names the field.
Error check_rings(unsigned rings);

struct StripeRange {
  size_t first = 0;  // element offset in the tensor
  size_t count = 0;
};
// Stripe i of R over `count` elements (see the top of this file).
StripeRange stripe(size_t count, unsigned rings, unsigned i) noexcept;

struct MessagePlan {
  size_t count = 0;          // elements
  size_t esize = 0;          // bytes per element
  uint16_t msg_len = 0;      // packets per message (at most)
  uint16_t pmtu = 0;         // payload bytes per packet
  size_t elems_per_msg = 0;  // elements in a full message
  size_t messages = 0;

  size_t slot_bytes() const noexcept { return size_t{msg_len} * pmtu; }
  size_t first_elem(size_t i) const noexcept { return i * elems_per_msg; }
  size_t elems(size_t i) const noexcept;
  size_t data_bytes(size_t i) const noexcept { return elems(i) * esize; }
  // Packets message i takes on the wire (its INA header's msg_len).
  uint16_t packets(size_t i) const noexcept;
};

// Checks the arguments and fills the plan; errors name the bad value.
Error make_plan(size_t count, DataType t, uint16_t msg_len, uint16_t pmtu, MessagePlan& out);

class Window {
 public:
  explicit Window(unsigned n = 1) : n_(n) {}
  void reset(size_t messages);
  unsigned size() const noexcept { return n_; }
  bool can_send(size_t i) const noexcept { return i < messages_ && i < done_ + n_; }
  // Each returns false on a completion out of order or for a message not
  // sent (a protocol error the caller reports).
  bool sent(size_t i);
  bool write_completed(size_t i);
  bool result_received(size_t i);
  size_t done() const noexcept { return done_; }  // messages done (a prefix)
  size_t next_send() const noexcept { return sent_; }
  size_t writes_completed() const noexcept { return writes_; }
  size_t results_received() const noexcept { return results_; }
  bool finished() const noexcept { return done_ == messages_; }

 private:
  void advance() noexcept;
  unsigned n_;
  size_t messages_ = 0, sent_ = 0, writes_ = 0, results_ = 0, done_ = 0;
};

// N from the bandwidth-delay product: ceil(gbps * rtt / message bits),
// clamped to [2, 64].
uint16_t window_from_bdp(double link_gbps, double rtt_us, size_t message_bytes) noexcept;

struct ChunkRange {
  size_t first = 0;  // element offset in the segment
  size_t count = 0;
};
ChunkRange ring_chunk(size_t n, unsigned ranks, unsigned chunk) noexcept;

struct RingStep {
  unsigned send_chunk = 0;
  unsigned recv_chunk = 0;
  bool reduce = false;  // true: reduce-scatter (reduce into own), false: all-gather (store)
};
RingStep ring_step(unsigned rank, unsigned ranks, unsigned step) noexcept;
inline unsigned ring_steps(unsigned ranks) noexcept { return 2 * (ranks - 1); }

}  // namespace netreduce::host
