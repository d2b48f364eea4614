// LoopbackTransport: P ranks as threads of one process, for unit tests of
// the collectives without an RDMA device.
//
// Example: P = 3, `box` set, one ring, pmtu 1024. Rank 1 posts a 2 KB write
// that starts with an INA header to rank 2:
//  1. The fabric cuts it into WRITE FIRST and LAST frames
//     (wire::build_message_packet: rank 1 at 10.0.0.2, real PSNs starting
//     near the 2^24 wrap, RETH, ImmDt, ICRC) and feeds them to a real
//     engine::Engine with the job's ring installed.
//  2. The engine holds them until ranks 0 and 2 send theirs; what it then
//     releases (or forwards) is parsed and its payload written into rank
//     2's receive region at its offset.
//  3. Once the last packet is delivered, rank 2 gets a receive completion
//     with the immediate of the last packet as delivered (the box's seal)
//     and rank 1 a write completion.
// A packet the engine drops is lost (no retransmission here): the writer
// times out, which is how tests see drops. Without `box` or the INA magic a
// write is delivered at once, completions in the order posted, as RC does.
// Lanes: with `rings` = R, lane g of rank r writes to QPN 0x100 + 64 g +
// (r + 1) mod P from UDP port 0xC000 + 64 g + r, so the engine's CLT tells
// the rings apart; the box installs ring g as ring.ring_id + g.
// Local ranks: with `local_size` = n, `world` counts hosts (10.0.0.1 +
// host); global rank r is local rank l = r % n of host r / n and owns the
// host's lanes l R .. l R + R - 1, seen as its lanes 0..R - 1 (rank() the
// host); the box installs them as ring.ring_id + l R + s.
//
// Threads:
// - Each rank thread calls its own transport. One fabric mutex guards every
//   receive region, completion queue and the engine; poll() waits on the
//   rank's condition variable.
// - Local ranks of a host share a real shm segment (LocalGroup, local.h)
//   named from a per-fabric nonce, so they must be created concurrently.
#pragma once

#include <functional>
#include <memory>

#include "engine/engine.h"
#include "host-lib/transport.h"

namespace netreduce::host {

struct LoopbackConfig {
  unsigned world = 2;
  size_t recv_bytes = 1u << 20;
  bool box = false;
  unsigned rings = 1;       // lanes per rank (1..kMaxRings of plan.h)
  unsigned local_size = 1;  // ranks per host (1..kMaxLocalRanks of local.h)
  // Ring installed in the box (members are filled in: rank r = 10.0.0.1 + r);
  // with rings > 1, ring g is this spec with id ring.ring_id + g.
  engine::RingSpec ring{};
  engine::EngineConfig engine{};
  // A bypassed box (tests): the packets of INA writes for which this says
  // true skip the engine and reach their receiver as sent. Called with the
  // fabric's lock held: sender rank, lane, the INA header's message id,
  // packet index in the message. Unset: every packet goes through the box.
  std::function<bool(unsigned sender, unsigned lane, uint32_t msg_id, uint32_t k)> bypass;
  // A late ACK (tests): a write for which this says true completes at its
  // sender only after the sender receives a write posted after this one was
  // delivered (its predecessor's next message overtook the ACK). Called
  // with the fabric's lock held: sender rank, lane, work request id.
  std::function<bool(unsigned sender, unsigned lane, uint64_t wr_id)> late_ack;
  // A late read (tests): a receive for which this says true reaches its
  // receiver's completion queue only after the next write to that receiver
  // is delivered, whose data may land over it first (the receiver was slow
  // to read its result). Called with the fabric's lock held: receiver rank,
  // lane, immediate as delivered.
  std::function<bool(unsigned receiver, unsigned lane, uint32_t imm)> late_read;
};

class LoopbackFabric {
 public:
  explicit LoopbackFabric(const LoopbackConfig& cfg);
  ~LoopbackFabric();
  LoopbackFabric(const LoopbackFabric&) = delete;
  LoopbackFabric& operator=(const LoopbackFabric&) = delete;

  // The transport of one rank (each rank once; rank < world x local_size).
  // Errors: rank out of range, taken twice, or the box refusing the ring.
  Error transport(unsigned rank, std::unique_ptr<Transport>& out);

  const LoopbackConfig& config() const noexcept { return cfg_; }

  // The bootstrap's allgather for failover (collective.h's Exchange) among
  // the ring of `rank`'s local rank (every host's, in host order; all ranks
  // without local ranks): rank's k-th call meets every member's k-th;
  // thread-safe.
  Error exchange(unsigned rank, const std::string& mine, std::vector<std::string>& all,
                 Clock::time_point deadline);
  static uint32_t rank_ip(unsigned rank) noexcept { return 0x0A000001u + rank; }

  // Box statistics (zero without a box).
  uint64_t packets_into_box() const;
  // Completions in host `rank`'s queues, not yet polled (late ACKs held
  // back do not count).
  size_t completions_queued(unsigned rank) const;
  uint64_t packets_dropped_by_box() const;
  // Ring g's state at the box (its counters), g < rings x local_size.
  std::optional<engine::RingInfo> box_ring(unsigned g = 0) const;
  // Payload bytes each host sent into the box (INA writes, without headers).
  uint64_t host_bytes_into_box(unsigned host) const;
  // Names the shm segment of a host's local ranks (per fabric).
  uint64_t nonce() const noexcept { return nonce_; }

  struct Impl;

 private:
  LoopbackConfig cfg_;
  std::unique_ptr<Impl> impl_;
  uint64_t nonce_ = 0;
};

// A Communicator over the fabric: path ina when the fabric has a box (and
// options do not force the ring), ring otherwise. It runs the fabric's
// rings; Options::rings must be 0 (the fabric's) or that number, and
// Options::local_size -1 or the fabric's, local_rank -1 or rank % n. With
// local_size > 1 this blocks until the host's other local ranks come (or
// connect_timeout_ms passes).
Error make_loopback_communicator(LoopbackFabric& fabric, unsigned rank, const Options& options,
                                 std::unique_ptr<Communicator>& out);

}  // namespace netreduce::host
