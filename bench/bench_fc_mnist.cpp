// cstorch side of the fully connected MNIST-shaped benchmarks (bench/run cases fc_mnist_*).
//
// Trains 784 -> hidden... -> 10 (ReLU between layers), SGD with momentum, cross-entropy, on
// batches already in memory (raw files written by bench/fc_data.py, shared with the PyTorch
// peer bench/fc_mnist_peer.py). Every mode has its own model and optimizer, built from the same
// seed, and is warmed up with `--warmup` steps. A timed repeat of N steps is:
//   eager:  the step body called directly; loss.item<float>() after the last step.
//   traced: the same body through cs::trace; cs::synchronize() before the clock starts and
//           after the last call (the executor runs asynchronously).
//   forward, forward_backward (eager, diagnostics): forward + loss; forward + loss + backward
//           then zero_grad(set_to_none), to see where an eager step's time goes.
//   traced_forward (diagnostic): forward + loss through cs::trace.
//   traced_zero_first (diagnostic): the traced step in PyTorch's usual order (zero_grad,
//           forward, backward, step).
//   traced_forward_backward (diagnostic): forward + loss + backward through cs::trace,
//           returning the gradients (no optimizer step).
//
// Standalone: for each mode, `--repeats` repeats of `--steps` steps; one JSON line per mode
// with the median seconds per step.
// --serve (used by bench/run to interleave the two sides): prints {"ready": ...} once every
// mode is warmed up, then answers stdin commands, one JSON line each:
//   run MODE N   -> {"mode": MODE, "steps": N, "sec": SECONDS}
//   info         -> {"info": {MODE: {"loss": ..., "executor_threads": ..., ...}}}
//   quit
#include <cstorch/cstorch.h>
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace cs = cstorch;
using cs::Tensor;
using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

namespace {

std::vector<char> read_file(const std::string& path, size_t bytes) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot open " + path);
  std::vector<char> buf(bytes);
  f.read(buf.data(), static_cast<std::streamsize>(bytes));
  if (static_cast<size_t>(f.gcount()) != bytes)
    throw std::runtime_error(
        fmt::format("{}: expected {} bytes, read {}", path, bytes, f.gcount()));
  return buf;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct Options {
  std::vector<int64_t> hidden;
  uint64_t seed;
  double lr, momentum;
};

// One mode: its own model, optimizer and (for traced modes) traced function.
class Runner {
 public:
  Runner(std::string mode, const Options& o, const std::vector<Tensor>& X,
         const std::vector<Tensor>& Y, cs::Device device)
      : mode_(std::move(mode)), X_(X), Y_(Y), traced_(mode_.starts_with("traced")) {
    cs::manual_seed(o.seed);
    int64_t in = 784;
    for (auto h : o.hidden) {
      model_->push_back(cs::nn::Linear(in, h).module());
      model_->push_back(cs::nn::ReLU().module());
      in = h;
    }
    model_->push_back(cs::nn::Linear(in, 10).module());
    model_->to(device);
    opt_ = std::make_shared<cs::optim::SGD>(model_->parameters(), o.lr, o.momentum);

    auto model = model_;
    auto opt = opt_;
    auto body = [model, opt](const Tensor& x, const Tensor& y) {
      auto loss = cs::cross_entropy(model(x), y);
      loss.backward();
      opt->step();
      opt->zero_grad();
      return loss;
    };
    auto forward = [model](const Tensor& x, const Tensor& y) {
      return cs::cross_entropy(model(x), y);
    };
    auto forward_backward = [model, opt](const Tensor& x, const Tensor& y) {
      auto loss = cs::cross_entropy(model(x), y);
      loss.backward();
      opt->zero_grad();
      return loss;
    };
    // The gradients are returned as outputs so the traced backward stays live (not removed as
    // dead code); zero_grad at the end as in the full step. (Calling zero_grad first instead
    // retraces on every call, and accumulating gradients across calls intermittently fails:
    // see bench/README.md.)
    auto fwd_bwd_traced = cs::trace(
        [model, opt](const Tensor& x, const Tensor& y) {
          auto loss = cs::cross_entropy(model(x), y);
          loss.backward();
          std::vector<Tensor> out = {loss};
          for (auto& p : model->parameters()) out.push_back(p.grad());
          opt->zero_grad();
          return out;
        },
        "bench_forward_backward");
    // PyTorch's usual order: zero_grad first.
    auto zero_first = [model, opt](const Tensor& x, const Tensor& y) {
      opt->zero_grad();
      auto loss = cs::cross_entropy(model(x), y);
      loss.backward();
      opt->step();
      return loss;
    };
    if (mode_ == "traced")
      step_ = cs::trace(body, "bench_step");
    else if (mode_ == "traced_zero_first")
      step_ = cs::trace(zero_first, "bench_step_zero_first");
    else if (mode_ == "eager")
      step_ = body;
    else if (mode_ == "forward")
      step_ = forward;
    else if (mode_ == "forward_backward")
      step_ = forward_backward;
    else if (mode_ == "traced_forward")
      step_ = cs::trace(forward, "bench_forward");
    else if (mode_ == "traced_forward_backward")
      step_ = [fwd_bwd_traced](const Tensor& x, const Tensor& y) mutable {
        return fwd_bwd_traced(x, y)[0];
      };
    else
      throw std::runtime_error("unknown mode " + mode_ +
                               " (traced, eager, forward, forward_backward, traced_forward, "
                               "traced_forward_backward, traced_zero_first)");
  }

