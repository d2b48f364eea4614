// Parallel NetReduce (Options::local_size = n > 1): H hosts of n local
// ranks each, all as threads of this process over the loopback transport
// (the INA path through a real engine::Engine), hosts told apart by the
// fabric (global rank r = local rank r % n of host r / n). The local ranks
// of a host share a real POSIX shm segment with futex barriers (local.h).
//
// The reference is written here from plain loops over the independent
// reduction of tests/engine/reference.h (never src/reduce or local.cc):
//   - INA path, per element: fold over hosts in ring (host) order of (fold
//     over the host's local ranks in local order);
//   - ring path: the host's local fold, then, per chunk of the local stage
//     (ring_buffer_bytes) and per shard of it (shard l: c / n elements, one
//     more for l < c % n), the ring order of fixture.h across the hosts.
#include "host-lib/local.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <set>
#include <thread>

#include "host-lib/collective.h"
#include "host-lib/fixture.h"
#include "host-lib/plan.h"
#include "netreduce/netreduce.h"

using namespace netreduce;
using namespace netreduce::host;
using namespace netreduce::host::testing;

namespace {

constexpr uint16_t kMsgLen = 2, kPmtu = 256, kWindow = 2;
constexpr size_t kChunk = 4096;  // the local stage's chunk (Options::ring_buffer_bytes)

LoopbackConfig local_box(unsigned hosts, unsigned n, unsigned R = 1) {
  LoopbackConfig c = box_fabric(hosts, kMsgLen, kWindow, kPmtu);
  c.local_size = n;
  c.rings = R;
  return c;
}

LoopbackConfig local_ring(unsigned hosts, unsigned n, size_t recv_bytes) {
  LoopbackConfig c = ring_fabric(hosts, recv_bytes);
  c.local_size = n;
  return c;
}

Options local_options() {
  Options o;
  o.window = kWindow;
  o.ring_buffer_bytes = kChunk;
  return o;
}

// Element-wise fold of `in` (rank order) with the reference model.
std::vector<uint8_t> fold(const std::vector<const uint8_t*>& in, size_t bytes, DataType t, Op op) {
  std::vector<uint8_t> out(bytes);
  if (bytes > 0) ref::reduce(wd(t), wo(op), in, bytes, out.data());
  return out;
}

// Host h's local fold: its n ranks (global h n .. h n + n - 1) in local order.
std::vector<std::vector<uint8_t>> local_folds(const std::vector<std::vector<uint8_t>>& in,
                                              unsigned n, DataType t, Op op) {
  std::vector<std::vector<uint8_t>> hosts;
  for (size_t h = 0; h < in.size() / n; ++h) {
    std::vector<const uint8_t*> p;
    for (unsigned l = 0; l < n; ++l) p.push_back(in[h * n + l].data());
    hosts.push_back(fold(p, in[0].size(), t, op));
  }
  return hosts;
}

std::vector<uint8_t> ina_reference(const std::vector<std::vector<uint8_t>>& in, unsigned n,
                                   DataType t, Op op) {
  const auto hosts = local_folds(in, n, t, op);
  std::vector<const uint8_t*> p;
  for (const auto& h : hosts) p.push_back(h.data());
  return fold(p, in[0].size(), t, op);
}

std::vector<uint8_t> ring_reference(const std::vector<std::vector<uint8_t>>& in, unsigned n,
                                    DataType t, Op op, size_t seg_max) {
  const size_t es = element_size(t), count = in[0].size() / es, per_chunk = kChunk / es;
  const auto hosts = local_folds(in, n, t, op);
  std::vector<uint8_t> out(in[0].size());
  for (size_t off = 0; off < count; off += per_chunk) {
    const size_t c = std::min(per_chunk, count - off);
    size_t first = off;
    for (unsigned l = 0; l < n; ++l) {
      const size_t len = c / n + (l < c % n ? 1 : 0);
      if (len > 0) {
        std::vector<std::vector<uint8_t>> part;
        for (const auto& h : hosts)
          part.emplace_back(h.begin() + first * es, h.begin() + (first + len) * es);
        const auto r = ring_order_reference(part, t, op, seg_max);
        std::memcpy(out.data() + first * es, r.data(), r.size());
      }
      first += len;
    }
  }
  return out;
}

// 0, 1, n - 1, n, n + 1; n x (elements of a first packet, of a message)
// -1, 0, +1; the local stage's chunk -1, 0, +1 and two chunks + n - 1.
std::vector<size_t> sizes(unsigned n, size_t per_packet, size_t per_msg, size_t per_chunk) {
  std::set<size_t> s{0, 1, n - 1, n, n + 1};
  for (size_t unit : {per_packet, per_msg}) {
    s.insert(n * unit - 1);
    s.insert(n * unit);
    s.insert(n * unit + 1);
  }
  for (size_t v : {per_chunk - 1, per_chunk, per_chunk + 1, 2 * per_chunk + n - 1}) s.insert(v);
  return {s.begin(), s.end()};
}

// Names under /dev/shm that start with `prefix`.
std::vector<std::string> shm_entries(const std::string& prefix) {
  std::vector<std::string> found;
  if (DIR* d = opendir("/dev/shm")) {
    while (dirent* e = readdir(d))
      if (std::string(e->d_name).rfind(prefix, 0) == 0) found.push_back(e->d_name);
    closedir(d);
  }
  return found;
}

std::string shm_prefix(const LoopbackFabric& f) {
  return local_segment_name(f.nonce(), 0).substr(1, 27);  // "netreduce-<16 hex>-"
}

}  // namespace

