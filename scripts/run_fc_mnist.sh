#!/usr/bin/env bash
# Sets up, builds, and trains FC-MNIST with the Model Zoo Trainer (`cszoo fit
# configs/fc_mnist.yaml`) on synthetic digits (generated into data/mnist on the first run):
# progress, periodic test accuracy, checkpoints, TensorBoard events and a loss/LR plot in
# model_dir/fc_mnist. Running it again resumes from the latest checkpoint. Extra arguments go
# to cszoo (e.g. -o OTHER_MODEL_DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build -j "$(nproc)" --target cszoo
./build/cszoo fit configs/fc_mnist.yaml "$@"
