// VerbsTransport (rdma-core) and Communicator::create.
//
// Each rank opens the device (port, GID, PD) and joins the bootstrap; the
// job plan (job.h) runs over it: rank 0 broadcasts the number of stripes R
// (Options::rings; 1 for 0) and a job nonce, and an allgather of locality
// claims numbers hosts and local ranks (local.h). A rank's ring is local rank
// l of every host, in host order (without local ranks: every rank, in rank
// order); the transport's rank and world are its position on that ring and
// the host count H. With local ranks the host's shared segment is created
// next (LocalGroup, named from the nonce and the host index). Then each rank
// makes one CQ and, per stripe (a lane of transport.h), two RC QPs: qp_s[g]
// sends to the ring successor, qp_p[g] receives from the predecessor (H = 2
// gives two QPs between the same pair, one per direction), and one receive
// region of R equal parts, part g for lane g, registered with remote write
// access. Its address, rkey and part size, each QP's number and initial PSN,
// the GID, the port's active MTU and the options that must agree travel
// through the bootstrap's allgather (all ranks). Then qp_s[g] is brought to
// RTS against the successor's qp_p[g] and qp_p[g] against the predecessor's
// qp_s[g] (RoCEv2: a GRH with the peer's GID, path MTU = payload_bytes, so
// the NIC cuts messages exactly where the box expects), a second allgather
// makes sure every QP is ready before anything is sent, and rank 0 registers
// the job's n x R rings (ring l R + s: local rank l's ring, stripe s) in one
// call and broadcasts the path and their ids. The probe's verdict is
// gathered over all ranks. Distinct QPs per ring mean distinct QPNs, hence
// distinct UDP source ports (RoCEv2 derives them from the QPN), which is what
// lets NIC RSS and the box tell the rings apart. local_size 1 is the plain
// communicator: one ring of every rank, the same ids and the same wire bytes.
//
// Receives: WRITE WITH IMM consumes a receive WQE; each qp_p keeps its
// receive queue full (zero-SGE WQEs, re-posted as completions are polled).
// A completion's lane is found from its QP number. Memory
// registrations are cached by address range and released with the
// transport. Polling spins with yields, then sleeps 20 us per empty poll,
// until the deadline.
#include <arpa/inet.h>
#include <infiniband/verbs.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <thread>

#include "common/ring_json.h"
#include "host-lib/bootstrap.h"
#include "host-lib/comm_impl.h"
#include "host-lib/daemon.h"
#include "host-lib/job.h"
#include "host-lib/local.h"

namespace netreduce {
namespace host {
namespace {

constexpr int kQueueDepth = 1024;

Error verr(const std::string& m) { return Error::make(ErrorCode::transport, m); }

ibv_mtu mtu_enum(uint16_t bytes) {
  switch (bytes) {
    case 256:
      return IBV_MTU_256;
    case 512:
      return IBV_MTU_512;
    case 1024:
      return IBV_MTU_1024;
    case 2048:
      return IBV_MTU_2048;
    default:
      return IBV_MTU_4096;
  }
}
unsigned mtu_bytes(int e) { return 128u << e; }  // IBV_MTU_256 = 1

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
  uint32_t failback_calls = 0;  // every rank tries the box again on the same call
};

class VerbsTransport final : public Transport {
 public:
  ~VerbsTransport() override {
    for (ibv_qp* q : qp_s_)
      if (q) ibv_destroy_qp(q);
    for (ibv_qp* q : qp_p_)
      if (q) ibv_destroy_qp(q);
    for (auto& [addr, e] : mrs_) ibv_dereg_mr(e.mr);
    if (recv_mr_) ibv_dereg_mr(recv_mr_);
    if (cq_) ibv_destroy_cq(cq_);
    if (pd_) ibv_dealloc_pd(pd_);
    if (ctx_) ibv_close_device(ctx_);
    std::free(recv_buf_);
  }

  unsigned rank() const noexcept override { return rank_; }
  unsigned world() const noexcept override { return world_; }
  unsigned lanes() const noexcept override { return static_cast<unsigned>(recv_.size()); }
  const Region& recv_region(unsigned lane) const noexcept override { return recv_[lane]; }
  size_t successor_recv_bytes() const noexcept override { return succ_.recv_len; }
  unsigned max_outstanding_writes() const noexcept override { return kQueueDepth; }

