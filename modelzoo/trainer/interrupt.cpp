// The handlers of include/modelzoo/interrupt.h. The handler touches only lock-free atomics and
// calls only async-signal-safe functions (write, signal, raise).
#include "modelzoo/interrupt.h"

#include "modelzoo/trainer/interrupt_scope.h"

#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>

namespace modelzoo {

namespace {

std::atomic<int> g_signal{0};
std::atomic<int> g_scopes{0};
static_assert(std::atomic<int>::is_always_lock_free);

extern "C" void on_interrupt(int sig) {
  int none = 0;
  if (g_scopes.load() > 0 && g_signal.compare_exchange_strong(none, sig)) {
    static const char msg[] =
        "\ninterrupted: stopping after this step (a checkpoint of it is saved); interrupt again "
        "to stop at once\n";
    const ssize_t n = ::write(STDERR_FILENO, msg, sizeof msg - 1);
    (void)n;
    return;
  }
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

void install(int sig) {
  struct sigaction old {};
  if (sigaction(sig, nullptr, &old) != 0 || old.sa_handler == SIG_IGN) return;
  struct sigaction sa {};
  sa.sa_handler = on_interrupt;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // other threads' reads and waits carry on
  sigaction(sig, &sa, nullptr);
}

}  // namespace

void install_interrupt_handlers() {
  install(SIGINT);
  install(SIGTERM);
}

int interrupt_signal() {
  return g_signal.load();
}

void exit_if_interrupted() {
  const int sig = g_signal.load();
  if (sig == 0) return;
  std::fflush(stdout);
  std::fflush(stderr);
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

namespace detail {
InterruptScope::InterruptScope() {
  g_scopes.fetch_add(1);
}
InterruptScope::~InterruptScope() {
  g_scopes.fetch_sub(1);
}
}  // namespace detail

}  // namespace modelzoo
