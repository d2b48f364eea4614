// Error values for control paths (ring installation, configuration, API):
// a code, the field at fault, and a message a person can act on. Hot paths
// never build a Status; they return enumerated reasons and bump counters.
#pragma once

#include <string>
#include <utility>

namespace netreduce {

enum class StatusCode {
  ok,
  invalid_argument,
  not_found,
  already_exists,
  conflict,
  permission_denied,  // authenticated, but not allowed to do this (HTTP 403)
  resource_exhausted,
  unavailable,
  unimplemented,
  internal
};

constexpr const char* to_string(StatusCode c) noexcept {
  switch (c) {
    case StatusCode::ok:
      return "ok";
    case StatusCode::invalid_argument:
      return "invalid_argument";
    case StatusCode::not_found:
      return "not_found";
    case StatusCode::already_exists:
      return "already_exists";
    case StatusCode::conflict:
      return "conflict";
    case StatusCode::permission_denied:
      return "permission_denied";
    case StatusCode::resource_exhausted:
      return "resource_exhausted";
    case StatusCode::unavailable:
      return "unavailable";
    case StatusCode::unimplemented:
      return "unimplemented";
    case StatusCode::internal:
      return "internal";
  }
  return "unknown";
}

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string field, std::string message)
      : code_(code), field_(std::move(field)), message_(std::move(message)) {}

  static Status invalid(std::string field, std::string message) {
    return {StatusCode::invalid_argument, std::move(field), std::move(message)};
  }

  bool ok() const noexcept { return code_ == StatusCode::ok; }
  explicit operator bool() const noexcept { return ok(); }
  StatusCode code() const noexcept { return code_; }
  const std::string& field() const noexcept { return field_; }
  const std::string& message() const noexcept { return message_; }
  // "field: message" (or just the message when no field is at fault).
  std::string to_string() const { return field_.empty() ? message_ : field_ + ": " + message_; }

 private:
  StatusCode code_ = StatusCode::ok;
  std::string field_;
  std::string message_;
};

}  // namespace netreduce
