// Multi-replica data parallel end to end, with real MPI launches (mpirun -np 2): collectives,
// 2 replicas with batch B/2 each == 1 replica with batch B, sharded == unsharded optimizer
// state, checkpoint + resume == uninterrupted, the too-few-workers error, and a failing rank
// stopping the whole launch in bounded time.
#include <gtest/gtest.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>

#include "cstorch/checkpoint.h"
#include "cstorch/data/mnist.h"
#include "e2e/e2e_util.h"
#include "modelzoo/loggers.h"

namespace fs = std::filesystem;
using e2e::run;

namespace {

const std::string kBin = CSTORCH_BINARY_DIR;
const std::string kCszoo = kBin + "/cszoo";
const std::string kPlugins = kBin + "/tests/plugins";

using e2e::mpirun;

struct Setup {
  fs::path root, data;
};
const Setup& setup() {
  static Setup s = [] {
    Setup x;
    x.root = e2e::temp_dir("cstorch_dist", "runs");
    x.data = x.root / "mnist";
    cstorch::data::write_synthetic_mnist(x.data.string(), 2000, 300, 11);
    return x;
  }();
  return s;
}

struct Cfg {
  std::string name;
  int max_steps = 20;
  int ckpt_steps = 10;
  std::string backend = "device: CPU";
  std::string train_extra;
  std::string callbacks;
  bool validate = false;
};

// A small FC-MNIST config (global batch 32); returns its path.
std::string write_config(const Cfg& c) {
  const auto& s = setup();
  fs::path dir = s.root / c.name;
  fs::create_directories(dir);
  std::string data = s.data.string();
  std::string y =
      "trainer:\n  init:\n    " + c.backend + "\n    model_dir: " + (dir / "model").string() +
      "\n    seed: 7\n"
      "    model: {name: fc_mnist, hidden_sizes: [32]}\n"
      "    optimizer: {SGD: {lr: 0.05, momentum: 0.9}}\n"
      "    loop: {max_steps: " +
      std::to_string(c.max_steps) + (c.validate ? ", eval_frequency: 10" : "") +
      "}\n    checkpoint: {steps: " + std::to_string(c.ckpt_steps) +
      "}\n    logging: {log_steps: 5}\n" + c.callbacks +
      "  fit:\n    train_dataloader: {data_processor: MNISTDataProcessor, data_dir: " + data +
      ", batch_size: 32, shuffle_seed: 3, synthetic: false" + c.train_extra + "}\n";
  if (c.validate)
    y += "    val_dataloader: {data_processor: MNISTDataProcessor, data_dir: " + data +
         ", split: test, batch_size: 100, synthetic: false}\n";
  std::string path = (dir / "fit.yaml").string();
  std::ofstream(path) << y;
  return path;
}

fs::path ckpt(const std::string& name, int step) {
  return setup().root / name / "model" / ("checkpoint_" + std::to_string(step) + ".mdl");
}

// Largest |a - b| over a tensor relative to the largest |b|, for every model tensor.
void expect_models_close(const fs::path& a, const fs::path& b, double rel) {
  auto sa = cstorch::load(a.string()).at("model"), sb = cstorch::load(b.string()).at("model");
  ASSERT_EQ(sa.keys(), sb.keys());
  for (const auto& k : sa.keys()) {
    auto x = sa.at(k).as_tensor().to_vector<float>(), y = sb.at(k).as_tensor().to_vector<float>();
    ASSERT_EQ(x.size(), y.size()) << k;
    double diff = 0, scale = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      diff = std::max(diff, static_cast<double>(std::fabs(x[i] - y[i])));
      scale = std::max(scale, static_cast<double>(std::fabs(y[i])));
    }
    EXPECT_LE(diff, rel * scale) << k << ": max abs diff " << diff << " of max " << scale;
  }
}

// The last value of `metric` at `step` in model_dir's metrics.jsonl (NaN when none).
double logged_at(const fs::path& model_dir, const std::string& metric, int64_t step) {
  double v = NAN;
  for (auto& r : modelzoo::read_metrics_file(model_dir / "metrics.jsonl"))
    if (r.name == metric && r.step == step) v = r.value;
  return v;
}

