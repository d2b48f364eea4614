// Parallel NetReduce: locality, the shared segment and its futex barriers,
// and the three-stage all-reduce (theory of operation in local.h).
#include "host-lib/local.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <thread>

#include "host-lib/plan.h"
#include "host-lib/ring_order.h"
#include "reduce/reduce.h"

namespace netreduce::host {

// The segment's first bytes; the input slots and the result area follow,
// each chunk_bytes, at 64-byte aligned offsets.
struct LocalGroup::Header {
  std::atomic<uint64_t> magic;  // written last by local rank 0 (release); read by the others
  uint32_t local_size;          // local rank 0 writes before magic; others check
  uint32_t pad;
  uint64_t chunk_bytes;  // likewise
  // The futex word: every arrival and every failure bumps it (any rank), and
  // wakes the sleepers (any rank).
  alignas(64) std::atomic<uint32_t> bell;
  // 0, or local rank + 1 of the first rank that failed (it CASes 0 -> kClaimed,
  // writes `failure`, then stores l + 1 with release); read by all.
  std::atomic<uint32_t> failed;
  char failure[512];  // written by that rank before it rings; read by the others
  // Barriers reached: arrived[l] is written by local rank l only, read by all.
  alignas(64) std::atomic<uint64_t> arrived[kMaxLocalRanks];
  // The call each local rank makes: call[l] written by local rank l before
  // the first barrier of a call, read by all after it (so every rank sees
  // a disagreement at once instead of a barrier timing out).
  struct Call {
    uint64_t count;
    uint32_t dtype, op;
  } call[kMaxLocalRanks];
};

namespace {

constexpr uint64_t kMagic = 0x4E524C4F43414C31ull;  // "NRLOCAL1"
constexpr size_t kAlign = 64;
constexpr uint32_t kClaimed = 0x80000000u;  // Header::failed while its message is written

static_assert(std::atomic<uint32_t>::is_always_lock_free);
static_assert(std::atomic<uint64_t>::is_always_lock_free);

size_t round_up(size_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

size_t segment_bytes(unsigned n, size_t chunk) {
  return round_up(sizeof(LocalGroup::Header)) + (size_t{n} + 1) * round_up(chunk);
}

void futex_wake(std::atomic<uint32_t>* w) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(w), FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
}

// Sleeps while *w == seen, at most until `until` (and at most 100 ms: a
// safety net, not a poll).
void futex_wait(std::atomic<uint32_t>* w, uint32_t seen, Clock::time_point until) {
  auto left = until - Clock::now();
  if (left <= Clock::duration::zero()) return;
  left = std::min<Clock::duration>(left, std::chrono::milliseconds(100));
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
  timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(w), FUTEX_WAIT, seen, &ts, nullptr, 0);
}

std::string read_line(const char* path) {
  std::ifstream f(path);
  std::string s;
  std::getline(f, s);
  return s;
}

std::string ranks_list(const std::vector<unsigned>& r) {
  std::string s;
  for (unsigned x : r) {
    if (!s.empty()) s += ',';
    s += std::to_string(x);
  }
  return s;
}

std::string describe_call(uint64_t count, uint32_t dtype, uint32_t op) {
  return "count " + std::to_string(count) + " " + to_string(static_cast<DataType>(dtype)) + " " +
         to_string(static_cast<Op>(op));
}

}  // namespace

std::string local_segment_name(uint64_t nonce, unsigned host) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "/netreduce-%016llx-%u", static_cast<unsigned long long>(nonce),
                host);
  return buf;
}

std::string host_identity(const Options& options) {
  if (!options.host_id.empty()) return options.host_id;
  if (const char* e = std::getenv("NETREDUCE_HOST_ID"); e != nullptr && *e != '\0') return e;
  char name[256] = {};
  (void)gethostname(name, sizeof name - 1);
  return read_line("/proc/sys/kernel/random/boot_id") + "/" + name;
}

