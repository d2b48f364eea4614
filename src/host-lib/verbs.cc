// VerbsTransport (verbs.h): the Transport of transport.h over rdma-core.
//
// A rank opens the device (port, GID, PD); its rank and world become its
// position on its ring (local rank l of every host, in host order; without
// local ranks every rank, in rank order) and the ring's size, the host count
// H. Once the number of stripes R is known it makes one CQ and, per stripe (a
// lane of transport.h), two RC QPs: qp_s[g] sends to the ring successor,
// qp_p[g] receives from the predecessor (H = 2 gives two QPs between the same
// pair, one per direction), and one receive region of R equal parts, part g
// for lane g, registered with remote write access. Its address, rkey and part
// size, each QP's number and initial PSN, the GID and the port's active MTU
// are what the other ranks need of it (PeerInfo; communicator_create.cc
// exchanges them). Then qp_s[g] is brought to RTS against the successor's
// qp_p[g] and qp_p[g] against the predecessor's qp_s[g] (RoCEv2: a GRH with
// the peer's GID, path MTU = payload_bytes, so the NIC cuts messages exactly
// where the box expects). Distinct QPs per ring mean distinct QPNs, hence
// distinct UDP source ports (RoCEv2 derives them from the QPN), which is what
// lets NIC RSS and the box tell the rings apart.
//
// Receives: WRITE WITH IMM consumes a receive WQE; each qp_p keeps its
// receive queue full (zero-SGE WQEs, re-posted as completions are polled).
// A completion's lane is found from its QP number. Memory
// registrations are cached by address range and released with the
// transport. Polling spins with yields, then sleeps 20 us per empty poll,
// until the deadline.
#include "host-lib/verbs.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>

#include "host-lib/job.h"

namespace netreduce::host {
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

}  // namespace

VerbsTransport::~VerbsTransport() {
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

unsigned VerbsTransport::max_outstanding_writes() const noexcept { return kQueueDepth; }

Error VerbsTransport::register_memory(void* addr, size_t len, Region& out) {
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
    return verr("ibv_reg_mr of " + std::to_string(len) + " bytes failed: " + std::strerror(errno));
  mrs_[a] = {len, mr};
  out = {static_cast<uint8_t*>(addr), len, mr->lkey, mr->rkey};
  return {};
}

Error VerbsTransport::post_write_imm(unsigned lane, const Region& src, size_t off, size_t len,
                                     size_t remote_off, uint32_t imm, uint64_t wr_id) {
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
    return verr(who_ + ": ibv_post_send to successor rank " + std::to_string(global(successor())) +
                " (" + lane_label(local_rank_, local_size_, lane) +
                ") failed: " + std::strerror(rc));
  return {};
}

Error VerbsTransport::poll(Completion* out, unsigned max, unsigned& n, Clock::time_point deadline) {
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

Error VerbsTransport::post_recvs(unsigned lane, int count) {
  for (int i = 0; i < count; ++i) {
    ibv_recv_wr wr{};
    ibv_recv_wr* bad = nullptr;
    if (const int rc = ibv_post_recv(qp_p_[lane], &wr, &bad))
      return verr(who_ + ": ibv_post_recv (" + lane_label(local_rank_, local_size_, lane) +
                  ") failed: " + std::strerror(rc));
  }
  return {};
}

Error VerbsTransport::open(unsigned rank, unsigned world, const std::string& device, int gid_index,
                           uint8_t port, uint8_t qp_timeout) {
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

Error VerbsTransport::create_lanes(unsigned lanes, size_t recv_bytes) {
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

PeerInfo VerbsTransport::local_info() const {
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

Error VerbsTransport::connect_qp(ibv_qp* qp, uint32_t my_psn, uint32_t remote_qpn,
                                 uint32_t remote_psn, const uint8_t* remote_gid, uint16_t pmtu,
                                 unsigned peer) {
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

void VerbsTransport::place(const std::vector<unsigned>& ring, unsigned pos, unsigned l,
                           unsigned n) {
  ring_ = ring;
  rank_ = pos;
  world_ = static_cast<unsigned>(ring.size());
  local_rank_ = l;
  local_size_ = n;
  if (n > 1)
    who_ = "rank " + std::to_string(ring[pos]) + " (host " + std::to_string(pos) + ", local rank " +
           std::to_string(l) + ")";
}

Error VerbsTransport::connect(const std::vector<PeerInfo>& all, uint16_t pmtu) {
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

}  // namespace netreduce::host