double logged(const std::string& name, const std::string& metric, int64_t step) {
  auto rows = modelzoo::read_metrics_file(setup().root / name / "model" / "metrics.jsonl");
  for (auto& r : rows)
    if (r.name == metric && r.step == step) return r.value;
  return NAN;
}

}  // namespace

TEST(DistributedE2E, CollectivesAndATracedDataParallelStep) {
  int st = 0;
  std::string out = run(mpirun(2) + kBin + "/tests/dist_helper collectives", &st);
  EXPECT_EQ(st, 0) << out;
  EXPECT_NE(out.find("dist_helper ok rank 1 of 2"), std::string::npos) << out;
  // 3 replicas over a global batch of 7 (3 + 2 + 2 samples): the weighted mean is exact.
  out = run(mpirun(3) + kBin + "/tests/dist_helper traced", &st);
  EXPECT_EQ(st, 0) << out;
  EXPECT_NE(out.find("dist_helper ok rank 2 of 3"), std::string::npos) << out;
  // Without a launcher: a group of one, no MPI needed.
  out = run(kBin + "/tests/dist_helper traced", &st);
  EXPECT_EQ(st, 0) << out;
}

// 2 replicas with 16 samples each == 1 replica with 32 after 20 steps (and the combined loss
// and validation metrics equal the single replica's).
TEST(DistributedE2E, TwoReplicasMatchOneReplica) {
  int st = 0;
  std::string out = run(kCszoo + " fit " + write_config({.name = "one", .validate = true}), &st);
  ASSERT_EQ(st, 0) << out;
  out = run(mpirun(2) + kCszoo + " fit " + write_config({.name = "two", .validate = true}) +
                " --multireplica",
            &st);
  ASSERT_EQ(st, 0) << out;
  expect_models_close(ckpt("one", 20), ckpt("two", 20), 1e-5);
  // Rank 0 alone logs: one validation line per validation, one metrics file.
  size_t lines = 0;
  for (size_t p = out.find("validation at step 10"); p != std::string::npos;
       p = out.find("validation at step 10", p + 1))
    ++lines;
  EXPECT_EQ(lines, 1u) << out;
  for (const char* m : {"loss", "eval/loss", "eval/accuracy"}) {
    const int64_t step = std::string(m) == "loss" ? 20 : 10;
    double a = logged("one", m, step), b = logged("two", m, step);
    EXPECT_NEAR(a, b, 1e-5 * std::max(1.0, std::fabs(a))) << m;
  }
  std::ifstream meta(setup().root / "two" / "model" / "run_metadata.json");
  std::string text((std::istreambuf_iterator<char>(meta)), {});
  EXPECT_NE(text.find("\"replicas\": 2"), std::string::npos) << text;
}

// ZeRO-1 sharded optimizer state (max_wgt_servers: 0 = one shard per replica) gives the same
// weights and the same (gathered) optimizer state as one shard; the sharded run is started by
// cszoo itself (--num_csx 2 without mpirun).
TEST(DistributedE2E, ShardedOptimizerStateMatchesUnsharded) {
  int st = 0;
  std::string out =
      run(mpirun(2) + kCszoo + " fit " +
              write_config({.name = "unsharded",
                            .backend = "backend: {backend_type: CSX, cluster_config: {num_csx: 2, "
                                       "max_wgt_servers: 1}}"}),
          &st);
  ASSERT_EQ(st, 0) << out;
  out = run("OMPI_MCA_btl_vader_single_copy_mechanism=none OMP_NUM_THREADS=1 " + kCszoo + " fit " +
                write_config({.name = "sharded",
                              .backend = "backend: {backend_type: CSX, cluster_config: "
                                         "{max_wgt_servers: 0}}"}) +
                " --num_csx 2",
            &st);
  ASSERT_EQ(st, 0) << out;
  EXPECT_NE(out.find("launching 2 replicas"), std::string::npos) << out;
  // Piped output: the launcher gives the replicas a pseudo-terminal, but progress is plain
  // lines (no "\r" redraw frames), and only rank 0 prints the run's header and summary.
  EXPECT_EQ(out.find('\r'), std::string::npos) << out;
  EXPECT_NE(out.find("train 20/20"), std::string::npos) << out;
  size_t summaries = 0;
  for (size_t p = out.find("== fit completed"); p != std::string::npos;
       p = out.find("== fit completed", p + 1))
    ++summaries;
  EXPECT_EQ(summaries, 1u) << out;
  out = run(kCszoo + " checkpoint diff " + ckpt("unsharded", 20).string() + " " +
                ckpt("sharded", 20).string(),
            &st);
  EXPECT_EQ(st, 0) << out;
}

