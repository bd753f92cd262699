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
source "$here/device_parts.sh"
fashion_lmdb || exit 1
default_jobs
[[ ${SKIP_BENCH:-0} != 1 ]] && worker_step_bench
cat "$out/summary.txt" "$out/default.txt" "$out/ratios.txt" 2>/dev/null
