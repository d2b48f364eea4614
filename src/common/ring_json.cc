#include "common/ring_json.h"

#include <arpa/inet.h>

#include <set>

#include "wire/ina.h"

namespace netreduce {

using nlohmann::json;

std::string ipv4_to_string(uint32_t addr) {
  char buf[INET_ADDRSTRLEN];
  const uint32_t be = htonl(addr);
  return inet_ntop(AF_INET, &be, buf, sizeof(buf)) ? buf : "?";
}

bool ipv4_from_string(std::string_view s, uint32_t& addr) {
  // Parsed by hand over the whole view, not with inet_pton on c_str(): that
  // stops at an embedded NUL and would take "10.1.0.1\0x" as 10.1.0.1.
  uint32_t out = 0;
  size_t i = 0;
  for (int part = 0; part < 4; ++part) {
    if (part > 0) {
      if (i >= s.size() || s[i] != '.') return false;
      ++i;
    }
    const size_t start = i;
    unsigned v = 0;
    while (i < s.size() && i - start < 3 && s[i] >= '0' && s[i] <= '9')
      v = v * 10 + static_cast<unsigned>(s[i++] - '0');
    const size_t digits = i - start;
    if (digits == 0 || v > 255) return false;
    if (digits > 1 && s[start] == '0') return false;  // "010": octal to inet_aton, refused
    out = out << 8 | v;
  }
  if (i != s.size()) return false;  // a fourth digit, a fifth part, spaces, NUL, anything
  addr = out;
  return true;
}

json ring_to_json(const RingSpec& s) {
  json members = json::array();
  for (uint32_t m : s.members) members.push_back(ipv4_to_string(m));
  json dtypes = json::array(), ops = json::array();
  for (unsigned d = 1; d < 8; ++d)
    if (wire::is_valid_dtype(static_cast<uint8_t>(d)) && s.allows_dtype(static_cast<uint8_t>(d)))
      dtypes.push_back(std::string(wire::to_string(static_cast<wire::Dtype>(d))));
  for (unsigned o = 1; o < 8; ++o)
    if (wire::is_valid_op(static_cast<uint8_t>(o)) && s.allows_op(static_cast<uint8_t>(o)))
      ops.push_back(std::string(wire::to_string(static_cast<wire::ReduceOp>(o))));
  json j = {{"id", s.ring_id},
            {"members", members},
            {"msg_len", s.msg_len},
            {"window", s.window},
            {"payload_bytes", s.payload_bytes},
            {"dtypes", dtypes},
            {"ops", ops},
            {"memory_quota", s.memory_quota}};
  if (!s.qpns.empty()) j["qpns"] = s.qpns;  // absent when not given
  return j;
}

namespace {

// `s` quoted for an error message: at most 40 bytes, control and non-ASCII
// bytes as \xNN, so a NUL or a terminal escape in a request never reaches a
// log or a reply raw (and the reply stays valid UTF-8).
std::string printable(const std::string& s) {
  static const char* hex = "0123456789abcdef";
  std::string out = "'";
  for (size_t i = 0; i < s.size() && i < 40; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7F && c != '\'') {
      out += static_cast<char>(c);
    } else {
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out + (s.size() > 40 ? "'..." : "'");
}

template <typename T>
Status get_uint(const json& j, const char* key, T& out, bool required, uint64_t max) {
  if (!j.contains(key)) {
    if (required) return Status::invalid(key, "is required");
    return {};
  }
  const json& v = j.at(key);
  if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0))
    return Status::invalid(key, "must be a non-negative integer");
  const uint64_t x = v.get<uint64_t>();
  if (x > max) return Status::invalid(key, "must be at most " + std::to_string(max));
  out = static_cast<T>(x);
  return {};
}
}  // namespace

