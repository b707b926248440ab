// A CLI11 check for integer options. CLI11 2.1 converts a 64-bit option with strtoll / strtoull
// and does not look at their range error: `--seed 99999999999999999999` became 2^63 - 1 and ran,
// and an unsigned option read `-5` as 2^64 - 5; with base 0, `--seed 010` was 8. This runs
// before the conversion, rejects the first two, naming the option (CLI11 prefixes its name) and
// the type's range, and reads the third as 10.
#pragma once
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <charconv>
#include <limits>
#include <string>
#include <system_error>
#include <type_traits>

namespace modelzoo::cli {

// Accepts an optional '+' (or '-' when T is signed) and decimal digits that fit T, nothing else,
// and hands the value on in canonical decimal. Use with CLI::Option::transform (check would
// hand CLI11 the string as typed).
template <class T>
CLI::Validator whole_number() {
  static_assert(std::is_integral_v<T>);
  return CLI::Validator(
      [](std::string& s) -> std::string {
        const char* b = s.data();
        const char* e = b + s.size();
        if (b != e && *b == '+') ++b;
        T v{};
        const auto [end, ec] = std::from_chars(b, e, v);
        constexpr T lo = std::numeric_limits<T>::min(), hi = std::numeric_limits<T>::max();
        if (ec == std::errc::result_out_of_range)
          return fmt::format("{} is out of range ({} to {})", s, lo, hi);
        if (b == e || ec != std::errc() || end != e)
          return fmt::format("{} is not a whole number from {} to {}", s, lo, hi);
        s = fmt::format("{}", v);  // decimal for CLI11, which reads "010" as octal
        return {};
      },
      "", "whole_number");
}

}  // namespace modelzoo::cli
