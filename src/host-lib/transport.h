// The transport seam: what the collectives need from the pair of RC
// connections a rank holds (to its successor, from its predecessor), and
// nothing more. Two implementations: VerbsTransport (rdma-core, verbs.h) and
// LoopbackTransport (P ranks as threads in one process, loopback.h).
//
//   - register_memory: make a local buffer usable as a WRITE source
//     (cached: registering the same range again costs a lookup);
//   - recv_region: the registered buffer the predecessor writes into; its
//     address and rkey were handed to the predecessor when connecting;
//   - post_write_imm: one RDMA WRITE WITH IMMEDIATE of src[off, off + len)
//     to the successor's receive region at remote_off;
//   - poll: completions, until at least one or the deadline. A write's
//     completion means the successor has the data (RC acknowledged); a
//     receive completion carries the immediate of a predecessor's write,
//     in the order the predecessor posted them.
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
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual unsigned rank() const noexcept = 0;
  virtual unsigned world() const noexcept = 0;
  virtual Error register_memory(void* addr, size_t len, Region& out) = 0;
  virtual const Region& recv_region() const noexcept = 0;
  virtual size_t successor_recv_bytes() const noexcept = 0;
  virtual Error post_write_imm(const Region& src, size_t off, size_t len, size_t remote_off,
                               uint32_t imm, uint64_t wr_id) = 0;
  // Fills out[0, n) with 1..max completions, or n = 0 when the deadline passed.
  virtual Error poll(Completion* out, unsigned max, unsigned& n, Clock::time_point deadline) = 0;
  // Largest number of writes the collective may have in flight.
  virtual unsigned max_outstanding_writes() const noexcept = 0;

  unsigned successor() const noexcept { return (rank() + 1) % world(); }
  unsigned predecessor() const noexcept { return (rank() + world() - 1) % world(); }
};

}  // namespace netreduce::host
