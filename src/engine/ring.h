// A ring as the engine sees it: the specification (common/ring_spec.h, the
// contract shared with the host library and the daemon) plus what depends on
// the engine's records: the reduce modes, the ICRC fix-up methods, the memory
// a ring needs and the check of its memory quota.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/ring_spec.h"
#include "common/status.h"
#include "wire/ina.h"

namespace netreduce::engine {

using netreduce::kMaxMsgLen;
using netreduce::kMaxRanks;
using netreduce::kMaxWindow;
using netreduce::kMinRanks;
using netreduce::RingSpec;
using netreduce::slots_for_window;
inline constexpr size_t kInaHeaderBytes = sizeof(wire::InaHdr);

enum class ReduceMode : uint8_t {
  deterministic,  // hold every rank's packet, reduce in rank order at completion
  accumulate,     // reduce on arrival, keep only headers and one accumulator per cell
};

enum class IcrcFixup : uint8_t {
  full,    // recompute each released packet's ICRC over the whole packet
  linear,  // CRC linearity: one payload CRC per cell, O(header) per packet
};

// validate_fields, then the memory quota against ring_memory_bytes in
// deterministic mode; the Status names the first bad field.
Status validate(const RingSpec& spec);

// Bytes the engine needs for the ring in the given mode, counting the held
// packets at their largest (frame bytes of P-1 ranks for every cell).
uint64_t ring_memory_bytes(const RingSpec& spec, ReduceMode mode) noexcept;

}  // namespace netreduce::engine
