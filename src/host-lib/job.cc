// The verbs communicator's job plan (theory of operation in job.h).
#include "host-lib/job.h"

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>

namespace netreduce::host {
namespace {

Error bad(const std::string& m) { return Error::make(ErrorCode::bootstrap, "bootstrap: " + m); }

// Strict unsigned decimal (or hex) field; false on anything else.
bool parse_u64(const std::string& s, int base, uint64_t& out) {
  if (s.empty() || s.size() > 20) return false;
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(s.c_str(), &end, base);
  if (errno != 0 || end != s.c_str() + s.size() || s[0] == '-' || s[0] == '+') return false;
  out = v;
  return true;
}

bool parse_int(const std::string& s, int& out) {
  if (s == "-1") {
    out = -1;
    return true;
  }
  uint64_t v = 0;
  if (!parse_u64(s, 10, v) || v > 0x7FFFFFFF) return false;
  out = static_cast<int>(v);
  return true;
}

}  // namespace

std::string encode_job_header(const JobHeader& h) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%u %016" PRIx64, h.stripes, h.nonce);
  std::string out(buf);
  // Appends only: GCC 12 at -O3 warns falsely (-Wrestrict) on `" " + string`.
  if (!h.racks.empty()) out.append(" ").append(fabric_racks_json(h.racks).dump());
  return out;
}

Error decode_job_header(const std::string& s, JobHeader& out) {
  const size_t sp = s.find(' ');
  const size_t sp2 = sp == std::string::npos ? sp : s.find(' ', sp + 1);
  uint64_t r = 0;
  bool ok =
      sp != std::string::npos && parse_u64(s.substr(0, sp), 10, r) &&
      parse_u64(s.substr(sp + 1, sp2 == std::string::npos ? sp2 : sp2 - sp - 1), 16, out.nonce) &&
      r <= 0xFFFFFFFFu;
  out.racks.clear();
  if (ok && sp2 != std::string::npos) {
    const auto racks = nlohmann::json::parse(s.substr(sp2 + 1), nullptr, false);
    ok = !racks.is_discarded() && parse_fabric_racks(racks, out.racks) && !out.racks.empty();
  }
  if (!ok) return bad("malformed job header from rank 0: '" + s + "'");
  out.stripes = static_cast<unsigned>(r);
  return {};
}

// "<local_rank> <local_size> <rack bytes> <ring_order bytes> <rack><ring_order><host_id>":
// the labels are any strings (the host id last).
std::string encode_claim(const LocalityClaim& c) {
  return std::to_string(c.local_rank) + " " + std::to_string(c.local_size) + " " +
         std::to_string(c.rack.size()) + " " + std::to_string(c.ring_order.size()) + " " + c.rack +
         c.ring_order + c.host_id;
}

Error decode_claim(const std::string& s, unsigned rank, LocalityClaim& out) {
  int fields[4] = {};
  size_t at = 0;
  bool ok = true;
  for (int& f : fields) {
    const size_t sp = s.find(' ', at);
    ok = ok && sp != std::string::npos && parse_int(s.substr(at, sp - at), f);
    at = sp == std::string::npos ? s.size() : sp + 1;
  }
  const auto rack = static_cast<size_t>(fields[2]), order = static_cast<size_t>(fields[3]);
  if (!ok || fields[2] < 0 || fields[3] < 0 || s.size() < at + rack + order + 1)
    return bad("rank " + std::to_string(rank) + " sent a malformed locality claim");
  out.local_rank = fields[0];
  out.local_size = fields[1];
  out.rack = s.substr(at, rack);
  out.ring_order = s.substr(at + rack, order);
  out.host_id = s.substr(at + rack + order);
  return {};
}

std::string lane_label(unsigned local_rank, unsigned local_size, unsigned stripe) {
  if (local_size <= 1) return "ring " + std::to_string(stripe);
  return "local rank " + std::to_string(local_rank) + "'s ring, stripe " + std::to_string(stripe);
}

std::string encode_decision(const PathDecision& d) {
  if (!d.ina) return "R0:" + d.reason;
  std::string ids;
  for (uint32_t id : d.ring_ids) {
    if (!ids.empty()) ids += ',';
    ids += std::to_string(id);
  }
  return "I" + ids + ":" + d.reason;
}

Error decode_decision(const std::string& s, unsigned rings, PathDecision& out) {
  out = {};
  const size_t colon = s.find(':');
  if (s.size() < 3 || colon == std::string::npos || (s[0] != 'I' && s[0] != 'R'))
    return bad("malformed path decision from rank 0");
  out.ina = s[0] == 'I';
  out.reason = s.substr(colon + 1);
  if (!out.ina) return {};
  for (size_t pos = 1;;) {
    const size_t end = std::min(s.find(',', pos), colon);
    uint64_t id = 0;
    if (!parse_u64(s.substr(pos, end - pos), 10, id) || id == 0 || id > 0xFFFFFFFFu)
      return bad("malformed ring id in the path decision from rank 0");
    out.ring_ids.push_back(static_cast<uint32_t>(id));
    if (end == colon) break;
    pos = end + 1;
  }
  if (out.ring_ids.size() != rings)
    return bad("rank 0 sent " + std::to_string(out.ring_ids.size()) + " ring ids for " +
               std::to_string(rings) + " rings");
  return {};
}

std::vector<uint32_t> my_ring_ids(const std::vector<uint32_t>& job, unsigned local_rank,
                                  unsigned stripes) {
  const size_t first = size_t{local_rank} * stripes;
  if (first + stripes > job.size()) return {};
  return {job.begin() + static_cast<long>(first), job.begin() + static_cast<long>(first + stripes)};
}

Error ring_bootstrap(Bootstrap& job, const Locality& loc, const std::string& job_key,
                     Clock::time_point deadline, std::unique_ptr<Bootstrap>& out) {
  // The root publishes its address, or "!" and why it has none (so that
  // the members fail at once instead of at their deadline).
  const bool root = loc.host == 0;
  std::unique_ptr<Bootstrap> mine;
  std::string said;
  if (root) {
    const std::string ip = job.local_ip();
    Error e = ip.empty() ? Error::make(ErrorCode::bootstrap,
                                       "bootstrap: no address of this rank to listen at")
                         : Bootstrap::listen(loc.hosts, ip, mine);
    said = e.ok() ? mine->address() : "!" + e.message;
  }
  std::vector<std::string> all;
  if (Error e = job.allgather(said, all, deadline)) return e;
  const std::string& addr = all.at(loc.ring.at(0));
  const std::string who = "local rank " + std::to_string(loc.local_rank) + "'s ring: ";
  if (addr.empty() || addr[0] == '!')
    return Error::make(ErrorCode::bootstrap,
                       who + "its first member has no bootstrap" +
                           (addr.empty() ? std::string() : " (" + addr.substr(1) + ")"));
  if (root) {
    if (Error e = mine->accept(job_key, deadline)) return Error::make(e.code, who + e.message);
    out = std::move(mine);
    return {};
  }
  if (Error e = Bootstrap::create(loc.host, loc.hosts, addr, job_key, deadline, out))
    return Error::make(e.code, who + e.message);
  return {};
}

}  // namespace netreduce::host