  void run(int64_t n) {
    for (int64_t s = 0; s < n; ++s, ++i_) loss_ = step_(X_[i_ % X_.size()], Y_[i_ % Y_.size()]);
    if (traced_)
      cs::synchronize();
    else
      (void)loss_.item<float>();
  }
  // Seconds for n steps, from an idle executor to the last step's result.
  double timed(int64_t n) {
    if (traced_) cs::synchronize();
    auto t0 = Clock::now();
    run(n);
    return std::chrono::duration<double>(Clock::now() - t0).count();
  }
  double warmup(int64_t n) {
    double s = timed(n);
    if (traced_) {  // the thread count the executor thread (where traced steps run) sees
      auto probe = cs::step_closure([this]() { executor_threads_ = cs::get_num_threads(); });
      probe();
      cs::synchronize();
    }
    return s;
  }
  json info() const {
    float l = loss_.defined() ? loss_.item<float>() : NAN;
    json j = {{"loss", std::isfinite(l) ? json(l) : json(std::to_string(l))}};
    if (executor_threads_ >= 0) j["executor_threads"] = executor_threads_;
    return j;
  }
  const std::string& mode() const { return mode_; }

 private:
  std::string mode_;
  const std::vector<Tensor>& X_;
  const std::vector<Tensor>& Y_;
  bool traced_;
  cs::nn::Sequential model_;
  std::shared_ptr<cs::optim::SGD> opt_;
  std::function<Tensor(const Tensor&, const Tensor&)> step_;
  Tensor loss_;
  size_t i_ = 0;
  int executor_threads_ = -1;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"cstorch FC-MNIST training-step benchmark"};
  Options o{{256, 256}, 0, 0.01, 0.9};
  int64_t batch = 128, batches = 8, warmup = 20, steps = 100, repeats = 7;
  int threads = 1, lookahead = 0;
  bool serve = false;
  std::string data_prefix, device = "CPU";
  std::vector<std::string> modes = {"traced", "eager"};
  app.add_option("--hidden", o.hidden, "Hidden layer sizes")->delimiter(',');
  app.add_option("--batch", batch, "Batch size");
  app.add_option("--batches", batches, "Distinct batches in the data files (cycled)");
  app.add_option("--data", data_prefix, "Data file prefix: PREFIX.x.f32 and PREFIX.y.i64")
      ->required();
  app.add_option("--threads", threads, "Compute threads");
  app.add_option("--device", device, "CPU or GPU: where the model, the batches and the steps live");
  app.add_option("--warmup", warmup, "Warm-up steps per mode (not timed)");
  app.add_option("--steps", steps, "Steps per timed repeat (standalone)");
  app.add_option("--repeats", repeats, "Timed repeats, the median is reported (standalone)");
  app.add_option("--seed", o.seed, "Parameter initialisation seed");
  app.add_option("--lr", o.lr, "SGD learning rate");
  app.add_option("--momentum", o.momentum, "SGD momentum");
  app.add_option("--modes", modes,
                 "traced, eager, forward, forward_backward, traced_forward, "
                 "traced_forward_backward, traced_zero_first")
      ->delimiter(',');
  app.add_option("--lookahead", lookahead, "cs::set_lookahead(N) before running (0: the default)");
  bool flush_denormal = false;
  app.add_flag("--flush-denormal", flush_denormal, "cs::set_flush_denormal(true) before running");
  app.add_flag("--serve", serve,
               "Warm up, then run timed repeats on command from stdin (bench/run)");
  CLI11_PARSE(app, argc, argv);

