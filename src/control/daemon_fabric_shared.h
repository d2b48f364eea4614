// What the fabric's files share (daemon_fabric.cc, daemon_fabric_origin.cc,
// daemon_fabric_peer.cc): reading the values and keys etcd holds, which are
// input (another box, or an operator with etcdctl, may have written them
// wrong), and the pace of retries. Not part of Daemon's interface
// (control/daemon.h), whose class comment holds the fabric's threads and
// locks.
#pragma once

#include <chrono>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace netreduce::control {

// After a failed publish, keepalive or watch, the next try.
inline constexpr auto kRetry = std::chrono::seconds(1);

// The JSON object `text` holds; an empty object if it holds none.
nlohmann::json parse_object(const std::string& text);

// j[key] if it is a string, else "".
std::string text_field(const nlohmann::json& j, const char* key);

// j[key] if it is true; false if it is false, absent or not a boolean.
bool true_field(const nlohmann::json& j, const char* key);

// The ring id at the end of an entry key (".../rings/<id>"); false if none.
bool id_from_key(const std::string& key, const std::string& prefix, uint32_t& id);

}  // namespace netreduce::control
