// The daemon's persisted state: the rings operators and host libraries
// created, as one JSON file {"version": 1, "rings": [ring JSON, ...]}.
//
// save() never leaves a torn file: it writes `<file>.tmp`, fsyncs it, renames
// it over the file and fsyncs the directory, so after a crash (kill -9, power
// loss) the file holds either the old or the new state, whole. load() treats a
// missing file as an empty state and anything unreadable as an error naming
// the file and the ring at fault (the daemon refuses to start rather than
// silently forget rings).
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
  Status load(RingMap& out) const;
  Status save(const RingMap& rings) const;
  const std::string& path() const noexcept { return path_; }

 private:
  std::string path_;
};

}  // namespace netreduce::control
