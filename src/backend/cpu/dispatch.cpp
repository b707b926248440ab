// Which variant of the CPU kernels runs (variant.h): the built variants, what each needs of the
// CPU, and the choice, made once per process.
#include <cstdlib>
#include <string>
#include <string_view>

#include "backend/cpu/variant.h"
#include "cstorch/core/error.h"
#include "cstorch/version.h"

// CMake defines CSTORCH_CPU_VARIANT_LIST as X(suffix) for every built variant, best first.
#if !defined(CSTORCH_CPU_VARIANT_LIST)
#error "CSTORCH_CPU_VARIANT_LIST names the built variants of the CPU kernels (CMakeLists.txt)"
#endif

#define X(suffix) extern "C" const cstorch::cpu::KernelVariant* cstorch_cpu_variant_##suffix();
CSTORCH_CPU_VARIANT_LIST
#undef X

namespace cstorch::cpu {

namespace {

const KernelVariant* const* variant_array(size_t* n) {
  static const KernelVariant* const all[] = {
#define X(suffix) cstorch_cpu_variant_##suffix(),
      CSTORCH_CPU_VARIANT_LIST
#undef X
  };
  *n = sizeof(all) / sizeof(all[0]);
  return all;
}

std::string names(bool only_runnable) {
  std::string s;
  for (const KernelVariant* v : built_variants()) {
    if (only_runnable && !runs_here(*v)) continue;
    if (!s.empty()) s += ", ";
    s += v->name;
  }
  return s.empty() ? "none" : s;
}

const KernelVariant* choose() {
  const auto all = built_variants();
  const char* env = std::getenv("CSTORCH_CPU_KERNELS");
  if (env && *env) {
    const std::string_view want(env);
    if (want == "generic") return all.back();
    for (const KernelVariant* v : all) {
      if (want != v->name) continue;
      CS_CHECK(runs_here(*v),
               "CSTORCH_CPU_KERNELS={}: this CPU cannot run that variant of the CPU kernels (it "
               "runs: {})",
               want, names(true));
      return v;
    }
    fail(
        "CSTORCH_CPU_KERNELS={}: no such variant of the CPU kernels in this build (built: {}; "
        "\"generic\" is the last)",
        want, names(false));
  }
  for (const KernelVariant* v : all)
    if (runs_here(*v)) return v;
  return all.back();
}

}  // namespace

std::span<const KernelVariant* const> built_variants() {
  size_t n = 0;
  const KernelVariant* const* a = variant_array(&n);
  return {a, n};
}

bool runs_here(const KernelVariant& v) {
  const std::string_view name(v.name);
#if defined(__x86_64__) && defined(__GNUC__)
  // __builtin_cpu_supports answers for the CPU and for the OS saving the vector registers.
  // The variants' -march levels: x86-64-v3 = AVX2, FMA, BMI1/2 (and F16C, LZCNT, MOVBE, which
  // every CPU with those has); x86-64-v4 adds AVX-512 F, BW, CD, DQ and VL.
  const bool v3 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                  __builtin_cpu_supports("bmi") && __builtin_cpu_supports("bmi2");
  if (name == "avx2") return v3;
  if (name == "avx512")
    return v3 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512vl");
#endif
  // "x86-64", "generic": the baseline; "native": built for this machine.
  return name != "avx2" && name != "avx512";
}

const KernelVariant& kernels() {
  static const KernelVariant* v = choose();
  return *v;
}

}  // namespace cstorch::cpu

namespace cstorch {

const char* cpu_kernels() {
  return cpu::kernels().name;
}

}  // namespace cstorch
