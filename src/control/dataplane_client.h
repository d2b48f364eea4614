// Client of the data plane's control socket (src/dataplane/control.cc): one
// Unix stream connection, one JSON object per line each way. Every call has
// a deadline (connect, write and read together); a call that fails or times
// out closes the connection, and the next call connects again, so a
// restarted data plane is picked up by the next request. A call on a
// kept-open connection that turns out dead is retried once on a new one when
// the request was not delivered or only reads. Calls are
// serialized by a mutex (the socket carries one request at a time); a call
// waits for it at most the timeout too (then: unavailable), so no call takes
// longer than twice the timeout however many are queued.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>

#include "common/status.h"

namespace netreduce::control {

class DataplaneClient {
 public:
  DataplaneClient(std::string socket_path, std::chrono::milliseconds timeout)
      : path_(std::move(socket_path)), timeout_(timeout) {}
  ~DataplaneClient();
  DataplaneClient(const DataplaneClient&) = delete;
  DataplaneClient& operator=(const DataplaneClient&) = delete;

  // Sends `request` and returns the data plane's reply in `reply`. unavailable
  // if the socket cannot be reached or does not answer in time (field
  // "dataplane.timeout_ms" when the call never got the connection: other
  // calls held it; nothing is known about the data plane then); when the data
  // plane answers {"ok": false, "error": {...}}, that error as a Status.
  Status call(const nlohmann::json& request, nlohmann::json& reply);

  bool connected() const noexcept { return fd_open_.load(); }
  // Successful connects so far: a change means the connection was re-made.
  uint64_t connects() const noexcept { return connects_.load(); }
  const std::string& path() const noexcept { return path_; }

 private:
  Status connect_locked(std::chrono::steady_clock::time_point deadline);
  // One request/reply exchange; `delivered`: the request was written out.
  Status attempt_locked(const nlohmann::json& request, nlohmann::json& reply,
                        std::chrono::steady_clock::time_point deadline, bool& delivered);
  static bool is_read_only(const nlohmann::json& request);
  void close_locked();

  const std::string path_;
  const std::chrono::milliseconds timeout_;
  std::timed_mutex mu_;
  int fd_ = -1;
  std::string buf_;  // bytes read past the last reply line
  std::atomic<bool> fd_open_{false};
  std::atomic<uint64_t> connects_{0};
};

// A data plane / API error code name ("not_found", ...) back to its code.
StatusCode status_code_from_string(const std::string& name);

}  // namespace netreduce::control
