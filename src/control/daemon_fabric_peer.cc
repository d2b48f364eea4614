// The fabric at a peer, a box a ring's origin wrote an entry for
// (docs/design.md#fabric-state-in-etcd): each entry under this box's prefix,
// once its node matches what this box computes from its own fabric section,
// becomes a ring of its table and its data plane, and gets an ack under the
// entry's lease saying whether it is installed or why it was refused. An
// entry gone from etcd leaves the table and the data plane. Threads and
// locks: control/daemon.h.
//
// - Entries watcher (`entries_watch_`): on_entry_event() and sync_entries()
//   change the table and the data plane like an API call, then put the ack
//   of what they applied under the record's ack claim.
// - Upkeep (`fabric_upkeep_`): refresh_acks() acks again what the metrics
//   thread's view of the data plane says differently from the last ack.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "control/daemon.h"
#include "control/daemon_fabric_shared.h"
#include "control/daemon_shared.h"
#include "control/fabric.h"
#include "engine/engine_json.h"

namespace netreduce::control {

using nlohmann::json;

// --- The entries watcher ------------------------------------------------------

void Daemon::on_entry_event(const EtcdEvent& e) {
  if (!e.deleted) return apply_entry(e.kv);
  uint32_t id = 0;
  if (!id_from_key(e.kv.key, entries_prefix(cfg_.fabric->self), id)) return;
  remove_entry(id, e.prev ? text_field(parse_object(e.prev->value), "entry") : "");
}

void Daemon::apply_entry(const EtcdKv& kv) {
  uint32_t id = 0;
  const json v = parse_object(kv.value);
  const std::string origin = text_field(v, "origin");
  const std::string entry = text_field(v, "entry");
  // Not an entry any origin of this fabric wrote: nobody to tell.
  if (!id_from_key(kv.key, entries_prefix(cfg_.fabric->self), id) ||
      cfg_.fabric->find(origin) < 0 || origin == cfg_.fabric->self || !valid_credential(entry)) {
    ++counters_.fabric_entries_refused;
    spdlog::warn("fabric: {} is not an entry of another box of this fabric; ignored", kv.key);
    return;
  }
  RingRecord rec;
  rec.origin = origin;
  rec.entry = entry;
  rec.etcd_lease = kv.lease;
  rec.spec.ring_id = id;
  Status s = ring_tree_from_json(v.value("ring", json()), rec.spec, rec.tree);
  if (!s) s = Status(s.code(), "ring." + s.field(), s.message());
  if (s && rec.spec.ring_id != id)
    s = Status::invalid("ring.id", "is not the key's id " + std::to_string(id));
  if (s) s = engine::validate(rec.spec);
  if (s) s = check_own_entry(rec.spec, rec.tree);
  bool known = false;
  uint64_t claim = 0;
  if (s) s = install_entry(rec, known, claim);
  if (known) return;  // held already (a whole read after a restart)
  const bool refused = !s && s.code() != StatusCode::unavailable;
  if (refused) {
    ++counters_.fabric_entries_refused;
    spdlog::warn("ring {}: entry from box {} refused: {}", id, origin, s.to_string());
    // etcd holds this entry for the id now: an older one held here is over.
    drop_other_entry(id, entry);
  } else {
    ++counters_.fabric_entries_applied;
    spdlog::info("ring {}: fabric entry from box {} ({})", id, origin,
                 rec.tree ? "tree node" : "plain ring");
  }
  // Acked with no lock held. A record that entered the table did so claimed
  // for this ack (`claim`), so the upkeep's acks of it come after this one;
  // they correct it from a metrics refresh begun after it, or send what it
  // missed.
  const auto asked = SteadyClock::now();
  const bool sent = put_ack(rec, s.ok(), refused ? s : Status());
  if (!claim) return;
  std::lock_guard lock(mu_);
  if (auto it = rings_.find(id); it != rings_.end() && it->second.acking == claim) {
    it->second.acking = 0;
    it->second.acked_at = asked;
    if (sent) it->second.acked = s.ok();
  }
}

Status Daemon::install_entry(const RingRecord& rec, bool& known, uint64_t& claim) {
  const uint32_t id = rec.spec.ring_id;
  std::lock_guard change(change_mu_);
  std::unique_lock lock(mu_);
  std::optional<RingRecord> replaced;
  if (auto it = rings_.find(id); it != rings_.end()) {
    RingRecord& have = it->second;
    if (have.origin.empty())
      return {StatusCode::conflict, "id",
              id_text(id) + " is registered on box " + cfg_.fabric->self + " itself"};
    if (have.entry == rec.entry && same_spec(have.spec, rec.spec) && have.tree == rec.tree) {
      if (have.etcd_lease != rec.etcd_lease) {
        // Published again under a new lease: the old lease's ack went with
        // it, so the upkeep acks again under the new one.
        have.etcd_lease = rec.etcd_lease;
        have.acked.reset();
      }
      known = true;
      return {};
    }
    // A newer registration of the id (etcd's order): the old entry is over.
    replaced = have;
    rings_.erase(it);
  } else if (rings_.size() >= cfg_.max_rings) {
    return {StatusCode::resource_exhausted, "quotas.max_rings",
            "box " + cfg_.fabric->self + " holds its maximum of " + std::to_string(cfg_.max_rings) +
                " rings"};
  }
  const uint64_t need = engine::ring_memory_bytes(rec.spec, engine::ReduceMode::deterministic);
  if (const uint64_t used = memory_locked(); used + need > cfg_.max_memory)
    return {StatusCode::resource_exhausted, "quotas.max_memory",
            "the ring needs " + std::to_string(need) + " bytes; " + std::to_string(used) + " of " +
                std::to_string(cfg_.max_memory) + " are taken on box " + cfg_.fabric->self};
  claim = ++ack_claims_;
  rings_.emplace(id, rec).first->second.acking = claim;  // apply_entry's ack
  if (Status s = save_locked(); !s) {
    rings_.erase(id);
    return {StatusCode::internal, "", "cannot persist the state: " + s.message()};
  }
  lock.unlock();
  json reply;
  if (replaced) (void)change_call(dpcmd::remove_ring(id), reply);
  const Status s = change_call(install_cmd(rec), reply);
  if (!s && s.code() != StatusCode::unavailable) {  // refused by the data plane
    lock.lock();
    rings_.erase(id);
    (void)save_locked();
  }
  return s;
}

void Daemon::drop_other_entry(uint32_t id, const std::string& keep) {
  std::string other;
  {
    std::lock_guard lock(mu_);
    auto it = rings_.find(id);
    if (it == rings_.end() || it->second.origin.empty() || it->second.entry == keep) return;
    other = it->second.entry;
  }
  remove_entry(id, other);
}

void Daemon::remove_entry(uint32_t id, const std::string& entry) {
  std::lock_guard change(change_mu_);
  std::unique_lock lock(mu_);
  auto it = rings_.find(id);
  if (it == rings_.end() || it->second.origin.empty() ||
      (!entry.empty() && it->second.entry != entry))
    return;
  const RingRecord old = it->second;
  rings_.erase(it);
  if (Status s = save_locked(); !s) {
    rings_.emplace(id, old);
    spdlog::error("ring {}: etcd removed its entry, but the state cannot be saved: {}", id,
                  s.to_string());
    return;
  }
  lock.unlock();
  json reply;
  if (old.local) (void)change_call(dpcmd::remove_ring(id), reply);
  ++counters_.fabric_entries_removed;
  spdlog::info("ring {}: fabric entry from box {} removed (gone from etcd)", id, old.origin);
}

void Daemon::sync_entries(const std::vector<EtcdKv>& kvs) {
  std::map<uint32_t, std::string> in_etcd;  // id -> entry
  for (const EtcdKv& kv : kvs) {
    uint32_t id = 0;
    if (id_from_key(kv.key, entries_prefix(cfg_.fabric->self), id))
      in_etcd[id] = text_field(parse_object(kv.value), "entry");
    try {
      apply_entry(kv);
    } catch (const std::exception& e) {  // the next entries and the removals go on
      ++counters_.fabric_entries_refused;
      spdlog::error("fabric: {}: {}", kv.key, e.what());
    }
  }
  // What this box holds and etcd does not (or holds another registration of).
  std::vector<std::pair<uint32_t, std::string>> gone;
  {
    std::lock_guard lock(mu_);
    for (const auto& [id, rec] : rings_) {
      auto it = in_etcd.find(id);
      if (!rec.origin.empty() && (it == in_etcd.end() || it->second != rec.entry))
        gone.emplace_back(id, rec.entry);
    }
  }
  for (const auto& [id, entry] : gone) remove_entry(id, entry);
}

// --- Acks -------------------------------------------------------------------

bool Daemon::put_ack(const RingRecord& rec, bool installed, const Status& error) {
  // An entry without a lease was not written by an origin's publish: its
  // refusal is counted and logged here, not acked for ever.
  if (!rec.etcd_lease) return true;
  const json ack = {{"entry", rec.entry},
                    {"installed", installed},
                    {"error", error ? "" : error.message()},
                    {"field", error ? "" : error.field()}};
  const std::string key =
      acks_prefix(rec.origin) + std::to_string(rec.spec.ring_id) + "/" + cfg_.fabric->self;
  const Status s = etcd_->put(key, ack.dump(), rec.etcd_lease);
  // not_found: the entry's lease is gone, and the entry with it (its
  // removal is on its way through the watch).
  if (!s && s.code() != StatusCode::not_found) ++counters_.fabric_etcd_errors;
  return s.ok();
}

void Daemon::refresh_acks() {
  std::vector<RingRecord> changed;
  {
    std::lock_guard lock(mu_);
    // One writer of a record's ack at a time: two puts in flight could land
    // in etcd in the other order, leaving the older value as the last word.
    for (auto& [id, rec] : rings_)
      if (!rec.origin.empty() && rec.etcd_lease && !rec.acking) {
        rec.acking = ++ack_claims_;  // the copy below carries it
        changed.push_back(rec);
      }
  }
  for (const RingRecord& rec : changed) {
    // Only a refresh begun after the last ack tells anything new (an older
    // one may predate the install that ack reported).
    const std::optional<bool> installed = installed_per_cache(rec, rec.acked_at);
    const auto asked = SteadyClock::now();
    const bool sent = installed && rec.acked != *installed && put_ack(rec, *installed, {});
    std::lock_guard lock(mu_);
    // The claim, not the entry, names the record: the same entry may have
    // left and come back (a new lease) meanwhile, claimed by its install.
    if (auto it = rings_.find(rec.spec.ring_id);
        it != rings_.end() && it->second.acking == rec.acking) {
      it->second.acking = 0;
      if (sent) {
        it->second.acked = *installed;
        it->second.acked_at = asked;
      }
    }
  }
}

// --- A peer's check of its own entry --------------------------------------

Status Daemon::check_own_entry(const engine::RingSpec& spec,
                               const std::optional<engine::TreeSpec>& tree) const {
  // The installation's epoch and key, drawn by the origin; a stand-in key
  // when none came (a plain ring needs none; a tree node must then differ).
  TreeSecret secret;
  secret.key.fill(1);
  if (tree) {
    secret.epoch = tree->epoch;
    secret.key = tree->key;
  }
  std::vector<FabricEntry> entries;
  if (Status s = compute_fabric_entries(spec, *cfg_.fabric, secret, entries); !s)
    return Status(s.code(), "ring." + s.field(), s.message());
  const std::string& self = cfg_.fabric->self;
  auto mine = std::find_if(entries.begin(), entries.end(),
                           [&](const FabricEntry& e) { return e.box == self; });
  if (mine == entries.end())
    return {StatusCode::conflict, "ring",
            "box " + self + " has no part in this ring under its own fabric configuration; " +
                "the origin's fabric section differs from this box's"};
  if (mine->tree != tree)
    return {StatusCode::conflict, "ring.tree",
            "is not the node box " + self + " computes from its own fabric configuration; " +
                "the origin's fabric section differs from this box's"};
  return {};
}

}  // namespace netreduce::control
