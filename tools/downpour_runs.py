"""downpour_runs — read a run directory (config.toml, metrics/*.jsonl) into one summary.

Used by tools/downpour-summarize, tools/downpour-compare and tools/downpour-experiment.
A run directory holds (DESIGN.md "Runs"): config.toml, logs/, metrics/<role>-<id>.jsonl
(one JSON object per line: t, role, id, event, fields), model_final.dpt, summary.json.
"""
import glob
import json
import os
import tomllib

TARGET_TOP1 = 0.89  # the Fashion-MNIST accuracy the default job must reach


def read_jsonl(path):
    records = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise SystemExit(f"{path}:{n}: not a JSON object: {e}")
    return records


def load_run(run_dir):
    """Returns (config dict, list of metric records of every process, sorted by time)."""
    config_path = os.path.join(run_dir, "config.toml")
    if not os.path.exists(config_path):
        raise SystemExit(f"{run_dir}: no config.toml (not a run directory)")
    with open(config_path, "rb") as f:
        config = tomllib.load(f)
    records = []
    for path in sorted(glob.glob(os.path.join(run_dir, "metrics", "*.jsonl"))):
        records += read_jsonl(path)
    if not records:
        raise SystemExit(f"{run_dir}: no metrics/*.jsonl records")
    records.sort(key=lambda r: r.get("t", 0))
    return config, records


def summarize(run_dir):
    config, records = load_run(run_dir)
    starts = [r for r in records if r.get("event") == "start" and r.get("role") == "worker"]
    dones = [r for r in records if r.get("event") == "done" and r.get("role") == "worker"]
    # Servers log every pull they serve: how far ahead of the slowest worker the puller was, and
    # how long the consistency policy held the pull back.
    pulls = [r for r in records if r.get("event") == "pull" and r.get("role") == "server"]
    aheads = [r["ahead"] for r in pulls if r.get("ahead") is not None]
    waits = [r.get("wait_ms") or 0 for r in pulls]
    evals = [r for r in records if r.get("event") == "eval"]
    t0 = min(r["t"] for r in starts) if starts else records[0]["t"]
    t_end = max(r["t"] for r in dones) if dones else records[-1]["t"]
    final = [e for e in evals if e.get("final")]
    final = final[-1] if final else (evals[-1] if evals else None)
    reached = [e for e in evals if (e.get("top1") or 0) >= TARGET_TOP1]

    # Servers' own staleness counters: each worker asks every server at its end; the most
    # complete answer per server (most chunk updates) is the run's.
    per_server = {}
    for r in records:
        if r.get("event") == "server_stats" and r.get("ok"):
            s = r["server"]
            if s not in per_server or r["chunk_updates"] >= per_server[s]["chunk_updates"]:
                per_server[s] = r
    hist = []
    for r in per_server.values():
        h = json.loads(r["staleness_histogram"]) if isinstance(r["staleness_histogram"], str) else r["staleness_histogram"]
        hist = [a + b for a, b in zip(hist + [0] * (len(h) - len(hist)), h + [0] * (len(hist) - len(h)))]
    updates = sum(hist) if hist else 0
    stale_sum = sum(r["staleness_sum"] for r in per_server.values())

    consistency = config.get("consistency", {})
    cluster = config.get("cluster", {})
    worker = config.get("worker", {})
    summary = {
        "run_dir": os.path.abspath(run_dir),
        "name": config.get("run", {}).get("name", ""),
        "mode": consistency.get("mode", "async"),
        "servers": cluster.get("servers"),
        "workers": cluster.get("workers"),
        "batch_size": worker.get("batch_size"),
        "wall_s": t_end - t0,
        "steps": sum(d.get("steps", 0) for d in dones),
        "images": sum(d.get("images", 0) for d in dones),
        # Aggregate training throughput: every worker's images over its own training time.
        "images_per_s": sum(d.get("images_per_s", 0) or 0 for d in dones),
        "workers_done": len(dones),
        "final_top1": final.get("top1") if final else None,
        "final_top5": final.get("top5") if final else None,
        "final_test_loss": final.get("test_loss") if final else None,
        "final_epoch": final.get("epoch") if final else None,
        "target_top1": TARGET_TOP1,
        "time_to_target_s": (reached[0]["t"] - t0) if reached else None,
        "epochs_to_target": reached[0].get("epoch") if reached else None,
        "staleness_mean": (stale_sum / updates) if updates else None,
        "staleness_max": max((r["staleness_max"] for r in per_server.values()), default=None),
        "staleness_histogram": hist,
        "pulls_logged": len(pulls),
        "clock_ahead_max": max(aheads) if aheads else None,
        "pull_wait_ms_mean": (sum(waits) / len(waits)) if waits else None,
        "evals": [{"wall_s": e["t"] - t0, "epoch": e.get("epoch"), "step": e.get("step"), "top1": e.get("top1"),
                   "top5": e.get("top5"), "test_loss": e.get("test_loss"), "server_versions": e.get("server_versions")}
                  for e in evals],
    }
    return summary


def write_summary(run_dir):
    s = summarize(run_dir)
    with open(os.path.join(run_dir, "summary.json"), "w") as f:
        json.dump(s, f, indent=1)
    return s


def fmt(v, spec, none="—"):
    return none if v is None else format(v, spec)
