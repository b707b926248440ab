// Parallel loops on the one OpenMP thread pool that OpenBLAS (OpenMP build) also uses, so BLAS
// and our kernels never oversubscribe the cores. Small loops run inline: on 2 cores a fork/join
// costs more than a few thousand elements of work.
#pragma once
#include <omp.h>

#include <algorithm>
#include <cstdint>

namespace cstorch::cpu {

// Calls f(begin, end) over [0, n) in chunks; parallel when n >= 2 * grain and threads > 1.
// At most `max_threads` threads when it is > 0 (a kernel whose workspace has that many
// per-thread slots; a thread finds its slot at omp_get_thread_num()).
template <class F>
inline void parallel_for(int64_t n, int64_t grain, F&& f, int max_threads = 0) {
  if (n <= 0) return;
  int threads = omp_get_max_threads();
  if (max_threads > 0) threads = std::min(threads, max_threads);
  if (threads <= 1 || n < 2 * grain || omp_in_parallel()) {
    f(int64_t{0}, n);
    return;
  }
  int64_t chunks = std::min<int64_t>(threads, (n + grain - 1) / grain);
#pragma omp parallel for num_threads(static_cast <int>(chunks)) schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    int64_t b = n * c / chunks, e = n * (c + 1) / chunks;
    f(b, e);
  }
}

// Calls f(t, nt) once on each thread t of a team of `threads`, or f(0, 1) on the calling thread
// alone when threads <= 1 (no parallel region: its entry costs more than a small product).
template <class F>
inline void run_on_team(int threads, F&& f) {
  if (threads <= 1) {
    f(0, 1);
    return;
  }
#pragma omp parallel num_threads(threads)
  f(omp_get_thread_num(), omp_get_num_threads());
}

// Default grain for simple elementwise loops (elements per chunk).
inline constexpr int64_t kElementwiseGrain = 32768;

// Sets the thread count of the shared pool (OpenMP and OpenBLAS); n <= 0 keeps the default.
void set_num_threads(int n);
int get_num_threads();

// Ends the calling thread's idle OpenMP pool (its team's worker threads); no-op inside a parallel
// region or where the thread has none. Why: libgomp shortens its spin-wait to about 100
// iterations once it manages more threads than there are CPUs, so while a client thread's idle
// pool exists, every parallel region of the executor's team ends with its threads asleep on a
// futex and starts with a wake-up (measured on 2 cores: the FC-MNIST 256x256 step at 2 threads
// took 600 us with the client's pool alive, 408 us without).
void release_thread_pool();

// Denormal f32/f64 handling of the calling thread and of its OpenMP team (the CPU's DAZ and FTZ
// modes; threads created later inherit it). Returns false, changing nothing, where the CPU has
// no such modes.
bool set_flush_denormal(bool on);

}  // namespace cstorch::cpu
