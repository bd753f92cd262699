#!/bin/bash
# bench/scaling/corun_time.sh — does computing beside other workers slow a worker's compute?
# Runs N copies of downpour-time at once for N in COUNTS and prints each copy's forward+backward
# ms (bench/RESULTS.md §11.5.3: AlexNet, one thread, batch 64: 1.53 s alone, 2.28× with four on
# two cores, where sharing the cores gives 2×).
#   bench/scaling/corun_time.sh [MODEL_TOML] [BATCH] [THREADS] [COUNTS]   (defaults: alexnet_fashion 64 1 "1 2 4")
# Needs a build (scripts/bootstrap).
set -euo pipefail
cd "$(dirname "$0")/../.."
model=${1:-configs/models/alexnet_fashion.toml}
batch=${2:-64}
threads=${3:-1}
counts=${4:-1 2 4}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for n in $counts; do
  for i in $(seq "$n"); do
    build/client/engine/downpour-time --model "$model" --batch "$batch" --threads "$threads" --iterations 3 \
      --json > "$tmp/$n-$i.json" &
  done
  wait
  echo -n "$n at once: forward+backward ms"
  for i in $(seq "$n"); do
    python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(' %.0f' % (d['forward_ms'] + d['backward_ms']), end='')" \
      "$tmp/$n-$i.json"
  done
  echo
done
