// A Model Zoo plugin built outside the cstorch tree: registers the model "external_regression"
// (an MLP with a mean-squared-error loss) and the data processor "ExternalRegressionData"
// (in-memory samples of a fixed random teacher network), so a YAML file can name both and
//   cszoo fit regression.yaml --plugin_paths regression_plugin.so
// trains it without rebuilding cszoo. See regression.yaml.
#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include <cstorch/cstorch.h>
#include <modelzoo/model.h>

namespace {

namespace cs = cstorch;

class ExternalRegression : public modelzoo::Model {
 public:
  ExternalRegression(int64_t in, int64_t hidden)
      : Model("ExternalRegression"),
        net_(cs::nn::Linear(in, hidden), cs::nn::ReLU(), cs::nn::Linear(hidden, 1)) {
    register_module("net", net_.ptr());
  }
  // Batch keys: "x" [B, in] f32, "y" [B, 1] f32.
  cs::Tensor loss(const cs::Batch& b) override { return cs::mse_loss(net_(b.at("x")), b.at("y")); }

 private:
  cs::nn::Sequential net_;
};

MODELZOO_REGISTER(models, "external_regression",
                  [](const modelzoo::ConfigView& a) -> modelzoo::ModelPtr {
                    a.check_keys({"in_features", "hidden_size"});
                    int64_t in = a.get_int("in_features", 4), hidden = a.get_int("hidden_size", 32);
                    if (in < 1 || hidden < 1)
                      a.error(
                          fmt::format("sizes must be positive, got in_features {}, "
                                      "hidden_size {}",
                                      in, hidden));
                    return std::make_shared<ExternalRegression>(in, hidden);
                  });

// `num_samples` rows of y = sum_j tanh(x . w_j) v_j (8 hidden units), the same for every run:
// drawn on the host from a generator of its own (`seed`), so building the data (in a DataLoader
// worker thread) never touches cstorch's global generator, which initialises the model.
cs::Tensor teacher_data(int64_t rows, int64_t cols, uint64_t seed, cs::Tensor* y) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t hidden = 8;
  std::vector<float> w(static_cast<size_t>(cols * hidden)), v(hidden);
  for (float& e : w) e = normal(gen);
  for (float& e : v) e = normal(gen);
  std::vector<float> xs(static_cast<size_t>(rows * cols)), ys(static_cast<size_t>(rows));
  for (float& e : xs) e = normal(gen);
  for (int64_t r = 0; r < rows; ++r) {
    float out = 0;
    for (int64_t j = 0; j < hidden; ++j) {
      float pre = 0;
      for (int64_t c = 0; c < cols; ++c) pre += xs[r * cols + c] * w[c * hidden + j];
      out += std::tanh(pre) * v[j];
    }
    ys[r] = out;
  }
  *y = cs::from_vector(ys, {rows, 1});
  return cs::from_vector(xs, {rows, cols});
}

MODELZOO_REGISTER(data_processors, "ExternalRegressionData",
                  [](const modelzoo::ConfigView& a) -> modelzoo::DataLoaderPtr {
                    a.check_keys({"data_processor", "batch_size", "num_samples", "in_features",
                                  "seed", "shuffle"});
                    int64_t batch = a.at("batch_size").as_int();
                    int64_t n = a.get_int("num_samples", 512), in = a.get_int("in_features", 4);
                    if (batch < 1 || n < 1 || in < 1)
                      a.error("batch_size, num_samples and in_features must be positive");
                    cs::Config args = {{"batch_size", batch},
                                       {"num_samples", n},
                                       {"in_features", in},
                                       {"seed", a.get_int("seed", 7)},
                                       {"shuffle", a.get_bool("shuffle", true)}};
                    auto input_fn = [](const cs::Config& c, const cs::utils::data::WorkerInfo& w)
                        -> std::shared_ptr<cs::utils::data::Loader> {
                      cs::Tensor y;
                      cs::Tensor x = teacher_data(c.at("num_samples").get<int64_t>(),
                                                  c.at("in_features").get<int64_t>(),
                                                  c.at("seed").get<uint64_t>(), &y);
                      return std::make_shared<cs::utils::data::TensorLoader>(
                          cs::Batch{{"x", x}, {"y", y}}, c.at("batch_size").get<int64_t>(),
                          c.at("shuffle").get<bool>(), c.at("seed").get<uint64_t>(),
                          /*drop_last=*/true, w);
                    };
                    return std::make_shared<cs::utils::data::DataLoader>(input_fn, args);
                  });

}  // namespace
