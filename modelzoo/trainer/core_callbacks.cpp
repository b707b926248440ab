// Logging and checkpoint callbacks.
#include "modelzoo/trainer/core_callbacks.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "cstorch/distributed.h"
#include "cstorch/metrics.h"
#include "cstorch/runtime.h"
#include "modelzoo/plot.h"
#include "modelzoo/trainer.h"

namespace modelzoo {

void LoggingCallback::on_train_start(Trainer& t) {
  // Resumed from a checkpoint: the metrics files lose the rows the interrupted run logged past
  // it, which this run logs again.
  loggers_->resume_at(t.global_step());
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
  // A damaged line (a row the killed run before a resume left cut short) does not end the run
  // here: it is left out of the plot, and said.
  std::vector<std::string> damaged;
  auto records = read_metrics_file(metrics_file_, &damaged);
  warn_damaged_lines(metrics_file_, damaged);
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
  auto loggers = loggers_;
  auto progress = progress_;
  auto last = last_loss_;
  auto warned = warned_not_finite_;
  const bool main = cstorch::distributed::is_main_process();
  // Every step's loss is read (the run summary reports the last one); logging and the
  // progress bar use their own periods. The first loss that is not a finite number is reported
  // at once: a run whose losses turned NaN otherwise went on to report success.
  auto record = cstorch::step_closure([step, log, loggers, progress, last, warned, main](
                                          const cstorch::Tensor& l, const cstorch::Tensor& r) {
    const double loss = l.item<float>();
    *last = loss;
    if (!std::isfinite(loss) && !*warned && main) {
      *warned = true;
      fmt::print(stderr,
                 "warning: step {}: the training loss is {} (not a finite number); the data "
                 "may hold NaN or infinite values, or the learning rate may be too high\n",
                 step, loss);
    }
    if (!log && !progress) return;
    Scalars s{{"loss", loss}, {"lr", r.item<float>()}};
    if (log) loggers->log_metrics(step, s);
    if (progress) progress->log_metrics(step, s);
  });
  record(loss, lr);
}

void LoggingCallback::on_validation_result(Trainer& t, const Scalars& logged) {
  std::string line =
      fmt::format("validation at step {}: loss {:.5f}", t.global_step(), logged.at("eval/loss"));
  for (const auto& [key, v] : logged)
    if (key != "eval/loss") line += fmt::format("  {} {:.5f}", key.substr(5), v);
  loggers_->log_metrics(t.global_step(), logged);
  if (progress_) progress_->flush();
  if (!cstorch::distributed::is_main_process()) return;  // every replica has the same numbers
  fmt::print("{}{}\n", progress_ && progress_->terminal() ? "\n" : "", line);
  std::fflush(stdout);
}

void CheckpointCallback::on_train_start(Trainer& t) {
  if (t.checkpoint_config().save_initial_checkpoint && t.global_step() == 0) t.save_checkpoint();
}

void CheckpointCallback::on_checkpoint_step(Trainer& t) {
  t.save_checkpoint();
}

// ---------------------------------------------------------------------------------------------
// Precision

PrecisionCallback::PrecisionCallback(const ConfigView& p) {
  if (p.is_null()) return;
  if (p.has("fp16_type"))
    cstorch::fail("{}: this key is `dtype` here (bf16 or f16), with `enabled: true`",
                  p.child_path("fp16_type"));
  p.check_keys({"enabled", "dtype", "loss_scaling_factor", "initial_loss_scale",
                "steps_per_increase", "min_loss_scale", "max_loss_scale", "overflow_tolerance",
                "max_gradient_norm", "max_gradient_value"});
  if (p.has("max_gradient_norm")) max_norm_ = p.at("max_gradient_norm").as_double();
  if (p.has("max_gradient_value")) max_value_ = p.at("max_gradient_value").as_double();
  if (max_norm_ && max_value_)
    cstorch::fail("{}: give max_gradient_norm or max_gradient_value, not both", p.path());
  // The dtype is checked whether or not mixed precision is enabled (every key is checked).
  const std::string dt = p.get_string("dtype", "bf16");
  const bool bf16 = dt == "bf16" || dt == "bfloat16", f16 = dt == "f16" || dt == "float16";
  if (!bf16 && !f16) cstorch::fail("{}: must be bf16 or f16, got '{}'", p.child_path("dtype"), dt);
  if (!p.get_bool("enabled", false)) return;
  dtype_ = bf16 ? cstorch::DType::bf16 : cstorch::DType::f16;
  // f16 needs loss scaling (dynamic unless a number is given); bf16 only when asked. A
  // GradScaler is built only when the factor is not 0.0 (0.0: no loss scaling).
  if (!p.has("loss_scaling_factor") && dtype_ != cstorch::DType::f16) return;
  cstorch::amp::GradScalerOptions o;
  o.loss_scale = std::string("dynamic");
  if (p.has("loss_scaling_factor")) {
    ConfigView f = p.at("loss_scaling_factor");
    if (f.value().is_number()) {
      const double v = f.as_double();
      if (!(v >= 0 && std::isfinite(v)))
        cstorch::fail(
            "{}: must be \"dynamic\", a positive static loss scale or 0.0 (no loss scaling), "
            "got {}",
            f.path(), v);
      if (v == 0.0) return;
      o.loss_scale = v;
    } else if (f.as_string() != "dynamic") {
      cstorch::fail(
          "{}: must be \"dynamic\", a positive static loss scale or 0.0 (no loss scaling), got "
          "'{}'",
          f.path(), f.as_string());
    }
  }
  o.init_scale = p.get_double("initial_loss_scale", o.init_scale);
  o.steps_per_increase = p.get_int("steps_per_increase", o.steps_per_increase);
  o.min_loss_scale = p.get_double("min_loss_scale", o.min_loss_scale);
  o.max_loss_scale = p.get_double("max_loss_scale", o.max_loss_scale);
  o.overflow_tolerance = p.get_double("overflow_tolerance", o.overflow_tolerance);
  try {
    scaler_ = std::make_unique<cstorch::amp::GradScaler>(o);
  } catch (const cstorch::Error& e) {
    cstorch::fail("{}: {}", p.path(), e.what());
  }
}

std::string PrecisionCallback::describe() const {
  if (!dtype_) return "f32";
  std::string s = *dtype_ == cstorch::DType::bf16 ? "bf16 mixed" : "f16 mixed";
  if (scaler_) s += scaler_->dynamic() ? ", dynamic loss scaling" : ", static loss scaling";
  return s;
}

void PrecisionCallback::on_before_forward(Trainer&, const cstorch::Batch&) {
  if (dtype_) scope_.emplace(*dtype_);
}

void PrecisionCallback::on_after_forward(Trainer&, const cstorch::Tensor&) {
  scope_.reset();
}

void PrecisionCallback::on_train_exception(Trainer&, const std::exception&) {
  scope_.reset();
}

cstorch::Tensor PrecisionCallback::scale_loss(const cstorch::Tensor& loss) {
  return scaler_ ? scaler_->scale(loss) : loss;
}

void PrecisionCallback::optimizer_step(cstorch::nn::Module& model,
                                       cstorch::optim::Optimizer& optimizer) {
  if (scaler_ && (max_norm_ || max_value_)) scaler_->unscale_(optimizer);
  if (max_norm_) cstorch::amp::clip_grad_norm_(model.parameters(), *max_norm_);
  if (max_value_) cstorch::amp::clip_grad_value_(model.parameters(), *max_value_);
  if (scaler_) {
    scaler_->step(optimizer);
    scaler_->update();
  } else {
    optimizer.step();
  }
}

void PrecisionCallback::on_save_checkpoint(Trainer&, cstorch::State& state) {
  if (scaler_) state.set("grad_scaler", scaler_->state_dict());
}

void PrecisionCallback::on_load_checkpoint(Trainer&, const cstorch::State& state) {
  if (!scaler_ || !state.contains("grad_scaler")) return;
  try {
    scaler_->load_state_dict(state.at("grad_scaler"));
  } catch (const cstorch::Error& e) {
    cstorch::fail("checkpoint 'grad_scaler': {}", e.what());
  }
}

}  // namespace modelzoo
