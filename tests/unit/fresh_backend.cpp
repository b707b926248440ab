// Every unit test starts without a backend, as it does when ctest runs it in a process of its
// own: the backend is process-wide and of one type for the process's life, so a test that made
// a GPU or CSX backend would otherwise fail every later test that makes another type when the
// binary runs whole (unit_tests, or a gtest filter over several tests).
#include <gtest/gtest.h>

#include "runtime/run_mode.h"

namespace {

class FreshBackend : public testing::EmptyTestEventListener {
  void OnTestEnd(const testing::TestInfo&) override { cstorch::runtime::reset_backend_for_tests(); }
};

const bool registered = [] {
  testing::UnitTest::GetInstance()->listeners().Append(new FreshBackend);
  return true;
}();

}  // namespace
