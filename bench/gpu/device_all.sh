#!/usr/bin/env bash
# Issues 44 and 45's device answers in one call of about 8 minutes, for a session whose device
# time is 15 minutes, the machine's start included (device_worker.sh and device_server.sh, the
# fuller checks, take about that each). Most needed first; once $DEADLINE_S (default 420) seconds
# have passed, no later step starts (the longest step may then run 150 s: all within 600 s):
#  1. every GPU test of the net (gpu_agreement_test: transfers, factors packed on the device, in
#     f32 and cast to 16 bits, byte input for training and evaluation, casts), and every layer's
#     gradient on the device (gpu_gradcheck_test: ELU and PReLU have no other GPU test);
#  2. AlexNet's worker step against PyTorch's fwd + bwd + SGD, TF32 on, batch 128 (issue 45);
#  3. one shard's apply throughput at cluster.server_threads 1, 2, 4, 8 on the host's cores (44);
#  4. AlexNet S = 2, W = 2 GPU-worker jobs (bench/gpu/all_jobs.txt): fp32 against factors + fp16
#     pulls at an emulated 10 Gbit/s (45), and fp32 without a link at 1, 4, 8 lanes and over TCP (44);
#  5. the default job with GPU workers and whether its evaluator took bytes (45);
#  6. the dense path over TCP against the pipelined reference with 4 lanes (44), one repeat.
# Pack first, here: EXTRA_BINS="server/downpour-launch server/downpour-server server/downpour-coordinator
#   client/worker/downpour-worker client/worker/downpour-evaluator data/downpour-data bench/ps/downpour-bench-ps"
#   bench/gpu/pack_for_device.sh build .devcarry
# There:  bench/gpu/device_all.sh .devcarry
# A dry run here (CPU workers; checks the script, not the speed): OUT=/tmp/devall UNPACKED=/tmp/carry-all
#   DEVICE=cpu DEVICES=cpu BATCH=8 STEPS=4 DEFAULT_STEPS=100 SKIP_BENCH=1 QUICK=1 bench/gpu/device_all.sh .devcarry
# Everything lands in $OUT (default bench/gpu/out): summary.txt (a line per step), ratios.txt,
# rows.tsv (the jobs), default.txt, apply.txt, pipeline.txt, and the logs (those of the steps
# up to the jobs in logs.tgz, which device_compression.sh packs).
here=$(cd "$(dirname "$0")" && pwd)
source "$here/device_env.sh" "${1:-}"
source "$here/device_parts.sh"
deadline=${DEADLINE_S:-420}
due() {  # due NAME: whether step NAME may start (a summary line when it may not)
  (( SECONDS <= deadline )) && return 0
  echo "$1 skipped: past the ${deadline}s deadline" | tee -a "$out/summary.txt"
  return 1
}
if [[ ${QUICK:-0} == 1 ]]; then rounds=3; else rounds=6; fi
due agreement && run agreement 180 "$bin/gpu_agreement_test" --gtest_brief=1
due gradcheck && run gradcheck 90 "$bin/gpu_gradcheck_test" --gtest_brief=1
if [[ ${SKIP_BENCH:-0} != 1 ]] && due bench; then
  worker_step_bench
  cp "$out/ratios.txt" "$out/worker-ratio.txt"  # device_compression.sh writes ratios.txt afresh
fi
if due apply; then
  run apply 120 "$bin/downpour-bench-ps" --apply-grid --apply-threads 1,2,4,8 --workers 8 --rounds "$rounds" --repeats 2
  cp "$out/apply.log" "$out/apply.txt"
fi
# The jobs stop starting 90 s before the deadline, for the steps after them.
due jobs && JOBS=$here/all_jobs.txt PROFILE=0 SKIP_FACTORS_TEST=1 STEPS=${STEPS:-30} BUDGET_S=$((deadline - SECONDS - 90)) \
  OUT=$out UNPACKED=${UNPACKED:-/tmp/downpour-carry} bash "$here/device_compression.sh" "$carry"
[[ -e "$out/worker-ratio.txt" ]] && cat "$out/worker-ratio.txt" >>"$out/ratios.txt"
if due default; then
  fashion_lmdb && KS=1 default_jobs
fi
if due pipeline; then
  run pipeline 150 "$bin/downpour-bench-ps" --pipeline-grid --repeats 1 --rounds "$rounds" --server-threads 4 \
      --connections 2 --io-threads 4 --port 24000
  cp "$out/pipeline.log" "$out/pipeline.txt"
fi
echo "device_all: ${SECONDS}s" | tee -a "$out/summary.txt"
cat "$out/summary.txt" "$out/default.txt" "$out/ratios.txt" 2>/dev/null
grep -h "^| " "$out/apply.txt" "$out/pipeline.txt" 2>/dev/null
