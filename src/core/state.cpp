// cstorch::State: nested state values (see include/cstorch/state.h).
#include "cstorch/state.h"

#include <algorithm>
#include <cstring>

#include "core/internal.h"

namespace cstorch {

const char* kind_name(State::Kind k) {
  switch (k) {
    case State::Kind::None:
      return "none";
    case State::Kind::Bool:
      return "bool";
    case State::Kind::Int:
      return "int";
    case State::Kind::Float:
      return "float";
    case State::Kind::String:
      return "string";
    case State::Kind::Tensor:
      return "tensor";
    case State::Kind::List:
      return "list";
    case State::Kind::Map:
      return "map";
  }
  return "?";
}

State State::map() {
  State s;
  s.kind_ = Kind::Map;
  return s;
}

State State::list() {
  State s;
  s.kind_ = Kind::List;
  return s;
}

State State::map(std::initializer_list<std::pair<std::string, State>> items) {
  State s = map();
  for (const auto& [k, v] : items) {
    CS_CHECK(!s.contains(k), "State::map: key '{}' given twice", k);
    s.set(k, v);
  }
  return s;
}

void State::expect(Kind k, const char* what) const {
  CS_CHECK(kind_ == k, "State::{}: expected a {} value, got {} ({})", what, kind_name(k),
           kind_name(kind_), repr());
}

bool State::as_bool() const {
  expect(Kind::Bool, "as_bool");
  return i_ != 0;
}

int64_t State::as_int() const {
  expect(Kind::Int, "as_int");
  return i_;
}

double State::as_double() const {
  if (kind_ == Kind::Int) return static_cast<double>(i_);
  expect(Kind::Float, "as_double");
  return f_;
}

const std::string& State::as_string() const {
  expect(Kind::String, "as_string");
  return s_;
}

const Tensor& State::as_tensor() const {
  expect(Kind::Tensor, "as_tensor");
  return t_;
}

size_t State::size() const {
  CS_CHECK(kind_ == Kind::List || kind_ == Kind::Map,
           "State::size: expected a list or map value, got {}", kind_name(kind_));
  return items_.size();
}

const State& State::operator[](size_t i) const {
  expect(Kind::List, "operator[]");
  CS_CHECK(i < items_.size(), "State: list index {} out of range (size {})", i, items_.size());
  return items_[i];
}

State& State::operator[](size_t i) {
  expect(Kind::List, "operator[]");
  CS_CHECK(i < items_.size(), "State: list index {} out of range (size {})", i, items_.size());
  return items_[i];
}

void State::push_back(State v) {
  expect(Kind::List, "push_back");
  items_.push_back(std::move(v));
}

const std::vector<State>& State::items() const {
  CS_CHECK(kind_ == Kind::List || kind_ == Kind::Map,
           "State::items: expected a list or map value, got {}", kind_name(kind_));
  return items_;
}

bool State::contains(const std::string& key) const {
  expect(Kind::Map, "contains");
  return std::find(keys_.begin(), keys_.end(), key) != keys_.end();
}

const State& State::at(const std::string& key) const {
  expect(Kind::Map, "at");
  auto it = std::find(keys_.begin(), keys_.end(), key);
  if (it == keys_.end()) {
    fail("State: missing key '{}' (keys: {})", key,
         keys_.empty() ? std::string("none") : fmt::format("{}", fmt::join(keys_, ", ")));
  }
  return items_[static_cast<size_t>(it - keys_.begin())];
}

State& State::at(const std::string& key) {
  return const_cast<State&>(static_cast<const State*>(this)->at(key));
}

State& State::set(const std::string& key, State v) {
  expect(Kind::Map, "set");
  auto it = std::find(keys_.begin(), keys_.end(), key);
  if (it != keys_.end()) {
    State& slot = items_[static_cast<size_t>(it - keys_.begin())];
    slot = std::move(v);
    return slot;
  }
  keys_.push_back(key);
  items_.push_back(std::move(v));
  return items_.back();
}

bool State::erase(const std::string& key) {
  expect(Kind::Map, "erase");
  auto it = std::find(keys_.begin(), keys_.end(), key);
  if (it == keys_.end()) return false;
  size_t i = static_cast<size_t>(it - keys_.begin());
  keys_.erase(it);
  items_.erase(items_.begin() + static_cast<std::ptrdiff_t>(i));
  return true;
}

const std::vector<std::string>& State::keys() const {
  expect(Kind::Map, "keys");
  return keys_;
}

bool operator==(const State& a, const State& b) {
  if (a.kind_ != b.kind_) return false;
  switch (a.kind_) {
    case State::Kind::None:
      return true;
    case State::Kind::Bool:
    case State::Kind::Int:
      return a.i_ == b.i_;
    case State::Kind::Float:
      return a.f_ == b.f_ || (a.f_ != a.f_ && b.f_ != b.f_);
    case State::Kind::String:
      return a.s_ == b.s_;
    case State::Kind::Tensor: {
      const Tensor &x = a.t_, &y = b.t_;
      if (x.defined() != y.defined()) return false;
      if (!x.defined()) return true;
      if (x.shape() != y.shape() || x.dtype() != y.dtype()) return false;
      size_t n = static_cast<size_t>(x.numel()) * itemsize(x.dtype());
      if (n == 0) return true;
      const auto xb = detail::host_bytes(x, "State ==");
      const auto yb = detail::host_bytes(y, "State ==");
      return std::memcmp(xb.data(), yb.data(), n) == 0;
    }
    case State::Kind::List:
    case State::Kind::Map:
      return a.keys_ == b.keys_ && a.items_ == b.items_;
  }
  return false;
}

std::string State::repr() const {
  switch (kind_) {
    case Kind::None:
      return "none";
    case Kind::Bool:
      return i_ ? "true" : "false";
    case Kind::Int:
      return std::to_string(i_);
    case Kind::Float:
      return fmt::format("{}", f_);
    case Kind::String:
      return fmt::format("'{}'", s_);
    case Kind::Tensor:
      if (!t_.defined()) return "tensor(undefined)";
      return fmt::format("tensor({}{})", dtype_name(t_.dtype()), shape_str(t_.shape()));
    case Kind::List: {
      std::vector<std::string> parts;
      for (const auto& v : items_) parts.push_back(v.repr());
      return fmt::format("[{}]", fmt::join(parts, ", "));
    }
    case Kind::Map: {
      std::vector<std::string> parts;
      for (size_t i = 0; i < keys_.size(); ++i)
        parts.push_back(fmt::format("'{}': {}", keys_[i], items_[i].repr()));
      return fmt::format("{{{}}}", fmt::join(parts, ", "));
    }
  }
  return "?";
}

}  // namespace cstorch
