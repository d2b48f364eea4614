// The INA header's value types: data types, reduction ops, and a decoded view
// of the header that the first packet of every INA message carries (layout in
// headers.h, protocol in docs/design.md#wire-format).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "wire/headers.h"

namespace netreduce::wire {

// X(name, wire value, element bytes)
#define NETREDUCE_DTYPES(X) \
  X(fp32, 1, 4)             \
  X(fp16, 2, 2)             \
  X(bf16, 3, 2)             \
  X(int32, 4, 4)            \
  X(int64, 5, 8)            \
  X(fp64, 6, 8)

// X(name, wire value)
#define NETREDUCE_OPS(X) \
  X(sum, 1)              \
  X(min, 2)              \
  X(max, 3)

enum class Dtype : uint8_t {
#define NETREDUCE_X(name, value, bytes) name = value,
  NETREDUCE_DTYPES(NETREDUCE_X)
#undef NETREDUCE_X
};

enum class ReduceOp : uint8_t {
#define NETREDUCE_X(name, value) name = value,
  NETREDUCE_OPS(NETREDUCE_X)
#undef NETREDUCE_X
};

// Element size in bytes; 0 for a value that is not a Dtype.
constexpr size_t dtype_size(uint8_t wire) noexcept {
  switch (wire) {
#define NETREDUCE_X(name, value, bytes) \
  case value:                           \
    return bytes;
    NETREDUCE_DTYPES(NETREDUCE_X)
#undef NETREDUCE_X
  }
  return 0;
}
constexpr size_t dtype_size(Dtype d) noexcept { return dtype_size(static_cast<uint8_t>(d)); }
constexpr bool is_valid_dtype(uint8_t wire) noexcept { return dtype_size(wire) != 0; }
constexpr bool is_valid_op(uint8_t wire) noexcept {
  switch (wire) {
#define NETREDUCE_X(name, value) case value:
    NETREDUCE_OPS(NETREDUCE_X)
#undef NETREDUCE_X
    return true;
  }
  return false;
}

constexpr std::string_view to_string(Dtype d) noexcept {
  switch (d) {
#define NETREDUCE_X(name, value, bytes) \
  case Dtype::name:                     \
    return #name;
    NETREDUCE_DTYPES(NETREDUCE_X)
#undef NETREDUCE_X
  }
  return "invalid";
}
constexpr std::string_view to_string(ReduceOp o) noexcept {
  switch (o) {
#define NETREDUCE_X(name, value) \
  case ReduceOp::name:           \
    return #name;
    NETREDUCE_OPS(NETREDUCE_X)
#undef NETREDUCE_X
  }
  return "invalid";
}
std::optional<Dtype> parse_dtype(std::string_view s) noexcept;
std::optional<ReduceOp> parse_op(std::string_view s) noexcept;

// Decoded INA header, host byte order.
struct InaInfo {
  uint8_t version = kInaVersion;
  uint8_t dtype = 0;
  uint8_t op = 0;
  uint8_t flags = 0;
  uint32_t ring_id = 0;
  uint16_t rank = 0;
  uint16_t msg_len = 0;
  uint32_t msg_id = 0;
};

// Decodes the INA header at the start of a first packet's payload. Returns
// nothing if the payload is shorter than the header or the magic is absent
// (then the WRITE is ordinary RDMA traffic). Field values are not validated.
std::optional<InaInfo> ina_decode(const uint8_t* payload, size_t len) noexcept;

// Writes the header (magic included) to dst[0, sizeof(InaHdr)).
void ina_encode(const InaInfo& info, uint8_t* dst) noexcept;

}  // namespace netreduce::wire
