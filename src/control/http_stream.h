// The stream a worker of the HTTP front end (control/http_server.h) serves
// one request over: cpp-httplib parses the request from it and writes the
// response to it. It gives the head the gate saw complete from memory, then
// the socket's bytes, and holds the request to absolute deadlines and the
// body to a cap on the bytes taken from the socket.
//
// Example, listen.body_timeout_ms 10000, write_timeout_ms 10000, max_body
// 1 MiB:
//  1. A worker takes a request whose head the gate saw whole: its body must
//     be in within 10 s from now, however slowly it trickles in; then read()
//     fails, and read_timed_out() says why.
//  2. A chunked body may take at most 1 MiB and 64 KiB (its framing) from
//     the socket; then read() fails, and over_budget() says why.
//  3. The response must be out within 10 s of its first byte; then write()
//     fails, and write_timed_out() says why.
//
// Threads: a ConnStream is one worker's, for one request; nothing in it is
// shared.
#pragma once

#include <httplib.h>

#include <chrono>
#include <cstddef>
#include <string>

#include "control/http_server.h"

namespace netreduce::control {

// Milliseconds left until `deadline`, as a poll timeout: 0 once it passed,
// at most 2^30.
int ms_left(std::chrono::steady_clock::time_point deadline);

class ConnStream final : public httplib::Stream {
 public:
  using Clock = std::chrono::steady_clock;

  // `fd`: the connection's socket (non-blocking), past `head` already.
  ConnStream(int fd, std::string head, const HttpLimits& limits);

  bool is_readable() const override;
  bool is_writable() const override;
  ssize_t read(char* ptr, size_t size) override;
  ssize_t write(const char* ptr, size_t size) override;
  void get_remote_ip_and_port(std::string& ip, int& port) const override;
  void get_local_ip_and_port(std::string& ip, int& port) const override;
  socket_t socket() const override { return fd_; }

  bool over_budget() const noexcept { return over_budget_; }
  // httplib may stop at is_readable() (which records nothing) rather than in
  // read(): a body that failed at or past its deadline timed out either way.
  bool read_timed_out() const noexcept { return read_timed_out_ || Clock::now() >= read_deadline_; }
  bool write_timed_out() const noexcept { return write_timed_out_; }

 private:
  const int fd_;
  const std::string head_;
  size_t pos_ = 0;
  const Clock::time_point read_deadline_;
  const Clock::duration write_timeout_;
  Clock::time_point write_deadline_{};
  bool write_started_ = false;
  const size_t wire_budget_;
  size_t body_read_ = 0;
  bool over_budget_ = false;
  bool read_timed_out_ = false;
  bool write_timed_out_ = false;
};

}  // namespace netreduce::control
