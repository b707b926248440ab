// YAML -> Config (JSON value) conversion through yaml-cpp.
#include "cstorch/config.h"

#include <yaml-cpp/yaml.h>

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <optional>
#include <string_view>
#include <vector>

#include "checkpoint/common.h"  // ckpt::valid_utf8
#include "cstorch/core/error.h"

namespace cstorch {

namespace {
// YAML merge keys (`<<: *defaults`, or a list of aliases): the merged maps' keys are added where
// the map does not give them itself (explicit keys win, the first merged map before later ones),
// as YAML 1.1 readers do. yaml-cpp reads `<<` as a plain key.
void merge_keys(Config& m, const std::string& shown_path, const std::string& where) {
  if (!m.is_object() || !m.contains("<<")) return;
  Config merged = std::move(m["<<"]);
  m.erase("<<");
  auto add = [&](const Config& from) {
    if (!from.is_object())
      fail("{}the merge key (<<) in {} takes a map or a list of maps (`<<: *name`), got {}", where,
           shown_path, from.dump());
    for (const auto& [k, v] : from.items())
      if (!m.contains(k)) m[k] = v;
  };
  if (merged.is_array()) {
    for (const auto& e : merged) add(e);
  } else {
    add(merged);
  }
}

// Limits on what one YAML document may expand to. yaml-cpp resolves an alias (*name) to the
// node it names, shared: a document of a few hundred bytes can describe a graph that expands
// to billions of values, or that contains itself (`x: &a [1, *a]`). The conversion below walks
// that graph without recursion and stops at these limits.
constexpr size_t kMaxConfigDepth = 256;
constexpr size_t kMaxConfigValues = 1000000;

// YAML's spellings of infinity and NaN: `.inf`, `.Inf`, `.INF` with an optional sign, and
// `.nan`, `.NaN`, `.NAN` (YAML's core schema reads them as floats). strtod does not read them,
// and `lr: .inf` means the number: read as a string it would be refused as "expected a number"
// instead of by the range check that names the value.
std::optional<double> yaml_special_float(const std::string& s) {
  std::string_view v = s;
  const bool negative = !v.empty() && v.front() == '-';
  const bool sign = !v.empty() && (v.front() == '-' || v.front() == '+');
  std::string_view body = sign ? v.substr(1) : v;
  if (body == ".inf" || body == ".Inf" || body == ".INF")
    return negative ? -std::numeric_limits<double>::infinity()
                    : std::numeric_limits<double>::infinity();
  if (!sign && (body == ".nan" || body == ".NaN" || body == ".NAN"))
    return std::numeric_limits<double>::quiet_NaN();
  return std::nullopt;
}

}  // namespace

std::string config_text(const Config& v) {
  if (v.is_number_float() && !std::isfinite(v.get<double>())) {
    const double d = v.get<double>();
    return std::isnan(d) ? ".nan" : d > 0 ? ".inf" : "-.inf";
  }
  return v.dump(-1, ' ', false, Config::error_handler_t::replace);
}

namespace {

// A plain scalar as a number when all of it is one (strtoll / strtod, as std::stoll / std::stod
// read them, without the cost of an exception per non-number).
Config scalar(const YAML::Node& n) {
  const std::string& s = n.Scalar();
  if (n.Tag() == "!") return s;  // quoted: always a string
  if (s == "true" || s == "True" || s == "TRUE") return true;
  if (s == "false" || s == "False" || s == "FALSE") return false;
  if (s == "null" || s == "~" || s.empty()) return s.empty() ? Config(s) : Config(nullptr);
  if (auto special = yaml_special_float(s)) return *special;
  const char* b = s.c_str();
  char* end = nullptr;
  errno = 0;
  long long i = std::strtoll(b, &end, 10);
  if (end != b && errno == 0 && static_cast<size_t>(end - b) == s.size()) return i;
  errno = 0;
  double d = std::strtod(b, &end);
  if (end != b && errno == 0 && static_cast<size_t>(end - b) == s.size()) return d;
  return s;
}

// The key path of a value for messages ("trainer.init.loggers[0]"), shortened when very long.
std::string show_path(const std::string& p) {
  if (p.empty()) return "the top level";
  if (p.size() <= 160) return "'" + p + "'";
  return "'" + p.substr(0, 70) + " ... " + p.substr(p.size() - 70) + "'";
}

// `where`: "config: FILE: " or "config: ", the start of every message.
Config convert(const YAML::Node& top, const std::string& where) {
  struct Frame {
    YAML::Node node;
    Config value;
    YAML::const_iterator it, end;
    std::string key;  // the key under the parent map (unused under a list)
    size_t path_len;  // length of `path` without this frame's own component
  };
  size_t values = 0;
  std::string path;
  std::vector<Frame> stack;
  // Converts `n` (at `path`): a scalar becomes `out` at once, a container is pushed as a frame
  // whose value is filled as its children finish.
  auto visit = [&](const YAML::Node& n, Config& out, std::string key, size_t path_len) -> bool {
    if (++values > kMaxConfigValues)
      fail(
          "{}expands to more than {} values (the limit) at {}: YAML aliases (*name) repeat "
          "large parts of the document?",
          where, kMaxConfigValues, show_path(path));
    switch (n.Type()) {
      case YAML::NodeType::Sequence:
      case YAML::NodeType::Map:
        if (stack.size() >= kMaxConfigDepth)
          fail(
              "{}{} is nested deeper than {} levels (the limit): an alias that refers to a "
              "node containing it, e.g. `x: &a [1, *a]`?",
              where, show_path(path), kMaxConfigDepth);
        stack.push_back(Frame{n, n.IsMap() ? Config::object() : Config::array(), n.begin(), n.end(),
                              std::move(key), path_len});
        return true;
      case YAML::NodeType::Scalar:
        // A Config is JSON: its strings must be UTF-8 (writing one out, e.g. into a run
        // record or an error message, fails otherwise). yaml-cpp passes other bytes through.
        if (!ckpt::valid_utf8(n.Scalar()))
          fail("{}the value at {} (line {}) is not valid UTF-8 text", where, show_path(path),
               n.Mark().line + 1);
        out = scalar(n);
        return false;
      case YAML::NodeType::Null:
      case YAML::NodeType::Undefined:
        out = nullptr;
        return false;
    }
    return false;
  };
  Config result;
  visit(top, result, "", 0);
  while (!stack.empty()) {
    Frame& f = stack.back();
    if (f.it == f.end) {
      // Done: hand the value to the parent (or the result).
      Frame done = std::move(stack.back());
      stack.pop_back();
      merge_keys(done.value, show_path(path), where);
      path.resize(done.path_len);
      if (stack.empty()) {
        result = std::move(done.value);
      } else if (stack.back().value.is_array()) {
        stack.back().value.push_back(std::move(done.value));
      } else {
        stack.back().value[done.key] = std::move(done.value);
      }
      continue;
    }
    const size_t len = path.size();
    const bool map = f.node.IsMap();
    std::string key;
    if (map) {
      key = f.it->first.as<std::string>();
      if (!ckpt::valid_utf8(key))
        fail("{}a key under {} (line {}) is not valid UTF-8 text", where, show_path(path),
             f.it->first.Mark().line + 1);
      path += (path.empty() ? "" : ".") + key;
      // YAML readers keep one of the two values without a word (yaml-cpp the first, PyYAML the
      // last): a key written twice is a mistake either way.
      if (f.value.contains(key))
        fail("{}{} is given twice (again at line {}): a key appears once in a map", where,
             show_path(path), f.it->first.Mark().line + 1);
    } else {
      path += "[" + std::to_string(f.value.size()) + "]";
    }
    // (A YAML::Node is a reference: copy-construct it; assigning would write the node.)
    const YAML::Node child = map ? YAML::Node(f.it->second) : YAML::Node(*f.it);
    ++f.it;
    Config leaf;
    if (visit(child, leaf, key, len)) continue;  // `f` may be invalid now: the stack grew
    Frame& parent = stack.back();
    if (parent.value.is_array())
      parent.value.push_back(std::move(leaf));
    else
      parent.value[key] = std::move(leaf);
    path.resize(len);
  }
  return result;
}

}  // namespace

std::string ascii_lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

Config parse_config(const std::string& text) {
  try {
    return convert(YAML::Load(text), "config: ");
  } catch (const YAML::Exception& e) {
    fail("config: cannot parse (line {}, column {}): {}", e.mark.line + 1, e.mark.column + 1,
         e.msg);
  }
}

Config load_config_file(const std::string& path) {
  std::error_code ec;
  CS_CHECK(!std::filesystem::is_directory(path, ec), "config: '{}' is a directory, not a YAML file",
           path);
  try {
    return convert(YAML::LoadFile(path), "config: " + path + ": ");
  } catch (const YAML::BadFile&) {
    fail("config: cannot open '{}'", path);
  } catch (const YAML::Exception& e) {
    fail("config: {}: line {}, column {}: {}", path, e.mark.line + 1, e.mark.column + 1, e.msg);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {  // a read error of the stream
    fail("config: cannot read '{}': {}", path, e.what());
  }
}

}  // namespace cstorch
