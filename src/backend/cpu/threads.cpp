// Thread-count control for the shared OpenMP/OpenBLAS pool.
#include <cblas.h>

#include "backend/cpu/parallel.h"

namespace cstorch::cpu {

void set_num_threads(int n) {
  if (n <= 0) return;
  omp_set_num_threads(n);
  openblas_set_num_threads(n);
}
int get_num_threads() { return omp_get_max_threads(); }

}  // namespace cstorch::cpu
