// The order of the ring: which host follows which. A ring that visits each
// rack's hosts one after the other crosses each rack boundary once (twice
// for the ring's way back), where rank order may cross it at every hop.
//
// Example: ranks 0-3, racks a, b, a, b. Rank order 0, 1, 2, 3 crosses
// between the racks 4 times; by rack, 0, 2, 1, 3 crosses twice. A pinned
// order "0,3,1,2" is taken as given. The ring is rotated so that rank 0's
// host comes first: the same ring, rank 0 at place 0.
//
// Racks come from each rank's label, or from the box's fabric: rank 0 reads
// the daemon's racks (GET /v1/status, "fabric") and sends them in the job
// header, and a rank without a label takes the leaf of the rack whose
// worker CIDRs hold its address. Racks leaf0 = 10.0.1.0/24 and leaf1 =
// 10.0.2.0/24, ranks at 10.0.1.5, 10.0.2.5, 10.0.1.6, 10.0.2.6: labels
// leaf0, leaf1, leaf0, leaf1, so the ring 0, 2, 1, 3.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "host-lib/local.h"

namespace netreduce::host {

// A rack of the box's fabric: its leaf box's name and its workers' CIDRs
// (network address in host order, prefix length).
struct FabricRack {
  std::string leaf;
  std::vector<std::pair<uint32_t, unsigned>> workers;
  bool operator==(const FabricRack&) const = default;
};

// The leaf of the first rack whose CIDRs hold ipv4 (host order), or "".
std::string fabric_rack_of(uint32_t ipv4, const std::vector<FabricRack>& racks);

// The racks as the daemon writes them ([{"leaf": "leaf0", "workers":
// ["10.0.1.0/24"]}, ...]) and back. parse: false, and `out` empty, unless
// every entry is a leaf name of letters, digits, '.', '_', '-' with
// CIDRs a.b.c.d/n (n <= 32, no host bits set).
nlohmann::json fabric_racks_json(const std::vector<FabricRack>& racks);
bool parse_fabric_racks(const nlohmann::json& j, std::vector<FabricRack>& out);

// hosts: each host's ranks (ascending), hosts in the order of their lowest
// rank; all: every rank's claim. order: host indices in ring order, from
// rank 0's ring_order (each host at its lowest rank's place) when it gives
// one, else by rack (racks in the order of their lowest rank, a host's
// rack its lowest rank's). invalid_argument for a pinned order that is not
// every rank once.
Error ring_order(const std::vector<LocalityClaim>& all,
                 const std::vector<std::vector<unsigned>>& hosts, std::vector<unsigned>& order);

// invalid_argument unless pin is empty or every rank 0..world-1 once.
Error check_ring_order(const std::string& pin, unsigned world);

// options.rack, else NETREDUCE_RACK, else ""; options.ring_order, else
// NETREDUCE_RING_ORDER, else "".
std::string rack_label(const Options& options);
std::string pinned_ring_order(const Options& options);

}  // namespace netreduce::host
