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
// `s` with ASCII letters lower-cased: names in configs (optimizers, schedulers, registered
// components, device types) are matched case-insensitively through it.
std::string ascii_lower(std::string s);
}  // namespace cstorch
