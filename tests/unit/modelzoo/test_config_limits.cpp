// Config loading limits and errors: YAML aliases that refer to themselves or expand
// exponentially stop at a depth / value limit with an error naming the file, the key path and
// the limit; a directory or a top level that is not a map is named as such. Plain scalars:
// YAML's .inf and .nan are numbers.
#include <unistd.h>

#include <gtest/gtest.h>
#include <CLI/CLI.hpp>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>

#include "cstorch/config.h"
#include "cstorch/core/error.h"
#include "modelzoo/cli.h"
#include "unit/test_util.h"

namespace cs = cstorch;
namespace fs = std::filesystem;
using cs::testing::expect_error;

namespace {

fs::path temp_dir(const std::string& name) {
  return cs::testing::temp_dir("cstorch_config_limits", name);
}

std::string write(const fs::path& p, const std::string& text) {
  std::ofstream(p, std::ios::binary) << text;
  return p.string();
}

// "billion laughs": each level is a list of ten aliases of the previous one; 7 levels expand
// to 10^7 scalars from a few hundred bytes.
std::string laughs() {
  std::string y = "a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]\n";
  for (int i = 1; i <= 6; ++i) {
    std::string prev = "*a" + std::to_string(i - 1);
    y += "a" + std::to_string(i) + ": &a" + std::to_string(i) + " [";
    for (int k = 0; k < 10; ++k) y += (k ? ", " : "") + prev;
    y += "]\n";
  }
  return y;
}

}  // namespace

TEST(ConfigLimits, AliasCycleIsAnErrorNamingFileKeyAndLimit) {
  auto dir = temp_dir("cycle");
  std::string p = write(dir / "a.yaml", "x: &a [1, *a]\n");
  expect_error([&] { cs::load_config_file(p); },
               {"config: " + p + ":", "'x[1][1][1]", "nested deeper than 256 levels"});
  expect_error([&] { cs::parse_config("y: {z: &b [*b]}"); },
               {"'y.z[0][0]", "nested deeper than 256 levels"});
  fs::remove_all(dir);
}

TEST(ConfigLimits, ExponentialAliasExpansionFailsFast) {
  auto dir = temp_dir("laughs");
  std::string text = laughs();
  ASSERT_LT(text.size(), 600u);
  std::string p = write(dir / "laughs.yaml", text);
  auto t0 = std::chrono::steady_clock::now();
  expect_error([&] { cs::load_config_file(p); },
               {"config: " + p + ":", "more than 1000000 values (the limit) at 'a"});
  // A bound on the work, not a speed measurement: unbounded expansion took ~40 s (and 0.9 GB)
  // before the limit; with it, ~0.3 s (1.1 s under the sanitizers). 10 s leaves room for slow
  // or busy machines and still fails the unbounded reader.
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(s, 10.0);
  fs::remove_all(dir);
}

TEST(ConfigLimits, DeepAndAliasedConfigsWithinTheLimitsLoad) {
  // 200 levels of nesting, aliases shared a few times, and the scalar forms as before.
  std::string y = "d: ";
  for (int i = 0; i < 199; ++i) y += "[";
  y += "1";
  for (int i = 0; i < 199; ++i) y += "]";
  y += "\nbase: &b {lr: 0.1, n: 3}\nuse: [*b, *b]\n";
  y += "s: [+5, 0x10, 1e-400, 9999999999999999999, 1.5, abc, '12', true, ~, '', .5, 1e3]\n";
  cs::Config c = cs::parse_config(y);
  const cs::Config* d = &c["d"];
  int depth = 0;
  while (d->is_array()) d = &(*d)[0], ++depth;
  EXPECT_EQ(depth, 199);
  EXPECT_EQ(*d, 1);
  EXPECT_EQ(c["use"][1]["lr"], 0.1);
  EXPECT_EQ(c["use"][0]["n"], 3);
  const cs::Config& s = c["s"];
  EXPECT_TRUE(s[0].is_number_integer());
  EXPECT_EQ(s[0], 5);
  EXPECT_EQ(s[1], 16.0);      // strtod reads hex, as std::stod did
  EXPECT_EQ(s[2], "1e-400");  // out of range: a string, as before
  EXPECT_TRUE(s[3].is_number_float());
  EXPECT_EQ(s[4], 1.5);
  EXPECT_EQ(s[5], "abc");
  EXPECT_EQ(s[6], "12");
  EXPECT_EQ(s[7], true);
  EXPECT_TRUE(s[8].is_null());
  EXPECT_EQ(s[9], "");
  EXPECT_EQ(s[10], 0.5);
  EXPECT_EQ(s[11], 1000.0);
}

TEST(ConfigLimits, DirectoryAndNonMapTopLevelAreNamed) {
  auto dir = temp_dir("shapes");
  expect_error([&] { cs::load_config_file(dir.string()); },
               {"config: '" + dir.string() + "' is a directory"});
  // `cszoo fit` of a file whose top level is a list or a scalar.
  for (auto [name, text, what] :
       {std::tuple{"list.yaml", "- trainer: {}\n", "the top level is a list"},
        std::tuple{"scalar.yaml", "just text\n", "the top level is a single value"}}) {
    std::string p = write(dir / name, text);
    CLI::App app;
    int status = 1;
    modelzoo::register_cszoo_commands(app, status);
    std::vector<std::string> args = {p, "fit"};  // CLI11 takes them in reverse
    expect_error([&] { app.parse(args); }, {"config: " + p + ":", what});
  }
  fs::remove_all(dir);
}