TEST_CASE("local ranks, INA path: every dtype x op, n = 2..4, 2..3 hosts, bit-exact",
          "[hostlib][local][ina]") {
  std::mt19937_64 rng(1651);
  for (unsigned H : {2u, 3u}) {
    for (unsigned n : {2u, 3u, 4u}) {
      Job job(local_box(H, n), local_options());
      const unsigned P = H * n;
      for (unsigned r = 0; r < P; ++r) {
        REQUIRE(job.comms[r]->rank() == static_cast<int>(r));
        REQUIRE(job.comms[r]->world() == static_cast<int>(P));
        REQUIRE(job.comms[r]->local_rank() == static_cast<int>(r % n));
        REQUIRE(job.comms[r]->local_size() == static_cast<int>(n));
        REQUIRE(job.comms[r]->host() == static_cast<int>(r / n));
        REQUIRE(job.comms[r]->path() == Path::ina);
        REQUIRE(job.comms[r]->ring_id() == 7 + r % n);  // ring l = local rank l of every host
      }
      uint64_t bytes = 0;  // one rank's M, summed over the calls
      for (DataType t : kTypes) {
        const size_t es = element_size(t);
        const size_t per_packet = (kPmtu - kInaHeaderBytes) / es;
        const size_t per_msg = (size_t{kMsgLen} * kPmtu - kInaHeaderBytes) / es;
        for (Op op : kOps) {
          for (size_t count : sizes(n, per_packet, per_msg, kChunk / es)) {
            INFO("H=" << H << " n=" << n << " " << to_string(t) << " " << to_string(op)
                      << " count=" << count);
            std::vector<std::vector<uint8_t>> in, out;
            for (unsigned r = 0; r < P; ++r) in.push_back(make_input(rng, t, count, false));
            require_ok(job.run(in, out, count, t, op));
            const auto want = ina_reference(in, n, t, op);
            for (unsigned r = 0; r < P; ++r) REQUIRE(out[r] == want);
            bytes += count * es;
          }
        }
      }
      // Per host, the wire into the box carries one rank's bytes, not n x.
      for (unsigned h = 0; h < H; ++h) CHECK(job.fabric.host_bytes_into_box(h) == bytes);
      uint64_t packets = 0;
      for (unsigned l = 0; l < n; ++l) {
        const auto info = job.fabric.box_ring(l);
        REQUIRE(info);
        CHECK(info->spec.ring_id == 7 + l);
        CHECK(info->counters.connections_rebound == 0);
        packets += info->counters.packets_aggregated;
      }
      CHECK(packets == job.fabric.packets_into_box());
      CHECK(job.fabric.packets_dropped_by_box() == 0);
    }
  }
}

TEST_CASE("local ranks, INA path: the fold order is local first, then hosts",
          "[hostlib][local][ina]") {
  // fp16 sums round once per fold: the nested fold differs from the flat
  // rank-order fold of all ranks for some inputs, and the result is the
  // nested one.
  std::mt19937_64 rng(1652);
  const unsigned H = 2, n = 3, P = H * n;
  Job job(local_box(H, n), local_options());
  const size_t count = 4000;
  std::vector<std::vector<uint8_t>> in, out;
  for (unsigned r = 0; r < P; ++r) in.push_back(make_input(rng, DataType::fp16, count, false));
  require_ok(job.run(in, out, count, DataType::fp16, Op::sum));
  const auto want = ina_reference(in, n, DataType::fp16, Op::sum);
  for (unsigned r = 0; r < P; ++r) REQUIRE(out[r] == want);
  CHECK(want != rank_order_reference(in, DataType::fp16, Op::sum));
}

