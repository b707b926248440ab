// Data-parallel step and all-reduce cost, run under mpirun (bench/run case "allreduce").
//   bench_allreduce --mode step --batch 256 --steps 50    MLP 784-1024-1024-10, global batch
//       split over the launch's replicas; prints sec/step, the all-reduce time per step on the
//       communication thread and the part of it the step waited for (not hidden by backward).
//   bench_allreduce --mode micro                           eager all-reduce of 4 B and 8 MiB:
//       latency and bandwidth of this machine's transport (the cost model's alpha and beta).
// Rank 0 prints one JSON object.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>

#include "cstorch/cstorch.h"
#include "cstorch/distributed.h"

namespace cs = cstorch;
namespace dist = cstorch::distributed;
using Clock = std::chrono::steady_clock;

static double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

int main(int argc, char** argv) {
  CLI::App app{"data-parallel all-reduce benchmark"};
  std::string mode = "step";
  int64_t batch = 256, steps = 50, warmup = 5, hidden = 1024;
  app.add_option("--mode", mode);
  app.add_option("--batch", batch, "global batch");
  app.add_option("--steps", steps);
  app.add_option("--warmup", warmup);
  app.add_option("--hidden", hidden);
  CLI11_PARSE(app, argc, argv);
  try {
    cs::backend("CPU");
    const int n = dist::world_size();
    dist::set_num_replicas(n);
    const int r = dist::replica_rank();
    if (mode == "micro") {
      double lat = 0, bw = 0;
      for (size_t count : {size_t{1}, size_t{2} << 20}) {
        auto x = cs::ones({static_cast<int64_t>(count)});
        const int reps = count == 1 ? 2000 : 40;
        dist::all_reduce(x);  // warm up
        dist::barrier();
        auto t0 = Clock::now();
        for (int i = 0; i < reps; ++i) dist::all_reduce(x);
        double s = seconds_since(t0) / reps;
        if (count == 1)
          lat = s;
        else
          bw = 4.0 * count / s;
      }
      if (r == 0)
        std::printf("{\"replicas\": %d, \"latency_s\": %.4g, \"bytes_per_s\": %.4g}\n", n, lat, bw);
      return 0;
    }
    cs::manual_seed(1);
    cs::nn::Sequential model(cs::nn::Linear(784, hidden), cs::nn::ReLU(),
                             cs::nn::Linear(hidden, hidden), cs::nn::ReLU(),
                             cs::nn::Linear(hidden, 10));
    auto opt = cs::optim::configure_optimizer("SGD", model->parameters(),
                                              {{"lr", 0.01}, {"momentum", 0.9}});
    const int64_t b = dist::replica_batch_size(batch, n, r);
    cs::manual_seed(100 + r);
    auto x = cs::rand({b, 784});
    auto y = cs::from_vector(std::vector<int64_t>(static_cast<size_t>(b), 3), {b});
    auto step = cs::trace([&](const cs::Batch& bt) {
      auto loss = cs::nn::functional::cross_entropy(model(bt.at("x")), bt.at("y"));
      loss.backward();
      opt->step();
      opt->zero_grad();
      return loss;
    });
    cs::Batch bt{{"x", x}, {"y", y}};
    for (int64_t i = 0; i < warmup; ++i) step(bt);
    cs::synchronize();
    dist::barrier();
    auto s0 = dist::comm_stats();
    auto t0 = Clock::now();
    for (int64_t i = 0; i < steps; ++i) step(bt);
    cs::synchronize();
    double sec = seconds_since(t0) / static_cast<double>(steps);
    auto s1 = dist::comm_stats();
    size_t params = 0;
    for (auto& p : model->parameters()) params += static_cast<size_t>(p.numel());
    if (r == 0)
      std::printf(
          "{\"replicas\": %d, \"global_batch\": %lld, \"params\": %zu, \"sec_per_step\": %.6g, "
          "\"allreduce_s_per_step\": %.6g, \"wait_s_per_step\": %.6g, \"allreduces_per_step\": "
          "%.3g, \"values_per_step\": %.6g}\n",
          n, static_cast<long long>(batch), params, sec,
          (s1.busy_seconds - s0.busy_seconds) / steps, (s1.wait_seconds - s0.wait_seconds) / steps,
          static_cast<double>(s1.allreduces - s0.allreduces) / steps,
          (s1.values - s0.values) / steps);
  } catch (const std::exception& e) {
    dist::abort(e.what());
  }
  return 0;
}
