#!/usr/bin/env python3
"""bench/faults/server_death.py — the wall time a real job loses when a server dies.

Runs the default job (configs/runs/default.toml: coordinator, 2 servers, 2 workers, async,
Fashion-MNIST) in interleaved pairs: undisturbed, then the same job with server 1 SIGKILLed once
worker 0 has logged --kill-at steps. The launcher restarts the dead server with --recover
(checkpoint + write-ahead log) and the workers ride through the outage. For each pair it prints
both wall times (the launcher's own, launch.jsonl "end"), the difference, the final top-1 of
each, the killed run's restart timeline from launch.jsonl ("died" -> "restart"), and worker 0's
longest step in each run (in the killed run: the outage a worker saw).

  bench/faults/server_death.py --build-dir build --pairs 3 --steps 800 --kill-at 400
  bench/faults/server_death.py ... --set checkpoint.wal=false     # the same without the log
  bench/faults/server_death.py --build-dir build --wal-pairs 3 --steps 800   # the log's cost, no kill

Needs the Fashion-MNIST LMDBs of scripts/get_fashion_mnist. Everything stays on 127.0.0.1.
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import time


def read_jsonl(path):
    out = []
    try:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line:
                    try:
                        out.append(json.loads(line))
                    except json.JSONDecodeError:
                        pass  # a line being written
    except FileNotFoundError:
        pass
    return out


def steps_of(run_dir, worker=0):
    return sum(1 for r in read_jsonl(f"{run_dir}/metrics/worker-{worker}.jsonl") if r.get("event") == "step")


def longest_step_gap(run_dir, first, last, worker=0):
    """The longest wall time between two consecutive steps of `worker` among steps first..last:
    around the kill, the outage it saw (the window keeps clear of evaluations, which also make
    long steps for worker 0)."""
    walls = {r["step"]: r["wall_s"] for r in read_jsonl(f"{run_dir}/metrics/worker-{worker}.jsonl")
             if r.get("event") == "step"}
    return max((walls[s] - walls[s - 1] for s in range(first + 1, last + 1) if s in walls and s - 1 in walls),
               default=0.0)


def final_top1(run_dir):
    """The run's final top-1: the evaluator process's (eval.evaluator, the default), else worker 0's."""
    for name in ("evaluator.jsonl", "worker-0.jsonl"):
        path = f"{run_dir}/metrics/{name}"
        if not os.path.exists(path):
            continue
        evals = [r for r in read_jsonl(path) if r.get("event") == "eval" and r.get("final")]
        if evals:
            return evals[-1]["top1"]
    return float("nan")


def launcher_seconds(run_dir):
    ends = [r for r in read_jsonl(f"{run_dir}/launch.jsonl") if r.get("event") == "end"]
    return ends[-1]["seconds"] if ends else None