TEST_CASE("local ranks with rings: ring l striped R ways, ids 7 + l R + s",
          "[hostlib][local][ina][stripe]") {
  std::mt19937_64 rng(1653);
  const unsigned H = 2, n = 2, R = 2, P = H * n;
  Options o = local_options();
  Job job(local_box(H, n, R), o);
  for (unsigned r = 0; r < P; ++r) {
    REQUIRE(job.comms[r]->rings() == static_cast<int>(R));
    for (unsigned s = 0; s < R; ++s) REQUIRE(job.comms[r]->ring_id(s) == 7 + (r % n) * R + s);
  }
  uint64_t bytes = 0;
  for (DataType t : {DataType::fp32, DataType::bf16, DataType::int64})
    for (size_t count : {size_t{0}, size_t{1}, size_t{3}, size_t{5}, size_t{1001}, size_t{5000}}) {
      INFO(to_string(t) << " count=" << count);
      std::vector<std::vector<uint8_t>> in, out;
      for (unsigned r = 0; r < P; ++r) in.push_back(make_input(rng, t, count, false));
      require_ok(job.run(in, out, count, t, Op::sum));
      const auto want = ina_reference(in, n, t, Op::sum);
      for (unsigned r = 0; r < P; ++r) REQUIRE(out[r] == want);
      bytes += count * element_size(t);
    }
  for (unsigned h = 0; h < H; ++h) CHECK(job.fabric.host_bytes_into_box(h) == bytes);
  uint64_t aggregated = 0;
  for (unsigned g = 0; g < n * R; ++g) {
    const auto info = job.fabric.box_ring(g);
    REQUIRE(info);
    CHECK(info->counters.bytes_aggregated > 0);
    aggregated += info->counters.bytes_aggregated;
  }
  CHECK(aggregated == H * bytes);
  CHECK(!job.fabric.box_ring(n * R));
}

TEST_CASE("local ranks, ring path: every dtype x op, n = 2..4, 2..3 hosts",
          "[hostlib][local][ring]") {
  std::mt19937_64 rng(1654);
  const size_t recv_bytes = 2048;  // several ring segments per shard
  for (unsigned H : {2u, 3u}) {
    const size_t stride = recv_bytes / (4 * (H - 1)) / 64 * 64;
    for (unsigned n : {2u, 3u, 4u}) {
      Job job(local_ring(H, n, recv_bytes), local_options());
      const unsigned P = H * n;
      REQUIRE(job.comms[P - 1]->path() == Path::ring);
      REQUIRE(job.comms[P - 1]->local_size() == static_cast<int>(n));
      for (DataType t : kTypes) {
        const size_t es = element_size(t), seg_max = H * (stride / es);
        for (Op op : kOps) {
          for (size_t count : sizes(n, H, seg_max, kChunk / es)) {
            INFO("H=" << H << " n=" << n << " " << to_string(t) << " " << to_string(op)
                      << " count=" << count);
            std::vector<std::vector<uint8_t>> in, out;
            for (unsigned r = 0; r < P; ++r) in.push_back(make_input(rng, t, count, false));
            require_ok(job.run(in, out, count, t, op));
            const auto want = ring_reference(in, n, t, op, seg_max);
            for (unsigned r = 0; r < P; ++r) REQUIRE(out[r] == want);
            // Order-free cases: also the INA path's nested fold.
            if (op != Op::sum || t == DataType::int32 || t == DataType::int64)
              REQUIRE(want == ina_reference(in, n, t, op));
          }
        }
      }
    }
  }
}

