// The Trainer's private parts shared by its source files (trainer.cpp, run_record.cpp).
#pragma once
#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "cstorch/metrics.h"
#include "modelzoo/trainer.h"
#include "modelzoo/trainer/core_callbacks.h"

namespace modelzoo {

// A Trainer's init given both a device and a backend (the YAML and code forms, and the run
// config's check before any phase runs).
inline constexpr char kDeviceAndBackendError[] =
    "backend and device are mutually exclusive arguments of Trainer. Please only provide one or "
    "the other";

struct Trainer::Impl {
  std::vector<std::shared_ptr<CoreCallback>> core;
  std::shared_ptr<MultiLogger> loggers;
  std::shared_ptr<LoggingCallback> logging;
  std::string model_name;
  std::string artifact_dir;  // compile_only / validate_only reports
  // The metrics the model created while it was built (they live as long as the model): the
  // ones validation computes, combines over replicas, logs and resets. Every live metric when
  // the model created none at construction (one made elsewhere, e.g. by a callback).
  std::vector<cstorch::metrics::Metric*> model_metrics;
  std::vector<cstorch::metrics::Metric*> metrics() const {
    return model_metrics.empty() ? cstorch::metrics::live_metrics() : model_metrics;
  }
  // Validation loaders' positions before their first batch: every validation starts there.
  std::vector<std::pair<std::weak_ptr<cstorch::utils::data::DataLoader>, cstorch::State>>
      validation_starts;
};

// One run's record: model_dir/run_records/run_NNNN.yaml (`file` empty on processes other
// than the main one, which write nothing).
struct Trainer::RunRecord {
  std::filesystem::path file;
  nlohmann::ordered_json doc = nlohmann::ordered_json::object();  // fields in a fixed order
  std::chrono::steady_clock::time_point t0;
  int64_t start_step = 0;
  std::vector<std::string> checkpoints;
  const char* mode = "fit";

  // Replaces the file as a whole (a temporary file renamed over it), so a reader never sees
  // half a record.
  void write() const;
};

}  // namespace modelzoo
