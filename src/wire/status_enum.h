// One X-macro list of statuses -> an enum class, its count, and constexpr
// to_string (the value's name) and describe (its sentence). LIST(X) calls
// X(name, "description") once per value, in order; the first is 0.
//
//   #define MY_STATUS(X) X(ok, "fine") X(bad, "not fine")
//   NETREDUCE_DEFINE_STATUS_ENUM(MyStatus, kMyStatusCount, MY_STATUS)
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#define NETREDUCE_STATUS_VALUE_(name, desc) name,
#define NETREDUCE_STATUS_COUNT_(name, desc) +1
#define NETREDUCE_STATUS_NAME_(name, desc) \
  case name:                               \
    return #name;
#define NETREDUCE_STATUS_DESC_(name, desc) \
  case name:                               \
    return desc;

#define NETREDUCE_DEFINE_STATUS_ENUM(Type, Count, LIST)            \
  enum class Type : uint8_t { LIST(NETREDUCE_STATUS_VALUE_) };     \
  inline constexpr size_t Count = 0 LIST(NETREDUCE_STATUS_COUNT_); \
  constexpr std::string_view to_string(Type s) noexcept {          \
    using enum Type;                                               \
    switch (s) { LIST(NETREDUCE_STATUS_NAME_) }                    \
    return "invalid";                                              \
  }                                                                \
  constexpr std::string_view describe(Type s) noexcept {           \
    using enum Type;                                               \
    switch (s) { LIST(NETREDUCE_STATUS_DESC_) }                    \
    return "invalid";                                              \
  }
