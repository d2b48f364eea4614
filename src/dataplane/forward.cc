// Stage: forward (forward-only mode). The same ports and burst loop without
// INA processing: the baseline every benchmark figure is compared with.
#include <rte_mbuf.h>

#include "dataplane/lcore.h"

namespace netreduce::dataplane {

void forward(Lcore& lc, rte_mbuf** pkts, unsigned n) {
  for (unsigned i = 0; i < n; ++i) transmit(lc, pkts[i], lc.slot_of(pkts[i]->port));
}

}  // namespace netreduce::dataplane