// Checkpoint at step 10 with 2 replicas, resume to 20: identical to the uninterrupted run
// (weights, optimizer, every replica's data position).
TEST(DistributedE2E, CheckpointAndResumeMatchUninterrupted) {
  int st = 0;
  std::string out = run(
      mpirun(2) + kCszoo + " fit " + write_config({.name = "straight"}) + " --multireplica", &st);
  ASSERT_EQ(st, 0) << out;
  out = run(mpirun(2) + kCszoo + " fit " + write_config({.name = "resumed", .max_steps = 10}) +
                " --multireplica",
            &st);
  ASSERT_EQ(st, 0) << out;
  ASSERT_FALSE(fs::exists(ckpt("resumed", 20)));
  out = run(mpirun(2) + kCszoo + " fit " + write_config({.name = "resumed"}) + " --multireplica",
            &st);
  ASSERT_EQ(st, 0) << out;
  EXPECT_NE(out.find("loaded checkpoint"), std::string::npos) << out;
  out = run(kCszoo + " checkpoint diff " + ckpt("straight", 20).string() + " " +
                ckpt("resumed", 20).string(),
            &st);
  EXPECT_EQ(st, 0) << out;
  // A 2-replica checkpoint cannot silently resume as 1 replica (its data positions); named
  // explicitly it gives its weights, the data starting afresh (there was no way to go on).
  out = run(kCszoo + " fit " + write_config({.name = "resumed", .max_steps = 30}), &st);
  EXPECT_EQ(st, 1) << out;
  EXPECT_NE(out.find("data positions of 2 replicas, this run has 1"), std::string::npos) << out;
  EXPECT_NE(out.find("or name the checkpoint (--checkpoint_path"), std::string::npos) << out;
  out = run(kCszoo + " fit " + write_config({.name = "one_replica", .max_steps = 25}) +
                " --checkpoint_path " + ckpt("resumed", 20).string(),
            &st);
  EXPECT_EQ(st, 0) << out;
  EXPECT_NE(out.find("warning: checkpoint 'dataloader': it holds the data positions of 2 "
                     "replicas, this run has 1: the checkpoint was named"),
            std::string::npos)
      << out;
  EXPECT_TRUE(fs::exists(ckpt("one_replica", 25))) << out;
}

TEST(DistributedE2E, TooFewWorkersAndTooFewProcesses) {
  int st = 0;
  std::string out = run(mpirun(2) + kCszoo + " fit " +
                            write_config({.name = "workers", .train_extra = ", num_workers: 1"}) +
                            " --multireplica",
                        &st);
  EXPECT_NE(st, 0) << out;
  EXPECT_NE(out.find("2 replicas need at least 2 input workers (one per replica), got 1"),
            std::string::npos)
      << out;
  // num_csx larger than the launch.
  out = run(mpirun(1) + kCszoo + " fit " +
                write_config({.name = "procs",
                              .backend = "backend: {backend_type: CSX, cluster_config: "
                                         "{num_csx: 2}}"}),
            &st);
  EXPECT_NE(st, 0) << out;
  EXPECT_NE(out.find("num_csx is 2 but this run was launched as 1 process"), std::string::npos)
      << out;
}

