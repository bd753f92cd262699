#!/usr/bin/env bash
# Issue 45's device checks in one call, on a GPU machine (see device_env.sh), most important first:
#  1. the GPU tests that run the net's transfers (agreement with oneDNN, including training and
#     chunked uploads; Fashion-MNIST training), now that gradient downloads are not waited for
#     layer by layer;
#  2. AlexNet S = 2, W = 2 GPU workers at an emulated 10 Gbit/s, worker.outstanding_steps 1 and 2,
#     fp32 and factors + fp16 pulls (device_compression.sh with JOBS=bench/gpu/worker_step_jobs.txt;
#     its ratios.txt has each job over the fp32 k = 1 jobs);
#  3. the default job with both workers on the GPU, outstanding_steps 1 and 2, against 2026-11-26's
#     14,797 img/s (that was fmnist_small; today's default is fmnist_fast), and whether its
#     evaluator took the test set as bytes;
#  4. AlexNet's worker step against PyTorch's fwd + bwd + SGD, TF32 on, batch 128: with float input,
#     and with byte input (uint8 crops normalised on the GPU, each next batch uploaded a step ahead).
# Pack first, here: EXTRA_BINS="server/downpour-launch server/downpour-server server/downpour-coordinator
#   client/worker/downpour-worker client/worker/downpour-evaluator data/downpour-data bench/ps/downpour-bench-ps"
#   bench/gpu/pack_for_device.sh build .devcarry
# There:  bench/gpu/device_worker.sh .devcarry      (about 8 minutes; STEPS, BUDGET_S as device_compression.sh)
# A dry run here (CPU workers; checks the script, not the speed): OUT=/tmp/devwk UNPACKED=/tmp/carry-wk
#   DEVICE=cpu DEVICES=cpu BATCH=8 STEPS=4 DEFAULT_STEPS=100 SKIP_BENCH=1 bench/gpu/device_worker.sh .devcarry
# Everything lands in $OUT (default bench/gpu/out): summary.txt, rows.tsv, ratios.txt, default.txt.
here=$(cd "$(dirname "$0")" && pwd)
source "$here/device_env.sh" "${1:-}"
run agreement 180 "$bin/gpu_agreement_test" --gtest_brief=1
run training 150 "$bin/gpu_training_test"
JOBS=$here/worker_step_jobs.txt PROFILE=0 STEPS=${STEPS:-30} BUDGET_S=${BUDGET_S:-330} \
  OUT=$out UNPACKED=${UNPACKED:-/tmp/downpour-carry} bash "$here/device_compression.sh" "$carry"
data=data-sets/fashion-mnist
src=/usr/share/datasets/fashion-mnist
for part in train:train t10k:test; do
  [[ -e "$data/${part##*:}_lmdb/data.mdb" ]] && continue
  "$bin/downpour-data" convert-idx --images "$src/${part%%:*}-images-idx3-ubyte.gz" \
      --labels "$src/${part%%:*}-labels-idx1-ubyte.gz" --out "$data/${part##*:}_lmdb" >>"$out/convert.log" 2>&1 || exit 1
done
for dev in ${DEVICES:-gpu:0}; do
  for k in 1 2; do
    name=default-${dev%%:*}-k$k
    run "$name" 150 "$bin/downpour-launch" --config configs/runs/default.toml --run-dir "/tmp/runs/$name" \
        --bin-dir "$bin" --set "worker.device=$dev" --set "worker.outstanding_steps=$k" \
        ${DEFAULT_STEPS:+--set worker.steps=$DEFAULT_STEPS}
    python3 tools/downpour-summarize "/tmp/runs/$name" >>"$out/default.txt" 2>&1
    # Whether the evaluator's GPU net took the test set as bytes (its eval records' byte_input).
    python3 - "/tmp/runs/$name/metrics/evaluator.jsonl" "$name" <<'PY' >>"$out/default.txt" 2>&1
import json, sys
try:
    evals = [r for r in map(json.loads, open(sys.argv[1])) if r.get("event") == "eval"]
except (OSError, ValueError) as e:
    sys.exit(f"{sys.argv[2]}: evaluator records missing ({e})")
took = sum(1 for r in evals if r.get("byte_input"))
print(f"{sys.argv[2]}: {took} of {len(evals)} evaluations took the test set as bytes")
PY
  done
done
if [[ ${SKIP_BENCH:-0} != 1 ]]; then
  run downpour-bench 90 "$bin/downpour-bench-gpu" --model configs/models/alexnet.toml --batch 128 --iterations 20 \
      --tf32 on --json "$out/downpour-bench.json"
  run pytorch-bench 90 env -u LD_LIBRARY_PATH python3 bench/gpu/pytorch_alexnet.py --batch 128 --iterations 20 \
      --tf32 on --json "$out/pytorch-bench.json"
  # The issue's ratio: the worker's step (page-locked input, per-layer uploads, downloads as they
  # land) over PyTorch's fwd + bwd + SGD, with and without its input upload counted.
  python3 - "$out" <<'PY' | tee -a "$out/ratios.txt"
import json, sys
out = sys.argv[1]
try:
    d = json.load(open(f"{out}/downpour-bench.json"))["batches"][0]
    p = json.load(open(f"{out}/pytorch-bench.json"))["batches"][0]
except (OSError, ValueError, KeyError, IndexError) as e:
    sys.exit(f"bench: missing ({e})")
w = d["worker_images_per_s"]
wb = d["worker_bytes_images_per_s"]
print(f"AlexNet b{d['batch']} TF32: worker step {w:.0f} img/s (engine step {d['engine_images_per_s']:.0f}, "
      f"device step {d['device_images_per_s']:.0f}); PyTorch fwd+bwd+SGD {p['step_images_per_s']:.0f}, "
      f"with input upload {p['upload_step_images_per_s']:.0f}: worker / PyTorch {w / p['step_images_per_s']:.2f}x, "
      f"{w / p['upload_step_images_per_s']:.2f}x counting both uploads")
if wb:
    print(f"AlexNet b{d['batch']} TF32, byte input: worker step {wb:.0f} img/s: worker / PyTorch "
          f"{wb / p['step_images_per_s']:.2f}x, {wb / p['upload_step_images_per_s']:.2f}x counting both uploads; "
          f"bytes / floats {wb / w:.2f}x")
else:
    print("byte input: not measured (the net took none)")
PY
fi
cat "$out/summary.txt" "$out/default.txt" "$out/ratios.txt" 2>/dev/null
