#include "host-lib/daemon.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <thread>

#include "common/http_client.h"
#include "common/ring_json.h"

namespace netreduce::host {

namespace {

std::string trim(std::string s) {
  const auto b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return {};
  const auto e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}

// The "field" of an API error body; empty when there is none.
std::string error_field(const HttpReply& res) {
  try {
    const auto j = nlohmann::json::parse(res.body);
    if (j.contains("error") && j["error"].is_object())
      return j["error"].value("field", std::string{});
  } catch (const std::exception&) {
  }
  return {};
}

std::string describe_error(const HttpReply& res) {
  if (!res.ok()) return "no answer (" + res.error + ")";
  std::string m = "HTTP " + std::to_string(res.status);
  try {
    const auto j = nlohmann::json::parse(res.body);
    if (j.contains("error") && j["error"].is_object()) {
      const auto& e = j["error"];
      m += " " + e.value("code", std::string{});
      const std::string field = e.value("field", std::string{});
      if (!field.empty()) m += " (" + field + ")";
      m += ": " + e.value("message", std::string{});
    }
  } catch (const std::exception&) {
  }
  return m;
}

// A client for `target` with the bearer token set; null (with `why`) for a
// URL it cannot use. Every call names its own total deadline.
std::unique_ptr<HttpClient> client(const DaemonTarget& target, std::string& why) {
  auto cli = HttpClient::make(target.url, why);
  if (!cli) {
    why = "daemon " + why;
    return nullptr;
  }
  if (!target.token.empty()) cli->set_bearer(target.token);
  return cli;
}

using Deadline = std::chrono::steady_clock::time_point;

// What is left of `deadline`, in ms (at least 1: the call then fails at once).
int remaining_ms(Deadline deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - std::chrono::steady_clock::now());
  return static_cast<int>(std::max<int64_t>(left.count(), 1));
}

std::vector<std::string> credential_header(const std::string& credential) {
  if (credential.empty()) return {};
  return {std::string(kCredentialHeader) + ": " + credential};
}

std::string ring_path(uint32_t id) { return "/v1/rings/" + std::to_string(id); }

// DELETE /v1/rings/{id} with the credential within timeout_ms: "" when done
// (204, or 404: the ring is already gone), otherwise why not.
std::string delete_owned(HttpClient& cli, uint32_t id, const std::string& credential,
                         int timeout_ms) {
  const HttpReply res =
      cli.call("DELETE", ring_path(id), "", timeout_ms, credential_header(credential));
  if (res.status == 204 || res.status == 404) return {};
  return describe_error(res);
}

}  // namespace

uint32_t derive_ring_id(const std::string& bootstrap, const std::vector<uint32_t>& members,
                        uint64_t nonce) {
  uint32_t h = 2166136261u;  // FNV-1a
  auto mix = [&h](uint8_t b) { h = (h ^ b) * 16777619u; };
  for (char c : bootstrap) mix(static_cast<uint8_t>(c));
  for (uint32_t m : members)
    for (int s = 0; s < 32; s += 8) mix(static_cast<uint8_t>(m >> s));
  for (int s = 0; s < 64; s += 8) mix(static_cast<uint8_t>(nonce >> s));
  h &= 0x7FFFFFFF;
  return h == 0 ? 1 : h;
}

uint64_t random_nonce() {
  std::random_device rd;
  return uint64_t{rd()} << 32 ^ rd();
}

DaemonTarget daemon_target(const Options& o) {
  DaemonTarget t;
  t.url = o.daemon;
  if (t.url.empty())
    if (const char* v = std::getenv("NETREDUCE_DAEMON")) t.url = trim(v);
  t.token = o.token;
  if (t.token.empty()) {
    if (const char* v = std::getenv("NETREDUCE_TOKEN")) {
      t.token = trim(v);
    } else if (const char* f = std::getenv("NETREDUCE_TOKEN_FILE")) {
      std::ifstream in(f);
      if (!in) {
        t.error = std::string("NETREDUCE_TOKEN_FILE: cannot read ") + f;
      } else {
        std::stringstream ss;
        ss << in.rdbuf();
        t.token = trim(ss.str());
      }
    }
  }
  return t;
}