  try {
    cs::set_num_threads(threads);
    if (flush_denormal) cs::set_flush_denormal(true);
    if (lookahead > 0) cs::set_lookahead(lookahead);
    auto backend = cs::backend(device);

    // Data: `batches` batches of [batch, 784] f32 and [batch] i64, in memory.
    size_t xs = static_cast<size_t>(batches * batch * 784),
           ys = static_cast<size_t>(batches * batch);
    auto xbuf = read_file(data_prefix + ".x.f32", xs * sizeof(float));
    auto ybuf = read_file(data_prefix + ".y.i64", ys * sizeof(int64_t));
    std::vector<Tensor> X, Y;
    for (int64_t b = 0; b < batches; ++b) {
      X.push_back(
          cs::from_blob(xbuf.data() + b * batch * 784 * sizeof(float), {batch, 784}, cs::DType::f32)
              .to(backend->device()));
      Y.push_back(cs::from_blob(ybuf.data() + b * batch * sizeof(int64_t), {batch}, cs::DType::i64)
                      .to(backend->device()));
    }

    std::vector<std::unique_ptr<Runner>> runners;
    json warm = json::object();
    for (const auto& m : modes) {
      runners.push_back(std::make_unique<Runner>(m, o, X, Y, backend->device()));
      warm[m] = runners.back()->warmup(warmup);
    }
    auto find = [&](const std::string& m) -> Runner& {
      for (auto& r : runners)
        if (r->mode() == m) return *r;
      throw std::runtime_error("mode " + m + " was not set up (--modes)");
    };
    auto emit = [](const json& j) {
      std::printf("%s\n", j.dump().c_str());
      std::fflush(stdout);
    };

    if (serve) {
      emit({{"ready", true},
            {"side", "cstorch"},
            {"threads", threads},
            {"main_threads", cs::get_num_threads()},
            {"warmup_s", warm}});
      std::string line;
      while (std::getline(std::cin, line)) {
        std::istringstream in(line);
        std::string cmd, m;
        int64_t n = 0;
        in >> cmd;
        if (cmd == "run") {
          in >> m >> n;
          if (n <= 0) throw std::runtime_error("bad command: " + line);
          double s = find(m).timed(n);
          emit({{"mode", m}, {"steps", n}, {"sec", s}});
        } else if (cmd == "info") {
          json j = json::object();
          for (auto& r : runners) j[r->mode()] = r->info();
          j["traces"] = cs::runtime_stats().traces;
          j["executions"] = cs::runtime_stats().executions;
          emit({{"info", j}});
        } else if (cmd == "quit" || cmd.empty()) {
          break;
        } else {
          throw std::runtime_error("unknown command: " + line);
        }
      }
      return 0;
    }

    for (auto& r : runners) {
      std::vector<double> per_step;
      for (int64_t k = 0; k < repeats; ++k)
        per_step.push_back(r->timed(steps) / static_cast<double>(steps));
      json out = {{"side", "cstorch"},
                  {"mode", r->mode()},
                  {"threads", threads},
                  {"batch", batch},
                  {"hidden", o.hidden},
                  {"warmup", warmup},
                  {"steps", steps},
                  {"repeats", repeats},
                  {"sec_per_step", median(per_step)},
                  {"min_sec_per_step", *std::min_element(per_step.begin(), per_step.end())},
                  {"repeat_sec_per_step", per_step},
                  {"warmup_s", warm[r->mode()]}};
      out.update(r->info());
      emit(out);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_fc_mnist: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
