# Sourced after device_env.sh by device_worker.sh and device_all.sh: the pieces both run.
fashion_lmdb() {  # Fashion-MNIST's LMDBs where configs/runs/default.toml reads them
  local data=data-sets/fashion-mnist src=/usr/share/datasets/fashion-mnist part
  for part in train:train t10k:test; do
    [[ -e "$data/${part##*:}_lmdb/data.mdb" ]] && continue
    "$bin/downpour-data" convert-idx --images "$src/${part%%:*}-images-idx3-ubyte.gz" \
        --labels "$src/${part%%:*}-labels-idx1-ubyte.gz" --out "$data/${part##*:}_lmdb" >>"$out/convert.log" 2>&1 || return 1
  done
}

default_jobs() {  # the default job with GPU workers, per device in $DEVICES and k in $KS (outstanding_steps),
                  # its summary and whether its evaluator took the test set as bytes, in $out/default.txt
  local dev k name
  for dev in ${DEVICES:-gpu:0}; do
    for k in ${KS:-1 2}; do
      name=default-${dev%%:*}-k$k
      rm -rf "/tmp/runs/$name"
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
}

worker_step_bench() {  # issue 45's ratio: AlexNet's worker step over PyTorch's, in $out/ratios.txt
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
}