def server_pid(launcher_pid, server_id):
    """The launcher's child running `downpour-server --id <server_id>`."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue
        if ppid != launcher_pid or not argv or not argv[0].endswith(b"downpour-server"):
            continue
        if b"--id" in argv and argv[argv.index(b"--id") + 1] == str(server_id).encode():
            return int(pid)
    return None


def run(args, run_dir, kill_at):
    cmd = [f"{args.build_dir}/server/downpour-launch", "--config", args.config, "--run-dir", run_dir,
           "--set", f"worker.steps={args.steps}"]
    for s in args.set:
        cmd += ["--set", s]
    log = open(run_dir + ".log", "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    killed = None
    deadline = time.time() + args.limit_s
    while proc.poll() is None and time.time() < deadline:
        if kill_at and killed is None and steps_of(run_dir) >= kill_at:
            pid = server_pid(proc.pid, 1)
            if pid:
                os.kill(pid, signal.SIGKILL)
                killed = time.time()
        time.sleep(0.05)
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        raise SystemExit(f"{run_dir}: did not finish in {args.limit_s} s")
    if proc.returncode != 0:
        raise SystemExit(f"{run_dir}: launcher exited {proc.returncode}; see {run_dir}.log")
    return killed


def timeline(run_dir):
    events = read_jsonl(f"{run_dir}/launch.jsonl")
    died = [e for e in events if e.get("event") == "died"]
    restart = [e for e in events if e.get("event") == "restart"]
    parts = []
    if died:
        parts.append(f"died at {died[0].get('seconds', float('nan')):.1f} s")
    if restart:
        parts.append(f"restarted at {restart[0].get('seconds', float('nan')):.1f} s")
    return ", ".join(parts) or "no died/restart events"


def wal_cost(args, stamp):
    """Undisturbed runs with checkpoint.wal off and on, alternating: the log's cost on a real job."""
    times = {"false": [], "true": []}
    for i in range(args.wal_pairs):
        for wal in (("false", "true") if i % 2 == 0 else ("true", "false")):
            run_dir = f"{args.out}-{stamp}/wal{i}-{wal}"
            os.makedirs(os.path.dirname(run_dir + "/x"), exist_ok=True)
            saved = list(args.set)
            args.set = saved + [f"checkpoint.wal={wal}"]
            run(args, run_dir, 0)
            args.set = saved
            times[wal].append(launcher_seconds(run_dir))
            print(f"wal pair {i}: checkpoint.wal={wal}: {times[wal][-1]:.1f} s (top-1 {final_top1(run_dir):.4f})",
                  flush=True)
    ratios = sorted(on / off for off, on in zip(times["false"], times["true"]))
    print(f"job wall time with the write-ahead log / without: median {ratios[len(ratios) // 2]:.3f}, "
          f"range {ratios[0]:.3f} .. {ratios[-1]:.3f} over {len(ratios)} pairs")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build-dir", default="build")
    p.add_argument("--config", default="configs/runs/default.toml")
    p.add_argument("--pairs", type=int, default=2)
    p.add_argument("--steps", type=int, default=800, help="worker.steps of every run")
    p.add_argument("--kill-at", type=int, default=400, help="worker 0's step at which server 1 is killed")
    p.add_argument("--out", default="runs/bench-server-death")
    p.add_argument("--set", action="append", default=[], help="extra --set for every run")
    p.add_argument("--limit-s", type=float, default=900)
    p.add_argument("--wal-pairs", type=int, default=0,
                   help="instead: this many undisturbed pairs with checkpoint.wal off and on (the log's cost)")
    args = p.parse_args()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    if args.wal_pairs:
        return wal_cost(args, stamp)
    rows = []
    for i in range(args.pairs):
        base = f"{args.out}-{stamp}/pair{i}"
        os.makedirs(os.path.dirname(base + "/x"), exist_ok=True)
        whole = base + "/undisturbed"
        killed = base + "/killed"
        run(args, whole, 0)
        run(args, killed, args.kill_at)
        w, k = launcher_seconds(whole), launcher_seconds(killed)
        window = (args.kill_at - 5, args.kill_at + 40)
        gap_w, gap_k = longest_step_gap(whole, *window), longest_step_gap(killed, *window)
        rows.append((w, k, final_top1(whole), final_top1(killed), timeline(killed), gap_w, gap_k))
        print(f"pair {i}: undisturbed {w:.1f} s (top-1 {rows[-1][2]:.4f}, longest step {gap_w:.2f} s), server 1 "
              f"killed at step {args.kill_at}: {k:.1f} s (top-1 {rows[-1][3]:.4f}, longest step {gap_k:.2f} s), "
              f"lost {k - w:+.1f} s; {rows[-1][4]}", flush=True)
    lost = sorted(k - w for w, k, *_ in rows)
    outage = sorted(r[6] for r in rows)
    print(f"time lost per server death: median {lost[len(lost) // 2]:+.1f} s, range {lost[0]:+.1f} .. {lost[-1]:+.1f} s "
          f"over {len(rows)} pairs (job wall time, killed - undisturbed)")
    print(f"worker 0's longest step in the killed runs (the outage it saw): median {outage[len(outage) // 2]:.2f} s, "
          f"range {outage[0]:.2f} .. {outage[-1]:.2f} s")


if __name__ == "__main__":
    sys.exit(main())
