#include "dataplane/dataplane.h"

#include <grp.h>
#include <rte_cycles.h>
#include <rte_eal.h>
#include <rte_ethdev.h>
#include <rte_lcore.h>
#include <rte_malloc.h>
#include <rte_mbuf.h>
#include <rte_rcu_qsbr.h>
#include <rte_ring.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "common/ring_json.h"
#include "engine/engine_json.h"

// Rings between workers (inbox, TX handoff): the producer and consumer
// head/tail pairs sit on separate cache lines, so the consumer (the owner)
// and the producers (other workers) never write one line.
static_assert(offsetof(rte_ring, cons) >= offsetof(rte_ring, prod) + RTE_CACHE_LINE_SIZE);
static_assert(offsetof(rte_ring, prod) % RTE_CACHE_LINE_SIZE == 0 &&
              offsetof(rte_ring, cons) % RTE_CACHE_LINE_SIZE == 0);

namespace netreduce::dataplane {

Dataplane::Dataplane(DataplaneConfig cfg) : cfg_(std::move(cfg)) { mode_.store(cfg_.mode); }

Dataplane::~Dataplane() {
  for (Worker* w : workers_) {
    for (auto* b : w->txbuf) rte_free(b);
    if (w->inbox) rte_ring_free(w->inbox);
    if (w->commands) rte_ring_free(w->commands);
    for (auto* r : w->tx_handoff_in) rte_ring_free(r);
    w->~Worker();
    rte_free(w);
  }
  rte_free(qsbr_);
}

PortSetup Dataplane::port_setup(unsigned s) const {
  PortSetup p;
  p.port = port_ids_[s];
  p.name = cfg_.ports[s].name;
  p.field = "ports[" + std::to_string(s) + "]";
  p.rx_desc = cfg_.rx_desc;
  p.tx_desc = cfg_.tx_desc;
  p.mtu = cfg_.mtu;
  p.pool = pool_;
  return p;
}

Status Dataplane::setup() {
  // The control socket's group, before anything is allocated.
  if (Status s = resolve_control_group(); !s) return s;
  if (Status s = find_ports(); !s) return s;
  std::vector<unsigned> lcores;
  if (Status s = worker_lcores(lcores); !s) return s;
  if (Status s = create_pool(); !s) return s;
  const unsigned nw = static_cast<unsigned>(lcores.size());
  // RCU for the link table.
  const size_t qs = rte_rcu_qsbr_get_memsize(static_cast<uint32_t>(lcores.size()));
  qsbr_ = static_cast<rte_rcu_qsbr*>(rte_zmalloc("netreduce_qsbr", qs, RTE_CACHE_LINE_SIZE));
  if (!qsbr_ || rte_rcu_qsbr_init(qsbr_, static_cast<uint32_t>(lcores.size())) != 0)
    return {StatusCode::resource_exhausted, "memory", "cannot allocate the RCU state"};
  links_owned_ = std::make_unique<LinkTable>();
  links_.store(links_owned_.get(), std::memory_order_release);
  uint16_t nrxq[2], ntxq[2];
  if (Status s = configure_ports(nw, nrxq, ntxq); !s) return s;
  publish_cycles_ = rte_get_tsc_hz() / 1000 * kPublishMs;
  stall_threshold_cycles_ = rte_get_tsc_hz() / 1000000 * kStallUs;
  for (unsigned i = 0; i < nw; ++i)
    if (Status s = add_worker(i, lcores[i], nw, nrxq, ntxq); !s) return s;
  placement_ = Placement(nw);
  for (Worker* w : workers_)
    for (unsigned s = 0; s < 2; ++s)
      if (w->txq[s] < 0) w->tx_handoff_to[s] = workers_[w->index % ntxq[s]]->tx_handoff_in[s];
  if (Status s = apply_test_faults(); !s) return s;
  spdlog::info(
      "ports {} (id {}, {} rx / {} tx queues) and {} (id {}, {} rx / {} tx queues); {} worker(s); "
      "mode {}",
      cfg_.ports[0].name, port_ids_[0], nrxq[0], ntxq[0], cfg_.ports[1].name, port_ids_[1], nrxq[1],
      ntxq[1], nw, cfg_.mode == Mode::aggregate ? "aggregate" : "forward");
  return {};
}

Status Dataplane::resolve_control_group() {
  if (cfg_.control_group.empty()) return {};
  const std::string& g = cfg_.control_group;
  if (g.find_first_not_of("0123456789") == std::string::npos && g.size() <= 9) {
    control_gid_ = std::stol(g);
  } else {
    group gr{}, *found = nullptr;
    std::vector<char> buf(16384);
    if (::getgrnam_r(g.c_str(), &gr, buf.data(), buf.size(), &found) != 0 || !found)
      return {StatusCode::not_found, "control.group",
              "no group named '" + g + "' on this system (give a group name or a numeric gid)"};
    control_gid_ = static_cast<long>(found->gr_gid);
  }
  return {};
}

Status Dataplane::find_ports() {
  if (rte_eth_dev_count_avail() == 0)
    return {StatusCode::unavailable, "ports",
            "DPDK found no ports: give PCI devices (bound to vfio-pci) or --vdev arguments in eal"};
  for (unsigned s = 0; s < 2; ++s) {
    if (rte_eth_dev_get_port_by_name(cfg_.ports[s].name.c_str(), &port_ids_[s]) != 0) {
      std::string avail;
      uint16_t p;
      RTE_ETH_FOREACH_DEV(p) {
        char n[RTE_ETH_NAME_MAX_LEN];
        rte_eth_dev_get_name_by_port(p, n);
        avail += std::string(avail.empty() ? "" : ", ") + n;
      }
      return {StatusCode::not_found, "ports[" + std::to_string(s) + "].name",
              "no DPDK port named '" + cfg_.ports[s].name + "' (available: " + avail + ")"};
    }
  }
  if (port_ids_[0] == port_ids_[1]) return Status::invalid("ports", "the two ports must differ");
  return {};
}

// The configured lcores, or every EAL worker lcore.
Status Dataplane::worker_lcores(std::vector<unsigned>& lcores) const {
  lcores = cfg_.workers;
  if (lcores.empty()) {
    unsigned l;
    RTE_LCORE_FOREACH_WORKER(l) lcores.push_back(l);
  }
  if (lcores.empty())
    return Status::invalid(
        "workers",
        "no worker lcore: give EAL at least two lcores (-l 0-1), the main one runs control");
  if (lcores.size() > kMaxWorkers) return Status::invalid("workers", "at most 64 workers");
  for (unsigned l : lcores) {
    if (!rte_lcore_is_enabled(l) || l == rte_get_main_lcore())
      return Status::invalid(
          "workers", "lcore " + std::to_string(l) +
                         " is not an EAL worker lcore (check -l / --lcores; the main lcore is " +
                         std::to_string(rte_get_main_lcore()) + ")");
  }
  return {};
}

// Frames up to the MTU plus Ethernet, two VLAN tags and FCS.
Status Dataplane::create_pool() {
  const uint32_t frame = cfg_.mtu + 14 + 8 + 4;
  // Never below DPDK's default data room: some PMDs (af_packet) need it.
  const uint16_t room =
      static_cast<uint16_t>(RTE_PKTMBUF_HEADROOM + std::max<uint32_t>(RTE_MBUF_DEFAULT_DATAROOM,
                                                                      ((frame + 127) / 128) * 128));
  pool_ = rte_pktmbuf_pool_create("netreduce_pkts", cfg_.mbufs, cfg_.mbuf_cache, 0, room,
                                  rte_socket_id());
  if (!pool_)
    return {StatusCode::resource_exhausted, "memory.mbufs",
            "cannot allocate " + std::to_string(cfg_.mbufs) + " mbufs of " + std::to_string(room) +
                " bytes: " + dpdk_error(rte_errno) +
                " (lower memory.mbufs or give EAL more memory: -m / hugepages)"};
  return {};
}

// Each port gets as many RX and TX queues as there are workers, at most
// what it supports (`nrxq`, `ntxq`).
Status Dataplane::configure_ports(unsigned nw, uint16_t nrxq[2], uint16_t ntxq[2]) {
  for (unsigned s = 0; s < 2; ++s) {
    PortSetup ps = port_setup(s);
    port_max_queues(port_ids_[s], nrxq[s], ntxq[s]);
    if (nrxq[s] == 0 || ntxq[s] == 0)
      return {StatusCode::internal, ps.field, "cannot read the queue limits of " + ps.name};
    ps.rx_queues = nrxq[s] = static_cast<uint16_t>(std::min<unsigned>(nw, nrxq[s]));
    ps.tx_queues = ntxq[s] = static_cast<uint16_t>(std::min<unsigned>(nw, ntxq[s]));
    if (Status st = configure_port(ps); !st) return st;
  }
  return {};
}

engine::EngineConfig Dataplane::engine_config() {
  engine::EngineConfig ec;
  ec.mode = cfg_.reduce_mode;
  ec.icrc_fixup = cfg_.icrc_fixup;
  ec.verify_icrc = cfg_.verify_icrc;
  ec.max_rings = cfg_.max_rings;
  ec.clt_capacity = cfg_.clt_capacity;
  ec.memory_budget = cfg_.engine_memory;
  // The engine's clock is the worker's TSC (`now` in worker_loop).
  ec.retire_grace = rte_get_tsc_hz() / 1000 * uint64_t{cfg_.retire_grace_ms};
  // A resend of a packet whose message's first packet passed while the box
  // was bypassed or down: a millisecond is past reordering on a link and
  // within an RC retransmission timeout (4.096 us x 2^qp_timeout, 67 ms
  // at the host library's default).
  ec.forward_unmatched_after = rte_get_tsc_hz() / 1000 * kForwardUnmatchedMs;
  ec.forward_stalled_after = rte_get_tsc_hz() / 1000 * uint64_t{cfg_.stalled_forward_ms};
  ec.allocator = {[](void* ctx, uint16_t len) -> engine::Pkt {
                    rte_mbuf* m = rte_pktmbuf_alloc(static_cast<rte_mempool*>(ctx));
                    if (!m || rte_pktmbuf_tailroom(m) < len) {
                      rte_pktmbuf_free(m);
                      return {};
                    }
                    m->data_len = m->pkt_len = len;
                    return {rte_pktmbuf_mtod(m, uint8_t*), len, m, 0};
                  },
                  pool_};
  return ec;
}

// Worker i of nw on `lcore`: its engine, publication, inbox and command
// rings, and its RX queues, TX queues or TX handoff ring per port. It joins
// workers_ at once, so the destructor frees what it got if a step fails.
Status Dataplane::add_worker(unsigned i, unsigned lcore, unsigned nw, const uint16_t nrxq[2],
                             const uint16_t ntxq[2]) {
  void* mem = rte_zmalloc("netreduce_worker", sizeof(Worker), RTE_CACHE_LINE_SIZE);
  if (!mem) return {StatusCode::resource_exhausted, "memory", "cannot allocate worker state"};
  Worker* w = new (mem) Worker();
  workers_.push_back(w);
  w->index = i;
  w->lcore = lcore;
  w->engine = std::make_unique<engine::Engine>(engine_config());
  w->stall_cycles = rte_get_tsc_hz() / 1000 * uint64_t{cfg_.stall_timeout_ms};
  w->ring_store = std::make_unique<engine::RingFigures[]>(cfg_.max_rings);
  w->pub.ring_figures = w->ring_store.get();
  w->pub.ring_capacity = cfg_.max_rings;
  publish(*w, rte_rdtsc());
  const std::string id = std::to_string(i);
  w->inbox = rte_ring_create(("nr_in" + id).c_str(), 4096, rte_socket_id(), RING_F_SC_DEQ);
  w->commands = rte_ring_create(
      ("nr_cmd" + id).c_str(), 64, rte_socket_id(),
      RING_F_SC_DEQ);  // control thread callers enqueue (one at a time: on_worker_mu_)
  if (!w->inbox || !w->commands)
    return {StatusCode::resource_exhausted, "memory", "cannot create worker rings"};
  for (unsigned s = 0; s < 2; ++s) {
    if (i < nrxq[s]) w->rxq.emplace_back(s, i);
    if (i < ntxq[s]) {
      w->txq[s] = static_cast<int>(i);
      w->txbuf[s] = static_cast<rte_eth_dev_tx_buffer*>(rte_zmalloc_socket(
          "nr_txbuf", RTE_ETH_TX_BUFFER_SIZE(kMaxBurst), RTE_CACHE_LINE_SIZE, rte_socket_id()));
      if (!w->txbuf[s])
        return {StatusCode::resource_exhausted, "memory", "cannot allocate TX buffers"};
      rte_eth_tx_buffer_init(w->txbuf[s], cfg_.burst);
      rte_eth_tx_buffer_set_err_callback(w->txbuf[s], rte_eth_tx_buffer_count_callback,
                                         &w->stats.reasons[s][index(Reason::tx_full)]);
      if (nw > ntxq[s]) {
        w->tx_handoff_in[s] = rte_ring_create(("nr_tx" + id + "_" + std::to_string(s)).c_str(),
                                              4096, rte_socket_id(), RING_F_SC_DEQ);
        if (!w->tx_handoff_in[s])
          return {StatusCode::resource_exhausted, "memory", "cannot create TX handoff ring"};
      }
    }
  }
  return {};
}

// Test only: NAME=<worker index> puts that worker in a faulty state
// (`flag`), logged loudly; an index that does not exist is refused.
Status Dataplane::apply_test_faults() {
  struct TestFault {
    const char* name;
    bool Worker::*flag;
    const char* what;
  };
  for (const TestFault& t :
       {TestFault{"NETREDUCE_TEST_STALL_WORKER", &Worker::stall,
                  "stalls (no ports, commands, publication or RCU quiescent state) until the box "
                  "stops"},  // bounded control waits
        TestFault{"NETREDUCE_TEST_IGNORE_COMMANDS", &Worker::ignore_commands,
                  "ignores its command ring while running"}}) {  // command deadlines
    const char* v = std::getenv(t.name);
    if (!v || !*v) continue;
    const unsigned idx = static_cast<unsigned>(std::strtoul(v, nullptr, 10));
    if (idx >= workers_.size())
      return Status::invalid(t.name, "worker " + std::to_string(idx) + " does not exist");
    workers_[idx]->*t.flag = true;
    spdlog::warn("TESTING: worker {} (lcore {}) {} ({}); never set this in production", idx,
                 workers_[idx]->lcore, t.what, t.name);
  }
  return {};
}

Status Dataplane::preload_rings(const std::string& path) {
  std::ifstream in(path);
  if (!in) return {StatusCode::not_found, "rings", path + ": cannot open"};
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    return Status::invalid("rings", path + ": " + e.what());
  }
  if (!j.is_array()) return Status::invalid("rings", path + ": must be a JSON array of ring specs");
  for (size_t i = 0; i < j.size(); ++i) {
    engine::RingSpec spec;
    std::optional<engine::TreeSpec> tree;
    if (Status s = ring_tree_from_json(j[i], spec, tree); !s)
      return Status::invalid("rings[" + std::to_string(i) + "]." + s.field(), s.message());
    if (Status s = install_ring(spec, tree); !s)
      return Status(s.code(), "rings[" + std::to_string(i) + "]." + s.field(), s.message());
  }
  return {};
}

}  // namespace netreduce::dataplane
