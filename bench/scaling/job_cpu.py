#!/usr/bin/env python3
"""job_cpu.py — CPU per step of every kind of process in a real job on this host, in the steady
state: runs one downpour-launch job, reads each downpour process's utime + stime from
/proc/<pid>/stat every 0.25 s, and charges each process the CPU it used between worker 0's end
of step 2 and its last step (start-up, the first cold step and the final evaluation fall
outside), divided by the steps worker 0 took in that window. bench/RESULTS.md §11.5.3.

    bench/scaling/job_cpu.py [--config configs/runs/alexnet.toml] [--steps 12] [--work DIR]
        [--set KEY=VALUE ...]    (defaults: W = 4, S = 2, cluster.link_gbps = 10, async, no
                                 evaluation during training, no checkpoints)
        [--threads]              also each worker's and server's threads, by thread (the main
                                 thread is the one named after the program; ZeroMQ names its
                                 I/O threads ZMQbg/IO/n)
        [--slowdown FILE]        does the job slow the worker's compute? (the scaling model
                                 charges downpour-time's figure alone): with one worker
                                 (--set cluster.workers=1) and worker.threads = 1, compares the
                                 job's training thread's CPU a step (the worker's main thread:
                                 its compute) with downpour-time --json of the net alone (median
                                 forward + backward of 3, timed after the job), per GB/s the
                                 worker moved (its tx + rx bytes over the window):
                                 (job / alone - 1) / GB/s, written to FILE as JSON.
                                 bench/RESULTS.md §11.5.4.
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


def read_cpu(stat_path):
    """(utime + stime in clock ticks) of a /proc .../stat file."""
    with open(stat_path) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def sample_job(config, steps, sets, run_dir, threads=False):
    """Runs the job; returns {pid: (executable, [(time, cpu seconds), ...])}, and with threads
    also {(pid, tid): (executable, thread name, [(time, cpu seconds), ...])}."""
    shutil.rmtree(run_dir, ignore_errors=True)
    cmd = [os.path.join(ROOT, "build", "server", "downpour-launch"), "--config", config, "--run-dir", run_dir,
           "--timeout-s", "1800"]
    for s in DEFAULT_SETS + sets + [f"worker.steps={steps}"]:
        cmd += ["--set", s]
    tick = os.sysconf("SC_CLK_TCK")
    series, by_thread = {}, {}
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
                    cpu = read_cpu(d + "/stat") / tick  # utime, stime
                except (OSError, IndexError, ValueError):
                    continue  # the process ended between listing and reading
                # The latest name: a child of downpour-launch is "downpour-launch" until it execs.
                samples = series[d][1] if d in series else []
                samples.append((now, cpu))
                series[d] = (exe, samples)
                if threads and exe in ("downpour-worker", "downpour-server"):
                    for t in glob.glob(d + "/task/[0-9]*"):
                        try:
                            with open(t + "/comm") as f:
                                name = f.read().strip()
                            tcpu = read_cpu(t + "/stat") / tick
                        except (OSError, IndexError, ValueError):
                            continue
                        key = (d, t)
                        tsamples = by_thread[key][2] if key in by_thread else []
                        tsamples.append((now, tcpu))
                        by_thread[key] = (exe, name, tsamples)
            time.sleep(0.25)
    if p.returncode != 0:
        sys.exit(f"job_cpu: the job failed (exit {p.returncode}); see {run_dir}.log")
    return series, by_thread


def cpu_at(samples, t):
    """A process's CPU seconds at time t, linear between samples (flat before and after)."""
    if t <= samples[0][0]:
        return samples[0][1]
    for (t0, c0), (t1, c1) in zip(samples, samples[1:]):
        if t <= t1:
            return c0 + (c1 - c0) * (t - t0) / (t1 - t0) if t1 > t0 else c1
    return samples[-1][1]


def step_records(run_dir):
    """Worker 0's step records from its metrics."""
    out = []
    with open(os.path.join(run_dir, "metrics", "worker-0.jsonl")) as f:
        for line in f:
            r = json.loads(line)
            if r.get("event") == "step":
                out.append(r)
    return out