  Error register_memory(void* addr, size_t len, Region& out) override {
    const auto a = reinterpret_cast<uintptr_t>(addr);
    auto it = mrs_.upper_bound(a);
    if (it != mrs_.begin()) {
      --it;
      if (a >= it->first && a + len <= it->first + it->second.len) {
        ibv_mr* mr = it->second.mr;
        out = {static_cast<uint8_t*>(addr), len, mr->lkey, mr->rkey};
        return {};
      }
    }
    ibv_mr* mr = ibv_reg_mr(pd_, addr, len, IBV_ACCESS_LOCAL_WRITE);
    if (!mr)
      return verr("ibv_reg_mr of " + std::to_string(len) +
                  " bytes failed: " + std::strerror(errno));
    mrs_[a] = {len, mr};
    out = {static_cast<uint8_t*>(addr), len, mr->lkey, mr->rkey};
    return {};
  }

  Error post_write_imm(unsigned lane, const Region& src, size_t off, size_t len, size_t remote_off,
                       uint32_t imm, uint64_t wr_id) override {
    if (lane >= qp_s_.size() || off + len > src.len || remote_off + len > succ_.recv_len)
      return Error::make(ErrorCode::invalid_argument, "write of " + std::to_string(len) +
                                                          " bytes on lane " + std::to_string(lane) +
                                                          " outside the registered regions");
    ibv_sge sge{};
    sge.addr = reinterpret_cast<uintptr_t>(src.addr + off);
    sge.length = static_cast<uint32_t>(len);
    sge.lkey = src.lkey;
    ibv_send_wr wr{};
    wr.wr_id = wr_id;
    wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
    wr.sg_list = len ? &sge : nullptr;
    wr.num_sge = len ? 1 : 0;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.imm_data = htonl(imm);
    wr.wr.rdma.remote_addr = succ_.recv_addr + lane * succ_.recv_len + remote_off;
    wr.wr.rdma.rkey = succ_.recv_rkey;
    ibv_send_wr* bad = nullptr;
    if (const int rc = ibv_post_send(qp_s_[lane], &wr, &bad))
      return verr(who_ + ": ibv_post_send to successor rank " +
                  std::to_string(global(successor())) + " (" +
                  lane_label(local_rank_, local_size_, lane) + ") failed: " + std::strerror(rc));
    return {};
  }

  Error poll(Completion* out, unsigned max, unsigned& n, Clock::time_point deadline) override {
    n = 0;
    ibv_wc wc[16];
    unsigned empty = 0;
    for (;;) {
      const int got = ibv_poll_cq(cq_, static_cast<int>(std::min(max, 16u)), wc);
      if (got < 0) return verr(who_ + ": ibv_poll_cq failed");
      for (int i = 0; i < got; ++i) {
        Completion& c = out[n++];
        c = {};
        c.ok = wc[i].status == IBV_WC_SUCCESS;
        c.vendor_status = wc[i].status;
        c.what = ibv_wc_status_str(wc[i].status);
        c.wr_id = wc[i].wr_id;
        c.kind = Completion::Kind::write_done;
        for (unsigned g = 0; g < qp_p_.size(); ++g) {
          if (wc[i].qp_num == qp_p_[g]->qp_num) {
            c.kind = Completion::Kind::recv_imm;
            c.lane = g;
            break;
          }
          if (wc[i].qp_num == qp_s_[g]->qp_num) {
            c.lane = g;
            break;
          }
        }
        if (c.kind == Completion::Kind::recv_imm) {
          c.imm = ntohl(wc[i].imm_data);
          c.byte_len = wc[i].byte_len;
          if (c.ok) {
            if (Error e = post_recvs(c.lane, 1)) return e;
          }
        }
      }
      if (n > 0) return {};
      if (Clock::now() >= deadline) return {};
      if (++empty < 1000) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(20));
      }
    }
  }

