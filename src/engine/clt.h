// The engine's keyed tables (internal to src/engine/, docs/design.md#tables).
//
// OpenTable: a fixed-capacity hash table, open addressing with linear
// probing and backward-shift deletion, load factor capped at 1/2, sized at
// construction: no allocation after it. It serves every keyed lookup of the
// engine:
// - Clt: (src IP, dst IP, dst QPN) -> (ring slot, rank) for INA
//   connections, or -> tombstone for the connections of a removed ring in
//   its grace period. Only INA first packets that passed every check insert
//   here, so ordinary traffic cannot fill it; an entry leaves when its rank
//   re-binds to another QP or its tombstone expires.
// - LinkTable (ring_state.h): (src IP, dst IP) of every ring link.
// - RingIndex (ring_state.h): ring id -> ring slot.
// home() gives the first slot a key probes, for prefetching it a few packets
// ahead (engine.cc). Owned by the engine's thread; no sharing.
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "engine/line_vector.h"

namespace netreduce::engine::detail {

struct ConnKey {
  uint32_t src = 0;
  uint32_t dst = 0;
  uint32_t qpn = 0;
  bool operator==(const ConnKey&) const = default;
};

inline uint32_t hash_key(const ConnKey& k) noexcept {
  uint64_t h = (uint64_t{k.src} << 32 | k.dst) * 0x9E3779B97F4A7C15ull;
  h ^= uint64_t{k.qpn} * 0xC2B2AE3D27D4EB4Full;
  return static_cast<uint32_t>(h ^ (h >> 29));
}
inline uint32_t hash_key(uint64_t k) noexcept {
  const uint64_t h = k * 0x9E3779B97F4A7C15ull;
  return static_cast<uint32_t>(h ^ (h >> 32));
}

// A slot is the Value (its members read directly: slot->owner) plus the key.
template <class Key, class Value>
class OpenTable {
 public:
  struct Slot : Value {
    Key key{};
    bool used = false;
  };

  // Room for `capacity` entries at load 1/2 (at least 16).
  explicit OpenTable(unsigned capacity) : slots_(std::bit_ceil(std::max(capacity, 16u)) * 2) {}

  Slot* find(const Key& k) noexcept {
    for (size_t i = hash_key(k) & mask();; i = (i + 1) & mask()) {
      Slot& s = slots_[i];
      if (!s.used) return nullptr;
      if (s.key == k) return &s;
    }
  }
  const Slot* find(const Key& k) const noexcept { return const_cast<OpenTable*>(this)->find(k); }
  // The existing entry or a new one (Value{}); nullptr when full.
  Slot* insert(const Key& k) noexcept {
    if (Slot* s = find(k)) return s;
    if ((size_ + 1) * 2 > slots_.size()) return nullptr;
    for (size_t i = hash_key(k) & mask();; i = (i + 1) & mask()) {
      if (!slots_[i].used) {
        slots_[i] = Slot{};
        slots_[i].key = k;
        slots_[i].used = true;
        ++size_;
        return &slots_[i];
      }
    }
  }
  void erase(const Key& k) noexcept {
    size_t i = hash_key(k) & mask();
    for (;; i = (i + 1) & mask()) {
      if (!slots_[i].used) return;
      if (slots_[i].key == k) break;
    }
    // Backward shift: move later entries of the cluster into the hole when
    // their home position is at or before it.
    size_t hole = i;
    for (size_t j = (i + 1) & mask(); slots_[j].used; j = (j + 1) & mask()) {
      const size_t home = hash_key(slots_[j].key) & mask();
      if (((j - home) & mask()) >= ((j - hole) & mask())) {
        slots_[hole] = slots_[j];
        hole = j;
      }
    }
    slots_[hole] = Slot{};
    --size_;
  }
  // The slot a lookup of k reads first.
  const Slot* home(const Key& k) const noexcept { return &slots_[hash_key(k) & mask()]; }
  size_t size() const noexcept { return size_; }
  // Entries it takes before insert() refuses.
  size_t capacity() const noexcept { return slots_.size() / 2; }

 private:
  size_t mask() const noexcept { return slots_.size() - 1; }
  LineVector<Slot> slots_;
  size_t size_ = 0;
};

// ina: bound to (ring, rank) of an installed ring. retired: the connection
// of a removed ring during its grace period (every WRITE on it is dropped).
enum class ConnState : uint8_t { ina, retired };

struct ConnValue {
  uint32_t owner = 0;  // ina: ring slot index; retired: tombstone index
  uint8_t rank = 0;
  ConnState state = ConnState::ina;
  bool ina() const noexcept { return state == ConnState::ina; }
  bool retired() const noexcept { return state == ConnState::retired; }
};

using Clt = OpenTable<ConnKey, ConnValue>;

}  // namespace netreduce::engine::detail
