// netreducectl: the operator's CLI for netreduced. Subcommands mirror the API:
//
//   netreducectl [--server URL] [--token-file F] [--json] ring add --id 7 --members a,b,c ...
//   netreducectl ring add --file ring.json | ring ls | ring show ID | ring rm ID
//   netreducectl status | stats
//   netreducectl fault set --ring 7|all --kind drop --fraction 0.5 --duration-ms 10000
//   netreducectl fault clear [--ring 7] | fault ls
//
// Human-readable tables by default; --json prints the API's JSON as is.
// `ring add` prints the new ring's credential (the daemon tells it once);
// `--credential` presents it (X-Netreduce-Ring-Credential): a re-add of the
// same spec is then idempotent, and `ring rm` acts as the ring's owner. Without
// it `ring rm` relies on the operator token, which may delete any ring.
// The server defaults to $NETREDUCE_DAEMON or http://127.0.0.1:7470; the token
// (needed by ring add/rm) comes from --token-file, $NETREDUCE_TOKEN_FILE or
// $NETREDUCE_TOKEN.
//
// Exit status (scripts can rely on it):
//   0  done
//   1  the daemon answered with an error (HTTP 4xx/5xx; the error is printed)
//   2  usage error (bad flags or arguments, unreadable --file or token file)
//   3  cannot reach the daemon (connection refused, timeout)
#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "common/http_client.h"
#include "common/ring_json.h"

using netreduce::HttpClient;
using netreduce::HttpReply;
using nlohmann::json;

namespace {

enum Exit { kOk = 0, kApiError = 1, kUsage = 2, kNoConnection = 3 };

struct Options {
  std::string server;
  std::string token_file;
  bool json_out = false;
  int timeout_s = 10;
};

[[noreturn]] void usage_error(const std::string& msg) {
  std::cerr << "netreducectl: " << msg << "\n";
  std::exit(kUsage);
}

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : fallback;
}

