// Logging and checkpoint callbacks.
#include "modelzoo/trainer/core_callbacks.h"

#include <algorithm>
#include <filesystem>

#include "cstorch/metrics.h"
#include "cstorch/runtime.h"
#include "modelzoo/plot.h"
#include "modelzoo/trainer.h"

namespace modelzoo {

void LoggingCallback::on_train_start(Trainer& t) {
  if (progress_every_ <= 0 || t.run_steps() <= 0) return;
  ProgressBar::Options o;
  o.total_steps = t.global_step() + t.run_steps();
  o.print_every = progress_every_;
  progress_ = std::make_shared<ProgressBar>(o);
}

void LoggingCallback::end_progress() {
  if (!progress_) return;
  progress_->close();
  progress_.reset();
}

void LoggingCallback::on_train_end(Trainer&) {
  cstorch::synchronize();
  end_progress();
  loggers_->flush();
}

void LoggingCallback::on_train_exception(Trainer&, const std::exception&) {
  end_progress();
}

void LoggingCallback::on_fit_end(Trainer&) {
  loggers_->flush();
  if (metrics_file_.empty() || plot_file_.empty()) return;
  std::error_code ec;
  if (!std::filesystem::exists(metrics_file_, ec)) return;
  // Nothing to draw before the first logged step (a compile_only run, a resumed finished run
  // that logged nothing new still has its history in the file).
  auto records = read_metrics_file(metrics_file_);
  if (std::none_of(records.begin(), records.end(),
                   [](const MetricRecord& r) { return r.name == "loss"; }))
    return;
  write_png(render_loss_lr_plot(records, PlotOptions{}), plot_file_);
  fmt::print("wrote the loss/LR plot {}\n", plot_file_);
}

void LoggingCallback::finalize(Trainer&) {
  end_progress();
  loggers_->close();
}

void LoggingCallback::on_step_outputs(Trainer& t, const cstorch::Tensor& loss,
                                      const cstorch::Tensor& lr) {
  const int64_t step = t.global_step();
  const bool log = step % log_steps_ == 0;
  if (!log && !progress_) return;
  auto loggers = loggers_;
  auto progress = progress_;
  auto record = cstorch::step_closure(
      [step, log, loggers, progress](const cstorch::Tensor& l, const cstorch::Tensor& r) {
        Scalars s{{"loss", l.item<float>()}, {"lr", r.item<float>()}};
        if (log) loggers->log_metrics(step, s);
        if (progress) progress->log_metrics(step, s);
      });
  record(loss, lr);
}

void LoggingCallback::on_validation_result(Trainer& t, double mean_loss) {
  Scalars s = cstorch::metrics::compute_all(/*reset=*/true);
  Scalars logged{{"eval/loss", mean_loss}};
  std::string line = fmt::format("validation at step {}: loss {:.5f}", t.global_step(), mean_loss);
  for (const auto& [k, v] : s) {
    std::string key = k.rfind("eval/", 0) == 0 ? k : "eval/" + k;
    logged[key] = v;
    line += fmt::format("  {} {:.5f}", key.substr(5), v);
  }
  loggers_->log_metrics(t.global_step(), logged);
  if (progress_) progress_->flush();
  fmt::print("{}{}\n", progress_ && progress_->terminal() ? "\n" : "", line);
  std::fflush(stdout);
}

void CheckpointCallback::on_train_start(Trainer& t) {
  if (t.checkpoint_config().save_initial_checkpoint && t.global_step() == 0) t.save_checkpoint();
}

void CheckpointCallback::on_checkpoint_step(Trainer& t) {
  t.save_checkpoint();
}

}  // namespace modelzoo