// The first run on an empty data folder writes the synthetic data once: with 2 replicas of one
// launch (rank 0 writes, the other waits) and with two separate processes started at once (a
// file lock in the folder). Every rank writing at once used to fail ("write_idx: renaming ...").
TEST(DistributedE2E, FirstRunsOnAnEmptyDataFolderWriteTheDataOnce) {
  const fs::path root = setup().root / "empty_data";
  auto config = [&](const std::string& name, const fs::path& data) {
    fs::create_directories(root / name);
    const std::string path = (root / name / "fit.yaml").string();
    std::ofstream(path) << "trainer:\n  init:\n    device: CPU\n    model_dir: " +
                               (root / name / "model").string() +
                               "\n    model: {name: fc_mnist, hidden_sizes: [8]}\n"
                               "    optimizer: {SGD: {lr: 0.05}}\n    loop: {max_steps: 2}\n"
                               "    checkpoint: {steps: 2}\n"
                               "  fit:\n    train_dataloader: {data_processor: "
                               "MNISTDataProcessor, data_dir: " +
                               data.string() + ", batch_size: 8}\n";
    return path;
  };
  int st = 0;
  std::string out =
      run(mpirun(2) + kCszoo + " fit " + config("mpi", root / "data_mpi") + " --multireplica", &st);
  EXPECT_EQ(st, 0) << out;
  EXPECT_TRUE(cstorch::data::mnist_files_exist((root / "data_mpi").string())) << out;
  // Rank 0 alone wrote them.
  size_t writes = 0;
  for (size_t p = out.find("writing synthetic digits"); p != std::string::npos;
       p = out.find("writing synthetic digits", p + 1))
    ++writes;
  EXPECT_EQ(writes, 1u) << out;
  // Two processes that are not one MPI job.
  const std::string a = config("first", root / "data_two"), b = config("second", root / "data_two");
  out =
      run(kCszoo + " fit " + a + " & p=$!; " + kCszoo + " fit " + b + " & q=$!; wait $p && wait $q",
          &st);
  EXPECT_EQ(st, 0) << out;
  EXPECT_TRUE(fs::exists(root / "first" / "model" / "checkpoint_2.mdl")) << out;
  EXPECT_TRUE(fs::exists(root / "second" / "model" / "checkpoint_2.mdl")) << out;
}

// Every `key` integer anywhere under `s` (the per-worker loader states of a checkpoint).
void collect_ints(const cstorch::State& s, const std::string& key, std::vector<int64_t>& out) {
  if (s.is_map()) {
    for (const auto& k : s.keys()) {
      if (k == key && s.at(k).is_int()) out.push_back(s.at(k).as_int());
      collect_ints(s.at(k), key, out);
    }
  } else if (s.is_list()) {
    for (size_t i = 0; i < s.size(); ++i) collect_ints(s[i], key, out);
  }
}

// A tiny text model's run: 3 steps of a global batch of 8 (SGD: Adam would blow up the
// rounding noise of gradients that are zero in exact arithmetic, as the attention key bias's),
// every step logged and a checkpoint at the end. `data` (the data processor's keys) names a folder
// shared by the runs of one model.
std::string text_config(const std::string& name, const std::string& model,
                        const std::string& data) {
  const fs::path root = setup().root / "text";
  fs::create_directories(root / name);
  const std::string path = (root / name / "fit.yaml").string();
  std::ofstream(path) << "trainer:\n  init:\n    device: CPU\n    model_dir: " +
                             (root / name / "model").string() +
                             "\n    seed: 5\n    model: " + model +
                             "\n    optimizer: {SGD: {lr: 0.1, momentum: 0.9}}\n"
                             "    loop: {max_steps: 3}\n    checkpoint: {steps: 3}\n"
                             "    logging: {log_steps: 1}\n"
                             "  fit:\n    train_dataloader: {" +
                             data + ", batch_size: 8, shuffle_seed: 2}\n";
  return path;
}

