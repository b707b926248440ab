// Typed reads of a nested Config with errors that name the key path, e.g.
//   trainer.init.loop.max_steps: expected an integer, got "ten"
// A ConfigView is a (value, path) pair; at() descends and extends the path.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cstorch/config.h"
#include "cstorch/core/error.h"

namespace modelzoo {

using cstorch::Config;

class ConfigView {
 public:
  ConfigView(const Config& c, std::string path) : c_(&c), path_(std::move(path)) {}

  const Config& value() const { return *c_; }
  const std::string& path() const { return path_; }
  // `path.key` (or `key` at the root), `path[i]` for list elements.
  std::string child_path(const std::string& key) const;

  bool is_null() const { return c_->is_null(); }
  bool has(const std::string& key) const;  // a map holding `key` (not null)
  // The value under `key`; missing is an error naming the full path.
  ConfigView at(const std::string& key) const;
  ConfigView at(size_t i) const;
  size_t size() const;  // list length (error when not a list)

  // Errors unless this is a map whose keys are all in `allowed`; the error names the unknown
  // key and lists the valid ones.
  void check_keys(const std::vector<std::string>& allowed) const;
  void expect_map() const;
  void expect_list() const;

  // This value as a type (error names the path, the expected type and the value).
  int64_t as_int() const;
  double as_double() const;
  bool as_bool() const;
  std::string as_string() const;
  std::vector<std::string> as_string_list() const;  // a string or a list of strings

  // Optional members with defaults.
  int64_t get_int(const std::string& key, int64_t def) const;
  std::optional<int64_t> get_opt_int(const std::string& key) const;
  double get_double(const std::string& key, double def) const;
  bool get_bool(const std::string& key, bool def) const;
  std::string get_string(const std::string& key, const std::string& def) const;

  // A discriminated entry `{Name: {args}}` (one key): the name and a view of its arguments
  // (null arguments read as an empty map). A plain string is a name without arguments.
  std::pair<std::string, Config> named_entry() const;

  [[noreturn]] void error(const std::string& msg) const;

 private:
  const Config* c_;
  std::string path_;
};

// `"ten"`, `3`, `{...}`: a short rendering of a value for error messages.
std::string short_repr(const Config& c);

}  // namespace modelzoo
