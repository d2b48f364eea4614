// netreduce-dataplane configuration loader: YAML text -> DataplaneConfig.
//
// yaml-cpp builds the node tree; everything after that is done by hand on
// scalar text, never through yaml-cpp's as<T>(), so that every value is
// checked the same strict way (decimal integers only, no silent wrap-around)
// and every message names the dotted key at fault. The walk follows the
// schema and never recurses into arbitrary nodes, so aliases that make the
// tree cyclic (`a: &x [*x]`) cannot make it loop.
//
// Errors inside the walk are thrown as ConfigError and turned into a Status
// at the top; nothing (yaml-cpp's exceptions, bad_alloc, ...) escapes
// parse_config or load_config.
#include "dataplane/config.h"

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <exception>
#include <initializer_list>
#include <memory>
#include <sstream>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

namespace netreduce::dataplane {
namespace {

// Largest config file load_config reads: a guard against pointing it at a
// device or a huge file by mistake.
constexpr size_t kMaxFileBytes = 1u << 20;
// sockaddr_un::sun_path holds 108 bytes including the terminating NUL.
constexpr size_t kMaxSocketPath = 107;

struct ConfigError {
  std::string field;
  std::string message;
};

[[noreturn]] void fail(std::string field, std::string message) {
  throw ConfigError{std::move(field), std::move(message)};
}

// Input text as shown in a message or a field name: control characters
// replaced, long values cut, so that a message stays one readable line
// whatever the input.
std::string clean(std::string_view s) {
  constexpr size_t kMax = 40;
  std::string out;
  for (size_t i = 0; i < s.size() && i < kMax; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    out += (c < 0x20 || c == 0x7f) ? '?' : static_cast<char>(c);
  }
  if (s.size() > kMax) out += "...";
  return out;
}

std::string show(std::string_view s) { return "'" + clean(s) + "'"; }

// What a node is, for "must be X, got Y" messages.
std::string describe(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Scalar:
      return show(n.Scalar());
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Map:
      return "a mapping";
    case YAML::NodeType::Null:
      return "nothing (null)";
    case YAML::NodeType::Undefined:
      break;
  }
  return "nothing";
}

std::string join(std::initializer_list<std::string_view> names) {
  std::string out;
  for (const auto name : names) {
    if (!out.empty()) out += ", ";
    out += name;
  }
  return out;
}

// Levenshtein distance, for "did you mean" on unknown keys (short strings).
size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

std::string child(const std::string& parent, std::string_view key) {
  return parent.empty() ? std::string(key) : parent + "." + std::string(key);
}

// Iterates a mapping node in document order: checks every key is a known,
// plain, non-repeated name and calls handle(key, value, dotted_key). A null
// section (`memory:` with every line commented out) is an empty mapping.
template <typename Handler>
void for_each_key(const YAML::Node& map, const std::string& path,
                  std::initializer_list<std::string_view> known, Handler&& handle) {
  if (map.IsNull()) return;
  if (!map.IsMap()) {
    fail(path, "must be a mapping (key: value lines) with keys " + join(known) + ", got " +
                   describe(map));
  }
  std::vector<std::string> seen;
  for (auto it = map.begin(); it != map.end(); ++it) {
    const YAML::Node key = it->first;
    if (!key.IsScalar()) {
      fail(path, "keys must be plain names, got " + describe(key) + " as a key");
    }
    const std::string& name = key.Scalar();
    const std::string field = child(path, clean(name));
    std::string_view match;
    for (const auto k : known) {
      if (k == name) match = k;
    }
    if (match.empty()) {
      std::string msg = "unknown key (known: " + join(known) + ")";
      std::string_view best;
      size_t best_d = 3;  // suggest only close matches
      for (const auto k : known) {
        const size_t d = edit_distance(name, k);
        if (d < best_d) best_d = d, best = k;
      }
      if (!best.empty()) msg += "; did you mean '" + std::string(best) + "'?";
      fail(field, msg);
    }
    for (const auto& s : seen) {
      if (s == name) fail(field, "key given twice");
    }
    seen.push_back(name);
    handle(match, it->second, field);
  }
}

// The text of a scalar value; `what` describes the expected value.
const std::string& scalar(const YAML::Node& n, const std::string& field, std::string_view what) {
  if (!n.IsScalar()) fail(field, "must be " + std::string(what) + ", got " + describe(n));
  return n.Scalar();
}

// An integer in [lo, hi]. Decimal only, optional sign: YAML's 0x/0o forms
// and floats are refused rather than guessed at.
uint64_t integer(const YAML::Node& n, const std::string& field, int64_t lo, int64_t hi) {
  const std::string range = std::to_string(lo) + ".." + std::to_string(hi);
  const std::string& s = scalar(n, field, "an integer in " + range);
  std::string_view digits = s;
  if (!digits.empty() && digits[0] == '+') digits.remove_prefix(1);
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v);
  const bool all_digits = !digits.empty() && end == digits.data() + digits.size();
  if (ec == std::errc::result_out_of_range && all_digits) {
    fail(field, "must be in " + range + ", got " + show(s));
  }
  if (ec != std::errc() || !all_digits || (digits.size() != s.size() && digits[0] == '-')) {
    fail(field, "must be an integer, got " + show(s));
  }
  if (v < lo || v > hi) fail(field, "must be in " + range + ", got " + std::to_string(v));
  return static_cast<uint64_t>(v);
}

