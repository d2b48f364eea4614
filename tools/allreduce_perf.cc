// netreduce-allreduce-perf: all-reduce (and the other collectives) bandwidth
// over libnetreduce, in the spirit of nccl-tests' all_reduce_perf. One
// process per rank:
//
//   netreduce-allreduce-perf --rank R --world P --bootstrap HOST:PORT
//       [--device rxe0] [--gid-index -1] [-b 8] [-e 32M] [-f 2] [-d fp32]
//       [-o sum] [-n 20] [-w 5] [-c 1] [--msg-len 4] [--payload 1024]
//       [--window 0] [--timeout-ms 30000] [--qp-timeout 14] [--force-ring] [--rina]
//       [--failback-calls 64]
//       [--rings 0] [--local-size n] [--local-rank l] [--host-id ID]
//       [--check-order [--rack-size K]] [--collective all_reduce] [--root 0]
//   netreduce-allreduce-perf --loopback [--loopback-box] --world P ...
//       [--local-size n]
//       (self-test without RDMA: P ranks as threads of this process)
//
// -d and -o take one name, a comma-separated list or "all": the sweep runs
// for every data type x op in turn, on one communicator.
// --collective all_reduce (default), broadcast, all_gather, reduce_scatter,
// reduce, barrier (a list, or all) runs the sweep for each in turn (ops only
// where there is a reduction; barrier one row of size 0). Sizes are
// nccl-tests': the buffer the collective fills (all-gather's output and
// reduce-scatter's input, world x the count each rank contributes or
// keeps); --root (default 0) is broadcast's and reduce's root. The last
// column names the collective.
// --rings R stripes every tensor over R rings (Options::rings; 0: 1). At the end rank 0 reports the
// bytes each ring carried (its stripes of every call, this rank's data) and the total; with
// --loopback-box also each ring's bytes as the box counted them (all ranks).
// --local-size n (parallel NetReduce, Options::local_size): the P ranks are
// P / n hosts of n local ranks: with --loopback all threads of this one
// process; over verbs one process per rank (--rank is the global rank; a
// host's ranks are found by host identity, --host-id or NETREDUCE_HOST_ID or
// the boot id, and numbered in rank order unless --local-rank is given;
// without --local-size the count is discovered too).
// Local rank l of every host forms ring l (R stripes: rings l R .. l R + R - 1),
// which carries shard l of every local chunk (ring_buffer_bytes). The table
// then lists host 0's n x R rings, and with --loopback-box each host's
// payload bytes into the box, which equal one rank's data (not n x).
// For each size: warm-up calls, then n timed calls; time is the mean per call.
// algbw = bytes / time; busbw = algbw x nccl-tests' factor: 2 (P - 1) / P for
// all-reduce, (P - 1) / P for all-gather and reduce-scatter, 1 for broadcast
// and reduce (so ring and INA compare on the same scale). With -c 1 every
// size is also checked: rank r's element i is ((7 i + 13 r) mod 9) - 4, whose
// sum, min and max over ranks are exact in every data type, and every element
// of the result is compared (broadcast: the root's; all-gather: rank r's at
// its place; reduce-scatter: this rank's part of the reduction; reduce: the
// root's). --check-order replaces, for fp32/fp64 sums on
// the INA path, that pattern by order-sensitive values and the reference by
// parallel NetReduce's nested order (check_order below). With --rack-size K
// (one rank per host, a multi-rack tree of boxes) the nesting is the tree's:
// racks of K consecutive ranks, each folded in rank order at its leaf, then
// the racks in order at the spine. Exit status: 0 if every call succeeded and
// every check passed; 2 if there is no RDMA device; 1 otherwise.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "host-lib/comm_impl.h"
#include "host-lib/local.h"
#include "host-lib/loopback.h"
#include "host-lib/plan.h"
#include "netreduce/netreduce.hpp"
#include "reduce/reduce.h"
#include "wire/ina.h"

using namespace netreduce;

namespace {

bool parse_size(const std::string& s, size_t& out) {
  if (s.empty()) return false;
  size_t pos = 0;
  unsigned long long v = 0;
  try {
    v = std::stoull(s, &pos);
  } catch (...) {
    return false;
  }
  std::string suf = s.substr(pos);
  unsigned long long mul = 1;
  if (suf == "K" || suf == "k")
    mul = 1ull << 10;
  else if (suf == "M" || suf == "m")
    mul = 1ull << 20;
  else if (suf == "G" || suf == "g")
    mul = 1ull << 30;
  else if (!suf.empty())
    return false;
  out = static_cast<size_t>(v * mul);
  return true;
}

// "a,b,c" -> {a, b, c}; "all" -> the list `all`; an empty item stays (and
// is then refused by the parser).
std::vector<std::string> split_list(const std::string& s, const std::string& all) {
  const std::string& list = s == "all" ? all : s;
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    const size_t comma = list.find(',', start);
    out.push_back(list.substr(start, comma - start));
    if (comma == std::string::npos) return out;
    start = comma + 1;
  }
}

