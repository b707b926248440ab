// Helpers shared by the end-to-end tests: run a program, make a scratch folder.
#pragma once
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <string>

#include "unit/test_util.h"

namespace e2e {

// Runs `cmd` through the shell; returns its stdout and stderr together and sets `*status` to
// the exit status (-1 when it did not exit normally, e.g. killed by a signal).
inline std::string run(const std::string& cmd, int* status) {
  std::string out;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) {
    *status = -1;
    return out;
  }
  std::array<char, 4096> buf;
  while (fgets(buf.data(), buf.size(), p)) out += buf.data();
  int st = pclose(p);
  *status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return out;
}

// An empty folder in the temp directory, unique to this process (the unit tests' helper).
using cstorch::testing::temp_dir;

// mpirun with N processes as CI needs it (root in a container: --allow-run-as-root; shared
// memory without cross-process attach; one kernel thread per replica on a small machine).
inline std::string mpirun(int n) {
  std::string cmd =
      std::string("OMPI_MCA_btl_vader_single_copy_mechanism=none OMP_NUM_THREADS=1 ") +
      CSTORCH_MPIEXEC + " -np " + std::to_string(n) + " --oversubscribe --bind-to none";
  if (::geteuid() == 0) cmd += " --allow-run-as-root";
  return cmd + " ";
}

}  // namespace e2e
