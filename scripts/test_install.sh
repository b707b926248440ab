#!/usr/bin/env bash
# Checks that cstorch works as a library, as a program outside the tree uses it:
#   1. builds the libraries and cszoo (in `build`, reused when configured; CSTORCH_BUILD_DIR
#      names another) and installs them to a temporary prefix with `cmake --install`;
#   2. configures and builds examples/external against that prefix with find_package(cstorch),
#      runs its AdamW MLP (which fails unless its loss falls) and trains its plugin model with
#      the installed `cszoo fit ... --plugin_paths` (the loss must fall here too);
#   3. compiles a small program with `pkg-config --cflags --libs cstorch` (and one with
#      cstorch-modelzoo) and runs them;
#   4. configures an outer project that adds this tree with add_subdirectory (configure only:
#      a full build would rebuild the library).
# CSTORCH_INSTALL_TEST_SKIP_BUILD=1 installs what BUILD holds without building (the CTest entry
# `install_test`, which runs after the build).
# Prints "test_install: OK" at the end; any failure stops it with a non-zero status.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BUILD="${CSTORCH_BUILD_DIR:-$ROOT/build}"
JOBS="${JOBS:-$(nproc)}"
VERSION=$(sed -n 's/^project(cstorch VERSION \([0-9.]*\).*/\1/p' "$ROOT/CMakeLists.txt")
LAUNCHER=()
if command -v ccache >/dev/null; then
  LAUNCHER=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
fi

