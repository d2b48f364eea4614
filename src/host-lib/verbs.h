// VerbsTransport: the Transport (transport.h) over rdma-core verbs, and the
// per-rank information its ranks exchange to connect (PeerInfo).
//
// Its life, as Communicator::create (communicator_create.cc) drives it:
//   1. open(): the device, its port, GID and PD;
//   2. place(): this rank's ring (global ranks, host order) and its
//      position on it, once the job's locality is known;
//   3. create_lanes(): the CQ, the receive region and each lane's two RC
//      QPs, once the number of stripes is known;
//   4. local_info() to every rank, and connect() with the ring's members'
//      (every QP to RTS); then the collectives use it as a Transport.
// The theory of operation (QPs, receive queues, polling) is in verbs.cc.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "host-lib/plan.h"
#include "host-lib/transport.h"

namespace netreduce::host {

// The per-rank information every other rank needs (fixed layout, host order;
// all ranks run the same build). Lane g's entries are at index g.
struct PeerInfo {
  uint32_t magic = 0x4E52494E;
  uint32_t world = 0;
  uint32_t rings = 0;                                     // lanes (as rank 0 decided)
  uint32_t rings_option = 0;                              // Options::rings as given (must agree)
  uint32_t qpn_s[kMaxRings] = {}, psn_s[kMaxRings] = {};  // QPs to the successor
  uint32_t qpn_p[kMaxRings] = {}, psn_p[kMaxRings] = {};  // QPs from the predecessor
  uint8_t gid[16] = {};
  uint64_t recv_addr = 0;  // lane g's region at recv_addr + g * recv_len
  uint64_t recv_len = 0;   // one lane's
  uint32_t recv_rkey = 0;
  uint32_t ipv4 = 0;  // host order; 0 = unknown
  uint32_t active_mtu = 0;
  uint16_t msg_len = 0, payload_bytes = 0, window = 0, force_ring = 0;
  uint32_t failback_calls = 0;                 // every rank tries the box again on the same call
  uint8_t path_choice = 0, measure_links = 0;  // every rank chooses alike, measures together
  uint8_t rina = 0;                            // Rina mode (every rank alike)
};

class VerbsTransport final : public Transport {
 public:
  VerbsTransport() = default;
  ~VerbsTransport() override;
  VerbsTransport(const VerbsTransport&) = delete;
  VerbsTransport& operator=(const VerbsTransport&) = delete;

  unsigned rank() const noexcept override { return rank_; }
  unsigned world() const noexcept override { return world_; }
  unsigned job_rank(unsigned place) const noexcept override { return global(place); }
  unsigned lanes() const noexcept override { return static_cast<unsigned>(recv_.size()); }
  const Region& recv_region(unsigned lane) const noexcept override { return recv_[lane]; }
  size_t successor_recv_bytes() const noexcept override { return succ_.recv_len; }
  unsigned max_outstanding_writes() const noexcept override;

  Error register_memory(void* addr, size_t len, Region& out) override;
  Error post_write_imm(unsigned lane, const Region& src, size_t off, size_t len, size_t remote_off,
                       uint32_t imm, uint64_t wr_id) override;
  Error poll(Completion* out, unsigned max, unsigned& n, Clock::time_point deadline) override;

  // Opens the device: port, GID and PD. gid_index < 0: the first RoCEv2
  // IPv4-mapped GID. The lanes come later (create_lanes), once the number
  // of rings is known.
  Error open(unsigned rank, unsigned world, const std::string& device, int gid_index, uint8_t port,
             uint8_t qp_timeout);
  // Parallel NetReduce: this rank is position `pos` of a ring of the job's
  // global ranks `ring` (host order), as local rank l of n. Before
  // create_lanes. Without local ranks the ring is every rank, pos the rank.
  void place(const std::vector<unsigned>& ring, unsigned pos, unsigned l, unsigned n);
  // The CQ, the receive region (`lanes` parts of recv_bytes) and each lane's
  // two QPs, in INIT with their receive queues full.
  Error create_lanes(unsigned lanes, size_t recv_bytes);
  // What the other ranks need of this one (the options' fields left 0).
  PeerInfo local_info() const;
  // `all`: the ring's members' information, in ring (host) order.
  Error connect(const std::vector<PeerInfo>& all, uint16_t pmtu);

 private:
  struct Mr {
    size_t len;
    ibv_mr* mr;
  };
  Error post_recvs(unsigned lane, int count);
  // Brings a QP to RTS against the remote QP (number, its send PSN) at gid.
  Error connect_qp(ibv_qp* qp, uint32_t my_psn, uint32_t remote_qpn, uint32_t remote_psn,
                   const uint8_t* remote_gid, uint16_t pmtu, unsigned peer);
  unsigned global(unsigned pos) const { return pos < ring_.size() ? ring_[pos] : pos; }

  unsigned rank_ = 0, world_ = 1;  // position on my ring, ring size (hosts)
  unsigned local_rank_ = 0, local_size_ = 1;
  std::vector<unsigned> ring_;  // my ring's global ranks, host order
  std::string who_;             // "rank r" (plus host and local rank with local ranks)
  uint8_t port_ = 1, qp_timeout_ = 14;
  int gid_index_ = 0;
  ibv_gid gid_{};
  ibv_mtu active_mtu_ = IBV_MTU_1024;
  std::string devname_;
  ibv_context* ctx_ = nullptr;
  ibv_pd* pd_ = nullptr;
  ibv_cq* cq_ = nullptr;
  std::vector<ibv_qp*> qp_s_, qp_p_;  // per lane
  std::vector<uint32_t> psn_s_, psn_p_;
  uint8_t* recv_buf_ = nullptr;  // every lane's receive region, lane after lane
  ibv_mr* recv_mr_ = nullptr;
  std::vector<Region> recv_;  // per lane
  PeerInfo succ_{};
  std::map<uintptr_t, Mr> mrs_;
};

}  // namespace netreduce::host
