// The Trainer's private parts shared by its source files (trainer.cpp, run_record.cpp).
#pragma once
#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "modelzoo/trainer.h"
#include "modelzoo/trainer/core_callbacks.h"

namespace modelzoo {

struct Trainer::Impl {
  std::vector<std::shared_ptr<CoreCallback>> core;
  std::shared_ptr<MultiLogger> loggers;
  std::shared_ptr<LoggingCallback> logging;
  std::string model_name;
  std::string artifact_dir;  // compile_only / validate_only reports
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
