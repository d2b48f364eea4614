#include "common/yaml_fields.h"

#include <yaml-cpp/eventhandler.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <sstream>
#include <system_error>

namespace netreduce::yaml_fields {
namespace {

// Largest config file read_file reads: a guard against pointing it at a
// device or a huge file by mistake.
constexpr size_t kMaxFileBytes = 1u << 20;

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

std::string show(std::string_view s) {
  std::string out = clean(s);  // built in place: GCC 12 -Wrestrict misfires on "'" + x + "'"
  out.insert(out.begin(), '\'');
  out.push_back('\'');
  return out;
}

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
std::string socket_path(const YAML::Node& n, const std::string& field) {
  std::string s = non_empty(n, field, "an absolute path");
  if (s[0] != '/') fail(field, "must be an absolute path, got " + show(s));
  if (s.size() > kMaxSocketPath) {
    fail(field, "must be at most " + std::to_string(kMaxSocketPath) +
                    " bytes long (the limit of a Unix socket path), got " +
                    std::to_string(s.size()));
  }
  return s;
}

Status parse_document(const std::string& yaml_text, const std::string& origin,
                      const std::function<void(const YAML::Node&)>& walk,
                      const std::string& empty_hint) {
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
      return Status::invalid("", name + ": the document is empty; " + empty_hint);
    }
    if (!root.IsMap()) {
      return Status::invalid(
          "", name + ": the top level must be a mapping (key: value lines), got " + describe(root));
    }
    walk(root);
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

Status read_file(const std::string& path, std::string& out) {
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
    out = std::move(text);
    return {};
  } catch (const std::exception& e) {
    return Status(StatusCode::internal, "", path + ": " + e.what());
  } catch (...) {
    return Status(StatusCode::internal, "", path + ": unexpected error while reading the file");
  }
}

}  // namespace netreduce::yaml_fields