// The text models split the global batch across replicas like FC-MNIST (each input_fn gets
// its replica's share): GPT-2 and T5 (the same number of loss tokens in every sample) with 2
// replicas equal 1 replica step by step; BERT (a mean over a varying number of masked tokens
// per replica, so not equal) reads 4 samples per replica and step. The 2-replica runs go first,
// on an empty data folder.
TEST(DistributedE2E, TextModelsSplitTheGlobalBatchAcrossReplicas) {
  struct Case {
    std::string name, model, data;
    bool compare;
  };
  const std::vector<Case> cases = {
      {"gpt2",
       "{name: gpt2, vocab_size: 512, hidden_size: 32, num_hidden_layers: 1, num_heads: 2, "
       "filter_size: 64, max_position_embeddings: 32, dropout_rate: 0.0}",
       "data_processor: GptHDF5DataProcessor, max_sequence_length: 32, vocab_size: 512", true},
      {"t5",
       "{name: t5, src_vocab_size: 612, tgt_vocab_size: 612, d_model: 32, d_kv: 8, d_ff: 64, "
       "num_heads: 2, encoder_num_hidden_layers: 1, decoder_num_hidden_layers: 1, "
       "dropout_rate: 0.0}",
       "data_processor: T5DataProcessor, max_sequence_length: 32, vocab_size: 612", true},
      {"bert",
       "{name: bert, vocab_size: 512, hidden_size: 32, num_hidden_layers: 1, num_heads: 2, "
       "filter_size: 64, max_position_embeddings: 32, dropout_rate: 0.0}",
       "data_processor: BertDataProcessor, max_sequence_length: 32, vocab_size: 512", false},
  };
  const fs::path root = setup().root / "text";
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string data = c.data + ", data_dir: " + (root / ("data_" + c.name)).string();
    int st = 0;
    std::string out = run(mpirun(2) + kCszoo + " fit " +
                              text_config(c.name + "_two", c.model, data) + " --multireplica",
                          &st);
    ASSERT_EQ(st, 0) << out;
    const fs::path two = root / (c.name + "_two") / "model";
    // Each replica's loader makes batches of 4 and read 3 of them.
    const auto loader = cstorch::load((two / "checkpoint_3.mdl").string()).at("dataloader");
    std::vector<int64_t> batch, streamed;
    collect_ints(loader, "batch_size", batch);
    collect_ints(loader, "samples_streamed", streamed);
    EXPECT_EQ(batch, (std::vector<int64_t>{4, 4})) << loader.repr();
    EXPECT_EQ(streamed, (std::vector<int64_t>{12, 12})) << loader.repr();
    if (!c.compare) continue;
    out = run(kCszoo + " fit " + text_config(c.name + "_one", c.model, data), &st);
    ASSERT_EQ(st, 0) << out;
    const fs::path one = root / (c.name + "_one") / "model";
    auto rows_one = modelzoo::read_metrics_file(one / "metrics.jsonl");
    auto rows_two = modelzoo::read_metrics_file(two / "metrics.jsonl");
    for (int64_t step = 1; step <= 3; ++step) {
      double a = NAN, b = NAN;
      for (auto& r : rows_one)
        if (r.name == "loss" && r.step == step) a = r.value;
      for (auto& r : rows_two)
        if (r.name == "loss" && r.step == step) b = r.value;
      EXPECT_NEAR(a, b, 1e-5 * std::max(1.0, std::fabs(a))) << "loss at step " << step;
    }
    expect_models_close(one / "checkpoint_3.mdl", two / "checkpoint_3.mdl", 1e-5);
  }
}

