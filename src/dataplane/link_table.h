// The link table: what a worker reads to know which worker owns a frame.
// Built by the control thread from the placement's counts (placement.h),
// published RCU-style (dataplane.h) and read by dispatch and aggregate.
// DPDK-free.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

namespace netreduce::dataplane {

// (src, dst) address pair of adjacent ring members -> owning worker index,
// or kSplitBit | home when rings on several workers use the link (rings over
// the same members that give their QP numbers, e.g. the stripes of one job):
// then the packet's receiving connection (dst, BTH dest QP) -> owning worker
// decides, and a connection of no ring goes to `home`, a worker holding a
// ring on the link, whose engine drops what claims a ring it does not have
// (never to a worker without the link, which would forward it); tree id (= ring id) -> the worker
// owning that ring's tree node, for the box-to-box frames (UDP wire::kB2bPort) dispatch steers by
// their tree id; and the box's box-to-box addresses (every tree node's self address, on any
// worker), which aggregate hands its engine each burst (Engine::set_box_addresses): a frame for
// the box that dispatch cannot steer by tree id (unknown tree, a header too short to name one,
// IPv4 options, cut short, fragmented) is judged and dropped by whichever engine receives it,
// never forwarded by one without the tree. Written by the control thread (a new table per change,
// published RCU); read by dispatch and aggregate.
struct LinkTable {
  static constexpr uint16_t kSplitBit = 0x8000;  // kMaxWorkers < 0x8000
  std::unordered_map<uint64_t, uint16_t> owner;
  std::unordered_map<uint64_t, uint16_t> conn_owner;  // conn_key -> worker (split links only)
  std::unordered_map<uint32_t, uint16_t> tree_owner;
  std::vector<uint32_t> box_ips;  // host order, each once (a box has few: usually one)
  static uint64_t key(uint32_t src, uint32_t dst) { return uint64_t{src} << 32 | dst; }
  static uint64_t conn_key(uint32_t dst, uint32_t qpn) { return uint64_t{dst} << 24 | qpn; }
};

}  // namespace netreduce::dataplane
