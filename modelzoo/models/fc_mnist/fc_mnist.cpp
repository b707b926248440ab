// FC-MNIST for the Trainer: the model ("fc_mnist": `depth` hidden layers of `hidden_size`, or
// an explicit `hidden_sizes` list, ReLU, optional dropout, cross-entropy loss over
// `num_classes` classes from `input_size` features: 784 and 10 for MNIST, anything for a
// table brought with CSVDataProcessor and the like) and the
// "MNISTDataProcessor" over MNIST IDX files (synthetic digits are written first when the
// folder has none and `synthetic` is true, the default).
#include <cstdio>

#include "cstorch/data/dataset.h"
#include "cstorch/data/mnist.h"
#include "cstorch/metrics.h"
#include "cstorch/nn/functional.h"
#include "cstorch/nn/layers.h"
#include "modelzoo/data/loader_args.h"
#include "modelzoo/model.h"

namespace modelzoo {
namespace {

namespace cs = cstorch;

class FcMnist : public Model {
 public:
  FcMnist(int64_t input_size, int64_t num_classes, const std::vector<int64_t>& hidden,
          double dropout)
      : Model("FcMnist"), input_size_(input_size), num_classes_(num_classes) {
    int64_t in = input_size;
    for (size_t i = 0; i < hidden.size(); ++i) {
      net_->push_back(cs::nn::Linear(in, hidden[i]).module());
      net_->push_back(cs::nn::ReLU().module());
      if (dropout > 0) net_->push_back(cs::nn::Dropout(dropout).module());
      in = hidden[i];
    }
    net_->push_back(cs::nn::Linear(in, num_classes).module());
    register_module("net", net_.ptr());
  }
  cs::Tensor loss(const cs::Batch& b) override {
    check_batch(b);
    cs::Tensor logits = net_(b.at("x"));
    if (!is_training()) accuracy_.update(b.at("y"), cs::argmax(logits, -1));
    return cs::nn::functional::cross_entropy(logits, b.at("y"));
  }

