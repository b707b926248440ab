// cstorch side of the encoder-decoder training-step benchmarks (bench/run cases
// transformer_tiny and t5_tiny; PyTorch peer: bench/seq2seq_peer.py).
//
// One training step = loss of a padded seq2seq batch (the model's tiny config, dropout 0),
// backward, AdamW step, zero_grad. Batches are a deterministic function of (step, row,
// position) that the peer computes identically; 8 distinct batches are cycled. Modes:
//   traced: the step through cs::trace (synchronize before the clock starts and at the end);
//   eager:  the step body called directly (loss.item() after the last step).
// --print_config prints the model's configuration (JSON) and exits: bench/run passes it to
// the peer, so both build the same shapes.
// --serve: prints {"ready": ...} after the warm-up, then answers stdin commands:
//   run MODE N -> {"mode": MODE, "steps": N, "sec": S};  info -> {"info": {...}};  quit
#include <cstorch/cstorch.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "modelzoo/models/t5/t5.h"
#include "modelzoo/models/transformer/transformer.h"

namespace cs = cstorch;
using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

namespace {

json model_config(const std::string& model) {
  if (model == "transformer") {
    auto c = modelzoo::transformer::TransformerConfig::tiny();
    return {{"src_vocab_size", c.src_vocab_size},
            {"tgt_vocab_size", c.tgt_vocab_size},
            {"d_model", c.d_model},
            {"num_heads", c.num_heads},
            {"encoder_num_hidden_layers", c.encoder_num_hidden_layers},
            {"decoder_num_hidden_layers", c.decoder_num_hidden_layers},
            {"d_ff", c.d_ff},
            {"src_max_position_embeddings", c.src_max_position_embeddings},
            {"tgt_max_position_embeddings", c.tgt_max_position_embeddings},
            {"dropout_rate", 0.0},
            {"attention_dropout_rate", 0.0},
            {"layer_norm_epsilon", c.layer_norm_epsilon},
            {"label_smoothing", c.label_smoothing},
            {"share_encoder_decoder_embedding", c.share_encoder_decoder_embedding},
            {"share_embedding_weights", c.share_embedding_weights}};
  }
  if (model == "t5") {
    auto c = modelzoo::t5::T5Config::tiny();
    return {{"src_vocab_size", c.src_vocab_size},
            {"tgt_vocab_size", c.tgt_vocab_size},
            {"d_model", c.d_model},
            {"d_kv", c.d_kv},
            {"d_ff", c.d_ff},
            {"num_heads", c.num_heads},
            {"encoder_num_hidden_layers", c.encoder_num_hidden_layers},
            {"decoder_num_hidden_layers", c.decoder_num_hidden_layers},
            {"relative_attention_num_buckets", c.relative_attention_num_buckets},
            {"relative_attention_max_distance", c.relative_attention_max_distance},
            {"src_max_position_embeddings", c.src_max_position_embeddings},
            {"tgt_max_position_embeddings", c.tgt_max_position_embeddings},
            {"dropout_rate", 0.0},
            {"layer_norm_epsilon", c.layer_norm_epsilon},
            {"label_smoothing", c.label_smoothing},
            {"share_encoder_decoder_embedding", c.share_encoder_decoder_embedding},
            {"share_embedding_weights", c.share_embedding_weights}};
  }
  throw std::runtime_error("unknown --model " + model + " (transformer, t5)");
}

// The batch of step k (bench/seq2seq_peer.py computes the same): row r has 4r padded source
// and 2r padded target positions.
cs::Batch make_batch(int64_t k, int64_t B, int64_t S, int64_t T, int64_t vocab) {
  std::vector<int32_t> ids(B * S), am(B * S), dids(B * T), dam(B * T), labels(B * T);
  for (int64_t r = 0; r < B; ++r) {
    for (int64_t i = 0; i < S; ++i) {
      const bool real = i < S - 4 * r;
      ids[r * S + i] =
          real ? static_cast<int32_t>(1 + (k * 131 + r * 31 + i * 17) % (vocab - 1)) : 0;
      am[r * S + i] = real;
    }
    for (int64_t i = 0; i < T; ++i) {
      const bool real = i < T - 2 * r;
      labels[r * T + i] = real ? static_cast<int32_t>((k * 7 + r * 11 + i * 5) % vocab) : -100;
      dids[r * T + i] = (i == 0 || !real) ? 0 : labels[r * T + i - 1];
      dam[r * T + i] = real;
    }
  }
  return {{"input_ids", cs::from_vector(ids, {B, S})},
          {"attention_mask", cs::from_vector(am, {B, S})},
          {"decoder_input_ids", cs::from_vector(dids, {B, T})},
          {"decoder_attention_mask", cs::from_vector(dam, {B, T})},
          {"labels", cs::from_vector(labels, {B, T})}};
}

class Runner {
 public:
  Runner(const std::string& mode, const std::string& model, const json& cfg,
         const std::vector<cs::Batch>& batches)
      : mode_(mode), batches_(batches) {
    cs::manual_seed(0);
    modelzoo::Config c = cs::parse_config(cfg.dump());
    model_ = modelzoo::models().create(model, modelzoo::ConfigView(c, "model"), "model.name");
    opt_ = std::make_shared<cs::optim::AdamW>(model_->parameters(), 1e-3);
    auto m = model_;
    auto opt = opt_;
    auto body = [m, opt](const cs::Batch& b) {
      cs::Tensor loss = m->loss(b);
      loss.backward();
      opt->step();
      opt->zero_grad();
      return loss;
    };
    traced_ = mode == "traced";
    if (traced_)
      step_ = cs::trace(body, "bench_seq2seq_step");
    else if (mode == "eager")
      step_ = body;
    else
      throw std::runtime_error("unknown mode " + mode + " (traced, eager)");
  }
  double timed(int64_t n) {
    if (traced_) cs::synchronize();
    auto t0 = Clock::now();
    for (int64_t s = 0; s < n; ++s, ++i_) loss_ = step_(batches_[i_ % batches_.size()]);
    if (traced_)
      cs::synchronize();
    else
      (void)loss_.item<float>();
    return std::chrono::duration<double>(Clock::now() - t0).count();
  }
  json info() const {
    const float l = loss_.defined() ? loss_.item<float>() : NAN;
    return {{"loss", std::isfinite(l) ? json(l) : json(std::to_string(l))}};
  }
  const std::string& mode() const { return mode_; }

