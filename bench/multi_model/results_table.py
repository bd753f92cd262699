#!/usr/bin/env python3
"""bench/multi_model/results_table.py [EXPERIMENT_DIR] — the tables of bench/RESULTS.md section 13
from a run of configs/experiments/multi_model.toml (default runs/experiments/multi_model): per net
and scheme the wall time, the training time, the bytes moved (model payload pulled and pushed;
data read from partitions that were not the reader's own), every byte on the workers' wire, and
each model's final top-1; then the ratios the issue asks about. Reads each run's summary.json
(downpour-experiment writes them) and its workers' metrics."""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
import downpour_runs as dr  # noqa: E402

NETS = ["compact", "small"]
# sequential-sync: baseline (a) in sync at the models' own 64-image batch (4 workers x 16 images a round)
SCHEMES = ["pipeline", "sequential", "sequential-sync", "independent"]


def model_floats(run_dir, k):
    with open(os.path.join(run_dir, f"tensors-model-{k}.txt")) as f:
        total = 0
        for line in f:
            if line.strip() and not line.startswith("#"):
                n = 1
                for d in line.split()[1].split("x"):
                    n *= int(d)
                total += n
        return total


def run_numbers(run_dir):
    with open(os.path.join(run_dir, "summary.json")) as f:
        s = json.load(f)
    _, files = dr.load_run([run_dir])
    workers = dr.worker_files(files)
    dones = [r for w in workers for _, r in w.records("done")]
    mm = s["multi_model"]
    model_bytes = mm["model_bytes"]
    if mm["scheme"] == "sequential":  # (both sequential runs)
        # A data-parallel step pulls and pushes a whole model (f32). Counted from the steps, as the
        # worker now records it: this experiment's first run recorded the wire counters, which do
        # not see same-host shared memory.
        stages = [r for w in workers for _, r in w.records("stage")]
        model_bytes = sum(2 * r["steps"] * 4 * model_floats(run_dir, r["model"]) for r in stages)
    return {
        "wall_s": max(d["wall_s"] for d in dones),  # the slowest worker's stages (the run's training span)
        "train_s": max(d["train_s"] for d in dones),
        "launch_s": s.get("launch_wall_s"),
        "model_bytes": model_bytes,
        "data_bytes": mm["data_bytes_moved"],
        "wire_bytes": sum((d.get("tx_bytes_total") or 0) + (d.get("rx_bytes_total") or 0) for d in dones),
        "top1": {r["name"]: r["top1"] for r in mm["leaderboard"]},
        "wait_s": mm["wait_s"],
    }


def main():
    exp = sys.argv[1] if len(sys.argv) > 1 else "runs/experiments/multi_model"
    for net in NETS:
        rows = {}
        for scheme in SCHEMES:
            d = os.path.join(exp, f"{net}-{scheme}")
            if os.path.exists(os.path.join(d, "summary.json")):
                rows[scheme] = run_numbers(d)
        if not rows:
            continue
        names = sorted(next(iter(rows.values()))["top1"], key=lambda n: float(n.split("=")[1]))
        print(f"\n### {net}\n")
        print("| scheme | wall s (slowest worker) | training s | launcher s | model bytes moved | data bytes moved | "
              "moved in all | worker wire bytes | " + " | ".join(f"top-1 {n}" for n in names) + " |")
        print("| --- " * (8 + len(names)) + "|")
        for scheme, r in rows.items():
            moved = r["model_bytes"] + r["data_bytes"]
            print(f"| {scheme} | {r['wall_s']:.0f} | {r['train_s']:.0f} | {dr.fmt(r['launch_s'], '.0f')} | "
                  f"{r['model_bytes'] / 1e6:.1f} MB | {r['data_bytes'] / 1e6:.1f} MB | {moved / 1e6:.1f} MB | "
                  f"{r['wire_bytes'] / 1e6:.1f} MB | " + " | ".join(f"{100 * r['top1'][n]:.2f}%" for n in names) + " |")
        if "pipeline" in rows:
            p = rows["pipeline"]
            moved_p = p["model_bytes"] + p["data_bytes"]
            for base in ("independent", "sequential", "sequential-sync"):
                if base in rows:
                    b = rows[base]
                    moved_b = b["model_bytes"] + b["data_bytes"]
                    print(f"\npipeline vs {base}: {moved_b / moved_p:.1f}x fewer bytes moved, wall time "
                          f"{p['wall_s'] / b['wall_s']:.2f}x, top-1 differences (points): " +
                          ", ".join(f"{n} {100 * (p['top1'][n] - b['top1'][n]):+.2f}" for n in names))


if __name__ == "__main__":
    main()
