// cstorch side of the transformer benchmarks (bench/run cases gpt2_tiny, bert_tiny): a traced
// training step (forward, loss, backward, AdamW) of the Model Zoo GPT-2 or BERT on fixed random
// token batches. Prints one JSON line: seconds per step (median of repeats), tokens/s, the
// model FLOPs per step (6 N tokens + attention: 12 L B T^2 E for forward + backward of the two
// attention GEMMs) and the measured single-GEMM f32 peak of this machine at this thread count
// (the best of a few square and model-shaped sgemms through cstorch::matmul; CPU only). With
// --device GPU the model, the batch and the step live on the GPU (bench/run gpt2_124m_cuda).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>

#include "cstorch/cstorch.h"
#include "modelzoo/models/bert/bert.h"
#include "modelzoo/models/gpt2/gpt2.h"

namespace cs = cstorch;
using Clock = std::chrono::steady_clock;

static double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Best GFLOP/s of f32 matmuls (the machine's SGEMM peak as cstorch reaches it).
static double sgemm_peak() {
  double best = 0;
  for (int64_t n : {512, 1024}) {
    cs::Tensor a = cs::rand({n, n}), b = cs::rand({n, n});
    cs::matmul(a, b).data_ptr();
    for (int r = 0; r < 3; ++r) {
      auto t = Clock::now();
      cs::Tensor c = cs::matmul(a, b);
      c.data_ptr();
      best = std::max(best, 2.0 * n * n * n / seconds_since(t) / 1e9);
    }
  }
  return best;
}

int main(int argc, char** argv) {
  CLI::App app{"bench_transformer"};
  std::string model = "gpt2";
  int threads = 1, steps = 10, warmup = 3, repeats = 3;
  int64_t layers = 4, width = 256, heads = 4, T = 128, vocab = 8192, batch = 8;
  app.add_option("--model", model);
  app.add_option("--threads", threads);
  app.add_option("--steps", steps);
  app.add_option("--warmup", warmup);
  app.add_option("--repeats", repeats);
  app.add_option("--layers", layers);
  app.add_option("--width", width);
  app.add_option("--heads", heads);
  app.add_option("--seq", T);
  app.add_option("--vocab", vocab);
  app.add_option("--batch", batch);
  std::string precision = "f32";
  app.add_option("--precision", precision, "bf16: the forward under autocast (bf16 products)")
      ->check(CLI::IsMember({"f32", "bf16"}));
  bool recompute = false;
  app.add_flag("--recompute", recompute, "activation recomputation in every layer");
  std::string device = "CPU";
  app.add_option("--device", device, "CPU or GPU: where the model, the batch and the step live");
  CLI11_PARSE(app, argc, argv);
  cs::set_num_threads(threads);
  const cs::Device dev = cs::backend(device)->device();
  cs::manual_seed(0);
  std::shared_ptr<modelzoo::Model> m;
  if (model == "gpt2") {
    auto c = modelzoo::gpt2::GPT2Config::tiny();
    c.vocab_size = vocab;
    c.hidden_size = width;
    c.num_hidden_layers = layers;
    c.num_heads = heads;
    c.filter_size = 4 * width;
    c.max_position_embeddings = T;
    c.dropout_rate = c.attention_dropout_rate = c.embedding_dropout_rate = 0;
    c.recompute = recompute;
    m = std::make_shared<modelzoo::gpt2::GPT2Model>(c);
  } else {
    auto c = modelzoo::bert::BertConfig::tiny();
    c.vocab_size = vocab;
    c.hidden_size = width;
    c.num_hidden_layers = layers;
    c.num_heads = heads;
    c.filter_size = 4 * width;
    c.max_position_embeddings = T;
    c.dropout_rate = c.attention_dropout_rate = 0;
    c.recompute = recompute;
    m = std::make_shared<modelzoo::bert::BertModel>(c);
  }
  m->to(dev);
  int64_t nparams = 0;
  for (auto& p : m->parameters()) nparams += p.numel();
  std::vector<int32_t> ids(batch * T), ones(batch * T, 1), labels(batch * T), types(batch * T, 0),
      mlm(batch * T, -100);
  uint64_t s = 12345;
  for (size_t i = 0; i < ids.size(); ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    ids[i] = static_cast<int32_t>((s >> 33) % static_cast<uint64_t>(vocab));
    labels[i] = static_cast<int32_t>((s >> 13) % static_cast<uint64_t>(vocab));
    if (i % 7 == 0) mlm[i] = labels[i];  // ~15% predicted positions
  }
  cs::Batch b{{"input_ids", cs::from_vector(ids, {batch, T})},
              {"attention_mask", cs::from_vector(ones, {batch, T})}};
  if (model == "gpt2") {
    b["labels"] = cs::from_vector(labels, {batch, T});
  } else {
    b["token_type_ids"] = cs::from_vector(types, {batch, T});
    b["mlm_labels"] = cs::from_vector(mlm, {batch, T});
    b["next_sentence_label"] = cs::from_vector(std::vector<int32_t>(batch, 1), {batch});
  }
  for (auto& [k, t] : b) t = t.to(dev);
  cs::optim::AdamW opt(m->parameters(), 1e-4);
  auto step = cs::trace([&](const cs::Batch& x) {
    std::optional<cs::amp::autocast> ac;
    if (precision == "bf16") ac.emplace(cs::DType::bf16);
    cs::Tensor l = m->loss(x);
    ac.reset();
    l.backward();
    opt.step();
    opt.zero_grad();
    return l;
  });
  auto tw = Clock::now();
  step(b).item<float>();  // traced, compiled and run once
  const double first = seconds_since(tw);
  for (int i = 1; i < warmup; ++i) step(b).item<float>();
  const double warm = seconds_since(tw);
  std::vector<double> per;
  double loss = 0;
  for (int r = 0; r < repeats; ++r) {
    auto t = Clock::now();
    cs::Tensor l;
    for (int i = 0; i < steps; ++i) l = step(b);
    loss = l.item<double>();
    per.push_back(seconds_since(t) / steps);
  }
  std::sort(per.begin(), per.end());
  const double sec = per[per.size() / 2];
  const double tokens = static_cast<double>(batch * T);
  const double flops = 6.0 * static_cast<double>(nparams) * tokens +
                       12.0 * layers * batch * static_cast<double>(T) * T * width;
  nlohmann::json j{{"model", model},
                   {"threads", threads},
                   {"sec_per_step", sec},
                   {"min_sec_per_step", per[0]},
                   {"tokens_per_s", tokens / sec},
                   {"params", nparams},
                   {"flops_per_step", flops},
                   {"gflops", flops / sec / 1e9},
                   {"sgemm_peak_gflops", dev.type == cs::DeviceType::CPU ? sgemm_peak() : 0.0},
                   {"device", cs::device_str(dev)},
                   {"first_step_s", first},
                   {"loss", loss},
                   {"precision", precision},
                   {"warmup_s", warm}};
  std::printf("%s\n", j.dump().c_str());
  return 0;
}