// A barrier on the ring (its own choice) and path_choice ring: the stage
// across the hosts takes the ring (2(H - 1) steps) while the communicator
// stays on its box; a barrier's late host is waited for. Other calls keep
// the box.
TEST_CASE("local ranks: a ring choice runs the stage across the hosts on the ring",
          "[hostlib][local][path]") {
  const unsigned H = 3, n = 2, P = H * n;
  Job job(local_box(H, n), local_options(), true);
  std::vector<AllreduceHandle> h(P);
  for (unsigned r = 0; r < P; ++r)
    if (r / n != 2) REQUIRE(job.comms[r]->barrier_async(PathChoice::ring, h[r], 20000).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // host 2 late
  for (unsigned r = 0; r < P; ++r)
    if (r / n == 2) REQUIRE(job.comms[r]->barrier_async(PathChoice::ring, h[r], 20000).ok());
  for (unsigned r = 0; r < P; ++r) {
    INFO("rank " << r);
    REQUIRE(h[r].wait().ok());
    REQUIRE(h[r].record().path == Path::ring);
    REQUIRE(job.comms[r]->path() == Path::ina);
  }
  // The one element is local rank 0's shard: its ring ran 2(H - 1) steps.
  REQUIRE(job.comms[0]->last_call().steps == 2 * (H - 1));
  std::mt19937_64 rng(81);
  for (PathChoice c : {PathChoice::ina, PathChoice::ring}) {
    Options o = local_options();
    o.path_choice = c;
    Job j2(local_box(H, n), o, true);
    std::vector<std::vector<uint8_t>> in, out;
    for (unsigned r = 0; r < P; ++r) in.push_back(make_input(rng, DataType::int32, 500, true));
    require_ok(j2.run(in, out, 500, DataType::int32, Op::sum));
    for (unsigned r = 0; r < P; ++r) {
      REQUIRE(out[r] == rank_order_reference(in, DataType::int32, Op::sum));
      REQUIRE(j2.comms[r]->last_call().path == (c == PathChoice::ring ? Path::ring : Path::ina));
    }
  }
}

TEST_CASE("local ranks: in place, and several calls in a row", "[hostlib][local][ina]") {
  std::mt19937_64 rng(1655);
  const unsigned H = 3, n = 2, P = H * n;
  Job job(local_box(H, n), local_options());
  for (int call = 0; call < 10; ++call) {
    const size_t count = rng() % 5000;
    std::vector<std::vector<uint8_t>> in;
    for (unsigned r = 0; r < P; ++r) in.push_back(make_input(rng, DataType::fp32, count, false));
    const auto want = ina_reference(in, n, DataType::fp32, Op::sum);
    std::vector<AllreduceHandle> h(P);
    for (unsigned r = 0; r < P; ++r)
      REQUIRE(
          job.comms[r]
              ->allreduce_async(in[r].data(), in[r].data(), count, DataType::fp32, Op::sum, h[r])
              .ok());
    for (unsigned r = 0; r < P; ++r) REQUIRE(h[r].wait().ok());
    for (unsigned r = 0; r < P; ++r) REQUIRE(in[r] == want);
  }
}

TEST_CASE("local ranks: a bypassed ring fails over on its own, exact",
          "[hostlib][local][failover]") {
  // H = 3 hosts of n = 2 local ranks; the box is bypassed for local rank
  // 1's ring only (lane 1) in calls 1 and 2. That ring's members agree
  // among themselves (their own exchange), finish call 1 on the ring path
  // and stay there; local rank 0's ring stays on the INA path. Once the
  // bypass ends, ring 1 tries the box again (failback_calls 2, counted in
  // the ring's calls: three chunks of the local stage per call) and
  // returns to the INA path. Exactly representable sums: every path's
  // order gives the same bytes.
  const unsigned H = 3, n = 2, P = H * n;
  std::atomic<bool> armed{false};
  LoopbackConfig cfg = local_box(H, n);
  cfg.bypass = [&](unsigned, unsigned lane, uint32_t, uint32_t) { return armed && lane == 1; };
  Options o = local_options();
  o.failback_calls = 2;
  Job job(cfg, o);
  std::mt19937_64 rng(2511);
  int back = -1;  // the call after which ring 1 is on the INA path again
  for (int call = 0; call < 8; ++call) {
    INFO("call " << call);
    armed = call == 1 || call == 2;
    const size_t count = 3000;  // three chunks of the local stage
    std::vector<std::vector<uint8_t>> in, out;
    for (unsigned r = 0; r < P; ++r) in.push_back(make_input(rng, DataType::fp32, count, true));
    const auto errs = job.run(in, out, count, DataType::fp32, Op::sum, 5000);
    require_ok(errs);
    const auto want = ina_reference(in, n, DataType::fp32, Op::sum);
    if (back < 0 && call > 2 && job.comms[1]->path() == Path::ina) back = call;
    for (unsigned r = 0; r < P; ++r) {
      INFO("rank " << r);
      CHECK(out[r] == want);
      const bool ring1 = r % n == 1 && call >= 1;
      CHECK(job.comms[r]->path() == (ring1 && back < 0 ? Path::ring : Path::ina));
      CHECK(job.comms[r]->failovers() == (ring1 ? 1 : 0));
    }
  }
  CHECK(back > 2);
}

TEST_CASE("local ranks: a missing local peer is named, nothing hangs or leaks",
          "[hostlib][local][timeout]") {
  std::mt19937_64 rng(1656);
  SECTION("at a call") {
    const unsigned H = 2, n = 2, P = H * n;
    std::string prefix;
    {
      Job job(local_box(H, n), local_options());
      prefix = shm_prefix(job.fabric);
      CHECK(shm_entries(prefix).empty());  // unlinked once every local rank mapped it
      const size_t count = 3000;
      std::vector<std::vector<uint8_t>> in, out;
      for (unsigned r = 0; r < P; ++r) in.push_back(make_input(rng, DataType::fp32, count, false));
      // Global rank 1 (host 0, local rank 1) never calls.
      const auto errs = job.run(in, out, count, DataType::fp32, Op::sum, 300, {0, 2, 3});
      INFO(errs[0].message);
      REQUIRE(errs[0].code == ErrorCode::timeout);
      CHECK(errs[0].message ==
            "local rank 0 of 2 on host 0: local rank 1 did not arrive (inputs) within the timeout");
      for (unsigned r : {2u, 3u}) {
        INFO(errs[r].message);
        CHECK(!errs[r].ok());
      }
      // The communicator refuses further calls with the first error.
      std::vector<uint8_t> x(4);
      const Error again = job.comms[0]->allreduce(x.data(), x.data(), 1, DataType::fp32, Op::sum);
      CHECK(again.message.find("local rank 1 did not arrive") != std::string::npos);
    }
    CHECK(shm_entries(prefix).empty());
  }
  SECTION("at creation") {
    // Host 0's local rank 1 never comes: local rank 0 names it; on host 1,
    // local rank 1 waits for a local rank 0 that never creates the segment.
    LoopbackFabric f(local_box(2, 2));
    const std::string prefix = shm_prefix(f);
    Options o = local_options();
    o.connect_timeout_ms = 200;
    std::unique_ptr<Communicator> c0, c3;
    Error e0, e3;
    std::thread t0([&] { e0 = make_loopback_communicator(f, 0, o, c0); });
    std::thread t3([&] { e3 = make_loopback_communicator(f, 3, o, c3); });
    t0.join();
    t3.join();
    INFO(e0.message << " / " << e3.message);
    CHECK(e0.code == ErrorCode::timeout);
    CHECK(e0.message ==
          "local rank 0 of 2 on host 0: local rank 1 did not arrive (mapping the shared segment) "
          "within the timeout");
    CHECK(e3.code == ErrorCode::timeout);
    CHECK(e3.message.find("local rank 1 of 2 on host 1: local rank 0 did not create the shared "
                          "segment") == 0);
    CHECK(!c0);
    CHECK(!c3);
    CHECK(shm_entries(prefix).empty());
  }
}

TEST_CASE("local ranks: a segment planted under the job's name is refused, not mapped",
          "[hostlib][local]") {
  // A world-writable segment, or another user's, under the name host 1's
  // local rank 0 would create: its local rank 1 must not map it, nor remove
  // what is not its own.
  auto attach_to_planted = [](mode_t mode, uid_t uid) {
    LoopbackFabric f(local_box(2, 2));
    const std::string name = local_segment_name(f.nonce(), 1);
    const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    REQUIRE(fd >= 0);
    REQUIRE(ftruncate(fd, 64 << 20) == 0);
    REQUIRE(fchmod(fd, mode) == 0);
    REQUIRE(fchown(fd, uid, static_cast<gid_t>(-1)) == 0);
    Options o = local_options();
    o.connect_timeout_ms = 300;
    std::unique_ptr<Communicator> c3;
    const Error e = make_loopback_communicator(f, 3, o, c3);
    CHECK(!c3);
    CHECK(shm_entries(name.substr(1)).size() == 1);  // still there
    close(fd);
    shm_unlink(name.c_str());
    INFO(e.message);
    CHECK(e.code == ErrorCode::invalid_argument);
    CHECK(e.message.find("local rank 1 of 2 on host 1: the shared segment " + name) == 0);
    return e.message;
  };
  CHECK(attach_to_planted(0666, geteuid()).find("mode 0666") != std::string::npos);
  if (geteuid() == 0)  // only root can give a file away
    CHECK(attach_to_planted(0600, 65534).find("owner uid 65534") != std::string::npos);
}

TEST_CASE("local_size 1: the plain communicator", "[hostlib][local]") {
  std::mt19937_64 rng(1657);
  const unsigned P = 3;
  Options o = local_options();
  Job plain(box_fabric(P, kMsgLen, kWindow, kPmtu), o);
  o.local_size = 1;
  o.local_rank = 0;
  o.host_id = "some host";
  LoopbackConfig cfg = box_fabric(P, kMsgLen, kWindow, kPmtu);
  cfg.local_size = 1;
  Job one(cfg, o);
  for (unsigned r = 0; r < P; ++r) {
    CHECK(one.comms[r]->local_size() == 1);
    CHECK(one.comms[r]->local_rank() == 0);
    CHECK(one.comms[r]->host() == static_cast<int>(r));
    CHECK(one.comms[r]->rank() == static_cast<int>(r));
    CHECK(one.comms[r]->world() == static_cast<int>(P));
  }
  uint64_t bytes = 0;
  for (DataType t : kTypes) {
    const size_t count = 5 * kChunk / element_size(t) + 3;  // beyond the local chunk: unused
    std::vector<std::vector<uint8_t>> in, a, b;
    for (unsigned r = 0; r < P; ++r) in.push_back(make_input(rng, t, count, false));
    require_ok(plain.run(in, a, count, t, Op::sum));
    require_ok(one.run(in, b, count, t, Op::sum));
    for (unsigned r = 0; r < P; ++r) REQUIRE(a[r] == b[r]);
    REQUIRE(a[0] == rank_order_reference(in, t, Op::sum));
    bytes += count * element_size(t);
  }
  for (unsigned h = 0; h < P; ++h) CHECK(one.fabric.host_bytes_into_box(h) == bytes);
}

TEST_CASE("local ranks: validation names the field, the hosts and the ranks",
          "[hostlib][local][args]") {
  const auto claims = [](std::vector<std::pair<std::string, int>> v) {
    std::vector<LocalityClaim> c;
    for (auto& [id, l] : v) c.push_back({id, l, -1, "", ""});
    return c;
  };
  Locality loc;
  SECTION("discovered: numbered in global rank order, hosts by lowest rank") {
    const auto all = claims({{"b", -1}, {"a", -1}, {"b", -1}, {"a", -1}});
    REQUIRE(resolve_locality(all, 3, loc).ok());
    CHECK(loc.local_size == 2);
    CHECK(loc.local_rank == 1);
    CHECK(loc.host == 1);
    CHECK(loc.hosts == 2);
    CHECK(loc.ring == std::vector<unsigned>{2, 3});
    REQUIRE(resolve_locality(all, 0, loc).ok());
    CHECK(loc.ring == std::vector<unsigned>{0, 1});
  }
  SECTION("given local ranks reorder the ring") {
    const auto all = claims({{"a", 1}, {"a", 0}, {"b", 0}, {"b", 1}});
    REQUIRE(resolve_locality(all, 0, loc).ok());
    CHECK(loc.local_rank == 1);
    CHECK(loc.ring == std::vector<unsigned>{0, 3});
  }
  SECTION("unequal ranks per host") {
    const Error e = resolve_locality(claims({{"a", -1}, {"a", -1}, {"b", -1}}), 0, loc);
    CHECK(e.code == ErrorCode::invalid_argument);
    CHECK(e.message ==
          "local ranks: every host must run the same number of ranks: host 'a' has 2 (ranks 0,1); "
          "host 'b' has 1 (ranks 2) (to run ranks as separate ring members instead, give "
          "local_size 1 or a host_id per rank)");
  }
  SECTION("local_size 1: every rank a host of its own, also on one machine") {
    auto all = claims({{"a", -1}, {"a", -1}, {"b", -1}});
    for (auto& c : all) c.local_size = 1;
    REQUIRE(resolve_locality(all, 1, loc).ok());
    CHECK(loc.local_size == 1);
    CHECK(loc.local_rank == 0);
    CHECK(loc.hosts == 3);
    CHECK(loc.host == 1);
    CHECK(loc.ring == std::vector<unsigned>{0, 1, 2});
  }
  SECTION("duplicate local rank") {
    const Error e = resolve_locality(claims({{"a", 0}, {"a", 0}, {"b", 0}, {"b", 1}}), 0, loc);
    CHECK(e.code == ErrorCode::invalid_argument);
    CHECK(e.message == "local ranks: ranks 0 and 1 both give local_rank 0 on host 'a'");
  }
  SECTION("some given, some not") {
    const Error e = resolve_locality(claims({{"a", 0}, {"a", -1}}), 0, loc);
    CHECK(e.message.find("host 'a': some ranks give local_rank and some do not (ranks 0,1)") !=
          std::string::npos);
  }
  SECTION("local_size that disagrees with the host") {
    auto all = claims({{"a", -1}, {"a", -1}});
    all[1].local_size = 3;
    const Error e = resolve_locality(all, 0, loc);
    CHECK(e.message == "local ranks: rank 1 gives local_size 3 but host 'a' runs 2 ranks (0,1)");
  }
  SECTION("options out of range") {
    Options o;
    o.local_size = 17;
    CHECK(check_local_options(o).message.find("local_size: 17 is outside 1..16") == 0);
    o.local_size = 2;
    o.local_rank = 2;
    CHECK(check_local_options(o).message.find("local_rank: 2 is outside 0..1") == 0);
    o.local_rank = -2;
    CHECK(check_local_options(o).code == ErrorCode::invalid_argument);
  }
  SECTION("loopback: options that disagree with the fabric") {
    LoopbackFabric f(local_box(2, 2));
    std::unique_ptr<Communicator> c;
    Options o = local_options();
    o.local_size = 3;
    CHECK(make_loopback_communicator(f, 0, o, c).message ==
          "local_size: 3 where the loopback fabric has 2");
    o.local_size = -1;
    o.local_rank = 0;
    CHECK(make_loopback_communicator(f, 1, o, c).message ==
          "local_rank: 0 where rank 1 of the loopback fabric is local rank 1");
    CHECK(make_loopback_communicator(f, 4, Options{}, c).message.find("rank: 4 is outside 0..3") ==
          0);
  }
}

TEST_CASE("local ranks: local ranks that disagree on the call are told at once",
          "[hostlib][local][args]") {
  const unsigned H = 2, n = 2, P = H * n;
  Job job(local_box(H, n), local_options());
  std::vector<std::vector<float>> buf(P, std::vector<float>(8, 1.0f));
  std::vector<AllreduceHandle> h(P);
  for (unsigned r = 0; r < P; ++r) {
    const size_t count = r == 1 ? 6 : 5;  // host 0's local rank 1 disagrees
    REQUIRE(job.comms[r]
                ->allreduce_async(buf[r].data(), buf[r].data(), count, DataType::fp32, Op::sum,
                                  h[r], 300)
                .ok());
  }
  std::vector<Error> errs(P);
  for (unsigned r = 0; r < P; ++r) errs[r] = h[r].wait();
  INFO(errs[0].message);
  CHECK(errs[0].code == ErrorCode::invalid_argument);
  CHECK(errs[0].message ==
        "local rank 0 of 2 on host 0: local rank 1 called with count 6 fp32 sum, this rank with "
        "count 5 fp32 sum (every rank must make the same calls)");
  CHECK(errs[1].message ==
        "local rank 1 of 2 on host 0: local rank 0 called with count 5 fp32 sum, this rank with "
        "count 6 fp32 sum (every rank must make the same calls)");
  // Host 1 agrees locally; its rings then miss host 0 and time out.
  CHECK(errs[2].code == ErrorCode::timeout);
  CHECK(errs[3].code == ErrorCode::timeout);
}

TEST_CASE("local ranks: the verbs communicator takes them; the C API's sized options",
          "[hostlib][local][capi]") {
  // Range checks come before any device is touched; a valid local_size goes
  // on to the device (none here, or no bootstrap peer): no refusal.
  Options o;
  o.local_size = 2;
  o.connect_timeout_ms = 200;
  std::unique_ptr<Communicator> v;
  Error e = Communicator::create(0, 2, "", 0, "127.0.0.1:1", o, v);
  CHECK(e.code != ErrorCode::invalid_argument);
  CHECK(e.message.find("local") == std::string::npos);
  o.local_size = 40;
  e = Communicator::create(0, 2, "", 0, "127.0.0.1:1", o, v);
  CHECK(e.message.find("local_size: 40 is outside 1..16") == 0);

  // C API: the fields carry the C++ defaults; the macros pass the header's size.
  nr_options co;
  std::memset(&co, 0x5A, sizeof co);
  nr_options_init(&co);
  CHECK(co.local_rank == -1);
  CHECK(co.local_size == -1);
  CHECK(co.host_id == nullptr);
  CHECK(co.rings == 0);
  co.local_size = 2;
  co.local_rank = 2;
  nr_comm* cc = nullptr;
  CHECK(nr_comm_create(0, 2, "", 0, "127.0.0.1:1", &co, &cc) == NR_ERR_INVALID_ARGUMENT);
  CHECK(std::string(nr_last_error()).find("local_rank: 2 is outside 0..1") == 0);
  // A caller built before the size rule passes 104 bytes: the fields past
  // them are not read (here: garbage that would be refused) and default.
  nr_options old;
  std::memset(&old, 0x5A, sizeof old);
  nr_options_init_sized(&old, 104);
  CHECK(old.rings == 0);
  CHECK(old.local_size == 0x5A5A5A5A);  // not written
  old.connect_timeout_ms = 100;
  CHECK(nr_comm_create_sized(0, 2, "", 0, "127.0.0.1:1", &old, 104, &cc) !=
        NR_ERR_INVALID_ARGUMENT);
  CHECK(std::string(nr_last_error()).find("local") == std::string::npos);
  // A struct larger than this library knows (a newer header) is refused.
  CHECK(nr_comm_create_sized(0, 2, "", 0, "127.0.0.1:1", &co, sizeof co + 8, &cc) ==
        NR_ERR_INVALID_ARGUMENT);
  CHECK(std::string(nr_last_error()).find("opts_size: " + std::to_string(sizeof co + 8)) == 0);
  CHECK(nr_comm_local_rank(nullptr) == -1);
  CHECK(nr_comm_local_size(nullptr) == -1);
}

TEST_CASE("local ranks: a rank whose ring fails tells its local peers at once",
          "[hostlib][local][timeout]") {
  // count 1, n 2: shard 0 holds the element, shard 1 is empty. Host 1's
  // local rank 0 never calls, so host 0's ring 0 times out; host 0's local
  // rank 1 (nothing to send) waits at the results barrier and learns why
  // from local rank 0, not from its own deadline (which is much later, so
  // the order does not depend on timing).
  const unsigned H = 2, n = 2, P = H * n;
  Job job(local_box(H, n), local_options());
  std::vector<std::vector<uint8_t>> buf(P, std::vector<uint8_t>(4, 0));
  std::vector<AllreduceHandle> h(P);
  std::vector<Error> errs(P);
  for (unsigned r : {0u, 1u, 3u})
    REQUIRE(job.comms[r]
                ->allreduce_async(buf[r].data(), buf[r].data(), 1, DataType::fp32, Op::sum, h[r],
                                  r == 1 ? 20000 : 300)
                .ok());
  for (unsigned r : {0u, 1u, 3u}) errs[r] = h[r].wait();
  INFO(errs[0].message);
  REQUIRE(errs[0].code == ErrorCode::timeout);
  CHECK(errs[0].message.find("local rank 0 of 2 on host 0, shard elements [0, 1): rank 0: "
                             "all-reduce (ina path, ring 7) timed out") == 0);
  // Its ring's predecessor is host 1's local rank 0: global rank 2.
  CHECK(errs[0].message.find("not received from predecessor rank 2 (through the box") !=
        std::string::npos);
  INFO(errs[1].message);
  CHECK(errs[1].code == ErrorCode::transport);
  CHECK(errs[1].message.find("local rank 1 of 2 on host 0: local rank 0 failed (" +
                             errs[0].message.substr(0, 200)) == 0);
  INFO(errs[3].message);
  CHECK(errs[3].message ==
        "local rank 1 of 2 on host 1: local rank 0 did not arrive (inputs) within the timeout");
}

TEST_CASE("local ranks: bad arguments are refused before the local stage",
          "[hostlib][local][args]") {
  Job job(local_box(2, 2), local_options());
  std::vector<float> buf(16);
  const Error e = job.comms[0]->allreduce(buf.data(), buf.data() + 1, 8, DataType::fp32, Op::sum);
  CHECK(e.message == "recv: overlaps send without being the same buffer");
  const Error d =
      job.comms[1]->allreduce(buf.data(), buf.data(), 8, static_cast<DataType>(9), Op::sum);
  CHECK(d.message == "dtype: 9 is not a data type");
  // Nothing was entered: the communicators still work.
  std::vector<std::vector<uint8_t>> in(4, std::vector<uint8_t>(8, 1)), out;
  require_ok(job.run(in, out, 2, DataType::int32, Op::sum));
  for (const auto& o : out) CHECK(o == ina_reference(in, 2, DataType::int32, Op::sum));
}

namespace {

// One local rank as a process of its own: a one-host ring (a loopback
// fabric of world 1 in this process: the cross-host stage is the identity)
// behind the shared segment. Exit status: 0 if every call matched the local
// fold, 2 if set-up failed, 3 if a call failed, 4 on a wrong result; with
// `die_after` >= 0 the process dies (_exit) before call `die_after`.
int local_process(const std::string& name, unsigned l, unsigned n, uint64_t seed, int die_after,
                  int timeout_ms) {
  LoopbackFabric f(ring_fabric(1, 4096));
  std::unique_ptr<Transport> t;
  if (!f.transport(0, t).ok()) return 2;
  CollectiveConfig cc;
  cc.path = Path::ring;
  std::unique_ptr<Collective> ring;
  if (!Collective::create(*t, cc, ring).ok()) return 2;
  std::unique_ptr<LocalGroup> g;
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  if (!LocalGroup::create(name, l, n, 0, kChunk, deadline, g).ok()) return 2;
  for (int call = 0; call < 6; ++call) {
    if (call == die_after) _exit(9);
    std::mt19937_64 rng(seed + call);  // every process draws every rank's input
    const DataType ty = kTypes[call % 6];
    const size_t count = 3 * kChunk / element_size(ty) + call;
    std::vector<std::vector<uint8_t>> in;
    for (unsigned j = 0; j < n; ++j) in.push_back(make_input(rng, ty, count, false));
    std::vector<uint8_t> out(in[l].size());
    const Error e = g->allreduce(*ring, in[l].data(), out.data(), count, ty, Op::max,
                                 Clock::now() + std::chrono::milliseconds(timeout_ms));
    if (!e.ok()) {
      std::fprintf(stderr, "%s\n", e.message.c_str());
      return 3;
    }
    std::vector<const uint8_t*> p;
    for (const auto& v : in) p.push_back(v.data());
    if (out != fold(p, out.size(), ty, Op::max)) return 4;
  }
  return 0;
}

// Forks n local ranks (those in `absent` never start) and returns their exit
// statuses (-1: did not start).
std::vector<int> run_processes(const std::string& name, unsigned n, std::set<unsigned> absent,
                               int die_rank, int timeout_ms) {
  std::vector<pid_t> pids(n, -1);
  for (unsigned l = 0; l < n; ++l) {
    if (absent.count(l)) continue;
    const pid_t pid = fork();
    if (pid == 0)
      _exit(local_process(name, l, n, 1658, static_cast<int>(l) == die_rank ? 3 : -1, timeout_ms));
    pids[l] = pid;
  }
  std::vector<int> status(n, -1);
  for (unsigned l = 0; l < n; ++l) {
    if (pids[l] < 0) continue;
    int st = 0;
    waitpid(pids[l], &st, 0);  // each child has its own deadlines
    status[l] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  }
  return status;
}

}  // namespace

TEST_CASE("local ranks as processes: one segment, futex barriers across processes",
          "[hostlib][local][process]") {
  const std::string name = local_segment_name(std::random_device{}(), 0);
  const std::string entry = name.substr(1);
  SECTION("n = 3, six calls of three chunks, every dtype") {
    CHECK(run_processes(name, 3, {}, -1, 5000) == std::vector<int>{0, 0, 0});
  }
  SECTION("a local rank that never starts") {
    // Local rank 0 (the creator) names it; the others saw the segment.
    CHECK(run_processes(name, 3, {2}, -1, 300) == std::vector<int>{2, 2, -1});
  }
  SECTION("a local rank that dies between calls") {
    // Local rank 1 exits before its fourth call: the others fail that call
    // (3) at their deadline instead of hanging.
    CHECK(run_processes(name, 3, {}, 1, 300) == std::vector<int>{3, 9, 3});
  }
  CHECK(shm_entries(entry).empty());
}
