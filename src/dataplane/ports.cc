#include "dataplane/ports.h"

#include <rte_errno.h>
#include <rte_ethdev.h>

#include <algorithm>

namespace netreduce::dataplane {

std::string dpdk_error(int rc) { return rte_strerror(rc < 0 ? -rc : rc); }

uint32_t port_max_mtu(uint16_t port) {
  rte_eth_dev_info info{};
  if (rte_eth_dev_info_get(port, &info) != 0) return 0;
  return std::min<uint32_t>(info.max_mtu, info.max_rx_pktlen > 18 ? info.max_rx_pktlen - 18 : 0);
}

void port_max_queues(uint16_t port, uint16_t& rx, uint16_t& tx) {
  rte_eth_dev_info info{};
  rx = tx = 0;
  if (rte_eth_dev_info_get(port, &info) != 0) return;
  rx = info.max_rx_queues;
  tx = info.max_tx_queues;
}

Status configure_port(const PortSetup& p) {
  rte_eth_dev_info info{};
  if (int rc = rte_eth_dev_info_get(p.port, &info); rc != 0)
    return {StatusCode::internal, p.field, "device info of " + p.name + ": " + dpdk_error(rc)};
  const uint32_t max_mtu = port_max_mtu(p.port);
  const uint32_t mtu = p.mtu ? p.mtu : std::min(kMaxMtu, max_mtu);
  if (mtu > max_mtu)
    return Status::invalid(
        "mtu", "port " + p.name + " supports an MTU of at most " + std::to_string(max_mtu));
  rte_eth_conf conf{};
  conf.rxmode.mtu = mtu;
  if (int rc = rte_eth_dev_configure(p.port, p.rx_queues, p.tx_queues, &conf); rc != 0)
    return {StatusCode::internal, p.field, "configure " + p.name + ": " + dpdk_error(rc)};
  uint16_t rxd = p.rx_desc, txd = p.tx_desc;
  rte_eth_dev_adjust_nb_rx_tx_desc(p.port, &rxd, &txd);
  const int socket = rte_eth_dev_socket_id(p.port);
  for (uint16_t q = 0; q < p.rx_queues; ++q)
    if (int rc = rte_eth_rx_queue_setup(p.port, q, rxd, socket, nullptr, p.pool); rc != 0)
      return {StatusCode::internal, p.field,
              "RX queue setup on " + p.name + ": " + dpdk_error(rc) +
                  " (see the driver's message above)"};
  for (uint16_t q = 0; q < p.tx_queues; ++q)
    if (int rc = rte_eth_tx_queue_setup(p.port, q, txd, socket, nullptr); rc != 0)
      return {StatusCode::internal, p.field,
              "TX queue setup on " + p.name + ": " + dpdk_error(rc) +
                  " (see the driver's message above)"};
  return {};
}

Status start_port(const PortSetup& p) {
  if (int rc = rte_eth_dev_start(p.port); rc != 0)
    return {StatusCode::unavailable, p.field,
            "cannot start port " + p.name + ": " + dpdk_error(rc)};
  rte_eth_promiscuous_enable(p.port);
  return {};
}

}  // namespace netreduce::dataplane
