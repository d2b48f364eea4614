// The cost model's link figures (link_figures.h).
#include "host-lib/link_figures.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "host-lib/collective.h"

namespace netreduce::host {
namespace {

constexpr int kSmallCalls = 5;
constexpr size_t kBandwidthBytes = size_t{1} << 20;

using Micros = std::chrono::duration<double, std::micro>;

// The median time of kSmallCalls calls of `call`, in us.
template <typename Call>
Error median_us(Call&& call, double& out) {
  std::vector<double> us;
  for (int i = 0; i < kSmallCalls; ++i) {
    const auto t0 = Clock::now();
    if (Error e = call()) return e;
    us.push_back(Micros(Clock::now() - t0).count());
  }
  std::nth_element(us.begin(), us.begin() + kSmallCalls / 2, us.end());
  out = us[kSmallCalls / 2];
  return {};
}

}  // namespace

LinkFigures configured_links(const Options& o) {
  LinkFigures f;
  f.alpha_us = o.rtt_us / 2;
  f.gbps = o.link_gbps;
  f.box_us = o.box_us;
  return f;
}

Error measure_links(Collective& c, unsigned world, double probe_us, Clock::time_point deadline,
                    LinkFigures& figures) {
  if (world < 2) return {};
  const double steps = 2.0 * (world - 1);
  int32_t one = 1, sum = 0;
  double ring_us = 0;
  if (Error e = median_us(
          [&] { return c.ring_allreduce(&one, &sum, 1, DataType::int32, Op::sum, deadline); },
          ring_us))
    return e;
  const double alpha = ring_us / steps;
  if (probe_us >= alpha) figures.box_us = probe_us - alpha;
  std::vector<float> big(kBandwidthBytes / sizeof(float), 1.0f);
  const auto t0 = Clock::now();
  if (Error e =
          c.ring_allreduce(big.data(), big.data(), big.size(), DataType::fp32, Op::sum, deadline))
    return e;
  const double big_us = Micros(Clock::now() - t0).count();
  const double wire_us = big_us - steps * alpha;
  if (wire_us > 0) figures.gbps = steps * (kBandwidthBytes / double(world)) * 8 / (wire_us * 1e3);
  figures.alpha_us = alpha;
  figures.measured = true;
  return {};
}

std::string encode_links(PathChoice choice, const LinkFigures& f) {
  return fmt::format("{} {:a} {:a} {:a} {}", static_cast<int>(choice), f.alpha_us, f.gbps, f.box_us,
                     f.measured ? 1 : 0);
}

bool decode_links(const std::string& s, PathChoice& choice, LinkFigures& f) {
  int c = 0, measured = 0, end = 0;
  if (std::sscanf(s.c_str(), "%d %la %la %la %d%n", &c, &f.alpha_us, &f.gbps, &f.box_us, &measured,
                  &end) != 5 ||
      static_cast<size_t>(end) != s.size() || c < 0 || c > static_cast<int>(PathChoice::ring))
    return false;
  choice = static_cast<PathChoice>(c);
  f.measured = measured != 0;
  return true;
}

}  // namespace netreduce::host
