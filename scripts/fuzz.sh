#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/, clang with ASan and UBSan) and runs each for a bounded
# time. Exits non-zero on any finding: a crash, a sanitizer report, a leak, a hang (-timeout), an
# input needing too much memory (-rss_limit_mb) or an unexpected exception type; the input is
# saved to build-fuzz/findings/<target>/. Prints executions, exec/s and coverage per target.
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]      (default: 20 s, every target)
#
# Targets: config pt safetensors hdf5 idx bpe wordpiece csv arrays. Reproduce a finding with
#   build-fuzz/fuzz/fuzz_<target> build-fuzz/findings/<target>/<file>
# Environment: FUZZ_JOBS (build parallelism, default 2), FUZZ_ARGS (extra libFuzzer flags).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
ALL_TARGETS=(config pt safetensors hdf5 idx bpe wordpiece csv arrays)

SECONDS_PER_TARGET=${1:-20}
shift || true
if ! [[ $SECONDS_PER_TARGET =~ ^[0-9]+$ ]] || ((SECONDS_PER_TARGET < 1)); then
  echo "usage: scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]" >&2
  exit 2
fi
TARGETS=("$@")
((${#TARGETS[@]})) || TARGETS=("${ALL_TARGETS[@]}")
for t in "${TARGETS[@]}"; do
  if [[ " ${ALL_TARGETS[*]} " != *" $t "* ]]; then
    echo "fuzz: unknown target '$t' (targets: ${ALL_TARGETS[*]})" >&2
    exit 2
  fi
done

# The tools come from scripts/setup.sh (clang, libclang-rt-dev for libFuzzer and the sanitizer
# runtimes); nothing is installed here.
for tool in clang clang++ cmake ninja; do
  command -v "$tool" >/dev/null || {
    echo "fuzz: '$tool' not found; run scripts/setup.sh" >&2
    exit 1
  }
done
CLANG_RT=$(clang++ -print-resource-dir)/lib/linux/libclang_rt.fuzzer-x86_64.a
if [[ $(uname -m) == x86_64 && ! -f $CLANG_RT ]]; then
  echo "fuzz: libFuzzer ($CLANG_RT) not found; run scripts/setup.sh (libclang-rt-dev)" >&2
  exit 1
fi

LAUNCHER=()
if command -v ccache >/dev/null; then
  LAUNCHER=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
fi
BUILD=build-fuzz
# The targets run readers, not kernels: the CPU kernels in their fallback variant only.
CC=clang CXX=clang++ cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCSTORCH_WERROR=ON -DCSTORCH_FUZZ=ON -DCSTORCH_CUDA=OFF -DCSTORCH_BUILD_TESTS=OFF \
  -DCSTORCH_CPU_VARIANT_SUBSET=x86_64 \
  -DCSTORCH_BUILD_BENCH=OFF "${LAUNCHER[@]}" >/dev/null
cmake --build "$BUILD" -j "${FUZZ_JOBS:-2}" --target make_corpus \
  $(printf 'fuzz_%s ' "${TARGETS[@]}")

# The seed corpus is rewritten on every run (it follows the writers); what the fuzzer learns
# goes to a separate working corpus that later runs start from too.
rm -rf "$BUILD/corpus"
"$BUILD/fuzz/make_corpus" "$BUILD/corpus"

# Sanitizer settings: stop at the first error with a stack; leaks are checked (libhdf5's own
# are suppressed, see fuzz/lsan.supp). OpenBLAS and the OpenMP runtime stay single-threaded.
export ASAN_OPTIONS="abort_on_error=1:detect_leaks=1:symbolize=1:detect_stack_use_after_return=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export LSAN_OPTIONS="suppressions=$ROOT/fuzz/lsan.supp:print_suppressions=0"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1

failed=()
summary=()
for t in "${TARGETS[@]}"; do
  findings="$BUILD/findings/$t"
  work="$BUILD/corpus-work/$t"
  log="$BUILD/fuzz-logs/$t.log"
  # The findings folder holds this run's findings only (libFuzzer's exit status says whether
  # there are any); the working corpus is kept.
  rm -rf "$findings"
  mkdir -p "$findings" "$work" "$(dirname "$log")"
  echo "fuzz: $t for ${SECONDS_PER_TARGET}s"
  # -rss_limit_mb also sets the per-allocation limit: a reader that believes a size field and
  # allocates gigabytes is an out-of-memory finding. -timeout: one input taking more than 10 s
  # is a hang. The dictionary, when there is one, holds the format's keywords.
  dict=()
  [[ -f fuzz/dict/$t.dict ]] && dict=(-dict="fuzz/dict/$t.dict")
  status=0
  # shellcheck disable=SC2086
  "$BUILD/fuzz/fuzz_$t" -max_total_time="$SECONDS_PER_TARGET" -rss_limit_mb=2048 -timeout=10 \
    -print_final_stats=1 -artifact_prefix="$findings/" "${dict[@]}" ${FUZZ_ARGS:-} \
    "$work" "$BUILD/corpus/$t" >"$log" 2>&1 || status=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
  ft=$(grep -o 'ft: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
  corp=$(grep -o 'corp: [0-9]*/[0-9]*[a-zA-Z]*' "$log" | tail -1 | cut -d' ' -f2)
  line=$(printf '%-12s execs %-9s exec/s %-6s cov %-6s ft %-6s corpus %s' "$t" "${execs:-?}" \
    "${rate:-?}" "${cov:-?}" "${ft:-?}" "${corp:-?}")
  if ((status != 0)); then
    failed+=("$t")
    line+="  FINDING (exit $status; inputs in $findings, log $log)"
    # The report: the sanitizer's or libFuzzer's summary and the first frames.
    grep -E -m1 -A25 '^==[0-9]+==ERROR|runtime error|^fuzz: |ALARM|out-of-memory|deadly signal' \
      "$log" >&2 || tail -40 "$log" >&2
  fi
  echo "$line"
  summary+=("$line")
done

echo
echo "fuzz summary (${SECONDS_PER_TARGET}s per target):"
printf '  %s\n' "${summary[@]}"
if ((${#failed[@]})); then
  echo "fuzz: findings in: ${failed[*]}" >&2
  exit 1
fi
echo "fuzz: no findings"
