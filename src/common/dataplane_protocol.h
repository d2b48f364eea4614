// The data plane's control protocol, client side and names, in one place.
//
// Theory of operation
// -------------------
// netreduce-dataplane answers on a Unix stream socket, one JSON object per
// line each way (the server and every command's reply are described at the top
// of src/dataplane/control_api.cc). This module holds what both ends and every
// client share: the command names (the server dispatches on the same
// constants), a builder per request, and DataplaneClient, the one client used
// by the daemon (netreduced), the loopback benchmark and the C++ tests.
//
// DataplaneClient. One connection; every call has a deadline (connect, write
// and read together). The request is written whole (a short send is
// continued until the deadline), and a reply is at most kMaxReply bytes. A
// call that fails or times out closes the connection, and the next call
// connects again, so a restarted data plane is picked up by the next request.
// A call on a kept-open connection that turns out dead is retried once on a
// new one when the request was not delivered or only reads (is_read_only).
// Calls are serialized by a mutex (the socket carries one request at a time);
// a call waits for it at most the timeout too (then: unavailable), so no call
// takes longer than twice the timeout however many are queued.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "common/ring_spec.h"
#include "common/status.h"

namespace netreduce {

// Command names ("cmd" of a request).
namespace dpcmd {
inline constexpr char kPing[] = "ping";
inline constexpr char kStatus[] = "status";
inline constexpr char kStats[] = "stats";
inline constexpr char kInstallRing[] = "install_ring";
inline constexpr char kRemoveRing[] = "remove_ring";
inline constexpr char kListRings[] = "list_rings";
inline constexpr char kGetRing[] = "get_ring";
inline constexpr char kSetMode[] = "set_mode";
inline constexpr char kSetPolling[] = "set_polling";
inline constexpr char kShutdown[] = "shutdown";
// Fault injection (dataplane/faults.h), refused unless faults.enabled.
inline constexpr char kSetFault[] = "set_fault";
inline constexpr char kClearFaults[] = "clear_faults";
inline constexpr char kListFaults[] = "list_faults";

// Commands that change nothing: safe to send again after a lost connection.
bool is_read_only(std::string_view cmd) noexcept;

// Request builders.
nlohmann::json ping();
nlohmann::json status();
nlohmann::json stats();
nlohmann::json list_rings();
nlohmann::json get_ring(uint32_t id);
nlohmann::json install_ring(const RingSpec& spec);
nlohmann::json remove_ring(uint32_t id);
nlohmann::json set_mode(std::string_view mode);  // "aggregate" | "forward"
nlohmann::json set_polling(bool enabled);
nlohmann::json shutdown();
// ring: an id, or nullopt for every installed ring (set) / every fault (clear).
nlohmann::json set_fault(std::optional<uint32_t> ring, std::string_view kind, double fraction,
                         uint32_t duration_ms);
nlohmann::json clear_faults(std::optional<uint32_t> ring);
nlohmann::json list_faults();
}  // namespace dpcmd

// An error code name ("not_found", ...) back to its code; internal if unknown.
StatusCode status_code_from_string(std::string_view name) noexcept;

class DataplaneClient {
 public:
  static constexpr size_t kMaxReply = 16u << 20;  // a longer reply line: unavailable

  DataplaneClient(std::string socket_path, std::chrono::milliseconds timeout);
  ~DataplaneClient();
  DataplaneClient(const DataplaneClient&) = delete;
  DataplaneClient& operator=(const DataplaneClient&) = delete;

  // Sends `request` and returns the data plane's reply in `reply`. unavailable
  // if the socket cannot be reached or does not answer in time (field
  // "dataplane.timeout_ms" when the call never got the connection: other
  // calls held it; nothing is known about the data plane then); when the data
  // plane answers {"ok": false, "error": {...}}, that error as a Status (the
  // whole reply is in `reply` then too).
  Status call(const nlohmann::json& request, nlohmann::json& reply);

  // Connects, trying again every 20 ms until `wait` has passed (a data plane
  // that is still starting); the last connect error if it never could.
  Status wait_until_connected(std::chrono::milliseconds wait);

  // From any thread, for a shutdown: the call in progress and every later
  // one fail at once (unavailable, "cancelled"), whatever their deadlines.
  void cancel() noexcept;

  bool connected() const noexcept { return fd_open_.load(); }
  // Successful connects so far: a change means the connection was re-made.
  uint64_t connects() const noexcept { return connects_.load(); }
  const std::string& path() const noexcept { return path_; }

 private:
  Status connect_locked(std::chrono::steady_clock::time_point deadline);
  // One request/reply exchange; `delivered`: the request was written out.
  Status attempt_locked(const nlohmann::json& request, nlohmann::json& reply,
                        std::chrono::steady_clock::time_point deadline, bool& delivered);
  void close_locked();
  // Waits for `events` on fd until the deadline or cancel(); false then.
  bool wait_locked(int fd, short events, std::chrono::steady_clock::time_point deadline) const;
  Status cancelled() const;

  const std::string path_;
  const std::chrono::milliseconds timeout_;
  std::timed_mutex mu_;
  int fd_ = -1;                        // guarded by mu_
  std::string buf_;                    // bytes read past the last reply line; guarded by mu_
  std::atomic<bool> fd_open_{false};   // written under mu_, read by anyone
  std::atomic<uint64_t> connects_{0};  // written under mu_, read by anyone
  std::atomic<bool> cancelled_{false};
  const int cancel_fd_;  // eventfd, readable once cancel() ran
};

}  // namespace netreduce
