// Shared by the libFuzzer targets in fuzz/: a per-process scratch folder for readers that take
// a path, and the rule that decides what counts as a finding.
//
// The readers promise a cstorch::Error naming the file and the problem for any bad input, so
// that exception is the expected outcome and is swallowed. Anything else is a finding: a crash
// or sanitizer report (libFuzzer and ASan/UBSan stop the run themselves), a hang (-timeout), too
// much memory (-rss_limit_mb / -malloc_limit_mb), or an exception of another type escaping a
// reader (a std::out_of_range or a parser's own exception carries no file name or position the
// user can act on): FUZZ_CATCH prints it and aborts, so libFuzzer saves the input.
#pragma once
#include <cxxabi.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>
#include <typeinfo>

#include "cstorch/core/error.h"

namespace cstorch::fuzz {

// A folder of this process's own, made once: /dev/shm (memory) when there is one, else /tmp.
// Each input overwrites the same files, so a run leaves a handful of small files behind.
inline const std::string& scratch_dir() {
  static const std::string dir = [] {
    std::error_code ec;
    std::string base = std::filesystem::is_directory("/dev/shm", ec) ? "/dev/shm" : "/tmp";
    std::string d = base + "/cstorch-fuzz-" + std::to_string(::getpid());
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}

// Writes `bytes` to scratch_dir()/name and returns the path.
inline std::string write_scratch(const std::string& name, std::string_view bytes) {
  std::string path = scratch_dir() + "/" + name;
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f || std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size() || std::fclose(f) != 0) {
    std::perror(path.c_str());
    std::abort();  // the harness itself failed: not a finding in the reader, but stop loudly
  }
  return path;
}

[[noreturn]] inline void unexpected_exception(const char* what, const char* type) {
  int status = 0;
  char* name = abi::__cxa_demangle(type, nullptr, nullptr, &status);
  std::fprintf(stderr, "fuzz: a reader threw %s instead of cstorch::Error: %s\n",
               status == 0 && name ? name : type, what);
  std::abort();
}

}  // namespace cstorch::fuzz

// Runs `body`; a cstorch::Error is the expected answer to bad input, anything else aborts.
#define FUZZ_CATCH(body)                                               \
  do {                                                                 \
    try {                                                              \
      body;                                                            \
    } catch (const cstorch::Error&) {                                  \
    } catch (const std::exception& e) {                                \
      cstorch::fuzz::unexpected_exception(e.what(), typeid(e).name()); \
    }                                                                  \
  } while (0)
