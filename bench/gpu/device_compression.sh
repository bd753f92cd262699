#!/usr/bin/env bash
# Issue 14's GPU target, on a GPU machine (see device_env.sh): AlexNet, async, S = 2 servers, W = 2
# GPU workers (both on the machine's one GPU), batch 128, every process's egress paced to an
# emulated 10 Gbit/s (cluster.link_gbps): fp32 against sufficient factors + fp16 pulls
# (compression.factor_threads = 4), each at cluster.server_threads = 8, 4 and 1 (2 servers × 8 =
# the host's 16 cores), and both without a link (the ceiling). fp32 and factors alternate, so a
# drift of the machine shows as a spread between repeats. Also: the GPU factors test, and unless
# PROFILE=0, downpour-time's GPU profile (the scaling model's input) and the load benchmark's
# rates on this host.
# Pack first, here: EXTRA_BINS="server/downpour-launch server/downpour-server server/downpour-coordinator
#   client/worker/downpour-worker client/worker/downpour-evaluator data/downpour-data bench/ps/downpour-bench-ps"
#   bench/gpu/pack_for_device.sh build .devcarry
# There:  [STEPS=40] [BUDGET_S=420] bench/gpu/device_compression.sh .devcarry
# A dry run here first, on CPU workers (~2.5 minutes on 2 cores; it checks the script and the
# rows, not the speed): OUT=/tmp/devout UNPACKED=/tmp/downpour-carry2 DEVICE=cpu BATCH=8 STEPS=4
#   PROFILE=0 TRACE_EVENTS=20000 JOBS=bench/gpu/compression_release.txt bench/gpu/device_compression.sh .devcarry
# Writes $OUT/rows.tsv (one row per job: images/s from the workers' median steps and from the
# whole run, median step ms, wire MB per worker step, the server loops' busy / sgd / factor
# seconds, and the workers' phase: 0 = lockstep, 0.5 = half a step apart), $OUT/<job>.trace.txt (downpour-trace's
# summary of the job's timelines; TRACE_EVENTS=0 turns them off), $OUT/alexnet-gpu-b128.time.json
# and $OUT/bench-ps.txt; the jobs' logs, step records and timelines come back as $OUT/jobs.tgz;
# $OUT/ratios.txt has each compressed job's images/s over the fp32 jobs' on the same link.
source "$(dirname "$0")/device_env.sh" "${1:-}"
steps=${STEPS:-40}
budget=${BUDGET_S:-420}   # no new job starts after this many seconds
data=/tmp/fashion-256
src=/usr/share/datasets/fashion-mnist
mkdir -p "$data"
# A 4,000-image slice of Fashion-256 (scripts/get_fashion_mnist --alexnet makes all 60,000 in
# ~3 minutes on 2 cores): images/s does not depend on which images, and the jobs are short.
run convert 120 bash -c "'$bin/downpour-data' convert-idx --images $src/train-images-idx3-ubyte.gz \
  --labels $src/train-labels-idx1-ubyte.gz --out $data/train_lmdb --resize 256 --channels 3 --encoded jpg \
  --quality 90 --limit 4000 && '$bin/downpour-data' mean $data/train_lmdb --out $data/mean.tensor" || exit 1
# device_all.sh has run every GPU test already (SKIP_FACTORS_TEST=1).
[[ ${SKIP_FACTORS_TEST:-0} == 1 ]] || run factors_test 180 "$bin/gpu_agreement_test" --gtest_filter='GpuNetAgreement.AlexNetFactored*'
[[ ${PROFILE:-1} == 1 ]] && run time_gpu 120 "$bin/downpour-time" --model configs/models/alexnet_fashion.toml --device gpu --batch 128 \
  --iterations 10 --json
[[ ${PROFILE:-1} == 1 ]] && cp "$out/time_gpu.log" "$out/alexnet-gpu-b128.time.json" &&
  "$bin/downpour-worker" --config configs/runs/alexnet.toml --write-tensors "$out/alexnet.tensors.txt" >/dev/null 2>&1

