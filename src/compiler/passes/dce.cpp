// Dead-code elimination: drop nodes that no step output or state write depends on.
#include "compiler/graph.h"

namespace cstorch::compiler {
namespace {
class Dce : public Pass {
 public:
  const char* name() const override { return "dce"; }
  bool run(Graph& g) override { return g.prune() > 0; }
};
}  // namespace
std::unique_ptr<Pass> make_dce_pass() {
  return std::make_unique<Dce>();
}
}  // namespace cstorch::compiler
