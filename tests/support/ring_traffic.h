// Ring traffic addressing: the one fixture that gives a ring's ranks their
// addresses and connections in every test and benchmark (the engine tests'
// harness, the RC ring simulator, the engine fuzz test, engine-bench and
// netreduce-loopback's traffic model).
//
// A ring of `ranks` members: rank r has IPv4 ip0 + r (host order), sends
// its RDMA WRITEs to its successor (r + 1) % ranks from UDP source port
// 0xC000 + r, and receives its predecessor's on QP qpn0 + r. `at(ranks,
// offset)` places a ring `offset` addresses (and QPNs) after 10.0.0.1, so
// several rings in one test have disjoint members and connections; a new
// run of the same job (new QPs) moves qpn0 on.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/engine.h"
#include "wire/message.h"

namespace netreduce::testing {

struct RingAddressing {
  static constexpr uint32_t kIp0 = 0x0A000001u;  // 10.0.0.1
  static constexpr uint32_t kQpn0 = 0x100;

  unsigned ranks = 2;
  uint32_t ip0 = kIp0;    // rank 0's IPv4, host order
  uint32_t qpn0 = kQpn0;  // the QP on which rank 0 receives the ring's data

  static RingAddressing at(unsigned ranks, unsigned offset) {
    return {ranks, kIp0 + offset, kQpn0 + offset};
  }
  uint32_t ip(unsigned r) const { return ip0 + r; }
  unsigned succ(unsigned r) const { return (r + 1) % ranks; }
  uint32_t recv_qpn(unsigned r) const { return qpn0 + r; }
  static uint16_t udp_src_port(unsigned r) { return static_cast<uint16_t>(0xC000 + r); }

  std::vector<uint32_t> members() const {
    std::vector<uint32_t> m;
    for (unsigned r = 0; r < ranks; ++r) m.push_back(ip(r));
    return m;
  }
  engine::RingSpec spec(uint32_t ring_id, uint16_t msg_len, uint16_t window,
                        uint16_t payload_bytes) const {
    engine::RingSpec s;
    s.ring_id = ring_id;
    s.members = members();
    s.msg_len = msg_len;
    s.window = window;
    s.payload_bytes = payload_bytes;
    return s;
  }
  // Rank r's INA message to its successor: addresses, connection, INA
  // header, first PSN and data; RETH address, rkey, immediate and MACs are
  // the caller's (RoceFrameSpec's defaults otherwise).
  wire::InaMessage message(unsigned r, uint32_t ring_id, uint32_t msg_id, wire::Dtype dtype,
                           wire::ReduceOp op, uint32_t psn0, const uint8_t* data, size_t bytes,
                           uint16_t pmtu) const {
    wire::InaMessage m;
    m.base.src_ip = ip(r);
    m.base.dst_ip = ip(succ(r));
    m.base.dest_qp = recv_qpn(succ(r));
    m.base.udp_src_port = udp_src_port(r);
    m.ina.dtype = static_cast<uint8_t>(dtype);
    m.ina.op = static_cast<uint8_t>(op);
    m.ina.ring_id = ring_id;
    m.ina.rank = static_cast<uint16_t>(r);
    m.ina.msg_id = msg_id;
    m.psn0 = psn0;
    m.data = data;
    m.data_bytes = bytes;
    m.pmtu = pmtu;
    return m;
  }
};

}  // namespace netreduce::testing