uint16_t power_of_two(const YAML::Node& n, const std::string& field, int64_t lo, int64_t hi) {
  const uint64_t v = integer(n, field, lo, hi);
  if ((v & (v - 1)) != 0) {
    fail(field, "must be a power of two in " + std::to_string(lo) + ".." + std::to_string(hi) +
                    ", got " + std::to_string(v));
  }
  return static_cast<uint16_t>(v);
}

bool boolean(const YAML::Node& n, const std::string& field) {
  const std::string& s = scalar(n, field, "true or false");
  if (s == "true" || s == "True" || s == "TRUE") return true;
  if (s == "false" || s == "False" || s == "FALSE") return false;
  fail(field, "must be true or false, got " + show(s));
}

// A string for argv or a path: may not contain NUL (it would be cut there).
std::string text(const YAML::Node& n, const std::string& field, std::string_view what) {
  const std::string& s = scalar(n, field, what);
  if (s.find('\0') != std::string::npos) fail(field, "must not contain a NUL character");
  return s;
}

std::string non_empty(const YAML::Node& n, const std::string& field, std::string_view what) {
  std::string s = text(n, field, what);
  if (s.empty()) fail(field, "must be " + std::string(what) + ", got an empty string");
  return s;
}

// Bytes: an integer, optionally followed by K/KiB, M/MiB or G/GiB (powers of
// 1024, optionally after a space). Greater than 0.
uint64_t size_bytes(const YAML::Node& n, const std::string& field) {
  constexpr std::string_view kForm =
      "a size in bytes: an integer, optionally followed by KiB, MiB or GiB (e.g. 256MiB)";
  const std::string& s = scalar(n, field, kForm);
  const std::string_view sv = s;
  size_t i = 0;
  while (i < sv.size() && sv[i] >= '0' && sv[i] <= '9') ++i;
  if (i == 0) {
    if (!sv.empty() && sv[0] == '-') fail(field, "must be greater than 0, got " + show(s));
    fail(field, "must be " + std::string(kForm) + ", got " + show(s));
  }
  uint64_t v = 0;
  const auto [end, ec] = std::from_chars(sv.data(), sv.data() + i, v);
  if (ec != std::errc() || end != sv.data() + i) fail(field, "too large, got " + show(s));
  std::string_view suffix = sv.substr(i);
  if (!suffix.empty() && suffix[0] == ' ') suffix.remove_prefix(1);
  unsigned shift = 0;
  if (suffix.empty() && i == sv.size()) {
    shift = 0;
  } else if (suffix == "K" || suffix == "KiB") {
    shift = 10;
  } else if (suffix == "M" || suffix == "MiB") {
    shift = 20;
  } else if (suffix == "G" || suffix == "GiB") {
    shift = 30;
  } else {
    fail(field, "unknown size suffix " + show(suffix) + " in " + show(s) +
                    " (use K/KiB, M/MiB or G/GiB, all powers of 1024, or a plain number of bytes)");
  }
  if (v == 0) fail(field, "must be greater than 0, got " + show(s));
  if (shift != 0 && v > (UINT64_MAX >> shift)) fail(field, "too large, got " + show(s));
  return v << shift;
}