int pattern(size_t i, int rank) {
  return static_cast<int>((7 * i + 13 * static_cast<size_t>(rank)) % 9) - 4;
}

void store(DataType t, uint8_t* p, double v) {
  switch (t) {
    case DataType::fp32: {
      const float f = static_cast<float>(v);
      std::memcpy(p, &f, 4);
      break;
    }
    case DataType::fp64:
      std::memcpy(p, &v, 8);
      break;
    case DataType::fp16: {
      const uint16_t h = reduce::float_to_fp16(static_cast<float>(v));
      std::memcpy(p, &h, 2);
      break;
    }
    case DataType::bf16: {
      const uint16_t h = reduce::float_to_bf16(static_cast<float>(v));
      std::memcpy(p, &h, 2);
      break;
    }
    case DataType::int32: {
      const int32_t x = static_cast<int32_t>(v);
      std::memcpy(p, &x, 4);
      break;
    }
    case DataType::int64: {
      const int64_t x = static_cast<int64_t>(v);
      std::memcpy(p, &x, 8);
      break;
    }
  }
}

void fill(DataType t, std::vector<uint8_t>& buf, size_t count, int rank) {
  const size_t es = element_size(t);
  for (size_t i = 0; i < count; ++i) store(t, buf.data() + i * es, pattern(i, rank));
}

// --check-order (fp32 and fp64 sums, INA path): values whose sum depends on
// the order of the adds (mixed signs, exponents spread wider than the
// mantissa), a function of (element, host, local rank). The reference is the
// nested rule of parallel NetReduce, written out here in plain adds of the
// element type: per host, the local ranks folded in local order, then the
// hosts folded in ring (host) order. `other` counts the elements whose sum
// differs under the other nesting (hosts first, then local ranks): how much
// the check discriminates.
template <typename T>
T order_value(size_t i, unsigned h, unsigned l) {
  const int spread = sizeof(T) == 4 ? 24 : 80;
  const int e =
      static_cast<int>((3 * i + 11 * h + 5 * l) % static_cast<size_t>(spread)) - spread / 2;
  const T m = static_cast<T>(1 + (7 * i + 13 * h + 5 * l) % 9) +
              std::ldexp(static_cast<T>((31 * i + 17 * h + 7 * l) % 1024), -20);
  const T v = std::ldexp(m, e);
  return (i + h + 2 * l) % 3 == 0 ? -v : v;
}

template <typename T>
void fill_order(std::vector<uint8_t>& buf, size_t count, unsigned h, unsigned l) {
  for (size_t i = 0; i < count; ++i) {
    const T v = order_value<T>(i, h, l);
    std::memcpy(buf.data() + i * sizeof(T), &v, sizeof(T));
  }
}

// With `flat` (racks of a tree) `other` is instead the flat ring's order, every
// rank folded left in rank order: what a single box would return.
template <typename T>
size_t check_order(const std::vector<uint8_t>& got, size_t count, unsigned hosts, unsigned n,
                   bool flat, size_t& other) {
  size_t errors = 0;
  for (size_t i = 0; i < count; ++i) {
    T nested = 0, alt = 0;
    for (unsigned h = 0; h < hosts; ++h) {
      T local = order_value<T>(i, h, 0);
      for (unsigned l = 1; l < n; ++l) local = local + order_value<T>(i, h, l);
      nested = h == 0 ? local : nested + local;
    }
    if (flat) {
      alt = order_value<T>(i, 0, 0);
      for (unsigned h = 0; h < hosts; ++h)
        for (unsigned l = h == 0 ? 1 : 0; l < n; ++l) alt = alt + order_value<T>(i, h, l);
    } else {
      for (unsigned l = 0; l < n; ++l) {
        T across = order_value<T>(i, 0, l);
        for (unsigned h = 1; h < hosts; ++h) across = across + order_value<T>(i, h, l);
        alt = l == 0 ? across : alt + across;
      }
    }
    if (std::memcmp(&nested, got.data() + i * sizeof(T), sizeof(T)) != 0) ++errors;
    if (std::memcmp(&nested, &alt, sizeof(T)) != 0) ++other;
  }
  return errors;
}

