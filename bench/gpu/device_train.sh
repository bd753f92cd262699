#!/usr/bin/env bash
# On a GPU machine, from the repository root, with the folder bench/gpu/pack_for_device.sh made
# (with the launcher, server, coordinator, worker and downpour-data in EXTRA_BINS): the default
# job (configs/runs/default.toml: async, 2 servers, 2 workers, Fashion-MNIST) with both workers on
# the GPU, then the same job with CPU workers on the same machine. Each run's metrics, logs and
# summary come back as $OUT/run-<device>.tgz; the summary lines are printed last.
#   [DEVICES="gpu:0 cpu"] [LAUNCH_ARGS="--set worker.steps=100"] bench/gpu/device_train.sh [carry-dir]
source "$(dirname "$0")/device_env.sh" "${1:-}"
data=data-sets/fashion-mnist
src=/usr/share/datasets/fashion-mnist
for part in train:train t10k:test; do
  "$bin/downpour-data" convert-idx --images "$src/${part%%:*}-images-idx3-ubyte.gz" \
      --labels "$src/${part%%:*}-labels-idx1-ubyte.gz" --out "$data/${part##*:}_lmdb" >>"$out/convert.log" 2>&1 || exit 1
done
run chunked 120 "$bin/gpu_agreement_test" --gtest_filter='GpuNetAgreement.ChunkedUploadsAndHostUpdates'
for dev in ${DEVICES:-gpu:0 cpu}; do
  name=default-${dev%%:*}
  run "$name" "${RUN_TIMEOUT:-200}" "$bin/downpour-launch" --config configs/runs/default.toml --run-dir "/tmp/runs/$name" \
      --bin-dir "$bin" --set "worker.device=$dev" ${LAUNCH_ARGS:-}
  python3 tools/downpour-summarize "/tmp/runs/$name" >>"$out/summaries.txt" 2>&1
  tar -czf "$out/run-${dev%%:*}.tgz" --exclude='*.dpt' --exclude='*.wal' -C /tmp/runs "$name"
done
cat "$out/summary.txt" "$out/summaries.txt"
