#include "bench/loopback/box_client.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <stdexcept>

using nlohmann::json;

namespace netreduce::bench {

Box::Box(const std::string& path) : client_(path, std::chrono::seconds(10)) {
  if (netreduce::Status s = client_.wait_until_connected(std::chrono::seconds(10)); !s)
    throw std::runtime_error("cannot connect to the data plane's control socket " + path + ": " +
                             s.to_string());
}

json Box::call(const json& req, bool must_succeed) {
  json reply;
  const netreduce::Status s = client_.call(req, reply);
  if (!s && (must_succeed || s.code() == netreduce::StatusCode::unavailable))
    throw std::runtime_error("data plane: " + req.value("cmd", std::string("?")) + ": " +
                             s.to_string());
  return reply;
}

Scraper::Scraper(const std::string& socket, double hz) {
  if (hz <= 0) return;
  thread_ = std::thread([this, socket, hz] { run(socket, hz); });
}

Scraper::~Scraper() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
}

void Scraper::run(const std::string& socket, double hz) {
  Box box(socket);
  const auto period = std::chrono::duration<double>(1.0 / hz);
  auto next = std::chrono::steady_clock::now();
  while (!stop_.load(std::memory_order_relaxed)) {
    const auto t0 = std::chrono::steady_clock::now();
    for (const json& req :
         {netreduce::dpcmd::status(), netreduce::dpcmd::stats(), netreduce::dpcmd::list_rings()})
      if (!box.call(req, false).value("ok", false)) failed_.fetch_add(1);
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    {
      std::lock_guard<std::mutex> l(mu_);
      ++count_;
      sum_ms_ += ms;
      max_ms_ = std::max(max_ms_, ms);
    }
    next += std::chrono::duration_cast<std::chrono::steady_clock::duration>(period);
    while (!stop_.load(std::memory_order_relaxed) && std::chrono::steady_clock::now() < next)
      std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(
          next - std::chrono::steady_clock::now(), std::chrono::milliseconds(10)));
  }
}

json Scraper::window() {
  std::lock_guard<std::mutex> l(mu_);
  json j = {{"scrapes", count_},
            {"failed_requests", failed_.exchange(0)},
            {"mean_ms", count_ ? sum_ms_ / double(count_) : 0.0},
            {"max_ms", max_ms_}};
  count_ = 0;
  sum_ms_ = max_ms_ = 0;
  return j;
}

void wait_retired(Box& box, uint32_t id) {
  const json st = box.call(netreduce::dpcmd::status());
  const uint64_t grace_ms = st.value("retire_grace_ms", uint64_t{0});
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(grace_ms) +
                     std::chrono::seconds(10);
  if (grace_ms > 2000)
    std::fprintf(stderr, "  waiting up to %.0f s for ring %u to retire (rings.retire_grace_ms)\n",
                 double(grace_ms) / 1000, id);
  for (;;) {
    bool retiring = false;
    for (const auto& r : box.call(netreduce::dpcmd::status()).value("retiring", json::array()))
      retiring = retiring || r.value("id", uint64_t{0}) == id;
    if (!retiring) return;
    if (std::chrono::steady_clock::now() > until)
      throw std::runtime_error("ring " + std::to_string(id) + " is still retiring after " +
                               std::to_string(grace_ms / 1000 + 10) + " s");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

RingSpec ring_of(const Traffic& t) {
  RingSpec ring;
  ring.ring_id = t.spec().ring_id;
  ring.members = t.members();
  ring.msg_len = t.spec().msg_len;
  ring.window = t.spec().window;
  ring.payload_bytes = t.spec().pmtu;
  // Each member's receiving QP, as the host library registers it: lets the
  // box spread rings over the same members (--stripes) by connection.
  const auto a = t.addressing();
  for (unsigned r = 0; r < t.spec().ranks; ++r) ring.qpns.push_back(a.recv_qpn(r));
  return ring;
}

}  // namespace netreduce::bench
