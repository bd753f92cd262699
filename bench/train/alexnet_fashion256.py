#!/usr/bin/env python3
"""bench/train/alexnet_fashion256.py — AlexNet on Fashion-256, 2 servers x 2 workers, async.

The heavy bench of docs/alexnet.md: launches configs/runs/alexnet.toml (Caffe's bvlc_alexnet
solver, random 227 crops + mirror + mean) for a bounded number of steps per worker, then prints
the curve from the run's metrics JSONL: training loss (worker 0's moving average and the batch
loss of both workers) and test top-1 / top-5 / loss against wall time and step, and what the
run reached. Needs the data of `scripts/get_fashion_mnist --alexnet` and a build
(scripts/bootstrap). Not a ctest: it runs for tens of minutes on purpose.

    bench/train/alexnet_fashion256.py                       # 400 steps per worker
    bench/train/alexnet_fashion256.py --steps 100000 --minutes 60   # what 60 minutes reach
    bench/train/alexnet_fashion256.py --steps 50 --eval-every 25 --run-dir runs/a
    bench/train/alexnet_fashion256.py --curve-only runs/a   # print the curve of a finished run

Exit status: the launcher's (non-zero when the run failed), 3 when the final test top-1 is not
above 2x chance (20%, a run that did not learn).
"""
import argparse
import datetime
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def read_jsonl(path):
    out = []
    if not os.path.exists(path):
        return out
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    pass  # a line cut by a kill
    return out


def fmt_min(seconds):
    return f"{seconds / 60:5.1f}"


def curve(run_dir, every):
    """Prints the loss and accuracy tables; returns the final (or last) eval record."""
    w0 = read_jsonl(os.path.join(run_dir, "metrics", "worker-0.jsonl"))
    w1 = read_jsonl(os.path.join(run_dir, "metrics", "worker-1.jsonl"))
    if not w0:
        print(f"alexnet_fashion256: no metrics in {run_dir}/metrics/worker-0.jsonl", file=sys.stderr)
        return None
    steps0 = [r for r in w0 if r.get("event") == "step"]
    steps1 = {r["step"]: r for r in w1 if r.get("event") == "step"}
    evals = [r for r in w0 if r.get("event") == "eval"]
    print(f"\nRun {run_dir}: worker 0 logged {len(steps0)} steps, {len(evals)} evaluations\n")
    print("Training loss (worker 0's step; loss_ema = its moving average; w1 = worker 1's batch loss at the same step)\n")
    print("| step | wall (min) | epochs of the 60k (both workers) | loss_ema w0 | batch loss w0 | batch loss w1 | img/s w0 |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in steps0:
        if r["step"] % every and r is not steps0[-1] and r["step"] != 1:
            continue
        other = steps1.get(r["step"])
        w1_loss = f"{other['loss']:.3f}" if other else "—"
        print(f"| {r['step']} | {fmt_min(r['wall_s'])} | {r['epoch']:.3f} | {r['loss_ema']:.3f} | {r['loss']:.3f} "
              f"| {w1_loss} | {r['images_per_s']:.1f} |")
    print("\nTest set (worker 0, centre crop, no mirror)\n")
    print("| step | wall (min) | epochs of the 60k (both workers) | server updates | test loss | top-1 | top-5 | images |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in evals:
        tag = " (final)" if r.get("final") else ""
        print(f"| {r['step']}{tag} | {fmt_min(r['wall_s'])} | {r['epoch']:.3f} | {r.get('server_versions', '—')} "
              f"| {r['test_loss']:.3f} | {100 * r['top1']:.2f}% | {100 * r['top5']:.2f}% | {r['test_images']} |")
    return evals[-1] if evals else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build-dir", default="build")
    ap.add_argument("--config", default="configs/runs/alexnet.toml")
    ap.add_argument("--steps", type=int, default=400, help="steps per worker (default 400)")
    ap.add_argument("--eval-every", type=int, default=50, help="evaluate every N steps (worker 0)")
    ap.add_argument("--test-batches", type=int, default=10, help="test batches of 100 per evaluation (0 = all 10k)")
    ap.add_argument("--minutes", type=float, default=0,
                    help="stop the job after this many minutes, finished or not (the curve is then the "
                         "evaluations made so far); 0 = run the steps and stop after --timeout-min")
    ap.add_argument("--timeout-min", type=float, default=90, help="fail the job after this many minutes")
    ap.add_argument("--run-dir", default="", help="default runs/alexnet-fashion256-<UTC time>")
    ap.add_argument("--set", action="append", default=[], help="more run config overrides, section.key=value")
    ap.add_argument("--curve-only", metavar="RUN_DIR", help="print the curve of a finished run, launch nothing")
    ap.add_argument("--every", type=int, default=25, help="loss table: every N steps")
    args = ap.parse_args()
    os.chdir(ROOT)

    if args.curve_only:
        last = curve(args.curve_only, args.every)
        return 0 if last else 1

    data = "data-sets/fashion-256"
    for need in ("train_lmdb", "test_lmdb", "mean.tensor"):
        if not os.path.exists(os.path.join(data, need)) and not any(s.startswith("data.") for s in args.set):
            print(f"alexnet_fashion256: {data}/{need} missing; run scripts/get_fashion_mnist --alexnet first",
                  file=sys.stderr)
            return 2
    launch = os.path.join(args.build_dir, "server", "downpour-launch")
    if not os.access(launch, os.X_OK):
        print(f"alexnet_fashion256: {launch} not built; run scripts/bootstrap", file=sys.stderr)
        return 2
    run_dir = args.run_dir or "runs/alexnet-fashion256-" + datetime.datetime.utcnow().strftime("%Y%m%d-%H%M%S")
    cmd = [launch, "--config", args.config, "-o", run_dir, "--timeout-s",
           str(int((args.minutes or args.timeout_min) * 60)),
           "--set", f"worker.steps={args.steps}", "--set", f"eval.every_steps={args.eval_every}",
           "--set", f"eval.test_batches={args.test_batches}"]
    for s in args.set:
        cmd += ["--set", s]
    print("nproc", os.cpu_count(), "|", " ".join(cmd), flush=True)
    started = time.time()
    rc = subprocess.call(cmd)
    took = time.time() - started
    print(f"\nalexnet_fashion256: the launcher exited {rc} after {took / 60:.1f} min")
    last = curve(run_dir, args.every)
    if rc != 0 and not (args.minutes and took >= args.minutes * 60 - 5):
        return rc  # failed, not stopped by --minutes
    if last is None or last["top1"] <= 0.2:
        print("alexnet_fashion256: the final test top-1 is not above 20% (chance is 10%): the run did not learn",
              file=sys.stderr)
        return 3
    print(f"\nReached: test top-1 {100 * last['top1']:.2f}% (top-5 {100 * last['top5']:.2f}%, loss "
          f"{last['test_loss']:.3f}) at step {last['step']} of worker 0, {took / 60:.1f} min wall")
    return 0


if __name__ == "__main__":
    sys.exit(main())
