// Thread-count control for the shared OpenMP/OpenBLAS pool.
#include "backend/cpu/parallel.h"

namespace cstorch::cpu {

// OpenBLAS is always called single-threaded from inside our OpenMP team (linalg.cpp splits
// large GEMMs), so the OpenMP thread count is the only setting.
void set_num_threads(int n) {
  if (n <= 0) return;
  omp_set_num_threads(n);
}
int get_num_threads() {
  return omp_get_max_threads();
}

}  // namespace cstorch::cpu
