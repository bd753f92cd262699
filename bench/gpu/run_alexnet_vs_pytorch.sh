#!/usr/bin/env bash
# AlexNet training throughput, downpour's CUDA backend against PyTorch eager fp32, in the same run
# on the same GPU, batch 128 and 256; TF32 on (both defaults) and off. Writes JSON under
# $OUT_DIR (default bench/gpu/out) and prints a Markdown table for RESULTS-gpu.md.
#   bench/gpu/run_alexnet_vs_pytorch.sh [build-dir]     (default build-dir: build)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build}
out=${OUT_DIR:-$root/bench/gpu/out}
iters=${ITERATIONS:-20}
mkdir -p "$out"
cmake --build "$build" --target downpour-bench-gpu downpour-time -j"$(nproc)"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv | tee "$out/nvidia-smi.csv"
for tf32 in on off; do
  "$build/bench/gpu/downpour-bench-gpu" --model "$root/configs/models/alexnet.toml" --batch 128 --batch 256 \
      --iterations "$iters" --tf32 "$tf32" --json "$out/downpour-tf32-$tf32.json" | tee "$out/downpour-tf32-$tf32.txt"
  /usr/bin/python3 "$root/bench/gpu/pytorch_alexnet.py" --batch 128 256 --iterations "$iters" --tf32 "$tf32" \
      --json "$out/pytorch-tf32-$tf32.json" | tee "$out/pytorch-tf32-$tf32.txt"
done
# The engine's own `time` command on the GPU (its step includes the host SGD update).
"$build/client/engine/downpour-time" --model "$root/configs/models/alexnet.toml" --batch 128 --iterations "$iters" \
    --device gpu | tee "$out/downpour-time-gpu-b128.txt"
/usr/bin/python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
print("\n| tf32 | batch | downpour device step img/s | downpour engine step img/s | downpour +host SGD img/s "
      "| PyTorch fwd+bwd img/s | PyTorch fwd+bwd+SGD img/s | engine / PyTorch step |")
print("|---|---|---|---|---|---|---|---|")
for tf32 in ("on", "off"):
    d = json.load(open(f"{out}/downpour-tf32-{tf32}.json"))
    p = json.load(open(f"{out}/pytorch-tf32-{tf32}.json"))
    for db, pb in zip(d["batches"], p["batches"]):
        print(f"| {tf32} | {db['batch']} | {db['device_images_per_s']:.0f} | {db['engine_images_per_s']:.0f} | "
              f"{db['train_images_per_s']:.0f} | {pb['fwd_bwd_images_per_s']:.0f} | {pb['step_images_per_s']:.0f} | "
              f"{db['engine_images_per_s'] / pb['step_images_per_s']:.2f}x |")
PY