std::string read_file(const std::string& path, const char* what) {
  std::ifstream in(path);
  if (!in) usage_error(std::string("cannot read ") + what + " " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string token(const Options& o) {
  std::string t;
  if (!o.token_file.empty()) {
    t = read_file(o.token_file, "token file");
  } else if (const char* env = std::getenv("NETREDUCE_TOKEN"); env && *env) {
    t = env;
  }
  const auto ws = " \t\r\n";
  t.erase(t.find_last_not_of(ws) + 1);
  t.erase(0, t.find_first_not_of(ws));
  return t;
}

// One API call. Returns the parsed body (null for 204); exits 3 when the
// daemon cannot be reached and 1 on an HTTP error (printing it).
json call(const Options& o, const std::string& method, const std::string& path,
          const std::string& body = "", bool auth = false, const std::string& credential = "") {
  static const std::regex kUrl(R"(^http://[A-Za-z0-9.\-\[\]:]+(:[0-9]{1,5})?/?$)");
  if (!std::regex_match(o.server, kUrl))
    usage_error("bad --server '" + o.server + "' (expected http://host:port)");
  std::string why;
  auto cli = HttpClient::make(o.server, why);
  if (!cli) usage_error("bad --server '" + o.server + "' (expected http://host:port)");
  if (auth) cli->set_bearer(token(o));
  std::vector<std::string> headers;
  if (!credential.empty()) headers.push_back("X-Netreduce-Ring-Credential: " + credential);
  const HttpReply r = cli->call(method, path, body, o.timeout_s * 1000, headers);
  if (!r.ok()) {
    std::cerr << "netreducectl: cannot reach netreduced at " << o.server << ": " << r.error << "\n";
    std::exit(kNoConnection);
  }
  json j;
  if (!r.body.empty()) {
    try {
      j = json::parse(r.body);
    } catch (const std::exception&) {
      j = r.body;
    }
  }
  if (r.status >= 400) {
    if (o.json_out) {
      std::cout << j.dump(2) << "\n";
    } else if (j.is_object() && j.contains("error") && j["error"].is_object()) {
      const json& e = j["error"];
      std::cerr << "error (HTTP " << r.status << ", " << e.value("code", "")
                << "): " << (e.value("field", "").empty() ? "" : e.value("field", "") + ": ")
                << e.value("message", "") << "\n";
    } else {
      std::cerr << "error: HTTP " << r.status << "\n";
    }
    std::exit(kApiError);
  }
  return j;
}

// A plain text table: the header row, then the rows, columns padded.
void table(const std::vector<std::string>& head,
           const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> w(head.size());
  for (size_t c = 0; c < head.size(); ++c) w[c] = head[c].size();
  for (const auto& r : rows)
    for (size_t c = 0; c < r.size() && c < w.size(); ++c) w[c] = std::max(w[c], r[c].size());
  auto line = [&](const std::vector<std::string>& r) {
    std::string s;
    for (size_t c = 0; c < head.size(); ++c) {
      const std::string cell = c < r.size() ? r[c] : "";
      s += cell;
      if (c + 1 < head.size()) s += std::string(w[c] - cell.size() + 2, ' ');
    }
    std::cout << s << "\n";
  };
  line(head);
  for (const auto& r : rows) line(r);
}

std::string str(const json& v) {
  if (v.is_null()) return "-";
  if (v.is_string()) return v.get<std::string>();
  if (v.is_boolean()) return v.get<bool>() ? "yes" : "no";
  if (v.is_array()) {
    std::string s;
    for (const auto& x : v) s += (s.empty() ? "" : ",") + str(x);
    return s.empty() ? "all" : s;
  }
  if (v.is_number_float()) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.3f", v.get<double>());
    return buf;
  }
  return v.dump();
}

std::string field(const json& j, const char* k) { return j.contains(k) ? str(j[k]) : "-"; }

std::vector<std::string> ring_row(const json& r) {
  return {field(r, "id"),       std::to_string(r.value("members", json::array()).size()),
          field(r, "members"),  field(r, "msg_len"),
          field(r, "window"),   field(r, "payload_bytes"),
          field(r, "dtypes"),   field(r, "ops"),
          field(r, "installed")};
}
const std::vector<std::string> kRingHead = {"ID",      "RANKS",  "MEMBERS", "MSG_LEN",  "WINDOW",
                                            "PAYLOAD", "DTYPES", "OPS",     "INSTALLED"};

// A tree node in one line: its children in reduction order, then its parent.
std::string tree_line(const json& t) {
  if (!t.is_object()) return "plain ring (no tree)";
  std::string out = "children";
  const char* sep = " ";
  for (const json& c : t.value("children", json::array())) {
    for (const auto& [k, v] : c.items()) out += sep + k + " " + str(v);
    sep = ", ";
  }
  if (t.contains("parent"))
    out += "; parent " + field(t["parent"], "ip") + " (port " + field(t["parent"], "port") +
           ", child " + field(t, "index_at_parent") + " there)";
  else
    out += "; root";
  return out;
}

// A fabric ring: this box's node and, at the origin, what every other box reported.
void print_fabric(const json& f) {
  std::cout << "\n";
  table(
      {"FABRIC", "VALUE"},
      {{"box", field(f, "box")},
       {"origin", field(f, "origin")},
       {"entry", field(f, "entry")},
       {"this box", f.value("local", true) ? tree_line(f.value("tree", json())) : "no part"},
       {"in etcd", f.contains("published") ? (f.value("published", false) ? "yes" : "NO") : "-"}});
  if (!f.contains("peers")) return;
  std::vector<std::vector<std::string>> rows;
  for (const json& p : f["peers"])
    rows.push_back({field(p, "box"), p.value("installed", false) ? "yes" : "NO",
                    tree_line(p.value("tree", json())), p.value("error", std::string())});
  std::cout << "\n";
  table({"BOX", "INSTALLED", "NODE", "ERROR"}, rows);
}

// Active faults (GET /v1/faults, and the answers of fault set / clear).
void print_faults(const json& faults) {
  std::vector<std::vector<std::string>> rows;
  for (const json& f : faults)
    rows.push_back({field(f, "ring"), field(f, "kind"), field(f, "fraction"),
                    field(f, "remaining_ms"), field(f, "packets")});
  table({"RING", "KIND", "FRACTION", "REMAINING_MS", "PACKETS"}, rows);
}

// --ring: a ring id or "all"; anything else is a usage error.
json ring_or_all(const std::string& s, const char* cmd) {
  if (s == "all") return "all";
  if (!s.empty() && s.size() <= 10 && s.find_first_not_of("0123456789") == std::string::npos &&
      std::stoull(s) <= 0xFFFFFFFFull)
    return std::stoull(s);
  usage_error(std::string(cmd) + ": --ring must be a ring id or \"all\", got '" + s + "'");
}

void print_ring(const json& r) {
  table(kRingHead, {ring_row(r)});
  if (r.contains("fabric")) print_fabric(r["fabric"]);
  if (!r.contains("counters")) return;
  std::cout << "\n";
  const json& c = r["counters"];
  std::vector<std::vector<std::string>> rows;
  for (const char* k : {"packets_aggregated", "bytes_aggregated", "cells_completed",
                        "messages_completed", "retransmissions_served", "connections_rebound"})
    rows.push_back({k, field(c, k)});
  for (const char* k :
       {"held_packets", "held_bytes", "open_cells", "stalled_cells", "memory_bytes", "worker"})
    rows.push_back({k, field(r, k)});
  const json c_drops = c.value("drops", json::object());
  for (const auto& [k, v] : c_drops.items())
    if (v.is_number() && v.get<double>() != 0) rows.push_back({"drop " + k, str(v)});
  const json tree = c.value("tree", json::object());
  for (const auto& [k, v] : tree.items()) rows.push_back({"tree " + k, str(v)});
  table({"COUNTER", "VALUE"}, rows);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "netreducectl: configure and inspect a netreduce box through netreduced\n"
      "exit status: 0 ok, 1 API error (HTTP 4xx/5xx), 2 usage, 3 cannot reach the daemon"};
  app.require_subcommand(1);
  Options o;
  o.server = env_or("NETREDUCE_DAEMON", "http://127.0.0.1:7470");
  o.token_file = env_or("NETREDUCE_TOKEN_FILE", "");
  app.add_option("--server", o.server, "daemon URL (env NETREDUCE_DAEMON)")->capture_default_str();
  app.add_option("--token-file", o.token_file,
                 "file holding the bearer token (env NETREDUCE_TOKEN_FILE, or NETREDUCE_TOKEN)");
  app.add_flag("--json", o.json_out, "print the API's JSON instead of tables");
  app.add_option("--timeout", o.timeout_s, "seconds the whole call to the daemon may take")
      ->check(CLI::Range(1, 3600));

  CLI::App* ring = app.add_subcommand("ring", "rings: add, ls, show, rm");
  ring->require_subcommand(1);
  CLI::App* add = ring->add_subcommand("add", "create a ring (idempotent for an identical spec)");
  std::string file;
  uint32_t id = 0;
  std::vector<std::string> members, member_lists, dtypes, ops;
  unsigned msg_len = 0, window = 0, payload = 0;
  uint64_t memory_quota = 0;
  uint32_t lease_ms = 0;
  std::string credential;
  add->add_option("--file", file, "ring JSON file (the API's ring object)");
  add->add_option("--id", id, "ring id");
  add->add_option("--member", members, "member address, rank order (repeat)");
  add->add_option("--members", member_lists, "member addresses, rank order, comma-separated")
      ->delimiter(',');
  add->add_option("--msg-len", msg_len, "packets per message");
  add->add_option("--window", window, "host window N (messages)");
  add->add_option("--payload", payload, "payload bytes per packet (RoCE MTU: 256..4096)");
  add->add_option("--dtype", dtypes, "allowed dtype (repeat or comma-separated; default all)")
      ->delimiter(',');
  add->add_option("--op", ops, "allowed op (repeat or comma-separated; default all)")
      ->delimiter(',');
  add->add_option("--memory-quota", memory_quota, "bytes the ring may hold (0: no per-ring quota)");
  add->add_option("--lease-ms", lease_ms,
                  "remove the ring unless renewed within this many ms (default: no lease)");
  add->add_option("--credential", credential,
                  "the ring's credential: re-adding the same spec is then idempotent");
  uint32_t show_id = 0, rm_id = 0;
  CLI::App* ls = ring->add_subcommand("ls", "list rings");
  CLI::App* show = ring->add_subcommand("show", "one ring with its live counters");
  show->add_option("id", show_id, "ring id")->required();
  CLI::App* rm = ring->add_subcommand("rm", "delete a ring");
  rm->add_option("id", rm_id, "ring id")->required();
  rm->add_option("--credential", credential,
                 "act as the ring's owner (needed with a job token; checked if given)");
  CLI::App* fault = app.add_subcommand(
      "fault", "injected faults for rehearsals (data plane faults.enabled): set, clear, ls");
  fault->require_subcommand(1);
  CLI::App* fset = fault->add_subcommand(
      "set", "drop, duplicate, reorder or bypass a fraction of a ring's packets for a while");
  std::string fault_ring, fault_kind;
  double fraction = 1.0;
  uint32_t duration_ms = 0;
  fset->add_option("--ring", fault_ring, "ring id, or all (every installed ring)")->required();
  fset->add_option("--kind", fault_kind, "drop, duplicate, reorder or bypass")
      ->required()
      ->check(CLI::IsMember({"drop", "duplicate", "reorder", "bypass"}));
  fset->add_option("--fraction", fraction, "share of the ring's packets, 0..1 (default 1)")
      ->check(CLI::Range(0.0, 1.0));
  fset->add_option("--duration-ms", duration_ms,
                   "how long the fault lasts (required; at most faults.max_duration_ms)")
      ->required();
  CLI::App* fclear = fault->add_subcommand("clear", "end injected faults now (default: all)");
  fclear->add_option("--ring", fault_ring, "only this ring's fault");
  CLI::App* fls = fault->add_subcommand("ls", "active faults: remaining time, packets faulted");
  CLI::App* status = app.add_subcommand("status", "daemon and data plane status");
  CLI::App* stats = app.add_subcommand("stats", "data plane counters: ports, lcores, rings, drops");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? kOk : kUsage;
  }

  if (add->parsed()) {
    json spec;
    if (!file.empty()) {
      if (add->count("--id") || !members.empty() || !member_lists.empty())
        usage_error("ring add: give either --file or the ring flags, not both");
      try {
        spec = json::parse(read_file(file, "ring file"));
      } catch (const json::exception& e) {
        usage_error(file + ": not JSON: " + e.what());
      }
    } else {
      for (const char* req : {"--id", "--msg-len", "--window", "--payload"})
        if (!add->count(req))
          usage_error(std::string("ring add: ") + req + " is required (or --file)");
      members.insert(members.end(), member_lists.begin(), member_lists.end());
      if (members.empty()) usage_error("ring add: --member or --members is required (or --file)");
      spec = {{"id", id},
              {"members", members},
              {"msg_len", msg_len},
              {"window", window},
              {"payload_bytes", payload}};
      if (!dtypes.empty()) spec["dtypes"] = dtypes;
      if (!ops.empty()) spec["ops"] = ops;
      if (memory_quota) spec["memory_quota"] = memory_quota;
    }
    if (add->count("--lease-ms")) {
      if (!spec.is_object()) usage_error(file + ": the ring must be a JSON object");
      spec["lease_ms"] = lease_ms;
    }
    const json r = call(o, "POST", "/v1/rings", spec.dump(), true, credential);
    if (o.json_out) {
      std::cout << r.dump(2) << "\n";
    } else {
      const json ring = r.value("ring", json::object());
      table(kRingHead, {ring_row(ring)});
      if (ring.contains("credential"))
        std::cout << "credential " << str(ring["credential"]) << "\n";
    }
    return kOk;
  }
  if (ls->parsed()) {
    const json r = call(o, "GET", "/v1/rings");
    if (o.json_out) {
      std::cout << r.dump(2) << "\n";
    } else {
      std::vector<std::vector<std::string>> rows;
      for (const json& x : r.value("rings", json::array())) rows.push_back(ring_row(x));
      table(kRingHead, rows);
    }
    return kOk;
  }
  if (show->parsed()) {
    const json r = call(o, "GET", "/v1/rings/" + std::to_string(show_id));
    if (o.json_out) {
      std::cout << r.dump(2) << "\n";
    } else {
      print_ring(r);
    }
    return kOk;
  }
  if (rm->parsed()) {
    call(o, "DELETE", "/v1/rings/" + std::to_string(rm_id), "", true, credential);
    if (o.json_out) {
      std::cout << json{{"deleted", rm_id}}.dump(2) << "\n";
    } else {
      std::cout << "ring " << rm_id << " deleted\n";
    }
    return kOk;
  }
  if (fset->parsed()) {
    const json body = {{"ring", ring_or_all(fault_ring, "fault set")},
                       {"kind", fault_kind},
                       {"fraction", fraction},
                       {"duration_ms", duration_ms}};
    const json r = call(o, "POST", "/v1/faults", body.dump(), true);
    if (o.json_out) {
      std::cout << r.dump(2) << "\n";
    } else {
      print_faults(r.value("faults", json::array()));
    }
    return kOk;
  }
  if (fclear->parsed()) {
    std::string path = "/v1/faults";
    if (!fault_ring.empty() && fault_ring != "all") {
      const json id = ring_or_all(fault_ring, "fault clear");
      path += "/" + std::to_string(id.get<uint64_t>());
    }
    const json r = call(o, "DELETE", path, "", true);
    if (o.json_out) {
      std::cout << r.dump(2) << "\n";
    } else {
      std::cout << field(r, "cleared") << " fault(s) cleared\n";
    }
    return kOk;
  }
  if (fls->parsed()) {
    const json r = call(o, "GET", "/v1/faults");
    if (o.json_out) {
      std::cout << r.dump(2) << "\n";
    } else {
      if (!r.value("enabled", false))
        std::cout << "fault injection is off at the data plane (faults.enabled)\n";
      print_faults(r.value("faults", json::array()));
    }
    return kOk;
  }
  if (status->parsed()) {
    const json r = call(o, "GET", "/v1/status");
    if (o.json_out) {
      std::cout << r.dump(2) << "\n";
      return kOk;
    }
    const json dp = r.value("dataplane", json::object());
    const json q = r.value("quotas", json::object());
    table({"ITEM", "VALUE"},
          {{"daemon version", field(r, "version")},
           {"rings configured", field(r, "rings") + " (max " + field(q, "max_rings") + ")"},
           {"ring memory (worst case)",
            field(q, "memory_in_use_bytes") + " of " + field(q, "max_memory_bytes")},
           {"data plane",
            dp.value("connected", false) ? "connected" : "DOWN (" + field(dp, "error") + ")"},
           {"data plane mode", field(dp, "mode")},
           {"engine memory in use", field(dp.value("memory", json::object()), "in_use_bytes")},
           {"engine memory free", field(dp.value("memory", json::object()), "free_bytes")},
           {"mbufs in use", field(dp.value("mbufs", json::object()), "in_use") + " of " +
                                field(dp.value("mbufs", json::object()), "total")}});
    std::vector<std::vector<std::string>> ports;
    for (const json& p : dp.value("ports", json::array()))
      ports.push_back({field(p, "name"), field(p, "link_up"), field(p, "speed_mbps"),
                       field(p, "rx_packets"), field(p, "tx_packets")});
    if (!ports.empty()) {
      std::cout << "\n";
      table({"PORT", "LINK", "MBPS", "RX_PACKETS", "TX_PACKETS"}, ports);
    }
    std::vector<std::vector<std::string>> lcores;
    for (const json& w : dp.value("workers", json::array()))
      lcores.push_back({field(w, "worker"), field(w, "lcore")});
    if (!lcores.empty()) {
      std::cout << "\n";
      table({"WORKER", "LCORE"}, lcores);
    }
    return kOk;
  }
  if (stats->parsed()) {
    const json r = call(o, "GET", "/v1/stats");
    if (o.json_out) {
      std::cout << r.dump(2) << "\n";
      return kOk;
    }
    std::vector<std::vector<std::string>> rows;
    for (const json& p : r.value("ports", json::array()))
      rows.push_back({field(p, "name"), field(p, "rx_packets"), field(p, "tx_packets"),
                      field(p, "rx_bytes"), field(p, "tx_bytes"), field(p, "rx_missed"),
                      field(p, "box_rx_packets"), field(p, "box_tx_packets")});
    table({"PORT", "RX_PACKETS", "TX_PACKETS", "RX_BYTES", "TX_BYTES", "RX_MISSED", "BOX_RX",
           "BOX_TX"},
          rows);
    rows.clear();
    for (const json& w : r.value("workers", json::array()))
      rows.push_back({field(w, "lcore"), field(w, "busy_ratio"), field(w, "rings"),
                      field(w, "memory_bytes"), field(w, "dispatched")});
    std::cout << "\n";
    table({"LCORE", "BUSY", "RINGS", "MEMORY_BYTES", "DISPATCHED"}, rows);
    rows.clear();
    for (const json& x : r.value("rings", json::array())) {
      const json c = x.value("counters", json::object());
      uint64_t drops = 0;
      const json c_drops = c.value("drops", json::object());
      for (const auto& [k, v] : c_drops.items())
        if (v.is_number_unsigned()) drops += v.get<uint64_t>();
      rows.push_back({field(x.value("spec", json::object()), "id"), field(c, "packets_aggregated"),
                      field(c, "bytes_aggregated"), field(c, "messages_completed"),
                      field(c, "retransmissions_served"), std::to_string(drops)});
    }
    std::cout << "\n";
    table({"RING", "PACKETS", "BYTES", "MESSAGES", "RETRANSMISSIONS", "DROPS"}, rows);
    rows.clear();
    const json r_reasons = r.value("reasons", json::object());
    for (const auto& [k, v] : r_reasons.items())
      if (v.is_number() && v.get<double>() != 0) rows.push_back({k, str(v)});
    // The data plane's own (dataplane/reasons.h): full queues, injected faults.
    const json dp_reasons = r.value("dataplane_reasons", json::object());
    for (const auto& [k, v] : dp_reasons.items())
      if (v.is_number() && v.get<double>() != 0) rows.push_back({k, str(v)});
    std::cout << "\n";
    table({"REASON", "PACKETS"}, rows);
    return kOk;
  }
  return kUsage;
}
