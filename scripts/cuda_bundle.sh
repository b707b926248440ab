#!/usr/bin/env bash
# Packs a CUDA build's GPU test programs, with the shared libraries they load, for a GPU machine
# that has a CUDA driver and cuBLASLt but not this project's Debian libraries (HDF5, yaml-cpp,
# OpenBLAS, ...). Builds BUILD_DIR (default build-gpu: CUDA from CUDACXX or /usr/local/cuda,
# CUDA_ARCHS default 90, -DCSTORCH_NATIVE=OFF so the programs run on any x86-64 host), then writes
# OUT (default .dev/bundle.tar.xz) holding bin/ (cuda_tests, reference_tests, cszoo,
# bench_fc_mnist, bench_transformer) and lib/ (every library they load except glibc's, the C++ runtime's and
# CUDA's, which the GPU machine has). scripts/cuda_bundle_check.sh runs them there.
# The toolkit's major version must match the GPU machine's cuBLASLt (libcublasLt.so.N).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build-gpu}
OUT=${OUT:-.dev/bundle.tar.xz}
NVCC=${CUDACXX:-/usr/local/cuda/bin/nvcc}
source scripts/cuda_env.sh
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCSTORCH_NATIVE=OFF \
  -DCSTORCH_BUILD_BENCH=ON -DCSTORCH_BUILD_EXAMPLES=OFF -DCSTORCH_PYTHON=/usr/bin/python3 \
  "-DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCHS:-90}" "${CUDA_CMAKE_ARGS[@]}" > /dev/null
cmake --build "$BUILD_DIR" -j "$(nproc)" --target cuda_tests reference_tests cszoo bench_fc_mnist bench_transformer
stage=$(mktemp -d)
mkdir -p "$stage/bin" "$stage/lib" "$(dirname "$OUT")"
for b in tests/cuda_tests tests/reference_tests cszoo bench/bench_fc_mnist bench/bench_transformer; do
  cp "$BUILD_DIR/$b" "$stage/bin/" && strip "$stage/bin/$(basename "$b")"
done
for b in "$stage"/bin/*; do ldd "$b" | awk '/=> \//{print $3}'; done | sort -u |
  grep -vE '/(libc|libm|libpthread|libdl|librt|libresolv|libstdc\+\+|libgcc_s|ld-linux[^/]*|libcuda|libcublas[^/]*|libcudart[^/]*)\.so' |
  while read -r l; do cp -L "$l" "$stage/lib/"; done
tar cJf "$OUT" -C "$stage" bin lib
rm -rf "$stage"
echo "cuda_bundle: $OUT ($(du -h "$OUT" | cut -f1))"
