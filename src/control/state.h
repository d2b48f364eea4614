// The daemon's persisted state: the rings operators and host libraries
// created, each with the credential of the job that owns it and its lease,
// as one JSON file
//   {"version": 2, "rings": [ring JSON + {"credential": "<32 hex>", "lease_ms": N}, ...]}
// (version 1 files, written before rings had owners, load as rings with no
// credential and no lease: only the operator token may remove them).
//
// A fabric ring (control/fabric.h, daemon.h "Fabric") also carries
//   "fabric": {"entry": "<32 hex>", "origin": "<box>" (peers only),
//              "local": false (only when this box holds no part of it),
//              "tree": {...} (this box's node; absent: a plain ring),
//              "peers": [{"box": "<name>", "ring": {ring JSON + "tree"}}] (origin only)}
// and the file's "fabric_deletes": [{"box", "id", "entry"}] lists the peers
// a deleted or expired fabric ring must still be removed from.
//
// The credentials are secrets: the file is created mode 0600 (and forced to
// 0600 when replaced). The lease's deadline is not persisted: a restarted
// daemon gives every lease a fresh full period.
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

#include <chrono>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "engine/ring.h"
#include "engine/tree.h"

namespace netreduce::control {

// At a fabric ring's origin: one other box's entry and its push state.
struct PeerPush {
  std::string box;      // fabric box name
  nlohmann::json ring;  // the entry its data plane installs (ring JSON + "tree")
  // Push state, memory only (a restarted origin pushes every entry once
  // more; the push is idempotent). Written and read under the daemon's mutex.
  bool pushed = false;     // the peer daemon accepted the entry
  bool installed = false;  // and said its data plane holds it
  std::string error;       // the last failed push, empty after a success
  std::chrono::steady_clock::time_point last_push{};
};

// A removal the origin still owes a peer (a deleted or expired fabric ring).
struct FabricDelete {
  std::string box;
  uint32_t id = 0;
  std::string entry;
  // The last attempt (memory only, under the daemon's mutex): retried once a second.
  std::chrono::steady_clock::time_point last_try{};
  bool same(const FabricDelete& o) const { return box == o.box && id == o.id && entry == o.entry; }
};

struct RingRecord {
  engine::RingSpec spec;
  // 32 lowercase hex digits (128 random bits) issued to the job that created
  // the ring; empty for rings of a version-1 state file (no job owns them).
  std::string credential;
  // 0: no lease, the ring stays until deleted. Otherwise the daemon removes
  // the ring when it is not renewed within lease_ms.
  uint32_t lease_ms = 0;
  // When the lease runs out. Not persisted; written and read under the
  // daemon's mutex only.
  std::chrono::steady_clock::time_point expires{};

  // Fabric rings (empty entry: an ordinary ring, none of the below).
  std::string entry;   // 32 hex: this registration's id, the same on every box
  std::string origin;  // at a peer: the box whose daemon registered it
  bool local = true;   // false: an origin outside the ring's tree (nothing installed here)
  std::optional<engine::TreeSpec> tree;  // this box's node; none: a plain ring
  std::vector<PeerPush> peers;           // at the origin: the other boxes' entries
};

using RingMap = std::map<uint32_t, RingRecord>;

// True for a well-formed credential (32 lowercase hex digits).
bool valid_credential(const std::string& c);

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
  Status load(RingMap& out, std::vector<FabricDelete>* deletes = nullptr) const;
  Status save(const RingMap& rings, const std::vector<FabricDelete>& deletes = {}) const;
  const std::string& path() const noexcept { return path_; }

 private:
  std::string path_;
  int lock_fd_ = -1;
};

}  // namespace netreduce::control
