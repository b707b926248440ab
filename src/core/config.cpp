// YAML -> Config (JSON value) conversion through yaml-cpp.
#include "cstorch/config.h"

#include <yaml-cpp/yaml.h>

#include <cctype>

#include "cstorch/core/error.h"

namespace cstorch {

static Config convert(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined:
      return nullptr;
    case YAML::NodeType::Sequence: {
      Config a = Config::array();
      for (const auto& x : n) a.push_back(convert(x));
      return a;
    }
    case YAML::NodeType::Map: {
      Config o = Config::object();
      for (const auto& kv : n) o[kv.first.as<std::string>()] = convert(kv.second);
      return o;
    }
    case YAML::NodeType::Scalar: {
      const std::string& s = n.Scalar();
      if (n.Tag() == "!") return s;  // quoted: always a string
      if (s == "true" || s == "True" || s == "TRUE") return true;
      if (s == "false" || s == "False" || s == "FALSE") return false;
      if (s == "null" || s == "~" || s.empty()) return s.empty() ? Config(s) : Config(nullptr);
      try {
        size_t pos = 0;
        long long i = std::stoll(s, &pos, 10);
        if (pos == s.size()) return i;
      } catch (...) {
      }
      try {
        size_t pos = 0;
        double d = std::stod(s, &pos);
        if (pos == s.size()) return d;
      } catch (...) {
      }
      return s;
    }
  }
  return nullptr;
}

std::string ascii_lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

Config parse_config(const std::string& text) {
  try {
    return convert(YAML::Load(text));
  } catch (const YAML::Exception& e) {
    fail("config: cannot parse (line {}, column {}): {}", e.mark.line + 1, e.mark.column + 1,
         e.msg);
  }
}

Config load_config_file(const std::string& path) {
  try {
    return convert(YAML::LoadFile(path));
  } catch (const YAML::BadFile&) {
    fail("config: cannot open '{}'", path);
  } catch (const YAML::Exception& e) {
    fail("config: {}: line {}, column {}: {}", path, e.mark.line + 1, e.mark.column + 1, e.msg);
  }
}

}  // namespace cstorch
