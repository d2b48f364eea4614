// Stage: forward (forward-only mode). The same ports and burst loop without
// INA processing: the baseline every benchmark figure is compared with.
#include <rte_mbuf.h>

#include "dataplane/dataplane.h"

namespace netreduce::dataplane {

void forward(Dataplane& dp, Worker& w, rte_mbuf** pkts, unsigned n) {
  for (unsigned i = 0; i < n; ++i) transmit(dp, w, pkts[i], pkts[i]->port == dp.port_id(0) ? 0 : 1);
}

}  // namespace netreduce::dataplane
