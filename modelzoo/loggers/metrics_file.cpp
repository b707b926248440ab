// CSV and JSON-lines metrics files (writers and the reader the plot uses), MultiLogger and
// the wall clock.
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <optional>
#include <sstream>
#include <variant>

#include <cstorch/core/error.h>
#include <nlohmann/json.hpp>

#include "modelzoo/loggers.h"

namespace modelzoo {

double unix_time() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

namespace {

std::ofstream open_append(const std::filesystem::path& file, const char* who, bool* was_empty) {
  if (file.has_parent_path()) {
    std::error_code ec;
    std::filesystem::create_directories(file.parent_path(), ec);
    CS_CHECK(!ec, "{}: cannot create the directory '{}': {}", who, file.parent_path().string(),
             ec.message());
  }
  std::error_code ec;
  auto size = std::filesystem::file_size(file, ec);
  *was_empty = ec || size == 0;
  // A last row cut short (a run killed in the middle of a write, a full disk) has no newline:
  // the next row would continue that line and be lost with it. The cut row is ended first.
  bool cut = false;
  if (!*was_empty) {
    std::ifstream in(file, std::ios::binary);
    in.seekg(-1, std::ios::end);
    cut = in.good() && in.get() != '\n';
  }
  errno = 0;
  std::ofstream out(file, std::ios::app);
  CS_CHECK(out.good(), "{}: cannot open '{}' for writing: {}", who, file.string(),
           errno != 0 ? std::strerror(errno) : "unknown reason");
  if (cut) out << '\n';
  return out;
}

// The cause of a failed stream operation: errno as the failing write left it (callers
// clear it first).
std::string stream_error() {
  return errno != 0 ? std::strerror(errno) : "the stream reported an error (no system error)";
}

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
  std::string r = "\"";
  for (char c : s) {
    if (c == '"') r += '"';
    r += c;
  }
  return r + "\"";
}

// Splits one CSV line (RFC 4180 quoting, no embedded newlines).
std::vector<std::string> csv_split(const std::string& line) {
  std::vector<std::string> f(1);
  bool quoted = false;
  for (size_t i = 0; i < line.size(); ++i) {
    char c = line[i];
    if (quoted) {
      if (c == '"' && i + 1 < line.size() && line[i + 1] == '"') {
        f.back() += '"';
        ++i;
      } else if (c == '"') {
        quoted = false;
      } else {
        f.back() += c;
      }
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      f.emplace_back();
    } else if (c != '\r') {
      f.back() += c;
    }
  }
  return f;
}

// The step of one line of a metrics file, if it has one (not the CSV header, not a damaged
// line).
std::optional<int64_t> line_step(const std::string& line, bool csv) {
  if (csv) {
    size_t comma = line.find(',');
    if (comma == std::string::npos) return std::nullopt;
    int64_t v = 0;
    auto [p, ec] = std::from_chars(line.data(), line.data() + comma, v);
    if (ec != std::errc() || p != line.data() + comma) return std::nullopt;
    return v;
  }
  auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("step") || !j["step"].is_number_integer()) return std::nullopt;
  return j["step"].get<int64_t>();
}

// Rewrites `file` without its rows of steps after `step` (crash safe: a temporary file renamed
// over it). Nothing happens when there are none.
void drop_steps_after(const std::filesystem::path& file, int64_t step, bool csv, const char* who) {
  std::ifstream in(file, std::ios::binary);
  if (!in.good()) return;  // not created yet
  std::string line, kept;
  bool dropped = false;
  while (std::getline(in, line)) {
    auto s = line_step(line, csv);
    if (s && *s > step) {
      dropped = true;
      continue;
    }
    kept += line;
    kept += '\n';
  }
  CS_CHECK(in.eof(), "{}: reading '{}' failed: {}", who, file.string(), stream_error());
  in.close();
  if (!dropped) return;
  std::filesystem::path tmp = file;
  tmp += fmt::format(".tmp-{}", static_cast<long>(::getpid()));
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    errno = 0;
    out << kept;
    out.flush();
    CS_CHECK(out.good(), "{}: writing '{}' failed: {}", who, tmp.string(), stream_error());
  }
  std::error_code ec;
  std::filesystem::rename(tmp, file, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    cstorch::fail("{}: replacing '{}' failed: {}", who, file.string(), ec.message());
  }
}

// Shortest text that reads back as the same double ("{}" in fmt is round-trip exact).
std::string number(double v) {
  return fmt::format("{}", v);
}

}  // namespace

CSVLogger::CSVLogger(const std::filesystem::path& file) : path_(file) {
  bool empty = false;
  out_ = open_append(file, "CSVLogger", &empty);
  if (empty) out_ << "step,wall_time,name,value\n";
  flush();
}

void CSVLogger::log_metrics(int64_t step, const Scalars& metrics) {
  CS_CHECK(!closed_, "CSVLogger: log_metrics after close() ('{}')", path_.string());
  std::string t = fmt::format("{:.3f}", unix_time());
  errno = 0;
  for (const auto& [name, value] : metrics)
    out_ << step << ',' << t << ',' << csv_field(name) << ',' << number(value) << '\n';
  flush();
}

void CSVLogger::flush() {
  if (closed_) return;
  if (out_.good()) errno = 0;  // else keep the cause of the write that failed
  out_.flush();
  CS_CHECK(out_.good(), "CSVLogger: writing '{}' failed: {}", path_.string(), stream_error());
}

void CSVLogger::resume_at(int64_t step) {
  CS_CHECK(!closed_, "CSVLogger: resume_at after close() ('{}')", path_.string());
  flush();
  out_.close();
  drop_steps_after(path_, step, /*csv=*/true, "CSVLogger");
  bool empty = false;
  out_ = open_append(path_, "CSVLogger", &empty);
  if (empty) out_ << "step,wall_time,name,value\n";
  flush();
}

