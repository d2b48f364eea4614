// The transport seam: what the collectives need from the RC connections a
// rank holds (to its successor, from its predecessor), and nothing more. Two
// implementations: VerbsTransport (rdma-core, verbs.cc) and LoopbackTransport
// (P ranks as threads in one process, loopback.h).
//
// Lanes. A transport has lanes() >= 1 lanes; lane i carries ring i of a
// striped communicator (Options::rings): its own pair of QPs (so its own
// QPNs, PSNs and UDP source port) and its own receive region, all lanes
// completing into one queue that poll() drains, so one progress loop drives
// every ring. Lane 0 of a one-lane transport is exactly the single
// connection pair of an unstriped communicator.
//
//   - register_memory: make a local buffer usable as a WRITE source on any
//     lane (cached: registering the same range again costs a lookup);
//   - recv_region(lane): the registered buffer the predecessor writes into
//     on that lane; its address and rkey were handed to the predecessor
//     when connecting. Every lane's region has the same size;
//   - post_write_imm(lane, ...): one RDMA WRITE WITH IMMEDIATE of
//     src[off, off + len) on the lane's QP to the successor's receive region
//     of that lane at remote_off;
//   - poll: completions of every lane, until at least one or the deadline.
//     A write's completion means the successor has the data (RC
//     acknowledged); a receive completion carries the immediate of a
//     predecessor's write. Within a lane both kinds arrive in the order
//     posted; lanes are independent of each other.
//
// A Transport is used by one thread at a time (the communicator's progress
// thread). Errors are Error values naming the peer.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

#include "netreduce/netreduce.hpp"

namespace netreduce::host {

using Clock = std::chrono::steady_clock;

struct Region {
  uint8_t* addr = nullptr;
  size_t len = 0;
  uint32_t lkey = 0;
  uint32_t rkey = 0;
};

struct Completion {
  enum class Kind : uint8_t { write_done, recv_imm };
  Kind kind = Kind::write_done;
  bool ok = true;
  uint64_t wr_id = 0;     // write_done: the id given to post_write_imm
  uint32_t imm = 0;       // recv_imm: the immediate
  uint32_t byte_len = 0;  // recv_imm: bytes written
  int vendor_status = 0;  // !ok: the transport's status (ibv_wc_status)
  const char* what = "";  // !ok: its name (static string)
  unsigned lane = 0;      // the lane (ring index) it belongs to
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual unsigned rank() const noexcept = 0;
  virtual unsigned world() const noexcept = 0;
  virtual unsigned lanes() const noexcept = 0;
  virtual Error register_memory(void* addr, size_t len, Region& out) = 0;
  virtual const Region& recv_region(unsigned lane) const noexcept = 0;
  // Bytes of each of the successor's receive regions (one per lane).
  virtual size_t successor_recv_bytes() const noexcept = 0;
  virtual Error post_write_imm(unsigned lane, const Region& src, size_t off, size_t len,
                               size_t remote_off, uint32_t imm, uint64_t wr_id) = 0;
  // Fills out[0, n) with 1..max completions of any lane, or n = 0 when the
  // deadline passed.
  virtual Error poll(Completion* out, unsigned max, unsigned& n, Clock::time_point deadline) = 0;
  // Largest number of writes the collective may have in flight on one lane.
  virtual unsigned max_outstanding_writes() const noexcept = 0;

  unsigned successor() const noexcept { return (rank() + 1) % world(); }
  unsigned predecessor() const noexcept { return (rank() + world() - 1) % world(); }
  // The job's rank at a place of this ring (rank() is the place), which
  // messages name: another with local ranks or a ring out of rank order.
  virtual unsigned job_rank(unsigned place) const noexcept { return place; }
};

}  // namespace netreduce::host
