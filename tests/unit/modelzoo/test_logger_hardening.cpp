// Loggers after failures and resumes: write errors give their cause, and a run resumed from a
// checkpoint leaves each step once in the metrics files (the interrupted run's rows past the
// checkpoint are dropped); the resumed Trainer also removes temporary checkpoint files that
// killed saves left behind.
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "cstorch/cstorch.h"
#include "modelzoo/loggers.h"
#include "modelzoo/plot.h"
#include "modelzoo/trainer.h"

#include "unit/test_util.h"

namespace cs = cstorch;
namespace fs = std::filesystem;
using modelzoo::Config;
using modelzoo::ConfigView;

namespace {

fs::path temp_dir(const std::string& name) {
  return cs::testing::temp_dir("cstorch_logger_hardening", name);
}

// Steps of the "loss" rows of a metrics file, with their counts.
std::map<int64_t, int> loss_steps(const fs::path& file) {
  std::map<int64_t, int> n;
  for (const auto& r : modelzoo::read_metrics_file(file))
    if (r.name == "loss") ++n[r.step];
  return n;
}

// In a child process whose files may not grow past 4 KiB: buffer 5 KB of events, flush.
void flush_past_the_file_size_limit(const fs::path& dir) {
  ::signal(SIGXFSZ, SIG_IGN);  // a write past the limit fails with EFBIG instead
  rlimit lim{4096, 4096};
  ::setrlimit(RLIMIT_FSIZE, &lim);
  try {
    modelzoo::TensorBoardLogger tb(dir);
    for (int i = 0; i < 10; ++i) tb.log_metrics(i, {{std::string(480, 'x'), 1.0}});
    tb.flush();
    std::exit(3);
  } catch (const cs::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
  }
  std::exit(0);
}

// Random data for fc_mnist: x [batch, 784], y in 0..9.
class Data : public cs::utils::data::Loader {
 public:
  explicit Data(int64_t batches) : batches_(batches) {}
  std::optional<cs::Batch> next() override {
    if (pos_ >= batches_) return std::nullopt;
    std::vector<float> x(4 * 784);
    for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 7 + pos_) % 13) / 13;
    std::vector<int64_t> y = {pos_ % 10, (pos_ + 1) % 10, (pos_ + 2) % 10, (pos_ + 3) % 10};
    ++pos_;
    return cs::Batch{{"x", cs::from_vector(x, {4, 784})}, {"y", cs::from_vector(y, {4})}};
  }
  void reset() override { pos_ = 0; }
  int64_t size() const override { return batches_; }

 private:
  int64_t batches_, pos_ = 0;
};

modelzoo::DataLoaderPtr data(int64_t batches) {
  return std::make_shared<cs::utils::data::DataLoader>(
      [batches](const Config&, const cs::utils::data::WorkerInfo&) {
        return std::make_shared<Data>(batches);
      });
}

}  // namespace

TEST(LoggerHardening, TensorBoardWriteErrorsGiveTheCause) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto dir = temp_dir("tb");
  EXPECT_EXIT(flush_past_the_file_size_limit(dir / "tb"), ::testing::ExitedWithCode(0),
              "TensorBoardLogger: flushing '.*events.out.tfevents.*' failed: File too large");
  fs::remove_all(dir);
}

TEST(LoggerHardening, ResumeAtDropsTheRowsPastTheStep) {
  auto dir = temp_dir("resume_at");
  auto csv = dir / "metrics.csv", jsonl = dir / "metrics.jsonl";
  {
    modelzoo::CSVLogger c(csv);
    modelzoo::JSONLinesLogger j(jsonl);
    for (int64_t s = 1; s <= 8; ++s) {
      c.log_metrics(s, {{"loss", 1.0 / static_cast<double>(s)}, {"lr", 0.1}});
      j.log_metrics(s, {{"loss", 1.0 / static_cast<double>(s)}, {"lr", 0.1}});
    }
  }
  {  // resumed at step 5: steps 6..8 are logged again
    modelzoo::MultiLogger m;
    m.add(std::make_shared<modelzoo::CSVLogger>(csv));
    m.add(std::make_shared<modelzoo::JSONLinesLogger>(jsonl));
    m.resume_at(5);
    for (int64_t s = 6; s <= 9; ++s) m.log_metrics(s, {{"loss", 2.0}});
  }
  for (const auto& f : {csv, jsonl}) {
    auto n = loss_steps(f);
    ASSERT_EQ(n.size(), 9u) << f;
    for (auto [step, count] : n) EXPECT_EQ(count, 1) << f << " step " << step;
    auto rows = modelzoo::read_metrics_file(f);
    EXPECT_EQ(rows.back().step, 9);
    EXPECT_EQ(rows.back().value, 2.0);
  }
  std::ifstream in(csv);
  std::string first;
  std::getline(in, first);
  EXPECT_EQ(first, "step,wall_time,name,value");  // the header stays, once
  // Nothing past the step: the file is left as it is.
  auto before = fs::last_write_time(jsonl);
  modelzoo::JSONLinesLogger j(jsonl);
  j.resume_at(20);
  EXPECT_EQ(fs::last_write_time(jsonl), before);
  fs::remove_all(dir);
}

