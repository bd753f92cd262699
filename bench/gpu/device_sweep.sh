#!/usr/bin/env bash
# On a GPU machine (see device_env.sh): runs the default job once per line of a sweep file,
# "NAME --set key=value ...", with the workers (and the evaluator) on the GPU (TF32 off, so the
# arithmetic is fp32 as on a CPU worker; DEVICE=cpu for CPU workers), PARALLEL runs at a time
# (default 1; each on its own port range), and writes $OUT/sweep.tsv (name, final top-1, wall s,
# img/s) and the summarize lines ($OUT/summaries.txt); only these come back (the tool returns at
# most 8 files).
#   [PARALLEL=3] [DEVICE=gpu:0] [RUN_TIMEOUT=120] bench/gpu/device_sweep.sh CARRY_DIR SWEEP_FILE
source "$(dirname "$0")/device_env.sh" "${1:-}"
sweep=$2
data=data-sets/fashion-mnist
src=/usr/share/datasets/fashion-mnist
for part in train:train t10k:test; do
  [[ -d "$data/${part##*:}_lmdb" ]] || "$bin/downpour-data" convert-idx --images "$src/${part%%:*}-images-idx3-ubyte.gz" \
      --labels "$src/${part%%:*}-labels-idx1-ubyte.gz" --out "$data/${part##*:}_lmdb" >>"$out/convert.log" 2>&1 || exit 1
done
device=${DEVICE:-gpu:0}
parallel=${PARALLEL:-1}
mkdir -p /tmp/runs "$out/rows"
one() {  # one NAME PORT ARGS...: a run, its summary, its row
  local name=$1 port=$2; shift 2
  run "$name" "${RUN_TIMEOUT:-120}" "$bin/downpour-launch" --config configs/runs/default.toml --run-dir "/tmp/runs/$name" \
      --bin-dir "$bin" --set "worker.device=$device" $([[ $device == gpu* ]] && echo --set worker.tf32=false) \
      --set "cluster.coordinator=127.0.0.1:$port" --set "cluster.base_port=$((port + 1))" "$@" >/dev/null
  python3 tools/downpour-summarize "/tmp/runs/$name" >"$out/rows/$name.summary" 2>&1
  python3 - "/tmp/runs/$name/summary.json" "$name" >"$out/rows/$name.tsv" <<'PY'
import json, sys
try:
    s = json.load(open(sys.argv[1]))
    print(f"{sys.argv[2]}\t{s['final_top1']}\t{s['wall_s']:.1f}\t{s['images_per_s']:.0f}")
except Exception as e:  # a failed run: its line says so
    print(f"{sys.argv[2]}\tfailed: {e}\t\t")
PY
}
k=0
while read -r name args; do
  [[ -z "$name" || "$name" == \#* ]] && continue
  while (( $(jobs -rp | wc -l) >= parallel )); do wait -n; done
  # shellcheck disable=SC2086
  one "$name" $((20000 + 10 * k)) $args &
  k=$((k + 1))
done <"$sweep"
wait
printf 'name\tfinal_top1\twall_s\timages_per_s\n' >"$out/sweep.tsv"
cat "$out"/rows/*.tsv >>"$out/sweep.tsv" 2>/dev/null
cat "$out"/rows/*.summary >>"$out/summaries.txt" 2>/dev/null
# The device tool brings back 8 files: the per-run logs travel as one archive.
(cd "$out" && tar -czf logs.tgz ./*.log rows && rm -rf ./*.log rows)
column -t "$out/sweep.tsv"
