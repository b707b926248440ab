// Errors raised by cstorch. Every error is a cstorch::Error whose message says what failed and
// where (op, shape, file, key path or step) so a user can act on it.
#pragma once
#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace cstorch {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

// Throws cstorch::Error with a fmt-formatted message.
template <class... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

#define CS_CHECK(cond, ...)                    \
  do {                                         \
    if (!(cond)) ::cstorch::fail(__VA_ARGS__); \
  } while (0)

}  // namespace cstorch
