// Registries of named components (models, data processors, callbacks, loggers) so a YAML file
// can name them. Names are matched case-insensitively; an unknown name is an error that lists
// the registered ones. Components register from static initialisers:
//
//   MODELZOO_REGISTER(models, "fc_mnist", [](const modelzoo::ConfigView& a) { ... });
//
// Shared libraries in a plugin directory (`cszoo --python_paths DIR`, kept for the command
// line's compatibility) are loaded with load_plugins(); their static initialisers register
// more components without rebuilding cszoo.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <fmt/ranges.h>

#include "modelzoo/config_view.h"

namespace modelzoo {

namespace detail {
// The shared library load_plugins is loading now (its static initialisers are registering), or
// null outside a load.
const std::string* loading_plugin();
// A registration error inside a plugin's static initialisers: kept, and raised by load_plugins
// once the library's load returned (an exception thrown through the loader's own frames would
// end the process or leave the loader locked).
void defer_plugin_error(std::string message);
}  // namespace detail

template <class T>
class Registry {
 public:
  using Factory = std::function<T(const ConfigView& args)>;
  explicit Registry(std::string what) : what_(std::move(what)) {}

  // Registers `name`; registering a name twice is an error naming where each came from (built
  // in, or the plugin file).
  void add(const std::string& name, Factory f) {
    auto key = cstorch::ascii_lower(name);
    const std::string* plugin = detail::loading_plugin();
    const std::string from = plugin ? fmt::format("plugin '{}'", *plugin) : "built in";
    if (auto it = entries_.find(key); it != entries_.end()) {
      std::string message = fmt::format("{} '{}' is registered twice: by {} and by {}", what_, name,
                                        it->second.origin, from);
      if (plugin) return detail::defer_plugin_error(std::move(message));
      cstorch::fail("{}", message);
    }
    entries_[key] = {name, std::move(f), from};
  }
  bool contains(const std::string& name) const {
    return entries_.count(cstorch::ascii_lower(name)) > 0;
  }
  // Registered names, sorted.
  std::vector<std::string> names() const {
    std::vector<std::string> r;
    for (const auto& [k, v] : entries_) r.push_back(v.name);
    return r;
  }
  // Builds `name` with `args`; `where` is the key path of the name for error messages.
  T create(const std::string& name, const ConfigView& args, const std::string& where) const {
    auto it = entries_.find(cstorch::ascii_lower(name));
    if (it == entries_.end())
      cstorch::fail("{}: unknown {} '{}' (registered: {})", where, what_, name,
                    fmt::join(names(), ", "));
    return it->second.factory(args);
  }

 private:
  std::string what_;
  struct Entry {
    std::string name;  // as registered
    Factory factory;
    std::string origin;  // "built in" or "plugin 'PATH'"
  };
  std::map<std::string, Entry> entries_;
};

// Loads each path: a shared library itself, or every shared library (*.so) of a directory, in
// name order. A path that is neither, or a library that fails to load, is an error naming it
// and the loader's message; so is a library registering a name already registered (built in or
// by an earlier library), naming both. Returns the paths loaded.
std::vector<std::string> load_plugins(const std::vector<std::string>& paths);

}  // namespace modelzoo

#define MODELZOO_CONCAT2(a, b) a##b
#define MODELZOO_CONCAT(a, b) MODELZOO_CONCAT2(a, b)
// Registers a factory in registry `reg()` at static-initialisation time.
#define MODELZOO_REGISTER(reg, name, ...)                                     \
  static const bool MODELZOO_CONCAT(modelzoo_registered_, __COUNTER__) = [] { \
    ::modelzoo::reg().add(name, __VA_ARGS__);                                 \
    return true;                                                              \
  }()
