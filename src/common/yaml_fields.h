// Strict YAML field readers shared by the configuration loaders (the data
// plane's and the control daemon's): yaml-cpp builds the node tree, and
// these read scalars by hand (decimal integers only, no silent wrap-around),
// check mapping keys (unknown keys are errors, with a "did you mean"), and
// throw ConfigError naming the dotted key at fault. parse_document() runs a
// loader's walk over one YAML document and turns every error (ConfigError,
// yaml-cpp's exceptions, bad_alloc) into a Status, so nothing escapes it.
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace netreduce::yaml_fields {

// sockaddr_un::sun_path holds 108 bytes including the terminating NUL.
inline constexpr size_t kMaxSocketPath = 107;

struct ConfigError {
  std::string field;
  std::string message;
};

[[noreturn]] void fail(std::string field, std::string message);

// Input text as shown in a message or a field name: control characters
// replaced, long values cut.
std::string clean(std::string_view s);
std::string show(std::string_view s);       // 'clean(s)'
std::string describe(const YAML::Node& n);  // what a node is, for "got ..." messages
std::string join(std::initializer_list<std::string_view> names);
size_t edit_distance(std::string_view a, std::string_view b);
std::string child(const std::string& parent, std::string_view key);
std::string indexed(const std::string& field, size_t i);  // field[i]

// The text of a scalar value; `what` describes the expected value.
const std::string& scalar(const YAML::Node& n, const std::string& field, std::string_view what);
// An integer in [lo, hi]. Decimal only, optional sign.
uint64_t integer(const YAML::Node& n, const std::string& field, int64_t lo, int64_t hi);
uint16_t power_of_two(const YAML::Node& n, const std::string& field, int64_t lo, int64_t hi);
bool boolean(const YAML::Node& n, const std::string& field);
// A string for argv or a path: may not contain NUL.
std::string text(const YAML::Node& n, const std::string& field, std::string_view what);
std::string non_empty(const YAML::Node& n, const std::string& field, std::string_view what);
// Bytes: an integer, optionally followed by K/KiB, M/MiB or G/GiB. Greater than 0.
uint64_t size_bytes(const YAML::Node& n, const std::string& field);
// An absolute path short enough for a Unix socket.
std::string socket_path(const YAML::Node& n, const std::string& field);

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

// Reads a configuration file (at most 1 MiB); the Status names the path.
Status read_file(const std::string& path, std::string& text);

// Parses `yaml_text` as exactly one YAML document whose top level is a
// mapping and calls walk(root). `empty_hint` completes "the document is
// empty; ..." (what the file needs at least).
Status parse_document(const std::string& yaml_text, const std::string& origin,
                      const std::function<void(const YAML::Node&)>& walk,
                      const std::string& empty_hint);

}  // namespace netreduce::yaml_fields