// A validation set smaller than the replicas: a replica whose share is empty validates nothing
// and adds nothing (its "makes no batches" error stopped the launch, blaming drop_last, and
// left the run record 'running'); the combined eval/loss is one process's on the same
// checkpoint (1e-5 relative: sums of f32 losses in another grouping).
TEST(DistributedE2E, AReplicaWithNoValidationDataAddsNothing) {
  const fs::path root = setup().root / "small_val";
  const fs::path data = root / "mnist";
  cstorch::data::write_synthetic_mnist(data.string(), 96, 2, 5);
  const std::string d = data.string();
  const std::string y =
      "trainer:\n  init:\n    device: CPU\n    model_dir: " + (root / "model").string() +
      "\n    seed: 7\n    model: {name: fc_mnist, hidden_sizes: [16]}\n"
      "    optimizer: {SGD: {lr: 0.05}}\n    loop: {max_steps: 2}\n"
      "  fit:\n    train_dataloader: {data_processor: MNISTDataProcessor, data_dir: " +
      d +
      ", batch_size: 6, synthetic: false}\n"
      "    val_dataloader: {data_processor: MNISTDataProcessor, data_dir: " +
      d +
      ", split: test, batch_size: 3, synthetic: false}\n"
      "  validate:\n    val_dataloader: {data_processor: MNISTDataProcessor, data_dir: " +
      d + ", split: test, batch_size: 3, synthetic: false}\n";
  fs::create_directories(root);
  const std::string cfg = (root / "fit.yaml").string();
  std::ofstream(cfg) << y;
  int st = 0;
  std::string out = run(mpirun(3) + kCszoo + " fit " + cfg + " --multireplica", &st);
  ASSERT_EQ(st, 0) << out;
  const double three = logged_at(root / "model", "eval/loss", 2);
  out = run(kCszoo + " validate " + cfg, &st);
  ASSERT_EQ(st, 0) << out;
  const double one = logged_at(root / "model", "eval/loss", 2);
  EXPECT_FALSE(std::isnan(three));
  EXPECT_NEAR(three, one, 1e-5 * std::max(1.0, std::fabs(one)));
}

// The multi-replica switches: `runconfig.multireplica: True` in a legacy params.yaml trains on
// every process of an mpirun launch (both through `cszoo fit` and the runner form `cszoo run`),
// and cs_ip (runconfig or --cs_ip) is accepted and recorded in run_metadata.json.
TEST(DistributedE2E, MultireplicaInParamsAndCsIp) {
  const fs::path root = setup().root / "switches";
  fs::create_directories(root);
  const std::string params = (root / "params.yaml").string();
  std::ofstream(params) << "train_input: {data_processor: MNISTDataProcessor, data_dir: " +
                               setup().data.string() +
                               ", batch_size: 32, synthetic: false}\n"
                               "model: {name: fc_mnist, hidden_sizes: [16]}\n"
                               "optimizer: {optimizer_type: SGD, learning_rate: 0.05}\n"
                               "runconfig:\n  max_steps: 2\n  save_checkpoints_steps: 2\n"
                               "  model_dir: " +
                               (root / "fit").string() +
                               "\n  mode: train\n  cs_ip: 10.4.5.3\n  multireplica: True\n";
  auto metadata = [&](const std::string& name) {
    std::ifstream f(root / name / "run_metadata.json");
    return std::string((std::istreambuf_iterator<char>(f)), {});
  };
  int st = 0;
  std::string out = run(mpirun(2) + kCszoo + " fit " + params, &st);
  ASSERT_EQ(st, 0) << out;
  EXPECT_NE(metadata("fit").find("\"replicas\": 2"), std::string::npos) << metadata("fit") << out;
  EXPECT_NE(metadata("fit").find("\"cs_ip\": \"10.4.5.3\""), std::string::npos) << metadata("fit");
  out = run(mpirun(2) + kCszoo + " run --mode train --params " + params + " --model_dir " +
                (root / "runner").string() + " --cs_ip 10.9.9.9",
            &st);
  ASSERT_EQ(st, 0) << out;
  EXPECT_NE(metadata("runner").find("\"replicas\": 2"), std::string::npos)
      << metadata("runner") << out;
  EXPECT_NE(metadata("runner").find("\"cs_ip\": \"10.9.9.9\""), std::string::npos)
      << metadata("runner");
  // The Trainer form with --cs_ip, one process.
  out = run(kCszoo + " fit " + write_config({.name = "cs_ip", .max_steps = 2, .ckpt_steps = 2}) +
                " --cs_ip 10.1.2.3",
            &st);
  ASSERT_EQ(st, 0) << out;
  std::ifstream f(setup().root / "cs_ip" / "model" / "run_metadata.json");
  std::string text((std::istreambuf_iterator<char>(f)), {});
  EXPECT_NE(text.find("\"cs_ip\": \"10.1.2.3\""), std::string::npos) << text;
}

