#include "host-lib/rina.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "host-lib/collective.h"
#include "host-lib/plan.h"
#include "host-lib/scale.h"

namespace netreduce::host {
namespace {

Error bad(const std::string& why) {
  return Error::make(ErrorCode::invalid_argument, "rina: " + why);
}

// A stage's error, named: "rina: lane 2 (ring across 3 groups): <its text>".
Error named(const std::string& stage, Error e) {
  e.message = fmt::format("rina: {}: {}", stage, e.message);
  return e;
}

}  // namespace

Error make_rina_plan(const std::vector<RinaRack>& racks, RinaPlan& out) {
  RinaPlan p;
  for (const RinaRack& r : racks) p.world += static_cast<unsigned>(r.ranks.size());
  if (racks.empty()) return bad("no racks");
  p.group_of.assign(p.world, ~0u);
  p.member_of.assign(p.world, 0);
  for (size_t i = 0; i < racks.size(); ++i) {
    const RinaRack& r = racks[i];
    if (r.ranks.empty()) return bad(fmt::format("rack {} has no ranks", i));
    for (unsigned x : r.ranks) {
      if (x >= p.world || p.group_of[x] != ~0u)
        return bad(
            fmt::format("rack {}: rank {} is outside 0..{} or in two racks", i, x, p.world - 1));
      p.group_of[x] = 0;  // seen; the group is set below
    }
    if (r.box && r.ranks.size() >= 2) {
      p.groups.push_back(r.ranks);
      p.lanes = std::max(p.lanes, static_cast<unsigned>(r.ranks.size()));
    } else {
      for (unsigned x : r.ranks) p.groups.push_back({x});
    }
  }
  for (unsigned g = 0; g < p.groups.size(); ++g)
    for (unsigned i = 0; i < p.groups[g].size(); ++i) {
      p.group_of[p.groups[g][i]] = g;
      p.member_of[p.groups[g][i]] = i;
    }
  out = std::move(p);
  return {};
}

Rina::Rina(const RinaPlan& plan, unsigned rank, Communicator* rack,
           std::vector<Communicator*> lanes)
    : plan_(plan), member_(plan.member_of[rank]), rack_(rack), lanes_(std::move(lanes)) {}

Error Rina::create(const RinaPlan& plan, unsigned rank, Communicator* rack,
                   std::vector<Communicator*> lanes, std::unique_ptr<Rina>& out) {
  if (rank >= plan.world) return bad(fmt::format("rank {} is outside 0..{}", rank, plan.world - 1));
  const unsigned g = plan.group_of[rank], G = static_cast<unsigned>(plan.groups.size());
  const size_t m = plan.groups[g].size();
  if ((m >= 2) != (rack != nullptr))
    return bad(fmt::format("rank {}: a rack communicator is {} (its group has {} ranks)", rank,
                           rack ? "given where none belongs" : "missing", m));
  if (rack && (rack->world() != static_cast<int>(m) ||
               rack->rank() != static_cast<int>(plan.member_of[rank])))
    return bad(fmt::format("rank {}: the rack communicator is rank {} of {}, expected {} of {}",
                           rank, rack->rank(), rack->world(), plan.member_of[rank], m));
  if (lanes.size() != plan.lanes)
    return bad(fmt::format("{} lane communicators for {} lanes", lanes.size(), plan.lanes));
  for (unsigned j = 0; j < plan.lanes; ++j) {
    const bool mine = G > 1 && plan.carrier(g, j) == rank;
    if (mine != (lanes[j] != nullptr))
      return bad(fmt::format("rank {}: lane {}'s communicator is {}", rank, j,
                             mine ? "missing" : "given where this rank does not carry it"));
    if (mine &&
        (lanes[j]->world() != static_cast<int>(G) || lanes[j]->rank() != static_cast<int>(g)))
      return bad(fmt::format("rank {}: lane {}'s communicator is rank {} of {}, expected {} of {}",
                             rank, j, lanes[j]->rank(), lanes[j]->world(), g, G));
  }
  out.reset(new Rina(plan, rank, rack, std::move(lanes)));
  return {};
}

Path Rina::rack_path() const { return rack_ ? rack_->path() : Path::ina; }

Error Rina::allreduce(const void* send, void* recv, size_t count, DataType t, Op op,
                      int timeout_ms) {
  const Op wire = op == Op::avg ? Op::sum : op;
  if (Error e = Collective::check_args(send, recv, count, t, wire)) return named("all-reduce", e);
  // timeout_ms < 0: each stage its communicator's op_timeout_ms.
  const Clock::time_point deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  const auto left = [&] {
    if (timeout_ms < 0) return -1;
    const auto ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    return static_cast<int>(std::max<int64_t>(ms, 1));
  };
  const size_t es = element_size(t);
  auto* out = static_cast<uint8_t*>(recv);
  const unsigned G = static_cast<unsigned>(plan_.groups.size()), K = plan_.lanes;

  // 1. The rack's sum, through its box.
  if (rack_) {
    if (Error e = rack_->allreduce(send, recv, count, t, wire, left()))
      return named(fmt::format("rack stage (rank {} of {})", member_, rack_->world()), e);
  } else if (recv != send && count > 0) {
    std::memmove(recv, send, count * es);
  }
  // 2. Each lane this rank carries: a ring across the groups, all at once.
  if (G > 1) {
    std::vector<AllreduceHandle> h(K);
    std::vector<Error> errs(K);
    std::vector<bool> started(K, false);
    for (unsigned j = 0; j < K; ++j) {
      const ChunkRange r = ring_chunk(count, K, j);
      if (!lanes_[j] || r.count == 0) continue;
      errs[j] = lanes_[j]->allreduce_async(out + r.first * es, out + r.first * es, r.count, t, wire,
                                           h[j], left());
      started[j] = errs[j].ok();
    }
    for (unsigned j = 0; j < K; ++j)
      if (started[j]) errs[j] = h[j].wait();
    Error lane_error;
    for (unsigned j = 0; j < K && lane_error.ok(); ++j)
      if (!errs[j].ok())
        lane_error = named(
            fmt::format("lane {} (a ring across {} groups, its ranks the groups)", j, G), errs[j]);
    // 3. The other members' lanes, through the rack's box. A member whose
    // lane failed takes part too (so nobody waits for it), saying so.
    if (rack_) {
      unsigned ok_members = 0;
      if (Error e = spread(out, count, t, lane_error.ok(), ok_members, left()))
        return lane_error.ok() ? named("spread", e) : lane_error;
      if (lane_error.ok() && ok_members != static_cast<unsigned>(rack_->world()))
        return Error::make(ErrorCode::transport,
                           fmt::format("rina: spread: {} of the rack's {} members failed a lane "
                                       "(their errors name it)",
                                       rack_->world() - ok_members, rack_->world()));
    }
    if (!lane_error.ok()) return lane_error;
  }
  if (op == Op::avg) divide_elements(recv, count, t, plan_.world);
  return {};
}

// An all-gather of the members' lanes: the int32 sum of raw bits, each
// member's lanes in place and zeros elsewhere. At most one member has
// non-zero bits at any byte, so no sum carries: bit-exact for every type.
// One more word counts the members whose lanes succeeded (ok_members).
Error Rina::spread(uint8_t* out, size_t count, DataType t, bool lanes_ok, unsigned& ok_members,
                   int timeout_ms) {
  const size_t es = element_size(t), bytes = count * es, words = (bytes + 3) / 4;
  scratch_.assign((words + 1) * 4, 0);
  for (unsigned j = 0; j < plan_.lanes && lanes_ok; ++j) {
    const ChunkRange r = ring_chunk(count, plan_.lanes, j);
    if (lanes_[j] && r.count > 0)
      std::memcpy(scratch_.data() + r.first * es, out + r.first * es, r.count * es);
  }
  const int32_t mine = lanes_ok ? 1 : 0;
  std::memcpy(scratch_.data() + words * 4, &mine, 4);
  if (Error e = rack_->allreduce(scratch_.data(), scratch_.data(), words + 1, DataType::int32,
                                 Op::sum, timeout_ms))
    return e;
  int32_t n = 0;
  std::memcpy(&n, scratch_.data() + words * 4, 4);
  ok_members = static_cast<unsigned>(n);
  if (bytes > 0 && lanes_ok && ok_members == static_cast<unsigned>(rack_->world()))
    std::memcpy(out, scratch_.data(), bytes);
  return {};
}

}  // namespace netreduce::host