// got[i] against the reduction over the ranks of element first + i.
size_t check(DataType t, Op op, const std::vector<uint8_t>& got, size_t count, int world,
             size_t first = 0) {
  const size_t es = element_size(t);
  std::vector<uint8_t> want(es);
  size_t errors = 0;
  for (size_t i = 0; i < count; ++i) {
    int acc = pattern(first + i, 0);
    for (int r = 1; r < world; ++r) {
      const int v = pattern(first + i, r);
      acc = op == Op::sum ? acc + v : op == Op::min ? std::min(acc, v) : std::max(acc, v);
    }
    store(t, want.data(), acc);
    if (std::memcmp(want.data(), got.data() + i * es, es) != 0) ++errors;
  }
  return errors;
}

// got[r count + i] against rank r's element i, for `ranks` ranks from rank 0
// (all-gather), or from rank `only` alone (broadcast: ranks 1, only the root).
size_t check_pattern(DataType t, const std::vector<uint8_t>& got, size_t count, int ranks,
                     int only = -1) {
  const size_t es = element_size(t);
  std::vector<uint8_t> want(es);
  size_t errors = 0;
  for (int r = 0; r < ranks; ++r)
    for (size_t i = 0; i < count; ++i) {
      store(t, want.data(), pattern(i, only >= 0 ? only : r));
      if (std::memcmp(want.data(), got.data() + (r * count + i) * es, es) != 0) ++errors;
    }
  return errors;
}

enum class Coll { all_reduce, broadcast, all_gather, reduce_scatter, reduce, barrier };
constexpr const char* kCollNames[] = {"all_reduce",     "broadcast", "all_gather",
                                      "reduce_scatter", "reduce",    "barrier"};
const char* to_string(Coll c) { return kCollNames[static_cast<int>(c)]; }
bool reduces(Coll c) {
  return c == Coll::all_reduce || c == Coll::reduce_scatter || c == Coll::reduce;
}
// Each rank contributes (all-gather) or keeps (reduce-scatter) 1 / world of the buffer.
bool sharded(Coll c) { return c == Coll::all_gather || c == Coll::reduce_scatter; }

// nccl-tests' bus bandwidth factor: what crosses each rank's link per algbw byte.
double bus_factor(Coll c, int world) {
  const double p = world;
  switch (c) {
    case Coll::all_reduce:
      return 2 * (p - 1) / p;
    case Coll::all_gather:
    case Coll::reduce_scatter:
      return (p - 1) / p;
    case Coll::broadcast:
    case Coll::reduce:
      return 1;
    case Coll::barrier:
      break;
  }
  return 0;
}

struct SweepParams {
  std::vector<Coll> colls;
  int root;
  std::vector<DataType> types;
  std::vector<Op> ops;
  size_t min_bytes, max_bytes;
  double factor;
  int iters, warmup;
  bool check;
  bool check_order;    // fp32/fp64 sums: order-sensitive values, the nested rule (INA path)
  unsigned rack_size;  // with check_order: the tree's racks of consecutive ranks (0: hosts)
  size_t chunk_bytes;  // the local stage's chunk (Options::ring_buffer_bytes)
};

// Bytes of this rank's data each of its rings carried in a call of `count`
// elements (plan.h's stripe rule), added per call. With local ranks the
// rank's ring carries its shard (the same rule over local_size) of every
// local chunk of `chunk_bytes`, striped over the rings.
void add_stripes(std::vector<uint64_t>& per_ring, size_t count, size_t esize, unsigned local_rank,
                 unsigned local_size, size_t chunk_bytes) {
  const unsigned R = static_cast<unsigned>(per_ring.size());
  const size_t per_chunk = local_size > 1 ? chunk_bytes / esize : count;
  for (size_t off = 0; off < count; off += per_chunk) {
    const size_t c = std::min(per_chunk, count - off);
    const size_t shard = host::stripe(c, local_size, local_rank).count;
    for (unsigned g = 0; g < R; ++g) per_ring[g] += host::stripe(shard, R, g).count * esize;
  }
}

// ids[g], per_ring[g]: ring g's id and the bytes it carried for one host;
// box_bytes (if any): what the box aggregated on it (all hosts' copies).
void print_ring_bytes(const std::vector<uint32_t>& ids, const std::vector<uint64_t>& per_ring,
                      const std::vector<uint64_t>& box_bytes) {
  std::printf("# %4s %10s %16s%s\n", "ring", "id", "bytes",
              box_bytes.empty() ? "" : "        box bytes");
  uint64_t total = 0, box_total = 0;
  for (size_t g = 0; g < per_ring.size(); ++g) {
    total += per_ring[g];
    std::printf("# %4zu %10u %16llu", g, ids[g], static_cast<unsigned long long>(per_ring[g]));
    if (g < box_bytes.size()) {
      box_total += box_bytes[g];
      std::printf(" %16llu", static_cast<unsigned long long>(box_bytes[g]));
    }
    std::printf("\n");
  }
  std::printf("# %4s %10s %16llu", "all", "", static_cast<unsigned long long>(total));
  if (!box_bytes.empty()) std::printf(" %16llu", static_cast<unsigned long long>(box_total));
  std::printf("\n");
}

