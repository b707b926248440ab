// A steady-state traced training step performs zero heap allocations. This binary replaces
// malloc and operator new with counting versions (per thread), so allocations by OpenBLAS,
// OpenMP and the kernels are all seen.
#include <gtest/gtest.h>
#include <malloc.h>
#include <omp.h>
#include <atomic>

#include <cstorch/cstorch.h>
#include <cstorch/nn/transformer.h>

#include "runtime/alloc_counter.h"

namespace cstorch::runtime {
void set_alloc_hooks_installed(bool on);
}

#include <execinfo.h>
#include <unistd.h>

#include <cstdlib>

// Counts an allocation when it belongs to a compiled step: made on the executor thread or on a
// thread of a parallel region (the kernels' OpenMP workers) while a step is counted.
static void count_alloc();

// With CSTORCH_ALLOC_TRACE set, print the call stack of every counted allocation.
static void trace_alloc() {
  static thread_local bool busy = false;
  if (busy || !std::getenv("CSTORCH_ALLOC_TRACE")) return;
  busy = true;
  void* frames[16];
  int n = backtrace(frames, 16);
  backtrace_symbols_fd(frames, n, 2);
  write(2, "----\n", 5);
  busy = false;
}

static void count_alloc() {
  if (!cstorch::runtime::alloc_counted_thread(omp_in_parallel() != 0)) return;
  cstorch::runtime::alloc_count().fetch_add(1, std::memory_order_relaxed);
  trace_alloc();
}

extern "C" {
void* __libc_malloc(size_t);
void* __libc_calloc(size_t, size_t);
void* __libc_realloc(void*, size_t);
void* __libc_memalign(size_t, size_t);

void* malloc(size_t n) {
  count_alloc();
  return __libc_malloc(n);
}
void* calloc(size_t a, size_t b) {
  count_alloc();
  return __libc_calloc(a, b);
}
void* realloc(void* p, size_t n) {
  count_alloc();
  return __libc_realloc(p, n);
}
void* aligned_alloc(size_t al, size_t n) {
  count_alloc();
  return __libc_memalign(al, n);
}
int posix_memalign(void** p, size_t al, size_t n) {
  count_alloc();
  *p = __libc_memalign(al, n);
  return *p ? 0 : 12;
}
}

namespace cs = cstorch;

// The counter sees allocations made by every thread that works for a step, not only the one
// that started it: here the workers of a parallel region on the executor thread.
TEST(ZeroAlloc, CountsAllocationsOfParallelWorkers) {
  cs::runtime::set_alloc_hooks_installed(true);
  cs::set_num_threads(2);
  std::atomic<int64_t> counted{-1};
  std::atomic<int> team{0};
  cs::detail::enqueue_closure(
      [&] {
#pragma omp parallel num_threads(2)  // the team exists before counting starts
        team = omp_get_num_threads();
        cs::runtime::AllocCounter c;
#pragma omp parallel num_threads(2)
        {
          if (omp_get_thread_num() == 1) {
            void* volatile p = std::malloc(64);
            std::free(p);
          }
          team = omp_get_num_threads();
        }
        counted = c.count();
      },
      "count");
  cs::synchronize();
  ASSERT_EQ(team.load(), 2);
  EXPECT_GE(counted.load(), 1);
}

TEST(ZeroAlloc, SteadyStateTracedTrainingStep) {
  cs::runtime::set_alloc_hooks_installed(true);
  cs::manual_seed(0);
  cs::nn::Sequential m(cs::nn::Linear(784, 256), cs::nn::ReLU(), cs::nn::Dropout(0.1),
                       cs::nn::Linear(256, 256), cs::nn::GELU(), cs::nn::Linear(256, 10));
  cs::optim::AdamW opt(m->parameters(), 1e-3);
  auto step = cs::trace([&](const cs::Batch& b) {
    auto loss = cs::cross_entropy(m(b.at("x")), b.at("y"), -100, 0.1);
    loss.backward();
    opt.step();
    opt.zero_grad();
    return loss;
  });
  cs::Batch batch{{"x", cs::randn({128, 784})},
                  {"y", cs::from_vector(std::vector<int64_t>(128, 4), {128})}};
  for (int i = 0; i < 5; ++i) step(batch);
  cs::synchronize();
  auto st = cs::runtime_stats();
  EXPECT_EQ(st.last_step_heap_allocations, 0);
  EXPECT_GE(st.executions, 5);
}

// A transformer step: fused attention (with attention dropout and a trainable bias), layer
// norms, GELU, tied head, AdamW; with `recompute` the layer's re-run is part of the compiled
// backward. Checks that the steps ran compiled and the last one allocated nothing.
void expect_transformer_step_allocation_free(bool recompute) {
  cs::runtime::set_alloc_hooks_installed(true);
  cs::manual_seed(0);
  cs::nn::TransformerLayerOptions o;
  o.d_model = 64;
  o.nhead = 4;
  o.dim_feedforward = 128;
  o.dropout = 0.1;
  o.activation = "gelu_tanh";
  o.norm_first = true;
  o.recompute = recompute;
  cs::nn::TransformerEncoderLayer layer(o);
  cs::nn::Embedding emb(100, 64);
  cs::nn::RelativePositionBias rb(4, true);
  std::vector<cs::Tensor> params = layer->parameters();
  for (auto* m : {emb.module().get(), rb.module().get()})
    for (auto& p : m->parameters()) params.push_back(p);
  cs::optim::AdamW opt(params, 1e-3);
  auto step = cs::trace([&](const cs::Batch& b) {
    cs::nn::AttentionMasks masks;
    masks.causal = true;
    masks.key_mask = b.at("mask");
    masks.position_bias = rb(32, 32);
    auto h = layer->forward(emb(b.at("ids")), masks);
    auto loss = cs::cross_entropy(cs::reshape(cs::nn::tied_logits(h, emb->weight), {4 * 32, 100}),
                                  cs::reshape(b.at("ids"), {4 * 32}));
    loss.backward();
    opt.step();
    opt.zero_grad();
    return loss;
  });
  std::vector<int64_t> ids(4 * 32), mask(4 * 32, 1);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>(i * 7 % 100);
  cs::Batch batch{{"ids", cs::from_vector(ids, {4, 32})}, {"mask", cs::from_vector(mask, {4, 32})}};
  const int64_t before = cs::runtime_stats().executions;
  for (int i = 0; i < 5; ++i) step(batch);
  cs::synchronize();
  auto st = cs::runtime_stats();
  EXPECT_GE(st.executions - before, 5);
  EXPECT_EQ(st.last_step_heap_allocations, 0);
}

TEST(ZeroAlloc, SteadyStateTracedTransformerStep) {
  expect_transformer_step_allocation_free(false);
}

TEST(ZeroAlloc, SteadyStateTracedTransformerStepWithRecomputation) {
  expect_transformer_step_allocation_free(true);
}
