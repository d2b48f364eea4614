// Bootstrap: a TCP rendezvous for exchanging connection information, like
// NCCL's unique id. Rank 0 listens at "host:port"; every other rank
// connects (retrying while rank 0 is not up yet) and says hello (magic,
// rank, world). Then:
//   allgather: every rank sends a blob to rank 0, rank 0 sends the table of
//              all blobs (rank order) back to each;
//   broadcast: rank 0 sends a blob to every rank.
// Frames are a 4-byte big-endian length and the bytes. Every socket
// operation has the caller's deadline; errors name the peer rank and the
// address.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "host-lib/transport.h"

namespace netreduce::host {

// Splits "host:port"; false with a message if malformed.
bool parse_host_port(const std::string& s, std::string& host, uint16_t& port, std::string& error);

class Bootstrap {
 public:
  static Error create(unsigned rank, unsigned world, const std::string& address,
                      Clock::time_point deadline, std::unique_ptr<Bootstrap>& out);
  ~Bootstrap();
  Bootstrap(const Bootstrap&) = delete;
  Bootstrap& operator=(const Bootstrap&) = delete;

  Error allgather(const std::string& mine, std::vector<std::string>& all,
                  Clock::time_point deadline);
  // At rank 0 `blob` is sent; elsewhere it receives.
  Error broadcast(std::string& blob, Clock::time_point deadline);

 private:
  Bootstrap(unsigned rank, unsigned world, std::string address)
      : rank_(rank), world_(world), address_(std::move(address)) {}
  unsigned rank_, world_;
  std::string address_;
  int listen_fd_ = -1;
  std::vector<int> peers_;  // rank 0: fd per rank (index 0 unused); others: [0] = rank 0
};

}  // namespace netreduce::host
