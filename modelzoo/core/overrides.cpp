// Command-line overrides (KEY.PATH=VALUE), YAML output of a Config, and the resolved config of
// the current cszoo command.
#include "modelzoo/overrides.h"

#include <yaml-cpp/yaml.h>

#include <optional>

#include "cstorch/core/error.h"
#include "modelzoo/config_view.h"

namespace modelzoo {

namespace {

bool is_index(const std::string& s) {
  if (s.empty() || s.size() > 9) return false;
  for (char ch : s)
    if (ch < '0' || ch > '9') return false;
  return true;
}

}  // namespace

std::string ConfigOverride::key_path() const {
  std::string r;
  for (const auto& p : path) {
    if (is_index(p))
      r += "[" + p + "]";
    else
      r += (r.empty() ? "" : ".") + p;
  }
  return r;
}

ConfigOverride parse_override(const std::string& arg) {
  const auto eq = arg.find('=');
  if (eq == std::string::npos)
    cstorch::fail(
        "override '{}': expected KEY.PATH=VALUE (e.g. trainer.init.loop.max_steps=50); a "
        "command takes one config file, then overrides",
        arg);
  ConfigOverride o;
  o.text = arg;
  const std::string key = arg.substr(0, eq);
  if (key.empty()) cstorch::fail("override '{}': the key path before '=' is empty", arg);
  size_t start = 0;
  while (true) {
    const auto dot = key.find('.', start);
    std::string comp =
        key.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (comp.empty())
      cstorch::fail("override '{}': the key path '{}' has an empty component", arg, key);
    o.path.push_back(comp);
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  try {
    o.value = cstorch::parse_config(arg.substr(eq + 1));
  } catch (const cstorch::Error& e) {
    cstorch::fail("override '{}': the value is not valid YAML: {}", arg, e.what());
  }
  return o;
}

void apply_override(Config& root, const ConfigOverride& o) {
  Config* node = &root;
  std::string where;  // the key path walked so far, as errors write it
  for (const auto& comp : o.path) {
    if (node->is_array()) {
      if (!is_index(comp))
        cstorch::fail("override '{}': {} is a list; '{}' is not an index (0, 1, ...)", o.text,
                      where, comp);
      const size_t i = std::stoul(comp);
      if (i >= node->size())
        cstorch::fail("override '{}': {}: index {} is out of range (the list has {} entr{})",
                      o.text, where, i, node->size(), node->size() == 1 ? "y" : "ies");
      node = &(*node)[i];
      where += "[" + comp + "]";
      continue;
    }
    if (node->is_null()) *node = Config::object();
    if (!node->is_object())
      cstorch::fail("override '{}': {} is {}, not a map, so it has no key '{}'", o.text,
                    where.empty() ? std::string("the top level") : where, short_repr(*node), comp);
    // A number indexes a list; on a map without such a key it was meant for a list the config
    // does not have there (trainer.0.init.seed on a config of one trainer phase), and creating
    // the key would only move the error to the config check, under a key the user never wrote.
    if (is_index(comp) && !node->contains(comp)) {
      std::vector<std::string> keys;
      for (const auto& [k, v] : node->items()) keys.push_back(k);
      cstorch::fail(
          "override '{}': {} is a map, not a list, so '{}' does not index it{}", o.text,
          where.empty() ? std::string("the top level") : where, comp,
          keys.empty() ? std::string() : fmt::format("; its keys: {}", fmt::join(keys, ", ")));
    }
    node = &(*node)[comp];
    where += (where.empty() ? "" : ".") + comp;
  }
  *node = o.value;
}

namespace {

// Whether a string would read back as something else (a number, a boolean, null) or not at
// all when written as a plain scalar.
bool needs_quotes(const std::string& s) {
  if (s.empty()) return true;
  try {
    Config back = cstorch::parse_config(s);
    return !(back.is_string() && back.get<std::string>() == s);
  } catch (const cstorch::Error&) {
    return true;
  }
}

void emit(YAML::Emitter& e, const Config& c) {
  if (c.is_object()) {
    e << YAML::BeginMap;
    for (const auto& [k, v] : c.items()) {
      e << YAML::Key;
      if (needs_quotes(k)) e << YAML::DoubleQuoted;
      e << k << YAML::Value;
      emit(e, v);
    }
    e << YAML::EndMap;
  } else if (c.is_array()) {
    e << YAML::BeginSeq;
    for (const auto& v : c) emit(e, v);
    e << YAML::EndSeq;
  } else if (c.is_string()) {
    const auto& s = c.get_ref<const std::string&>();
    if (needs_quotes(s)) e << YAML::DoubleQuoted;
    e << s;
  } else if (c.is_null()) {
    e << YAML::Null;
  } else if (c.is_boolean()) {
    e << (c.get<bool>() ? "true" : "false");
  } else {
    // A number's text reads back as the same number (a double keeps its '.0'; infinity and NaN
    // in YAML's spelling).
    e << cstorch::config_text(c);
  }
}

std::optional<ResolvedRunConfig>& resolved() {
  static std::optional<ResolvedRunConfig> r;
  return r;
}

}  // namespace

std::string to_yaml(const Config& c) {
  YAML::Emitter e;
  emit(e, c);
  std::string s = e.c_str();
  if (s.empty() || s.back() != '\n') s += '\n';
  return s;
}

const ResolvedRunConfig* resolved_run_config() {
  return resolved() ? &*resolved() : nullptr;
}

void set_resolved_run_config(ResolvedRunConfig r) {
  resolved() = std::move(r);
}

}  // namespace modelzoo
