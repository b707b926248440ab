// The Model Zoo's language models (gpt2, bert, transformer, t5) at toy sizes, their batches, and
// a traced training run on any device from the same initial weights: per-step losses and final
// parameters, for comparing a device with the CPU. Used by the device-layer tests (the checking
// device), the CUDA capability test (tests/unit/device/) and the GPU tests (tests/cuda/).
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <cstorch/cstorch.h>

#include "modelzoo/model.h"
#include "modelzoo/registry.h"
#include "runtime/run_mode.h"

namespace cstorch::testing {

inline std::shared_ptr<modelzoo::Model> zoo_model(const std::string& name,
                                                  const std::string& yaml) {
  auto cfg = parse_config(yaml);
  return modelzoo::models().create(name, modelzoo::ConfigView(cfg, "model"), "model.name");
}

// A toy configuration of `name` (vocabulary 64, two heads, sequences up to 12-16 tokens).
inline std::string lm_yaml(const std::string& name, double dropout) {
  const std::string d = "dropout_rate: " + std::to_string(dropout) + "\n";
  return name == "gpt2" || name == "bert"
             ? "vocab_size: 64\nhidden_size: 32\nnum_hidden_layers: 2\nnum_heads: 2\n"
               "max_position_embeddings: 16\nfilter_size: 64\n" +
                   d
             : "vocab_size: 64\nd_model: 16\nnum_heads: 2\nd_ff: 32\nencoder_num_hidden_layers: "
               "1\ndecoder_num_hidden_layers: 1\nmax_position_embeddings: 12\n" +
                   d;
}

// A batch of B = 2 sequences of T = 8 tokens for `name`, with a padded position and (for the
// encoder-decoder models) an ignored label. `shift` varies the token ids.
inline Batch text_batch(const std::string& name, int shift = 0) {
  const int64_t B = 2, T = 8;
  std::vector<int32_t> ids(B * T), mask(B * T, 1), labels(B * T), types(B * T, 0);
  for (size_t i = 0; i < ids.size(); ++i) {
    ids[i] = static_cast<int32_t>((i * 7 + 3 + shift) % 64);
    labels[i] = static_cast<int32_t>((i * 5 + 1 + shift) % 64);
  }
  mask[15] = 0;
  Batch b{{"input_ids", from_vector(ids, {B, T})}, {"attention_mask", from_vector(mask, {B, T})}};
  if (name == "gpt2") {
    b["labels"] = from_vector(labels, {B, T});
  } else if (name == "bert") {
    b["token_type_ids"] = from_vector(types, {B, T});
    b["mlm_labels"] = from_vector(labels, {B, T});
    b["next_sentence_label"] = from_vector(std::vector<int32_t>{0, 1}, {B});
  } else {  // transformer, t5
    std::vector<int32_t> dids(B * T), dmask(B * T, 1);
    for (size_t i = 0; i < dids.size(); ++i)
      dids[i] = static_cast<int32_t>((i * 3 + 2 + shift) % 64);
    dmask[B * T - 1] = 0;
    labels[B * T - 1] = -100;
    b["decoder_input_ids"] = from_vector(dids, {B, T});
    b["decoder_attention_mask"] = from_vector(dmask, {B, T});
    b["labels"] = from_vector(labels, {B, T});
  }
  return b;
}

struct LmRun {
  std::vector<float> losses;   // one per step
  std::vector<Tensor> params;  // final parameters, on the CPU
};

// `steps` traced training steps of the model on `dev` (batches taken in turn), from the weights
// seed 11 gives, with the optimizer make_opt builds.
inline LmRun lm_run(Device dev, const std::string& name, const std::string& yaml,
                    const std::function<std::unique_ptr<optim::Optimizer>(nn::Module&)>& make_opt,
                    const std::vector<Batch>& batches, int steps) {
  runtime::StepDeviceScope scope(dev);
  manual_seed(11);
  auto model = zoo_model(name, yaml);
  model->to(dev);
  auto opt = make_opt(*model);
  auto step = trace([&](const Batch& b) {
    Tensor l = model->loss(b);
    l.backward();
    opt->step();
    opt->zero_grad();
    return l;
  });
  LmRun r;
  for (int s = 0; s < steps; ++s)
    r.losses.push_back(step(batches[s % batches.size()]).template item<float>());
  for (auto& p : model->parameters()) r.params.push_back(p.to(Device{}));
  return r;
}

}  // namespace cstorch::testing
