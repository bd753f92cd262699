#!/usr/bin/env python3
"""job_cpu.py — CPU per step of every kind of process in a real job on this host, in the steady
state: runs one downpour-launch job, reads each downpour process's utime + stime from
/proc/<pid>/stat every 0.25 s, and charges each process the CPU it used between worker 0's end
of step 2 and its last step (start-up, the first cold step and the final evaluation fall
outside), divided by the steps worker 0 took in that window. bench/RESULTS.md §11.5.3.

    bench/scaling/job_cpu.py [--config configs/runs/alexnet.toml] [--steps 12] [--work DIR]
        [--set KEY=VALUE ...]    (defaults: W = 4, S = 2, cluster.link_gbps = 10, async, no
                                 evaluation during training, no checkpoints)
Needs a build (scripts/bootstrap) and the config's data; run it on a quiet machine.
"""
import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_SETS = ["cluster.workers=4", "cluster.servers=2", "cluster.link_gbps=10", "consistency.mode=async",
                "eval.every_steps=0", "eval.test_batches=1", "checkpoint.every_updates=0",
                "cluster.coordinator=127.0.0.1:9700", "cluster.base_port=9705"]


def sample_job(config, steps, sets, run_dir):
    """Runs the job; returns {pid: (executable, [(time, cpu seconds), ...])}."""
    shutil.rmtree(run_dir, ignore_errors=True)
    cmd = [os.path.join(ROOT, "build", "server", "downpour-launch"), "--config", config, "--run-dir", run_dir,
           "--timeout-s", "1800"]
    for s in DEFAULT_SETS + sets + [f"worker.steps={steps}"]:
        cmd += ["--set", s]
    tick = os.sysconf("SC_CLK_TCK")
    series = {}
    with open(run_dir + ".log", "w") as log:
        p = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        while p.poll() is None:
            now = time.time()
            for d in glob.glob("/proc/[0-9]*"):
                try:
                    with open(d + "/cmdline") as f:
                        exe = os.path.basename(f.read().split("\0")[0])
                    if not exe.startswith("downpour-"):
                        continue
                    with open(d + "/stat") as f:
                        fields = f.read().rsplit(")", 1)[1].split()
                    cpu = (int(fields[11]) + int(fields[12])) / tick  # utime, stime
                except (OSError, IndexError, ValueError):
                    continue  # the process ended between listing and reading
                # The latest name: a child of downpour-launch is "downpour-launch" until it execs.
                samples = series[d][1] if d in series else []
                samples.append((now, cpu))
                series[d] = (exe, samples)
            time.sleep(0.25)
    if p.returncode != 0:
        sys.exit(f"job_cpu: the job failed (exit {p.returncode}); see {run_dir}.log")
    return series


def cpu_at(samples, t):
    """A process's CPU seconds at time t, linear between samples (flat before and after)."""
    if t <= samples[0][0]:
        return samples[0][1]
    for (t0, c0), (t1, c1) in zip(samples, samples[1:]):
        if t <= t1:
            return c0 + (c1 - c0) * (t - t0) / (t1 - t0) if t1 > t0 else c1
    return samples[-1][1]


def step_times(run_dir):
    """Worker 0's (step, end time) from its metrics."""
    out = []
    with open(os.path.join(run_dir, "metrics", "worker-0.jsonl")) as f:
        for line in f:
            r = json.loads(line)
            if r.get("event") == "step":
                out.append((r["step"], r["t"]))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=os.path.join(ROOT, "configs", "runs", "alexnet.toml"))
    ap.add_argument("--steps", type=int, default=12, help="steps per worker (>= 4)")
    ap.add_argument("--work", default=os.path.join(ROOT, "runs", "job-cpu"))
    ap.add_argument("--set", action="append", default=[], help="more run-config settings (later ones win)")
    args = ap.parse_args()
    if args.steps < 4:
        sys.exit(f"job_cpu: --steps {args.steps}: must be >= 4 (the window starts after step 2)")
    os.makedirs(args.work, exist_ok=True)
    run_dir = os.path.join(args.work, f"steps-{args.steps}")
    series = sample_job(args.config, args.steps, args.set, run_dir)
    steps = step_times(run_dir)
    first = next((t for s, t in steps if s == 2), None)
    if first is None or steps[-1][0] <= 2:
        sys.exit(f"job_cpu: {run_dir}/metrics/worker-0.jsonl has no steps after step 2")
    last_step, last = steps[-1]
    n = last_step - 2
    total = {}
    for exe, samples in series.values():
        total.setdefault(exe, []).append(cpu_at(samples, last) - cpu_at(samples, first))
    print(f"worker 0's steps 3..{last_step}: {last - first:.2f} s, {(last - first) / n:.3f} s a step")
    print("| process | count | CPU s a step, each | CPU s a step, all |")
    print("| --- | ---: | --- | ---: |")
    for exe in sorted(total):
        each = ", ".join(f"{c / n:.3f}" for c in total[exe])
        print(f"| {exe} | {len(total[exe])} | {each} | {sum(total[exe]) / n:.3f} |")


if __name__ == "__main__":
    main()