Error check_local_options(const Options& o) {
  if (o.local_size != -1 && (o.local_size < 1 || o.local_size > static_cast<int>(kMaxLocalRanks)))
    return Error::make(ErrorCode::invalid_argument,
                       "local_size: " + std::to_string(o.local_size) + " is outside 1.." +
                           std::to_string(kMaxLocalRanks) + " (or -1: discover)");
  if (o.local_rank != -1 &&
      (o.local_rank < 0 || (o.local_size != -1 && o.local_rank >= o.local_size) ||
       o.local_rank >= static_cast<int>(kMaxLocalRanks)))
    return Error::make(
        ErrorCode::invalid_argument,
        "local_rank: " + std::to_string(o.local_rank) + " is outside 0.." +
            std::to_string((o.local_size != -1 ? o.local_size : kMaxLocalRanks) - 1) +
            " (or -1: discover)");
  return {};
}

Error resolve_locality(const std::vector<LocalityClaim>& all, unsigned rank, Locality& out) {
  const auto bad = [](const std::string& m) {
    return Error::make(ErrorCode::invalid_argument, "local ranks: " + m);
  };
  // Hosts in order of their lowest global rank. A rank that gives
  // local_size 1 is a host of its own, whatever machine it shares (several
  // ranks per machine as separate ring members, without local ranks).
  const auto host_of = [&](unsigned r) {
    return all[r].local_size == 1 ? all[r].host_id + "#rank" + std::to_string(r) : all[r].host_id;
  };
  std::vector<std::string> ids;
  std::map<std::string, std::vector<unsigned>> members;
  for (unsigned r = 0; r < all.size(); ++r) {
    auto& m = members[host_of(r)];
    if (m.empty()) ids.push_back(host_of(r));
    m.push_back(r);
  }
  const size_t n = members[ids[0]].size();
  for (const auto& id : ids)
    if (members[id].size() != n) {
      std::string list;
      for (const auto& i : ids)
        list += (list.empty() ? "" : "; ") + std::string("host '") + i + "' has " +
                std::to_string(members[i].size()) + " (ranks " + ranks_list(members[i]) + ")";
      return bad("every host must run the same number of ranks: " + list +
                 " (to run ranks as separate ring members instead, give local_size 1 or a "
                 "host_id per rank)");
    }
  if (n > kMaxLocalRanks)
    return bad("host '" + ids[0] + "' runs " + std::to_string(n) + " ranks, more than " +
               std::to_string(kMaxLocalRanks));
  // local[r]: rank r's local rank.
  std::vector<unsigned> local(all.size());
  for (const auto& id : ids) {
    const auto& m = members[id];
    unsigned given = 0;
    for (unsigned r : m) {
      if (all[r].local_size != -1 && static_cast<size_t>(all[r].local_size) != n)
        return bad("rank " + std::to_string(r) + " gives local_size " +
                   std::to_string(all[r].local_size) + " but host '" + id + "' runs " +
                   std::to_string(n) + " ranks (" + ranks_list(m) + ")");
      given += all[r].local_rank != -1 ? 1 : 0;
    }
    if (given != 0 && given != m.size())
      return bad("host '" + id + "': some ranks give local_rank and some do not (ranks " +
                 ranks_list(m) + "): give it on all or none");
    std::vector<int> seen(n, -1);
    for (unsigned k = 0; k < m.size(); ++k) {
      const unsigned r = m[k];
      const int l = given ? all[r].local_rank : static_cast<int>(k);
      if (l < 0 || static_cast<size_t>(l) >= n)
        return bad("rank " + std::to_string(r) + " gives local_rank " + std::to_string(l) +
                   ", outside 0.." + std::to_string(n - 1) + " on host '" + id + "'");
      if (seen[l] != -1)
        return bad("ranks " + std::to_string(seen[l]) + " and " + std::to_string(r) +
                   " both give local_rank " + std::to_string(l) + " on host '" + id + "'");
      seen[l] = static_cast<int>(r);
      local[r] = static_cast<unsigned>(l);
    }
  }
  {
    std::vector<std::vector<unsigned>> hosts;
    for (const auto& id : ids) hosts.push_back(members[id]);
    std::vector<unsigned> order;
    if (Error e = ring_order(all, hosts, order)) return e;
    std::vector<std::string> ring_ids;
    for (unsigned h : order) ring_ids.push_back(ids[h]);
    ids.swap(ring_ids);
  }
  out = {};
  out.rank_order = std::is_sorted(
      ids.begin(), ids.end(),
      [&](const std::string& a, const std::string& b) { return members[a][0] < members[b][0]; });
  out.local_size = static_cast<unsigned>(n);
  out.local_rank = local[rank];
  out.hosts = static_cast<unsigned>(ids.size());
  out.rings.assign(n, {});
  for (unsigned h = 0; h < ids.size(); ++h) {
    const auto& m = members[ids[h]];
    if (host_of(rank) == ids[h]) out.host = h;
    for (unsigned l = 0; l < n; ++l)
      for (unsigned r : m)
        if (local[r] == l) out.rings[l].push_back(r);
  }
  out.ring = out.rings[out.local_rank];
  return {};
}

