// Loss / learning-rate plot: a tiny raster renderer (lines, rectangles, a 5x7 bitmap font)
// and a PNG encoder over zlib.
#include "modelzoo/plot.h"

#include <zlib.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <utility>

#include <cstorch/core/error.h>

namespace modelzoo {

namespace {

struct RGB {
  uint8_t r, g, b;
};
constexpr RGB kBlack{0, 0, 0}, kGrid{225, 225, 225}, kLoss{31, 119, 180}, kLr{255, 127, 14},
    kText{40, 40, 40};

// 5x7 glyphs, rows top to bottom, '#' = ink.
const std::map<char, std::array<const char*, 7>>& font() {
  static const std::map<char, std::array<const char*, 7>> f = {
      {'0', {".###.", "#...#", "#..##", "#.#.#", "##..#", "#...#", ".###."}},
      {'1', {"..#..", ".##..", "..#..", "..#..", "..#..", "..#..", ".###."}},
      {'2', {".###.", "#...#", "....#", "...#.", "..#..", ".#...", "#####"}},
      {'3', {"#####", "...#.", "..#..", "...#.", "....#", "#...#", ".###."}},
      {'4', {"...#.", "..##.", ".#.#.", "#..#.", "#####", "...#.", "...#."}},
      {'5', {"#####", "#....", "####.", "....#", "....#", "#...#", ".###."}},
      {'6', {"..##.", ".#...", "#....", "####.", "#...#", "#...#", ".###."}},
      {'7', {"#####", "....#", "...#.", "..#..", ".#...", ".#...", ".#..."}},
      {'8', {".###.", "#...#", "#...#", ".###.", "#...#", "#...#", ".###."}},
      {'9', {".###.", "#...#", "#...#", ".####", "....#", "...#.", ".##.."}},
      {'a', {".....", ".....", ".###.", "....#", ".####", "#...#", ".####"}},
      {'b', {"#....", "#....", "#.##.", "##..#", "#...#", "#...#", "####."}},
      {'c', {".....", ".....", ".###.", "#....", "#....", "#...#", ".###."}},
      {'d', {"....#", "....#", ".##.#", "#..##", "#...#", "#...#", ".####"}},
      {'e', {".....", ".....", ".###.", "#...#", "#####", "#....", ".###."}},
      {'f', {"..##.", ".#..#", ".#...", "###..", ".#...", ".#...", ".#..."}},
      {'g', {".....", ".....", ".####", "#...#", ".####", "....#", ".###."}},
      {'h', {"#....", "#....", "#.##.", "##..#", "#...#", "#...#", "#...#"}},
      {'i', {"..#..", ".....", ".##..", "..#..", "..#..", "..#..", ".###."}},
      {'j', {"...#.", ".....", "..##.", "...#.", "...#.", "#..#.", ".##.."}},
      {'k', {"#....", "#....", "#..#.", "#.#..", "##...", "#.#..", "#..#."}},
      {'l', {".##..", "..#..", "..#..", "..#..", "..#..", "..#..", ".###."}},
      {'m', {".....", ".....", "##.#.", "#.#.#", "#.#.#", "#...#", "#...#"}},
      {'n', {".....", ".....", "#.##.", "##..#", "#...#", "#...#", "#...#"}},
      {'o', {".....", ".....", ".###.", "#...#", "#...#", "#...#", ".###."}},
      {'p', {".....", ".....", "####.", "#...#", "####.", "#....", "#...."}},
      {'q', {".....", ".....", ".##.#", "#..##", ".####", "....#", "....#"}},
      {'r', {".....", ".....", "#.##.", "##..#", "#....", "#....", "#...."}},
      {'s', {".....", ".....", ".###.", "#....", ".###.", "....#", "####."}},
      {'t', {".#...", ".#...", "###..", ".#...", ".#...", ".#..#", "..##."}},
      {'u', {".....", ".....", "#...#", "#...#", "#...#", "#..##", ".##.#"}},
      {'v', {".....", ".....", "#...#", "#...#", "#...#", ".#.#.", "..#.."}},
      {'w', {".....", ".....", "#...#", "#...#", "#.#.#", "#.#.#", ".#.#."}},
      {'x', {".....", ".....", "#...#", ".#.#.", "..#..", ".#.#.", "#...#"}},
      {'y', {".....", ".....", "#...#", "#...#", ".####", "....#", ".###."}},
      {'z', {".....", ".....", "#####", "...#.", "..#..", ".#...", "#####"}},
      {'.', {".....", ".....", ".....", ".....", ".....", ".##..", ".##.."}},
      {',', {".....", ".....", ".....", ".....", ".##..", "..#..", ".#..."}},
      {'-', {".....", ".....", ".....", "#####", ".....", ".....", "....."}},
      {'+', {".....", "..#..", "..#..", "#####", "..#..", "..#..", "....."}},
      {':', {".....", ".##..", ".##..", ".....", ".##..", ".##..", "....."}},
      {'/', {".....", "....#", "...#.", "..#..", ".#...", "#....", "....."}},
      {'_', {".....", ".....", ".....", ".....", ".....", ".....", "#####"}},
      {'(', {"...#.", "..#..", ".#...", ".#...", ".#...", "..#..", "...#."}},
      {')', {".#...", "..#..", "...#.", "...#.", "...#.", "..#..", ".#..."}},
      {'%', {"##...", "##..#", "...#.", "..#..", ".#...", "#..##", "...##"}},
      {' ', {".....", ".....", ".....", ".....", ".....", ".....", "....."}},
  };
  return f;
}
constexpr std::array<const char*, 7> kUnknownGlyph = {"#####", "#...#", "#...#", "#...#",
                                                      "#...#", "#...#", "#####"};

class Canvas {
 public:
  explicit Canvas(Image& img) : img_(img) {}
  void pixel(int x, int y, RGB c) { img_.set(x, y, c.r, c.g, c.b); }
  void hline(int x0, int x1, int y, RGB c) {
    for (int x = std::min(x0, x1); x <= std::max(x0, x1); ++x) pixel(x, y, c);
  }
  void vline(int x, int y0, int y1, RGB c) {
    for (int y = std::min(y0, y1); y <= std::max(y0, y1); ++y) pixel(x, y, c);
  }
  // Bresenham, `thick` pixels wide (a square pen).
  void line(int x0, int y0, int x1, int y1, RGB c, int thick = 2) {
    int dx = std::abs(x1 - x0), sx = x0 < x1 ? 1 : -1;
    int dy = -std::abs(y1 - y0), sy = y0 < y1 ? 1 : -1;
    int err = dx + dy;
    while (true) {
      for (int a = 0; a < thick; ++a)
        for (int b = 0; b < thick; ++b) pixel(x0 + a - thick / 2, y0 + b - thick / 2, c);
      if (x0 == x1 && y0 == y1) break;
      int e2 = 2 * err;
      if (e2 >= dy) {
        err += dy;
        x0 += sx;
      }
      if (e2 <= dx) {
        err += dx;
        y0 += sy;
      }
    }
  }
  static int text_width(const std::string& s, int scale = 1) {
    return static_cast<int>(s.size()) * 6 * scale;
  }
  // Text with its top-left corner at (x, y).
  void text(int x, int y, const std::string& s, RGB c, int scale = 1) {
    for (char ch : s) {
      char k = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      auto it = font().find(k);
      const auto& g = it == font().end() ? kUnknownGlyph : it->second;
      for (int r = 0; r < 7; ++r)
        for (int col = 0; col < 5; ++col)
          if (g[static_cast<size_t>(r)][col] == '#')
            for (int a = 0; a < scale; ++a)
              for (int b = 0; b < scale; ++b) pixel(x + col * scale + a, y + r * scale + b, c);
      x += 6 * scale;
    }
  }