def time_alone(config_path, repeats=3):
    """(median forward + backward ms of `repeats` downpour-time runs, model path, batch) of the job's
    net (its resolved config.toml), one engine thread."""
    import tomllib
    with open(config_path, "rb") as f:
        c = tomllib.load(f)
    if int(c["worker"].get("threads", 1)) != 1:
        sys.exit(f"job_cpu: --slowdown needs worker.threads = 1 (the job has {c['worker'].get('threads')}): "
                 "the compute is the main thread's CPU only then")
    model, batch = c["model"]["config"], int(c["worker"]["batch_size"])
    cmd = [os.path.join(ROOT, "build", "client", "engine", "downpour-time"), "--model", model, "--batch", str(batch),
           "--threads", "1", "--iterations", "2", "--json"]
    times = []
    for _ in range(repeats):
        d = json.loads(subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True).stdout)
        times.append(d["forward_ms"] + d["backward_ms"])
    times.sort()
    return times[len(times) // 2], times, model, batch


def write_slowdown(path, run_dir, by_thread, records, first, last, n):
    """The job's training-thread CPU a step against the net alone, per GB/s the worker moved."""
    # Worker processes' main threads that ran in the window (the launcher's short-lived
    # `downpour-worker --write-tensors` ended before it).
    mains = [(exe, samples) for (d, t), (exe, name, samples) in by_thread.items()
             if exe == "downpour-worker" and d.rsplit("/", 1)[1] == t.rsplit("/", 1)[1]
             and cpu_at(samples, last) - cpu_at(samples, first) > 0.01]
    if len(mains) != 1:
        sys.exit(f"job_cpu: --slowdown needs a job of one worker (found {len(mains)} worker processes' main threads)")
    job_ms = 1e3 * (cpu_at(mains[0][1], last) - cpu_at(mains[0][1], first)) / n
    window = [r for r in records if first < r["t"] <= last]
    moved = sum(r.get("tx_bytes", 0) + r.get("rx_bytes", 0) for r in window)
    gbytes = moved / (last - first) / 1e9
    alone_ms, times, model, batch = time_alone(os.path.join(run_dir, "config.toml"))
    if gbytes <= 0:
        sys.exit("job_cpu: the worker moved no bytes in the window (tx_bytes/rx_bytes in its step records)")
    slowdown = max(0.0, job_ms / alone_ms - 1) / gbytes
    result = {"slowdown_per_gbytes": slowdown, "job_main_thread_cpu_ms": job_ms, "alone_ms": alone_ms,
              "alone_repeats_ms": times, "worker_gbytes_per_s": gbytes, "model": model, "batch": batch,
              "steps": n, "run_dir": os.path.relpath(run_dir, ROOT),
              "source": "bench/scaling/job_cpu.py --slowdown (a one-worker job's training thread vs downpour-time)"}
    print(f"\ntraining thread {job_ms:.1f} ms of CPU a step in the job, {alone_ms:.1f} ms alone "
          f"(downpour-time: {', '.join(f'{t:.1f}' for t in times)}), ×{job_ms / alone_ms:.3f} while the worker "
          f"moved {gbytes:.3f} GB/s: {slowdown:.3f} more per GB/s")
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=os.path.join(ROOT, "configs", "runs", "alexnet.toml"))
    ap.add_argument("--steps", type=int, default=12, help="steps per worker (>= 4)")
    ap.add_argument("--work", default=os.path.join(ROOT, "runs", "job-cpu"))
    ap.add_argument("--set", action="append", default=[], help="more run-config settings (later ones win)")
    ap.add_argument("--threads", action="store_true", help="also each worker's and server's threads")
    ap.add_argument("--slowdown", metavar="FILE",
                    help="a one-worker job's training-thread CPU against the net alone, as JSON here")
    args = ap.parse_args()
    if args.steps < 4:
        sys.exit(f"job_cpu: --steps {args.steps}: must be >= 4 (the window starts after step 2)")
    os.makedirs(args.work, exist_ok=True)
    run_dir = os.path.join(args.work, f"steps-{args.steps}")
    series, by_thread = sample_job(args.config, args.steps, args.set, run_dir, args.threads or args.slowdown)
    records = step_records(run_dir)
    steps = [(r["step"], r["t"]) for r in records]
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
    if args.threads:
        # Per process: its threads' CPU a step, busiest first (threads idle in the window omitted).
        print()
        print("| process | pid | thread | tid | CPU s a step |")
        print("| --- | ---: | --- | ---: | ---: |")
        for (d, t), (exe, name, samples) in sorted(by_thread.items(),
                                                   key=lambda kv: (kv[1][0], int(kv[0][0].rsplit("/", 1)[1]),
                                                                   -(cpu_at(kv[1][2], last) - cpu_at(kv[1][2], first)))):
            cpu = (cpu_at(samples, last) - cpu_at(samples, first)) / n
            if cpu >= 0.0005:
                print(f"| {exe} | {d.rsplit('/', 1)[1]} | {name} | {t.rsplit('/', 1)[1]} | {cpu:.3f} |")
    if args.slowdown:
        write_slowdown(args.slowdown, run_dir, by_thread, records, first, last, n)


if __name__ == "__main__":
    main()
