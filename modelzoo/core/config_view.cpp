// ConfigView: typed config reads with key-path errors.
#include "modelzoo/config_view.h"

#include <cmath>

#include "cstorch/core/error.h"

namespace modelzoo {

std::string short_repr(const Config& c) {
  // (Invalid UTF-8 in a string, possible in a Config made in code, is shown as U+FFFD rather
  // than making the message itself fail; infinity and NaN in YAML's spelling.)
  std::string s = cstorch::config_text(c);
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

static const char* type_word(const Config& c) {
  if (c.is_null()) return "null";
  if (c.is_boolean()) return "a boolean";
  if (c.is_number_integer()) return "an integer";
  if (c.is_number()) return "a number";
  if (c.is_string()) return "a string";
  if (c.is_array()) return "a list";
  return "a map";
}

void ConfigView::error(const std::string& msg) const {
  cstorch::fail("{}: {}", path_.empty() ? std::string("<config>") : path_, msg);
}

std::string ConfigView::child_path(const std::string& key) const {
  return path_.empty() ? key : path_ + "." + key;
}

bool ConfigView::has(const std::string& key) const {
  return c_->is_object() && c_->contains(key) && !c_->at(key).is_null();
}

void ConfigView::expect_map() const {
  if (!c_->is_object()) error(fmt::format("expected a map, got {}", short_repr(*c_)));
}

void ConfigView::expect_list() const {
  if (!c_->is_array()) error(fmt::format("expected a list, got {}", short_repr(*c_)));
}

ConfigView ConfigView::at(const std::string& key) const {
  expect_map();
  if (!c_->contains(key)) cstorch::fail("{}: missing required key", child_path(key));
  return ConfigView(c_->at(key), child_path(key));
}

ConfigView ConfigView::at(size_t i) const {
  expect_list();
  if (i >= c_->size()) error(fmt::format("index {} out of range (size {})", i, c_->size()));
  return ConfigView((*c_)[i], fmt::format("{}[{}]", path_, i));
}

size_t ConfigView::size() const {
  expect_list();
  return c_->size();
}

void ConfigView::check_keys(const std::vector<std::string>& allowed) const {
  if (c_->is_null()) return;
  expect_map();
  for (const auto& [k, v] : c_->items()) {
    bool ok = false;
    for (const auto& a : allowed) ok = ok || a == k;
    if (!ok)
      cstorch::fail("{}: unknown key (valid keys: {})", child_path(k), fmt::join(allowed, ", "));
  }
}

int64_t ConfigView::as_int() const {
  if (c_->is_number_integer()) return c_->get<int64_t>();
  if (c_->is_number_float()) {
    double d = c_->get<double>();
    if (std::floor(d) == d && std::abs(d) < 9e15) return static_cast<int64_t>(d);
  }
  error(fmt::format("expected an integer, got {}", short_repr(*c_)));
}

double ConfigView::as_double() const {
  if (c_->is_number()) return c_->get<double>();
  error(fmt::format("expected a number, got {}", short_repr(*c_)));
}

bool ConfigView::as_bool() const {
  if (c_->is_boolean()) return c_->get<bool>();
  error(fmt::format("expected true or false, got {}", short_repr(*c_)));
}

std::string ConfigView::as_string() const {
  if (c_->is_string()) return c_->get<std::string>();
  error(fmt::format("expected a string, got {} ({})", type_word(*c_), short_repr(*c_)));
}

std::vector<std::string> ConfigView::as_string_list() const {
  if (c_->is_string()) return {c_->get<std::string>()};
  std::vector<std::string> r;
  for (size_t i = 0; i < size(); ++i) r.push_back(at(i).as_string());
  return r;
}

int64_t ConfigView::get_int(const std::string& key, int64_t def) const {
  return has(key) ? at(key).as_int() : def;
}
std::optional<int64_t> ConfigView::get_opt_int(const std::string& key) const {
  if (!has(key)) return std::nullopt;
  return at(key).as_int();
}
double ConfigView::get_double(const std::string& key, double def) const {
  return has(key) ? at(key).as_double() : def;
}
bool ConfigView::get_bool(const std::string& key, bool def) const {
  return has(key) ? at(key).as_bool() : def;
}
std::string ConfigView::get_string(const std::string& key, const std::string& def) const {
  return has(key) ? at(key).as_string() : def;
}

std::pair<std::string, Config> ConfigView::named_entry() const {
  if (c_->is_string()) return {c_->get<std::string>(), Config::object()};
  if (!c_->is_object() || c_->size() != 1)
    error(fmt::format("expected one entry of the form {{Name: {{arguments}}}}, got {}",
                      short_repr(*c_)));
  auto it = c_->begin();
  Config args = it.value().is_null() ? Config::object() : it.value();
  if (!args.is_object())
    cstorch::fail("{}: arguments must be a map, got {}", child_path(it.key()), short_repr(args));
  return {it.key(), args};
}

}  // namespace modelzoo
