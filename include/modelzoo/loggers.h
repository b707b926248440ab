// Model Zoo loggers: where a run's scalars (loss, learning rate, eval metrics) go.
//
//   modelzoo::TensorBoardLogger tb(model_dir / "tensorboard");
//   modelzoo::JSONLinesLogger file(model_dir / "metrics.jsonl");
//   modelzoo::ProgressBar bar({.total_steps = 1000});
//   for each logged step: tb.log_metrics(step, {{"loss", 0.42}, {"lr", 1e-3}});  (same for the
//   others)
//
// Every logger takes one call per logged step with a map of scalar name -> value (names are
// free-form tags such as "loss", "lr", "eval/accuracy"). Values are host doubles: read them
// from a step closure or after synchronisation, never inside a traced step. Errors (a file
// that cannot be created or written) are cstorch::Error naming the file.
#pragma once
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

namespace modelzoo {

using Scalars = std::map<std::string, double>;

class Logger {
 public:
  virtual ~Logger() = default;
  // Records `metrics` for global step `step` (steps should not decrease).
  virtual void log_metrics(int64_t step, const Scalars& metrics) = 0;
  // Pushes buffered output to its destination (the OS, the terminal).
  virtual void flush() {}
  // Flushes and releases the destination; later log_metrics calls are errors. Idempotent.
  virtual void close() {}
  // A run starts (or resumes from a checkpoint) at global step `step`: records of later steps
  // that the destination already holds (an earlier run went past that checkpoint before it
  // was stopped) are dropped, so the steps logged again are not there twice. The metrics
  // files rewrite themselves; other loggers ignore it.
  virtual void resume_at(int64_t step) {}
};

// Seconds since the Unix epoch (the wall_time of TensorBoard events and metrics files).
double unix_time();

// ---------------------------------------------------------------------------------------------
// TensorBoard scalar event file, written without TensorFlow:
//   LOG_DIR/events.out.tfevents.<unix seconds>.<hostname>.<pid>.<n>
// The file is a sequence of TFRecords — uint64 length (little endian), uint32 masked CRC-32C
// of the length bytes, the payload, uint32 masked CRC-32C of the payload (mask:
// ((crc >> 15) | (crc << 17)) + 0xa282ead8) — each payload a serialized tensorflow.Event
// protobuf: wall_time (field 1, double), step (2, int64), then either file_version (3,
// "brain.Event:2", the first record) or summary (5) holding one Summary.Value (field 1) per
// scalar with tag (1, string) and simple_value (2, float). One event per log_metrics call.
// Creates LOG_DIR if needed.
class TensorBoardLogger : public Logger {
 public:
  explicit TensorBoardLogger(const std::filesystem::path& log_dir);
  ~TensorBoardLogger() override;
  void log_metrics(int64_t step, const Scalars& metrics) override;
  void flush() override;
  void close() override;
  const std::filesystem::path& path() const { return path_; }

 private:
  void write_record(const std::string& payload);
  std::filesystem::path path_;
  std::ofstream out_;
  bool closed_ = false;
};

// CRC-32C (Castagnoli), as TFRecord uses, and its TFRecord mask.
uint32_t crc32c(const void* data, size_t n);
uint32_t masked_crc32c(const void* data, size_t n);

// ---------------------------------------------------------------------------------------------
// Metrics files. CSV: a header "step,wall_time,name,value" then one row per scalar (long
// format, so metrics logged at different steps — training loss, eval accuracy — share one
// file); names containing a comma or quote are quoted as RFC 4180. JSON lines: one object per
// log_metrics call, {"step": S, "wall_time": T, "<name>": value, ...}; non-finite values are
// written as null. Both append to an existing file (a resumed run continues it; the CSV
// header is written only to an empty file) and flush after every call, so a killed run keeps
// what it logged. resume_at(S) rewrites the file without the rows of steps after S.
class CSVLogger : public Logger {
 public:
  explicit CSVLogger(const std::filesystem::path& file);
  void log_metrics(int64_t step, const Scalars& metrics) override;
  void flush() override;
  void close() override;
  void resume_at(int64_t step) override;

