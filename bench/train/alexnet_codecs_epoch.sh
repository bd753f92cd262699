#!/bin/bash
# bench/train/alexnet_codecs_epoch.sh — AlexNet on Fashion-256 for one epoch with each wire codec:
# one worker (2 engine threads), two servers, async, batch 64, 938 steps (60,032 images), same
# seed, shared memory (no emulated link: this is about accuracy, not bytes' time), the evaluator
# on the first 2,000 test images every 188 batches, then downpour-test on the whole 10,000.
# One worker so that the codec is the only difference between the runs (no async arrival order).
# bench/RESULTS.md §11.3.1 has what it printed. ~22 min a codec on a 2-core VM.
#
#   [SEED=N] bench/train/alexnet_codecs_epoch.sh [OUT_DIR] [CODEC ...]
#     codecs: fp32 factors-fp16 topk1 topk1-warmup onebit (default: all but topk1-warmup);
#     topk1-warmup: top-k 1% warmed up over the first 188 pushes (0.2 epoch, docs/compression.md);
#     OUT_DIR default runs/alex-conv;
#     SEED: run.seed (default 1: initial weights, data order, crops, dropout)
# Needs a build (scripts/bootstrap) and scripts/get_fashion_mnist --alexnet.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-runs/alex-conv}
shift || true
codecs=("$@")
[ ${#codecs[@]} -gt 0 ] || codecs=(fp32 factors-fp16 topk1 onebit)
mkdir -p "$out"
common=(--config configs/runs/alexnet.toml --set cluster.workers=1 --set cluster.servers=2
  --set worker.steps=938 --set worker.threads=2 --set eval.every_steps=188 --set eval.test_batches=20
  --set checkpoint.every_updates=0 --set checkpoint.wal=false --set run.seed=${SEED:-1})
runs=()
for c in "${codecs[@]}"; do
  case $c in
    fp32) extra=() ;;
    factors-fp16) extra=(--set compression.factors=true --set compression.pull=fp16) ;;
    topk1) extra=(--set compression.push=topk --set compression.top_k_fraction=0.01 --set compression.error_feedback=true) ;;
    topk1-warmup) extra=(--set compression.push=topk --set compression.top_k_fraction=0.01
      --set compression.error_feedback=true --set compression.top_k_warmup_pushes=188) ;;
    onebit) extra=(--set compression.push=onebit --set compression.error_feedback=true) ;;
    *) echo "alexnet_codecs_epoch.sh: unknown codec '$c' (fp32, factors-fp16, topk1, topk1-warmup, onebit)" >&2; exit 2 ;;
  esac
  d=$out/$c
  rm -rf "$d"
  echo "== $c start $(date +%T)"
  build/server/downpour-launch "${common[@]}" "${extra[@]}" -o "$d" > "$out/$c.log" 2>&1
  echo "== $c launch done $(date +%T)"
  build/client/worker/downpour-test --run-dir "$d" --set worker.threads=2 --json > "$out/$c.test.json"
  echo "== $c whole test set: $(cat "$out/$c.test.json")"
  runs+=("$c=$d")
done
tools/downpour-compare -q -o "$out/compare" "${runs[@]}"
echo "comparison: $out/compare/comparison.md, report.html"