 private:
  Image& img_;
};

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

struct Rect {
  int x0, y0, x1, y1;  // inclusive plot area
};

void draw_panel(Canvas& cv, const Rect& r, const Series& s, double xlo, double xhi,
                const std::string& title, RGB color, bool x_labels) {
  cv.text(r.x0, r.y0 - 14, title, kText);
  double ylo = INFINITY, yhi = -INFINITY;
  for (auto& [x, y] : s.points)
    if (std::isfinite(y)) {
      ylo = std::min(ylo, y);
      yhi = std::max(yhi, y);
    }
  bool any = std::isfinite(ylo);
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
  auto px = [&](double x) {
    return r.x0 + static_cast<int>(std::lround((x - xlo) / (xhi - xlo) * (r.x1 - r.x0)));
  };
  auto py = [&](double y) {
    return r.y1 - static_cast<int>(std::lround((y - ylo) / (yhi - ylo) * (r.y1 - r.y0)));
  };
  double ystep = 0, xstep = 0;
  for (double t : nice_ticks(ylo, yhi, &ystep)) {
    int y = py(t);
    cv.hline(r.x0 + 1, r.x1, y, kGrid);
    cv.hline(r.x0 - 4, r.x0, y, kBlack);
    std::string l = tick_label(t, ystep);
    cv.text(r.x0 - 7 - Canvas::text_width(l), y - 3, l, kText);
  }
  for (double t : nice_ticks(xlo, xhi, &xstep)) {
    int x = px(t);
    cv.vline(x, r.y0, r.y1 - 1, kGrid);
    cv.vline(x, r.y1, r.y1 + 4, kBlack);
    if (x_labels) {
      std::string l = tick_label(t, xstep);
      cv.text(x - Canvas::text_width(l) / 2, r.y1 + 8, l, kText);
    }
  }
  // Axes on top of the grid.
  cv.vline(r.x0, r.y0, r.y1, kBlack);
  cv.hline(r.x0, r.x1, r.y1, kBlack);
  if (!any) {
    std::string l = "no values";
    cv.text((r.x0 + r.x1 - Canvas::text_width(l)) / 2, (r.y0 + r.y1) / 2, l, kText);
    return;
  }
  const std::pair<double, double>* prev = nullptr;
  for (const auto& p : s.points) {
    if (!std::isfinite(p.second)) {
      prev = nullptr;
      continue;
    }
    if (prev)
      cv.line(px(prev->first), py(prev->second), px(p.first), py(p.second), color);
    else
      cv.line(px(p.first), py(p.second), px(p.first), py(p.second), color);
    prev = &p;
  }
}

void put_be32(std::string& out, uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<char>((v >> s) & 0xff));
}

void put_chunk(std::string& out, const char* type, const std::string& data) {
  put_be32(out, static_cast<uint32_t>(data.size()));
  std::string td = std::string(type, 4) + data;
  out += td;
  put_be32(out, static_cast<uint32_t>(::crc32(0, reinterpret_cast<const Bytef*>(td.data()),
                                              static_cast<uInt>(td.size()))));
}

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
  CS_CHECK(!loss.points.empty() || !lr.points.empty(),
           "plot: the metrics have no '{}' and no '{}' values to plot", o.loss_key, o.lr_key);
  double xlo = INFINITY, xhi = -INFINITY;
  for (const Series* s : {&loss, &lr})
    for (auto& p : s->points) {
      xlo = std::min(xlo, p.first);
      xhi = std::max(xhi, p.first);
    }
  if (xhi <= xlo) {
    xlo -= 1;
    xhi += 1;
  }
  Image img(o.width, o.height);
  Canvas cv(img);
  const int left = 80, right = 20, top = o.title.empty() ? 24 : 44, gap = 46, bottom = 40;
  if (!o.title.empty())
    cv.text((o.width - Canvas::text_width(o.title, 2)) / 2, 8, o.title, kText, 2);
  int panel_h = (o.height - top - gap - bottom) / 2;
  Rect top_r{left, top, o.width - right, top + panel_h};
  Rect bot_r{left, top + panel_h + gap, o.width - right, top + 2 * panel_h + gap};
  draw_panel(cv, top_r, loss, xlo, xhi, o.loss_key, kLoss, true);
  draw_panel(cv, bot_r, lr, xlo, xhi, o.lr_key == "lr" ? "learning rate" : o.lr_key, kLr, true);
  cv.text((bot_r.x0 + bot_r.x1 - Canvas::text_width("step")) / 2, bot_r.y1 + 22, "step", kText);
  return img;
}

