#!/usr/bin/env bash
# Issue 44's device checks in one call, on a GPU machine with 16 host cores (see device_env.sh):
#  1. apply lanes: one shard's apply throughput at cluster.server_threads 1, 2, 4, 8, on the host's
#     CPU alone (downpour-bench-ps --apply-grid; the issue asks >= 0.8x linear to 4);
#  2. the dense path over TCP loopback against the pipelined reference, one lane and one
#     connection, then 4 lanes, 2 connections per server, 4 I/O threads (--pipeline-grid);
#  3. AlexNet S = 2, W = 2 GPU workers, fp32, no link, at server_threads 1, 4, 8 and over TCP
#     (device_compression.sh with JOBS=bench/gpu/server_lanes_jobs.txt), against 2026-11-28's
#     1457-1570 img/s.
# Pack first, here: EXTRA_BINS="server/downpour-launch server/downpour-server server/downpour-coordinator
#   client/worker/downpour-worker client/worker/downpour-evaluator data/downpour-data bench/ps/downpour-bench-ps"
#   bench/gpu/pack_for_device.sh build .devcarry
# There:  bench/gpu/device_server.sh .devcarry      (about 8 minutes; STEPS, BUDGET_S as device_compression.sh)
# A dry run here (CPU workers; checks the script, not the speed): OUT=/tmp/devsrv UNPACKED=/tmp/carry-srv
#   DEVICE=cpu BATCH=8 STEPS=4 QUICK=1 bench/gpu/device_server.sh .devcarry
# Writes $OUT/apply.txt, $OUT/pipeline-1.txt, $OUT/pipeline-4.txt and device_compression.sh's rows.
here=$(cd "$(dirname "$0")" && pwd)
source "$here/device_env.sh" "${1:-}"
if [[ ${QUICK:-0} == 1 ]]; then rounds=3 repeats=1; else rounds=8 repeats=3; fi
run apply 150 "$bin/downpour-bench-ps" --apply-grid --apply-threads 1,2,4,8 --workers 8 --rounds "$rounds" \
    --repeats "$repeats"
cp "$out/apply.log" "$out/apply.txt"
run pipeline-1 200 "$bin/downpour-bench-ps" --pipeline-grid --repeats "$repeats" --rounds "$rounds"
cp "$out/pipeline-1.log" "$out/pipeline-1.txt"
run pipeline-4 200 "$bin/downpour-bench-ps" --pipeline-grid --repeats "$repeats" --rounds "$rounds" \
    --server-threads 4 --connections 2 --io-threads 4 --port 24000
cp "$out/pipeline-4.log" "$out/pipeline-4.txt"
grep -h "^| " "$out/apply.txt" "$out/pipeline-1.txt" "$out/pipeline-4.txt" | tee -a "$out/summary.txt"
JOBS=$here/server_lanes_jobs.txt PROFILE=0 STEPS=${STEPS:-40} BUDGET_S=${BUDGET_S:-300} \
  OUT=$out UNPACKED=${UNPACKED:-/tmp/downpour-carry} bash "$here/device_compression.sh" "$carry"
