// Command-line overrides (KEY.PATH=VALUE): parsing, applying, errors, and the YAML text of a
// resolved config.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "cstorch/config.h"
#include "cstorch/core/error.h"
#include "modelzoo/overrides.h"

using cstorch::Config;
using cstorch::parse_config;
using modelzoo::apply_override;
using modelzoo::parse_override;

namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const cstorch::Error& e) {
    return e.what();
  }
  return "(no error)";
}

Config applied(const std::string& yaml, const std::vector<std::string>& overrides) {
  Config c = parse_config(yaml);
  for (const auto& o : overrides) apply_override(c, parse_override(o));
  return c;
}

}  // namespace

TEST(Overrides, ValuesAreYaml) {
  EXPECT_EQ(parse_override("trainer.init.loop.max_steps=50").value, Config(50));
  EXPECT_EQ(parse_override("a.lr=1e-3").value, Config(0.001));
  EXPECT_EQ(parse_override("a.flag=true").value, Config(true));
  EXPECT_EQ(parse_override("a.sizes=[1,2]").value, Config::array({1, 2}));
  EXPECT_EQ(parse_override("a.opt={SGD: {lr: 0.1}}").value, parse_config("{SGD: {lr: 0.1}}"));
  EXPECT_EQ(parse_override("a.name=text").value, Config("text"));
  EXPECT_EQ(parse_override("a.name=\"007\"").value, Config("007"));
  EXPECT_EQ(parse_override("a.eq=x=y").value, Config("x=y"));  // split at the first '='
  EXPECT_TRUE(parse_override("a.b=").value.is_null());
  auto o = parse_override("trainer.init.schedulers.0.LinearLR.total_iters=10");
  EXPECT_EQ(o.path, (std::vector<std::string>{"trainer", "init", "schedulers", "0", "LinearLR",
                                              "total_iters"}));
  EXPECT_EQ(o.key_path(), "trainer.init.schedulers[0].LinearLR.total_iters");
}

TEST(Overrides, MalformedArgumentsNameThemselves) {
  EXPECT_EQ(error_of([] { parse_override("max_steps"); }),
            "override 'max_steps': expected KEY.PATH=VALUE (e.g. "
            "trainer.init.loop.max_steps=50); a command takes one config file, then overrides");
  EXPECT_EQ(error_of([] { parse_override("=5"); }),
            "override '=5': the key path before '=' is empty");
  EXPECT_EQ(error_of([] { parse_override("a..b=5"); }),
            "override 'a..b=5': the key path 'a..b' has an empty component");
  EXPECT_NE(error_of([] {
              parse_override("a.b=[1,");
            }).find("override 'a.b=[1,': the value is not valid YAML"),
            std::string::npos);
}

TEST(Overrides, SetCreateAndIndex) {
  const std::string yaml =
      "trainer:\n  init:\n    loop: {max_steps: 60}\n"
      "    schedulers: [{LinearLR: {total_iters: 5}}]\n";
  Config c = applied(yaml, {"trainer.init.loop.max_steps=50", "trainer.init.loop.eval_frequency=10",
                            "trainer.init.optimizer.SGD.lr=0.01",
                            "trainer.init.schedulers.0.LinearLR.total_iters=7"});
  EXPECT_EQ(c["trainer"]["init"]["loop"], parse_config("{max_steps: 50, eval_frequency: 10}"));
  EXPECT_EQ(c["trainer"]["init"]["optimizer"], parse_config("{SGD: {lr: 0.01}}"));
  EXPECT_EQ(c["trainer"]["init"]["schedulers"][0]["LinearLR"]["total_iters"], 7);
  // A list of phases: the index picks the phase.
  Config phases = applied("trainer: [{trainer: {init: {seed: 1}}}, {trainer: {init: {seed: 2}}}]",
                          {"trainer.1.trainer.init.seed=9"});
  EXPECT_EQ(phases["trainer"][0]["trainer"]["init"]["seed"], 1);
  EXPECT_EQ(phases["trainer"][1]["trainer"]["init"]["seed"], 9);
  // Later overrides win.
  EXPECT_EQ(applied("a: 1", {"a=2", "a=3"})["a"], 3);
  // An empty file takes overrides too.
  EXPECT_EQ(applied("", {"trainer.init.seed=4"}), parse_config("trainer: {init: {seed: 4}}"));
}

