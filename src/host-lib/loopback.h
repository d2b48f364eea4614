// LoopbackTransport: P ranks as threads of one process, for unit tests of
// the collectives without an RDMA device.
//
// A LoopbackFabric holds every rank's receive region and completion queue
// behind one mutex. post_write_imm() delivers at once: the bytes land in the
// successor's receive region, the successor gets a receive completion with
// the immediate, the writer a write completion; in the order posted, like RC.
//
// With `box` set, the fabric emulates the netreduce box by packetizing: every
// write that starts with an INA header is cut into RoCEv2 frames through
// wire::build_message_packet (rank r at 10.0.0.1 + r, real PSNs starting near
// the 2^24 wrap, RETH, ImmDt, ICRC) and fed to a real engine::Engine with the
// job's ring installed. What the engine releases (or forwards) is parsed
// and its payload written into the receiver's region at its offset; a
// write completes, on both sides, when its last packet has been delivered.
// Packets the engine drops are lost for good (there is no retransmission
// here): the writer then times out, which is how tests see them. Writes
// without the INA magic are delivered directly (the engine would forward
// them untouched).
//
// Rings. With `rings` = R every rank's transport has R lanes (transport.h),
// each with its own receive region of recv_bytes, PSN sequence and
// connection: lane g of rank r writes to destination QPN 0x100 + 64 g +
// (r + 1) mod P from UDP source port 0xC000 + 64 g + r, so the engine's CLT
// tells the rings apart as it would real QPs. With a box, ring g is
// installed with id ring.ring_id + g. Lane 0 is exactly the one-ring fabric.
//
// Local ranks (parallel NetReduce). With `local_size` = n, `world` counts
// hosts (the ring members, 10.0.0.1 + host) and the job has world x n
// ranks: global rank r is local rank r % n of host r / n. Each host has
// n x R lanes; local rank l owns lanes l R .. l R + R - 1 (ring l, striped
// R ways) with its own completion queue, and sees them as its lanes
// 0..R - 1, with rank() the host and world() the host count: the transport
// of ring l. The box installs n x R rings, ids ring.ring_id + l R + s. The
// local ranks of a host share a real shm segment (LocalGroup, local.h),
// named from a per-fabric nonce, so they must be created concurrently.
#pragma once

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
  static uint32_t rank_ip(unsigned rank) noexcept { return 0x0A000001u + rank; }

  // Box statistics (zero without a box).
  uint64_t packets_into_box() const;
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
