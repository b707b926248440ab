// cstorch::State: kinds, typed access errors, ordered maps, equality, StateDict conversion.
#include <gtest/gtest.h>

#include "cstorch/cstorch.h"

using namespace cstorch;

TEST(State, KindsAndTypedAccess) {
  State s = State::map({{"a", 1}, {"b", 2.5}, {"c", "x"}, {"d", true}, {"e", nullptr}});
  EXPECT_EQ(s.at("a").as_int(), 1);
  EXPECT_DOUBLE_EQ(s.at("a").as_double(), 1.0);
  EXPECT_DOUBLE_EQ(s.at("b").as_double(), 2.5);
  EXPECT_EQ(s.at("c").as_string(), "x");
  EXPECT_TRUE(s.at("d").as_bool());
  EXPECT_TRUE(s.at("e").is_none());
  EXPECT_THROW(s.at("b").as_int(), Error);
  EXPECT_THROW(s.at("d").as_int(), Error);  // a bool is not an int
  try {
    s.at("zz");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("missing key 'zz' (keys: a, b, c, d, e)"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(State::map({{"a", 1}, {"a", 2}}), Error);
}

TEST(State, MapKeepsInsertionOrderAndReplaces) {
  State s = State::map();
  s.set("z", 1);
  s.set("a", 2);
  s.set("z", 3);
  ASSERT_EQ(s.keys(), (std::vector<std::string>{"z", "a"}));
  EXPECT_EQ(s.at("z").as_int(), 3);
  EXPECT_TRUE(s.erase("z"));
  EXPECT_FALSE(s.erase("z"));
  EXPECT_EQ(s.size(), 1u);
}

TEST(State, ListsAndDeepCopy) {
  State l = State::list();
  l.push_back(1);
  l.push_back(State::map({{"k", 2}}));
  State copy = l;
  copy[1].set("k", 5);
  EXPECT_EQ(l[1].at("k").as_int(), 2);  // containers are copied
  EXPECT_THROW(l[2], Error);
  EXPECT_EQ(l.repr(), "[1, {'k': 2}]");
}

TEST(State, EqualityComparesTensorBytes) {
  Tensor t = from_vector(std::vector<float>{1, 2, 3}, {3});
  State a = State::map({{"w", t}, {"n", 1}});
  State b = State::map({{"w", from_vector(std::vector<float>{1, 2, 3}, {3})}, {"n", 1}});
  State c = State::map({{"w", from_vector(std::vector<float>{1, 2, 4}, {3})}, {"n", 1}});
  State d = State::map({{"n", 1}, {"w", t}});
  EXPECT_TRUE(a == b);
  EXPECT_FALSE(a == c);
  EXPECT_FALSE(a == d);  // order matters
  EXPECT_EQ(a.repr(), "{'w': tensor(f32[3]), 'n': 1}");
}

TEST(State, StateDictConversion) {
  nn::Linear fc(3, 2);
  State s = fc->state_dict().to_state();
  ASSERT_EQ(s.keys(), (std::vector<std::string>{"weight", "bias"}));
  nn::StateDict back = nn::StateDict::from_state(s);
  EXPECT_EQ(back.keys(), s.keys());
  s.set("bias", 3);
  EXPECT_THROW(nn::StateDict::from_state(s), Error);
}
