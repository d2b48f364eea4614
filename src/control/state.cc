#include "control/state.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/ring_json.h"
#include "engine/engine_json.h"
#include "engine/ring.h"

namespace netreduce::control {

using nlohmann::json;

namespace {

// A tree written before installations had an epoch and a key.
bool keyless_tree(const json& t) {
  return t.is_object() && !t.contains("epoch") && !t.contains("key");
}

// Whether any tree of a record's fabric section (its own, its pushes) is keyless.
bool keyless_fabric(const json& fabric) {
  if (keyless_tree(fabric.value("tree", json()))) return true;
  for (const json& p : fabric.value("peers", json::array()))
    if (p.is_object() && p.contains("ring") && p["ring"].is_object() &&
        keyless_tree(p["ring"].value("tree", json())))
      return true;
  return false;
}

// An origin's keyless record becomes one new installation: every tree of
// it (its own, its pushes) gets the same fresh epoch and key.
bool give_installation(json& fabric) {
  engine::TreeSpec secret;
  if (!random_bytes(&secret.epoch, sizeof secret.epoch) ||
      !random_bytes(secret.key.data(), secret.key.size()))
    return false;
  auto keyed = [&](json& t) {
    if (!t.is_object()) return;
    t["epoch"] = secret.epoch;
    t["key"] = key_to_hex(secret.key);
  };
  if (fabric.contains("tree")) keyed(fabric["tree"]);
  if (fabric.contains("peers") && fabric["peers"].is_array())
    for (json& p : fabric["peers"])
      if (p.is_object() && p.contains("ring") && p["ring"].is_object() &&
          p["ring"].contains("tree"))
        keyed(p["ring"]["tree"]);
  return true;
}

Status io_error(const std::string& what, const std::string& path) {
  return {StatusCode::internal, "", what + " " + path + ": " + std::strerror(errno)};
}

// Writes all of `data` to fd; false on error.
bool write_all(int fd, const std::string& data) {
  size_t off = 0;
  while (off < data.size()) {
    const ssize_t n = ::write(fd, data.data() + off, data.size() - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    off += static_cast<size_t>(n);
  }
  return true;
}

}  // namespace

bool random_bytes(void* out, size_t n) {
  auto* p = static_cast<unsigned char*>(out);
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::getrandom(p + got, n - got, 0);
    if (r < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    got += static_cast<size_t>(r);
  }
  return true;
}

bool valid_credential(const std::string& c) {
  if (c.size() != 32) return false;
  for (char x : c)
    if (!((x >= '0' && x <= '9') || (x >= 'a' && x <= 'f'))) return false;
  return true;
}

StateFile::~StateFile() {
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

Status StateFile::lock() {
  if (lock_fd_ >= 0) return {};
  const std::string path = lock_path();
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0)
    return {StatusCode::internal, "state.file",
            "cannot create the lock file " + path + ": " +
                (errno == ELOOP ? std::string("it is a symbolic link (refused)")
                                : std::string(std::strerror(errno)) +
                                      " (its directory must exist and be writable)")};
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char buf[32] = {};
    const ssize_t n = ::pread(fd, buf, sizeof(buf) - 1, 0);
    ::close(fd);
    std::string pid = n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
    pid.erase(pid.find_last_not_of(" \n") + 1);
    if (err == EWOULDBLOCK)
      return {StatusCode::conflict, "state.file",
              path_ + " is in use by another netreduced (pid " + (pid.empty() ? "unknown" : pid) +
                  ", lock " + path + "); stop it, or give this instance its own state.file"};
    return {StatusCode::internal, "state.file", "cannot lock " + path + ": " + std::strerror(err)};
  }
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, pid.data(), pid.size(), 0) < 0) {
    const Status s{StatusCode::internal, "state.file",
                   "cannot write the lock file " + path + ": " + std::strerror(errno)};
    ::close(fd);
    return s;
  }
  lock_fd_ = fd;
  return {};
}