 private:
  std::string mode_;
  const std::vector<cs::Batch>& batches_;
  modelzoo::ModelPtr model_;
  std::shared_ptr<cs::optim::AdamW> opt_;
  std::function<cs::Tensor(const cs::Batch&)> step_;
  cs::Tensor loss_;
  size_t i_ = 0;
  bool traced_ = false;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"cstorch encoder-decoder training-step benchmark"};
  std::string model = "t5";
  int64_t batch = 8, src_len = 64, tgt_len = 64, warmup = 10, steps = 20, repeats = 5;
  int threads = 1;
  bool serve = false, print_config = false;
  std::vector<std::string> modes = {"traced", "eager"};
  app.add_option("--model", model, "transformer or t5 (tiny configuration)");
  app.add_option("--batch", batch, "Batch size");
  app.add_option("--src_len", src_len, "Source length");
  app.add_option("--tgt_len", tgt_len, "Target length");
  app.add_option("--threads", threads, "Compute threads");
  app.add_option("--warmup", warmup, "Warm-up steps per mode");
  app.add_option("--steps", steps, "Steps per timed repeat (standalone)");
  app.add_option("--repeats", repeats, "Timed repeats (standalone)");
  app.add_option("--modes", modes, "traced, eager")->delimiter(',');
  app.add_flag("--serve", serve, "Warm up, then run timed repeats on command (bench/run)");
  app.add_flag("--print_config", print_config, "Print the model configuration and exit");
  CLI11_PARSE(app, argc, argv);
  auto emit = [](const json& j) {
    std::printf("%s\n", j.dump().c_str());
    std::fflush(stdout);
  };
  try {
    const json cfg = model_config(model);
    if (print_config) {
      emit(cfg);
      return 0;
    }
    cs::set_num_threads(threads);
    std::vector<cs::Batch> batches;
    for (int64_t k = 0; k < 8; ++k)
      batches.push_back(
          make_batch(k, batch, src_len, tgt_len, cfg["src_vocab_size"].get<int64_t>()));
    std::vector<std::unique_ptr<Runner>> runners;
    json warm = json::object();
    for (const auto& m : modes) {
      runners.push_back(std::make_unique<Runner>(m, model, cfg, batches));
      warm[m] = runners.back()->timed(warmup);
    }
    auto find = [&](const std::string& m) -> Runner& {
      for (auto& r : runners)
        if (r->mode() == m) return *r;
      throw std::runtime_error("mode " + m + " was not set up (--modes)");
    };
    if (serve) {
      emit({{"ready", true}, {"side", "cstorch"}, {"threads", threads}, {"warmup_s", warm}});
      std::string line;
      while (std::getline(std::cin, line)) {
        std::istringstream in(line);
        std::string cmd, m;
        int64_t n = 0;
        in >> cmd;
        if (cmd == "run") {
          in >> m >> n;
          if (n <= 0) throw std::runtime_error("bad command: " + line);
          emit({{"mode", m}, {"steps", n}, {"sec", find(m).timed(n)}});
        } else if (cmd == "info") {
          json j = json::object();
          for (auto& r : runners) j[r->mode()] = r->info();
          j["traces"] = cs::runtime_stats().traces;
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
      std::vector<double> per;
      for (int64_t k = 0; k < repeats; ++k)
        per.push_back(r->timed(steps) / static_cast<double>(steps));
      std::sort(per.begin(), per.end());
      emit({{"side", "cstorch"},
            {"model", model},
            {"mode", r->mode()},
            {"threads", threads},
            {"sec_per_step", per[per.size() / 2]},
            {"loss", r->info()["loss"]}});
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_seq2seq: %s\n", e.what());
    return 1;
  }
  return 0;
}
