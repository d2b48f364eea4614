// The loopback benchmark's side of the box's control socket, through the one
// data plane client (common/dataplane_protocol.h): Box makes calls, Scraper
// loads the socket as netreduced's /metrics scrapes do, and the helpers
// install a traffic model's ring and wait out a removed ring's retirement.
//
// Example. A point of the sweep with ring 0xB0: set_mode forward, measure,
// set_mode aggregate, install_ring(ring_of(t)), measure, remove_ring 0xB0,
// then wait_retired(box, 0xB0) before the next point installs 0xB0 again.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "bench/loopback/traffic.h"
#include "common/dataplane_protocol.h"
#include "common/ring_spec.h"

namespace netreduce::bench {

// Connects, waiting up to 10 s for a box that is still starting; each call
// has a 10 s deadline. A failed call, or (if `must_succeed`) an error reply,
// throws naming the command and the box's error.
class Box {
 public:
  explicit Box(const std::string& path);
  nlohmann::json call(const nlohmann::json& req, bool must_succeed = true);

 private:
  netreduce::DataplaneClient client_;
};

// --scrape-hz: a second control client asks the box what netreduced asks it
// for every /metrics scrape (status, stats, list_rings), `hz` times a second,
// on its own thread, from construction to destruction. `window()` counts the
// scrapes completed since the previous call and their latency.
class Scraper {
 public:
  Scraper(const std::string& socket, double hz);
  ~Scraper();
  nlohmann::json window();

 private:
  void run(const std::string& socket, double hz);

  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> failed_{0};
  std::mutex mu_;
  uint64_t count_ = 0;
  double sum_ms_ = 0, max_ms_ = 0;
};

// A removed ring stays retiring for the box's rings.retire_grace_ms; its id
// cannot be installed again, and forward mode is refused, until it is over.
void wait_retired(Box& box, uint32_t id);

// The ring a traffic model's workers form.
RingSpec ring_of(const Traffic& t);

}  // namespace netreduce::bench