job() {  # job NAME PORT --set ...: one AlexNet job; its row in $out/rows.tsv
  local name=$1 port=$2; shift 2
  if (( SECONDS > budget )); then echo "$name skipped: past the ${budget}s budget" | tee -a "$out/summary.txt"; return; fi
  rm -rf "/tmp/jobs/$name"
  run "$name" 150 "$bin/downpour-launch" --config configs/runs/alexnet.toml --run-dir "/tmp/jobs/$name" \
    --bin-dir "$bin" --timeout-s 140 --set "worker.device=${DEVICE:-gpu:0}" --set "worker.batch_size=${BATCH:-128}" --set worker.threads=4 \
    --set "worker.steps=$steps" --set eval.every_steps=0 --set 'data.test=""' --set checkpoint.every_updates=0 \
    --set "data.train=$data/train_lmdb" --set "data.mean_file=$data/mean.tensor" \
    --set "cluster.coordinator=127.0.0.1:$port" --set "cluster.base_port=$((port + 5))" \
    --set "cluster.trace_events=${TRACE_EVENTS:-200000}" "$@"
  # Each job's timelines, summarised (docs/operations.md "Timelines"); the files are in jobs.tgz.
  python3 tools/downpour-trace "/tmp/jobs/$name" >"$out/$name.trace.txt" 2>&1
  python3 - "/tmp/jobs/$name" "$name" >>"$out/rows.tsv" <<'PY'
import json, sys
sys.path.insert(0, "tools")
import downpour_report as report, downpour_runs as dr
run_dir, name = sys.argv[1:]
try:
    summary = dr.write_summary(run_dir)
    _, files = dr.load_run([run_dir])
    workers = dr.worker_files(files)
    rows = report.step_breakdown(workers)
    phase = report.workers_phase(workers, rows)  # 0 = lockstep, 0.5 = half a step apart
    b = summary["batch_size"]
    med = report.images_per_s_from_steps(rows, b)
    step = max(r["step_ms"] for r in rows)
    tx = max(r["tx_bytes"] or 0 for r in rows) / 1e6
    rx = max(r["rx_bytes"] or 0 for r in rows) / 1e6
    comp = max(r["compute_ms"] or 0 for r in rows)
    # The servers' message loops: busy / wall is each loop's load (server_end, docs/operations.md).
    loops = []
    for s in (0, 1):
        end = [json.loads(x) for x in open(f"{run_dir}/metrics/server-{s}.jsonl") if '"server_end"' in x]
        e = end[-1] if end else {}
        loops.append(f"{e.get('busy_s', 0):.1f}/{e.get('sgd_s', 0):.1f}/{e.get('factor_s', 0):.1f}")
    print(f"{name}\t{med:.0f}\t{summary['images_per_s']:.0f}\t{step:.1f}\t{comp:.1f}\t{tx:.1f}\t{rx:.1f}\t"
          f"{summary['wall_s']:.1f}\t{loops[0]}\t{loops[1]}\t{'-' if phase is None else f'{phase:.2f}'}")
    for r in rows:
        print(report.breakdown_line(r), file=sys.stderr)
except Exception as e:  # a failed job: its row says so
    print(f"{name}\tfailed: {e}")
PY
}
mkdir -p /tmp/jobs
printf 'job\timg_s_median_steps\timg_s_whole_run\tstep_ms\tcompute_ms\ttx_MB_per_step\trx_MB_per_step\twall_s\tserver0_busy/sgd/factor_s\tserver1_busy/sgd/factor_s\tphase\n' >"$out/rows.tsv"
link=(--set cluster.link_gbps=10)
fp32=(--set compression.factors=false --set compression.push=fp32 --set compression.pull=fp32)
sf16=(--set compression.factors=true --set compression.push=fp32 --set compression.pull=fp16)
sf16+=(--set compression.factor_threads=4)
st() { echo --set "cluster.server_threads=$1"; }
# JOBS=FILE: lines "NAME ARGS..." (ARGS may use $link, $fp32, $sf16 and $(st N)) instead of the list below.
if [[ -n ${JOBS:-} ]]; then
  k=0
  while read -r name rest; do
    [[ -z "$name" || "$name" == \#* ]] && continue
    eval "job $name $((21000 + 20 * k)) $rest"
    k=$((k + 1))
  done <"$JOBS"
else
job fp32-10g-s8-a 21000 "${link[@]}" "${fp32[@]}" $(st 8)
job sf16-10g-s8-a 21020 "${link[@]}" "${sf16[@]}" $(st 8)
job fp32-10g-s4 21040 "${link[@]}" "${fp32[@]}" $(st 4)
job sf16-10g-s4 21060 "${link[@]}" "${sf16[@]}" $(st 4)
job fp32-10g-s8-b 21080 "${link[@]}" "${fp32[@]}" $(st 8)
job sf16-10g-s8-b 21100 "${link[@]}" "${sf16[@]}" $(st 8)
job fp32-10g-s1 21120 "${link[@]}" "${fp32[@]}" $(st 1)
job sf16-10g-s1 21140 "${link[@]}" "${sf16[@]}" $(st 1)
job fp32-nolink-s8 21160 "${fp32[@]}" $(st 8)
job sf16-nolink-s8 21180 "${sf16[@]}" $(st 8)
fi
# The host's transport and server rates for the scaling model (as scaling_validate.py --bench).
if [[ ${PROFILE:-1} == 1 ]] && (( SECONDS < budget + 60 )); then
  run bench_ps 90 "$bin/downpour-bench-ps" --servers 2 --workers 1 --rounds 6
  cp "$out/bench_ps.log" "$out/bench-ps.txt"
fi
(cd /tmp/jobs && tar -czf "$out/jobs.tgz" --exclude='*.dpt' --exclude='*.wal' .)
(cd "$out" && tar -czf logs.tgz ./*.log && rm -f ./*.log)
cat "$out/summary.txt"
python3 -c 'import sys; [print("  ".join(f"{c:>16}" for c in l.rstrip("\n").split("\t"))) for l in open(sys.argv[1])]' "$out/rows.tsv"
# The issue's ratio: each compressed job's images/s (median steps) over the mean of the fp32 jobs
# on the same link, with the fp32 jobs' spread (they alternate with the others, so a drifting
# machine shows there); also in $out/ratios.txt.
python3 - "$out/rows.tsv" <<'PY' | tee "$out/ratios.txt"
import statistics, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])][1:]
ok = [(r[0], float(r[1])) for r in rows if len(r) > 1 and not r[1].startswith("failed")]
for link in sorted({n.split("-")[1] for n, _ in ok if n.count("-") >= 1}):
    base = [v for n, v in ok if n.startswith(f"fp32-{link}")]
    if not base:
        continue
    mean = statistics.mean(base)
    print(f"{link}: fp32 {mean:.0f} img/s (mean of {len(base)} jobs, {min(base):.0f}-{max(base):.0f})")
    for n, v in ok:
        if not n.startswith("fp32-") and n.split("-")[1] == link and mean > 0:
            print(f"  {n}: {v:.0f} img/s = {v / mean:.2f}x fp32 ({v / max(base):.2f}-{v / min(base):.2f}x of single fp32 jobs)")
PY