  Error post_recvs(unsigned lane, int count) {
    for (int i = 0; i < count; ++i) {
      ibv_recv_wr wr{};
      ibv_recv_wr* bad = nullptr;
      if (const int rc = ibv_post_recv(qp_p_[lane], &wr, &bad))
        return verr(who_ + ": ibv_post_recv (" + lane_label(local_rank_, local_size_, lane) +
                    ") failed: " + std::strerror(rc));
    }
    return {};
  }

  // Opens the device: port, GID and PD. gid_index < 0: the first RoCEv2
  // IPv4-mapped GID. The lanes come later (create_lanes), once the number
  // of rings is known.
  Error open(unsigned rank, unsigned world, const std::string& device, int gid_index, uint8_t port,
             uint8_t qp_timeout) {
    if (qp_timeout < 1 || qp_timeout > 31)
      return Error::make(ErrorCode::invalid_argument,
                         "qp_timeout: " + std::to_string(qp_timeout) + " is outside 1..31");
    qp_timeout_ = qp_timeout;
    rank_ = rank;
    world_ = world;
    who_ = "rank " + std::to_string(rank);
    port_ = port;
    int num = 0;
    ibv_device** list = ibv_get_device_list(&num);
    if (!list || num == 0) {
      if (list) ibv_free_device_list(list);
      return Error::make(ErrorCode::no_device,
                         "no RDMA device: ibv_get_device_list found none (for Soft-RoCE: "
                         "modprobe rdma_rxe; rdma link add rxe0 type rxe netdev eth0)");
    }
    ibv_device* dev = nullptr;
    std::string names;
    for (int i = 0; i < num; ++i) {
      const std::string name = ibv_get_device_name(list[i]);
      names += (names.empty() ? "" : ", ") + name;
      if (device.empty() ? i == 0 : name == device) dev = list[i];
    }
    if (!dev) {
      ibv_free_device_list(list);
      return Error::make(ErrorCode::no_device,
                         "no RDMA device named '" + device + "' (present: " + names + ")");
    }
    ctx_ = ibv_open_device(dev);
    devname_ = ibv_get_device_name(dev);
    ibv_free_device_list(list);
    if (!ctx_)
      return Error::make(ErrorCode::no_device,
                         "cannot open RDMA device " + devname_ + ": " + std::strerror(errno));
    ibv_port_attr pa{};
    if (ibv_query_port(ctx_, port_, &pa) != 0)
      return Error::make(ErrorCode::no_device, devname_ + ": no port " + std::to_string(port_));
    if (pa.state != IBV_PORT_ACTIVE)
      return verr(devname_ + " port " + std::to_string(port_) + " is not active");
    active_mtu_ = pa.active_mtu;
    if (gid_index < 0) {
      for (int i = 0; i < pa.gid_tbl_len; ++i) {
        ibv_gid_entry e{};
        if (ibv_query_gid_ex(ctx_, port_, static_cast<uint32_t>(i), &e, 0) != 0) continue;
        const uint8_t* g = e.gid.raw;
        const bool v4 = std::all_of(g, g + 10, [](uint8_t b) { return b == 0; }) && g[10] == 0xFF &&
                        g[11] == 0xFF;
        if (e.gid_type == IBV_GID_TYPE_ROCE_V2 && v4) {
          gid_index = i;
          break;
        }
      }
      if (gid_index < 0)
        return verr(devname_ + " port " + std::to_string(port_) +
                    ": no RoCEv2 GID with an IPv4 address (give --gid-index)");
    }
    gid_index_ = gid_index;
    if (ibv_query_gid(ctx_, port_, gid_index_, &gid_) != 0)
      return verr(devname_ + ": no GID at index " + std::to_string(gid_index_));
    pd_ = ibv_alloc_pd(ctx_);
    if (!pd_) return verr(devname_ + ": cannot create a PD: " + std::strerror(errno));
    return {};
  }

