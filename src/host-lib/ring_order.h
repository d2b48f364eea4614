// The order of the ring: which host follows which. A ring that visits each
// rack's hosts one after the other crosses each rack boundary once (twice
// for the ring's way back), where rank order may cross it at every hop.
//
// Example: ranks 0-3, racks a, b, a, b. Rank order 0, 1, 2, 3 crosses
// between the racks 4 times; by rack, 0, 2, 1, 3 crosses twice. A pinned
// order "0,3,1,2" is taken as given. The ring is rotated so that rank 0's
// host comes first: the same ring, rank 0 at place 0.
#pragma once

#include <string>
#include <vector>

#include "host-lib/local.h"

namespace netreduce::host {

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