WORK=$(mktemp -d /tmp/cstorch-install-test.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
PREFIX="$WORK/prefix"
step() { printf '\n== test_install: %s\n' "$*"; }
fail() { printf 'test_install: FAIL: %s\n' "$*" >&2; exit 1; }

if [[ "${CSTORCH_INSTALL_TEST_SKIP_BUILD:-0}" != 1 ]]; then
  step "build the libraries and cszoo in $BUILD"
  if [[ ! -f "$BUILD/CMakeCache.txt" ]]; then
    cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCSTORCH_WERROR=ON \
      -DCSTORCH_PYTHON=/usr/bin/python3 "${LAUNCHER[@]}"
  fi
  cmake --build "$BUILD" -j "$JOBS" --target cstorch modelzoo cszoo
fi

step "install to $PREFIX"
cmake --install "$BUILD" --prefix "$PREFIX" >/dev/null
for f in include/cstorch/cstorch.h include/modelzoo/trainer.h include/modelzoo/models/gpt2/gpt2.h \
  include/modelzoo/models/bert/bert.h lib/libcstorch.so lib/libmodelzoo.so bin/cszoo \
  lib/cmake/cstorch/cstorchConfig.cmake lib/cmake/cstorch/cstorchConfigVersion.cmake \
  lib/pkgconfig/cstorch.pc lib/pkgconfig/cstorch-modelzoo.pc; do
  [[ -e "$PREFIX/$f" ]] || fail "the install has no $f"
done
if grep -rl '#include "\(src\|core\|runtime\|backend\|ops\|ir\)/' "$PREFIX/include" >/dev/null; then
  fail "an installed header includes a private src/ header"
fi
# The installed cszoo runs from its own RPATH (no LD_LIBRARY_PATH).
"$PREFIX/bin/cszoo" --help >/dev/null || fail "the installed cszoo does not run"
# The data tools the guides run are installed where the build has them, and run too.
for t in make_text_data make_digits; do
  if [[ -x "$BUILD/$t" ]]; then
    [[ -x "$PREFIX/bin/$t" ]] || fail "the install has no bin/$t (the build has it)"
    "$PREFIX/bin/$t" --help >/dev/null || fail "the installed $t does not run"
  fi
done

step "examples/external with find_package(cstorch $VERSION)"
cmake -S "$ROOT/examples/external" -B "$WORK/external" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$PREFIX" "${LAUNCHER[@]}" >/dev/null
cmake --build "$WORK/external" -j "$JOBS"
"$WORK/external/mlp_adamw" || fail "mlp_adamw (exit $?)"

step "cszoo fit with the plugin model"
(cd "$WORK" && "$PREFIX/bin/cszoo" fit "$ROOT/examples/external/regression.yaml" \
  --plugin_paths "$WORK/external/regression_plugin.so" -o "$WORK/model_dir")
python3 - "$WORK/model_dir/metrics.jsonl" <<'PY' || fail "the plugin model's loss did not fall"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
first, last = rows[0]["loss"], rows[-1]["loss"]
print(f"plugin model: loss {first:.4f} at step {rows[0]['step']} -> {last:.4f} at step {rows[-1]['step']}")
sys.exit(0 if len(rows) >= 10 and last < 0.5 * first else 1)
PY

step "the same through the package's imported cstorch::cszoo (target fit_plugin)"
cmake --build "$WORK/external" --target fit_plugin >/dev/null
[[ -s "$WORK/external/model_dir/metrics.jsonl" ]] || fail "fit_plugin wrote no metrics"

step "pkg-config"
export PKG_CONFIG_PATH="$PREFIX/lib/pkgconfig"
[[ "$(pkg-config --modversion cstorch)" == "$VERSION" ]] || fail "cstorch.pc version is not $VERSION"
cat >"$WORK/tiny.cpp" <<'CPP'
#include <cstorch/cstorch.h>
int main() {
  auto t = cstorch::ones({2, 3}) * 2.0;
  fmt::print("cstorch {} sum {}\n", cstorch::version(), t.sum().item<float>());
  return t.sum().item<float>() == 12.0f ? 0 : 1;
}
CPP
# shellcheck disable=SC2046  # pkg-config's output is a list of flags
g++ -O1 "$WORK/tiny.cpp" -o "$WORK/tiny" $(pkg-config --cflags --libs cstorch) \
  -Wl,-rpath,"$(pkg-config --variable=libdir cstorch)"
"$WORK/tiny" | tee "$WORK/tiny.out"
grep -q "cstorch $VERSION sum 12" "$WORK/tiny.out" || fail "the pkg-config program printed the wrong thing"
cat >"$WORK/tiny_zoo.cpp" <<'CPP'
#include <modelzoo/model.h>
int main() {
  bool ok = modelzoo::models().contains("gpt2") && modelzoo::models().contains("fc_mnist");
  fmt::print("models: {}\n", fmt::join(modelzoo::models().names(), " "));
  return ok ? 0 : 1;
}
CPP
# shellcheck disable=SC2046
g++ -O1 "$WORK/tiny_zoo.cpp" -o "$WORK/tiny_zoo" $(pkg-config --cflags --libs cstorch-modelzoo) \
  -Wl,-rpath,"$(pkg-config --variable=libdir cstorch)"
"$WORK/tiny_zoo" || fail "the pkg-config Model Zoo program"

step "add_subdirectory from an outer project (configure only)"
mkdir -p "$WORK/outer"
cat >"$WORK/outer/CMakeLists.txt" <<CMAKE
cmake_minimum_required(VERSION 3.25)
project(outer LANGUAGES C CXX)
add_subdirectory("$ROOT" cstorch)
add_executable(outer_app app.cpp)
target_link_libraries(outer_app PRIVATE cstorch::cstorch cstorch::modelzoo)
foreach(t unit_tests e2e_tests bench_gemm fc_mnist)
  if(TARGET \${t})
    message(FATAL_ERROR "add_subdirectory built \${t}: tests, benchmarks and examples are for the top-level build")
  endif()
endforeach()
CMAKE
echo 'int main() { return 0; }' >"$WORK/outer/app.cpp"
cmake -S "$WORK/outer" -B "$WORK/outer/build" -G Ninja >/dev/null

printf '\ntest_install: OK\n'
