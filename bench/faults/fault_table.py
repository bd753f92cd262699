#!/usr/bin/env python3
"""bench/faults/fault_table.py — the fault table: a real job across hosts made of network
namespaces (scripts/netns-cluster), disturbed one way per row, each checked afterwards.

For each mode (async, sync) it runs the undisturbed job --baseline times (the run-to-run spread),
then one job per (role, fault):

  roles   server 1, worker 1, the coordinator (each on a host of its own)
  faults  short cut: the host's link down for --short-s (less than the 2 s heartbeat timeout)
          long cut:  down for --long-s (past the timeout: a worker is declared dead)
          freeze:    the role's process SIGSTOPped for --long-s, then SIGCONTed

injected once the faulted worker (worker 1 for its own rows, else worker 0) has taken
--at of its steps. Each row records every task's exit code, whether any was still running at
--limit-s (a process left waiting on a run that is over), the wall time against the undisturbed
median, the final top-1 against the undisturbed runs, and downpour-history's verdict on the kept
history (checkpoint.history): acknowledged pushes lost, pushes applied twice, and whether each
server's last checkpoint equals the replay of its log.

  bench/faults/fault_table.py --build-dir build --out bench/faults/table-2026-12-06

Writes OUT/rows.json and OUT/table.md (the table bench/RESULTS.md shows). Needs root (namespaces)
and the Fashion-MNIST IDX files of tests (/usr/share/datasets/fashion-mnist). ~10 minutes on 2 cores;
each job's run directory (its kept history, ~3 GB) is removed once its row is written.
"""
import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "cluster"))
import netns_job as nj  # noqa: E402

ROLES = ["server 1", "worker 1", "coordinator"]
FAULTS = ["short cut", "long cut", "freeze"]


def final_top1(run_dir):
    evals = nj.metrics(run_dir, "evaluator", "eval")
    finals = [e for e in evals if e.get("final")]
    return finals[-1]["top1"] if finals else None


def history(build_dir, run_dir, out):
    r, report = nj.fab.history_report(build_dir, run_dir, out)
    return r.returncode, report, (r.stdout + r.stderr).strip().splitlines()[-1:]


def run_one(a, prefix, subnet, keys, tmp, mode, seed, role=None, fault=None):
    name = f"{mode}-{role or 'none'}-{fault or 'none'}-{seed}".replace(" ", "_")
    base = os.path.join(tmp, name)
    os.makedirs(base)
    config = nj.job_config(os.path.join(base, "job.toml"), subnet, keys, steps=a.steps, mode=mode, history=True,
                           checkpoint_every=a.checkpoint_every, seed=seed, whole_test_set=True,
                           cluster_extra=f"restart_workers = {a.restart_workers}\n" if a.restart_workers else "")
    run_dir = os.path.join(base, "run")
    job = nj.Job(a.build_dir, prefix, subnet, config, run_dir, base)
    row = {"mode": mode, "role": role, "fault": fault, "seed": seed}
    try:
        job.start()
        if role:
            watch = 1 if role == "worker 1" else 0
            if not job.wait_steps(watch, int(a.at * a.steps), limit_s=120):
                raise RuntimeError(f"worker {watch} never reached step {int(a.at * a.steps)}:\n{job.output()}")
            row["fault_at_s"] = round(time.monotonic() - job.started_at, 2)
            if fault == "short cut":
                job.cut(role, a.short_s)
            elif fault == "long cut":
                job.cut(role, a.long_s)
            else:
                job.freeze(role, a.long_s)
        codes = job.wait_all(a.limit_s)
        end = time.monotonic()
        row["wall_s"] = round(end - job.started_at, 2)
        if role:
            row["after_heal_s"] = round(end - job.healed_at, 2)
        row["codes"] = {r: c for r, c in codes.items()}
        row["left_waiting"] = [r for r, c in codes.items() if c is None]
    finally:
        job.kill_all()
    row["top1"] = final_top1(run_dir)
    row["steps"] = {w: (nj.metrics(run_dir, f"worker-{w}", "done") or [{}])[-1].get("steps") for w in (0, 1)}
    text = job.output()
    row["declared_dead"] = [line.split("coordinator: ", 1)[1].split(" silent")[0]
                            for line in text.splitlines() if "silent for more than" in line and "declared dead" in line]
    code, report, last = history(a.build_dir, run_dir, os.path.join(base, "history.json"))
    row["history_exit"] = code
    row["history_line"] = last[0] if last else ""
    if report:
        row["lost"] = sum(w["lost"] for w in report["workers"])
        row["applied_twice"] = sum(w["applied_twice"] for w in report["workers"])
        row["acked"] = sum(w["acked"] for w in report["workers"])
        row["applied_unacked"] = sum(w["applied_unacked"] for w in report["workers"])
        row["replay_equal"] = sum(1 for s in report["servers"] if s["equal"])
        row["servers"] = len(report["servers"])
    # A kept history is large (every push of the run: about 3 GB for this job): only the report stays.
    shutil.rmtree(run_dir, ignore_errors=True)
    print(json.dumps(row), flush=True)
    return row


