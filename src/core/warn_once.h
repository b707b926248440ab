// Warnings said once a process for each subject (an eager loop would repeat them every step).
#pragma once
#include <cstdio>
#include <mutex>
#include <set>
#include <string>

namespace cstorch::detail {

// Prints "warning: <message>" to stderr the first time `subject` is given; later calls with the
// same subject print nothing. Thread-safe.
inline void warn_once(const std::string& subject, const std::string& message) {
  static std::mutex mu;
  static std::set<std::string> said;
  std::lock_guard<std::mutex> lock(mu);
  if (said.insert(subject).second) std::fprintf(stderr, "warning: %s\n", message.c_str());
}

}  // namespace cstorch::detail
