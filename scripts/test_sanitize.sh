#!/usr/bin/env bash
# The sanitizer leg: builds cstorch with AddressSanitizer + UndefinedBehaviorSanitizer (GCC,
# -DCSTORCH_SANITIZE=ON, warnings as errors) in build-asan/ and runs the unit tests and the
# end-to-end tests there. Any sanitizer report fails the CTest entry that produced it: ASan and
# LSan stop the process with an error, UBSan is made fatal.
#
# Kept inside CI's time: the CPU kernels are built at -O2 as everywhere, everything else (the
# rest of the library, the tests and the programs they start) at -Og (GCC builds it 2.5 times
# faster under the sanitizers, and the tests spend their time in the kernels), and the
# unit tests run as CSTORCH_SANITIZE_SHARDS processes (8; GoogleTest sharding) rather than one
# per test, since every instrumented process pays about 1.5 s of sanitizer start-up and exit
# checks; the end-to-end tests as four such processes, so both cores work. A report names its
# test in the shard's output. -DCSTORCH_SANITIZE_SHARDS=0 at configure time
# (CSTORCH_SANITIZE_SHARDS=0 in the environment here) gives one process per test again. Only
# the CPU kernel variant this machine runs is built.
#
# A separate script rather than an option of scripts/test.sh: test.sh is the README's one
# command for the whole suite and stays that; this leg builds another tree with other targets
# and runs a chosen subset, and CI (.ci/run) runs it after test.sh.
#
# Left out, on purpose:
# - alloc_tests: it replaces malloc and operator new for the whole process to count heap
#   allocations, as ASan's runtime does for its own bookkeeping; the two cannot both own the
#   allocator (tests/CMakeLists.txt does not build it when CSTORCH_SANITIZE is on).
# - reference_tests: the PyTorch side runs in python3, which is not instrumented; the cstorch
#   side runs the same kernels the unit tests already run under the sanitizers. Set
#   CSTORCH_SANITIZE_REFERENCE=1 to run them too (about 10 more minutes on 2 cores).
# - clang_format: not a build product; the normal suite checks it.
# - install_test: it installs the library and builds programs outside the tree against it; an
#   instrumented library in an uninstrumented program stops at start ("ASan runtime does not
#   come first in initial library list"). The normal suite runs it.
# - the end-to-end tests that launch MPI ranks (DistributedE2E.*, DeviceE2E.TwoReplicas*,
#   YourOwnData.TwoReplicas*): Open MPI unloads its components (dlclose) at MPI_Finalize, so
#   LeakSanitizer reports ~750 KB of their allocations per rank with no library name left to
#   suppress them by; and they are the slowest tests under the sanitizers (1-2.5 min each on 2
#   cores). The normal suite runs them.
# - the long convergence runs, TransformerFit.{Bert,T5,Transformer}TinyLossFalls and
#   MixedPrecision.FcMnistBf16ReachesTheF32TargetAndF16Trains: 4-6 minutes each here (20 of the
#   leg's 26 minutes of end-to-end tests on a 2-core Zen 1 machine), and each step after the
#   first replays the same program. What they run is instrumented elsewhere in the leg: the
#   models train traced in the unit tests (Transformer.RegisteredModelsTrainTraced,
#   Seq2SeqErrors.TrainsTraced/*), every demo config's data processors run in
#   TextProcessors.DemoConfigsDataSectionsLoad, mixed precision in Autocast.* and GradScaler.*,
#   and cszoo's fit end to end in TransformerFit.Gpt2TinyLossFallsAndGenerates and FcMnist.*.
#   The normal suite runs them.
#
# Usage: scripts/test_sanitize.sh [extra ctest arguments, e.g. -R unit_tests_shard]
# CSTORCH_SANITIZE_GTEST_FILTER chooses tests inside the binaries (a GoogleTest filter, e.g.
# 'Checkpoint*'; it replaces the default one that leaves out the MPI tests).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
scripts/setup.sh
JOBS=$(nproc)
BUILD=${CSTORCH_ASAN_BUILD_DIR:-build-asan}

launcher=()
if command -v ccache > /dev/null; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
fi
# Only the CPU kernel variant this machine runs (the best it can, by dispatch.cpp's test on the
# same CPU flags): the others would be compiled under the sanitizers and never run by default.
cpu_flags=" $(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || true) "
has_flags() {
  local f
  for f in "$@"; do [[ $cpu_flags == *" $f "* ]] || return 1; done
}
variant=""
if [[ $(uname -m) == x86_64 ]]; then
  variant=x86_64
  if has_flags avx2 fma bmi1 bmi2; then
    variant=avx2
    has_flags avx512f avx512bw avx512cd avx512dq avx512vl && variant=avx512
  fi
fi
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCSTORCH_SANITIZE=ON \
  -DCSTORCH_WERROR=ON -DCSTORCH_PYTHON=/usr/bin/python3 -DCSTORCH_CUDA=OFF \
  -DCSTORCH_CPU_VARIANT_SUBSET="$variant" \
  -DCSTORCH_SANITIZE_SHARDS="${CSTORCH_SANITIZE_SHARDS:-8}" "${launcher[@]}"
targets=(unit_tests e2e_tests)
ctest_exclude='^(clang_format|reference_tests|install_test)$'
if [[ ${CSTORCH_SANITIZE_REFERENCE:-0} == 1 ]]; then
  targets+=(reference_tests)
  ctest_exclude='^(clang_format|install_test)$'
fi
# e2e_tests depends on every program it runs (cszoo, the examples, the helpers and plugins).
cmake --build "$BUILD" -j "$JOBS" --target "${targets[@]}"

# halt_on_error: the first report ends the process (non-zero), so the test fails.
# detect_leaks: LeakSanitizer at exit; third-party leaks are suppressed by name in
# tests/lsan.supp, never wholesale. UBSan reports are fatal and carry a stack.
export ASAN_OPTIONS="detect_leaks=1:halt_on_error=1:check_initialization_order=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
export LSAN_OPTIONS="suppressions=$ROOT/tests/lsan.supp:print_suppressions=0${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
# The test binaries read this filter from the environment (it names end-to-end suites only;
# with one process per unit test, their own --gtest_filter arguments take precedence).
long_runs="TransformerFit.BertTinyLossFalls:TransformerFit.T5TinyLossFalls"
long_runs+=":TransformerFit.TransformerTinyLossFalls:MixedPrecision.FcMnistBf16ReachesTheF32TargetAndF16Trains"
export GTEST_FILTER="${CSTORCH_SANITIZE_GTEST_FILTER:--DistributedE2E.*:DeviceE2E.TwoReplicas*:YourOwnData.TwoReplicas*:$long_runs}"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
ctest --test-dir "$BUILD" --output-on-failure -j "$JOBS" --timeout 1800 -E "$ctest_exclude" "$@"
