// Model Zoo loggers: TensorBoard event files read back by an independent reader here (own
// bitwise CRC-32C and protobuf decoding) and by a standard-library Python reader; CSV and
// JSON-lines metrics files; the progress bar; the loss/LR PNG plot (parsed here and by
// Python's zlib).
#include <cairo.h>
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "modelzoo/loggers.h"
#include "modelzoo/plot.h"
#include "unit/test_util.h"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

fs::path temp_dir(const std::string& tag) {
  auto p = fs::temp_directory_path() /
           ("cstorch_" + tag + "_" + std::to_string(static_cast<long>(::getpid())));
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// Runs `cmd`, returns the exit status and stdout + stderr.
int run(const std::string& cmd, std::string* out) {
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return -1;
  char buf[4096];
  size_t n;
  out->clear();
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out->append(buf, n);
  int rc = ::pclose(p);
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

std::string script(const char* name) {
  return std::string(CSTORCH_PYTHON) + " " + CSTORCH_SOURCE_DIR + "/tests/unit/modelzoo/" + name;
}

// ---- an independent TFRecord / Event reader -------------------------------------------------

uint32_t crc32c_bitwise(const uint8_t* p, size_t n) {
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
  }
  return ~c;
}
uint32_t mask(uint32_t c) {
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

struct Event {
  double wall_time = 0;
  int64_t step = 0;
  std::string file_version;
  std::vector<std::pair<std::string, float>> values;
};

struct Proto {
  const uint8_t* p;
  size_t n, i = 0;
  uint64_t varint() {
    uint64_t v = 0;
    for (int s = 0;; s += 7) {
      if (i >= n) throw std::runtime_error("truncated varint");
      uint8_t b = p[i++];
      v |= static_cast<uint64_t>(b & 0x7f) << s;
      if (!(b & 0x80)) return v;
    }
  }
  // Next field: number, wire type and its bytes (varints decoded into `num`).
  bool next(int* field, int* wire, std::string* bytes, uint64_t* num) {
    if (i >= n) return false;
    uint64_t key = varint();
    *field = static_cast<int>(key >> 3);
    *wire = static_cast<int>(key & 7);
    size_t len = 0;
    switch (*wire) {
      case 0:
        *num = varint();
        return true;
      case 1:
        len = 8;
        break;
      case 2:
        len = varint();
        break;
      case 5:
        len = 4;
        break;
      default:
        throw std::runtime_error("bad wire type");
    }
    if (i + len > n) throw std::runtime_error("truncated field");
    bytes->assign(reinterpret_cast<const char*>(p + i), len);
    i += len;
    return true;
  }
};

// Parses a whole event file; throws std::runtime_error on bad framing or CRCs.
std::vector<Event> read_events(const fs::path& file) {
  std::string d = read_file(file);
  const auto* p = reinterpret_cast<const uint8_t*>(d.data());
  std::vector<Event> out;
  size_t pos = 0;
  while (pos < d.size()) {
    if (pos + 12 > d.size()) throw std::runtime_error("truncated header");
    uint64_t len;
    uint32_t len_crc, data_crc;
    std::memcpy(&len, p + pos, 8);
    std::memcpy(&len_crc, p + pos + 8, 4);
    if (len_crc != mask(crc32c_bitwise(p + pos, 8))) throw std::runtime_error("bad length CRC");
    if (pos + 16 + len > d.size()) throw std::runtime_error("truncated record");
    std::memcpy(&data_crc, p + pos + 12 + len, 4);
    if (data_crc != mask(crc32c_bitwise(p + pos + 12, len)))
      throw std::runtime_error("bad data CRC");
    Event e;
    Proto ev{p + pos + 12, len};
    int f, w;
    std::string b;
    uint64_t num = 0;
    while (ev.next(&f, &w, &b, &num)) {
      if (f == 1 && w == 1) std::memcpy(&e.wall_time, b.data(), 8);
      if (f == 2 && w == 0) e.step = static_cast<int64_t>(num);
      if (f == 3 && w == 2) e.file_version = b;
      if (f == 5 && w == 2) {
        Proto sum{reinterpret_cast<const uint8_t*>(b.data()), b.size()};
        std::string vb;
        while (sum.next(&f, &w, &vb, &num)) {
          if (f != 1 || w != 2) continue;
          Proto val{reinterpret_cast<const uint8_t*>(vb.data()), vb.size()};
          std::string tag, x;
          float fv = NAN;
          while (val.next(&f, &w, &x, &num)) {
            if (f == 1 && w == 2) tag = x;
            if (f == 2 && w == 5) std::memcpy(&fv, x.data(), 4);
          }
          e.values.emplace_back(tag, fv);
        }
      }
    }
    out.push_back(e);
    pos += 16 + len;
  }
  return out;
}

}  // namespace

TEST(TensorBoard, Crc32cKnownValues) {
  // The standard check value of CRC-32C, and the empty string.
  EXPECT_EQ(modelzoo::crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(modelzoo::crc32c("", 0), 0u);
  std::string s(1000, '\x5a');
  EXPECT_EQ(modelzoo::crc32c(s.data(), s.size()),
            crc32c_bitwise(reinterpret_cast<const uint8_t*>(s.data()), s.size()));
}

TEST(TensorBoard, EventFileReadsBackWithBothReaders) {
  auto dir = temp_dir("tb");
  fs::path file;
  double before = modelzoo::unix_time();
  {
    modelzoo::TensorBoardLogger tb(dir / "train");
    file = tb.path();
    EXPECT_EQ(file.parent_path(), dir / "train");
    EXPECT_EQ(file.filename().string().rfind("events.out.tfevents.", 0), 0u);
    for (int64_t s = 1; s <= 3; ++s)
      tb.log_metrics(s * 10, {{"loss", 1.0 / s}, {"lr", 0.01 * s}, {"eval/accuracy", 0.5 + s}});
    tb.log_metrics(1000000000000LL, {{"big step", -2.5}});
    tb.close();
    EXPECT_ERROR(tb.log_metrics(5, {{"loss", 1}}), "log_metrics after close()");
  }
  auto events = read_events(file);
  ASSERT_EQ(events.size(), 5u);
  EXPECT_EQ(events[0].file_version, "brain.Event:2");
  EXPECT_TRUE(events[0].values.empty());
  for (auto& e : events) {
    EXPECT_GE(e.wall_time, before - 1);
    EXPECT_LE(e.wall_time, modelzoo::unix_time() + 1);
  }
  for (int s = 1; s <= 3; ++s) {
    const Event& e = events[static_cast<size_t>(s)];
    EXPECT_EQ(e.step, s * 10);
    // Values come in tag order (the map's), as float.
    ASSERT_EQ(e.values.size(), 3u);
    EXPECT_EQ(e.values[0].first, "eval/accuracy");
    EXPECT_EQ(e.values[0].second, static_cast<float>(0.5 + s));
    EXPECT_EQ(e.values[1].first, "loss");
    EXPECT_EQ(e.values[1].second, static_cast<float>(1.0 / s));
    EXPECT_EQ(e.values[2].first, "lr");
    EXPECT_EQ(e.values[2].second, static_cast<float>(0.01 * s));
  }
  EXPECT_EQ(events[4].step, 1000000000000LL);

  // The standard-library Python reader agrees.
  std::string out;
  ASSERT_EQ(run(script("read_tfevents.py") + " '" + file.string() + "'", &out), 0) << out;
  json py = json::parse(out);
  ASSERT_EQ(py.size(), events.size());
  EXPECT_EQ(py[0]["file_version"], "brain.Event:2");
  for (size_t i = 0; i < events.size(); ++i) {
    EXPECT_EQ(py[i]["step"].get<int64_t>(), events[i].step);
    EXPECT_DOUBLE_EQ(py[i]["wall_time"].get<double>(), events[i].wall_time);
    ASSERT_EQ(py[i]["values"].size(), events[i].values.size());
    for (size_t k = 0; k < events[i].values.size(); ++k) {
      EXPECT_EQ(py[i]["values"][k]["tag"], events[i].values[k].first);
      EXPECT_EQ(py[i]["values"][k]["simple_value"].get<double>(), events[i].values[k].second);
    }
  }

  // A flipped byte is caught by both readers (the readers can fail).
  std::string bytes = read_file(file);
  bytes[bytes.size() - 10] ^= 0x20;
  auto bad = dir / "corrupt.tfevents";
  std::ofstream(bad, std::ios::binary) << bytes;
  EXPECT_THROW(read_events(bad), std::runtime_error);
  EXPECT_NE(run(script("read_tfevents.py") + " '" + bad.string() + "'", &out), 0);
  EXPECT_NE(out.find("bad data CRC"), std::string::npos) << out;
  fs::remove_all(dir);
}

TEST(TensorBoard, TwoLoggersInOneDirectoryGetDistinctFiles) {
  auto dir = temp_dir("tb2");
  modelzoo::TensorBoardLogger a(dir), b(dir);
  EXPECT_NE(a.path(), b.path());
  fs::remove_all(dir);
}

TEST(TensorBoard, UnwritableDirectoryIsAClearError) {
  auto dir = temp_dir("tb3");
  std::ofstream(dir / "file") << "x";  // a file where a directory is needed
  EXPECT_ERROR(modelzoo::TensorBoardLogger(dir / "file" / "sub"),
               "TensorBoardLogger: cannot create the log directory", "file/sub");
  fs::remove_all(dir);
}

TEST(MetricsFiles, CsvAndJsonLinesRoundTripAndAppend) {
  auto dir = temp_dir("mfiles");
  auto csv = dir / "metrics.csv", jsonl = dir / "sub" / "metrics.jsonl";
  {
    modelzoo::CSVLogger c(csv);
    modelzoo::JSONLinesLogger j(jsonl);
    for (modelzoo::Logger* l : std::initializer_list<modelzoo::Logger*>{&c, &j}) {
      l->log_metrics(1, {{"loss", 2.5}, {"lr", 1e-3}});
      l->log_metrics(2, {{"loss", 0.1 + 0.2}, {"odd, \"name\"", NAN}});
    }
  }
  {  // a resumed run appends; the CSV header is not repeated
    modelzoo::CSVLogger c(csv);
    modelzoo::JSONLinesLogger j(jsonl);
    c.log_metrics(3, {{"eval/accuracy", 0.75}});
    j.log_metrics(3, {{"eval/accuracy", 0.75}});
    c.close();
    EXPECT_ERROR(c.log_metrics(4, {}), "CSVLogger: log_metrics after close()");
  }
  std::string text = read_file(csv);
  EXPECT_EQ(text.rfind("step,wall_time,name,value\n", 0), 0u);
  EXPECT_EQ(text.find("step,wall_time", 1), std::string::npos);
  EXPECT_NE(text.find(",\"odd, \"\"name\"\"\",nan\n"), std::string::npos) << text;
  for (const auto& f : {csv, jsonl}) {
    auto r = modelzoo::read_metrics_file(f);
    ASSERT_EQ(r.size(), 5u) << f;
    EXPECT_EQ(r[0].step, 1);
    EXPECT_EQ(r[0].name, "loss");  // map order
    EXPECT_EQ(r[0].value, 2.5);
    EXPECT_EQ(r[1].name, "lr");
    EXPECT_EQ(r[1].value, 1e-3);
    EXPECT_EQ(r[2].value, 0.1 + 0.2);  // exact round trip
    EXPECT_EQ(r[3].name, "odd, \"name\"");
    EXPECT_TRUE(std::isnan(r[3].value));
    EXPECT_EQ(r[4].step, 3);
    EXPECT_EQ(r[4].name, "eval/accuracy");
    EXPECT_GT(r[4].wall_time, 1.6e9);
  }
  fs::remove_all(dir);
}

TEST(MetricsFiles, ReadErrorsNameFileAndLine) {
  auto dir = temp_dir("mfiles_bad");
  std::ofstream(dir / "a.jsonl") << "{\"step\": 1, \"loss\": 2}\n{\"step\": 2, \"loss\": \"x\"}\n";
  EXPECT_ERROR(modelzoo::read_metrics_file(dir / "a.jsonl"), "a.jsonl' line 2",
               "\"loss\" is not a number");
  std::ofstream(dir / "b.jsonl") << "{\"step\": 1}\nnot json\n";
  EXPECT_ERROR(modelzoo::read_metrics_file(dir / "b.jsonl"), "b.jsonl' line 2", "invalid JSON");
  std::ofstream(dir / "c.csv") << "step,wall_time,name,value\n1,0,loss\n";
  EXPECT_ERROR(modelzoo::read_metrics_file(dir / "c.csv"), "c.csv' line 2",
               "expected 4 fields, got 3");
  std::ofstream(dir / "d.csv") << "x,y\n";
  EXPECT_ERROR(modelzoo::read_metrics_file(dir / "d.csv"), "d.csv' line 1", "expected the header");
  EXPECT_ERROR(modelzoo::read_metrics_file(dir / "missing.csv"), "cannot open", "missing.csv");
  modelzoo::JSONLinesLogger j(dir / "e.jsonl");
  EXPECT_ERROR(j.log_metrics(1, {{"step", 1}}), "may not be called 'step'");
  fs::remove_all(dir);
}

TEST(ProgressBar, TerminalRedrawsOneLineWithRateEtaLossAndLr) {
  std::ostringstream out;
  double now = 100;
  modelzoo::ProgressBar bar(
      {.total_steps = 100, .bar_width = 10, .out = &out, .terminal = true, .clock = [&] {
         return now;
       }});
  bar.log_metrics(0, {{"loss", 2.0}});
  EXPECT_EQ(out.str(), "\rtrain   0/100 [>         ]   0%  -- steps/s  ETA --  loss 2.0000\x1b[K");
  now = 110;  // 50 steps in 10 s: 5 steps/s, 50 steps left: ETA 10 s
  bar.log_metrics(50, {{"loss", 0.12346}, {"lr", 0.001}, {"other", 3}});
  std::string s = out.str();
  EXPECT_NE(s.find("\rtrain  50/100 [=====>    ]  50%  5.00 steps/s  ETA 0:10  loss 0.1235  lr "
                   "1.00e-03\x1b[K"),
            std::string::npos)
      << s;
  now = 120;
  bar.log_metrics(100, {{"loss", 0.1}});
  s = out.str();
  EXPECT_NE(s.find("[==========] 100%  5.00 steps/s  ETA 0:00  loss 0.1000\x1b[K\n"),
            std::string::npos)
      << s;
  EXPECT_EQ(s.back(), '\n');
  // Long runs show hours.
  EXPECT_NE(bar.render(50, {}, 100 + 3600.0 * 10).find("ETA 10:00:00"), std::string::npos)
      << bar.render(50, {}, 100 + 3600.0 * 10);
}

TEST(ProgressBar, NotATerminalPrintsPlainPeriodicLines) {
  std::ostringstream out;
  double now = 0;
  modelzoo::ProgressBar bar(
      {.total_steps = 25, .print_every = 10, .out = &out, .terminal = false, .clock = [&] {
         return now;
       }});
  EXPECT_FALSE(bar.terminal());
  for (int s = 1; s <= 25; ++s) {
    now = s * 0.5;
    bar.log_metrics(s, {{"loss", 1.0 / s}});
  }
  bar.close();
  std::string s = out.str();
  EXPECT_EQ(s.find('\r'), std::string::npos);
  EXPECT_EQ(s.find('['), std::string::npos);
  // Steps 10, 20 and the last one (25), one line each.
  EXPECT_EQ(std::count(s.begin(), s.end(), '\n'), 3) << s;
  EXPECT_NE(s.find("train 10/25  2.00 steps/s  ETA 0:08  loss 0.1000\n"), std::string::npos) << s;
  EXPECT_NE(s.find("train 25/25"), std::string::npos) << s;
  EXPECT_ERROR(modelzoo::ProgressBar({.total_steps = 0}), "total_steps must be positive");
}

// ---- the plot ---------------------------------------------------------------------------------

namespace {

struct Png {
  int w = 0, h = 0;
  std::vector<uint8_t> rgb;
};

// Decodes a PNG through Cairo (which reads any valid PNG, whatever its scanline filters) into
// RGB; the independent standard-library check is check_png.py.
Png parse_png(const fs::path& file) {
  Png png;
  cairo_surface_t* s = cairo_image_surface_create_from_png(file.c_str());
  EXPECT_EQ(cairo_surface_status(s), CAIRO_STATUS_SUCCESS) << file;
  if (cairo_surface_status(s) == CAIRO_STATUS_SUCCESS) {
    png.w = cairo_image_surface_get_width(s);
    png.h = cairo_image_surface_get_height(s);
    const unsigned char* data = cairo_image_surface_get_data(s);
    const int stride = cairo_image_surface_get_stride(s);
    for (int y = 0; y < png.h; ++y)
      for (int x = 0; x < png.w; ++x) {
        uint32_t px;
        std::memcpy(&px, data + static_cast<size_t>(y) * stride + static_cast<size_t>(x) * 4, 4);
        png.rgb.push_back(static_cast<uint8_t>(px >> 16));
        png.rgb.push_back(static_cast<uint8_t>(px >> 8));
        png.rgb.push_back(static_cast<uint8_t>(px));
      }
  }
  cairo_surface_destroy(s);
  return png;
}

// Mean row of the pixels of `color` in column x within rows [y0, y1); -1 if none.
double mean_row(const Png& png, int x, int y0, int y1, std::array<uint8_t, 3> color) {
  double sum = 0;
  int n = 0;
  for (int y = y0; y < y1; ++y) {
    const uint8_t* q = &png.rgb[(static_cast<size_t>(y) * png.w + x) * 3];
    if (q[0] == color[0] && q[1] == color[1] && q[2] == color[2]) {
      sum += y;
      ++n;
    }
  }
  return n ? sum / n : -1;
}

}  // namespace

TEST(Plot, LossAndLrCurvesAsAValidPng) {
  auto dir = temp_dir("plot");
  {
    modelzoo::JSONLinesLogger j(dir / "metrics.jsonl");
    for (int s = 0; s <= 200; s += 5) {
      modelzoo::Scalars m{{"loss", 2.5 * std::exp(-s / 60.0) + 0.1},
                          {"lr", 0.01 * 0.5 * (1 + std::cos(M_PI * s / 200.0))}};
      if (s % 50 == 0) m["eval/accuracy"] = s / 200.0;
      j.log_metrics(s, m);
    }
  }
  auto png_path = dir / "loss_lr.png";
  modelzoo::plot_metrics_file(dir / "metrics.jsonl", png_path,
                              {.width = 400, .height = 300, .title = "fc_mnist run"});
  Png png = parse_png(png_path);
  ASSERT_EQ(png.w, 400);
  ASSERT_EQ(png.h, 300);
  // The loss curve (blue) falls from left to right in the top half; the LR curve (orange)
  // falls in the bottom half; sampled columns across the plot area all hold the curve.
  const std::array<uint8_t, 3> blue{31, 119, 180}, orange{255, 127, 14};
  double prev_loss = -1, prev_lr = -1;
  int columns = 0;
  for (int x = 90; x < 375; x += 15) {
    double yl = mean_row(png, x, 0, png.h / 2, blue);
    double yr = mean_row(png, x, png.h / 2, png.h, orange);
    ASSERT_GE(yl, 0) << "no loss curve in column " << x;
    ASSERT_GE(yr, 0) << "no lr curve in column " << x;
    EXPECT_GE(yl, prev_loss - 1) << "column " << x;  // rows grow downwards
    EXPECT_GE(yr, prev_lr - 1) << "column " << x;
    prev_loss = yl;
    prev_lr = yr;
    ++columns;
  }
  EXPECT_GT(columns, 15);
  // Axes and tick labels are drawn: the left axis column is black over most of a panel.
  int black = 0;
  for (int y = 0; y < png.h; ++y)
    if (png.rgb[(static_cast<size_t>(y) * png.w + 80) * 3] == 0) ++black;
  EXPECT_GT(black, png.h / 2);

  // Python's zlib agrees: valid chunks, the right inflated size, the same blue pixel count.
  size_t blue_count = 0;
  for (size_t i = 0; i < png.rgb.size(); i += 3)
    if (png.rgb[i] == 31 && png.rgb[i + 1] == 119 && png.rgb[i + 2] == 180) ++blue_count;
  std::string out;
  ASSERT_EQ(run(script("check_png.py") + " '" + png_path.string() + "' 31 119 180", &out), 0)
      << out;
  json py = json::parse(out);
  EXPECT_EQ(py["width"], 400);
  EXPECT_EQ(py["height"], 300);
  EXPECT_EQ(py["color_pixels"].get<size_t>(), blue_count);
  EXPECT_GT(py["columns"].get<int>(), 250);  // the curve spans the plot's width
  fs::remove_all(dir);
}

TEST(Plot, Errors) {
  auto dir = temp_dir("plot_err");
  {
    modelzoo::CSVLogger c(dir / "m.csv");
    c.log_metrics(1, {{"accuracy", 0.5}});
  }
  EXPECT_ERROR(modelzoo::plot_metrics_file(dir / "m.csv", dir / "p.png"),
               "no 'loss', no 'lr' and no 'eval/loss' values");
  // Only validation losses (a run shorter than its logging interval): a plot of them.
  modelzoo::Image val_only = modelzoo::render_loss_lr_plot(
      {{10, 0, "eval/loss", 2.0}, {20, 0, "eval/loss", 1.5}}, {.width = 400, .height = 300});
  size_t val_pixels = 0;
  for (size_t i = 0; i < val_only.rgb.size(); i += 3)
    if (val_only.rgb[i] != val_only.rgb[i + 1] || val_only.rgb[i + 1] != val_only.rgb[i + 2])
      ++val_pixels;  // coloured (not white, black or grey): the curve and its markers
  EXPECT_GT(val_pixels, 50u);
  EXPECT_ERROR(modelzoo::render_loss_lr_plot({{1, 0, "loss", 1.0}}, {.width = 50}),
               "at least 200x200");
  EXPECT_ERROR(modelzoo::plot_metrics_file(dir / "none.jsonl", dir / "p.png"), "cannot open");
  // Only a loss series (and a single point): still a valid image.
  modelzoo::Image img = modelzoo::render_loss_lr_plot({{7, 0, "loss", 1.0}});
  EXPECT_EQ(img.width, 800);
  modelzoo::write_png(img, dir / "one.png");
  EXPECT_EQ(parse_png(dir / "one.png").h, 600);
  fs::remove_all(dir);
}