// The size sweep of one rank; rank 0 prints. Returns the exit status.
// ring_bytes: this rank's bytes per ring, over every call (see add_stripes).
int sweep(Communicator& comm, const SweepParams& p, std::vector<uint64_t>& ring_bytes) {
  const int rank = comm.rank(), world = comm.world();
  const size_t min_bytes = p.min_bytes, max_bytes = p.max_bytes;
  const double factor = p.factor;
  const int iters = p.iters, warmup = p.warmup, check_on = p.check ? 1 : 0;
  if (rank == 0) {
    std::printf("# netreduce-allreduce-perf: world %d, path %s (%s), ring %u, window %u\n", world,
                to_string(comm.path()), comm.path_reason().c_str(), comm.ring_id(), comm.window());
    std::printf("# rings %d (ids", comm.rings());
    for (int g = 0; g < comm.rings(); ++g) std::printf(" %u", comm.ring_id(g));
    std::printf("): each tensor cut into %d stripes\n", comm.rings());
    const LinkFigures& f = comm.links();
    std::printf("# links (%s): alpha %.2f us, %.3f Gb/s, box %.2f us\n",
                f.measured ? "measured" : "configured", f.alpha_us, f.gbps, f.box_us);
    if (comm.local_size() > 1)
      std::printf(
          "# local size %d: %d hosts; local rank l of every host forms ring l (%d x %d "
          "rings)\n",
          comm.local_size(), world / comm.local_size(), comm.local_size(), comm.rings());
    std::printf("# %12s %12s %6s %5s %5s %10s %9s %9s %7s %5s  %s\n", "size(B)", "count", "type",
                "op", "path", "time(us)", "algbw", "busbw", "errors", "steps", "collective");
    std::printf("# %12s %12s %6s %5s %5s %10s %9s %9s %7s %5s\n", "", "(elements)", "", "", "", "",
                "(GB/s)", "(GB/s)", "", "");
  }
  std::vector<uint8_t> in(std::max<size_t>(max_bytes, 8)), out(in.size());
  ring_bytes.assign(static_cast<size_t>(comm.rings()), 0);
  const auto add = [&](size_t count, size_t es) {
    add_stripes(ring_bytes, count, es, static_cast<unsigned>(comm.local_rank()),
                static_cast<unsigned>(comm.local_size()), p.chunk_bytes);
  };
  size_t total_errors = 0, order_checked = 0, order_other = 0;
  int status = 0;
  // The nesting the order check expects: racks of a tree, or hosts of local ranks.
  const unsigned n = p.rack_size ? p.rack_size : static_cast<unsigned>(comm.local_size()),
                 hosts = static_cast<unsigned>(world) / n,
                 h = p.rack_size ? static_cast<unsigned>(rank) / n
                                 : static_cast<unsigned>(comm.host()),
                 l = p.rack_size ? static_cast<unsigned>(rank) % n
                                 : static_cast<unsigned>(comm.local_rank());
  if (p.check_order && comm.path() != Path::ina) {
    if (rank == 0)
      std::printf("# order check: the path is %s (%s); the nested rule is the INA path's\n",
                  to_string(comm.path()), comm.path_reason().c_str());
    return 1;
  }
  // The sweeps: every collective x data type x op it takes (barrier: one).
  struct Job {
    Coll c;
    DataType t;
    Op o;
  };
  std::vector<Job> jobs;
  for (Coll c : p.colls) {
    if (c == Coll::barrier) {
      jobs.push_back({c, DataType::int32, Op::sum});
      continue;
    }
    for (DataType t : p.types)
      for (Op o : reduces(c) ? p.ops : std::vector<Op>{Op::sum}) jobs.push_back({c, t, o});
  }
  for (size_t job_i = 0; status == 0 && job_i < jobs.size(); ++job_i) {
    const Coll c = jobs[job_i].c;
    const DataType t = jobs[job_i].t;
    const Op o = jobs[job_i].o;
    const size_t es = element_size(t), shards = sharded(c) ? static_cast<size_t>(world) : 1;
    const size_t first = c == Coll::barrier ? 0 : std::max(min_bytes, es * shards);
    // Sizes up to -e (a sharded collective whose smallest size is larger
    // has no row); barrier's one row has size 0.
    for (size_t bytes = first; bytes <= max_bytes || c == Coll::barrier;) {
      // count: the elements of the buffer the row reports; per: what one
      // rank contributes or keeps of it.
      const size_t count = c == Coll::barrier ? 0 : bytes / es / shards * shards,
                   per = count / shards;
      const bool ordered = c == Coll::all_reduce && p.check_order && o == Op::sum &&
                           (t == DataType::fp32 || t == DataType::fp64);
      const auto prepare = [&] {
        if (!ordered)
          fill(t, in, c == Coll::all_gather ? per : count, rank);
        else if (t == DataType::fp32)
          fill_order<float>(in, count, h, l);
        else
          fill_order<double>(in, count, h, l);
      };
      // One call; on the INA path, the bytes of the all-reduce it is on
      // each ring (what the box counts).
      const auto call = [&](size_t& words, size_t& word_bytes) -> Error {
        words = count;
        word_bytes = es;
        switch (c) {
          case Coll::all_reduce:
            return comm.allreduce(in.data(), out.data(), count, t, o);
          case Coll::broadcast:
            words = (count * es + 3) / 4, word_bytes = 4;
            return comm.broadcast(in.data(), count, t, p.root);
          case Coll::all_gather:
            words = (count * es + 3) / 4, word_bytes = 4;
            return comm.all_gather(in.data(), out.data(), per, t);
          case Coll::reduce_scatter:
            return comm.reduce_scatter(in.data(), out.data(), per, t, o);
          case Coll::reduce:
            return comm.reduce(in.data(), out.data(), count, t, o, p.root);
          case Coll::barrier:
            words = 1, word_bytes = 4;
            return comm.barrier();
        }
        return Error::make(ErrorCode::internal, "unknown collective");
      };
      const auto run = [&]() -> Error {
        size_t words = 0, word_bytes = 0;
        Error e = call(words, word_bytes);
        if (e.ok() && comm.last_call().path == Path::ina) add(words, word_bytes);
        return e;
      };
      prepare();
      Error err;
      for (int i = 0; i < warmup && err.ok(); ++i) err = run();
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < iters && err.ok(); ++i) err = run();
      const double us =
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
          iters;
      size_t errors = 0;
      if (err.ok() && check_on && c != Coll::barrier) {
        prepare();  // a broadcast overwrote the input
        std::memset(out.data(), 0xA5, count * es);
        err = run();
        if (err.ok() && ordered) {
          const bool flat = p.rack_size != 0;
          errors = t == DataType::fp32
                       ? check_order<float>(out, count, hosts, n, flat, order_other)
                       : check_order<double>(out, count, hosts, n, flat, order_other);
          order_checked += count;
        } else if (err.ok()) {
          switch (c) {
            case Coll::all_reduce:
              errors = check(t, o, out, count, world);
              break;
            case Coll::broadcast:
              errors = check_pattern(t, in, count, 1, p.root);
              break;
            case Coll::all_gather:
              errors = check_pattern(t, out, per, world);
              break;
            case Coll::reduce_scatter:
              errors = check(t, o, out, per, world, static_cast<size_t>(rank) * per);
              break;
            case Coll::reduce:
              errors = rank == p.root ? check(t, o, out, count, world) : 0;
              break;
            case Coll::barrier:
              break;
          }
        }
      }
      if (!err.ok()) {
        std::fprintf(stderr, "netreduce-allreduce-perf: rank %d: %s, size %zu: %s\n", rank,
                     to_string(c), count * es, err.message.c_str());
        status = 1;
        break;
      }
      total_errors += errors;
      if (rank == 0 || errors > 0) {
        const double algbw = static_cast<double>(count * es) / us / 1e3;
        const double busbw = algbw * bus_factor(c, world);
        const CallRecord last = comm.last_call();
        std::printf("  %12zu %12zu %6s %5s %5s %10.1f %9.3f %9.3f %7s %5u  %s\n", count * es, count,
                    c == Coll::barrier ? "-" : to_string(t), reduces(c) ? to_string(o) : "-",
                    to_string(last.path), us, algbw, busbw,
                    check_on && c != Coll::barrier ? std::to_string(errors).c_str() : "N/A",
                    last.steps, to_string(c));
        std::fflush(stdout);
      }
      if (c == Coll::barrier) break;
      const size_t next = static_cast<size_t>(std::ceil(static_cast<double>(bytes) * factor));
      bytes = next > bytes ? next : bytes + 1;
    }
  }
  if (rank == 0 && p.check_order && p.rack_size)
    std::printf(
        "# order check: %zu elements against the nested rule (racks of %u ranks in rank order, "
        "then %u racks in order); %zu of them differ under the flat ring order\n",
        order_checked, n, hosts, order_other);
  else if (rank == 0 && p.check_order)
    std::printf(
        "# order check: %zu elements against the nested rule (local ranks in local order, then "
        "%u hosts in ring order); %zu of them differ under the other nesting\n",
        order_checked, hosts, order_other);
  if (comm.failovers() > 0)
    std::printf("# rank %d: failovers %d, path now %s (%s)\n", rank, comm.failovers(),
                to_string(comm.path()), comm.path_reason().c_str());
  if (const host::RinaJob* rj = comm.impl().rina.get())
    std::printf("# rank %d: %s; this rank's rack stage: %s (ring %u, %d failovers)\n", rank,
                rj->describe().c_str(), to_string(rj->rina->rack_path()),
                rj->rack ? rj->rack->ring_id() : 0u, rj->rack ? rj->rack->failovers() : 0);
  if (rank == 0)
    std::printf("# errors: %zu, status: %s\n", total_errors,
                status == 0 && total_errors == 0 ? "ok" : "FAILED");
  return status != 0 || total_errors != 0 ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"netreduce collectives benchmark, all-reduce by default (one process per rank)"};
  int rank = -1, world = 0, gid_index = -1, iters = 20, warmup = 5, check_on = 1;
  std::string bootstrap, device, dtype_s = "fp32", op_s = "sum", min_s = "8", max_s = "32M";
  double factor = 2;
  Options opt;
  app.add_option("--rank", rank, "this process's rank (required unless --loopback)");
  app.add_option("--world", world, "number of ranks")->required();
  app.add_option("--bootstrap", bootstrap,
                 "rank 0's rendezvous address host:port (required unless --loopback)");
  app.add_option("--device", device, "RDMA device (default: the first one)");
  app.add_option("--gid-index", gid_index, "GID index (default -1: the first RoCEv2 IPv4 GID)");
  app.add_option("-b,--minbytes", min_s, "smallest size (K, M, G suffixes)");
  app.add_option("-e,--maxbytes", max_s, "largest size");
  app.add_option("-f,--stepfactor", factor, "size multiplier between steps")
      ->check(CLI::Range(1.01, 1e6));
  app.add_option("-d,--datatype", dtype_s,
                 "fp32 fp16 bf16 int32 int64 fp64, a comma-separated list, or all");
  app.add_option("-o,--op", op_s, "sum min max, a comma-separated list, or all");
  std::string coll_s = "all_reduce";
  app.add_option("--collective", coll_s,
                 "all_reduce broadcast all_gather reduce_scatter reduce barrier, a "
                 "comma-separated list, or all");
  int root = 0;
  app.add_option("--root", root, "root rank of broadcast and reduce");
  app.add_option("-n,--iters", iters, "timed calls per size")->check(CLI::Range(1, 1000000));
  app.add_option("-w,--warmup_iters", warmup, "warm-up calls per size")
      ->check(CLI::Range(0, 1000000));
  app.add_option("-c,--check", check_on, "check the result at every size (0/1)");
  app.add_option("--msg-len", opt.msg_len, "packets per INA message");
  app.add_option("--payload", opt.payload_bytes, "RoCE path MTU (payload bytes per packet)");
  app.add_option("--window", opt.window, "window N (0: bandwidth-delay estimate)");
  app.add_option("--timeout-ms", opt.op_timeout_ms, "deadline of one all-reduce");
  app.add_option("--connect-timeout-ms", opt.connect_timeout_ms, "deadline of the set-up");
  app.add_option("--ring-id", opt.ring_id, "ring id registered with the daemon (0: derived)");
  app.add_option("--lease-ms", opt.lease_ms,
                 "lease of the ring at the daemon, renewed by rank 0 (0: none)");
  bool keep_ring = false;
  app.add_flag("--keep-ring", keep_ring,
               "leave the ring at the daemon at exit (until its lease runs out), to read its "
               "counters");
  app.add_option("--ipv4", opt.ipv4, "this rank's IPv4 in the ring (default: from the GID)");
  app.add_option("--qp-timeout", opt.qp_timeout,
                 "RC retransmission timeout exponent: 4.096 us x 2^N (default 14)")
      ->check(CLI::Range(1, 31));
  app.add_flag("--force-ring", opt.force_ring, "never use the box");
  app.add_option("--failback-calls", opt.failback_calls,
                 "after a failover, calls before the box is tried again (0: never; default 64)");
  app.add_flag("--rina", opt.rina,
               "Rina mode (Options::rina): racks through their boxes, a ring across them; "
               "every rank prints its rack stage's path at the end");
  std::string path_s = "ina";
  app.add_option("--path", path_s,
                 "while the box is up: ina (every call through the box, the default), model "
                 "(the cost model picks per call) or ring (every call on the ring)")
      ->check(CLI::IsMember({"model", "ina", "ring"}));
  app.add_option("--rings", opt.rings,
                 "rings side by side, each tensor striped over them (1..8; 0: the box's worker "
                 "count from the daemon, or 1)")
      ->check(CLI::Range(0u, host::kMaxRings));
  int local_size = 1;
  app.add_option("--local-size", local_size,
                 "ranks per host (parallel NetReduce): --world ranks are world / n hosts of n "
                 "local ranks (--loopback: threads of this process; verbs: one process per "
                 "rank, default: discovered)")
      ->check(CLI::Range(1u, host::kMaxLocalRanks));
  app.add_option("--local-rank", opt.local_rank,
                 "this process's local rank on its host (verbs; default -1: discovered, local "
                 "ranks in global rank order)")
      ->check(CLI::Range(-1, static_cast<int>(host::kMaxLocalRanks) - 1));
  app.add_option("--host-id", opt.host_id,
                 "this process's host identity (verbs; default: NETREDUCE_HOST_ID, else boot id "
                 "and hostname)");
  bool check_order = false;
  app.add_flag("--check-order", check_order,
               "fp32/fp64 sums: order-sensitive values checked against the nested rule (local "
               "ranks, then hosts in ring order); needs the INA path");
  unsigned rack_size = 0;
  app.add_option("--rack-size", rack_size,
                 "with --check-order: the ranks sit in racks of K consecutive ranks behind a leaf "
                 "box each (a multi-rack tree): each rack folded in rank order, then the racks in "
                 "order (one rank per host)")
      ->check(CLI::Range(1u, 64u));
  bool loopback = false, loopback_box = false;
  app.add_flag("--loopback", loopback,
               "self-test without RDMA: all --world ranks as threads over the loopback transport");
  app.add_flag("--loopback-box", loopback_box,
               "with --loopback: through an in-process engine (the INA path)");
  CLI11_PARSE(app, argc, argv);
  opt.delete_ring_at_close = !keep_ring;
  opt.path_choice = path_s == "ina"    ? PathChoice::ina
                    : path_s == "ring" ? PathChoice::ring
                                       : PathChoice::model;

  std::vector<DataType> types;
  std::vector<Op> ops;
  size_t min_bytes = 0, max_bytes = 0;
  std::string bad;
  for (const std::string& name : split_list(dtype_s, "fp32,fp16,bf16,int32,int64,fp64")) {
    const auto dt = wire::parse_dtype(name);
    if (!dt && bad.empty()) bad = "-d: unknown data type '" + name + "'";
    types.push_back(static_cast<DataType>(dt.value_or(wire::Dtype::fp32)));
  }
  for (const std::string& name : split_list(op_s, "sum,min,max")) {
    const auto op = wire::parse_op(name);
    if (!op && bad.empty()) bad = "-o: unknown op '" + name + "'";
    ops.push_back(static_cast<Op>(op.value_or(wire::ReduceOp::sum)));
  }
  std::vector<Coll> colls;
  for (const std::string& name :
       split_list(coll_s, "all_reduce,broadcast,all_gather,reduce_scatter,reduce,barrier")) {
    const auto* it = std::find(std::begin(kCollNames), std::end(kCollNames), name);
    if (it == std::end(kCollNames) && bad.empty()) bad = "--collective: unknown '" + name + "'";
    colls.push_back(static_cast<Coll>(it == std::end(kCollNames) ? 0 : it - kCollNames));
  }
  if (!bad.empty()) {
    // the first unknown name is reported
  } else if (!parse_size(min_s, min_bytes) || !parse_size(max_s, max_bytes)) {
    bad = "-b/-e: bad size";
  } else if (min_bytes > max_bytes) {
    bad = "-b: larger than -e";
  } else if (loopback_box && !loopback) {
    bad = "--loopback-box: needs --loopback";
  } else if (world < 1 || world > 64) {
    bad = "--world: must be in 1..64";
  } else if (!loopback && (rank < 0 || rank >= world)) {
    bad = "--rank: must be in 0..world-1";
  } else if (root < 0 || root >= world) {
    bad = "--root: must be in 0..world-1";
  } else if (check_order && (colls.size() != 1 || colls[0] != Coll::all_reduce)) {
    bad = "--check-order: all_reduce only";
  } else if (world % local_size != 0) {
    bad = "--local-size: must divide --world (every host runs the same number of ranks)";
  } else if (rack_size && (!check_order || local_size != 1 || world % rack_size != 0)) {
    bad = "--rack-size: needs --check-order, one rank per host and must divide --world";
  } else if (!loopback && bootstrap.empty()) {
    bad = "--bootstrap: required (host:port of rank 0)";
  }
  if (!bad.empty()) {
    std::fprintf(stderr, "netreduce-allreduce-perf: %s\n", bad.c_str());
    return 1;
  }
  const SweepParams sp{colls,
                       root,
                       types,
                       ops,
                       min_bytes,
                       max_bytes,
                       factor,
                       iters,
                       warmup,
                       check_on != 0,
                       check_order && check_on != 0,
                       rack_size,
                       opt.ring_buffer_bytes};
  if (!loopback) {
    if (local_size > 1) opt.local_size = local_size;  // else discovered
    std::unique_ptr<Communicator> comm;
    if (Error e = Communicator::create(rank, world, device, gid_index, bootstrap, opt, comm)) {
      std::fprintf(stderr, "netreduce-allreduce-perf: rank %d: %s\n", rank, e.message.c_str());
      return e.code == ErrorCode::no_device ? 2 : 1;
    }
    std::vector<uint64_t> ring_bytes;
    const int status = sweep(*comm, sp, ring_bytes);
    std::vector<uint32_t> ids;
    for (int g = 0; g < comm->rings(); ++g) ids.push_back(comm->ring_id(g));
    if (rank == 0) print_ring_bytes(ids, ring_bytes, {});
    return status;
  }
  // Self-test without RDMA: every rank a thread of this process over the
  // loopback transport, through an in-process engine (--loopback-box).
  host::LoopbackConfig lc;
  const unsigned n = static_cast<unsigned>(local_size), hosts = static_cast<unsigned>(world) / n;
  lc.world = hosts;
  lc.local_size = n;
  lc.box = loopback_box;
  lc.rings = opt.rings ? opt.rings : 1;
  lc.ring.ring_id = 1;
  lc.ring.msg_len = opt.msg_len;
  lc.ring.payload_bytes = opt.payload_bytes;
  lc.ring.window = opt.window ? opt.window
                              : host::window_from_bdp(opt.link_gbps, opt.rtt_us,
                                                      size_t{opt.msg_len} * opt.payload_bytes);
  opt.window = lc.ring.window;
  lc.recv_bytes =
      std::max(opt.ring_buffer_bytes, size_t{lc.ring.window} * opt.msg_len * opt.payload_bytes);
  host::LoopbackFabric fabric(lc);
  std::vector<std::unique_ptr<Communicator>> comms(static_cast<size_t>(world));
  {
    // A host's local ranks wait for each other: create them all at once.
    std::vector<Error> errs(comms.size());
    std::vector<std::thread> th;
    for (int r = 0; r < world; ++r)
      th.emplace_back([&, r] {
        errs[r] = host::make_loopback_communicator(fabric, static_cast<unsigned>(r), opt, comms[r]);
      });
    for (auto& t : th) t.join();
    for (int r = 0; r < world; ++r)
      if (!errs[r].ok()) {
        std::fprintf(stderr, "netreduce-allreduce-perf: loopback rank %d: %s\n", r,
                     errs[r].message.c_str());
        return 1;
      }
  }
  std::vector<int> rc(static_cast<size_t>(world));
  std::vector<std::vector<uint64_t>> ring_bytes(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] { rc[r] = sweep(*comms[r], sp, ring_bytes[r]); });
  for (auto& t : threads) t.join();
  // Host 0's rings (local rank l's R rings are l R .. l R + R - 1) and the
  // box's own count per ring: data bytes aggregated, all hosts' copies.
  std::vector<uint32_t> ids;
  std::vector<uint64_t> host_ring_bytes, box_bytes;
  for (unsigned l = 0; l < n; ++l)
    for (unsigned g = 0; g < lc.rings; ++g) {
      ids.push_back(comms[l]->ring_id(static_cast<int>(g)));
      host_ring_bytes.push_back(ring_bytes[l][g]);
    }
  for (unsigned g = 0; loopback_box && g < n * lc.rings; ++g) {
    const auto info = fabric.box_ring(g);
    box_bytes.push_back(info ? info->counters.bytes_aggregated : 0);
  }
  print_ring_bytes(ids, host_ring_bytes, box_bytes);
  {
    // The ranks leave at once, as a job's processes do: a communicator's
    // close waits for its peers'.
    std::vector<std::thread> leave;
    for (auto& c : comms) leave.emplace_back([&c] { c.reset(); });
    for (auto& t : leave) t.join();
  }
  if (loopback_box) {
    // Per host, the payload on the wire into the box: one rank's data.
    uint64_t one_rank = 0;
    for (uint64_t b : host_ring_bytes) one_rank += b;
    for (unsigned h = 0; h < hosts; ++h)
      std::printf(
          "# host %u: %llu payload bytes on the wire into the box (one rank's data: %llu)\n", h,
          static_cast<unsigned long long>(fabric.host_bytes_into_box(h)),
          static_cast<unsigned long long>(one_rank));
  }
  for (int r : rc)
    if (r != 0) return r;
  return 0;
}