 private:
  std::filesystem::path path_;
  std::ofstream out_;
  bool closed_ = false;
};

class JSONLinesLogger : public Logger {
 public:
  explicit JSONLinesLogger(const std::filesystem::path& file);
  void log_metrics(int64_t step, const Scalars& metrics) override;
  void flush() override;
  void close() override;
  void resume_at(int64_t step) override;

 private:
  std::filesystem::path path_;
  std::ofstream out_;
  bool closed_ = false;
};

// One scalar read back from a metrics file.
struct MetricRecord {
  int64_t step = 0;
  double wall_time = 0;
  std::string name;
  double value = 0;  // NaN for a JSON null
};
// Reads a CSV (".csv") or JSON-lines (any other extension) metrics file written by the
// loggers above. Errors name the file and line. With `damaged` given, a line that does not read
// as a row (a row cut short when a run was killed or the disk filled, a hand edit) is skipped
// instead and described there ("line N: why"), so that the rest of the history still plots;
// a file that cannot be opened, or a CSV file without its header, is an error either way.
std::vector<MetricRecord> read_metrics_file(const std::filesystem::path& file,
                                            std::vector<std::string>* damaged = nullptr);

// ---------------------------------------------------------------------------------------------
// Console progress. On a terminal: one line redrawn in place ("\r"),
//   train  420/1000 [=========>          ]  42%  12.5 steps/s  ETA 0:46  loss 0.4321  lr 1.00e-03
// Not on a terminal (a log file, CI): quiet except a plain line every `print_every` steps and
// at the last step, without the bar. Rate = steps since the first call / seconds since then
// (0 until a second call); ETA = (total_steps − step) / rate. `loss_key` and `lr_key` pick the
// scalars shown (absent ones are left out).
// Whether stdout is a terminal: isatty, except in an MPI launch (whose launcher gives every
// process a pseudo-terminal): there the CSTORCH_STDOUT_IS_TTY=1 that `cszoo --num_csx N` sets
// when its own stdout is a terminal, else false.
bool stdout_is_terminal();

class ProgressBar : public Logger {
 public:
  struct Options {
    int64_t total_steps = 0;  // > 0 (an error otherwise)
    std::string desc = "train";
    std::string loss_key = "loss";
    std::string lr_key = "lr";
    int bar_width = 30;
    int64_t print_every = 100;      // non-terminal output
    std::ostream* out = nullptr;    // default std::cout
    std::optional<bool> terminal;   // default: stdout_is_terminal()
    std::function<double()> clock;  // seconds; default steady_clock (tests inject one)
  };
  explicit ProgressBar(Options options);
  ~ProgressBar() override;
  void log_metrics(int64_t step, const Scalars& metrics) override;
  void flush() override;
  void close() override;  // ends the in-place line with a newline
  bool terminal() const { return terminal_; }
  // The text of the status for `step` (no "\r"/newline); exposed for tests.
  std::string render(int64_t step, const Scalars& metrics, double now) const;

 private:
  Options opt_;
  bool terminal_;
  std::ostream* out_;
  std::optional<double> t0_;
  int64_t step0_ = 0;
  bool line_open_ = false, closed_ = false;
};

// Fans one call out to several loggers (in order).
class MultiLogger : public Logger {
 public:
  void add(std::shared_ptr<Logger> l) { loggers_.push_back(std::move(l)); }
  void log_metrics(int64_t step, const Scalars& metrics) override;
  void flush() override;
  void close() override;
  void resume_at(int64_t step) override;
  const std::vector<std::shared_ptr<Logger>>& loggers() const { return loggers_; }

 private:
  std::vector<std::shared_ptr<Logger>> loggers_;
};

}  // namespace modelzoo
