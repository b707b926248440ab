// Registries and plugin loading.
#include "modelzoo/registry.h"

#include <dlfcn.h>

#include <algorithm>
#include <cctype>
#include <filesystem>

namespace modelzoo {

namespace {
// Plugins load on the thread that calls load_plugins; their registrations run inside dlopen.
thread_local const std::string* g_loading = nullptr;
thread_local std::vector<std::string>* g_errors = nullptr;
}  // namespace

const std::string* detail::loading_plugin() {
  return g_loading;
}

void detail::defer_plugin_error(std::string message) {
  if (g_errors) g_errors->push_back(std::move(message));
}

std::vector<std::string> load_plugins(const std::vector<std::string>& dirs) {
  namespace fs = std::filesystem;
  std::vector<std::string> loaded;
  for (const auto& d : dirs) {
    std::error_code ec;
    CS_CHECK(fs::exists(d, ec), "plugin path '{}' does not exist{}", d,
             fs::path(d).is_relative() ? fmt::format(" (relative to the working directory '{}')",
                                                     fs::current_path(ec).string())
                                       : std::string());
    const bool file = fs::is_regular_file(d, ec);
    CS_CHECK(file || fs::is_directory(d, ec),
             "plugin path '{}' is neither a shared library (.so) nor a directory", d);
    std::vector<std::string> libs;
    if (file) {
      libs.push_back(d);
    } else {
      for (const auto& e : fs::directory_iterator(d))
        if (e.is_regular_file() && e.path().extension() == ".so") libs.push_back(e.path().string());
    }
    std::sort(libs.begin(), libs.end());
    for (const auto& lib : libs) {
      // RTLD_GLOBAL: a plugin may depend on symbols of a plugin loaded before it.
      std::vector<std::string> errors;
      g_loading = &lib;
      g_errors = &errors;
      void* h = dlopen(lib.c_str(), RTLD_NOW | RTLD_GLOBAL);
      g_loading = nullptr;
      g_errors = nullptr;
      if (!h) cstorch::fail("cannot load plugin '{}': {}", lib, dlerror());
      if (!errors.empty()) cstorch::fail("plugin '{}': {}", lib, fmt::join(errors, "; "));
      loaded.push_back(lib);
    }
  }
  return loaded;
}

}  // namespace modelzoo