// A key written twice in one map is an error naming the file, the key path and the second
// line (yaml-cpp kept one of the two values without a word); the same key in two maps is not.
TEST(ConfigLimits, AKeyGivenTwiceInOneMapIsAnError) {
  auto dir = temp_dir("duplicate");
  std::string p =
      write(dir / "d.yaml", "trainer:\n  init:\n    device: CPU\n    seed: 1\n    device: GPU\n");
  expect_error([&] { cs::load_config_file(p); },
               {"config: " + p + ": ", "'trainer.init.device' is given twice (again at line 5)"});
  expect_error([&] { cs::parse_config("a: [1, {d: 2, d: 3}]"); },
               {"'a[1].d' is given twice (again at line 1)"});
  const cs::Config ok = cs::parse_config("a: {d: 1}\nb: {d: 2}\nc: [{d: 3}, {d: 4}]\n");
  EXPECT_EQ(ok["b"]["d"].get<int>(), 2);
  EXPECT_EQ(ok["c"][1]["d"].get<int>(), 4);
  fs::remove_all(dir);
}

// YAML merge keys: a phase written as `<<: *first` plus its changes (read as an unknown key
// '<<' and refused, in a run tried as a new user would). Explicit keys win over merged ones,
// an earlier merged map over a later one; a merge of something else than maps is an error.
TEST(ConfigLimits, MergeKeysAddTheMergedMapsKeys) {
  const cs::Config c = cs::parse_config(
      "base: &b {lr: 0.1, momentum: 0.9}\n"
      "more: &m {nesterov: true, lr: 0.5}\n"
      "one: {<<: *b, lr: 0.01}\n"
      "two:\n  <<: [*b, *m]\n  extra: 1\n");
  EXPECT_EQ(c["one"], cs::parse_config("{lr: 0.01, momentum: 0.9}"));
  EXPECT_EQ(c["two"], cs::parse_config("{lr: 0.1, momentum: 0.9, nesterov: true, extra: 1}"));
  expect_error([&] { cs::parse_config("a: {<<: 3, b: 1}"); },
               {"the merge key (<<) in 'a' takes a map or a list of maps", "got 3"});
}

// Plain scalars: YAML's spellings of infinity and NaN (.inf, .Inf, .INF with an optional sign;
// .nan, .NaN, .NAN) are floats, as the other numbers are; a quoted one is a string, as a quoted
// "123" is; what strtod reads (inf, nan, ...) stays a number.
TEST(ConfigScalars, YamlInfinityAndNaNAreFloats) {
  const double inf = std::numeric_limits<double>::infinity();
  for (const std::string s : {".inf", ".Inf", ".INF", "+.inf", "+.Inf", "+.INF"}) {
    const cs::Config c = cs::parse_config("a: " + s);
    ASSERT_TRUE(c["a"].is_number_float()) << s << ": " << c.dump();
    EXPECT_EQ(c["a"].get<double>(), inf) << s;
  }
  for (const std::string s : {"-.inf", "-.Inf", "-.INF"}) {
    const cs::Config c = cs::parse_config("a: " + s);
    ASSERT_TRUE(c["a"].is_number_float()) << s << ": " << c.dump();
    EXPECT_EQ(c["a"].get<double>(), -inf) << s;
  }
  for (const std::string s : {".nan", ".NaN", ".NAN"}) {
    const cs::Config c = cs::parse_config("a: " + s);
    ASSERT_TRUE(c["a"].is_number_float()) << s << ": " << c.dump();
    EXPECT_TRUE(std::isnan(c["a"].get<double>())) << s;
  }
  // In a flow list, and as a whole document.
  const cs::Config list = cs::parse_config("[.inf, -.inf, .nan, 1]");
  EXPECT_EQ(list[0].get<double>(), inf);
  EXPECT_EQ(list[1].get<double>(), -inf);
  EXPECT_TRUE(std::isnan(list[2].get<double>()));
  EXPECT_EQ(list[3], 1);
  EXPECT_EQ(cs::parse_config(".inf").get<double>(), inf);
  // Quoted: strings, as a quoted number is.
  EXPECT_EQ(cs::parse_config("a: '.inf'")["a"], ".inf");
  EXPECT_EQ(cs::parse_config("a: \".nan\"")["a"], ".nan");
  EXPECT_EQ(cs::parse_config("a: \"123\"")["a"], "123");
  EXPECT_EQ(cs::parse_config("a: 123")["a"], 123);
  // Other spellings are not YAML's: strings (a sign on NaN, mixed case, more letters).
  for (const std::string s :
       {"+.nan", "-.nan", ".iNf", ".nAn", ".infinity", "..inf", ".inf.", "inf."})
    EXPECT_EQ(cs::parse_config("a: " + s)["a"], s) << s;
  // What strtod reads is a number, as before.
  EXPECT_EQ(cs::parse_config("a: inf")["a"].get<double>(), inf);
  EXPECT_EQ(cs::parse_config("a: -Infinity")["a"].get<double>(), -inf);
  EXPECT_TRUE(std::isnan(cs::parse_config("a: nan")["a"].get<double>()));
  EXPECT_TRUE(std::isnan(cs::parse_config("a: NaN")["a"].get<double>()));
  EXPECT_EQ(cs::parse_config("a: 1e-3")["a"].get<double>(), 1e-3);
}
