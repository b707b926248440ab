// Config: nested configuration values (maps, lists, numbers, strings, booleans) as JSON
// values; parse_config reads YAML (a superset of JSON), e.g. "{scheduler: CosineDecay, lr: 0.1}".
#pragma once
#include <string>

#include <nlohmann/json.hpp>

namespace cstorch {
using Config = nlohmann::json;
// Parses YAML or JSON text; errors name the line and column.
Config parse_config(const std::string& text);
// Reads a YAML or JSON file; errors name the file.
Config load_config_file(const std::string& path);
// A value's text for messages and written configs: JSON's (dump(); invalid UTF-8 in a string shown
// as U+FFFD), except infinite and NaN numbers, which JSON has no text for (dump() writes null):
// those in YAML's spelling, .inf, -.inf and .nan, which parse_config reads back as the same value.
std::string config_text(const Config& v);
// `s` with ASCII letters lower-cased: names in configs (optimizers, schedulers, registered
// components, device types) are matched case-insensitively through it.
std::string ascii_lower(std::string s);
}  // namespace cstorch
