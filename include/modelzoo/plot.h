// A run's loss and learning-rate curves as a PNG image, drawn with Cairo.
//
//   modelzoo::plot_metrics_file(model_dir / "metrics.jsonl", model_dir / "loss_lr.png");
//
// The image has two panels sharing the x axis (global step): on top the training loss and,
// when the metrics hold validation results, the validation loss (a line with a dot per
// validation, and a legend); the learning rate below. Each panel has axes, grid lines, tick
// labels and a title. Missing values (NaN) break a curve. Colors: white background, training
// loss kLossColor, validation loss kValLossColor, learning rate kLrColor.
#pragma once
#include <array>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "modelzoo/loggers.h"

namespace modelzoo {

inline constexpr std::array<uint8_t, 3> kLossColor{31, 119, 180};    // blue
inline constexpr std::array<uint8_t, 3> kValLossColor{44, 160, 44};  // green
inline constexpr std::array<uint8_t, 3> kLrColor{255, 127, 14};      // orange

struct PlotOptions {
  int width = 800;   // pixels, at least 200
  int height = 600;  // pixels, at least 200
  std::string loss_key = "loss";
  std::string lr_key = "lr";
  std::string val_loss_key = "eval/loss";  // drawn in the loss panel when present
  std::string title;                       // drawn above the loss panel when not empty
};

// An 8-bit RGB image, rows top to bottom, 3 bytes per pixel.
struct Image {
  int width = 0, height = 0;
  std::vector<uint8_t> rgb;
  Image() = default;
  Image(int w, int h, uint8_t r = 255, uint8_t g = 255, uint8_t b = 255);
  void set(int x, int y, uint8_t r, uint8_t g, uint8_t b);  // ignores points outside
  const uint8_t* at(int x, int y) const { return &rgb[(static_cast<size_t>(y) * width + x) * 3]; }
};

// Renders the loss and learning-rate series of `records` (the names in `options`), with the
// validation loss in the loss panel. Errors when none of the three series has a value, or the
// size is too small.
Image render_loss_lr_plot(const std::vector<MetricRecord>& records,
                          const PlotOptions& options = {});

// Writes `image` as a PNG (8-bit RGB, through Cairo), replacing `file` only once the new one is
// complete. Errors name the file.
void write_png(const Image& image, const std::filesystem::path& file);

// One warning on stderr naming the metrics file, how many damaged lines read_metrics_file left
// out and the first of them; nothing when there are none.
void warn_damaged_lines(const std::filesystem::path& metrics_file,
                        const std::vector<std::string>& damaged);

// read_metrics_file + render_loss_lr_plot + write_png. Damaged lines of the metrics file are
// left out of the plot, with a warning (warn_damaged_lines).
void plot_metrics_file(const std::filesystem::path& metrics_file, const std::filesystem::path& png,
                       const PlotOptions& options = {});

}  // namespace modelzoo