// One replica throws at step 5 while the other waits in the gradient all-reduce: both stop,
// non-zero, within 30 s, and the message names the rank.
TEST(DistributedE2E, AFailingRankStopsEveryRank) {
  int st = 0;
  auto t0 = std::chrono::steady_clock::now();
  std::string out =
      run(mpirun(2) + kCszoo + " fit " +
              write_config({.name = "fault",
                            .max_steps = 200,
                            .callbacks = "    callbacks: [{FailAtStep: {step: 5, rank: 1}}]\n"}) +
              " --multireplica --python_paths " + kPlugins,
          &st);
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(st, 0) << out;
  EXPECT_LT(s, 30.0) << out;
  EXPECT_NE(out.find("error: rank 1 of 2: FailAtStep: injected failure at step 5"),
            std::string::npos)
      << out;
  EXPECT_FALSE(fs::exists(ckpt("fault", 200)));
}

// CLOCK_MONOTONIC now and as FailAtStep's `mark` file recorded it (seconds; one clock for every
// process of the machine).
double monotonic_now() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}
double read_mark(const fs::path& p) {
  std::ifstream f(p);
  double t = NAN;
  f >> t;
  return t;
}

// A replica killed with SIGKILL at step 5 (it cannot report anything) while the other waits in
// the gradient all-reduce: the launch stops, non-zero, within seconds of the kill, and the
// output names the killed rank (the survivor says which rank has exited as the launcher
// terminates it). The bound is generous for a loaded machine; without the launcher's
// reaction the survivor would wait for the 300 s watchdog.
TEST(DistributedE2E, AKilledRankStopsEveryRankAndIsNamed) {
  const fs::path mark = setup().root / "killed.mark";
  int st = 0;
  std::string out = run(
      "timeout -s KILL 280 env " + mpirun(2) + kCszoo + " fit " +
          write_config({.name = "killed",
                        .max_steps = 100000,
                        .ckpt_steps = 100000,
                        .callbacks = "    callbacks: [{FailAtStep: {step: 5, rank: 1, how: kill, "
                                     "mark: " +
                                     mark.string() + "}}]\n"}) +
          " --multireplica --python_paths " + kPlugins,
      &st);
  const double end = monotonic_now();
  EXPECT_NE(st, 0) << out;
  ASSERT_TRUE(fs::exists(mark)) << out;
  EXPECT_LT(end - read_mark(mark), 30.0) << out;
  EXPECT_NE(out.find("cstorch: rank 0 of 2: terminated by the launcher; rank 1 (pid "),
            std::string::npos)
      << out;
  EXPECT_NE(out.find(") has exited"), std::string::npos) << out;
  EXPECT_EQ(out.find("rank 0 (pid "), std::string::npos) << out;
}

// A replica stopped with SIGSTOP (a hang: it neither fails nor exits) at step 5, with the
// watchdog set to 3 s in the YAML config (and a larger limit in the environment, which the
// config overrides): the survivor stops the launch about 3 s later, naming the stopped rank,
// the limit and how to change it.
TEST(DistributedE2E, AStoppedRankStopsTheLaunchAfterTheConfiguredTimeout) {
  const fs::path mark = setup().root / "stopped.mark";
  int st = 0;
  std::string out = run(
      "CSTORCH_COLLECTIVE_TIMEOUT_S=250 timeout -s KILL 280 env " + mpirun(2) + kCszoo + " fit " +
          write_config({.name = "stopped",
                        .max_steps = 100000,
                        .ckpt_steps = 100000,
                        .backend = "backend: {backend_type: CSX, cluster_config: {num_csx: 2, "
                                   "collective_timeout_s: 3}}",
                        .callbacks = "    callbacks: [{FailAtStep: {step: 5, rank: 1, how: stop, "
                                     "mark: " +
                                     mark.string() + "}}]\n"}) +
          " --python_paths " + kPlugins,
      &st);
  const double end = monotonic_now();
  EXPECT_NE(st, 0) << out;
  ASSERT_TRUE(fs::exists(mark)) << out;
  const double waited = end - read_mark(mark);
  EXPECT_GT(waited, 2.0) << out;
  EXPECT_LT(waited, 3.0 + 40.0) << out;
  EXPECT_NE(out.find("cstorch: rank 0 of 2: all-reduce #"), std::string::npos) << out;
  EXPECT_NE(out.find(" did not complete within 3 s; rank 1 (pid "), std::string::npos) << out;
  EXPECT_NE(out.find(") is stopped (SIGSTOP or a debugger). The limit (3 s, from "
                     "cluster_config.collective_timeout_s) is set by "
                     "trainer.init.backend.cluster_config.collective_timeout_s in the YAML "
                     "config or the environment variable CSTORCH_COLLECTIVE_TIMEOUT_S"),
            std::string::npos)
      << out;
}