Status StateFile::load(RingMap& out) const {
  std::ifstream in(path_);
  if (!in) {
    const int err = errno;
    struct stat st {};
    // A link whose target is gone is not a daemon's first start: reading it
    // as empty would remove every ring from a running box, and the first
    // save would replace the link.
    if (err == ENOENT && ::lstat(path_.c_str(), &st) == 0 && S_ISLNK(st.st_mode))
      return {StatusCode::internal, "state.file",
              path_ +
                  " is a symbolic link to a file that does not exist; point it at the state "
                  "file or remove it"};
    if (err == ENOENT) {
      out.clear();
      return {};
    }
    errno = err;
    return io_error("cannot open", path_);
  }
  std::stringstream ss;
  ss << in.rdbuf();
  json j;
  try {
    j = json::parse(ss.str());
  } catch (const std::exception& e) {
    return Status::invalid("", path_ + ": not JSON: " + e.what());
  }
  if (!j.is_object() || !j.contains("rings") || !j["rings"].is_array())
    return Status::invalid("", path_ + ": expected {\"version\": 2, \"rings\": [...]}");
  const json version = j.value("version", json(1));
  if (version != 1 && version != 2)
    return Status::invalid("version", path_ + ": unknown state version " + version.dump() +
                                          " (this daemon reads 1 and 2)");
  RingMap rings;
  for (size_t i = 0; i < j["rings"].size(); ++i) {
    const std::string where = path_ + ": rings[" + std::to_string(i) + "]: ";
    json r = j["rings"][i];
    RingRecord rec;
    if (r.is_object() && version == 2) {
      if (r.contains("credential")) {
        if (!r["credential"].is_string() || !valid_credential(r["credential"].get<std::string>()))
          return Status::invalid("credential", where + "credential: must be 32 hex digits");
        rec.credential = r["credential"].get<std::string>();
        r.erase("credential");
      }
      if (r.contains("lease_ms")) {
        if (!r["lease_ms"].is_number_unsigned() || r["lease_ms"].get<uint64_t>() > 0xFFFFFFFFu)
          return Status::invalid("lease_ms",
                                 where + "lease_ms: must be an unsigned 32-bit integer");
        rec.lease_ms = r["lease_ms"].get<uint32_t>();
        r.erase("lease_ms");
      }
    }
    json fabric;
    if (r.is_object() && r.contains("fabric")) {
      fabric = r["fabric"];
      r.erase("fabric");
    }
    if (Status s = ring_from_json(r, rec.spec); !s)
      return Status::invalid(s.field(), where + s.to_string());
    if (!fabric.is_null()) {
      const std::string fw = where + "fabric: ";
      if (!fabric.is_object() || !fabric.contains("entry") || !fabric["entry"].is_string() ||
          !valid_credential(fabric["entry"].get<std::string>()))
        return Status::invalid("fabric", fw + "must be an object with \"entry\" (32 hex digits)");
      if (fabric.contains("origin") && !fabric["origin"].is_string())
        return Status::invalid("fabric", fw + "origin: must be a box name (a string)");
      if (fabric.contains("local") && !fabric["local"].is_boolean())
        return Status::invalid("fabric", fw + "local: must be true or false");
      if (fabric.contains("peers") && !fabric["peers"].is_array())
        return Status::invalid("fabric", fw + "peers: must be an array");
      if (fabric.contains("etcd_lease") && !fabric["etcd_lease"].is_number_integer())
        return Status::invalid("fabric", fw + "etcd_lease: must be an integer");
      // Written before tree installations had an epoch and key: an origin
      // draws one now (its pushes take it to the peers, which replace their
      // copies); a peer's copy is left for its origin to push again.
      if (keyless_fabric(fabric)) {
        if (!fabric.value("origin", std::string()).empty()) continue;
        if (!give_installation(fabric))
          return Status(StatusCode::internal, "", fw + "getrandom failed: " + std::strerror(errno));
      }
      rec.entry = fabric["entry"].get<std::string>();
      rec.origin = fabric.value("origin", std::string());
      rec.local = fabric.value("local", true);
      rec.etcd_lease = fabric.value("etcd_lease", int64_t{0});
      if (!rec.origin.empty()) rec.lease_ms = 0;  // a peer's entry lives as long as etcd holds it
      if (fabric.contains("tree")) {
        engine::TreeSpec t;
        if (Status s = tree_from_json(fabric["tree"], rec.spec, t); !s)
          return Status::invalid(s.field(), fw + s.to_string());
        rec.tree = std::move(t);
      }
      for (const json& p : fabric.value("peers", json::array())) {
        if (!p.is_object() || !p.contains("box") || !p["box"].is_string() || !p.contains("ring"))
          return Status::invalid("fabric", fw + "peers: each needs \"box\" and \"ring\"");
        PeerEntry peer;
        peer.box = p["box"].get<std::string>();
        peer.ring = p["ring"];
        rec.peers.push_back(std::move(peer));
      }
    }
    // The memory quota against what the ring needs (the engine's sizes), as
    // at registration: a ring the data plane would refuse forever is not
    // restored.
    if (Status s = engine::validate(rec.spec); !s)
      return Status::invalid(s.field(), where + s.to_string());
    const uint32_t id = rec.spec.ring_id;
    if (!rings.emplace(id, std::move(rec)).second)
      return Status::invalid("id", path_ + ": ring " + std::to_string(id) + " given twice");
  }
  out = std::move(rings);
  return {};
}

