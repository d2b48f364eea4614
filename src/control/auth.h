// Who a request is: the daemon's one decision of authorization, and the
// constant-time comparison every secret check uses. No I/O, no threads.
//
// The operator token (auth.token_file) may do everything; the jobs' token
// (auth.job_token_file, when configured) may create rings and delete or
// renew those whose credential it presents (Daemon checks the credential).
// Anything else is anonymous: routes flagged kAuth answer 401 before
// reading a body byte (control/http_server.h).
//
// Example: tokens "op-1" (operator) and "job-2" (jobs).
//   "Bearer op-1"  -> kOperator
//   "Bearer job-2" -> kJob
//   "Bearer op-"   -> kAnonymous (a prefix of a token is not the token)
//   "bearer op-1"  -> kAnonymous (the scheme is matched as every client
//                     of this project sends it)
//   ""             -> kAnonymous
#pragma once

#include <string>

namespace netreduce::control {

enum class Role { kAnonymous, kOperator, kJob };

// The daemon's bearer tokens; job empty: no jobs' token configured.
struct Tokens {
  std::string operator_token;
  std::string job_token;
};

// The role of a request whose Authorization header is `authorization`
// ("" when it has none).
Role role_of(const std::string& authorization, const Tokens& tokens) noexcept;

// Constant-time comparison: the time taken depends only on the lengths, not
// on where the contents differ. An empty `want` never matches.
bool same_secret(const std::string& given, const std::string& want) noexcept;

}  // namespace netreduce::control
