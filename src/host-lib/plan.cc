#include "host-lib/plan.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace netreduce::host {

size_t MessagePlan::elems(size_t i) const noexcept {
  if (i >= messages) return 0;
  return std::min(elems_per_msg, count - first_elem(i));
}

uint16_t MessagePlan::packets(size_t i) const noexcept {
  const size_t bytes = kInaHeaderBytes + data_bytes(i);
  return static_cast<uint16_t>((bytes + pmtu - 1) / pmtu);
}

Error make_plan(size_t count, DataType t, uint16_t msg_len, uint16_t pmtu, MessagePlan& out) {
  const size_t es = element_size(t);
  if (es == 0)
    return Error::make(ErrorCode::invalid_argument,
                       "dtype: " + std::to_string(static_cast<int>(t)) + " is not a data type");
  if (pmtu != 256 && pmtu != 512 && pmtu != 1024 && pmtu != 2048 && pmtu != 4096)
    return Error::make(ErrorCode::invalid_argument,
                       "payload_bytes: " + std::to_string(pmtu) +
                           " is not a RoCE MTU (256, 512, 1024, 2048, 4096)");
  if (msg_len < 1 || msg_len > 1024)
    return Error::make(ErrorCode::invalid_argument,
                       "msg_len: " + std::to_string(msg_len) + " packets is outside 1..1024");
  out = {};
  out.count = count;
  out.esize = es;
  out.msg_len = msg_len;
  out.pmtu = pmtu;
  out.elems_per_msg = (size_t{msg_len} * pmtu - kInaHeaderBytes) / es;
  out.messages = (count + out.elems_per_msg - 1) / out.elems_per_msg;
  return {};
}

Error check_rings(unsigned rings) {
  if (rings < 1 || rings > kMaxRings)
    return Error::make(ErrorCode::invalid_argument, "rings: " + std::to_string(rings) +
                                                        " is outside 1.." +
                                                        std::to_string(kMaxRings) + " (0 = 1)");
  return {};
}

StripeRange stripe(size_t count, unsigned rings, unsigned i) noexcept {
  const ChunkRange c = ring_chunk(count, rings, i);  // the same even split
  return {c.first, c.count};
}

void Window::reset(size_t messages) {
  messages_ = messages;
  sent_ = writes_ = results_ = done_ = 0;
}

void Window::advance() noexcept { done_ = std::min(writes_, results_); }

bool Window::sent(size_t i) {
  if (i != sent_ || !can_send(i)) return false;
  ++sent_;
  return true;
}

bool Window::write_completed(size_t i) {
  if (i != writes_ || i >= sent_) return false;
  ++writes_;
  advance();
  return true;
}

bool Window::result_received(size_t i) {
  // A result can only exist once this rank's own message went out (the box
  // needs every rank's packets), so a result for an unsent message is an error.
  if (i != results_ || i >= sent_) return false;
  ++results_;
  advance();
  return true;
}

uint16_t window_from_bdp(double link_gbps, double rtt_us, size_t message_bytes) noexcept {
  if (!(link_gbps > 0) || !(rtt_us > 0) || message_bytes == 0) return 2;
  const double bdp_bytes = link_gbps * 1e9 / 8 * rtt_us * 1e-6;
  const double n = std::ceil(bdp_bytes / static_cast<double>(message_bytes));
  return static_cast<uint16_t>(std::clamp(n, 2.0, 64.0));
}

ChunkRange ring_chunk(size_t n, unsigned ranks, unsigned chunk) noexcept {
  const size_t base = n / ranks, extra = n % ranks;
  ChunkRange r;
  r.first = chunk * base + std::min<size_t>(chunk, extra);
  r.count = base + (chunk < extra ? 1 : 0);
  return r;
}

RingStep ring_step(unsigned rank, unsigned ranks, unsigned step) noexcept {
  const auto mod = [ranks](long v) {
    return static_cast<unsigned>(((v % static_cast<long>(ranks)) + ranks) % ranks);
  };
  RingStep s;
  if (step < ranks - 1) {
    s.send_chunk = mod(static_cast<long>(rank) - step);
    s.recv_chunk = mod(static_cast<long>(rank) - step - 1);
    s.reduce = true;
  } else {
    const long t = step - (ranks - 1);
    s.send_chunk = mod(static_cast<long>(rank) + 1 - t);
    s.recv_chunk = mod(static_cast<long>(rank) - t);
    s.reduce = false;
  }
  return s;
}

}  // namespace netreduce::host
