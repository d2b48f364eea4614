#include "host-lib/ring_order.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdlib>
#include <map>
#include <numeric>

#include "common/ring_json.h"

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

uint32_t prefix_mask(unsigned len) { return len == 0 ? 0 : ~uint32_t{0} << (32 - len); }

bool leaf_name(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
  });
}

// "a.b.c.d/n" with no host bits set.
bool parse_cidr(const std::string& s, std::pair<uint32_t, unsigned>& out) {
  const size_t slash = s.find('/');
  unsigned len = 0;
  if (slash == std::string::npos || !ipv4_from_string(s.substr(0, slash), out.first)) return false;
  const char* end = s.data() + s.size();
  const auto [p, ec] = std::from_chars(s.data() + slash + 1, end, len);
  if (ec != std::errc() || p != end || slash + 1 == s.size() || len > 32) return false;
  out.second = len;
  return (out.first & ~prefix_mask(len)) == 0;
}

}  // namespace

std::string fabric_rack_of(uint32_t ipv4, const std::vector<FabricRack>& racks) {
  for (const FabricRack& r : racks)
    for (const auto& [net, len] : r.workers)
      if ((ipv4 & prefix_mask(len)) == net) return r.leaf;
  return "";
}

nlohmann::json fabric_racks_json(const std::vector<FabricRack>& racks) {
  nlohmann::json out = nlohmann::json::array();
  for (const FabricRack& r : racks) {
    nlohmann::json workers = nlohmann::json::array();
    for (const auto& [net, len] : r.workers)
      workers.push_back(ipv4_to_string(net) + "/" + std::to_string(len));
    out.push_back({{"leaf", r.leaf}, {"workers", workers}});
  }
  return out;
}

bool parse_fabric_racks(const nlohmann::json& j, std::vector<FabricRack>& out) {
  out.clear();
  std::vector<FabricRack> racks;
  if (!j.is_array()) return false;
  for (const auto& e : j) {
    if (!e.is_object() || !e.contains("leaf") || !e["leaf"].is_string() ||
        !leaf_name(e["leaf"].get<std::string>()) || !e.contains("workers") ||
        !e["workers"].is_array())
      return false;
    FabricRack r{e["leaf"].get<std::string>(), {}};
    for (const auto& w : e["workers"]) {
      std::pair<uint32_t, unsigned> cidr;
      if (!w.is_string() || !parse_cidr(w.get<std::string>(), cidr)) return false;
      r.workers.push_back(cidr);
    }
    racks.push_back(std::move(r));
  }
  out = std::move(racks);
  return true;
}

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
