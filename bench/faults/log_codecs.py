#!/usr/bin/env python3
"""bench/faults/log_codecs.py — what the servers' write-ahead log costs a job, per push codec:
pushes logged as the wire carried them (server/wal.h kCodedPush, the build) against the same
pushes logged as their f32 gradients (a second downpour-server, --dense-server, built with the
coded records switched off: how every server logged before).

For each repeat and each codec the two servers alternate on the same job (a run config, default
configs/runs/default.toml: 2 servers, 2 workers, async, the log on), --steps per worker. Per job:

  log MB/step   bytes both servers appended to their logs per worker step (server_end wal_bytes)
  log s         the servers' loops' time appending (wal_s, summed over the servers)
  loop s        the loops' busy time (busy_s, summed)
  rx MB/step    bytes the servers received per worker step (rx_bytes)
  img/s         sum over workers of batch / median step (steps 2..)
  wall s        the launcher's (launch.jsonl "end")
  top-1         the evaluator's final

  # the dense server: a worktree of this commit, HandlePush's `wire` argument set to nullptr,
  # `ninja -C build server/downpour-server` there
  bench/faults/log_codecs.py --build-dir build --dense-server /tmp/dense-log/build/server/downpour-server \\
      --steps 400 --repeats 2 --codecs fp32,fp16,factors,factors+fp16,topk,onebit --work runs/log-codecs

Needs the Fashion-MNIST LMDBs of scripts/get_fashion_mnist (or the run config's data). Every job
stays on 127.0.0.1; its checkpoints and logs are removed after it (a log holds GBs).
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))
from downpour_runs import read_jsonl  # noqa: E402  (a torn line skipped with a warning, like the tools)

# --set lists of each codec name (docs/config.md [compression]).
CODECS = {
    "fp32": ["compression.factors=false", "compression.push=fp32"],
    "fp16": ["compression.factors=false", "compression.push=fp16"],
    "factors": ["compression.factors=true", "compression.push=fp32"],
    "factors+fp16": ["compression.factors=true", "compression.push=fp16"],
    "topk": ["compression.factors=false", "compression.push=topk", "compression.top_k_fraction=0.01"],
    "onebit": ["compression.factors=false", "compression.push=onebit"],
}


def last(records, event):
    rows = [r for r in records if r.get("event") == event]
    return rows[-1] if rows else None


def job(args, label, server_cmd, codec, index, repeat):
    name = f"{codec.replace('+', '_')}-{label}-r{repeat + 1}"
    run = os.path.join(args.work, name)
    shutil.rmtree(run, ignore_errors=True)
    port = args.port + 20 * index
    cmd = [os.path.join(args.build_dir, "server", "downpour-launch"), "--config", args.config, "--run-dir", run,
           "--timeout-s", str(args.timeout_s),
           "--set", f"worker.steps={args.steps}", "--set", f"cluster.coordinator=127.0.0.1:{port}",
           "--set", f"cluster.base_port={port + 5}", "--set", "checkpoint.wal=true", "--set", "eval.every_steps=0"]
    for s in CODECS[codec] + args.set:
        cmd += ["--set", s]
    if server_cmd:
        cmd += ["--server-cmd", server_cmd]
    with open(run + ".log", "w") as f:
        r = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT)
    if r.returncode != 0:
        sys.exit(f"log_codecs: {name} failed (exit {r.returncode}); see {run}.log")
    metrics = os.path.join(run, "metrics")
    ends = [last(read_jsonl(os.path.join(metrics, n)), "server_end") for n in sorted(os.listdir(metrics))
            if n.startswith("server-")]
    if any(e is None or "wal_bytes" not in e for e in ends):
        sys.exit(f"log_codecs: {name}: a server wrote no server_end with wal_bytes (an older downpour-server?)")
    workers = [read_jsonl(os.path.join(metrics, n)) for n in sorted(os.listdir(metrics)) if n.startswith("worker-")]
    steps = sum(1 for w in workers for r in w if r.get("event") == "step")
    rate = 0.0
    for w in workers:
        ms = [r["step_ms"] for r in w if r.get("event") == "step" and r.get("step", 0) >= 2]
        batch = next((r.get("batch_size") for r in w if r.get("event") == "start"), None) or args.batch
        if ms:
            rate += batch * 1000.0 / statistics.median(ms)
    end = last(read_jsonl(os.path.join(run, "launch.jsonl")), "end")
    final = last(read_jsonl(os.path.join(metrics, "evaluator.jsonl")), "done")
    for folder, _, names in os.walk(run):
        for n in names:
            if n.endswith((".wal", ".dpt")):
                os.remove(os.path.join(folder, n))
    return {
        "codec": codec, "log": label, "repeat": repeat + 1,
        "log_mb_per_step": sum(e["wal_bytes"] for e in ends) / 1e6 / steps,
        "log_s": sum(e["wal_s"] for e in ends),
        "loop_s": sum(e["busy_s"] for e in ends),
        "rx_mb_per_step": sum(e["rx_bytes"] for e in ends) / 1e6 / steps,
        "coded": sum(e["wal_coded_records"] for e in ends), "records": sum(e["wal_records"] for e in ends),
        "images_per_s": rate,
        "wall_s": end.get("seconds") if end else None,
        "top1": final.get("final_top1") if final else None,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build-dir", default=os.path.join(ROOT, "build"))
    ap.add_argument("--dense-server", required=True,
                    help="a downpour-server that logs every push as its f32 gradient (see the docstring)")
    ap.add_argument("--config", default=os.path.join(ROOT, "configs", "runs", "default.toml"))
    ap.add_argument("--codecs", default="fp32,fp16,factors,factors+fp16,topk,onebit")
    ap.add_argument("--steps", type=int, default=400, help="per worker")
    ap.add_argument("--batch", type=int, default=64, help="the run's worker.batch_size, if its start record lacks it")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--set", action="append", default=[], help="another --set for every job")
    ap.add_argument("--work", default=os.path.join(ROOT, "runs", "log-codecs"))
    ap.add_argument("--port", type=int, default=8600)
    ap.add_argument("--timeout-s", type=int, default=1800)
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()
    codecs = args.codecs.split(",")
    for c in codecs:
        if c not in CODECS:
            sys.exit(f"log_codecs: --codecs: unknown codec {c!r} (known: {', '.join(CODECS)})")
    if args.steps < 3 or args.repeats < 1:
        sys.exit("log_codecs: --steps must be >= 3 and --repeats >= 1")
    if not os.access(args.dense_server, os.X_OK):
        sys.exit(f"log_codecs: --dense-server {args.dense_server}: not an executable")
    os.makedirs(args.work, exist_ok=True)
    rows = []
    index = 0
    print("| codec | log | log MB/step | log s | loop s | rx MB/step | coded records | img/s | wall s | top-1 |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for repeat in range(args.repeats):
        for codec in codecs:
            order = [("as sent", None), ("f32", args.dense_server)]
            if (repeat + index) % 2:
                order.reverse()
            for label, server in order:
                r = job(args, label, server, codec, index, repeat)
                index += 1
                rows.append(r)
                top1 = f"{r['top1']:.4f}" if r["top1"] is not None else "—"
                wall = f"{r['wall_s']:.1f}" if r["wall_s"] is not None else "—"
                print(f"| {codec} | {label} | {r['log_mb_per_step']:.3f} | {r['log_s']:.2f} | {r['loop_s']:.2f} | "
                      f"{r['rx_mb_per_step']:.3f} | {r['coded']}/{r['records']} | {r['images_per_s']:.0f} | {wall} | "
                      f"{top1} |", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