  // The CQ, the receive region (`lanes` parts of recv_bytes) and each lane's
  // two QPs, in INIT with their receive queues full.
  Error create_lanes(unsigned lanes, size_t recv_bytes) {
    ibv_device_attr da{};
    ibv_query_device(ctx_, &da);
    const int depth = std::min(kQueueDepth, da.max_qp_wr > 0 ? da.max_qp_wr : kQueueDepth);
    int cqe = static_cast<int>(lanes) * 4 * kQueueDepth;
    if (da.max_cqe > 0) cqe = std::min(cqe, da.max_cqe);
    cq_ = ibv_create_cq(ctx_, cqe, nullptr, nullptr, 0);
    if (!cq_) return verr(devname_ + ": cannot create a CQ: " + std::strerror(errno));
    const size_t total = lanes * recv_bytes;
    recv_buf_ = static_cast<uint8_t*>(std::aligned_alloc(4096, (total + 4095) / 4096 * 4096));
    if (!recv_buf_) return Error::make(ErrorCode::internal, "out of memory for the receive region");
    std::memset(recv_buf_, 0, total);
    recv_mr_ = ibv_reg_mr(pd_, recv_buf_, total, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    if (!recv_mr_)
      return verr(devname_ + ": cannot register the receive region: " + std::strerror(errno));
    for (unsigned g = 0; g < lanes; ++g)
      recv_.push_back({recv_buf_ + g * recv_bytes, recv_bytes, recv_mr_->lkey, recv_mr_->rkey});
    if (world_ < 2) return {};
    std::random_device rd;
    for (unsigned g = 0; g < lanes; ++g) {
      for (auto* qs : {&qp_s_, &qp_p_}) {
        ibv_qp_init_attr ia{};
        ia.send_cq = cq_;
        ia.recv_cq = cq_;
        ia.qp_type = IBV_QPT_RC;
        ia.cap.max_send_wr = static_cast<uint32_t>(depth);
        ia.cap.max_recv_wr = static_cast<uint32_t>(depth);
        ia.cap.max_send_sge = 1;
        ia.cap.max_recv_sge = 1;
        ibv_qp* q = ibv_create_qp(pd_, &ia);
        if (!q)
          return verr(devname_ + ": cannot create an RC QP for " +
                      lane_label(local_rank_, local_size_, g) + ": " + std::strerror(errno));
        qs->push_back(q);
        ibv_qp_attr a{};
        a.qp_state = IBV_QPS_INIT;
        a.pkey_index = 0;
        a.port_num = port_;
        a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE;
        if (ibv_modify_qp(q, &a,
                          IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
          return verr(devname_ + ": QP to INIT failed: " + std::strerror(errno));
      }
      if (Error e = post_recvs(g, depth)) return e;
      psn_s_.push_back(rd() & 0xFFFFFF);
      psn_p_.push_back(rd() & 0xFFFFFF);
    }
    return {};
  }

  PeerInfo local_info() const {
    PeerInfo i;
    i.world = world_;
    i.rings = lanes();
    for (unsigned g = 0; g < qp_s_.size(); ++g) {
      i.qpn_s[g] = qp_s_[g]->qp_num;
      i.qpn_p[g] = qp_p_[g]->qp_num;
      i.psn_s[g] = psn_s_[g];
      i.psn_p[g] = psn_p_[g];
    }
    std::memcpy(i.gid, gid_.raw, 16);
    i.recv_addr = reinterpret_cast<uintptr_t>(recv_buf_);
    i.recv_len = recv_.empty() ? 0 : recv_[0].len;
    i.recv_rkey = recv_mr_ ? recv_mr_->rkey : 0;
    const uint8_t* g = gid_.raw;
    if (std::all_of(g, g + 10, [](uint8_t b) { return b == 0; }) && g[10] == 0xFF && g[11] == 0xFF)
      i.ipv4 = uint32_t{g[12]} << 24 | uint32_t{g[13]} << 16 | uint32_t{g[14]} << 8 | g[15];
    i.active_mtu = static_cast<uint32_t>(active_mtu_);
    return i;
  }

  // Brings a QP to RTS against the remote QP (number, its send PSN) at gid.
  Error connect_qp(ibv_qp* qp, uint32_t my_psn, uint32_t remote_qpn, uint32_t remote_psn,
                   const uint8_t* remote_gid, uint16_t pmtu, unsigned peer) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = mtu_enum(pmtu);
    a.dest_qp_num = remote_qpn;
    a.rq_psn = remote_psn;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 12;
    a.ah_attr.is_global = 1;
    std::memcpy(a.ah_attr.grh.dgid.raw, remote_gid, 16);
    a.ah_attr.grh.sgid_index = static_cast<uint8_t>(gid_index_);
    a.ah_attr.grh.hop_limit = 64;
    a.ah_attr.port_num = port_;
    if (ibv_modify_qp(qp, &a,
                      IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                          IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
      return verr(who_ + ": QP to RTR with rank " + std::to_string(global(peer)) +
                  " failed: " + std::strerror(errno));
    ibv_qp_attr b{};
    b.qp_state = IBV_QPS_RTS;
    b.timeout = qp_timeout_;  // 4.096 us x 2^qp_timeout per retransmission timeout
    // 6, not 7: rdma_rxe (and some NICs) treat 7 as "retry forever", so a
    // QP whose peer or box vanished would never error out. The collectives'
    // own deadlines bound every wait in any case.
    b.retry_cnt = 6;
    b.rnr_retry = 7;  // receive queues are kept full: RNR cannot last
    b.sq_psn = my_psn;
    b.max_rd_atomic = 1;
    if (ibv_modify_qp(qp, &b,
                      IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                          IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
      return verr(who_ + ": QP to RTS with rank " + std::to_string(global(peer)) +
                  " failed: " + std::strerror(errno));
    return {};
  }

  // Parallel NetReduce: this rank is position `pos` of a ring of the job's
  // global ranks `ring` (host order), as local rank l of n. Before
  // create_lanes. Without local ranks the ring is every rank, pos the rank.
  void place(const std::vector<unsigned>& ring, unsigned pos, unsigned l, unsigned n) {
    ring_ = ring;
    rank_ = pos;
    world_ = static_cast<unsigned>(ring.size());
    local_rank_ = l;
    local_size_ = n;
    if (n > 1)
      who_ = "rank " + std::to_string(ring[pos]) + " (host " + std::to_string(pos) +
             ", local rank " + std::to_string(l) + ")";
  }

  // `all`: the ring's members' information, in ring (host) order.
  Error connect(const std::vector<PeerInfo>& all, uint16_t pmtu) {
    if (pmtu > mtu_bytes(active_mtu_))
      return Error::make(ErrorCode::invalid_argument, "payload_bytes: " + std::to_string(pmtu) +
                                                          " exceeds the port's active MTU " +
                                                          std::to_string(mtu_bytes(active_mtu_)));
    succ_ = all[successor()];
    if (world_ == 1) return {};
    const PeerInfo& pred = all[predecessor()];
    for (unsigned g = 0; g < qp_s_.size(); ++g) {
      if (Error e = connect_qp(qp_s_[g], psn_s_[g], succ_.qpn_p[g], succ_.psn_p[g], succ_.gid, pmtu,
                               successor()))
        return e;
      if (Error e = connect_qp(qp_p_[g], psn_p_[g], pred.qpn_s[g], pred.psn_s[g], pred.gid, pmtu,
                               predecessor()))
        return e;
    }
    return {};
  }

 private:
  struct Mr {
    size_t len;
    ibv_mr* mr;
  };
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

}  // namespace
}  // namespace host

Error Communicator::create(int rank, int world, const std::string& device, int gid_index,
                           const std::string& bootstrap, const Options& options,
                           std::unique_ptr<Communicator>& out) {
  using namespace host;
  out.reset();
  if (world < 1 || world > 64)
    return Error::make(ErrorCode::invalid_argument,
                       "world: " + std::to_string(world) + " is outside 1..64");
  if (rank < 0 || rank >= world)
    return Error::make(
        ErrorCode::invalid_argument,
        "rank: " + std::to_string(rank) + " is outside 0.." + std::to_string(world - 1));
  {
    std::string h, err;
    uint16_t p = 0;
    if (!parse_host_port(bootstrap, h, p, err))
      return Error::make(ErrorCode::invalid_argument, err);
  }
  if (options.connect_timeout_ms <= 0 || options.op_timeout_ms <= 0 ||
      options.daemon_timeout_ms <= 0)
    return Error::make(ErrorCode::invalid_argument, "timeouts must be positive");
  if (options.rings != 0)
    if (Error e = check_rings(options.rings)) return e;
  if (Error e = check_local_options(options)) return e;
  const auto deadline = Clock::now() + std::chrono::milliseconds(options.connect_timeout_ms);

  CollectiveConfig cc;
  cc.msg_len = options.msg_len;
  cc.pmtu = options.payload_bytes;
  cc.window = options.window ? options.window
                             : window_from_bdp(options.link_gbps, options.rtt_us,
                                               size_t{options.msg_len} * options.payload_bytes);
  MessagePlan probe;
  if (Error e = make_plan(0, DataType::fp32, cc.msg_len, cc.pmtu, probe)) return e;

  auto t = std::make_unique<VerbsTransport>();
  if (Error e = t->open(static_cast<unsigned>(rank), static_cast<unsigned>(world), device,
                        gid_index, options.port, options.qp_timeout))
    return e;
  std::unique_ptr<Bootstrap> boot;
  std::string job_key = options.job_key;
  if (const char* env = std::getenv("NETREDUCE_JOB_KEY"); job_key.empty() && env) job_key = env;
  if (Error e = Bootstrap::create(static_cast<unsigned>(rank), static_cast<unsigned>(world),
                                  bootstrap, job_key, deadline, boot))
    return e;

  // Step 1 (job.h): rank 0 decides the number of rings per local ring (the
  // stripes R): Options::rings, or for 0 the box's worker count W (the box
  // spreads a job's rings over its workers by their QPs: each ring's spec
  // names them), 1 without a box or with the ring path forced; with n local
  // ranks found in step 2, rings 0 takes max(1, W / n) stripes so that the
  // job's n x R rings fill the workers once, not n times. With it, the job
  // nonce (shared segments' names).
  std::string header;
  if (rank == 0) {
    unsigned r = options.rings;
    if (r == 0) {
      std::string why;
      r = options.force_ring
              ? 1u
              : std::clamp(box_workers(daemon_target(options), options.daemon_timeout_ms, why), 1u,
                           kMaxRings);
    }
    header = encode_job_header(r, random_nonce());
  }
  if (Error e = boot->broadcast(header, deadline)) return e;
  unsigned R = 0;
  uint64_t nonce = 0;
  if (Error e = decode_job_header(header, R, nonce)) return e;
  if (Error e = check_rings(R))
    return Error::make(ErrorCode::bootstrap, "bootstrap: rank 0 sent " + e.message);

  // Step 2: locality. Hosts, local ranks, and my ring (local rank l of every host).
  std::vector<std::string> blobs;
  {
    LocalityClaim mine{host_identity(options), options.local_rank, options.local_size};
    if (Error e = boot->allgather(encode_claim(mine), blobs, deadline)) return e;
  }
  std::vector<LocalityClaim> claims(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r)
    if (Error e = decode_claim(blobs[r], static_cast<unsigned>(r), claims[r])) return e;
  Locality loc;
  if (Error e = resolve_locality(claims, static_cast<unsigned>(rank), loc)) return e;
  const unsigned n = loc.local_size, H = loc.hosts;
  if (options.rings == 0) R = std::max(1u, R / n);
  if (options.ring_id != 0 && uint64_t{options.ring_id} + n * R - 1 > 0xFFFFFFFFu)
    return Error::make(ErrorCode::invalid_argument, "ring_id: " + std::to_string(options.ring_id) +
                                                        " + " + std::to_string(n * R - 1) +
                                                        " (one id per ring) exceeds 2^32 - 1");
  t->place(loc.ring, loc.host, loc.local_rank, n);
  // The host's shared segment: every local rank of the host meets here.
  std::unique_ptr<LocalGroup> local;
  if (n > 1)
    if (Error e = LocalGroup::create(local_segment_name(nonce, loc.host), loc.local_rank, n,
                                     loc.host, options.ring_buffer_bytes, deadline, local))
      return e;

  // Step 3: QPs of my ring (R lanes), exchanged among all ranks.
  const size_t recv_bytes = recv_region_bytes(cc, H, options.ring_buffer_bytes);
  if (Error e = t->create_lanes(R, recv_bytes)) return e;
  PeerInfo mine = t->local_info();
  mine.world = static_cast<uint32_t>(world);
  if (!options.ipv4.empty() && !ipv4_from_string(options.ipv4, mine.ipv4))
    return Error::make(ErrorCode::invalid_argument,
                       "ipv4: '" + options.ipv4 + "' is not an IPv4 address");
  mine.msg_len = cc.msg_len;
  mine.payload_bytes = cc.pmtu;
  mine.window = cc.window;
  mine.force_ring = options.force_ring ? 1 : 0;
  mine.rings_option = options.rings;
  mine.failback_calls = options.failback_calls;

  if (Error e = boot->allgather(std::string(reinterpret_cast<const char*>(&mine), sizeof mine),
                                blobs, deadline))
    return e;
  std::vector<PeerInfo> all(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    if (blobs[r].size() != sizeof(PeerInfo))
      return Error::make(ErrorCode::bootstrap, "bootstrap: rank " + std::to_string(r) +
                                                   " sent malformed connection information");
    std::memcpy(&all[r], blobs[r].data(), sizeof(PeerInfo));
    const PeerInfo& p = all[r];
    if (p.magic != mine.magic || p.world != mine.world || p.msg_len != mine.msg_len ||
        p.payload_bytes != mine.payload_bytes || p.window != mine.window ||
        p.recv_len != mine.recv_len || p.force_ring != mine.force_ring || p.rings != mine.rings ||
        p.rings_option != mine.rings_option || p.failback_calls != mine.failback_calls)
      return Error::make(ErrorCode::invalid_argument,
                         "rank " + std::to_string(r) +
                             " uses different options (world, msg_len, payload_bytes, window, "
                             "ring_buffer_bytes, force_ring, rings or failback_calls) than rank " +
                             std::to_string(rank));
  }
  {
    std::vector<PeerInfo> ring;
    for (unsigned g : loc.ring) ring.push_back(all[g]);
    if (Error e = t->connect(ring, cc.pmtu)) return e;
  }
  // Everyone's QPs are ready before anyone sends.
  if (Error e = boot->allgather("ready", blobs, deadline)) return e;

  // Step 4: rank 0 decides the path and tells everyone. It owns the rings it
  // registered (all n x R of the job): renewed while the communicator lives,
  // deleted at the end (or right away when the probe sends every rank to the
  // ring path, or create fails after this point).
  std::string decision;
  std::vector<std::unique_ptr<OwnedRing>> owned;
  if (rank == 0) {
    // Ring l R + s: local rank l of every host, stripe s; each member's
    // receiving QP of that stripe (qpns) lets the box run the job's rings
    // on different workers.
    std::vector<engine::RingSpec> specs(size_t{n} * R);
    bool ips = true;
    for (unsigned l = 0; l < n; ++l)
      for (unsigned s = 0; s < R; ++s) {
        engine::RingSpec& sp = specs[size_t{l} * R + s];
        for (unsigned g : loc.rings[l]) {
          sp.members.push_back(all[g].ipv4);
          // One ring has nothing to be told apart from: no qpns (so a daemon
          // that does not know the field registers it too).
          if (n * R > 1) sp.qpns.push_back(all[g].qpn_p[s]);
          ips = ips && all[g].ipv4 != 0;
        }
        sp.msg_len = cc.msg_len;
        sp.window = cc.window;
        sp.payload_bytes = cc.pmtu;
      }
    PathDecision d;
    if (options.force_ring) {
      d.reason = "ring forced by options";
    } else if (H < 2) {
      d.reason = world < 2 ? "a single rank needs no box" : "a single host needs no box";
    } else if (!ips) {
      d.reason = "a rank's GID has no IPv4 address (give --ipv4)";
    } else if (std::string why =
                   box_unfit(daemon_target(options), options.daemon_timeout_ms, options.qp_timeout);
               !why.empty()) {
      d.reason = why;
    } else {
      const Registration reg = setup_job_rings(options, bootstrap, specs, R, owned);
      d.ina = reg.installed;
      d.reason = reg.reason;
      d.ring_ids = reg.ring_ids;
    }
    decision = encode_decision(d);
  }
  if (Error e = boot->broadcast(decision, deadline)) return e;
  {
    PathDecision d;
    if (Error e = decode_decision(decision, n * R, d)) return e;
    cc.path = d.ina ? Path::ina : Path::ring;
    cc.reason = d.reason;
    if (d.ina) cc.ring_ids = my_ring_ids(d.ring_ids, loc.local_rank, R);
  }

  // Step 5: the probe on every ring, and its verdict over all ranks.
  std::unique_ptr<Collective> coll;
  if (Error e = Collective::create(*t, cc, coll)) return e;
  if (cc.path == Path::ina) {
    // Trust the box only once a probe all-reduce through it (one element per
    // ring) is right on every rank; otherwise every rank falls back to the
    // ring path together.
    bool confirmed = false;
    std::string why;
    const auto probe_deadline =
        std::max(deadline, Clock::now() + std::chrono::milliseconds(options.daemon_timeout_ms));
    std::string ids;
    for (uint32_t id : cc.ring_ids) ids += (ids.empty() ? "" : ", ") + std::to_string(id);
    if (Error e = probe_box(*coll, loc.host, H, probe_deadline, confirmed, why))
      return Error::make(
          e.code,
          "the daemon installed ring" + std::string(R > 1 ? "s " : " ") + ids +
              (n > 1 ? " (local rank " + std::to_string(loc.local_rank) + "'s)" : std::string()) +
              " but the probe all-reduce through the box failed: " + e.message);
    if (n > 1 && !confirmed)
      why = "local rank " + std::to_string(loc.local_rank) + "'s ring: " + why;
    if (Error e = boot->allgather(confirmed ? "1" : "0" + why, blobs, deadline)) return e;
    for (int r = 0; r < world; ++r) {
      if (blobs[r] == "1") continue;
      cc.path = Path::ring;
      cc.reason = "rank " + std::to_string(r) + ": " + blobs[r].substr(1);
      cc.ring_ids.clear();
      coll.reset();
      for (auto& o : owned) o->release(/*rollback=*/true);
      if (Error e = Collective::create(*t, cc, coll)) return e;
      break;
    }
  }
  // With local ranks, failover agrees among one ring's members (local rank
  // l of every host), over a bootstrap of their own.
  // Every rank learns whether every ring got one: if one did not (a port
  // the network refuses), no ring fails over, as every rank says once.
  std::shared_ptr<Bootstrap> ring_boot;
  if (n > 1 && coll->path() == Path::ina) {
    const auto ring_deadline =
        std::max(deadline, Clock::now() + std::chrono::milliseconds(options.daemon_timeout_ms));
    std::unique_ptr<Bootstrap> rb;
    const Error mine = ring_bootstrap(*boot, loc, job_key, ring_deadline, rb);
    if (Error e = boot->allgather(mine.ok() ? "1" : "0" + mine.message, blobs, ring_deadline))
      return e;
    ring_boot = std::move(rb);
    for (int r = 0; r < world && ring_boot; ++r)
      if (blobs[r] != "1") {
        std::fprintf(stderr, "netreduce: rank %d: no failover to the ring path: rank %d: %s\n",
                     rank, r, blobs[r].substr(1).c_str());
        ring_boot.reset();
      }
  }
  auto impl = std::make_unique<Communicator::Impl>(std::move(t), std::move(coll), options);
  impl->owned_rings = std::move(owned);
  if (n > 1) {
    impl->local = std::move(local);
    impl->global_rank = rank;
    impl->global_world = world;
    impl->host = loc.host;
  }
  std::shared_ptr<Bootstrap> b = std::move(boot);
  // Failover (docs/design.md#failover) agrees among the ring's members: the
  // job's bootstrap, or the ring's own with local ranks.
  if (impl->collective->path() == Path::ina && (n == 1 || ring_boot)) {
    impl->collective->set_exchange(
        [x = n > 1 ? ring_boot : b](const std::string& mine, std::vector<std::string>& all,
                                    Clock::time_point dl) { return x->allgather(mine, all, dl); });
    impl->collective->set_failback(
        options.failback_calls,
        [target = daemon_target(options), ids = cc.ring_ids, ms = options.daemon_timeout_ms] {
          return rings_not_ready(target, ids, ms);
        });
  }
  impl->close_barrier = [b, ms = std::max(options.op_timeout_ms, 1000)] {
    std::vector<std::string> all;
    (void)b->allgather("", all, Clock::now() + std::chrono::milliseconds(ms));
  };
  out = std::make_unique<Communicator>(std::move(impl));
  return {};
}

}  // namespace netreduce
