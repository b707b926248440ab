#!/usr/bin/env bash
# Sets up, builds, and trains FC-MNIST on synthetic digits (generated into data/mnist on the
# first run), printing the loss and the final test accuracy. Extra arguments go to the example.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build -j "$(nproc)" --target fc_mnist
./build/fc_mnist --data-dir data/mnist "$@"
