#include "bench/loopback/generator.h"

#include <rte_cycles.h>
#include <rte_ethdev.h>

#include <algorithm>

#include "dataplane/ports.h"

namespace netreduce::bench {

namespace {

constexpr unsigned kBurst = 32;

}  // namespace

uint64_t g_hz = 0;

std::string port_setup(uint16_t port, rte_mempool* pool, uint16_t nq) {
  netreduce::dataplane::PortSetup p;
  p.port = port;
  p.name = "generator port " + std::to_string(port);
  p.field = "port";
  p.rx_queues = p.tx_queues = nq;
  p.rx_desc = p.tx_desc = 2048;
  p.pool = pool;
  if (netreduce::Status s = netreduce::dataplane::configure_port(p); !s) return s.to_string();
  if (netreduce::Status s = netreduce::dataplane::start_port(p); !s) return s.to_string();
  return "";
}

bool Generator::round(uint64_t base, uint64_t count, bool aggregated, bool timed,
                      std::vector<double>* latencies) {
  const unsigned P = t_.spec().ranks;
  const uint32_t L = t_.packets_per_message();
  const size_t total = count * L * P;
  // --remove-mid-run: frames before `complete` are released before the
  // callback; the P-1 after it are held.
  const size_t complete = std::min(total, (total / (2 * P) + 1) * P);
  const size_t cut = at_half_ ? std::min(total, complete + P - 1) : total;
  out_.resize(total);
  in_.resize(total + kBurst);
  if (rte_pktmbuf_alloc_bulk(p_.pool, out_.data(), static_cast<unsigned>(total)) != 0) return false;
  size_t i = 0;
  for (uint64_t n = base; n < base + count; ++n)
    for (uint32_t k = 0; k < L; ++k)
      for (unsigned r = 0; r < P; ++r, ++i) {
        rte_mbuf* m = out_[i];
        const size_t len =
            t_.build(r, n, k, rte_pktmbuf_mtod(m, uint8_t*), rte_pktmbuf_tailroom(m));
        m->data_len = static_cast<uint16_t>(len);
        m->pkt_len = static_cast<uint32_t>(len);
        f_.bytes_in += len;
      }
  const size_t got = push_and_collect(total, complete, cut, timed, latencies);
  check(base, count, total, got, aggregated);
  return true;
}

size_t Generator::push_and_collect(size_t total, size_t complete, size_t cut, bool timed,
                                   std::vector<double>* latencies) {
  // Timed: push everything, collect everything (or give up after 2 s of silence).
  size_t sent = 0, got = 0;
  const uint64_t t0 = rte_rdtsc();
  uint64_t last = t0, t_last_rx = t0;
  while (got < total) {
    if (sent < total && sent - got < max_inflight_)
      sent += rte_eth_tx_burst(
          p_.tx, p_.q, out_.data() + sent,
          static_cast<uint16_t>(std::min<size_t>(kBurst, (at_half_ ? cut : total) - sent)));
    if (at_half_ && sent == cut && got >= complete) {
      at_half_();
      at_half_ = nullptr;
      last = rte_rdtsc();
    }
    if (p_.tx != p_.rx) {  // nothing should come back the way it went: count and free it
      rte_mbuf* back[kBurst];
      const uint16_t b = rte_eth_rx_burst(p_.tx, p_.q, back, kBurst);
      f_.unknown += b;
      rte_pktmbuf_free_bulk(back, b);
    }
    const uint16_t n = rte_eth_rx_burst(p_.rx, p_.q, in_.data() + got, kBurst);
    const uint64_t now = rte_rdtsc();
    if (n) {
      if (latencies)
        for (uint16_t j = 0; j < n; ++j)
          latencies->push_back(double(now - t0) * 1e6 / double(g_hz));
      got += n;
      last = t_last_rx = now;
      if (got + kBurst > in_.size()) in_.resize(in_.size() * 2);  // more than sent: keep counting
    } else if (now - last > 2 * g_hz) {
      break;
    }
  }
  if (timed) f_.cycles += t_last_rx - t0;
  if (sent < total) rte_pktmbuf_free_bulk(out_.data() + sent, static_cast<unsigned>(total - sent));
  f_.packets_in += sent;
  f_.packets_out += got;
  return got;
}

void Generator::check(uint64_t base, uint64_t count, size_t total, size_t got, bool aggregated) {
  const unsigned P = t_.spec().ranks;
  const uint32_t L = t_.packets_per_message();
  // Check every frame the box released.
  seen_.assign(total, 0);
  for (size_t j = 0; j < got; ++j) {
    rte_mbuf* m = in_[j];
    f_.bytes_out += m->pkt_len;
    Traffic::Id id;
    const auto v = m->nb_segs == 1
                       ? t_.check_frame(rte_pktmbuf_mtod(m, const uint8_t*), m->data_len,
                                        aggregated, base, count, id, scratch_.data())
                       : Traffic::Verdict::unknown;
    if (v == Traffic::Verdict::good) {
      uint8_t& s = seen_[((id.n - base) * L + id.k) * P + id.rank];
      if (s++)
        ++f_.duplicate;
      else
        ++f_.good;
    } else if (v == Traffic::Verdict::bad) {
      ++f_.bad;
    } else {
      ++f_.unknown;
    }
  }
  rte_pktmbuf_free_bulk(in_.data(), static_cast<unsigned>(got));
  for (uint8_t s : seen_) f_.missing += s == 0;
  // A message is complete when every worker got every packet of it.
  for (uint64_t n = 0; n < count; ++n) {
    bool all = true;
    for (size_t j = n * L * P; j < (n + 1) * L * P; ++j) all = all && seen_[j];
    f_.messages += all;
  }
}

}  // namespace netreduce::bench
