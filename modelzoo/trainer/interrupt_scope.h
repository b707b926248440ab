// Trainer::fit's side of include/modelzoo/interrupt.h (modelzoo/trainer/interrupt.cpp).
#pragma once

namespace modelzoo::detail {

// While one is alive, a first SIGINT / SIGTERM asks to stop (interrupt_signal()) instead of
// ending the process: held by Trainer::fit's step loop.
class InterruptScope {
 public:
  InterruptScope();
  ~InterruptScope();
  InterruptScope(const InterruptScope&) = delete;
  InterruptScope& operator=(const InterruptScope&) = delete;
};

}  // namespace modelzoo::detail