def fmt_codes(codes):
    vals = list(codes.values())
    if all(c == 0 for c in vals):
        return "0 (all 5)"
    return ", ".join(f"{r}: {c}" for r, c in codes.items() if c != 0)


def table(rows, a):
    out = ["| mode | role | fault | exit codes | left waiting | wall s (× undisturbed) | top-1 (Δ vs undisturbed mean) "
           "| worker steps 0 / 1 | declared dead | history: lost / twice / replay = checkpoint |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for mode in a.modes:
        base = [r for r in rows if r["mode"] == mode and not r["role"]]
        walls = [r["wall_s"] for r in base]
        tops = [r["top1"] for r in base if r["top1"] is not None]
        wall_med = statistics.median(walls)
        top_mean = statistics.mean(tops)
        spread = f"{100 * min(tops):.2f}–{100 * max(tops):.2f}%"
        for r in rows:
            if r["mode"] != mode:
                continue
            undisturbed = not r["role"]
            top = "—" if r["top1"] is None else f"{100 * r['top1']:.2f}%"
            if undisturbed:
                top += f" (of {spread})"
            elif r["top1"] is not None:
                top += f" ({100 * (r['top1'] - top_mean):+.2f})"
            hist = (f"{r.get('lost', '?')} / {r.get('applied_twice', '?')} / {r.get('replay_equal', '?')} of "
                    f"{r.get('servers', '?')}" + ("" if r["history_exit"] == 0 else f" (exit {r['history_exit']})"))
            what = r["fault"] or f"seed {r['seed']}"
            out.append(f"| {mode} | {r['role'] or 'undisturbed'} | {what} | "
                       f"{fmt_codes(r['codes'])} | {', '.join(r['left_waiting']) or 'none'} | "
                       f"{r['wall_s']:.1f} ({r['wall_s'] / wall_med:.2f}×) | {top} | "
                       f"{r['steps'][0]} / {r['steps'][1]} | {', '.join(r['declared_dead']) or 'nobody'} | {hist} |")
    return "\n".join(out) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build-dir", default="build")
    p.add_argument("--out", required=True)
    p.add_argument("--modes", default="async,sync")
    p.add_argument("--baseline", type=int, default=3, help="undisturbed runs per mode")
    p.add_argument("--steps", type=int, default=600, help="steps per worker")
    p.add_argument("--at", type=float, default=0.2, help="the fault comes at this fraction of the steps")
    p.add_argument("--short-s", type=float, default=1.0)
    p.add_argument("--long-s", type=float, default=4.0)
    p.add_argument("--checkpoint-every", type=int, default=100)
    p.add_argument("--limit-s", type=float, default=180)
    p.add_argument("--restart-workers", type=int, default=0,
                   help="cluster.restart_workers: a worker put out of the run is restarted with --resume")
    p.add_argument("--roles", default=",".join(ROLES))
    p.add_argument("--faults", default=",".join(FAULTS))
    a = p.parse_args()
    a.modes = a.modes.split(",")
    a.roles = a.roles.split(",")
    a.faults = a.faults.split(",")
    a.build_dir = os.path.abspath(a.build_dir)
    why = nj.can_run()
    if why:
        sys.exit(f"fault_table: {why}")
    os.makedirs(a.out, exist_ok=True)
    prefix = f"dpf{os.getpid() % 1000}"
    subnet = nj.free_subnet()
    rows = []
    with tempfile.TemporaryDirectory(prefix="downpour-faults-") as tmp:
        nj.script("down", "--prefix", prefix)
        r = nj.script("up", str(len(nj.HOSTS)), "--prefix", prefix, "--subnet", subnet)
        if r.returncode != 0:
            sys.exit(r.stderr.strip())
        try:
            keys = nj.make_keys(a.build_dir, tmp)
            for mode in a.modes:
                for seed in range(1, a.baseline + 1):
                    rows.append(run_one(a, prefix, subnet, keys, tmp, mode, seed))
                for role in a.roles:
                    for fault in a.faults:
                        rows.append(run_one(a, prefix, subnet, keys, tmp, mode, 1, role, fault))
        finally:
            nj.script("down", "--prefix", prefix)
    with open(os.path.join(a.out, "rows.json"), "w") as f:
        json.dump({"args": {k: v for k, v in vars(a).items()}, "rows": rows}, f, indent=1)
    text = table(rows, a)
    with open(os.path.join(a.out, "table.md"), "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
