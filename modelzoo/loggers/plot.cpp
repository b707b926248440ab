// Loss / learning-rate plot, drawn with Cairo (lines, text, PNG output).
#include "modelzoo/plot.h"

#include <cairo.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <utility>

#include <cstorch/core/error.h>

namespace modelzoo {

namespace {

struct RGB {
  uint8_t r, g, b;
};
constexpr RGB kBlack{0, 0, 0}, kGrid{225, 225, 225}, kText{40, 40, 40};
constexpr RGB rgb(const std::array<uint8_t, 3>& c) {
  return {c[0], c[1], c[2]};
}

void set_color(cairo_t* cr, RGB c) {
  cairo_set_source_rgb(cr, c.r / 255.0, c.g / 255.0, c.b / 255.0);
}

// About five "nice" ticks (1, 2 or 5 × 10^n apart) covering [lo, hi].
std::vector<double> nice_ticks(double lo, double hi, double* step_out) {
  double span = hi - lo;
  double raw = span / 5;
  double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double n = raw / mag;
  double step = (n < 1.5 ? 1 : n < 3 ? 2 : n < 7 ? 5 : 10) * mag;
  std::vector<double> t;
  for (double v = std::ceil(lo / step) * step; v <= hi + step * 1e-9; v += step)
    t.push_back(std::fabs(v) < step * 1e-9 ? 0.0 : v);
  *step_out = step;
  return t;
}

std::string tick_label(double v, double step) {
  double a = std::max(std::fabs(v), step);
  if (a >= 1e5 || step < 1e-3) return fmt::format("{:.1e}", v);
  int decimals = std::max(0, static_cast<int>(-std::floor(std::log10(step) + 1e-9)));
  return fmt::format("{:.{}f}", v, decimals);
}

struct Series {
  std::vector<std::pair<double, double>> points;  // (step, value), by step
};

Series series_of(const std::vector<MetricRecord>& records, const std::string& key) {
  Series s;
  for (const auto& r : records)
    if (r.name == key) s.points.emplace_back(static_cast<double>(r.step), r.value);
  std::stable_sort(s.points.begin(), s.points.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  return s;
}

// The plot area of one panel, in pixels (x0, y0 top left; x1, y1 bottom right).
struct Rect {
  double x0, y0, x1, y1;
};

double text_width(cairo_t* cr, const std::string& s) {
  cairo_text_extents_t e;
  cairo_text_extents(cr, s.c_str(), &e);
  return e.x_advance;
}

// Text with its baseline's left end at (x, y).
void text_at(cairo_t* cr, double x, double y, const std::string& s, RGB c) {
  set_color(cr, c);
  cairo_move_to(cr, x, y);
  cairo_show_text(cr, s.c_str());
}

// A 1-pixel line on pixel centres (crisp, not smeared over two rows).
void crisp_line(cairo_t* cr, double x0, double y0, double x1, double y1, RGB c) {
  set_color(cr, c);
  cairo_set_line_width(cr, 1.0);
  cairo_move_to(cr, std::floor(x0) + 0.5, std::floor(y0) + 0.5);
  cairo_line_to(cr, std::floor(x1) + 0.5, std::floor(y1) + 0.5);
  cairo_stroke(cr);
}

struct Curve {
  const Series* series;
  RGB color;
  std::string label;
  bool markers;  // a dot at every point (sparse series: validation)
};

void draw_panel(cairo_t* cr, const Rect& r, const std::vector<Curve>& curves, double xlo,
                double xhi, const std::string& title) {
  cairo_set_font_size(cr, 13);
  text_at(cr, r.x0, r.y0 - 8, title, kText);
  double ylo = INFINITY, yhi = -INFINITY;
  for (const auto& c : curves)
    for (auto& [x, y] : c.series->points)
      if (std::isfinite(y)) {
        ylo = std::min(ylo, y);
        yhi = std::max(yhi, y);
      }
  const bool any = std::isfinite(ylo);
  if (!any) {
    ylo = 0;
    yhi = 1;
  }
  if (yhi - ylo < 1e-12 * std::max(1.0, std::fabs(yhi))) {
    double d = std::fabs(yhi) > 0 ? std::fabs(yhi) * 0.1 : 1.0;
    ylo -= d;
    yhi += d;
  } else {
    double pad = (yhi - ylo) * 0.05;
    ylo -= pad;
    yhi += pad;
  }
  auto px = [&](double x) { return r.x0 + (x - xlo) / (xhi - xlo) * (r.x1 - r.x0); };
  auto py = [&](double y) { return r.y1 - (y - ylo) / (yhi - ylo) * (r.y1 - r.y0); };
  cairo_set_font_size(cr, 11);
  double ystep = 0, xstep = 0;
  for (double t : nice_ticks(ylo, yhi, &ystep)) {
    const double y = py(t);
    crisp_line(cr, r.x0 + 1, y, r.x1, y, kGrid);
    crisp_line(cr, r.x0 - 4, y, r.x0, y, kBlack);
    std::string l = tick_label(t, ystep);
    text_at(cr, r.x0 - 7 - text_width(cr, l), y + 4, l, kText);
  }
  for (double t : nice_ticks(xlo, xhi, &xstep)) {
    const double x = px(t);
    crisp_line(cr, x, r.y0, x, r.y1 - 1, kGrid);
    crisp_line(cr, x, r.y1, x, r.y1 + 4, kBlack);
    std::string l = tick_label(t, xstep);
    text_at(cr, x - text_width(cr, l) / 2, r.y1 + 17, l, kText);
  }
  // Axes on top of the grid.
  crisp_line(cr, r.x0, r.y0, r.x0, r.y1, kBlack);
  crisp_line(cr, r.x0, r.y1, r.x1, r.y1, kBlack);
  if (!any) {
    std::string l = "no values";
    text_at(cr, (r.x0 + r.x1 - text_width(cr, l)) / 2, (r.y0 + r.y1) / 2, l, kText);
    return;
  }
  // Curves, clipped to the plot area; a NaN value breaks the line.
  cairo_save(cr);
  cairo_rectangle(cr, r.x0, r.y0 - 4, r.x1 - r.x0 + 4, r.y1 - r.y0 + 4);
  cairo_clip(cr);
  cairo_set_line_join(cr, CAIRO_LINE_JOIN_ROUND);
  cairo_set_line_cap(cr, CAIRO_LINE_CAP_ROUND);
  for (const auto& c : curves) {
    set_color(cr, c.color);
    cairo_set_line_width(cr, 2.5);
    bool open = false;
    for (const auto& [x, y] : c.series->points) {
      if (!std::isfinite(y)) {
        open = false;
        continue;
      }
      if (open) {
        cairo_line_to(cr, px(x), py(y));
      } else {
        cairo_new_sub_path(cr);
        cairo_move_to(cr, px(x), py(y));
        cairo_line_to(cr, px(x), py(y));  // a lone point still shows (round cap)
        open = true;
      }
    }
    cairo_stroke(cr);
    if (c.markers)
      for (const auto& [x, y] : c.series->points)
        if (std::isfinite(y)) {
          cairo_new_sub_path(cr);
          cairo_arc(cr, px(x), py(y), 4.0, 0, 2 * M_PI);
          cairo_fill(cr);
        }
  }
  cairo_restore(cr);
  // A legend in the panel's top right corner when it holds more than one curve.
  if (curves.size() < 2) return;
  cairo_set_font_size(cr, 11);
  double y = r.y0 + 14;
  for (const auto& c : curves) {
    if (c.series->points.empty()) continue;
    const double w = text_width(cr, c.label);
    const double x = r.x1 - w - 10;
    set_color(cr, c.color);
    cairo_rectangle(cr, x - 22, y - 7, 16, 5);
    cairo_fill(cr);
    text_at(cr, x, y, c.label, kText);
    y += 16;
  }
}

using SurfacePtr = std::unique_ptr<cairo_surface_t, decltype(&cairo_surface_destroy)>;
using ContextPtr = std::unique_ptr<cairo_t, decltype(&cairo_destroy)>;

}  // namespace

Image::Image(int w, int h, uint8_t r, uint8_t g, uint8_t b) : width(w), height(h) {
  CS_CHECK(w > 0 && h > 0, "Image: size must be positive, got {}x{}", w, h);
  rgb.resize(static_cast<size_t>(w) * h * 3);
  for (size_t i = 0; i < rgb.size(); i += 3) {
    rgb[i] = r;
    rgb[i + 1] = g;
    rgb[i + 2] = b;
  }
}

void Image::set(int x, int y, uint8_t r, uint8_t g, uint8_t b) {
  if (x < 0 || y < 0 || x >= width || y >= height) return;
  uint8_t* p = &rgb[(static_cast<size_t>(y) * width + x) * 3];
  p[0] = r;
  p[1] = g;
  p[2] = b;
}

Image render_loss_lr_plot(const std::vector<MetricRecord>& records, const PlotOptions& o) {
  CS_CHECK(o.width >= 200 && o.height >= 200, "plot: the image must be at least 200x200, got {}x{}",
           o.width, o.height);
  Series loss = series_of(records, o.loss_key), lr = series_of(records, o.lr_key);
  Series val = series_of(records, o.val_loss_key);
  // A run shorter than its logging interval has validation losses but no training rows: it
  // still gets a plot (the validation curve) rather than an error.
  CS_CHECK(!loss.points.empty() || !lr.points.empty() || !val.points.empty(),
           "plot: the metrics have no '{}', no '{}' and no '{}' values to plot", o.loss_key,
           o.lr_key, o.val_loss_key);
  double xlo = INFINITY, xhi = -INFINITY;
  for (const Series* s : {&loss, &lr, &val})
    for (auto& p : s->points) {
      xlo = std::min(xlo, p.first);
      xhi = std::max(xhi, p.first);
    }
  if (xhi <= xlo) {
    xlo -= 1;
    xhi += 1;
  }
  SurfacePtr surface(cairo_image_surface_create(CAIRO_FORMAT_RGB24, o.width, o.height),
                     cairo_surface_destroy);
  CS_CHECK(cairo_surface_status(surface.get()) == CAIRO_STATUS_SUCCESS,
           "plot: cannot create a {}x{} image: {}", o.width, o.height,
           cairo_status_to_string(cairo_surface_status(surface.get())));
  {
    ContextPtr cr(cairo_create(surface.get()), cairo_destroy);
    cairo_t* c = cr.get();
    cairo_set_source_rgb(c, 1, 1, 1);
    cairo_paint(c);
    cairo_select_font_face(c, "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
    const double left = 80, right = 20, top = o.title.empty() ? 28 : 52, gap = 50, bottom = 44;
    if (!o.title.empty()) {
      cairo_set_font_size(c, 16);
      text_at(c, (o.width - text_width(c, o.title)) / 2, 22, o.title, kText);
    }
    const double panel_h = std::floor((o.height - top - gap - bottom) / 2);
    Rect top_r{left, top, o.width - right, top + panel_h};
    Rect bot_r{left, top + panel_h + gap, o.width - right, top + 2 * panel_h + gap};
    std::vector<Curve> top_curves{{&loss, rgb(kLossColor), "train loss", false}};
    if (!val.points.empty())
      top_curves.push_back({&val, rgb(kValLossColor), "validation loss", true});
    draw_panel(c, top_r, top_curves, xlo, xhi, o.loss_key == "loss" ? "loss" : o.loss_key);
    draw_panel(c, bot_r, {{&lr, rgb(kLrColor), "learning rate", false}}, xlo, xhi,
               o.lr_key == "lr" ? "learning rate" : o.lr_key);
    cairo_set_font_size(c, 12);
    text_at(c, (bot_r.x0 + bot_r.x1 - text_width(c, "step")) / 2, bot_r.y1 + 36, "step", kText);
    CS_CHECK(cairo_status(c) == CAIRO_STATUS_SUCCESS, "plot: drawing failed: {}",
             cairo_status_to_string(cairo_status(c)));
  }
  cairo_surface_flush(surface.get());
  // RGB24 pixels are native-endian 32-bit words 0x00RRGGBB.
  Image img(o.width, o.height);
  const unsigned char* data = cairo_image_surface_get_data(surface.get());
  const int stride = cairo_image_surface_get_stride(surface.get());
  for (int y = 0; y < o.height; ++y)
    for (int x = 0; x < o.width; ++x) {
      uint32_t px;
      std::memcpy(&px, data + static_cast<size_t>(y) * stride + static_cast<size_t>(x) * 4, 4);
      img.set(x, y, (px >> 16) & 0xff, (px >> 8) & 0xff, px & 0xff);
    }
  return img;
}

void write_png(const Image& image, const std::filesystem::path& file) {
  CS_CHECK(image.width > 0 && image.height > 0 &&
               image.rgb.size() == static_cast<size_t>(image.width) * image.height * 3,
           "write_png: the image buffer does not match its size {}x{}", image.width, image.height);
  SurfacePtr s(cairo_image_surface_create(CAIRO_FORMAT_RGB24, image.width, image.height),
               cairo_surface_destroy);
  CS_CHECK(cairo_surface_status(s.get()) == CAIRO_STATUS_SUCCESS,
           "write_png: cannot create a {}x{} image for '{}'", image.width, image.height,
           file.string());
  cairo_surface_flush(s.get());
  unsigned char* data = cairo_image_surface_get_data(s.get());
  const int stride = cairo_image_surface_get_stride(s.get());
  for (int y = 0; y < image.height; ++y)
    for (int x = 0; x < image.width; ++x) {
      const uint8_t* p = image.at(x, y);
      const uint32_t px = (uint32_t{p[0]} << 16) | (uint32_t{p[1]} << 8) | p[2];
      std::memcpy(data + static_cast<size_t>(y) * stride + static_cast<size_t>(x) * 4, &px, 4);
    }
  cairo_surface_mark_dirty(s.get());
  if (file.has_parent_path()) std::filesystem::create_directories(file.parent_path());
  // Written next to the target, then renamed over it: a failed write leaves the old plot.
  std::filesystem::path tmp = file;
  tmp += ".tmp";
  const cairo_status_t st = cairo_surface_write_to_png(s.get(), tmp.c_str());
  if (st != CAIRO_STATUS_SUCCESS) {
    std::error_code ec;
    std::filesystem::remove(tmp, ec);
    cstorch::fail("write_png: cannot write '{}': {}", file.string(), cairo_status_to_string(st));
  }
  std::filesystem::rename(tmp, file);
}

void warn_damaged_lines(const std::filesystem::path& metrics_file,
                        const std::vector<std::string>& damaged) {
  if (damaged.empty()) return;
  fmt::print(stderr, "warning: {}: {} damaged line{} left out of the plot ({}{})\n",
             metrics_file.string(), damaged.size(), damaged.size() == 1 ? "" : "s", damaged.front(),
             damaged.size() > 1 ? ", ..." : "");
}

void plot_metrics_file(const std::filesystem::path& metrics_file, const std::filesystem::path& png,
                       const PlotOptions& options) {
  std::vector<std::string> damaged;
  auto records = read_metrics_file(metrics_file, &damaged);
  warn_damaged_lines(metrics_file, damaged);
  write_png(render_loss_lr_plot(records, options), png);
}

}  // namespace modelzoo
