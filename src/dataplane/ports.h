// Port setup: one helper for every DPDK port this project configures (the
// box's two ports, the loopback benchmark's generator ports).
//
// configure_port queries the device, checks the MTU against what it can
// receive (ethdev checks the frame, MTU + Ethernet header + FCS, against the
// device's largest receive frame as well as its MTU limit), configures the
// queues with the descriptor counts the device accepts and the mbuf pool for
// RX. start_port starts it in promiscuous mode (a bump in the wire, or a
// generator, passes every MAC). Errors name `field` and say what failed.
#pragma once

#include <rte_mempool.h>

#include <cstdint>
#include <string>

#include "common/status.h"

namespace netreduce::dataplane {

struct PortSetup {
  uint16_t port = 0;
  std::string name;   // for messages
  std::string field;  // the configuration field a failure is reported under
  uint16_t rx_queues = 1, tx_queues = 1;
  uint16_t rx_desc = 1024, tx_desc = 1024;  // adjusted to the device's limits
  uint32_t mtu = 0;                         // 0: the largest the device takes, up to kMaxMtu
  rte_mempool* pool = nullptr;              // RX buffers
};

inline constexpr uint32_t kMaxMtu = 4200;  // RoCE MTU 4096 + headers

// A DPDK error code (negative or positive errno) as text.
std::string dpdk_error(int rc);
// The largest MTU the device can receive (0 if it cannot be asked).
uint32_t port_max_mtu(uint16_t port);
// The device's queue limits (0 if it cannot be asked).
void port_max_queues(uint16_t port, uint16_t& rx, uint16_t& tx);
Status configure_port(const PortSetup& p);
Status start_port(const PortSetup& p);

}  // namespace netreduce::dataplane