TEST(Overrides, StructuralErrorsNameTheKeyPath) {
  const std::string yaml = "trainer:\n  init:\n    loop: {max_steps: 60}\n    callbacks: [A]\n";
  EXPECT_EQ(error_of([&] { applied(yaml, {"trainer.init.loop.max_steps.x=1"}); }),
            "override 'trainer.init.loop.max_steps.x=1': trainer.init.loop.max_steps is 60, not a "
            "map, so it has no key 'x'");
  EXPECT_EQ(error_of([&] { applied(yaml, {"trainer.init.callbacks.3.A.x=1"}); }),
            "override 'trainer.init.callbacks.3.A.x=1': trainer.init.callbacks: index 3 is out of "
            "range (the list has 1 entry)");
  EXPECT_EQ(error_of([&] { applied(yaml, {"trainer.init.callbacks.first=1"}); }),
            "override 'trainer.init.callbacks.first=1': trainer.init.callbacks is a list; 'first' "
            "is not an index (0, 1, ...)");
  // A phase index on a config of one phase (a map): said here, not created as a key "0" that
  // the config check would then call unknown.
  EXPECT_EQ(error_of([&] { applied(yaml, {"trainer.0.init.seed=3"}); }),
            "override 'trainer.0.init.seed=3': trainer is a map, not a list, so '0' does not "
            "index it; its keys: init");
  // A map that has such a key takes the override.
  EXPECT_EQ(applied("m: {'0': 1}", {"m.0=2"}), parse_config("m: {'0': 2}"));
  // A new map on the way has no keys to name.
  EXPECT_EQ(error_of([&] { applied("", {"a.0=1"}); }),
            "override 'a.0=1': a is a map, not a list, so '0' does not index it");
}

TEST(Overrides, YamlTextReadsBackAsTheSameConfig) {
  Config c = parse_config(
      "trainer:\n"
      "  init:\n"
      "    model_dir: \"007\"\n"
      "    flag: \"true\"\n"
      "    empty: \"\"\n"
      "    colon: \"a: b\"\n"
      "    hash: \"x #y\"\n"
      "    nothing: null\n"
      "    lr: 0.1\n"
      "    one: 1.0\n"
      "    tiny: 1.0e-12\n"
      "    steps: 50\n"
      "    neg: -3\n"
      "    on: true\n"
      "    list: [1, [2, 3], {a: b}]\n"
      "    emptylist: []\n"
      "    emptymap: {}\n"
      "    \"123\": key\n");
  const std::string text = modelzoo::to_yaml(c);
  EXPECT_EQ(parse_config(text), c) << text;
  EXPECT_EQ(parse_config(text)["trainer"]["init"]["one"].is_number_float(), true) << text;
}

// Infinity and NaN are written in YAML's spelling (JSON's text for them is null), so they read
// back as numbers; the strings ".inf" and "inf" are quoted, since plain they read as numbers.
TEST(Overrides, NonFiniteNumbersReadBackAsNumbers) {
  EXPECT_EQ(parse_override("a.lr=.inf").value.get<double>(),
            std::numeric_limits<double>::infinity());
  Config c = parse_config("a: .inf\nb: -.inf\nc: .nan\nd: '.inf'\ne: 'inf'\nf: inf\n");
  const std::string text = modelzoo::to_yaml(c);
  EXPECT_EQ(text, "a: .inf\nb: -.inf\nc: .nan\nd: \".inf\"\ne: \"inf\"\nf: .inf\n");
  Config back = parse_config(text);
  EXPECT_EQ(back["a"].get<double>(), std::numeric_limits<double>::infinity());
  EXPECT_EQ(back["b"].get<double>(), -std::numeric_limits<double>::infinity());
  EXPECT_TRUE(std::isnan(back["c"].get<double>()));
  EXPECT_EQ(back["d"], ".inf");
  EXPECT_EQ(back["e"], "inf");
  EXPECT_EQ(back["f"].get<double>(), std::numeric_limits<double>::infinity());
}

TEST(Overrides, ResolvedRunConfig) {
  modelzoo::ResolvedRunConfig r;
  r.params_file = "cfg.yaml";
  r.overrides = {"trainer.init.seed=3"};
  r.config = parse_config("trainer: {init: {seed: 3}}");
  modelzoo::set_resolved_run_config(r);
  ASSERT_NE(modelzoo::resolved_run_config(), nullptr);
  EXPECT_EQ(modelzoo::resolved_run_config()->overrides, r.overrides);
  EXPECT_EQ(parse_config(modelzoo::resolved_run_config()->yaml()), r.config);
}