std::string indexed(const std::string& field, size_t i) {
  return field + "[" + std::to_string(i) + "]";
}

void parse_eal(const YAML::Node& n, const std::string& field, DataplaneConfig& cfg) {
  if (n.IsNull()) return;
  if (!n.IsSequence()) {
    fail(field, "must be a list of EAL arguments (e.g. [\"-l\", \"0-1\"]), got " + describe(n));
  }
  for (size_t i = 0; i < n.size(); ++i) {
    cfg.eal_args.push_back(text(n[i], indexed(field, i), "a string (one EAL argument)"));
  }
}

void parse_ports(const YAML::Node& n, const std::string& field, DataplaneConfig& cfg) {
  if (!n.IsSequence()) {
    fail(field, "must be a list of exactly 2 ports (- name: <device>), got " + describe(n));
  }
  if (n.size() != 2) {
    fail(field, "must list exactly 2 ports (the box is a bump in the wire between A and B), got " +
                    std::to_string(n.size()));
  }
  for (size_t i = 0; i < n.size(); ++i) {
    const std::string port_field = indexed(field, i);
    const YAML::Node port = n[i];
    if (!port.IsMap()) {
      fail(port_field,
           "must be a mapping with 'name' (e.g. '- name: net_ring0'), got " + describe(port));
    }
    PortConfig pc;
    bool has_name = false;
    for_each_key(port, port_field, {"name"},
                 [&](std::string_view, const YAML::Node& v, const std::string& f) {
                   pc.name = non_empty(v, f, "a DPDK device name (PCI address or vdev name)");
                   has_name = true;
                 });
    if (!has_name) fail(child(port_field, "name"), "required key missing");
    for (size_t j = 0; j < cfg.ports.size(); ++j) {
      if (cfg.ports[j].name == pc.name) {
        fail(child(port_field, "name"),
             "same device as " + indexed(field, j) + ": " + show(pc.name));
      }
    }
    cfg.ports.push_back(std::move(pc));
  }
}

void parse_workers(const YAML::Node& n, const std::string& field, DataplaneConfig& cfg) {
  if (n.IsNull()) return;
  if (!n.IsSequence()) fail(field, "must be a list of lcore ids (e.g. [1, 2]), got " + describe(n));
  for (size_t i = 0; i < n.size(); ++i) {
    const std::string f = indexed(field, i);
    const auto lcore = static_cast<unsigned>(integer(n[i], f, 0, 1023));
    for (size_t j = 0; j < cfg.workers.size(); ++j) {
      if (cfg.workers[j] == lcore) {
        fail(f, "duplicate lcore " + std::to_string(lcore) + " (also " + indexed(field, j) + ")");
      }
    }
    cfg.workers.push_back(lcore);
  }
}

void parse_memory(const YAML::Node& n, const std::string& path, DataplaneConfig& cfg) {
  for_each_key(n, path, {"mbufs", "mbuf_cache", "engine"},
               [&](std::string_view key, const YAML::Node& v, const std::string& f) {
                 if (key == "mbufs") {
                   cfg.mbufs = static_cast<uint32_t>(integer(v, f, 1024, UINT32_MAX));
                 } else if (key == "mbuf_cache") {
                   cfg.mbuf_cache = static_cast<uint32_t>(integer(v, f, 0, 512));
                 } else {
                   cfg.engine_memory = size_bytes(v, f);
                 }
               });
  // Only a given cache can break this: the default (256) fits the smallest
  // pool (1024).
  if (cfg.mbuf_cache > cfg.mbufs / 4) {
    fail(child(path, "mbuf_cache"), "must be at most memory.mbufs / 4 (" +
                                        std::to_string(cfg.mbufs / 4) + "), got " +
                                        std::to_string(cfg.mbuf_cache));
  }
}

