// configure_optimizer: build an optimizer from a name and a map of arguments.
#include <algorithm>
#include <cctype>
#include <functional>
#include <set>

#include "core/internal.h"
#include "cstorch/optim/optimizer.h"

namespace cstorch::optim {

namespace {
std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

struct Arg {
  const Config& c;
  std::set<std::string>& used;
  double num(const std::string& k, double def) {
    used.insert(k);
    if (!c.contains(k)) return def;
    const auto& v = c.at(k);
    if (v.is_boolean()) return v.get<bool>() ? 1 : 0;
    CS_CHECK(v.is_number(), "configure_optimizer: '{}' must be a number, got {}", k, v.dump());
    return v.get<double>();
  }
  bool flag(const std::string& k, bool def) { return num(k, def ? 1 : 0) != 0; }
  std::pair<double, double> betas(double d1, double d2) {
    used.insert("betas");
    if (c.contains("betas")) {
      const auto& b = c.at("betas");
      CS_CHECK(b.is_array() && b.size() == 2,
               "configure_optimizer: 'betas' must be a list of two numbers");
      return {b[0].get<double>(), b[1].get<double>()};
    }
    return {num("beta1", d1), num("beta2", d2)};
  }
};

using Factory = std::function<std::unique_ptr<Optimizer>(std::vector<Tensor>, Arg&)>;
const std::vector<std::pair<std::string, Factory>>& factories() {
  static const std::vector<std::pair<std::string, Factory>> f = {
      {"SGD",
       [](std::vector<Tensor> p, Arg& a) {
         return std::make_unique<SGD>(std::move(p), a.num("lr", 0.001), a.num("momentum", 0),
                                      a.num("dampening", 0), a.num("weight_decay", 0),
                                      a.flag("nesterov", false), a.flag("maximize", false));
       }},
      {"AdamW",
       [](std::vector<Tensor> p, Arg& a) {
         auto [b1, b2] = a.betas(0.9, 0.999);
         return std::make_unique<AdamW>(std::move(p), a.num("lr", 0.001), b1, b2,
                                        a.num("eps", 1e-8), a.num("weight_decay", 0.01),
                                        a.flag("amsgrad", false), a.flag("maximize", false));
       }},
  };
  return f;
}
}  // namespace

std::vector<std::string> optimizer_names() {
  std::vector<std::string> r;
  for (auto& [n, f] : factories()) r.push_back(n);
  return r;
}

std::unique_ptr<Optimizer> configure_optimizer(const std::string& type, std::vector<Tensor> params,
                                               const Config& args_in) {
  Config args = args_in.is_null() ? Config::object() : args_in;
  CS_CHECK(args.is_object(), "configure_optimizer: arguments must be a map, got {}", args.dump());
  if (args.contains("learning_rate")) {
    CS_CHECK(!args.contains("lr"),
             "configure_optimizer: give either 'lr' or its alias 'learning_rate', not both");
    args["lr"] = args["learning_rate"];
    args.erase("learning_rate");
  }
  for (auto& [name, make] : factories()) {
    if (lower(name) != lower(type)) continue;
    std::set<std::string> used;
    Arg a{args, used};
    auto opt = make(std::move(params), a);
    std::vector<std::string> unknown;
    for (auto& [k, v] : args.items())
      if (!used.count(k)) unknown.push_back(k);
    if (!unknown.empty())
      fmt::print(stderr, "warning: configure_optimizer({}): ignoring unknown arguments: {}\n", name,
                 fmt::join(unknown, ", "));
    return opt;
  }
  fail("configure_optimizer: unknown optimizer type '{}'; valid types: {}", type,
       fmt::join(optimizer_names(), ", "));
}

}  // namespace cstorch::optim
