#!/usr/bin/env python3
"""overlap_alexnet.py — AlexNet (CPU workers, batch 64) step-time breakdown with the pull
overlapped with compute (the default in async runs), without it (downpour-worker --no-overlap),
and with one more step of pushes outstanding (worker.outstanding_steps = 2: a step computes
without waiting for its predecessor's round trip), for S servers × 1 worker, from a build tree.

    bench/train/overlap_alexnet.py [--build build] [--servers 1,2] [--steps 15] [--threads 2] [--rounds 1]
                                   [--modes overlap,blocking] [--link-gbps G]
                                   [--inflight-mb M[,M...]]

Modes: blocking (--no-overlap), overlap (outstanding_steps = 1, the default), lag1
(outstanding_steps = 2), layer and layer-lag1 (the same two with cluster.send_order = "layer" and
cluster.inflight_mb = --inflight-mb: the parts the next forward reads first overtake; several
windows run each layer mode once per window, named -<M>mb, in one grid on one dataset). With
--link-gbps every process paces what it sends (cluster.link_gbps, docs/emulated_links.md), and
the table adds the link's time for the step's bytes, link ms = max(pushed bytes, the most pulled
from one server) / rate, and step / max(compute, link): the share of the step that neither
compute nor the link explains.

Makes a small synthetic 256×256 colour LMDB first (PNG files written here with the standard
library, converted by downpour-data convert-folder; random crops of 227 feed AlexNet), then per
(servers, overlap) runs one async job with downpour-launch, summarizes it with
tools/downpour-summarize and prints the worker's medians: step, compute, pull wait, push wait,
loader, comm, and the overlap ratio step / max(compute, comm) (docs/operations.md). The first
step of each run is left out of the medians (cold kernels, a blocking whole pull).

Runs go to --work (default /tmp/downpour-overlap-bench, recreated). Exits non-zero when a run
fails. Timing on a shared 2-core machine is noisy: the server's update competes with the
worker's compute for the cores.
"""
import argparse
import json
import os
import random
import shutil
import struct
import subprocess
import sys
import zlib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def write_png(path, width, height, rgb):
    """8-bit RGB PNG from a bytes object of height rows × width × 3."""
    def chunk(kind, data):
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body) & 0xFFFFFFFF)
    rows = b"".join(b"\x00" + rgb[y * width * 3:(y + 1) * width * 3] for y in range(height))
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n")
        f.write(chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)))
        f.write(chunk(b"IDAT", zlib.compress(rows, 1)))
        f.write(chunk(b"IEND", b""))


def make_dataset(work, build, images, classes):
    """images random 256×256 PNGs with random labels → work/train_lmdb (raw BGR records)."""
    folder = os.path.join(work, "images")
    os.makedirs(folder)
    rng = random.Random(7)
    lines = []
    for i in range(images):
        name = f"img{i:04d}.png"
        # Smooth random colour blobs: cheap, and not constant (crops and mirrors differ).
        base = [rng.randrange(256) for _ in range(3)]
        row = bytes((base[c] + (x * (c + 1)) // 4) % 256 for x in range(256) for c in range(3))
        rgb = b"".join(row[(y % 64) * 3:] + row[:(y % 64) * 3] for y in range(256))
        write_png(os.path.join(folder, name), 256, 256, rgb)
        lines.append(f"{name} {rng.randrange(classes)}\n")
    with open(os.path.join(work, "list.txt"), "w") as f:
        f.writelines(lines)
    out = os.path.join(work, "train_lmdb")
    cmd = [os.path.join(build, "data", "downpour-data"), "convert-folder", "--root", folder, "--list",
           os.path.join(work, "list.txt"), "--out", out, "--resize", "256"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return out


CONFIG = """[run]
name = "overlap-alexnet"
out_dir = "{work}"
seed = 1

[model]
config = "{root}/configs/models/alexnet.toml"

[cluster]
servers = {servers}
workers = 1
coordinator = "127.0.0.1:{port}"
base_port = {base_port}
bind = "127.0.0.1"
{link}
[solver]
base_lr = 0.001
lr_policy = "fixed"
momentum = 0.9
weight_decay = 0.0005

[consistency]
mode = "async"

[worker]
batch_size = {batch}
steps = {steps}
pull_every = 1
push_every = 1
outstanding_steps = {outstanding}
device = "cpu"
threads = {threads}

[data]
train = "{train}"
test = ""
crop = 227
mirror = true
scale = 0.00390625

[eval]
every_steps = 0
at_start = false

[checkpoint]
every_updates = 0
"""

FIELDS = ["step_ms", "compute_ms", "pull_wait_ms", "push_wait_ms", "loader_wait_ms", "comm_ms"]


# overlap, outstanding_steps, cluster.send_order ("layer" with cluster.inflight_mb = --inflight-mb)
MODES = {"overlap": (True, 1, "call"), "blocking": (False, 1, "call"), "lag1": (True, 2, "call"),
         "layer": (True, 1, "layer"), "layer-lag1": (True, 2, "layer")}


def run_one(args, work, train, servers, mode, window, index, round_no):
    overlap, outstanding, order = MODES[mode]
    cluster = [f"link_gbps = {args.link_gbps}"] if args.link_gbps else []
    if order == "layer":
        cluster += ['send_order = "layer"', f"inflight_mb = {window}"]
    name = (f"s{servers}-{mode}" + (f"-{window}mb" if order == "layer" and len(args.windows) > 1 else "")
            + (f"-r{round_no}" if args.rounds > 1 else ""))
    run_dir = os.path.join(work, name)
    config = os.path.join(work, name + ".toml")
    with open(config, "w") as f:
        f.write(CONFIG.format(work=work, root=ROOT, servers=servers, port=7555 + 10 * index,
                              base_port=7600 + 10 * index, batch=args.batch, steps=args.steps,
                              threads=args.threads, train=train, outstanding=outstanding,
                              link="".join(line + "\n" for line in cluster)))
    # The tensor list the servers serve, from the worker's own model (a --worker-cmd stand-in is
    # not asked for it by the launcher).
    tensors = os.path.join(work, name + ".tensors.txt")
    subprocess.run([os.path.join(args.build, "client", "worker", "downpour-worker"), "--config", config,
                    "--write-tensors", tensors], check=True, stdout=subprocess.DEVNULL)
    cmd = [os.path.join(args.build, "server", "downpour-launch"), "--config", config, "--run-dir", run_dir,
           "--tensors", tensors, "--timeout-s", str(args.timeout_s)]
    if not overlap:
        cmd += ["--worker-cmd", os.path.join(args.build, "client", "worker", "downpour-worker") + " --no-overlap"]
    log = os.path.join(work, name + ".log")
    with open(log, "w") as f:
        r = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT)
    if r.returncode != 0:
        sys.exit(f"overlap_alexnet: {name} failed (exit {r.returncode}); see {log}")
    s = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "downpour-summarize"), run_dir],
                       capture_output=True, text=True, check=True)
    with open(os.path.join(run_dir, "summary.json")) as f:
        summary = json.load(f)
    row = summary["step_breakdown"][0]
    row["link_ms"] = None
    if args.link_gbps:
        # What the link needs for a step's bytes: the worker's egress carries every push, each
        # server's the pulls of its chunks (the larger share bounds).
        per_server = pulled_per_server(run_dir, servers)
        push = summary["push_bytes_per_step"] or 0
        row["link_ms"] = 1e3 * max(push, per_server) * 8 / (args.link_gbps * 1e9)
    return name, row, s.stdout


