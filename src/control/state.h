// The daemon's persisted state: the rings operators and host libraries
// created, as one JSON file {"version": 1, "rings": [ring JSON, ...]}.
//
// save() never leaves a torn file: it writes `<file>.tmp`, fsyncs it, renames
// it over the file and fsyncs the directory, so after a crash (kill -9, power
// loss) the file holds either the old or the new state, whole. load() treats a
// missing file as an empty state and anything unreadable as an error naming
// the file and the ring at fault (the daemon refuses to start rather than
// silently forget rings).
//
// lock() makes the daemon the file's only user: an exclusive flock on
// `<file>.lock`, which holds the owner's pid, kept until the process exits
// (the kernel drops it even after kill -9, so a stale pid in the file is
// harmless). A second netreduced on the same state file gets an error naming
// the first one's pid.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "common/status.h"
#include "engine/ring.h"

namespace netreduce::control {

using RingMap = std::map<uint32_t, engine::RingSpec>;

class StateFile {
 public:
  explicit StateFile(std::string path) : path_(std::move(path)) {}
  ~StateFile();
  StateFile(const StateFile&) = delete;
  StateFile& operator=(const StateFile&) = delete;

  // Error (field state.file): another process holds the lock, or the lock
  // file cannot be created.
  Status lock();
  std::string lock_path() const { return path_ + ".lock"; }
  Status load(RingMap& out) const;
  Status save(const RingMap& rings) const;
  const std::string& path() const noexcept { return path_; }

 private:
  std::string path_;
  int lock_fd_ = -1;
};

}  // namespace netreduce::control