void parse_engine(const YAML::Node& n, const std::string& path, DataplaneConfig& cfg) {
  for_each_key(
      n, path,
      {"reduce_mode", "icrc_fixup", "verify_icrc", "max_rings", "clt_capacity", "stall_timeout_ms"},
      [&](std::string_view key, const YAML::Node& v, const std::string& f) {
        if (key == "reduce_mode") {
          const std::string& s = scalar(v, f, "deterministic or accumulate");
          if (s == "deterministic") {
            cfg.reduce_mode = engine::ReduceMode::deterministic;
          } else if (s == "accumulate") {
            cfg.reduce_mode = engine::ReduceMode::accumulate;
          } else {
            fail(f, "must be deterministic or accumulate, got " + show(s));
          }
        } else if (key == "icrc_fixup") {
          const std::string& s = scalar(v, f, "linear or full");
          if (s == "linear") {
            cfg.icrc_fixup = engine::IcrcFixup::linear;
          } else if (s == "full") {
            cfg.icrc_fixup = engine::IcrcFixup::full;
          } else {
            fail(f, "must be linear or full, got " + show(s));
          }
        } else if (key == "verify_icrc") {
          cfg.verify_icrc = boolean(v, f);
        } else if (key == "max_rings") {
          cfg.max_rings = static_cast<unsigned>(integer(v, f, 1, 1024));
        } else if (key == "clt_capacity") {
          cfg.clt_capacity = static_cast<unsigned>(integer(v, f, 16, 1048576));
        } else {
          cfg.stall_timeout_ms = static_cast<uint32_t>(integer(v, f, 1, 3600000));
        }
      });
}

void parse_control(const YAML::Node& n, const std::string& path, DataplaneConfig& cfg) {
  for_each_key(n, path, {"socket"},
               [&](std::string_view, const YAML::Node& v, const std::string& f) {
                 std::string s = non_empty(v, f, "an absolute path");
                 if (s[0] != '/') fail(f, "must be an absolute path, got " + show(s));
                 if (s.size() > kMaxSocketPath) {
                   fail(f, "must be at most " + std::to_string(kMaxSocketPath) +
                               " bytes long (the limit of a Unix socket path), got " +
                               std::to_string(s.size()));
                 }
                 cfg.control_socket = std::move(s);
               });
}

void parse_top(const YAML::Node& root, DataplaneConfig& cfg) {
  bool has_ports = false;
  for_each_key(root, "",
               {"eal", "ports", "mtu", "rx_desc", "tx_desc", "burst", "mode", "workers", "memory",
                "engine", "control"},
               [&](std::string_view key, const YAML::Node& v, const std::string& f) {
                 if (key == "eal") {
                   parse_eal(v, f, cfg);
                 } else if (key == "ports") {
                   parse_ports(v, f, cfg);
                   has_ports = true;
                 } else if (key == "mtu") {
                   cfg.mtu = static_cast<uint16_t>(integer(v, f, 1500, 9600));
                 } else if (key == "rx_desc") {
                   cfg.rx_desc = power_of_two(v, f, 64, 16384);
                 } else if (key == "tx_desc") {
                   cfg.tx_desc = power_of_two(v, f, 64, 16384);
                 } else if (key == "burst") {
                   cfg.burst = static_cast<uint16_t>(integer(v, f, 1, 256));
                 } else if (key == "mode") {
                   const std::string& s = scalar(v, f, "aggregate or forward");
                   if (s == "aggregate") {
                     cfg.mode = Mode::aggregate;
                   } else if (s == "forward") {
                     cfg.mode = Mode::forward;
                   } else {
                     fail(f, "must be aggregate or forward, got " + show(s));
                   }
                 } else if (key == "workers") {
                   parse_workers(v, f, cfg);
                 } else if (key == "memory") {
                   parse_memory(v, f, cfg);
                 } else if (key == "engine") {
                   parse_engine(v, f, cfg);
                 } else {
                   parse_control(v, f, cfg);
                 }
               });
  if (!has_ports) fail("ports", "required key missing (list the 2 ports: - name: <device>)");
}