Status ring_from_json(const json& j, RingSpec& out) {
  if (!j.is_object()) return Status::invalid("", "a ring must be a JSON object");
  static const std::set<std::string> known = {"id",     "members",       "msg_len",
                                              "window", "payload_bytes", "dtypes",
                                              "ops",    "memory_quota",  "qpns"};
  for (const auto& [k, v] : j.items())
    if (!known.count(k)) return Status::invalid(k, "unknown field");
  RingSpec s;
  if (Status st = get_uint(j, "id", s.ring_id, true, 0xFFFFFFFFu); !st) return st;
  if (Status st = get_uint(j, "msg_len", s.msg_len, true, 0xFFFF); !st) return st;
  if (Status st = get_uint(j, "window", s.window, true, 0xFFFF); !st) return st;
  if (Status st = get_uint(j, "payload_bytes", s.payload_bytes, true, 0xFFFF); !st) return st;
  if (Status st = get_uint(j, "memory_quota", s.memory_quota, false, ~uint64_t{0}); !st) return st;

  if (!j.contains("members")) return Status::invalid("members", "is required");
  const json& m = j.at("members");
  if (!m.is_array()) return Status::invalid("members", "must be an array");
  s.members.assign(m.size(), 0);
  std::vector<bool> seen(m.size(), false);
  for (size_t i = 0; i < m.size(); ++i) {
    const std::string field = "members[" + std::to_string(i) + "]";
    std::string addr;
    size_t rank = i;
    if (m[i].is_string()) {
      addr = m[i].get<std::string>();
    } else if (m[i].is_object() && m[i].contains("rank") && m[i].contains("address") &&
               m[i]["rank"].is_number_unsigned() && m[i]["address"].is_string()) {
      rank = m[i]["rank"].get<size_t>();
      addr = m[i]["address"].get<std::string>();
      if (rank >= m.size())
        return Status::invalid(field + ".rank", "must be below the number of members");
      if (seen[rank])
        return Status::invalid(field + ".rank", "rank " + std::to_string(rank) + " given twice");
    } else {
      return Status::invalid(
          field, "must be an IPv4 address string or {\"rank\": r, \"address\": \"a.b.c.d\"}");
    }
    seen[rank] = true;
    if (!ipv4_from_string(addr, s.members[rank]))
      return Status::invalid(field, printable(addr) +
                                        " is not an IPv4 address (a dotted quad such as "
                                        "10.0.0.1: four decimal numbers 0..255 without leading "
                                        "zeros, nothing before or after)");
  }

  auto mask_of = [&](const char* key, uint8_t& mask, bool dtype) -> Status {
    if (!j.contains(key)) return {};
    const json& a = j.at(key);
    if (!a.is_array()) return Status::invalid(key, "must be an array of names");
    mask = 0;
    for (const json& n : a) {
      if (!n.is_string()) return Status::invalid(key, "must be an array of names");
      const std::string name = n.get<std::string>();
      if (dtype) {
        auto d = wire::parse_dtype(name);
        if (!d)
          return Status::invalid(
              key, "unknown dtype '" + name + "' (fp32, fp16, bf16, int32, int64, fp64)");
        mask |= static_cast<uint8_t>(1u << static_cast<unsigned>(*d));
      } else {
        auto o = wire::parse_op(name);
        if (!o) return Status::invalid(key, "unknown op '" + name + "' (sum, min, max)");
        mask |= static_cast<uint8_t>(1u << static_cast<unsigned>(*o));
      }
    }
    if (mask == 0)
      return Status::invalid(key, "must name at least one entry (omit it to allow all)");
    return {};
  };
  if (j.contains("qpns")) {
    const json& q = j.at("qpns");
    if (!q.is_array()) return Status::invalid("qpns", "must be an array of QP numbers");
    for (size_t i = 0; i < q.size(); ++i) {
      if (!q[i].is_number_integer() || q[i].get<int64_t>() < 0 || q[i].get<int64_t>() > 0xFFFFFF)
        return Status::invalid("qpns[" + std::to_string(i) + "]",
                               "must be a QP number (an integer 0..16777215)");
      s.qpns.push_back(q[i].get<uint32_t>());
    }
  }
  if (Status st = mask_of("dtypes", s.dtype_mask, true); !st) return st;
  if (Status st = mask_of("ops", s.op_mask, false); !st) return st;
  if (Status st = validate_fields(s); !st) return st;
  out = std::move(s);
  return {};
}

json status_to_json(const Status& s) {
  return {{"code", to_string(s.code())}, {"field", s.field()}, {"message", s.message()}};
}

std::string dump_json(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace netreduce
