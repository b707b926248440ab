// Console progress bar: redrawn in place on a terminal, plain periodic lines otherwise.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iostream>

#include <cstorch/core/error.h>

#include "cstorch/distributed.h"

#include "modelzoo/loggers.h"

namespace modelzoo {

namespace {

double steady_seconds() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

std::string hms(double seconds) {
  auto s = static_cast<int64_t>(std::llround(std::max(0.0, seconds)));
  if (s >= 3600) return fmt::format("{}:{:02d}:{:02d}", s / 3600, (s / 60) % 60, s % 60);
  return fmt::format("{}:{:02d}", s / 60, s % 60);
}

}  // namespace

bool stdout_is_terminal() {
  // Under an MPI launcher stdout is the launcher's pseudo-terminal whatever the launcher's own
  // output is: trust what cszoo recorded before launching (CSTORCH_STDOUT_IS_TTY), and treat
  // an unknown launch as not a terminal, so piped logs never hold redraw frames.
  if (cstorch::distributed::launched_by_mpi()) {
    const char* v = std::getenv("CSTORCH_STDOUT_IS_TTY");
    return v && std::string(v) == "1";
  }
  return ::isatty(STDOUT_FILENO) == 1;
}

ProgressBar::ProgressBar(Options options) : opt_(std::move(options)) {
  CS_CHECK(opt_.total_steps > 0, "ProgressBar: total_steps must be positive, got {}",
           opt_.total_steps);
  CS_CHECK(opt_.bar_width >= 1, "ProgressBar: bar_width must be at least 1, got {}",
           opt_.bar_width);
  CS_CHECK(opt_.print_every >= 1, "ProgressBar: print_every must be at least 1, got {}",
           opt_.print_every);
  out_ = opt_.out ? opt_.out : &std::cout;
  terminal_ = opt_.terminal.value_or(stdout_is_terminal());
  if (!opt_.clock) opt_.clock = steady_seconds;
}

ProgressBar::~ProgressBar() {
  try {
    close();
  } catch (...) {
  }
}

std::string ProgressBar::render(int64_t step, const Scalars& metrics, double now) const {
  const int64_t total = opt_.total_steps;
  int64_t shown = std::clamp<int64_t>(step, 0, total);
  double frac = static_cast<double>(shown) / static_cast<double>(total);
  int width = static_cast<int>(std::to_string(total).size());
  std::string s = fmt::format("{} {:>{}}/{}", opt_.desc, step, width, total);
  if (terminal_) {
    int filled = static_cast<int>(frac * opt_.bar_width);
    std::string bar(static_cast<size_t>(opt_.bar_width), ' ');
    for (int i = 0; i < filled; ++i) bar[static_cast<size_t>(i)] = '=';
    if (filled < opt_.bar_width) bar[static_cast<size_t>(filled)] = '>';
    s += fmt::format(" [{}] {:3d}%", bar, static_cast<int>(frac * 100));
  }
  double rate = 0;
  if (t0_ && now > *t0_ && step > step0_) rate = static_cast<double>(step - step0_) / (now - *t0_);
  if (rate > 0) {
    s += rate >= 10 ? fmt::format("  {:.1f} steps/s", rate) : fmt::format("  {:.2f} steps/s", rate);
    s += "  ETA " + hms(static_cast<double>(total - shown) / rate);
  } else {
    s += "  -- steps/s  ETA --";
  }
  if (auto it = metrics.find(opt_.loss_key); it != metrics.end())
    s += fmt::format("  {} {:.4f}", opt_.loss_key, it->second);
  if (auto it = metrics.find(opt_.lr_key); it != metrics.end())
    s += fmt::format("  {} {:.2e}", opt_.lr_key, it->second);
  return s;
}

void ProgressBar::log_metrics(int64_t step, const Scalars& metrics) {
  CS_CHECK(!closed_, "ProgressBar: log_metrics after close()");
  double now = opt_.clock();
  if (!t0_) {
    t0_ = now;
    step0_ = step;
  }
  std::string line = render(step, metrics, now);
  if (terminal_) {
    // Pad over a longer previous line, and return to column 0 for the next redraw.
    *out_ << '\r' << line << "\x1b[K";
    line_open_ = true;
    if (step >= opt_.total_steps) {
      *out_ << '\n';
      line_open_ = false;
    }
    out_->flush();
  } else if (step % opt_.print_every == 0 || step >= opt_.total_steps) {
    *out_ << line << '\n';
    out_->flush();
  }
}

void ProgressBar::flush() {
  out_->flush();
}

void ProgressBar::close() {
  if (closed_) return;
  if (line_open_) *out_ << '\n';
  line_open_ = false;
  out_->flush();
  closed_ = true;
}

}  // namespace modelzoo