Registration register_ring(const DaemonTarget& target, engine::RingSpec spec, int timeout_ms,
                           uint32_t lease_ms, const std::function<uint32_t()>& fresh_id) {
  Registration reg;
  reg.ring_id = spec.ring_id;
  reg.lease_ms = lease_ms;
  if (target.url.empty()) {
    reg.reason = "no box configured (NETREDUCE_DAEMON unset)";
    return reg;
  }
  if (!target.error.empty()) {
    reg.reason = target.error;
    return reg;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  try {
    std::string why;
    auto cli = client(target, why);
    if (!cli) {
      reg.reason = why;
      return reg;
    }
    // No DELETE first: an id held by anyone else (another job, or a leftover
    // of this job's earlier run) is theirs until they or its lease remove it.
    std::string taken;  // derived ids other jobs hold, for the reason
    std::string credential;
    for (int attempt = 1;; ++attempt) {
      reg.ring_id = spec.ring_id;
      nlohmann::json body = ring_to_json(spec);
      if (lease_ms) body["lease_ms"] = lease_ms;
      const HttpReply res = cli->call("POST", "/v1/rings", body.dump(), remaining_ms(deadline));
      if (res.status == 200 || res.status == 201) {
        try {
          const auto j = nlohmann::json::parse(res.body);
          credential = j.at("ring").value("credential", std::string{});
        } catch (const std::exception&) {
        }
        break;
      }
      // 503 `busy` (the daemon's data plane calls are all taken) is answered
      // before the request is acted on: try again while the deadline allows.
      if (res.status == 503 && !res.header("Retry-After").empty() &&
          std::chrono::steady_clock::now() + std::chrono::milliseconds(250) < deadline) {
        --attempt;
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        continue;
      }
      // Only a 409 about the id is a collision worth a fresh id; another
      // conflict (e.g. the box's placement, field "members") is final.
      const bool conflict = res.status == 409 && error_field(res) == "id";
      if (conflict && fresh_id && attempt < kIdAttempts) {
        taken += (taken.empty() ? "" : ", ") + std::to_string(spec.ring_id);
        spec.ring_id = fresh_id();
        continue;
      }
      reg.reason = "daemon at " + target.url + " refused ring " + std::to_string(spec.ring_id) +
                   ": " + describe_error(res);
      if (conflict && fresh_id)
        reg.reason += " (derived ids " + taken + " were also taken; " +
                      std::to_string(kIdAttempts) + " tried)";
      return reg;
    }
    const std::string path = ring_path(spec.ring_id);
    const std::string retried =
        taken.empty() ? "" : " (derived ids " + taken + " were registered by other jobs)";
    for (;;) {
      const HttpReply g = cli->call("GET", path, "", remaining_ms(deadline));
      if (g.status == 200) {
        try {
          const auto j = nlohmann::json::parse(g.body);
          if (j.value("installed", false)) {
            reg.installed = true;
            reg.credential = credential;
            reg.reason = "ring " + std::to_string(spec.ring_id) + " installed by the daemon at " +
                         target.url + retried;
            return reg;
          }
        } catch (const std::exception&) {
        }
      }
      if (std::chrono::steady_clock::now() + std::chrono::milliseconds(100) >= deadline) {
        reg.reason = "daemon at " + target.url + " accepted ring " + std::to_string(spec.ring_id) +
                     " but the data plane did not install it within " + std::to_string(timeout_ms) +
                     " ms (" +
                     (g.status == 200 ? std::string("installed: false") : describe_error(g)) + ")" +
                     retried;
        // Ours, and unused: remove it rather than leave it to its lease
        // (a cleanup with a budget of its own).
        if (const std::string e = delete_owned(*cli, spec.ring_id, credential, timeout_ms);
            !e.empty())
          reg.reason += "; deleting it again failed: " + e;
        return reg;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  } catch (const std::exception& e) {
    reg.reason = std::string("daemon registration failed: ") + e.what();
  }
  return reg;
}

Registration setup_ring(const Options& options, const std::string& bootstrap, engine::RingSpec spec,
                        std::unique_ptr<OwnedRing>& owned) {
  owned.reset();
  std::function<uint32_t()> fresh;
  if (options.ring_id) {
    spec.ring_id = options.ring_id;
  } else {
    fresh = [&] { return derive_ring_id(bootstrap, spec.members, random_nonce()); };
    spec.ring_id = fresh();
  }
  const DaemonTarget target = daemon_target(options);
  Registration reg =
      register_ring(target, spec, options.daemon_timeout_ms, options.lease_ms, fresh);
  if (reg.installed)
    owned = std::make_unique<OwnedRing>(target, reg.ring_id, reg.credential, reg.lease_ms,
                                        options.daemon_timeout_ms, options.delete_ring_at_close);
  return reg;
}

Registration setup_rings(const Options& options, const std::string& bootstrap,
                         const engine::RingSpec& spec, unsigned rings,
                         std::vector<std::unique_ptr<OwnedRing>>& owned) {
  return setup_rings(options, bootstrap, std::vector<engine::RingSpec>{spec}, rings, owned);
}

Registration setup_rings(const Options& options, const std::string& bootstrap,
                         const std::vector<engine::RingSpec>& specs, unsigned stripes,
                         std::vector<std::unique_ptr<OwnedRing>>& owned) {
  std::vector<engine::RingSpec> per_ring;
  for (const engine::RingSpec& s : specs) per_ring.insert(per_ring.end(), stripes, s);
  return setup_job_rings(options, bootstrap, per_ring, stripes, owned);
}

Registration setup_job_rings(const Options& options, const std::string& bootstrap,
                             const std::vector<engine::RingSpec>& per_ring, unsigned stripes,
                             std::vector<std::unique_ptr<OwnedRing>>& owned) {
  owned.clear();
  Registration all;
  std::string ids;
  const unsigned rings = static_cast<unsigned>(per_ring.size()), n = rings / stripes;
  for (unsigned g = 0; g < rings; ++g) {
    Options o = options;
    if (o.ring_id) o.ring_id = options.ring_id + g;  // the caller checked it does not wrap
    std::unique_ptr<OwnedRing> one;
    Registration reg = setup_ring(o, bootstrap, per_ring[g], one);
    if (rings == 1) {
      reg.ring_ids = {reg.ring_id};
      if (reg.installed) owned.push_back(std::move(one));
      return reg;
    }
    if (!reg.installed) {
      for (auto& r : owned) r->release(/*rollback=*/true);
      owned.clear();
      reg.reason = "ring " + std::to_string(g) + " of " + std::to_string(rings) +
                   (n > 1 ? " (local rank " + std::to_string(g / stripes) + "'s ring, stripe " +
                                std::to_string(g % stripes) + ", id "
                          : std::string(" (id ")) +
                   std::to_string(reg.ring_id) + "): " + reg.reason;
      return reg;
    }
    all.ring_ids.push_back(reg.ring_id);
    ids += (ids.empty() ? "" : ", ") + std::to_string(reg.ring_id);
    owned.push_back(std::move(one));
  }
  all.installed = true;
  all.ring_id = all.ring_ids.front();
  all.lease_ms = options.lease_ms;
  all.reason = std::to_string(rings) + " rings (ids " + ids + ") installed by the daemon at " +
               daemon_target(options).url;
  if (n > 1)
    all.reason +=
        " (" + std::to_string(n) + " local rings x " + std::to_string(stripes) + " stripes)";
  return all;
}

namespace {

// The "dataplane" object of the daemon's GET /v1/status (and the whole
// answer in `all`), or false with why.
bool dataplane_status(const DaemonTarget& target, int timeout_ms, nlohmann::json& dp,
                      std::string& why, nlohmann::json* all = nullptr) {
  if (target.url.empty()) {
    why = "no box configured (NETREDUCE_DAEMON unset)";
    return false;
  }
  try {
    auto cli = client(target, why);
    if (!cli) return false;
    const HttpReply res = cli->call("GET", "/v1/status", "", timeout_ms);
    if (res.status != 200) {
      why = "daemon at " + target.url + " status: " + describe_error(res);
      return false;
    }
    auto j = nlohmann::json::parse(res.body);
    dp = j.value("dataplane", nlohmann::json::object());
    if (!dp.is_object()) throw std::runtime_error("\"dataplane\" is not an object");
    if (all) *all = std::move(j);
    return true;
  } catch (const std::exception& e) {
    why = std::string("daemon status: ") + e.what();
  }
  return false;
}

}  // namespace

BoxOutline box_outline(const DaemonTarget& target, int timeout_ms, std::string& why) {
  nlohmann::json dp, all;
  BoxOutline out;
  if (!dataplane_status(target, timeout_ms, dp, why, &all)) return out;
  // A fabric section the library cannot read orders nothing (rank order).
  if (const auto f = all.find("fabric"); f != all.end() && f->is_object() && f->contains("racks"))
    parse_fabric_racks((*f)["racks"], out.racks);
  const auto w = dp.value("workers", nlohmann::json::array());
  if (!w.is_array() || w.empty()) {
    why = "daemon at " + target.url + " reports no data plane workers (data plane down?)";
    return out;
  }
  out.workers = static_cast<unsigned>(w.size());
  return out;
}

std::string box_unfit(const DaemonTarget& target, int timeout_ms, uint8_t qp_timeout) {
  nlohmann::json dp;
  std::string why;
  if (!dataplane_status(target, timeout_ms, dp, why)) return why;
  if (dp.value("connected", false) != true)
    return "the daemon at " + target.url + " has no data plane connected (" +
           dp.value("error", std::string("no error given")) + ")";
  const auto caps = dp.value("capabilities", nlohmann::json::array());
  if (!caps.is_array() || std::find(caps.begin(), caps.end(), "result_digest") == caps.end())
    return "the box at " + target.url +
           " does not seal its results (no \"result_digest\" among its capabilities)";
  // 7 transmissions of a WRITE (retry_cnt 6), each waiting 4.096 us x 2^qp_timeout.
  const double budget_ms = 7 * 4.096e-3 * static_cast<double>(uint64_t{1} << qp_timeout);
  const auto grace = dp.value("retire_grace_ms", nlohmann::json());
  if (!grace.is_number_unsigned() || static_cast<double>(grace.get<uint64_t>()) < budget_ms)
    return "the box at " + target.url + " forgets a removed ring's connections after " +
           (grace.is_number() ? std::to_string(grace.get<int64_t>()) : std::string("?")) +
           " ms (rings.retire_grace_ms), sooner than this job's RC retransmission budget of " +
           std::to_string(static_cast<uint64_t>(budget_ms)) + " ms (7 x 4.096 us x 2^" +
           std::to_string(qp_timeout) + ", qp_timeout): raise it on the box";
  return {};
}

std::string rings_not_ready(const DaemonTarget& target, const std::vector<uint32_t>& ids,
                            int timeout_ms) {
  std::string why;
  auto cli = client(target, why);
  if (!cli) return why;
  const Deadline deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (uint32_t id : ids) {
    const HttpReply g = cli->call("GET", ring_path(id), "", remaining_ms(deadline));
    if (g.status != 200)
      return "the daemon at " + target.url + " does not list ring " + std::to_string(id) + " (" +
             describe_error(g) + ")";
    try {
      if (!nlohmann::json::parse(g.body).value("installed", false))
        return "ring " + std::to_string(id) + " is not installed in the box (daemon at " +
               target.url + ")";
    } catch (const std::exception& e) {
      return "the daemon at " + target.url + " sent an unreadable ring: " + e.what();
    }
  }
  return {};
}

// ---- OwnedRing ------------------------------------------------------------

OwnedRing::OwnedRing(DaemonTarget target, uint32_t ring_id, std::string credential,
                     uint32_t lease_ms, int timeout_ms, bool delete_at_release)
    : target_(std::move(target)),
      ring_id_(ring_id),
      credential_(std::move(credential)),
      lease_ms_(lease_ms),
      timeout_ms_(timeout_ms),
      delete_at_release_(delete_at_release) {
  if (lease_ms_ > 0) thread_ = std::thread([this] { renew_main(); });
}

OwnedRing::~OwnedRing() { (void)release(); }

std::string OwnedRing::released() const {
  std::lock_guard lk(mu_);
  return released_;
}

void OwnedRing::renew_main() {
  const auto period = std::chrono::milliseconds(std::max<uint32_t>(lease_ms_ / 3, 1));
  bool reported = false;
  bool failed = false;
  std::unique_ptr<HttpClient> cli;
  std::unique_lock lk(mu_);
  for (;;) {
    // After a failure (a busy daemon answers 503) try again within a second
    // rather than a third of the lease, so a brief refusal cannot expire it.
    const auto wait =
        failed ? std::min<std::chrono::milliseconds>(period, std::chrono::milliseconds(1000))
               : period;
    if (cv_.wait_for(lk, wait, [this] { return stop_; })) return;
    lk.unlock();
    std::string err;
    try {
      if (!cli) cli = client(target_, err);
      if (cli) {
        const HttpReply res = cli->call("PUT", ring_path(ring_id_) + "/lease", "", timeout_ms_,
                                        credential_header(credential_));
        if (res.status == 200)
          ++renewals_;
        else
          err = describe_error(res);
      }
    } catch (const std::exception& e) {
      err = e.what();
    }
    failed = !err.empty();
    if (!err.empty() && !reported) {
      // Once: a daemon that is away would otherwise fill the job's log. The
      // collectives go on; the ring goes when its lease runs out.
      std::fprintf(stderr,
                   "netreduce: renewing the lease of ring %u at %s failed: %s (further failures "
                   "are not reported; the daemon removes the ring %u ms after the last renewal)\n",
                   ring_id_, target_.url.c_str(), err.c_str(), lease_ms_);
      reported = true;
    }
    lk.lock();
  }
}

std::string OwnedRing::release(bool rollback) {
  {
    std::lock_guard lk(mu_);
    if (stop_) return released_;
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::string outcome;
  if (!delete_at_release_ && !rollback) {
    std::lock_guard lk(mu_);
    released_ = "kept";
    return released_;
  }
  try {
    std::string why;
    auto cli = client(target_, why);
    const std::string e = cli ? delete_owned(*cli, ring_id_, credential_, timeout_ms_) : why;
    outcome = e.empty() ? "deleted" : "not deleted: " + e;
  } catch (const std::exception& ex) {
    outcome = std::string("not deleted: ") + ex.what();
  }
  if (outcome != "deleted")
    std::fprintf(stderr, "netreduce: deleting ring %u at %s: %s\n", ring_id_, target_.url.c_str(),
                 outcome.c_str());
  std::lock_guard lk(mu_);
  released_ = outcome;
  return outcome;
}

}  // namespace netreduce::host
