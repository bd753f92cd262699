#!/usr/bin/env bash
# On a GPU machine, from the repository root, with the folder bench/gpu/pack_for_device.sh made
# (default .devcarry): the GPU test binaries (agreement with oneDNN, gradient checks, Fashion-MNIST
# training), then AlexNet training throughput, downpour against PyTorch eager fp32 in the same run
# (TF32 on and off, batch 128 and 256). Logs and JSON go to $OUT (default bench/gpu/out).
#   bench/gpu/device_check.sh [carry-dir]
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
carry=${1:-$root/.devcarry}
out=${OUT:-$root/bench/gpu/out}
iters=${ITERATIONS:-20}
mkdir -p "$out"
cd "$root"
# Libraries: ours from the carry folder; CUDA's from the machine. PyTorch runs without this path:
# it brings its own cuDNN and refuses an older one found first (the H200 image's system cuDNN is 9.14).
[[ -f "$carry/lib/libdnnl.so.2" ]] || xz -dk "$carry/lib/libdnnl.so.2.xz"
libdirs="$carry/lib"
for name in libcudnn.so.9 libcublas.so.13 libcublasLt.so.13 libcudart.so.13; do
  d=$(find /usr/local/cuda*/ /usr/lib /opt /usr/local/lib -name "$name" -print -quit 2>/dev/null | xargs -r dirname)
  [[ -n "$d" ]] && libdirs="$libdirs:$d" || echo "device_check: $name not found" | tee -a "$out/env.txt"
done
export LD_LIBRARY_PATH="$libdirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# The test binaries read configs at the build machine's source path and the data at Debian's path.
src=$(cat "$carry/source_dir")
[[ -e "$src" ]] || { mkdir -p "$(dirname "$src")" && ln -s "$root" "$src"; }
mkdir -p /usr/share/datasets/fashion-mnist && cp --update=none "$carry"/fashion-mnist/*.gz /usr/share/datasets/fashion-mnist/
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv; nproc
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"; ldd "$carry/bin/gpu_training_test" | grep -E 'cud|cublas|dnnl|not found'
  env -u LD_LIBRARY_PATH python3 -c 'import torch; print("torch", torch.__version__, torch.version.cuda, torch.backends.cudnn.version())'
} 2>&1 | tee -a "$out/env.txt"
run() {  # run NAME SECONDS CMD...: one log per step, a PASS/FAIL line in the summary
  local name=$1 t=$2; shift 2
  local t0=$SECONDS
  timeout "$t" "$@" >"$out/$name.log" 2>&1; local rc=$?
  echo "$name rc=$rc $((SECONDS - t0))s" | tee -a "$out/summary.txt"
  tail -n 3 "$out/$name.log"
}
run gradcheck 120 "$carry/bin/gpu_gradcheck_test" --gtest_brief=1
run agreement 180 "$carry/bin/gpu_agreement_test" --gtest_brief=1
run training 150 "$carry/bin/gpu_training_test"
for tf32 in on off; do
  run "downpour-tf32-$tf32" 90 "$carry/bin/downpour-bench-gpu" --model configs/models/alexnet.toml \
      --batch 128 --batch 256 --iterations "$iters" --tf32 "$tf32" --json "$out/downpour-tf32-$tf32.json"
  run "pytorch-tf32-$tf32" 90 env -u LD_LIBRARY_PATH python3 bench/gpu/pytorch_alexnet.py --batch 128 256 --iterations "$iters" \
      --tf32 "$tf32" --json "$out/pytorch-tf32-$tf32.json"
done
run downpour-time-b128 60 "$carry/bin/downpour-time" --model configs/models/alexnet.toml --batch 128 \
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
