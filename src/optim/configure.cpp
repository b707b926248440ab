// configure_optimizer: build an optimizer from a name and a map of arguments.
#include <algorithm>
#include <cctype>
#include <functional>
#include <optional>
#include <set>

#include "core/internal.h"
#include "cstorch/optim/optimizer.h"

namespace cstorch::optim {

namespace {

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
  // A switch: true / false (or 1 / 0). Another number was taken as true, and a string was
  // called "not a number".
  bool flag(const std::string& k, bool def) {
    used.insert(k);
    if (!c.contains(k)) return def;
    const auto& v = c.at(k);
    if (v.is_boolean()) return v.get<bool>();
    CS_CHECK(v.is_number() && (v.get<double>() == 0 || v.get<double>() == 1),
             "configure_optimizer: '{}' must be true or false, got {}", k, v.dump());
    return v.get<double>() != 0;
  }
  // A pair given as a two-element list `key` or as two scalar keys k1, k2.
  std::pair<double, double> pair(const std::string& key, const std::string& k1, double d1,
                                 const std::string& k2, double d2) {
    used.insert(key);
    if (c.contains(key)) {
      const auto& b = c.at(key);
      CS_CHECK(b.is_array() && b.size() == 2 && b[0].is_number() && b[1].is_number(),
               "configure_optimizer: '{}' must be a list of two numbers, got {}", key, b.dump());
      CS_CHECK(!c.contains(k1) && !c.contains(k2),
               "configure_optimizer: give either '{}' or '{}'/'{}', not both", key, k1, k2);
      return {b[0].get<double>(), b[1].get<double>()};
    }
    return {num(k1, d1), num(k2, d2)};
  }
  std::pair<double, double> betas(double d1, double d2) {
    return pair("betas", "beta1", d1, "beta2", d2);
  }
  std::optional<double> opt_num(const std::string& k) {
    used.insert(k);
    if (!c.contains(k) || c.at(k).is_null()) return std::nullopt;
    return num(k, 0);
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
      {"Adam",
       [](std::vector<Tensor> p, Arg& a) {
         auto [b1, b2] = a.betas(0.9, 0.999);
         return std::make_unique<Adam>(std::move(p), a.num("lr", 0.001), b1, b2, a.num("eps", 1e-8),
                                       a.num("weight_decay", 0), a.flag("amsgrad", false),
                                       a.flag("maximize", false));
       }},
      {"AdamW",
       [](std::vector<Tensor> p, Arg& a) {
         auto [b1, b2] = a.betas(0.9, 0.999);
         return std::make_unique<AdamW>(std::move(p), a.num("lr", 0.001), b1, b2,
                                        a.num("eps", 1e-8), a.num("weight_decay", 0.01),
                                        a.flag("amsgrad", false), a.flag("maximize", false));
       }},
      {"Adadelta",
       [](std::vector<Tensor> p, Arg& a) {
         return std::make_unique<Adadelta>(std::move(p), a.num("lr", 1.0), a.num("rho", 0.9),
                                           a.num("eps", 1e-6), a.num("weight_decay", 0),
                                           a.flag("maximize", false));
       }},
      {"Adafactor",
       [](std::vector<Tensor> p, Arg& a) {
         auto [e1, e2] = a.pair("eps", "eps1", 1e-30, "eps2", 1e-3);
         auto lr = a.opt_num("lr");
         bool rel = a.flag("relative_step", !lr.has_value());
         return std::make_unique<Adafactor>(
             std::move(p), lr, e1, e2, a.num("clip_threshold", 1.0), a.num("decay_rate", -0.8),
             a.opt_num("beta1"), a.num("weight_decay", 0), a.flag("scale_parameter", true), rel,
             a.flag("warmup_init", false));
       }},
      {"Adagrad",
       [](std::vector<Tensor> p, Arg& a) {
         return std::make_unique<Adagrad>(
             std::move(p), a.num("lr", 1e-2), a.num("lr_decay", 0), a.num("weight_decay", 0),
             a.num("initial_accumulator_value", 0), a.num("eps", 1e-10), a.flag("maximize", false));
       }},
      {"Adamax",
       [](std::vector<Tensor> p, Arg& a) {
         auto [b1, b2] = a.betas(0.9, 0.999);
         return std::make_unique<Adamax>(std::move(p), a.num("lr", 2e-3), b1, b2,
                                         a.num("eps", 1e-8), a.num("weight_decay", 0),
                                         a.flag("maximize", false));
       }},
      {"ASGD",
       [](std::vector<Tensor> p, Arg& a) {
         return std::make_unique<ASGD>(std::move(p), a.num("lr", 1e-2), a.num("lambd", 1e-4),
                                       a.num("alpha", 0.75), a.num("t0", 1e6),
                                       a.num("weight_decay", 0), a.flag("maximize", false));
       }},
      {"Lamb",
       [](std::vector<Tensor> p, Arg& a) {
         auto [b1, b2] = a.betas(0.9, 0.999);
         return std::make_unique<Lamb>(std::move(p), a.num("lr", 1e-3), b1, b2, a.num("eps", 1e-6),
                                       a.num("weight_decay", 0), a.flag("adam", false));
       }},
      {"Lion",
       [](std::vector<Tensor> p, Arg& a) {
         auto [b1, b2] = a.betas(0.9, 0.99);
         return std::make_unique<Lion>(std::move(p), a.num("lr", 1e-4), b1, b2,
                                       a.num("weight_decay", 0));
       }},
      {"NAdam",
       [](std::vector<Tensor> p, Arg& a) {
         auto [b1, b2] = a.betas(0.9, 0.999);
         return std::make_unique<NAdam>(std::move(p), a.num("lr", 2e-3), b1, b2, a.num("eps", 1e-8),
                                        a.num("weight_decay", 0), a.num("momentum_decay", 4e-3));
       }},
      {"RAdam",
       [](std::vector<Tensor> p, Arg& a) {
         auto [b1, b2] = a.betas(0.9, 0.999);
         return std::make_unique<RAdam>(std::move(p), a.num("lr", 1e-3), b1, b2, a.num("eps", 1e-8),
                                        a.num("weight_decay", 0));
       }},
      {"RMSprop",
       [](std::vector<Tensor> p, Arg& a) {
         return std::make_unique<RMSprop>(std::move(p), a.num("lr", 1e-2), a.num("alpha", 0.99),
                                          a.num("eps", 1e-8), a.num("weight_decay", 0),
                                          a.num("momentum", 0), a.flag("centered", false),
                                          a.flag("maximize", false));
       }},
      {"Rprop",
       [](std::vector<Tensor> p, Arg& a) {
         auto [em, ep] = a.pair("etas", "etaminus", 0.5, "etaplus", 1.2);
         auto [smin, smax] = a.pair("step_sizes", "step_size_min", 1e-6, "step_size_max", 50);
         return std::make_unique<Rprop>(std::move(p), a.num("lr", 1e-2), em, ep, smin, smax,
                                        a.flag("maximize", false));
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
    if (ascii_lower(name) != ascii_lower(type)) continue;
    std::set<std::string> used;
    Arg a{args, used};
    auto opt = make(std::move(params), a);
    std::vector<std::string> unknown;
    for (auto& [k, v] : args.items())
      if (!used.count(k)) unknown.push_back(k);
    // A misspelt argument would silently train with its default: an error, as for every key.
    if (!unknown.empty()) {
      used.insert("learning_rate");
      fail("configure_optimizer({}): unknown argument{} '{}'; valid arguments: {}", name,
           unknown.size() > 1 ? "s" : "", fmt::join(unknown, "', '"), fmt::join(used, ", "));
    }
    return opt;
  }
  fail("configure_optimizer: unknown optimizer type '{}'; valid types: {}", type,
       fmt::join(optimizer_names(), ", "));
}

}  // namespace cstorch::optim
