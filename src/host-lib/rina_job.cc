#include "host-lib/rina_job.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>

namespace netreduce::host {
namespace {

// One communicator of the job's Rina mode: a box rack's or a lane's.
struct Part {
  std::vector<unsigned> members;  // job ranks; the first listens
  int lane = -1;                  // the lane's index; -1: a rack
  std::string name;               // for errors: "rack leaf0", "lane 1"
};

Error failed(const std::string& part, const Error& e) {
  return Error::make(e.code, fmt::format("rina: {}: {}", part, e.message));
}

// The racks in the ring's order (a label's ranks where its first one is),
// each rack's ranks in the ring's order.
std::vector<RinaRack> racks_of(const RinaJobInput& in) {
  std::vector<RinaRack> racks;
  std::map<std::string, size_t> at;
  for (unsigned r : in.ring) {
    const std::string& label = in.rack_of[r];
    auto [it, fresh] = at.emplace(label, racks.size());
    if (fresh) {
      const bool box =
          !label.empty() && std::any_of(in.boxes.begin(), in.boxes.end(),
                                        [&](const FabricRack& f) { return f.leaf == label; });
      racks.push_back({{}, box});
    }
    racks[it->second].ranks.push_back(r);
  }
  return racks;
}

std::vector<Part> parts_of(const RinaPlan& plan, const std::vector<std::string>& labels) {
  std::vector<Part> parts;
  for (size_t g = 0; g < plan.groups.size(); ++g)
    if (plan.groups[g].size() >= 2) parts.push_back({plan.groups[g], -1, "rack " + labels[g]});
  // One group (every rank in one box rack) needs no ring across groups.
  for (unsigned j = 0; j < plan.lanes && plan.groups.size() > 1; ++j) {
    Part p{{}, static_cast<int>(j), fmt::format("lane {}", j)};
    for (unsigned g = 0; g < plan.groups.size(); ++g) p.members.push_back(plan.carrier(g, j));
    parts.push_back(std::move(p));
  }
  return parts;
}

// A part's options: the job's, its order pinned to its members', one host
// per rank; a lane on the ring path.
Options part_options(const Options& job, const Part& p, Clock::time_point deadline) {
  Options o = job;
  o.rina = false;
  o.rack = "-";
  o.ring_order.clear();
  for (size_t i = 0; i < p.members.size(); ++i)
    o.ring_order.append(i ? "," : "").append(std::to_string(i));
  o.ring_id = 0;
  o.local_rank = 0;
  o.local_size = 1;
  const auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  o.connect_timeout_ms = static_cast<int>(std::clamp<int64_t>(left, 1, 1 << 30));
  if (p.lane >= 0) {
    o.force_ring = true;
    o.rings = 1;
  }
  return o;
}

}  // namespace

bool rina_mode(const Options& options) {
  const char* env = std::getenv("NETREDUCE_RINA");
  return options.rina || (env != nullptr && std::string(env) == "1");
}

RinaJob::~RinaJob() {
  rina.reset();
  for (auto& l : lanes) l.reset();
  rack.reset();
}

std::string RinaJob::describe() const {
  std::string s = fmt::format("rina: {} groups, {} lanes:", plan.groups.size(), plan.lanes);
  for (size_t g = 0; g < plan.groups.size(); ++g) {
    std::string ranks;
    for (unsigned r : plan.groups[g])
      ranks.append(ranks.empty() ? "" : ", ").append(std::to_string(r));
    s += g ? "; " : " ";
    if (plan.groups[g].size() >= 2)
      s += fmt::format("{} (ranks {}) through its box", labels[g], ranks);
    else
      s += fmt::format("rank {} alone", ranks);
  }
  return s;
}

Error make_rina_job(const RinaJobInput& in, Bootstrap& job, const Options& options,
                    Clock::time_point deadline, std::unique_ptr<RinaJob>& out) {
  out = std::make_unique<RinaJob>();
  RinaJob* rj = out.get();
  if (Error e = make_rina_plan(racks_of(in), rj->plan)) return e;
  const RinaPlan& plan = rj->plan;
  for (const auto& g : plan.groups) rj->labels.push_back(in.rack_of[g[0]]);
  const std::vector<Part> parts = parts_of(plan, rj->labels);

  // The parts this rank leads listen; one allgather tells every member.
  std::map<size_t, std::unique_ptr<Bootstrap>> listening;
  nlohmann::json said = nlohmann::json::object();
  for (size_t p = 0; p < parts.size(); ++p) {
    if (parts[p].members[0] != in.rank) continue;
    const std::string ip = job.local_ip();
    std::unique_ptr<Bootstrap> b;
    Error e = ip.empty() ? Error::make(ErrorCode::bootstrap, "no address of this rank to listen at")
                         : Bootstrap::listen(static_cast<unsigned>(parts[p].members.size()), ip, b);
    said[std::to_string(p)] = e.ok() ? b->address() : std::string("!").append(e.message);
    if (e.ok()) listening[p] = std::move(b);
  }
  std::vector<std::string> all;
  if (Error e = job.allgather(said.dump(), all, deadline)) return e;

  rj->lanes.resize(plan.lanes);
  for (size_t p = 0; p < parts.size(); ++p) {
    const Part& part = parts[p];
    const auto me = std::find(part.members.begin(), part.members.end(), in.rank);
    if (me == part.members.end()) continue;
    const auto idx = static_cast<unsigned>(me - part.members.begin());
    const auto m = static_cast<unsigned>(part.members.size());
    const auto told = nlohmann::json::parse(all.at(part.members[0]), nullptr, false);
    const std::string addr =
        told.is_object() ? told.value(std::to_string(p), std::string("!not told")) : "!not told";
    if (addr.empty() || addr[0] == '!')
      return failed(part.name,
                    Error::make(ErrorCode::bootstrap, "its first member, rank " +
                                                          std::to_string(part.members[0]) +
                                                          ", has no bootstrap: " + addr.substr(1)));
    const std::string key = in.job_key + "/rina/" + std::to_string(p);
    std::unique_ptr<Bootstrap> boot;
    if (idx == 0) {
      boot = std::move(listening[p]);
      if (Error e = boot->accept(key, deadline)) return failed(part.name, e);
    } else if (Error e = Bootstrap::create(idx, m, addr, key, deadline, boot)) {
      return failed(part.name, e);
    }
    std::unique_ptr<Communicator> c;
    if (Error e = create_on_bootstrap(idx, m, in.device, in.gid_index, std::move(boot), addr,
                                      part_options(options, part, deadline), c))
      return failed(part.name, e);
    (part.lane >= 0 ? rj->lanes[static_cast<size_t>(part.lane)] : rj->rack) = std::move(c);
  }
  std::vector<Communicator*> lanes;
  for (auto& l : rj->lanes) lanes.push_back(l.get());
  return Rina::create(plan, in.rank, rj->rack.get(), lanes, rj->rina);
}

}  // namespace netreduce::host
