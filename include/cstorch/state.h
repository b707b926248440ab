// cstorch::State: the nested value every state_dict() produces and cstorch::save / load take
// and return — maps (insertion-ordered, string keys), lists, tensors, integers, floats,
// booleans, strings and none. It is PyTorch's nested state dict in C++.
//
// Values have value semantics: copying a State copies its containers; tensors inside are
// handles (a copied State shares the tensors, as a copied Python dict would).
// Accessors check the kind and throw cstorch::Error naming the expected and actual kind and,
// for map lookups, the missing key and the keys that are there.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "cstorch/tensor.h"

namespace cstorch {

class State {
 public:
  enum class Kind { None, Bool, Int, Float, String, Tensor, List, Map };

  State() = default;  // none
  State(std::nullptr_t) {}
  State(bool v) : kind_(Kind::Bool), i_(v) {}
  State(int v) : kind_(Kind::Int), i_(v) {}
  State(int64_t v) : kind_(Kind::Int), i_(v) {}
  State(double v) : kind_(Kind::Float), f_(v) {}
  State(const char* v) : kind_(Kind::String), s_(v) {}
  State(std::string v) : kind_(Kind::String), s_(std::move(v)) {}
  State(Tensor v) : kind_(Kind::Tensor), t_(std::move(v)) {}
  State(std::vector<State> v) : kind_(Kind::List), items_(std::move(v)) {}

  // An empty map / list.
  static State map();
  static State list();
  // A map from key/value pairs, in the given order (a repeated key is an error).
  static State map(std::initializer_list<std::pair<std::string, State>> items);

  Kind kind() const { return kind_; }
  bool is_none() const { return kind_ == Kind::None; }
  bool is_bool() const { return kind_ == Kind::Bool; }
  bool is_int() const { return kind_ == Kind::Int; }
  bool is_float() const { return kind_ == Kind::Float; }
  bool is_number() const { return is_int() || is_float(); }
  bool is_string() const { return kind_ == Kind::String; }
  bool is_tensor() const { return kind_ == Kind::Tensor; }
  bool is_list() const { return kind_ == Kind::List; }
  bool is_map() const { return kind_ == Kind::Map; }

  // Typed reads; a wrong kind is an error. as_double accepts integers; as_int accepts only
  // integers (and booleans are not integers).
  bool as_bool() const;
  int64_t as_int() const;
  double as_double() const;
  const std::string& as_string() const;
  const Tensor& as_tensor() const;

  // Lists and maps: number of entries (an error for other kinds).
  size_t size() const;
  // List element i (bounds-checked) and append.
  const State& operator[](size_t i) const;
  State& operator[](size_t i);
  void push_back(State v);
  const std::vector<State>& items() const;  // list elements, or map values in key order

  // Map access. at() errors name the missing key and list the present keys.
  bool contains(const std::string& key) const;
  const State& at(const std::string& key) const;
  State& at(const std::string& key);
  // Inserts or replaces `key` (a new key goes last).
  State& set(const std::string& key, State v);
  bool erase(const std::string& key);
  const std::vector<std::string>& keys() const;  // map keys in insertion order

  // Structural equality: same kinds, keys in the same order, equal scalars, and tensors with
  // equal shape, dtype and bytes.
  friend bool operator==(const State& a, const State& b);

  // Short human-readable form (tensors as "tensor(f32[2, 3])"), for messages and tests.
  std::string repr() const;

 private:
  void expect(Kind k, const char* what) const;
  Kind kind_ = Kind::None;
  int64_t i_ = 0;
  double f_ = 0;
  std::string s_;
  Tensor t_;
  std::vector<std::string> keys_;  // maps only
  std::vector<State> items_;       // list elements, or map values parallel to keys_
};

const char* kind_name(State::Kind k);

}  // namespace cstorch