def pulled_per_server(run_dir, servers):
    """The most pull bytes one server sent per worker step (the servers' tx_bytes over the steps)."""
    worst = 0.0
    steps = 0
    with open(os.path.join(run_dir, "metrics", "worker-0.jsonl")) as f:
        steps = sum(1 for line in f if '"step_ms"' in line)
    for s in range(servers):
        path = os.path.join(run_dir, "metrics", f"server-{s}.jsonl")
        tx = 0
        with open(path) as f:
            for line in f:
                r = json.loads(line)
                if r.get("tx_bytes") is not None:
                    tx = max(tx, r["tx_bytes"])
        worst = max(worst, tx / max(1, steps))
    return worst


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"), help="build tree (default ./build)")
    ap.add_argument("--work", default="/tmp/downpour-overlap-bench", help="scratch folder (recreated)")
    ap.add_argument("--servers", default="1,2", help="server counts, comma-separated (default 1,2)")
    ap.add_argument("--steps", type=int, default=15, help="steps per run (default 15)")
    ap.add_argument("--batch", type=int, default=64, help="batch size (default 64)")
    ap.add_argument("--threads", type=int, default=2, help="worker compute threads (default 2)")
    ap.add_argument("--images", type=int, default=128, help="synthetic training images (default 128)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="repeat the whole grid, interleaved, so both modes see the same load drift (default 1)")
    ap.add_argument("--timeout-s", type=int, default=900, help="per run (default 900)")
    ap.add_argument("--modes", default="overlap,blocking",
                    help="comma-separated, from " + ", ".join(MODES) + " (default overlap,blocking)")
    ap.add_argument("--link-gbps", type=float, default=0, help="emulated link rate (default: none)")
    ap.add_argument("--inflight-mb", default="16",
                    help="cluster.inflight_mb of the layer modes, MiB; a comma-separated list runs each layer "
                         "mode once per window (default 16; the others keep 128)")
    args = ap.parse_args()
    try:
        args.windows = [int(x) for x in args.inflight_mb.split(",")]
    except ValueError:
        sys.exit(f"overlap_alexnet: --inflight-mb {args.inflight_mb!r}: expected MiB, comma-separated")
    if any(not 1 <= w <= 4096 for w in args.windows):
        sys.exit(f"overlap_alexnet: --inflight-mb {args.inflight_mb}: each must be in 1..4096 (cluster.inflight_mb)")
    for mode in args.modes.split(","):
        if mode not in MODES:
            sys.exit(f"overlap_alexnet: --modes: unknown mode {mode!r} (known: {', '.join(MODES)})")
    args.build = os.path.abspath(args.build)
    shutil.rmtree(args.work, ignore_errors=True)
    os.makedirs(args.work)
    train = make_dataset(args.work, args.build, args.images, 1000)
    rows = []
    index = 0
    for round_no in range(1, args.rounds + 1):
        for servers in [int(x) for x in args.servers.split(",")]:
            for mode in args.modes.split(","):
                for window in (args.windows if MODES[mode][2] == "layer" else [None]):
                    name, row, text = run_one(args, args.work, train, servers, mode, window, index, round_no)
                    index += 1
                    print(text, end="", flush=True)
                    rows.append((name, row))
    print()
    print("| run | steps | step ms | compute ms | pull wait ms | push wait ms | loader ms | comm ms "
          "| step / max(compute, comm) | link ms | step / max(compute, link) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, row in rows:
        cells = [f"{row[k]:.0f}" if row[k] is not None else "—" for k in FIELDS]
        ratio = f"{row['overlap_ratio']:.3f}" if row["overlap_ratio"] is not None else "—"
        link = row["link_ms"]
        link_cells = (f"{link:.0f} | {row['step_ms'] / max(row['compute_ms'], link):.3f}" if link else "— | —")
        print(f"| {name} | {row['steps']} | " + " | ".join(cells) + f" | {ratio} | {link_cells} |")


if __name__ == "__main__":
    main()
