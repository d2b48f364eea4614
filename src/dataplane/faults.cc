// Fault injection: the worker's stage (inject_faults) and the control
// thread's side (the active faults, the table and its publication). The
// theory of operation is in faults.h.
#include "dataplane/faults.h"

#include <rte_cycles.h>
#include <rte_mbuf.h>
#include <rte_rcu_qsbr.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "dataplane/dataplane.h"
#include "wire/headers.h"
#include "wire/ina.h"
#include "wire/opcode.h"

namespace netreduce::dataplane {

std::string_view to_string(FaultKind k) noexcept {
  switch (k) {
    case FaultKind::drop:
      return "drop";
    case FaultKind::duplicate:
      return "duplicate";
    case FaultKind::reorder:
      return "reorder";
    case FaultKind::bypass:
      return "bypass";
  }
  return "invalid";
}

std::optional<FaultKind> fault_kind_from(std::string_view s) noexcept {
  for (FaultKind k : {FaultKind::drop, FaultKind::duplicate, FaultKind::reorder, FaultKind::bypass})
    if (s == to_string(k)) return k;
  return std::nullopt;
}

void FaultTable::size_hits(unsigned workers) {
  lines = std::max<unsigned>(1, static_cast<unsigned>((rules.size() + 7) / 8));
  hits = std::make_unique<Line[]>(size_t{workers} * lines);
  for (size_t i = 0; i < size_t{workers} * lines; ++i)
    for (auto& c : hits[i].n) c.store(0, std::memory_order_relaxed);
}

uint64_t FaultTable::hits_of(unsigned rule, unsigned workers) const noexcept {
  uint64_t sum = 0;
  for (unsigned w = 0; w < workers; ++w) sum += hit(w, rule).load(std::memory_order_relaxed);
  return sum;
}

// ---- worker side ------------------------------------------------------------

namespace {

uint64_t splitmix64(uint64_t x) noexcept {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// xorshift64*: a few cycles, plenty for choosing packets. The state is
// never 0 (seeding makes sure), which xorshift could not leave.
inline uint32_t draw(uint64_t& s) noexcept {
  s ^= s >> 12;
  s ^= s << 25;
  s ^= s >> 27;
  return static_cast<uint32_t>((s * 0x2545F4914F6CDD1Dull) >> 32);
}

// The rule a frame falls under, or -1: RDMA WRITEs only, by receiving
// connection first (rings that gave QP numbers), then by link.
inline int rule_of(const FaultTable& t, const engine::Frame& f) noexcept {
  if (f.status != wire::ParseStatus::ok || !wire::is_rdma_write(f.parsed.opcode)) return -1;
  const auto* ip = reinterpret_cast<const wire::Ipv4Hdr*>(f.pkt.data + f.parsed.l3);
  if (!t.by_conn.empty()) {
    const auto* bth = reinterpret_cast<const wire::Bth*>(f.pkt.data + f.parsed.bth);
    auto it = t.by_conn.find(LinkTable::conn_key(ip->dst.host(), bth->dest_qp.host()));
    if (it != t.by_conn.end()) return it->second;
  }
  if (!t.by_link.empty()) {
    auto it = t.by_link.find(LinkTable::key(ip->src.host(), ip->dst.host()));
    if (it != t.by_link.end()) return it->second;
  }
  return -1;
}

// An ordinary WRITE's first packet (no INA header): a bypass leaves it to
// the engine, which forwards it anyway and records its write, so that its
// later packets still pass when the bypass ends in the middle of it (the
// engine drops a ring link's later packets whose write it never saw). A job
// that failed over to the ring path keeps running across the bypass's end.
inline bool ordinary_first(const engine::Frame& f) noexcept {
  return wire::is_write_first(f.parsed.opcode) &&
         !wire::ina_decode(f.pkt.data + f.parsed.payload, f.parsed.payload_len);
}

}  // namespace

unsigned inject_faults(Lcore& lc, const FaultTable& t, engine::Frame* frames, unsigned n,
                       uint64_t now) {
  Worker& w = lc.w;
  if (w.fault_generation != t.generation) {
    w.fault_generation = t.generation;
    w.fault_rng = splitmix64(t.seed ^ splitmix64(t.generation * 64 + w.index)) | 1;
  }
  engine::Frame out[kMaxBurst];
  unsigned k = 0;
  // The packet reorder holds back, and its rule: it leaves right after the
  // next packet of the same rule, or last in the burst.
  engine::Frame held;
  int held_rule = -1;
  for (unsigned i = 0; i < n; ++i) {
    const engine::Frame& f = frames[i];
    const int r = rule_of(t, f);
    if (r < 0 || now >= t.rules[r].until_tsc || draw(w.fault_rng) >= t.rules[r].threshold ||
        (t.rules[r].kind == FaultKind::bypass && ordinary_first(f))) {
      out[k++] = f;
      if (r >= 0 && r == held_rule) {  // the ring's next packet: the held one follows it
        out[k++] = held;
        held_rule = -1;
        ++w.stats.reasons[held.pkt.meta][index(Reason::fault_reorder)];
        t.hit(w.index, static_cast<unsigned>(r)).fetch_add(1, std::memory_order_relaxed);
      }
      continue;
    }
    auto* m = static_cast<rte_mbuf*>(f.pkt.handle);
    const unsigned slot = f.pkt.meta;
    // Only this worker writes its line: a relaxed add is a plain add.
    auto& hits = t.hit(w.index, static_cast<unsigned>(r));
    switch (t.rules[r].kind) {
      case FaultKind::drop:
        ++w.stats.reasons[slot][index(Reason::fault_drop)];
        hits.fetch_add(1, std::memory_order_relaxed);
        rte_pktmbuf_free(m);
        break;
      case FaultKind::bypass:
        ++w.stats.reasons[slot][index(Reason::fault_bypass)];
        hits.fetch_add(1, std::memory_order_relaxed);
        transmit(lc, m, slot);
        break;
      case FaultKind::duplicate: {
        out[k++] = f;
        // A full burst has no room for a copy (the stages' arrays hold
        // kMaxBurst frames): then the packet goes once. So does one when the
        // pool is empty.
        rte_mbuf* c = k < kMaxBurst ? rte_pktmbuf_copy(m, lc.pool, 0, UINT32_MAX) : nullptr;
        if (!c) break;
        c->port = m->port;
        engine::Frame copy = f;
        copy.pkt.data = rte_pktmbuf_mtod(c, uint8_t*);
        copy.pkt.handle = c;
        out[k++] = copy;
        ++w.stats.reasons[slot][index(Reason::fault_duplicate)];
        hits.fetch_add(1, std::memory_order_relaxed);
        break;
      }
      case FaultKind::reorder:
        if (held_rule < 0) {
          held = f;
          held_rule = r;
        } else {
          out[k++] = f;
          if (r == held_rule) {
            out[k++] = held;
            held_rule = -1;
            ++w.stats.reasons[held.pkt.meta][index(Reason::fault_reorder)];
            hits.fetch_add(1, std::memory_order_relaxed);
          }
        }
        break;
    }
  }
  if (held_rule >= 0) out[k++] = held;  // no later packet of its ring: in order after all
  std::copy(out, out + k, frames);
  return k;
}

// ---- control side -----------------------------------------------------------

Status Dataplane::faults_allowed() const {
  if (cfg_.faults_enabled) return {};
  return {StatusCode::conflict, "faults.enabled",
          "fault injection is off on this box: set faults.enabled: true in the data plane's "
          "configuration (config/dataplane.yaml) and restart it to rehearse faults"};
}

Status Dataplane::set_fault(std::optional<uint32_t> ring, FaultKind kind, double fraction,
                            uint32_t duration_ms) {
  if (Status s = faults_allowed(); !s) return s;
  if (!(fraction >= 0.0 && fraction <= 1.0))  // NaN fails too
    return Status::invalid("fraction", "must be a number from 0 to 1");
  if (duration_ms == 0 || duration_ms > cfg_.faults_max_duration_ms)
    return Status::invalid("duration_ms",
                           "must be 1.." + std::to_string(cfg_.faults_max_duration_ms) +
                               " (faults.max_duration_ms), got " + std::to_string(duration_ms));
  std::vector<uint32_t> ids;
  if (ring) {
    if (!placement_.installed(*ring))
      return {StatusCode::not_found, "ring", "no ring " + std::to_string(*ring) + " installed"};
    ids.push_back(*ring);
  } else {
    for (const auto& [id, e] : placement_.installed()) ids.push_back(id);
    if (ids.empty()) return {StatusCode::not_found, "ring", "no ring is installed"};
  }
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(duration_ms);
  const uint64_t until_tsc = rte_rdtsc() + rte_get_tsc_hz() / 1000 * uint64_t{duration_ms};
  for (uint32_t id : ids) {
    std::erase_if(faults_, [&](const ActiveFault& a) { return a.ring_id == id; });
    faults_.push_back({id, kind, fraction, until, until_tsc, 0});
  }
  std::sort(faults_.begin(), faults_.end(),
            [](const ActiveFault& a, const ActiveFault& b) { return a.ring_id < b.ring_id; });
  publish_faults();
  spdlog::warn("FAULT INJECTED: {} {} of the packets of {} for {} ms (an operator's rehearsal)",
               to_string(kind), fraction, ring ? "ring " + std::to_string(*ring) : "every ring",
               duration_ms);
  return {};
}

size_t Dataplane::clear_faults(std::optional<uint32_t> ring) {
  const size_t n =
      std::erase_if(faults_, [&](const ActiveFault& a) { return !ring || a.ring_id == *ring; });
  if (n) {
    publish_faults();
    spdlog::warn("faults cleared: {} ({})", n, ring ? "ring " + std::to_string(*ring) : "all");
  }
  return n;
}

void Dataplane::publish_faults() {
  std::unique_ptr<FaultTable> next;
  if (!faults_.empty()) {
    next = std::make_unique<FaultTable>();
    next->generation = ++fault_generation_;
    next->seed = cfg_.faults_seed;
    for (const ActiveFault& a : faults_) {
      const Placement::Ring* ring = placement_.installed(a.ring_id);
      if (!ring) continue;  // gone: expire_faults drops it
      const auto r = static_cast<uint16_t>(next->rules.size());
      // fraction x 2^32, exact at 0 and 1.
      next->rules.push_back(
          {a.ring_id, a.kind, static_cast<uint64_t>(std::ldexp(a.fraction, 32)), a.until_tsc});
      const std::vector<uint64_t> conns = conns_of(ring->spec, ring->tree);
      if (!conns.empty()) {
        for (uint64_t c : conns) next->by_conn[c] = r;
      } else {
        for (uint64_t l : links_of(ring->spec, ring->tree)) next->by_link[l] = r;
      }
    }
    next->size_hits(static_cast<unsigned>(workers_.size()));
  }
  fault_table_.store(next.get(), std::memory_order_release);
  uint64_t token = 0;
  const Status s = quiesce(&token);
  // No worker reads the old table any more (unless one is stuck: then its
  // figures may still grow a little): its hits are carried over.
  if (FaultTable* old = fault_owned_.get()) {
    for (unsigned r = 0; r < old->rules.size(); ++r)
      for (ActiveFault& a : faults_)
        if (a.ring_id == old->rules[r].ring_id)
          a.packets += old->hits_of(r, static_cast<unsigned>(workers_.size()));
  }
  if (!s) {
    spdlog::warn("fault table replaced; the old one is kept until {}", s.message());
    faults_deferred_.emplace_back(token, std::move(fault_owned_));
  }
  fault_owned_ = std::move(next);
}

void Dataplane::expire_faults() {
  std::erase_if(faults_deferred_,
                [&](const auto& d) { return rte_rcu_qsbr_check(qsbr_, d.first, false) == 1; });
  if (faults_.empty()) return;
  const auto now = std::chrono::steady_clock::now();
  const size_t n = std::erase_if(faults_, [&](const ActiveFault& a) {
    const bool over = a.until <= now || !placement_.installed(a.ring_id);
    if (over)
      spdlog::warn("fault on ring {} ({} {}) ended{}", a.ring_id, to_string(a.kind), a.fraction,
                   placement_.installed(a.ring_id) ? "" : ": the ring was removed");
    return over;
  });
  if (n) publish_faults();
}

nlohmann::json Dataplane::faults_json() {
  auto arr = nlohmann::json::array();
  const auto now = std::chrono::steady_clock::now();
  const FaultTable* t = fault_owned_.get();
  for (const ActiveFault& a : faults_) {
    uint64_t packets = a.packets;
    if (t)
      for (unsigned r = 0; r < t->rules.size(); ++r)
        if (t->rules[r].ring_id == a.ring_id)
          packets += t->hits_of(r, static_cast<unsigned>(workers_.size()));
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(a.until - now).count();
    arr.push_back({{"ring", a.ring_id},
                   {"kind", to_string(a.kind)},
                   {"fraction", a.fraction},
                   {"remaining_ms", std::max<int64_t>(0, left)},
                   {"packets", packets}});
  }
  return arr;
}

}  // namespace netreduce::dataplane
