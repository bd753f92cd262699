#!/usr/bin/env bash
# On a GPU machine, from the repository root, with the folder bench/gpu/pack_for_device.sh made
# (default .devcarry): the GPU test binaries (agreement with oneDNN, gradient checks, Fashion-MNIST
# training), then AlexNet training throughput, downpour against PyTorch eager fp32 in the same run
# (TF32 on and off, batch 128 and 256). Logs and JSON go to $OUT (default bench/gpu/out).
#   bench/gpu/device_check.sh [carry-dir]
iters=${ITERATIONS:-20}
source "$(dirname "$0")/device_env.sh" "${1:-}"
run gradcheck 120 "$bin/gpu_gradcheck_test" --gtest_brief=1
run agreement 180 "$bin/gpu_agreement_test" --gtest_brief=1
run training 150 "$bin/gpu_training_test"
for tf32 in on off; do
  run "downpour-tf32-$tf32" 90 "$bin/downpour-bench-gpu" --model configs/models/alexnet.toml \
      --batch 128 --batch 256 --iterations "$iters" --tf32 "$tf32" --json "$out/downpour-tf32-$tf32.json"
  run "pytorch-tf32-$tf32" 90 env -u LD_LIBRARY_PATH python3 bench/gpu/pytorch_alexnet.py --batch 128 256 --iterations "$iters" \
      --tf32 "$tf32" --json "$out/pytorch-tf32-$tf32.json"
done
run downpour-time-b128 60 "$bin/downpour-time" --model configs/models/alexnet.toml --batch 128 \
    --iterations "$iters" --device gpu
python3 - "$out" <<'PY'
import json, os, sys
out = sys.argv[1]
print("\n| tf32 | batch | downpour device step img/s | downpour engine step img/s | downpour +host SGD img/s "
      "| PyTorch fwd+bwd img/s | PyTorch fwd+bwd+SGD img/s | engine / PyTorch step |")
print("|---|---|---|---|---|---|---|---|")
for tf32 in ("on", "off"):
    try:
        d = json.load(open(f"{out}/downpour-tf32-{tf32}.json"))
        p = json.load(open(f"{out}/pytorch-tf32-{tf32}.json"))
    except (OSError, ValueError) as e:
        print(f"| {tf32} | missing: {e} |"); continue
    for db, pb in zip(d["batches"], p["batches"]):
        print(f"| {tf32} | {db['batch']} | {db['device_images_per_s']:.0f} | {db['engine_images_per_s']:.0f} | "
              f"{db['train_images_per_s']:.0f} | {pb['fwd_bwd_images_per_s']:.0f} | {pb['step_images_per_s']:.0f} | "
              f"{db['engine_images_per_s'] / pb['step_images_per_s']:.2f}x |")
PY
cat "$out/summary.txt"