// A bad CSTORCH_COLLECTIVE_TIMEOUT_S is an error at start-up, and each rank names itself.
TEST(DistributedE2E, ABadCollectiveTimeoutVariableIsAnError) {
  int st = 0;
  std::string out = run(
      "CSTORCH_COLLECTIVE_TIMEOUT_S=soon " + mpirun(2) + kBin + "/tests/dist_helper collectives",
      &st);
  EXPECT_NE(st, 0) << out;
  for (const char* rank : {"error: rank 0 of 2: ", "error: rank 1 of 2: "})
    EXPECT_NE(out.find(std::string(rank) +
                       "CSTORCH_COLLECTIVE_TIMEOUT_S='soon' is not a positive number of seconds"),
              std::string::npos)
        << out;
}

// One backend reused with another cluster_config: one launch, two trainers with different
// cluster_configs. The first runs 2 replicas (equal to one replica with the whole batch), the
// second 1 replica (rank 1 sits it out); each writes its own run metadata.
TEST(DistributedE2E, TrainersWithDifferentClusterConfigsInOneLaunch) {
  int st = 0;
  const auto& s = setup();
  std::string out = run(kCszoo + " fit " + write_config({.name = "single_ref"}), &st);
  ASSERT_EQ(st, 0) << out;
  auto trainer = [&](const std::string& name, int replicas) {
    return "  - trainer:\n      init:\n        backend: {backend_type: CSX, cluster_config: "
           "{num_csx: " +
           std::to_string(replicas) +
           "}}\n        model_dir: " + (s.root / name / "model").string() +
           "\n        seed: 7\n"
           "        model: {name: fc_mnist, hidden_sizes: [32]}\n"
           "        optimizer: {SGD: {lr: 0.05, momentum: 0.9}}\n"
           "        loop: {max_steps: 20}\n        checkpoint: {steps: 10}\n"
           "      fit:\n        train_dataloader: {data_processor: MNISTDataProcessor, data_dir: " +
           s.data.string() + ", batch_size: 32, shuffle_seed: 3, synthetic: false}\n";
  };
  fs::create_directories(s.root / "two_trainers");
  const std::string path = (s.root / "two_trainers" / "fit.yaml").string();
  std::ofstream(path) << "trainer:\n" + trainer("first_2", 2) + trainer("second_1", 1);
  out = run(mpirun(2) + kCszoo + " fit " + path, &st);
  ASSERT_EQ(st, 0) << out;
  expect_models_close(ckpt("single_ref", 20), ckpt("first_2", 20), 1e-5);
  expect_models_close(ckpt("single_ref", 20), ckpt("second_1", 20), 1e-5);
  for (auto [name, replicas] : {std::pair{"first_2", 2}, std::pair{"second_1", 1}}) {
    std::ifstream meta(s.root / name / "model" / "run_metadata.json");
    std::string text((std::istreambuf_iterator<char>(meta)), {});
    EXPECT_NE(text.find("\"replicas\": " + std::to_string(replicas)), std::string::npos)
        << name << ": " << text;
  }
}