Status StateFile::save(const RingMap& rings) const {
  json arr = json::array();
  for (const auto& [id, rec] : rings) {
    json r = ring_to_json(rec.spec);
    if (!rec.credential.empty()) r["credential"] = rec.credential;
    if (rec.lease_ms) r["lease_ms"] = rec.lease_ms;
    if (!rec.entry.empty()) {
      json f = {{"entry", rec.entry}};
      if (!rec.origin.empty()) f["origin"] = rec.origin;
      if (!rec.local) f["local"] = false;
      if (rec.tree) f["tree"] = tree_to_json(*rec.tree, KeyShown::included);
      if (!rec.peers.empty()) {
        f["peers"] = json::array();
        for (const PeerEntry& p : rec.peers)
          f["peers"].push_back({{"box", p.box}, {"ring", p.ring}});
      }
      if (rec.etcd_lease) f["etcd_lease"] = rec.etcd_lease;
      r["fabric"] = std::move(f);
    }
    arr.push_back(std::move(r));
  }
  json doc = {{"version", 2}, {"rings", arr}};
  const std::string text = doc.dump(2) + "\n";

  const std::filesystem::path path(path_);
  const std::string dir = path.parent_path().empty() ? "." : path.parent_path().string();
  const std::string tmp = path_ + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0 && errno == ELOOP)
    return {StatusCode::internal, "", "cannot create " + tmp + ": it is a symbolic link (refused)"};
  if (fd < 0) return io_error("cannot create", tmp);
  // A temp file left by a crash keeps its mode through O_TRUNC: force 0600,
  // the file holds the rings' credentials.
  if (::fchmod(fd, 0600) != 0 || !write_all(fd, text) || ::fsync(fd) != 0) {
    Status s = io_error("cannot write", tmp);
    ::close(fd);
    ::unlink(tmp.c_str());
    return s;
  }
  if (::close(fd) != 0) return io_error("cannot close", tmp);
  if (::rename(tmp.c_str(), path_.c_str()) != 0) {
    Status s = io_error("cannot rename over", path_);
    ::unlink(tmp.c_str());
    return s;
  }
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return io_error("cannot open directory", dir);
  const int rc = ::fsync(dfd);
  ::close(dfd);
  if (rc != 0) return io_error("cannot fsync directory", dir);
  return {};
}

}  // namespace netreduce::control