void CSVLogger::close() {
  if (closed_) return;
  flush();
  out_.close();
  closed_ = true;
}

JSONLinesLogger::JSONLinesLogger(const std::filesystem::path& file) : path_(file) {
  bool empty = false;
  out_ = open_append(file, "JSONLinesLogger", &empty);
}

void JSONLinesLogger::log_metrics(int64_t step, const Scalars& metrics) {
  CS_CHECK(!closed_, "JSONLinesLogger: log_metrics after close() ('{}')", path_.string());
  nlohmann::ordered_json j;
  j["step"] = step;
  j["wall_time"] = std::round(unix_time() * 1000) / 1000;
  for (const auto& [name, value] : metrics) {
    CS_CHECK(name != "step" && name != "wall_time",
             "JSONLinesLogger: a metric may not be called '{}' (a reserved key of '{}')", name,
             path_.string());
    // JSON has no NaN or infinity: those are written as the strings "NaN", "Infinity" and
    // "-Infinity" (as JavaScript spells them), so that a loss that diverged reads as such.
    if (std::isfinite(value))
      j[name] = value;
    else
      j[name] = std::isnan(value) ? "NaN" : value > 0 ? "Infinity" : "-Infinity";
  }
  errno = 0;
  out_ << j.dump() << '\n';
  flush();
}

void JSONLinesLogger::flush() {
  if (closed_) return;
  if (out_.good()) errno = 0;  // else keep the cause of the write that failed
  out_.flush();
  CS_CHECK(out_.good(), "JSONLinesLogger: writing '{}' failed: {}", path_.string(), stream_error());
}

void JSONLinesLogger::resume_at(int64_t step) {
  CS_CHECK(!closed_, "JSONLinesLogger: resume_at after close() ('{}')", path_.string());
  flush();
  out_.close();
  drop_steps_after(path_, step, /*csv=*/false, "JSONLinesLogger");
  bool empty = false;
  out_ = open_append(path_, "JSONLinesLogger", &empty);
}

void JSONLinesLogger::close() {
  if (closed_) return;
  flush();
  out_.close();
  closed_ = true;
}

namespace {

// The rows of one line of a metrics file (none for a blank line), or why it is not a row.
std::variant<std::vector<MetricRecord>, std::string> parse_metrics_line(const std::string& line,
                                                                        bool csv) {
  std::vector<MetricRecord> rows;
  if (line.empty() || line == "\r") return rows;
  if (csv) {
    auto f = csv_split(line);
    if (f.size() != 4) return fmt::format("expected 4 fields, got {}", f.size());
    try {
      rows.push_back({std::stoll(f[0]), std::stod(f[1]), f[2], std::stod(f[3])});
    } catch (const std::exception&) {
      return fmt::format("bad number in \"{}\"", line);
    }
    return rows;
  }
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(line);
  } catch (const std::exception& e) {
    return fmt::format("invalid JSON: {}", e.what());
  }
  if (!j.is_object() || !j.contains("step") || !j["step"].is_number_integer())
    return std::string("expected an object with an integer \"step\"");
  int64_t step = j["step"].get<int64_t>();
  double wall =
      j.contains("wall_time") && j["wall_time"].is_number() ? j["wall_time"].get<double>() : 0.0;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "step" || it.key() == "wall_time") continue;
    // A non-finite value is one of the strings above (null in files of earlier versions).
    double v = NAN;
    if (it->is_number()) {
      v = it->get<double>();
    } else if (it->is_string() && (*it == "Infinity" || *it == "-Infinity")) {
      v = *it == "Infinity" ? INFINITY : -INFINITY;
    } else if (!(it->is_null() || (it->is_string() && *it == "NaN"))) {
      return fmt::format("\"{}\" is not a number", it.key());
    }
    rows.push_back({step, wall, it.key(), v});
  }
  return rows;
}

}  // namespace

std::vector<MetricRecord> read_metrics_file(const std::filesystem::path& file,
                                            std::vector<std::string>* damaged) {
  std::ifstream in(file);
  CS_CHECK(in.good(), "read_metrics_file: cannot open '{}'", file.string());
  std::vector<MetricRecord> out;
  std::string line;
  int64_t lineno = 0;
  bool csv = file.extension() == ".csv";
  while (std::getline(in, line)) {
    ++lineno;
    if (csv && lineno == 1) {
      CS_CHECK(line.rfind("step,wall_time,name,value", 0) == 0,
               "read_metrics_file: '{}' line 1: expected the header "
               "\"step,wall_time,name,value\", got \"{}\"",
               file.string(), line);
      continue;
    }
    auto rows = parse_metrics_line(line, csv);
    if (auto* why = std::get_if<std::string>(&rows)) {
      CS_CHECK(damaged != nullptr, "read_metrics_file: '{}' line {}: {}", file.string(), lineno,
               *why);
      damaged->push_back(fmt::format("line {}: {}", lineno, *why));
      continue;
    }
    for (auto& r : std::get<std::vector<MetricRecord>>(rows)) out.push_back(std::move(r));
  }
  return out;
}

void MultiLogger::log_metrics(int64_t step, const Scalars& metrics) {
  for (auto& l : loggers_) l->log_metrics(step, metrics);
}
void MultiLogger::flush() {
  for (auto& l : loggers_) l->flush();
}
void MultiLogger::close() {
  for (auto& l : loggers_) l->close();
}
void MultiLogger::resume_at(int64_t step) {
  for (auto& l : loggers_) l->resume_at(step);
}

}  // namespace modelzoo
