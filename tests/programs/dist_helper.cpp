// A replica program for the distributed end-to-end tests (run under mpirun): checks the
// collectives eagerly and inside a traced step and prints "dist_helper ok rank R of N".
//   dist_helper collectives      eager all_reduce (sum, weighted mean), broadcast_, gather_state
//   dist_helper traced           a traced data-parallel SGD step equals the full-batch step
#include <cmath>
#include <cstdio>
#include <string>

#include "cstorch/cstorch.h"
#include "cstorch/distributed.h"

namespace cs = cstorch;
namespace dist = cstorch::distributed;

namespace {

int fails = 0;
void expect_near(float got, float want, const char* what) {
  if (std::fabs(got - want) > 1e-6f * std::max(1.0f, std::fabs(want))) {
    std::fprintf(stderr, "rank %d: %s: got %.9g, want %.9g\n", dist::world_rank(), what, got, want);
    ++fails;
  }
}

void collectives() {
  const int r = dist::replica_rank(), n = dist::num_replicas();
  // Sum: rank r contributes r + 1 in every element.
  auto x = cs::full({3}, r + 1.0);
  auto s = dist::all_reduce(x, dist::ReduceOp::Sum).to_vector<float>();
  for (float v : s) expect_near(v, n * (n + 1) / 2.0f, "sum");
  // Weighted mean with uneven weights w_r = r + 1 of values r: Σ (r+1) r / Σ (r+1).
  auto m = dist::all_reduce(cs::full({2, 2}, static_cast<double>(r)), dist::ReduceOp::Mean, r + 1.0)
               .to_vector<float>();
  double num = 0, den = 0;
  for (int k = 0; k < n; ++k) num += (k + 1.0) * k, den += k + 1.0;
  for (float v : m) expect_near(v, static_cast<float>(num / den), "weighted mean");
  // Broadcast from the last rank.
  auto b = cs::full({4}, 10.0 * r);
  dist::broadcast_({b}, n - 1);
  for (float v : b.to_vector<float>()) expect_near(v, 10.0f * (n - 1), "broadcast");
  // Gather a nested state on rank 0.
  cs::State st = cs::State::map({{"rank", r}, {"t", cs::full({2}, r * 0.5)}});
  auto all = dist::gather_state(st, 0);
  if (r == 0) {
    if (static_cast<int>(all.size()) != n) ++fails;
    for (int k = 0; k < static_cast<int>(all.size()); ++k) {
      if (all[k].at("rank").as_int() != k) ++fails;
      expect_near(all[k].at("t").as_tensor().to_vector<float>()[1], k * 0.5f, "gather");
    }
  } else if (!all.empty()) {
    ++fails;
  }
}

// y = x W^T; loss = mean((y - t)^2). Replica r takes rows r, r+n, ... of a global batch of 8
// (uneven when n does not divide 8); after 5 traced SGD steps W equals full-batch training.
void traced() {
  const int r = dist::replica_rank(), n = dist::num_replicas();
  const int64_t B = 7, D = 5;
  std::vector<float> X(B * D), T(B * 2);
  for (size_t i = 0; i < X.size(); ++i) X[i] = std::sin(0.37 * i);
  for (size_t i = 0; i < T.size(); ++i) T[i] = std::cos(0.11 * i);
  std::vector<float> xl, tl;
  for (int64_t i = r; i < B; i += n) {
    xl.insert(xl.end(), X.begin() + i * D, X.begin() + (i + 1) * D);
    tl.insert(tl.end(), T.begin() + i * 2, T.begin() + (i + 1) * 2);
  }
  const int64_t bl = static_cast<int64_t>(xl.size()) / D;
  auto make = [&] {
    std::vector<float> w(2 * D);
    for (size_t i = 0; i < w.size(); ++i) w[i] = 0.1f * static_cast<float>(i) - 0.3f;
    auto W = cs::from_vector(w, {2, D});
    W.set_requires_grad(true);
    return W;
  };
  auto run = [&](cs::Tensor W, const cs::Tensor& x, const cs::Tensor& t, bool traced_step) {
    auto body = [&](const cs::Tensor& xb, const cs::Tensor& tb) {
      auto d = cs::matmul(xb, W.transpose(0, 1)) - tb;
      auto loss = (d * d).mean();
      loss.backward();
      cs::NoGradGuard ng;
      W.copy_(W - W.grad() * 0.1);
      W.set_grad(cs::Tensor());
      return loss;
    };
    if (!traced_step) {
      for (int i = 0; i < 5; ++i) body(x, t);
      return W.to_vector<float>();
    }
    auto step = cs::trace([&](const cs::Batch& b) { return body(b.at("x"), b.at("t")); });
    for (int i = 0; i < 5; ++i) step(cs::Batch{{"x", x}, {"t", t}});
    return W.to_vector<float>();
  };
  auto want = run(make(), cs::from_vector(X, {B, D}), cs::from_vector(T, {B, 2}), false);
  auto got = run(make(), cs::from_vector(xl, {bl, D}), cs::from_vector(tl, {bl, 2}), true);
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::fabs(got[i] - want[i]) > 1e-5f * std::max(1.0f, std::fabs(want[i]))) {
      std::fprintf(stderr, "rank %d: W[%zu] = %.9g, full batch %.9g\n", r, i, got[i], want[i]);
      ++fails;
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "collectives";
  try {
    cs::backend("CPU");
    dist::set_num_replicas(dist::world_size());
    if (mode == "collectives")
      collectives();
    else if (mode == "traced")
      traced();
    else
      dist::abort("unknown mode " + mode);
  } catch (const std::exception& e) {
    dist::abort(e.what());
  }
  if (fails) dist::abort(std::to_string(fails) + " check(s) failed");
  std::printf("dist_helper ok rank %d of %d\n", dist::world_rank(), dist::world_size());
  return 0;
}
