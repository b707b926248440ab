// Every op in ops.def has a shape rule, a gradient rule and a CPU kernel in this build.
#include <gtest/gtest.h>

#include <set>

#include "ir/device.h"
#include "ops/vjp.h"

using namespace cstorch;

TEST(OpTable, EveryOpHasItsRulesAndKernels) {
  const auto& cpu = ir::device_backend(Device{});
  for (int i = 0; i < ir::kNumOps; ++i) {
    auto op = static_cast<ir::OpCode>(i);
    const auto& info = ir::op_info(op);
    EXPECT_NE(info.infer, nullptr) << info.name << ": no shape rule";
    EXPECT_NE(ops::vjp_of(op), nullptr) << info.name << ": no gradient rule (use CS_NO_VJP)";
    EXPECT_NE(cpu.kernel(op), nullptr) << info.name << ": no CPU kernel";
  }
}

TEST(OpTable, NamesAreUniqueAndTraitsConsistent) {
  std::set<std::string> names;
  for (int i = 0; i < ir::kNumOps; ++i) {
    auto op = static_cast<ir::OpCode>(i);
    EXPECT_TRUE(names.insert(ir::op_info(op).name).second) << ir::op_info(op).name;
    if (ir::has_trait(op, ir::kRandom)) {
      EXPECT_TRUE(ir::has_trait(op, ir::kNoGrad)) << ir::op_info(op).name;
    }
    if (ir::has_trait(op, ir::kLeaf)) {
      EXPECT_TRUE(ir::has_trait(op, ir::kNoGrad)) << ir::op_info(op).name;
    }
  }
}
