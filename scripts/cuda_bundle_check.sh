#!/usr/bin/env bash
# Runs on a GPU machine, from a checkout of this repository, with the bundle that
# scripts/cuda_bundle.sh made: the GPU tests (cuda_tests, then under compute-sanitizer's
# memcheck), the op-table reference rows on GPU:0, FC-MNIST with `cszoo fit --target_device GPU`
# and its checkpoint validated on the CPU, a short fit of each language model's demo config on
# the GPU, and, when python3 has torch and numpy, bench_fc_mnist on the GPU against PyTorch eager
# (bench/fc_mnist_peer.py) and GPT-2 124M (bf16, T=1024) against PyTorch eager and torch.compile
# (bench/transformer_peer.py); then a profile of the GPT-2 step with every kernel timed on the
# GPU's clock, and Nsight Compute's counters for the attention kernels where ncu exists. Logs go
# to LOGS (default
# /tmp/cuda_check). Usage: scripts/cuda_bundle_check.sh [BUNDLE]  (default .dev/bundle.tar.xz)
set -u
cd "$(dirname "$0")/.."
BUNDLE=${1:-.dev/bundle.tar.xz}
LOGS=${LOGS:-/tmp/cuda_check}
mkdir -p "$LOGS"
t0=$(date +%s)
elapsed() { echo "$(($(date +%s) - t0)) s"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
unpacked=$(mktemp -d)
tar xf "$BUNDLE" -C "$unpacked"
lt=$(find / -xdev -name 'libcublasLt.so.*' 2>/dev/null | head -1)
echo "cuBLASLt: $lt"
export LD_LIBRARY_PATH=$unpacked/lib:$(dirname "$lt"):${LD_LIBRARY_PATH:-}
B=$unpacked/bin
echo "=== cuda_tests"
timeout 300 "$B/cuda_tests" > "$LOGS/cuda_tests.log" 2>&1
grep -E '^\[ *(OK|FAILED|PASSED) ' "$LOGS/cuda_tests.log"
# CUDA_CHECK_QUICK=1 leaves out the memcheck pass (minutes), the torch.compile peer (its first
# step compiles for about 40 s) and ncu: for runs that changed no kernel.
QUICK=${CUDA_CHECK_QUICK:-0}
if [[ "$QUICK" != 1 ]]; then
  echo "=== memcheck ($(elapsed))"
  timeout 300 compute-sanitizer --tool memcheck "$B/cuda_tests" --gtest_filter='CudaOps.*:CudaDevice.*:CudaTraining.Optimizer*' > "$LOGS/memcheck.log" 2>&1
  grep 'ERROR SUMMARY' "$LOGS/memcheck.log"
fi
echo "=== reference rows on GPU:0 ($(elapsed))"
timeout 300 "$B/reference_tests" --gtest_filter='Ops/OpOnDevice.*GPU0*' > "$LOGS/reference_gpu.log" 2>&1
grep -E '^\[reference\]|^\[  (PASSED|FAILED)' "$LOGS/reference_gpu.log"
echo "=== cszoo fit on GPU:0, validate on the CPU ($(elapsed))"
timeout 120 "$B/cszoo" fit configs/fc_mnist.yaml --target_device GPU --model_dir "$LOGS/fc_gpu" --max_steps 300 > "$LOGS/cszoo_gpu.log" 2>&1
grep -E 'validation at|fit completed|error' "$LOGS/cszoo_gpu.log"
timeout 120 "$B/cszoo" validate configs/fc_mnist.yaml --target_device CPU --checkpoint_path "$LOGS/fc_gpu/checkpoint_300.mdl" --model_dir "$LOGS/fc_cpu" 2>&1 | grep -E 'validation at|error'
echo "=== the language models' demo configs on GPU:0 ($(elapsed))"
for c in gpt2_tiny bert_tiny transformer_tiny t5_tiny; do
  timeout 120 "$B/cszoo" fit "configs/$c.yaml" --target_device GPU --model_dir "$LOGS/$c" --max_steps 50 > "$LOGS/$c.log" 2>&1
  echo "$c: rc $? $(grep -E 'fit completed|error' "$LOGS/$c.log" | tail -1)"
done
if python3 -c 'import torch, numpy' 2>/dev/null; then
  echo "=== bench fc_mnist on the GPU: cstorch vs PyTorch eager ($(elapsed))"
  python3 bench/fc_data.py --out "$LOGS/fc/d" --batch 128 --batches 8
  for h in 256,256 1024,1024; do
    timeout 120 "$B/bench_fc_mnist" --device GPU --data "$LOGS/fc/d" --hidden $h --modes traced,eager --steps 200 --repeats 5 | tee -a "$LOGS/bench.log"
    timeout 120 python3 bench/fc_mnist_peer.py --device cuda --data "$LOGS/fc/d" --hidden $h --modes eager --steps 200 --repeats 5 | tee -a "$LOGS/bench.log"
  done | python3 -c 'import json, sys
for l in sys.stdin:
    j = json.loads(l)
    print(j.get("side", "cstorch"), j["mode"], j["hidden"], "%.1f us/step" % (1e6 * j["sec_per_step"]))'
  echo "=== GPT-2 124M on the GPU, B=8, T=1024, bf16: cstorch vs PyTorch eager / torch.compile ($(elapsed))"
  G="--model gpt2 --layers 12 --width 768 --heads 12 --seq 1024 --vocab 50304 --batch 8 --precision bf16 --steps 10 --repeats 3 --warmup 3"
  timeout 300 "$B/bench_transformer" $G --device GPU | tee -a "$LOGS/bench.log"
  timeout 300 python3 bench/transformer_peer.py $G --device cuda | tee -a "$LOGS/bench.log"
  [[ "$QUICK" == 1 ]] || timeout 300 python3 bench/transformer_peer.py $G --device cuda --compile | tee -a "$LOGS/bench.log"
fi
# Where the GPU step goes: every kernel timed on the device's clock (cudaEvents, no waits between
# kernels; the profile runs kernel by kernel, not as a CUDA graph). CUDA_CHECK_PROFILE=nodes
# lists every kernel call in the log as well.
echo "=== GPT-2 124M step profile on the GPU's clock ($(elapsed))"
P="--model gpt2 --layers 12 --width 768 --heads 12 --seq 1024 --vocab 50304 --batch 8 --precision bf16"
CSTORCH_PROFILE=${CUDA_CHECK_PROFILE:-1} timeout 120 "$B/bench_transformer" $P --steps 3 --repeats 1 --warmup 1 --device GPU > "$LOGS/profile.log" 2>&1
grep -A 30 "cstorch profile" "$LOGS/profile.log" | head -40
# The attention kernels' hardware counters (the forward of 12 layers, then the last layer's
# backward), when Nsight Compute is there.
if [[ "$QUICK" != 1 ]] && command -v ncu > /dev/null; then
  echo "=== ncu: attention kernels ($(elapsed))"
  CSTORCH_CUDA_GRAPHS=0 timeout 240 ncu --clock-control none -k regex:attention --launch-count 15 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
    "$B/bench_transformer" $P --steps 1 --repeats 1 --warmup 0 --device GPU > "$LOGS/ncu_attention.log" 2>&1
  grep -E '^  attention_|Duration|Compute \(SM\) Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Shared Memory Configuration Size|Dynamic Shared' "$LOGS/ncu_attention.log" | head -120
fi
rm -rf "$unpacked"
echo "=== done ($(elapsed)); logs in $LOGS"