// ------------------------------------------------------------------ segment

Error LocalGroup::create(const std::string& name, unsigned l, unsigned n, unsigned host,
                         size_t chunk_bytes, Clock::time_point deadline,
                         std::unique_ptr<LocalGroup>& out) {
  out.reset();
  if (n < 1 || n > kMaxLocalRanks || l >= n)
    return Error::make(ErrorCode::invalid_argument, "local rank " + std::to_string(l) + " of " +
                                                        std::to_string(n) + " is out of range");
  if (chunk_bytes < 8)
    return Error::make(ErrorCode::invalid_argument,
                       "local chunk: " + std::to_string(chunk_bytes) + " bytes is too small");
  std::unique_ptr<LocalGroup> g(new LocalGroup(name, l, n, host, chunk_bytes));
  g->bytes_ = segment_bytes(n, chunk_bytes);
  const std::string who = g->who();
  int fd = -1;
  if (l == 0) {
    fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0)
      return Error::make(ErrorCode::internal,
                         who + ": shm_open(" + name + ") failed: " + std::strerror(errno));
    // posix_fallocate, not only ftruncate: a tmpfs too small for the
    // segment (a container's 64 MB /dev/shm) is an error here, not a SIGBUS
    // at the first touch of a page that has no room.
    int err = ftruncate(fd, static_cast<off_t>(g->bytes_)) != 0 ? errno : 0;
    if (err == 0) err = posix_fallocate(fd, 0, static_cast<off_t>(g->bytes_));
    if (err != 0) {
      close(fd);
      shm_unlink(name.c_str());
      return Error::make(ErrorCode::internal, who + ": sizing the shared segment " + name + " to " +
                                                  std::to_string(g->bytes_) +
                                                  " bytes failed: " + std::strerror(err));
    }
  } else {
    // Wait for local rank 0 to create and size it.
    for (;;) {
      fd = shm_open(name.c_str(), O_RDWR | O_NOFOLLOW, 0600);
      if (fd >= 0) {
        struct stat st {};
        if (fstat(fd, &st) != 0) {
          const int err = errno;
          close(fd);
          return Error::make(ErrorCode::internal,
                             who + ": fstat of " + name + " failed: " + std::strerror(err));
        }
        // Local rank 0 makes it 0600 as this user: anything else is not
        // this job's (a segment planted under the job's name), and mapping
        // it would let its owner read and write every rank's data.
        if (st.st_uid != geteuid() || (st.st_mode & 0077) != 0) {
          close(fd);
          g->name_.clear();  // not ours: ~LocalGroup must not unlink it
          char mode[8];
          std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
          return Error::make(ErrorCode::invalid_argument,
                             who + ": the shared segment " + name + " has owner uid " +
                                 std::to_string(st.st_uid) + " and mode " + mode +
                                 ", not this user's with mode 0600: not local rank 0's, refused");
        }
        if (static_cast<size_t>(st.st_size) >= g->bytes_) break;
        close(fd);
        fd = -1;
      } else if (errno != ENOENT) {
        return Error::make(ErrorCode::internal,
                           who + ": shm_open(" + name + ") failed: " + std::strerror(errno));
      }
      if (Clock::now() >= deadline)
        return Error::make(ErrorCode::timeout,
                           who + ": local rank 0 did not create the shared segment " + name +
                               " within the timeout");
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  void* p = mmap(nullptr, g->bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) {
    shm_unlink(name.c_str());
    return Error::make(ErrorCode::internal, who + ": mmap of the shared segment " + name +
                                                " failed: " + strerror(errno));
  }
  g->base_ = p;
  g->h_ = static_cast<Header*>(p);
  Header& h = *g->h_;
  if (l == 0) {
    // ftruncate zeroed it: the counters start at 0.
    h.local_size = n;
    h.chunk_bytes = chunk_bytes;
    h.magic.store(kMagic, std::memory_order_release);
    h.bell.fetch_add(1, std::memory_order_acq_rel);
    futex_wake(&h.bell);
  } else {
    while (h.magic.load(std::memory_order_acquire) != kMagic) {
      if (Clock::now() >= deadline) {
        shm_unlink(name.c_str());
        return Error::make(ErrorCode::timeout, who + ": the shared segment " + name +
                                                   " was never initialised by local rank 0");
      }
      const uint32_t b = h.bell.load(std::memory_order_acquire);
      if (h.magic.load(std::memory_order_acquire) == kMagic) break;
      futex_wait(&h.bell, b, std::min(deadline, Clock::now() + std::chrono::milliseconds(1)));
    }
    if (h.local_size != n || h.chunk_bytes != chunk_bytes) {
      shm_unlink(name.c_str());
      return Error::make(ErrorCode::invalid_argument,
                         who + ": local rank 0 made the segment for " +
                             std::to_string(h.local_size) + " local ranks of " +
                             std::to_string(h.chunk_bytes) + "-byte chunks, this rank expects " +
                             std::to_string(n) + " of " + std::to_string(chunk_bytes));
    }
  }
  // Everyone mapped it: the name can go (everybody tries; ENOENT is fine).
  Error e = g->barrier("mapping the shared segment", deadline);
  shm_unlink(name.c_str());
  if (e) return e;  // ~LocalGroup unmaps
  out = std::move(g);
  return {};
}

LocalGroup::~LocalGroup() {
  if (base_ != nullptr) munmap(base_, bytes_);
  shm_unlink(name_.c_str());  // normally gone already (ENOENT)
}

std::string LocalGroup::who() const {
  return "local rank " + std::to_string(l_) + " of " + std::to_string(n_) + " on host " +
         std::to_string(host_);
}

uint8_t* LocalGroup::slot(unsigned j) const noexcept {
  return static_cast<uint8_t*>(base_) + round_up(sizeof(Header)) + size_t{j} * round_up(chunk_);
}
uint8_t* LocalGroup::result() const noexcept { return slot(n_); }

Error LocalGroup::fail(Error e, bool tell_peers) {
  if (tell_peers && h_ != nullptr) {
    uint32_t none = 0;
    if (h_->failed.compare_exchange_strong(none, kClaimed)) {
      // Claim the message first, then publish who failed.
      std::snprintf(h_->failure, sizeof h_->failure, "%s", e.message.c_str());
      h_->failed.store(l_ + 1, std::memory_order_release);
    }
    h_->bell.fetch_add(1, std::memory_order_acq_rel);
    futex_wake(&h_->bell);
  }
  failed_ = e;
  return e;
}

Error LocalGroup::barrier(const char* what, Clock::time_point deadline) {
  Header& h = *h_;
  const uint64_t k = ++barriers_;
  h.arrived[l_].store(k, std::memory_order_release);
  h.bell.fetch_add(1, std::memory_order_acq_rel);
  futex_wake(&h.bell);
  for (;;) {
    const uint32_t b = h.bell.load(std::memory_order_acquire);
    if (const uint32_t f = h.failed.load(std::memory_order_acquire); f != 0 && f != kClaimed)
      return fail(
          Error::make(ErrorCode::transport, who() + ": local rank " + std::to_string(f - 1) +
                                                " failed (" + h.failure + ")"),
          false);
    std::vector<unsigned> missing;
    for (unsigned j = 0; j < n_; ++j)
      if (h.arrived[j].load(std::memory_order_acquire) < k) missing.push_back(j);
    if (missing.empty()) return {};
    if (Clock::now() >= deadline)
      return fail(Error::make(ErrorCode::timeout, who() + ": local rank" +
                                                      (missing.size() > 1 ? "s " : " ") +
                                                      ranks_list(missing) + " did not arrive (" +
                                                      what + ") within the timeout"),
                  true);
    futex_wait(&h.bell, b, deadline);
  }
}

// ------------------------------------------------------------- all-reduce

Error LocalGroup::allreduce(Collective& ring, const void* send, void* recv, size_t count,
                            DataType t, Op op, Clock::time_point deadline, bool on_ring) {
  if (!failed_.ok())
    return Error::make(failed_.code, "communicator unusable after: " + failed_.message);
  if (Error e = Collective::check_args(send, recv, count, t, op)) return e;
  const size_t es = element_size(t);
  const reduce::ReduceFn fold = reduce::kernels(reduce::best_isa(), static_cast<wire::Dtype>(t),
                                                static_cast<wire::ReduceOp>(op))
                                    .reduce;
  const auto* src = static_cast<const uint8_t*>(send);
  auto* dst = static_cast<uint8_t*>(recv);
  const size_t per_chunk = chunk_ / es;
  const uint8_t* srcs[kMaxLocalRanks];
  uint8_t* res = result();
  h_->call[l_] = {count, static_cast<uint32_t>(t), static_cast<uint32_t>(op)};
  // A ring that fails over may finish its shard after the deadline (its
  // agreement runs until the deadline plus the call's budget again): its
  // host's other local ranks wait for its results that long.
  const Clock::time_point results_by =
      deadline + std::max(deadline - Clock::now(), Clock::duration{0});
  // At least one round, also for count 0: the first barrier checks the call.
  size_t off = 0;
  do {
    const size_t c = std::min(per_chunk, count - off);
    if (c) std::memcpy(slot(l_), src + off * es, c * es);  // count 0: send may be null
    if (Error e = barrier("inputs", deadline)) return e;
    if (off == 0)
      for (unsigned j = 0; j < n_; ++j) {
        const Header::Call& other = h_->call[j];
        if (other.count != count || other.dtype != static_cast<uint32_t>(t) ||
            other.op != static_cast<uint32_t>(op))
          return fail(
              Error::make(
                  ErrorCode::invalid_argument,
                  who() + ": local rank " + std::to_string(j) + " called with " +
                      describe_call(other.count, other.dtype, other.op) + ", this rank with " +
                      describe_call(count, static_cast<uint32_t>(t), static_cast<uint32_t>(op)) +
                      " (every rank must make the same calls)"),
              false);
      }
    const StripeRange s = stripe(c, n_, l_);
    if (s.count > 0) {
      for (unsigned j = 0; j < n_; ++j) srcs[j] = slot(j) + s.first * es;
      fold(srcs, n_, res + s.first * es, s.count);
      uint8_t* shard = res + s.first * es;
      if (Error e = on_ring ? ring.ring_allreduce(shard, shard, s.count, t, op, deadline)
                            : ring.allreduce(shard, shard, s.count, t, op, deadline))
        return fail(
            Error::make(e.code, who() + ", shard elements [" + std::to_string(off + s.first) +
                                    ", " + std::to_string(off + s.first + s.count) +
                                    "): " + e.message),
            true);
    }
    if (Error e = barrier("results", results_by)) return e;
    if (c) std::memcpy(dst + off * es, res, c * es);
    off += c;
  } while (off < count);
  return {};
}

}  // namespace netreduce::host
