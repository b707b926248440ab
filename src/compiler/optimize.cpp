// The standard pass pipeline, with optional graph dumps before and after every pass.
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "compiler/graph.h"

namespace cstorch::compiler {

static void dump(const Graph& g, const std::string& prefix, int idx, const char* stage) {
  const char* dir = std::getenv("CSTORCH_DUMP_GRAPHS");
  if (!dir || !*dir) return;
  std::filesystem::create_directories(dir);
  std::string base = fmt::format("{}/{}-{:02d}-{}", dir, prefix, idx, stage);
  std::ofstream(base + ".txt") << g.dump();
  std::ofstream(base + ".dot") << g.dot();
}

void optimize(Graph& g, const std::string& prefix, std::unique_ptr<Pass> before_fusion) {
  int idx = 0;
  dump(g, prefix, idx++, "traced");
  verify(g, "tracing");
  std::unique_ptr<Pass> passes[] = {make_dce_pass(),           make_cse_pass(),
                                    make_constant_fold_pass(), make_simplify_pass(),
                                    make_cse_pass(),           make_dce_pass()};
  for (auto& p : passes) {
    p->run(g);
    dump(g, prefix, idx++, p->name());
    verify(g, p->name());
  }
  if (before_fusion) {
    before_fusion->run(g);
    dump(g, prefix, idx++, before_fusion->name());
    verify(g, before_fusion->name());
  }
  // Fusion last: the other passes see the plain ops. CSTORCH_FUSION=0 turns these passes off
  // (to compare speed, or to see every op in CSTORCH_PROFILE=nodes). Attention's packed QKV
  // first (its slices and concatenation go, so nothing fuses them). Cached state casts next,
  // so that the new casts of updated states can join the updates' elementwise groups; GEMM
  // epilogues before elementwise fusion, so a relu or momentum update after a product joins the
  // product rather than an elementwise group; bf16 operands last, once the Fused programs that
  // may read a product as bf16 are known.
  const char* fusion = std::getenv("CSTORCH_FUSION");
  if (!(fusion && std::string(fusion) == "0")) {
    std::unique_ptr<Pass> fusions[] = {make_pack_attention_qkv_pass(),
                                       make_cache_state_casts_pass(),
                                       make_fuse_gemm_epilogue_pass(), make_fuse_elementwise_pass(),
                                       make_fused_bf16_operands_pass()};
    for (auto& p : fusions) {
      p->run(g);
      dump(g, prefix, idx++, p->name());
      verify(g, p->name());
    }
  }
  // Scheduling last: it only reorders.
  auto hoist = make_hoist_scalars_pass();
  hoist->run(g);
  dump(g, prefix, idx++, hoist->name());
  verify(g, hoist->name());
}

}  // namespace cstorch::compiler