// A run killed in the middle of writing a row leaves it cut short, without its newline. The
// next logger on the file ends that line first, so that its own rows are whole (they continued
// the cut line and were lost with it); a reader told to skip damaged lines reads the rest and
// says which line it left out, and the plot is drawn from them.
TEST(LoggerHardening, ARowCutShortIsEndedBeforeTheNextAndLeftOutOfThePlot) {
  auto dir = temp_dir("cut_row");
  const fs::path jsonl = dir / "metrics.jsonl", csv = dir / "metrics.csv";
  std::ofstream(jsonl) << "{\"step\": 1, \"loss\": 2.0}\n{\"step\": 2, \"lo";
  std::ofstream(csv) << "step,wall_time,name,value\n1,0,loss,2\n2,0,lo";
  {
    modelzoo::JSONLinesLogger j(jsonl);
    modelzoo::CSVLogger c(csv);
    j.log_metrics(3, {{"loss", 0.5}});
    c.log_metrics(3, {{"loss", 0.5}});
  }
  EXPECT_ERROR(modelzoo::read_metrics_file(jsonl), "metrics.jsonl' line 2", "invalid JSON");
  EXPECT_ERROR(modelzoo::read_metrics_file(csv), "metrics.csv' line 3", "expected 4 fields, got 3");
  for (const auto& [f, line] : {std::pair{jsonl, "line 2: invalid JSON"},
                                std::pair{csv, "line 3: expected 4 fields, got 3"}}) {
    std::vector<std::string> damaged;
    auto rows = modelzoo::read_metrics_file(f, &damaged);
    ASSERT_EQ(rows.size(), 2u) << f;
    EXPECT_EQ(rows[0].step, 1);
    EXPECT_EQ(rows[1].step, 3);
    EXPECT_EQ(rows[1].value, 0.5);
    ASSERT_EQ(damaged.size(), 1u) << f;
    EXPECT_EQ(damaged[0].rfind(line, 0), 0u) << damaged[0];
  }
  // A whole file stays as it was: no empty line is added before the next rows.
  const auto before = fs::file_size(jsonl);
  { modelzoo::JSONLinesLogger j(jsonl); }
  EXPECT_EQ(fs::file_size(jsonl), before);
  ::testing::internal::CaptureStderr();
  modelzoo::plot_metrics_file(jsonl, dir / "loss.png");
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(fs::file_size(dir / "loss.png") > 0);
  EXPECT_NE(err.find("metrics.jsonl: 1 damaged line left out of the plot (line 2: invalid JSON"),
            std::string::npos)
      << err;
  // A fit into a model_dir whose metrics file ends in such a row logs whole rows after it and
  // draws its plot at the end (it failed there on the damaged line).
  fs::remove(dir / "loss.png");
  Config c = cs::parse_config("device: CPU\nmodel_dir: " + dir.string() +
                              "\nseed: 3\n"
                              "model: {name: fc_mnist, depth: 1, hidden_size: 8}\n"
                              "optimizer: {SGD: {lr: 0.05}}\n"
                              "loop: {max_steps: 2}\n"
                              "checkpoint: {steps: 0, save_at_end: false}\n"
                              "logging: {log_steps: 1, progress: false}\n"
                              "loggers: [JSONLines]\n");
  std::ofstream(jsonl, std::ios::app) << "{\"step\": 9, \"lo";
  {
    modelzoo::Trainer t(ConfigView(c, "trainer.init"));
    t.fit(data(4));
  }
  std::vector<std::string> damaged;
  auto rows = modelzoo::read_metrics_file(jsonl, &damaged);
  EXPECT_EQ(damaged.size(), 2u);
  // The fit starts at step 0, so it dropped the earlier rows of later steps; the cut lines,
  // which have no step, stay.
  std::vector<int64_t> loss_rows;
  for (const auto& r : rows)
    if (r.name == "loss") loss_rows.push_back(r.step);
  EXPECT_EQ(loss_rows, (std::vector<int64_t>{1, 2}));
  EXPECT_TRUE(fs::exists(dir / "loss_lr.png"));
  fs::remove_all(dir);
}

TEST(LoggerHardening, ResumedFitLogsEachStepOnceAndRemovesStaleTemporaryCheckpoints) {
  auto dir = temp_dir("fit");
  auto config = [&](int64_t max_steps) {
    return cs::parse_config("device: CPU\nmodel_dir: " + dir.string() +
                            "\nseed: 3\n"
                            "model: {name: fc_mnist, depth: 1, hidden_size: 8}\n"
                            "optimizer: {SGD: {lr: 0.05}}\n"
                            "loop: {max_steps: " +
                            std::to_string(max_steps) +
                            "}\n"
                            "checkpoint: {steps: 4, save_at_end: false}\n"
                            "logging: {log_steps: 1, progress: false, plot: false}\n"
                            "loggers: [JSONLines, CSV]\n");
  };
  {  // stops after step 6; its last checkpoint is step 4
    Config c = config(6);
    modelzoo::Trainer t(ConfigView(c, "trainer.init"));
    t.fit(data(100));
  }
  // A save of step 8 killed mid-write (its process is gone) and one in progress (this one).
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) _exit(0);
  int ws = 0;
  ASSERT_EQ(waitpid(child, &ws, 0), child);
  auto stale = dir / (".checkpoint_8.mdl.tmp-" + std::to_string(child) + "-0");
  auto live = dir / (".checkpoint_12.mdl.tmp-" + std::to_string(::getpid()) + "-99");
  std::ofstream(stale) << "partial";
  std::ofstream(live) << "partial";
  {  // resumes from step 4 and runs to 10
    Config c = config(10);
    modelzoo::Trainer t(ConfigView(c, "trainer.init"));
    t.fit(data(100));
    EXPECT_EQ(t.global_step(), 10);
  }
  EXPECT_FALSE(fs::exists(stale));
  EXPECT_TRUE(fs::exists(live));
  for (const char* name : {"metrics.jsonl", "metrics.csv"}) {
    auto n = loss_steps(dir / name);
    ASSERT_EQ(n.size(), 10u) << name;
    EXPECT_EQ(n.begin()->first, 1);
    for (auto [step, count] : n) EXPECT_EQ(count, 1) << name << " step " << step;
  }
  fs::remove_all(dir);
}
