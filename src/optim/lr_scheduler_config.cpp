// configure_lr_scheduler: a scheduler (or a SequentialLR / ChainedLR of several) from
// configuration, with the number / map / list rules and errors for unknown names, unknown keys
// and old aliases.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <functional>
#include <map>
#include <set>
#include <type_traits>

#include "core/internal.h"
#include "cstorch/optim/lr_scheduler.h"

namespace cstorch::optim {

using namespace lr_scheduler;

namespace {

// A whole number an int64_t holds exactly: an integer, or a float such as 10.0 (an infinite or
// out-of-range float would make the conversion undefined).
bool is_whole(const Config& v) {
  if (v.is_number_integer()) return true;
  if (!v.is_number()) return false;
  const double d = v.get<double>();
  return std::isfinite(d) && d == std::floor(d) && std::abs(d) < 9e15;
}
int64_t whole(const Config& v) {
  return v.is_number_integer() ? v.get<int64_t>() : static_cast<int64_t>(v.get<double>());
}

// Reads the arguments of one scheduler entry; `where` names the entry in errors.
struct Args {
  const Config& c;
  std::string where;
  std::string prefix;  // "configure_lr_scheduler: ", or empty when `where` is a config key path
  const Config& get(const std::string& k) const {
    CS_CHECK(c.contains(k), "{}{}: missing required key '{}'", prefix, where, k);
    return c.at(k);
  }
  double number(const std::string& k) const {
    const auto& v = get(k);
    CS_CHECK(v.is_number(), "{}{}.{}: expected a number, got {}", prefix, where, k, config_text(v));
    return v.get<double>();
  }
  double number(const std::string& k, double def) const { return c.contains(k) ? number(k) : def; }
  int64_t integer(const std::string& k) const {
    const auto& v = get(k);
    CS_CHECK(is_whole(v), "{}{}.{}: expected an integer, got {}", prefix, where, k, config_text(v));
    return whole(v);
  }
  int64_t integer(const std::string& k, int64_t def) const {
    return c.contains(k) ? integer(k) : def;
  }
  std::optional<int64_t> opt_integer(const std::string& k) const {
    if (!c.contains(k) || c.at(k).is_null()) return std::nullopt;
    return integer(k);
  }
  bool flag(const std::string& k, bool def) const {
    if (!c.contains(k)) return def;
    const auto& v = c.at(k);
    CS_CHECK(v.is_boolean(), "{}{}.{}: expected true or false, got {}", prefix, where, k,
             config_text(v));
    return v.get<bool>();
  }
  std::string text(const std::string& k, const std::string& def) const {
    if (!c.contains(k)) return def;
    const auto& v = c.at(k);
    CS_CHECK(v.is_string(), "{}{}.{}: expected a string, got {}", prefix, where, k, config_text(v));
    return v.get<std::string>();
  }
  template <class T>
  std::vector<T> list(const std::string& k) const {
    const auto& v = get(k);
    CS_CHECK(v.is_array(), "{}{}.{}: expected a list, got {}", prefix, where, k, config_text(v));
    std::vector<T> r;
    for (const auto& e : v) {
      if constexpr (std::is_integral_v<T>) {
        CS_CHECK(is_whole(e), "{}{}.{}: expected integers, got {}", prefix, where, k,
                 config_text(e));
        r.push_back(whole(e));
      } else {
        CS_CHECK(e.is_number(), "{}{}.{}: expected numbers, got {}", prefix, where, k,
                 config_text(e));
        r.push_back(e.get<T>());
      }
    }
    return r;
  }
};

struct Spec {
  std::vector<std::string> keys;  // accepted keys (besides scheduler, param_group_key, ...)
  std::function<SchedulerPtr(Target, const Args&)> make;
};

const std::vector<std::pair<std::string, Spec>>& specs() {
  static const std::vector<std::pair<std::string, Spec>> s = {
      {"ConstantLR",
       {{"learning_rate", "total_iters"},
        [](Target t, const Args& a) {
          return std::make_shared<ConstantLR>(t, a.number("learning_rate"),
                                              a.opt_integer("total_iters"));
        }}},
      {"PolynomialLR",
       {{"initial_learning_rate", "end_learning_rate", "total_iters", "power", "cycle"},
        [](Target t, const Args& a) {
          return std::make_shared<PolynomialLR>(
              t, a.number("initial_learning_rate"), a.number("end_learning_rate"),
              a.integer("total_iters"), a.number("power", 1.0), a.flag("cycle", false));
        }}},
      {"LinearLR",
       {{"initial_learning_rate", "end_learning_rate", "total_iters"},
        [](Target t, const Args& a) {
          return std::make_shared<LinearLR>(t, a.number("initial_learning_rate"),
                                            a.number("end_learning_rate"),
                                            a.integer("total_iters"));
        }}},
      {"ExponentialLR",
       {{"initial_learning_rate", "total_iters", "decay_rate", "staircase"},
        [](Target t, const Args& a) {
          return std::make_shared<ExponentialLR>(t, a.number("initial_learning_rate"),
                                                 a.integer("total_iters"), a.number("decay_rate"),
                                                 a.flag("staircase", false));
        }}},
      {"InverseExponentialTimeDecayLR",
       {{"initial_learning_rate", "step_exponent", "total_iters", "decay_rate", "staircase"},
        [](Target t, const Args& a) {
          return std::make_shared<InverseExponentialTimeDecayLR>(
              t, a.number("initial_learning_rate"), a.number("step_exponent"),
              a.integer("total_iters"), a.number("decay_rate"), a.flag("staircase", false));
        }}},
      {"InverseSquareRootDecayLR",
       {{"initial_learning_rate", "scale", "warmup_steps"},
        [](Target t, const Args& a) {
          return std::make_shared<InverseSquareRootDecayLR>(
              t, a.number("initial_learning_rate", 1.0), a.number("scale", 1.0),
              a.integer("warmup_steps", 1));
        }}},
      {"CosineDecayLR",
       {{"initial_learning_rate", "end_learning_rate", "total_iters"},
        [](Target t, const Args& a) {
          return std::make_shared<CosineDecayLR>(t, a.number("initial_learning_rate"),
                                                 a.number("end_learning_rate"),
                                                 a.integer("total_iters"));
        }}},
      {"CosineAnnealingLR",
       {{"initial_learning_rate", "T_max", "eta_min"},
        [](Target t, const Args& a) {
          return std::make_shared<CosineAnnealingLR>(t, a.number("initial_learning_rate"),
                                                     a.integer("T_max"), a.number("eta_min", 0));
        }}},
      {"CosineAnnealingWarmRestarts",
       {{"initial_learning_rate", "T_0", "T_mult", "eta_min"},
        [](Target t, const Args& a) {
          return std::make_shared<CosineAnnealingWarmRestarts>(
              t, a.number("initial_learning_rate"), a.integer("T_0"), a.integer("T_mult", 1),
              a.number("eta_min", 0));
        }}},
      {"StepLR",
       {{"initial_learning_rate", "step_size", "gamma"},
        [](Target t, const Args& a) {
          return std::make_shared<StepLR>(t, a.number("initial_learning_rate"),
                                          a.integer("step_size"), a.number("gamma", 0.1));
        }}},
      {"MultiStepLR",
       {{"initial_learning_rate", "milestones", "gamma"},
        [](Target t, const Args& a) {
          return std::make_shared<MultiStepLR>(t, a.number("initial_learning_rate"),
                                               a.list<int64_t>("milestones"),
                                               a.number("gamma", 0.1));
        }}},
      {"MultiplicativeLR",
       {{"initial_learning_rate", "coefficient"},
        [](Target t, const Args& a) {
          return std::make_shared<MultiplicativeLR>(t, a.number("initial_learning_rate"),
                                                    a.number("coefficient"));
        }}},
      {"CyclicLR",
       {{"base_lr", "max_lr", "step_size_up", "step_size_down", "mode", "gamma"},
        [](Target t, const Args& a) {
          return std::make_shared<CyclicLR>(t, a.number("base_lr"), a.number("max_lr"),
                                            a.integer("step_size_up", 2000),
                                            a.opt_integer("step_size_down"),
                                            a.text("mode", "triangular"), a.number("gamma", 1.0));
        }}},
      {"OneCycleLR",
       {{"initial_learning_rate", "max_lr", "total_steps", "pct_start", "final_div_factor",
         "three_phase", "anneal_strategy"},
        [](Target t, const Args& a) {
          return std::make_shared<OneCycleLR>(
              t, a.number("initial_learning_rate"), a.number("max_lr"), a.integer("total_steps"),
              a.number("pct_start", 0.25), a.number("final_div_factor", 1e4),
              a.flag("three_phase", false), a.text("anneal_strategy", "cos"));
        }}},
      {"PiecewiseConstantLR",
       {{"learning_rates", "milestones"},
        [](Target t, const Args& a) {
          return std::make_shared<PiecewiseConstantLR>(t, a.list<double>("learning_rates"),
                                                       a.list<int64_t>("milestones"));
        }}},
  };
  return s;
}

// Old keys and the keys that replaced them.
const std::map<std::string, std::string>& aliases() {
  static const std::map<std::string, std::string> a = {
      {"steps", "total_iters"},
      {"decay_steps", "total_iters"},
      {"base_lr", "initial_learning_rate"},
      {"learning_rate", "initial_learning_rate"},
      {"values", "learning_rates"},
      {"boundaries", "milestones"},
  };
  return a;
}

// Keys every entry may carry besides the scheduler's own.
const std::set<std::string> kCommon = {"scheduler", "param_group_key", "main_scheduler"};

struct Built {
  SchedulerPtr sched;
  std::optional<int64_t> iters;  // how long it runs in a sequence
};

// `where` names the entry in errors; `prefix` starts each message.
Built build_one(Optimizer& opt, const Config& entry, const std::string& where,
                const std::string& prefix) {
  CS_CHECK(entry.is_object(), "{}{}: expected a map with key 'scheduler' or a number, got {}",
           prefix, where, entry.dump());
  CS_CHECK(entry.contains("scheduler") && entry.at("scheduler").is_string(),
           "{}{}: missing 'scheduler' (the scheduler's name), got {}", prefix, where, entry.dump());
  std::string want = ascii_lower(entry.at("scheduler").get<std::string>());
  for (const auto& [name, spec] : specs()) {
    std::string n = ascii_lower(name);
    std::string bare = n.size() > 2 && n.ends_with("lr") ? n.substr(0, n.size() - 2) : n;
    if (want != n && want != bare) continue;
    // The code form says which scheduler the entry is; a config key path already does.
    std::string w = prefix.empty() ? where : where + " (" + name + ")";
    for (const auto& [k, v] : entry.items()) {
      if (kCommon.count(k) || k == "total_iters") continue;
      if (std::find(spec.keys.begin(), spec.keys.end(), k) != spec.keys.end()) continue;
      auto al = aliases().find(k);
      CS_CHECK(al == aliases().end() ||
                   std::find(spec.keys.begin(), spec.keys.end(), al->second) == spec.keys.end(),
               "{}{}.{}: '{}' was renamed; use '{}'", prefix, w, k, k,
               al == aliases().end() ? std::string() : al->second);
      // A misspelt argument would silently run with its default: an error, as for every key.
      fail("{}{}.{}: unknown key '{}' of {}; valid keys: {}", prefix, w, k, k, name,
           fmt::join(*lr_scheduler_arguments(name), ", "));
    }
    Args args{entry, w, prefix};
    std::string key = args.text("param_group_key", "lr");
    Built b{spec.make(Target(opt, key), args), std::nullopt};
    b.iters =
        entry.contains("total_iters") ? args.opt_integer("total_iters") : b.sched->total_iters();
    return b;
  }
  if (want == "lambdalr" || want == "lambda")
    fail(
        "{}{}: LambdaLR needs a function; construct "
        "cstorch::optim::lr_scheduler::LambdaLR in code",
        prefix, where);
  fail("{}{}: unknown scheduler '{}'; valid schedulers: {}", prefix, where,
       entry.at("scheduler").get<std::string>(), fmt::join(lr_scheduler_names(), ", "));
}

}  // namespace

std::vector<std::string> lr_scheduler_names() {
  std::vector<std::string> r;
  for (const auto& [n, s] : specs()) r.push_back(n);
  r.push_back("SequentialLR (a list)");
  r.push_back("ChainedLR (a list with main_scheduler: ChainedLR)");
  return r;
}

std::optional<std::vector<std::string>> lr_scheduler_arguments(const std::string& scheduler) {
  const std::string want = ascii_lower(scheduler);
  for (const auto& [name, spec] : specs()) {
    std::string n = ascii_lower(name);
    std::string bare = n.size() > 2 && n.ends_with("lr") ? n.substr(0, n.size() - 2) : n;
    if (want != n && want != bare) continue;
    std::vector<std::string> r = spec.keys;
    for (const char* k : {"total_iters", "param_group_key"})
      if (std::find(r.begin(), r.end(), k) == r.end()) r.push_back(k);
    return r;
  }
  return std::nullopt;
}

std::shared_ptr<LRScheduler> configure_lr_scheduler(Optimizer& optimizer, const Config& lr) {
  return configure_lr_scheduler(optimizer, lr, "");
}

std::shared_ptr<LRScheduler> configure_lr_scheduler(Optimizer& optimizer, const Config& lr,
                                                    const std::string& key_path) {
  const std::string prefix = key_path.empty() ? "configure_lr_scheduler: " : "";
  const std::string root = key_path.empty() ? "learning_rate" : key_path;
  if (lr.is_number()) return std::make_shared<ConstantLR>(optimizer, lr.get<double>());
  if (lr.is_object()) return build_one(optimizer, lr, root, prefix).sched;
  CS_CHECK(lr.is_array(), "{}{} must be a number, a map or a list of maps, got {}", prefix, root,
           lr.dump());
  CS_CHECK(!lr.empty(), "{}{} is an empty list", prefix, root);
  bool chained = false;
  for (size_t i = 0; i < lr.size(); ++i) {
    if (!lr[i].is_object() || !lr[i].contains("main_scheduler")) continue;
    const auto& m = lr[i].at("main_scheduler");
    std::string v = m.is_string() ? ascii_lower(m.get<std::string>()) : "";
    CS_CHECK(v == "chainedlr" || v == "sequentiallr",
             "{}{}[{}].main_scheduler: expected ChainedLR or SequentialLR, got {}", prefix, root, i,
             config_text(m));
    chained = chained || v == "chainedlr";
  }
  std::vector<SchedulerPtr> subs;
  std::vector<int64_t> milestones;
  int64_t sum = 0;
  for (size_t i = 0; i < lr.size(); ++i) {
    std::string where = fmt::format("{}[{}]", root, i);
    Built b = build_one(optimizer, lr[i], where, prefix);
    subs.push_back(b.sched);
    if (chained || i + 1 == lr.size()) continue;
    auto T = b.iters;
    CS_CHECK(T.has_value(),
             "{}{}: a scheduler in a sequence needs 'total_iters' (how many steps it runs "
             "before the next one starts)",
             prefix, where);
    sum += *T;
    milestones.push_back(sum);
  }
  if (subs.size() == 1) return subs[0];
  if (chained) return std::make_shared<ChainedLR>(optimizer, subs);
  return std::make_shared<SequentialLR>(optimizer, subs, milestones);
}

}  // namespace cstorch::optim
