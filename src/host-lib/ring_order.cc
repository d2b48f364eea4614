#include "host-lib/ring_order.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <map>
#include <numeric>

namespace netreduce::host {
namespace {

std::string env_or(const std::string& given, const char* name) {
  if (!given.empty()) return given;
  const char* e = std::getenv(name);
  return e != nullptr ? e : "";
}

// The place of each rank in "r0,r1,...": every rank 0..world-1 once.
bool parse_pinned(const std::string& s, size_t world, std::vector<size_t>& place) {
  place.assign(world, world);
  size_t n = 0, at = 0;
  while (at <= s.size()) {
    const size_t end = std::min(s.find(',', at), s.size());
    unsigned r = 0;
    const auto [p, ec] = std::from_chars(s.data() + at, s.data() + end, r);
    if (ec != std::errc() || p != s.data() + end || r >= world || place[r] != world) return false;
    place[r] = n++;
    at = end + 1;
  }
  return n == world;
}

Error bad_pin(const std::string& pin, size_t world) {
  return Error::make(ErrorCode::invalid_argument,
                     "ring_order: '" + pin + "' is not every rank 0.." + std::to_string(world - 1) +
                         " once, comma-separated");
}

}  // namespace

Error check_ring_order(const std::string& pin, unsigned world) {
  std::vector<size_t> place;
  return pin.empty() || parse_pinned(pin, world, place) ? Error{} : bad_pin(pin, world);
}

Error ring_order(const std::vector<LocalityClaim>& all,
                 const std::vector<std::vector<unsigned>>& hosts, std::vector<unsigned>& order) {
  std::vector<size_t> key(hosts.size());
  const std::string& pin = all[0].ring_order;
  if (!pin.empty()) {
    std::vector<size_t> place;
    if (!parse_pinned(pin, all.size(), place)) return bad_pin(pin, all.size());
    for (size_t h = 0; h < hosts.size(); ++h) key[h] = place[hosts[h][0]];
  } else {
    std::map<std::string, size_t> first;  // rack -> its first host
    for (size_t h = 0; h < hosts.size(); ++h)
      key[h] = first.emplace(all[hosts[h][0]].rack, h).first->second;
  }
  order.resize(hosts.size());
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(),
                   [&](unsigned a, unsigned b) { return key[a] < key[b]; });
  // Host 0 holds rank 0 (hosts are in the order of their lowest rank).
  std::rotate(order.begin(), std::find(order.begin(), order.end(), 0u), order.end());
  return {};
}

std::string rack_label(const Options& options) { return env_or(options.rack, "NETREDUCE_RACK"); }

std::string pinned_ring_order(const Options& options) {
  return env_or(options.ring_order, "NETREDUCE_RING_ORDER");
}

}  // namespace netreduce::host
