#!/usr/bin/env python3
"""reply_order.py — cluster.reply_order = "arrival" against "step" on one machine: AlexNet async
jobs whose workers are emulated GPU workers (worker.emulate_ms: they sleep through the net's
layers, so the host's cores go to the servers and the transport), every process's egress paced
(cluster.link_gbps), the two orders alternating job by job so a drift of the machine touches
both alike.

    bench/scaling/reply_order.py [--build build] [--link 1] [--emulate-step-ms 300] [--workers 2]
        [--servers 2] [--steps 20] [--repeats 2] [--codec factors+pull=fp16] [--work DIR]
        [--rates FILE] [--trace-events N] [--set KEY=VALUE ...] [--dry-run]
        [--jobs LABEL:ORDER[:BIN_DIR],...]

--jobs: the jobs of one repeat, in turn (default "arrival:arrival,step:step"); a BIN_DIR runs that
job's processes from there (downpour-launch --bin-dir), to set two builds side by side.

Per job: images/s = the sum over workers of batch / median step (steps 2.., as
scaling_validate.py), each worker's median step, and the workers' phase: for every step end of
worker 0, the distance to the nearest step end of worker 1, as a fraction of worker 0's median
step (median over its steps; 0 = lockstep, 0.5 = half a step apart). With --trace-events N the
jobs keep timelines and their downpour-trace summaries are written beside them. Beside each
order, tools/downpour-scaling's prediction for these jobs (the emulated profile, --rates, the
host's cores): in lockstep for "arrival", out of phase for "step"; printed before any job runs.

Writes <work>/reply_order.md and reply_order.json. Why: bench/RESULTS.md §11.4.1 — two GPU
workers in lockstep get their pulled weights interleaved on each server's link, so each waits
for both workers' bytes.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "bench", "train"))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import downpour_report as report  # noqa: E402
import downpour_runs as dr  # noqa: E402
import downpour_scaling as sc  # noqa: E402
import scaling_validate as sv  # noqa: E402


def parse_jobs(text):
    """'label:order[:bin_dir],...' → [(label, order, bin_dir or None)]."""
    out = []
    for item in text.split(","):
        parts = item.split(":", 2)
        if len(parts) < 2 or not parts[0] or parts[1] not in ("arrival", "step"):
            sys.exit(f"reply_order: --jobs: {item!r}: expected LABEL:ORDER[:BIN_DIR] with ORDER arrival or step")
        if len(parts) == 3 and not os.path.isdir(parts[2]):
            sys.exit(f"reply_order: --jobs: {item!r}: {parts[2]} is not a directory")
        out.append((parts[0], parts[1], parts[2] if len(parts) == 3 else None))
    if len({label for label, _, _ in out}) != len(out):
        sys.exit(f"reply_order: --jobs: {text!r}: labels must differ")
    return out


def run_job(args, name, order, sets, bin_dir=None):
    run_dir = os.path.join(args.work, name)
    shutil.rmtree(run_dir, ignore_errors=True)
    extra = ["--bin-dir", os.path.abspath(bin_dir)] if bin_dir else []
    summary, workers = sv.launch(args, "alexnet", run_dir, sets + [f"cluster.reply_order={order}"], "reply_order", extra)
    rows = report.step_breakdown(workers)
    batch = summary["batch_size"]
    ph = report.workers_phase(workers, rows)
    if args.trace_events:
        trace = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "downpour-trace"), run_dir],
                               capture_output=True, text=True, cwd=ROOT)
        with open(run_dir + ".trace.txt", "w") as f:
            f.write(trace.stdout + trace.stderr)
    return {"name": name, "order": order, "bin_dir": bin_dir, "images_per_s": report.images_per_s_from_steps(rows, batch),
            "step_ms": {str(r["worker"]): r["step_ms"] for r in rows}, "phase": ph,
            "pull_wait_ms": {str(r["worker"]): r["pull_wait_ms"] for r in rows},
            "push_wait_ms": {str(r["worker"]): r["push_wait_ms"] for r in rows},
            "load_after": os.getloadavg()[0]}


def fmt(x, spec=".1f"):
    return "—" if x is None else format(x, spec)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--work", default="runs/reply-order")
    ap.add_argument("--data-root", default="data-sets", help="where fashion-256/ is (else a synthetic LMDB)")
    ap.add_argument("--link", type=float, default=1.0, help="cluster.link_gbps of every job (> 0)")
    ap.add_argument("--emulate-step-ms", type=float, default=300.0,
                    help="the emulated workers' forward + backward (this machine's per-layer proportions)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--servers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=2, help="pairs of jobs (arrival, step), alternating")
    ap.add_argument("--codec", default="factors+pull=fp16", help="a downpour-scaling codec name")
    ap.add_argument("--rates", default=os.path.join(HERE, "rates_tcp_quiet.json"),
                    help="the scaling model's rates JSON (default: bench/scaling/rates_tcp_quiet.json)")
    ap.add_argument("--trace-events", type=int, default=0, help="cluster.trace_events of every job (0 = off)")
    ap.add_argument("--timeout-s", type=int, default=900)
    ap.add_argument("--jobs", default="arrival:arrival,step:step", help="LABEL:ORDER[:BIN_DIR],... (see above)")
    ap.add_argument("--dry-run", action="store_true", help="the profile and the model's predictions only; no job")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="more settings for every job")
    args = ap.parse_args()
    if not args.link > 0:
        sys.exit(f"reply_order: --link {args.link:g}: must be > 0 (cluster.reply_order needs an emulated link)")
    if not args.emulate_step_ms > 0:
        sys.exit(f"reply_order: --emulate-step-ms {args.emulate_step_ms:g}: must be > 0")
    args.build = os.path.abspath(args.build)
    variants = parse_jobs(args.jobs)
    os.makedirs(args.work, exist_ok=True)
    try:
        codec = sc.parse_codec(args.codec)
    except dr.ToolError as e:
        sys.exit(f"reply_order: {e}")
    base = sv.load_base("alexnet")
    profile, _ = sv.time_profile(args, "alexnet", base)
    profile = sv.emulated_profile(profile, args.emulate_step_ms)
    tensors, _ = sv.tensors_of(args, "alexnet", base)
    rates = sc.rates_from_json(sc.read_json(args.rates, "--rates"), args.rates)
    predicted = {}
    for order, lockstep in (("arrival", True), ("step", False)):
        cluster = sc.Cluster(workers=args.workers, servers=args.servers, link_gbps=args.link, mode="async",
                             wal=sc.wal_from_config(base), batch=base["worker"]["batch_size"],
                             workers_per_host=args.workers, cores_per_host=os.cpu_count() or 1, emulated=True,
                             colocated=True, link_burst_ms=0.0, lockstep=lockstep,
                             chunk_elems=base["cluster"].get("chunk_elems", sc.DEFAULT_CHUNK_ELEMS))
        predicted[order] = sc.predict(profile, tensors, rates, cluster, codec).images_per_s
    print("model (" + rates.source + "): " + ", ".join(f"{o} {v:.1f} img/s ({'lockstep' if o == 'arrival' else 'out of phase'})"
                                                      for o, v in predicted.items()), flush=True)
    if args.dry_run:
        return
    sets = [f"cluster.workers={args.workers}", f"cluster.servers={args.servers}", f"worker.steps={args.steps}",
            "cluster.coordinator=127.0.0.1:7700", "cluster.base_port=7705", "eval.every_steps=0",
            "checkpoint.every_updates=0", "consistency.mode=async", f"cluster.link_gbps={args.link:g}",
            sv.emulate_set(profile)] + sv.data_sets(args, "alexnet") + codec.config_sets() + args.set
    if args.trace_events:
        sets.append(f"cluster.trace_events={args.trace_events}")
    print(f"machine: nproc {os.cpu_count()}, load {os.getloadavg()[0]:.2f}; link {args.link:g} Gbit/s, "
          f"W = {args.workers}, S = {args.servers}, {args.codec}, emulated step {args.emulate_step_ms:g} ms", flush=True)
    jobs = []
    for rep in range(args.repeats):
        for label, order, bin_dir in variants:
            j = run_job(args, f"{label}-r{rep + 1}", order, sets, bin_dir)
            j["label"] = label
            jobs.append(j)
            print(f"{j['name']}: {j['images_per_s']:.1f} img/s, steps "
                  + ", ".join(f"w{k} {fmt(v)} ms" for k, v in j["step_ms"].items())
                  + f", phase {fmt(j['phase'], '.2f')}, load {j['load_after']:.2f}", flush=True)
    lines = ["| job | reply order | images/s | step (ms) per worker | pull wait (ms) | push wait (ms) | phase |",
             "| --- | --- | ---: | --- | --- | --- | ---: |"]
    for j in jobs:
        per = lambda d: ", ".join(fmt(v) for v in d.values())  # noqa: E731
        lines.append(f"| {j['name']} | {j['order']} | {j['images_per_s']:.1f} | {per(j['step_ms'])} | "
                     f"{per(j['pull_wait_ms'])} | {per(j['push_wait_ms'])} | {fmt(j['phase'], '.2f')} |")
    for label, order, _ in variants:
        v = [j["images_per_s"] for j in jobs if j["label"] == label]
        med = statistics.median(v)
        lines.append(f"\n{label} ({order}): median {med:.1f} images/s over {len(v)} jobs ({min(v):.1f}–{max(v):.1f}); the model "
                     f"({'lockstep' if order == 'arrival' else 'out of phase'}) {predicted[order]:.1f} "
                     f"({100 * (predicted[order] / med - 1):+.0f}%)")
    text = "\n".join(lines) + "\n"
    print(text)
    with open(os.path.join(args.work, "reply_order.md"), "w") as f:
        f.write(text)
    with open(os.path.join(args.work, "reply_order.json"), "w") as f:
        json.dump({"format": "reply_order/1", "args": vars(args), "predicted": predicted, "jobs": jobs}, f, indent=1)
    print(f"written: {args.work}/reply_order.md, reply_order.json")


if __name__ == "__main__":
    main()
