// The daemon's persisted state: the rings operators and host libraries
// created, each with the credential of the job that owns it and its lease,
// as one JSON file. Example, one plain ring 7 of P = 3 members:
//   {"version": 2, "rings": [{"id": 7, "members": [...3 addresses...], ...,
//                             "credential": "<32 hex>", "lease_ms": 30000}]}
// A version 1 file (rings without owners) loads as rings with no credential
// and no lease: only the operator token may remove them. A fabric ring
// (control/fabric.h, daemon.h) also carries
//   "fabric": {"entry": "<32 hex>", "origin": "<box>" (peers only),
//              "local": false (only when this box holds no part of it),
//              "tree": {...} (this box's node; absent: a plain ring),
//              "peers": [{"box": "<name>", "ring": {ring JSON + "tree"}}] (origin only),
//              "etcd_lease": <id> (once published)}
// The file is mode 0600 (credentials and tree keys are secrets); lease
// deadlines are not persisted. "fabric_deletes" of files written when
// daemons pushed entries to each other is read and ignored: etcd holds what
// each box must remove.
//
// Contracts:
// - One process: lock() takes an exclusive flock on `<file>.lock` (holding
//   the owner's pid) until exit; the kernel drops it even after kill -9. A
//   second netreduced on the file gets an error naming the first one's pid.
// - One thread at a time: the daemon calls save() and load() under its `mu_`.
// - save() writes `<file>.tmp`, fsyncs it, renames it over the file and
//   fsyncs the directory: after a crash the file holds the old or the new
//   state, whole. load(): a missing file is an empty state; anything
//   unreadable is an error naming the file and the ring at fault. A fabric
//   ring written before tree installations had an epoch and key gets a new
//   installation at its origin (all its trees, its peers' entries included)
//   and is left out at a peer, which gets it from etcd again.
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

// At a fabric ring's origin: one other box's entry (published in etcd)
// and what that box reported of it.
struct PeerEntry {
  std::string box;      // fabric box name
  nlohmann::json ring;  // the entry its data plane installs (ring JSON + "tree")
  // The box's last report (its ack in etcd), memory only: a restarted
  // origin reads the acks again. Written and read under the daemon's mutex.
  bool installed = false;   // its data plane holds the entry
  std::string error;        // why it does not, when it said so
  std::string error_field;  // the field at fault ("id": the id is taken there)
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
  std::vector<PeerEntry> peers;          // at the origin: the other boxes' entries
  // The etcd lease the entries live under (0: not published yet): at the
  // origin the one it keeps alive, at a peer the one its ack is put with.
  int64_t etcd_lease = 0;
  // Memory only: the fabric's state, under the daemon's mutex (control/daemon.h).
  std::chrono::steady_clock::time_point etcd_renewed{};  // origin: last publish or keepalive
  std::chrono::steady_clock::time_point etcd_failed{};   // origin: last failed try; max: its POST's
  std::optional<bool> acked;                             // peer: the "installed" its last ack said
  std::chrono::steady_clock::time_point acked_at{};      // peer: when that ack was sent
  uint64_t acking = 0;  // peer: the claim (Daemon::ack_claims_) of whoever puts its ack; 0: none
};

using RingMap = std::map<uint32_t, RingRecord>;

// `n` bytes from the kernel's CSPRNG; false if getrandom fails.
bool random_bytes(void* out, size_t n);

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
  Status load(RingMap& out) const;
  Status save(const RingMap& rings) const;
  const std::string& path() const noexcept { return path_; }

 private:
  std::string path_;
  int lock_fd_ = -1;
};

}  // namespace netreduce::control