// "origin:line:column" (1-based), or just the origin when yaml-cpp has no
// position.
std::string where(const std::string& origin, const YAML::Mark& mark) {
  if (mark.is_null()) return origin;
  return origin + ":" + std::to_string(mark.line + 1) + ":" + std::to_string(mark.column + 1);
}

// First-pass event handler: counts documents, remembers where the second
// one starts, ignores everything else.
class DocumentCounter final : public YAML::EventHandler {
 public:
  int documents = 0;
  YAML::Mark second = YAML::Mark::null_mark();

  void OnDocumentStart(const YAML::Mark& mark) override {
    if (++documents == 2) second = mark;
  }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t,
                const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}
};

struct FileCloser {
  void operator()(std::FILE* f) const noexcept { std::fclose(f); }
};

}  // namespace

Status parse_config(const std::string& yaml_text, const std::string& origin, DataplaneConfig& out) {
  const std::string name = origin.empty() ? std::string("<config>") : origin;
  try {
    // First pass: syntax, and exactly one document. At most two documents
    // are asked for: yaml-cpp 0.7 returns an endless run of empty documents
    // after a stray ',' (jbeder/yaml-cpp#1040), which is why LoadAll is
    // never used here.
    {
      std::istringstream in(yaml_text);
      YAML::Parser parser(in);
      DocumentCounter counter;
      while (counter.documents < 2 && parser.HandleNextDocument(counter)) {
      }
      if (counter.documents >= 2) {
        return Status::invalid("", where(name, counter.second) +
                                       ": content after the end of the document (a second "
                                       "document after '---', or a stray character); write "
                                       "one mapping");
      }
    }
    const YAML::Node root = YAML::Load(yaml_text);
    if (root.IsNull()) {
      return Status::invalid("", name +
                                     ": the document is empty; it needs at least 'ports' (see "
                                     "config/dataplane.yaml)");
    }
    if (!root.IsMap()) {
      return Status::invalid(
          "", name + ": the top level must be a mapping (key: value lines), got " + describe(root));
    }
    DataplaneConfig cfg;
    parse_top(root, cfg);
    out = std::move(cfg);
    return {};
  } catch (const ConfigError& e) {
    return Status::invalid(e.field, e.message);
  } catch (const YAML::Exception& e) {
    return Status::invalid(
        "", where(name, e.mark) + ": " + (e.msg.empty() ? std::string("invalid YAML") : e.msg));
  } catch (const std::exception& e) {
    return Status(StatusCode::internal, "", name + ": " + e.what());
  } catch (...) {
    return Status(StatusCode::internal, "",
                  name + ": unexpected error while reading the configuration");
  }
}

Status load_config(const std::string& path, DataplaneConfig& out) {
  try {
    const std::unique_ptr<std::FILE, FileCloser> file(std::fopen(path.c_str(), "rb"));
    std::FILE* f = file.get();
    if (f == nullptr) {
      const int err = errno;
      return Status(err == ENOENT ? StatusCode::not_found : StatusCode::invalid_argument, "",
                    path + ": cannot open: " + std::strerror(err));
    }
    std::string text;
    char buf[8192];
    size_t n = 0;
    bool too_big = false;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) {
      text.append(buf, n);
      if (text.size() > kMaxFileBytes) {
        too_big = true;
        break;
      }
    }
    const int err = std::ferror(f) ? errno : 0;
    if (too_big) {
      return Status::invalid("", path + ": larger than " + std::to_string(kMaxFileBytes >> 10) +
                                     " KiB, not a configuration file");
    }
    if (err != 0) return Status::invalid("", path + ": cannot read: " + std::strerror(err));
    return parse_config(text, path, out);
  } catch (const std::exception& e) {
    return Status(StatusCode::internal, "", path + ": " + e.what());
  } catch (...) {
    return Status(StatusCode::internal, "", path + ": unexpected error while reading the file");
  }
}

}  // namespace netreduce::dataplane