void write_png(const Image& image, const std::filesystem::path& file) {
  CS_CHECK(image.width > 0 && image.height > 0 &&
               image.rgb.size() == static_cast<size_t>(image.width) * image.height * 3,
           "write_png: the image buffer does not match its size {}x{}", image.width, image.height);
  // Scanlines, each with filter byte 0 (none).
  size_t row = static_cast<size_t>(image.width) * 3;
  std::string raw;
  raw.reserve((row + 1) * static_cast<size_t>(image.height));
  for (int y = 0; y < image.height; ++y) {
    raw.push_back('\0');
    raw.append(reinterpret_cast<const char*>(&image.rgb[row * static_cast<size_t>(y)]), row);
  }
  uLongf zlen = compressBound(static_cast<uLong>(raw.size()));
  std::string z(zlen, '\0');
  int rc = compress2(reinterpret_cast<Bytef*>(z.data()), &zlen,
                     reinterpret_cast<const Bytef*>(raw.data()), static_cast<uLong>(raw.size()), 6);
  CS_CHECK(rc == Z_OK, "write_png: zlib compression failed (code {}) for '{}'", rc, file.string());
  z.resize(zlen);

  std::string png("\x89PNG\r\n\x1a\n", 8);
  std::string ihdr;
  put_be32(ihdr, static_cast<uint32_t>(image.width));
  put_be32(ihdr, static_cast<uint32_t>(image.height));
  ihdr += std::string("\x08\x02\x00\x00\x00", 5);  // 8-bit, RGB, deflate, filter 0, no interlace
  put_chunk(png, "IHDR", ihdr);
  put_chunk(png, "IDAT", z);
  put_chunk(png, "IEND", "");

  if (file.has_parent_path()) std::filesystem::create_directories(file.parent_path());
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  CS_CHECK(out.good(), "write_png: cannot create '{}'", file.string());
  out.write(png.data(), static_cast<std::streamsize>(png.size()));
  out.close();
  CS_CHECK(out.good(), "write_png: writing '{}' failed", file.string());
}

void plot_metrics_file(const std::filesystem::path& metrics_file, const std::filesystem::path& png,
                       const PlotOptions& options) {
  write_png(render_loss_lr_plot(read_metrics_file(metrics_file), options), png);
}

}  // namespace modelzoo