 private:
  // What the data must look like, said in the data's terms (a wrong column count or label type
  // otherwise fails inside a layer or the loss).
  void check_batch(const cs::Batch& b) const {
    for (const char* k : {"x", "y"})
      if (!b.count(k))
        cs::fail(
            "fc_mnist: the batch has no \"{}\" (it needs x: f32 [B, {}] features and y: "
            "i64 [B] class labels)",
            k, input_size_);
    const cs::Tensor &x = b.at("x"), &y = b.at("y");
    if (x.dtype() != cs::DType::f32 || x.dim() != 2 || x.size(1) != input_size_)
      cs::fail("fc_mnist: x must be f32 [B, {}] (input_size {}), got {} {}", input_size_,
               input_size_, cs::dtype_name(x.dtype()), cs::shape_str(x.shape()));
    if (y.dtype() != cs::DType::i64 || y.dim() != 1 || y.size(0) != x.size(0))
      cs::fail("fc_mnist: y must be i64 class labels [{}], got {} {}", x.size(0),
               cs::dtype_name(y.dtype()), cs::shape_str(y.shape()));
    if (!cs::is_tracing()) check_batch_values(b);
  }
  void check_batch_values(const cs::Batch& b) const override {
    auto it = b.find("y");
    if (it == b.end() || !it->second.defined() || it->second.dim() != 1 ||
        !cs::is_integral(it->second.dtype()))
      return;  // loss() names what is wrong
    const auto v = it->second.to_vector<int64_t>();
    for (size_t i = 0; i < v.size(); ++i)
      if (v[i] < 0 || v[i] >= num_classes_)
        cs::fail("fc_mnist: y[{}] = {} is outside the classes 0..{} (num_classes {})", i, v[i],
                 num_classes_ - 1, num_classes_);
  }
  int64_t input_size_, num_classes_;
  cs::nn::Sequential net_;
  cs::metrics::AccuracyMetric accuracy_{"eval/accuracy"};
};

MODELZOO_REGISTER(models, "fc_mnist", [](const ConfigView& a) -> ModelPtr {
  a.check_keys({"depth", "hidden_size", "hidden_sizes", "dropout", "input_size", "num_classes"});
  int64_t input_size = a.get_int("input_size", cs::data::kMnistPixels);
  int64_t num_classes = a.get_int("num_classes", 10);
  if (input_size < 1) a.error(fmt::format("input_size must be at least 1, got {}", input_size));
  if (num_classes < 2) a.error(fmt::format("num_classes must be at least 2, got {}", num_classes));
  std::vector<int64_t> hidden;
  if (a.has("hidden_sizes")) {
    if (a.has("depth") || a.has("hidden_size"))
      a.error("give either hidden_sizes or depth and hidden_size, not both");
    ConfigView hs = a.at("hidden_sizes");
    for (size_t i = 0; i < hs.size(); ++i) hidden.push_back(hs.at(i).as_int());
  } else {
    int64_t depth = a.get_int("depth", 2), width = a.get_int("hidden_size", 256);
    if (depth < 0) a.error(fmt::format("depth must be 0 or more, got {}", depth));
    hidden.assign(static_cast<size_t>(depth), width);
  }
  for (size_t i = 0; i < hidden.size(); ++i)
    if (hidden[i] < 1) a.error(fmt::format("hidden layer {} has size {}", i, hidden[i]));
  double dropout = a.get_double("dropout", 0.0);
  if (dropout < 0 || dropout >= 1)
    cs::fail("{}: must be in [0, 1), got {}", a.child_path("dropout"), dropout);
  return std::make_shared<FcMnist>(input_size, num_classes, hidden, dropout);
});

// Writes the synthetic digits when the folder has none: once, whichever processes (replicas,
// separate runs) or data processors name the same folder at the same time.
void ensure_mnist(const std::string& dir, bool synthetic, const std::string& where) {
  cs::data::write_once(
      dir, [&] { return cs::data::mnist_files_exist(dir); },
      [&] {
        const auto missing = cs::data::mnist_files_missing(dir);
        if (missing.size() < 4)
          cs::fail(
              "{}: '{}' lacks the MNIST file{} {} (an incomplete download?); add {}, or use a "
              "data_dir without MNIST files to have synthetic digits written there",
              where, dir, missing.size() == 1 ? "" : "s", fmt::join(missing, ", "),
              missing.size() == 1 ? "it" : "them");
        if (!synthetic)
          cs::fail("{}: no MNIST files in '{}' (set synthetic: true to generate digits)", where,
                   dir);
        fmt::print("no MNIST files in {}: writing synthetic digits (60000 train, 10000 test)\n",
                   dir);
        std::fflush(stdout);
        cs::data::write_synthetic_mnist(dir, 60000, 10000, 2024);
      });
}

MODELZOO_REGISTER(data_processors, "MNISTDataProcessor", [](const ConfigView& a) -> DataLoaderPtr {
  a.check_keys({"data_processor", "data_dir", "batch_size", "split", "shuffle", "shuffle_seed",
                "drop_last", "synthetic", "num_workers", "prefetch"});
  std::string dir = a.get_string("data_dir", "data/mnist");
  std::string split = a.get_string("split", "train");
  if (split != "train" && split != "test")
    cs::fail("{}: must be train or test, got '{}'", a.child_path("split"), split);
  int64_t batch = a.at("batch_size").as_int();
  if (batch < 1) cs::fail("{}: must be at least 1, got {}", a.child_path("batch_size"), batch);
  bool train = split == "train";
  ensure_mnist(dir, a.get_bool("synthetic", true), a.child_path("data_dir"));
  cs::Config args = {{"data_dir", dir},
                     {"split", split},
                     {"batch_size", batch},
                     {"shuffle", a.get_bool("shuffle", train)},
                     {"seed", a.get_int("shuffle_seed", 0)},
                     {"drop_last", a.get_bool("drop_last", train)}};
  detail::add_loader_args(a, args);
  return std::make_shared<cs::utils::data::DataLoader>(cs::data::mnist_input_fn, args);
});

}  // namespace
}  // namespace modelzoo
