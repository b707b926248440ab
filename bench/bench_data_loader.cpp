// cstorch side of the data-loader benchmarks (bench/run cases data_loader, data_wait_fc_mnist).
//
//   --mode loader: a DataLoader of `--workers` worker threads, each a DatasetLoader over
//     MnistDataset (the synthetic-digits IDX files in --data; train split, shuffled, batch
//     --batch, drop_last, sharded by worker). After --warmup batches, --repeats timed repeats
//     of --batches next() calls (the loader is re-iterated at the end of an epoch). Prints one
//     JSON line: {"sec_per_batch": median over repeats, "per_repeat": [...], ...}.
//   --mode fc: the FC-MNIST training loop (784 -> 256 -> 256 -> 10, SGD(0.01, 0.9), traced
//     step, loss read every 100 steps from a step closure) over the same DataLoader through a
//     DataExecutor for --steps steps. Prints the step time and how long and how often the
//     client waited for data: {"sec_per_step", "data_wait_s", "data_waits", ...}. The first
//     batch (the workers starting) is excluded from the wait figures.
#include <cstorch/cstorch.h>
#include <cstorch/data/mnist.h>
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>

namespace cs = cstorch;
namespace data = cstorch::utils::data;
using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

namespace {

double secs(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::shared_ptr<data::Loader> mnist_input_fn(const cs::Config& a, const data::WorkerInfo& w) {
  auto ds = std::make_shared<cs::data::MnistDataset>(a.at("dir").get<std::string>(), "train");
  cs::data::LoaderOptions o;
  o.batch_size = a.at("batch").get<int64_t>();
  o.shuffle = true;
  o.seed = 1;
  o.drop_last = true;
  o.worker = w;
  return std::make_shared<cs::data::DatasetLoader>(ds, o);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"cstorch data-loader benchmark"};
  std::string mode = "loader", dir;
  int workers = 1, threads = 1;
  int64_t batch = 64, batches = 1000, warmup = 50, repeats = 5, steps = 2000;
  app.add_option("--mode", mode, "loader or fc");
  app.add_option("--data", dir, "Folder with MNIST IDX files")->required();
  app.add_option("--workers", workers, "DataLoader worker threads");
  app.add_option("--threads", threads, "Compute threads (fc mode)");
  app.add_option("--batch", batch, "Batch size");
  app.add_option("--batches", batches, "Batches per timed repeat (loader mode)");
  app.add_option("--warmup", warmup, "Warm-up batches or steps");
  app.add_option("--repeats", repeats, "Timed repeats (loader mode)");
  app.add_option("--steps", steps, "Training steps after warm-up (fc mode)");
  CLI11_PARSE(app, argc, argv);
  try {
    cs::Config args{{"dir", dir}, {"batch", batch}, {"num_workers", workers}};
    if (mode == "loader") {
      data::DataLoader loader(mnist_input_fn, args);
      auto take = [&](int64_t n) {
        int64_t got = 0, samples = 0;
        while (got < n) {
          auto b = loader.next();
          if (!b) continue;  // end of an epoch: re-iterate
          samples += b->at("y").size(0);
          ++got;
        }
        return samples;
      };
      take(warmup);
      std::vector<double> per;
      int64_t samples = 0;
      for (int64_t r = 0; r < repeats; ++r) {
        auto t0 = Clock::now();
        samples += take(batches);
        per.push_back(secs(t0, Clock::now()) / static_cast<double>(batches));
      }
      json out{{"sec_per_batch", median(per)},
               {"per_repeat", per},
               {"batches", batches},
               {"samples_per_batch", samples / (repeats * batches)},
               {"workers", loader.num_workers()},
               {"waits", loader.data_waits()}};
      fmt::print("{}\n", out.dump());
      return 0;
    }
    if (mode != "fc") cs::fail("unknown --mode '{}': expected loader or fc", mode);

    cs::set_num_threads(threads);
    cs::manual_seed(0);
    cs::nn::Sequential model;
    model->push_back(cs::nn::Linear(784, 256).module());
    model->push_back(cs::nn::ReLU().module());
    model->push_back(cs::nn::Linear(256, 256).module());
    model->push_back(cs::nn::ReLU().module());
    model->push_back(cs::nn::Linear(256, 10).module());
    auto backend = cs::backend("CPU");
    auto compiled = cs::compile(model, backend);
    auto opt = cs::optim::configure_optimizer("SGD", model->parameters(),
                                              {{"lr", 0.01}, {"momentum", 0.9}});
    auto step = cs::trace([&](const cs::Batch& b) {
      auto loss = cs::nn::functional::cross_entropy(compiled(b.at("x")), b.at("y"));
      loss.backward();
      opt->step();
      opt->zero_grad();
      return loss;
    });
    float last_loss = 0;
    auto log = cs::step_closure([&](const cs::Tensor& l) { last_loss = l.item<float>(); });
    args["num_steps"] = warmup + steps;
    data::DataLoader loader(mnist_input_fn, args);
    data::DataExecutor ex(loader);
    double wait_first = 0, wait_at_timing = 0;
    int64_t waits_at_timing = 0;
    Clock::time_point t0;
    for (const auto& b : ex) {
      int64_t i = ex.step();
      if (i == 0) wait_first = ex.data_wait_seconds();
      if (i == warmup) {
        cs::synchronize();
        t0 = Clock::now();
        wait_at_timing = ex.data_wait_seconds();
        waits_at_timing = ex.data_waits();
      }
      auto loss = step(b);
      if (i % 100 == 0) log(loss);
    }
    double total = secs(t0, Clock::now());  // the loop's end synchronises
    json out{{"sec_per_step", total / static_cast<double>(steps)},
             {"steps", steps},
             {"warmup", warmup},
             {"data_wait_s", ex.data_wait_seconds() - wait_at_timing},
             {"data_waits", ex.data_waits() - waits_at_timing},
             {"data_wait_warmup_s", wait_at_timing - wait_first},
             {"data_wait_first_batch_s", wait_first},
             {"workers", loader.num_workers()},
             {"loss", last_loss}};
    fmt::print("{}\n", out.dump());
  } catch (const cs::Error& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
  return 0;
}
