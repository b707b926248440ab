// Every unit test starts without a backend, as it does when ctest runs it in a process of its
// own: the backend is process-wide and of one type for the process's life, so a test that made
// a GPU or CSX backend would otherwise fail every later test that makes another type when the
// binary runs whole (unit_tests, a gtest filter over several tests, or the sanitizer leg's
// shards).
//
// The metric registry is process-wide too, and a test cannot reset it: a metric lives as long
// as its owner. So every test must end with no live metric (its models and metrics destroyed);
// one kept longer shows up in a later test's live_metrics() and compute_all(). Checked here for
// every test, so a leak fails the test that made it, in a process of its own or not.
#include <gtest/gtest.h>

#include <string>

#include "cstorch/metrics.h"
#include "runtime/run_mode.h"

namespace {

class FreshBackend : public testing::EmptyTestEventListener {
  void OnTestEnd(const testing::TestInfo&) override {
    std::string live;
    for (const cstorch::metrics::Metric* m : cstorch::metrics::live_metrics())
      live += (live.empty() ? "" : ", ") + m->name();
    EXPECT_TRUE(live.empty()) << "the test left metrics alive past its end: " << live;
    cstorch::runtime::reset_backend_for_tests();
  }
};

const bool registered = [] {
  testing::UnitTest::GetInstance()->listeners().Append(new FreshBackend);
  return true;
}();

}  // namespace
