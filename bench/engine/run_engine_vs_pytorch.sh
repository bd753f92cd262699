#!/usr/bin/env bash
# The CPU engine against PyTorch CPU, in one run, same thread count: AlexNet (batch 64) and
# fmnist_small (batch 256) full training steps (forward, backward, SGD update) in images/s,
# plus the machine ceiling (a 4096³ oneDNN sgemm, GFLOP/s) and AlexNet's achieved GFLOP/s
# (4.35 GFLOP per training image) as a fraction of it.
#
# The machine is shared, so every measurement is repeated ROUNDS times, interleaved
# (sgemm, engine, PyTorch, engine, PyTorch per round) so both sides see the same background
# load; the table reports the best round (least disturbed) and the median.
#
# usage: bench/engine/run_engine_vs_pytorch.sh [BUILD_DIR] [ROUNDS] [THREADS]
#   BUILD_DIR  default build (needs target downpour-bench-engine built)
#   ROUNDS     default 3;  THREADS default 2
# env: ALEXNET_ITERS (default 3), SMALL_ITERS (default 10), PYTHON (default /usr/bin/python3)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${1:-$root/build}"
rounds="${2:-3}"
threads="${3:-2}"
alex_iters="${ALEXNET_ITERS:-3}"
small_iters="${SMALL_ITERS:-10}"
python="${PYTHON:-/usr/bin/python3}"
bench="$build/bench/engine/downpour-bench-engine"
peer="$root/bench/engine/pytorch_engine_peer.py"
if [[ ! -x "$bench" ]]; then
  echo "run_engine_vs_pytorch.sh: $bench not found; build it first:" >&2
  echo "  cmake --build $build --target downpour-bench-engine -j2" >&2
  exit 1
fi
out="$(mktemp)"
trap 'rm -f "$out"' EXIT
for ((r = 1; r <= rounds; ++r)); do
  echo "round $r/$rounds" >&2
  "$bench" --gemm-only --threads "$threads" >>"$out"
  "$bench" --model "$root/configs/models/alexnet.toml" --batch 64 --iterations "$alex_iters" \
    --threads "$threads" --flops-per-image 4.35e9 >>"$out"
  "$python" "$peer" --model alexnet --batch 64 --iterations "$alex_iters" --threads "$threads" >>"$out"
  "$bench" --model "$root/configs/models/fmnist_small.toml" --batch 256 --iterations "$small_iters" \
    --threads "$threads" >>"$out"
  "$python" "$peer" --model fmnist_small --batch 256 --iterations "$small_iters" --threads "$threads" >>"$out"
done
"$python" - "$out" "$threads" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
threads = sys.argv[2]
def vals(what, model=None):
    return [r["gflops"] if what == "sgemm" else r["images_per_s"]
            for r in rows if r["what"] == what and (model is None or r["model"] == model)]
ceiling = max(vals("sgemm"))
print(f"threads {threads}; rounds {len(vals('sgemm'))}; sgemm 4096^3 ceiling: best {ceiling:.1f} "
      f"GFLOP/s, median {statistics.median(vals('sgemm')):.1f}")
print()
print("| model | batch | downpour img/s (best / median) | PyTorch img/s (best / median) | speed-up (best / median) |")
print("| --- | --- | --- | --- | --- |")
for model, batch in (("alexnet", 64), ("fmnist_small", 256)):
    e, p = vals("engine", model), vals("pytorch", model)
    print(f"| {model} | {batch} | {max(e):.1f} / {statistics.median(e):.1f} | "
          f"{max(p):.1f} / {statistics.median(p):.1f} | "
          f"{max(e) / max(p):.2f}x / {statistics.median(e) / statistics.median(p):.2f}x |")
e = vals("engine", "alexnet")
g_best, g_med = max(e) * 4.35, statistics.median(e) * 4.35
print()
print(f"AlexNet achieved: best {g_best:.1f} GFLOP/s = {100 * g_best / ceiling:.0f}% of the sgemm ceiling; "
      f"median {g_med:.1f} GFLOP/s = {100 * g_med / ceiling:.0f}%")
PY
