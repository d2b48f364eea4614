// Authorization (auth.h).
#include "control/auth.h"

namespace netreduce::control {

Role role_of(const std::string& authorization, const Tokens& tokens) noexcept {
  static constexpr char kPrefix[] = "Bearer ";
  constexpr size_t kPrefixLen = sizeof(kPrefix) - 1;
  if (authorization.compare(0, kPrefixLen, kPrefix) != 0) return Role::kAnonymous;
  const std::string given = authorization.substr(kPrefixLen);
  if (same_secret(given, tokens.operator_token)) return Role::kOperator;
  if (!tokens.job_token.empty() && same_secret(given, tokens.job_token)) return Role::kJob;
  return Role::kAnonymous;
}

bool same_secret(const std::string& given, const std::string& want) noexcept {
  if (want.empty()) return false;
  unsigned char diff = given.size() == want.size() ? 0 : 1;
  for (size_t i = 0; i < given.size(); ++i)
    diff |= static_cast<unsigned char>(given[i] ^ want[i % want.size()]);
  return diff == 0;
}

}  // namespace netreduce::control
