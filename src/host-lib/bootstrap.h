// Bootstrap: a TCP rendezvous for exchanging connection information, like
// NCCL's unique id. Rank 0 listens at "host:port"; every other rank
// connects (retrying while rank 0 is not up yet) and says hello (magic,
// rank, world, job tag: 16 bytes of SHA-256 over the job key, zero without
// one); rank 0 answers one byte, accepted or "another job". Rank 0 reads
// hellos side by side, each within 5 s of its connection, so a silent
// stranger or another job's leftover rank at the same address is dropped
// and counted (the timeout error names the last one) without holding up
// the job; the same rank claimed twice fails, naming both addresses.
// Example: job key "a3f9" at 10.0.0.1:29500, world 4; a leftover rank 1 of
// an earlier job (key "77c0") connects first: it hears "another job" and
// keeps retrying to its own deadline; this job's ranks 1..3 join. Then:
//   allgather: every rank sends a blob to rank 0, rank 0 sends the table of
//              all blobs (rank order) back to each;
//   broadcast: rank 0 sends a blob to every rank.
// Frames are a 4-byte big-endian length and the bytes. Every socket
// operation has the caller's deadline; errors name the peer rank and the
// address.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "host-lib/transport.h"

struct sockaddr_in;

namespace netreduce::host {

// Splits "host:port"; false with a message if malformed.
bool parse_host_port(const std::string& s, std::string& host, uint16_t& port, std::string& error);

using JobTag = std::array<uint8_t, 16>;
// The tag a job key gives (all zero for "": no job identity beyond the
// address and world size).
JobTag job_tag(const std::string& key);

class Bootstrap {
 public:
  static Error create(unsigned rank, unsigned world, const std::string& address,
                      const std::string& job_key, Clock::time_point deadline,
                      std::unique_ptr<Bootstrap>& out);
  ~Bootstrap();
  Bootstrap(const Bootstrap&) = delete;
  Bootstrap& operator=(const Bootstrap&) = delete;

  // A bootstrap of some of a job's ranks (the ring of one local rank): its
  // rank 0 listens on a port the system picks at `ip` (listen, then
  // address() to tell the others, then accept); the others create() with
  // that address.
  static Error listen(unsigned world, const std::string& ip, std::unique_ptr<Bootstrap>& out);
  Error accept(const std::string& job_key, Clock::time_point deadline);
  // Over a rendezvous the caller has (netreduce.hpp Rendezvous): allgather
  // is the caller's, broadcast is an allgather of rank 0's blob, and
  // local_ip() is `ip` (the address the rank's own rendezvous would listen
  // at). The caller's allgather gets each exchange's deadline.
  static std::unique_ptr<Bootstrap> over(unsigned rank, unsigned world, const Rendezvous& rv,
                                         std::string ip);
  const std::string& address() const noexcept { return address_; }
  // The IPv4 address this rank reaches rank 0 through (at rank 0: the one
  // it listens at); empty if unknown.
  std::string local_ip() const;

  Error allgather(const std::string& mine, std::vector<std::string>& all,
                  Clock::time_point deadline);
  // At rank 0 `blob` is sent; elsewhere it receives.
  Error broadcast(std::string& blob, Clock::time_point deadline);

 private:
  Bootstrap(unsigned rank, unsigned world, std::string address)
      : rank_(rank), world_(world), address_(std::move(address)) {}
  Error bind_listen(const sockaddr_in& sa);
  Error join(const JobTag& job, Clock::time_point deadline);
  Error hello(const sockaddr_in& sa, const JobTag& job, Clock::time_point deadline);
  unsigned rank_, world_;
  std::string address_;
  int listen_fd_ = -1;
  std::string listen_ip_;   // rank 0: the address it listens at
  std::vector<int> peers_;  // rank 0: fd per rank (index 0 unused); others: [0] = rank 0
  std::function<Error(const std::string&, std::vector<std::string>&, Clock::time_point)>
      rendezvous_;  // over()
};

}  // namespace netreduce::host
