#include "engine/engine_json.h"

#include <string>

#include "common/ring_json.h"

namespace netreduce {

using nlohmann::json;

json reasons_to_json(const engine::ReasonCounters& c) {
  json j = json::object();
  for (size_t i = 0; i < c.size(); ++i)
    j[std::string(engine::to_string(static_cast<engine::Reason>(i)))] = c[i];
  return j;
}

json ring_info_to_json(const engine::RingInfo& i) {
  json drops = json::object();
  for (size_t r = 0; r < i.counters.drops.size(); ++r)
    if (engine::fate_of(static_cast<engine::Reason>(r)) == engine::Fate::drop)
      drops[std::string(engine::to_string(static_cast<engine::Reason>(r)))] = i.counters.drops[r];
  return {{"spec", ring_to_json(i.spec)},
          {"counters",
           {{"packets_aggregated", i.counters.packets_aggregated},
            {"bytes_aggregated", i.counters.bytes_aggregated},
            {"cells_completed", i.counters.cells_completed},
            {"messages_completed", i.counters.messages_completed},
            {"retransmissions_served", i.counters.retransmissions_served},
            {"connections_rebound", i.counters.connections_rebound},
            {"drops", drops}}},
          {"slots", i.slots},
          {"memory_bytes", i.memory_bytes},
          {"held_packets", i.held_packets},
          {"held_bytes", i.held_bytes},
          {"open_cells", i.open_cells},
          {"stalled_cells", i.stalled_cells}};
}

}  // namespace netreduce
