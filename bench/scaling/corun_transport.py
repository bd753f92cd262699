#!/usr/bin/env python3
"""corun_transport.py — does a worker's compute take more CPU when the transport moves bytes on
the same host? (bench/RESULTS.md §11.5.4)

The scaling model charges a CPU worker's compute at `downpour-time`'s figure alone, whatever the
transport does beside it on the host. The copies of the transport (ZeroMQ's I/O threads, the
kernel's loopback TCP, the PS client's memcpy of pulled weights, the servers' update) share the
caches and memory bandwidth with the net's kernels, so they could slow it. This measures that
on its own, without a job (`bench/scaling/job_cpu.py --slowdown` measures it in one):

  1. `downpour-time --json` alone, `--repeats` times: the process's CPU per full step
     (step_cpu_ms), the median;
  2. the same while `downpour-bench-ps --servers S --workers 1` pushes and pulls AlexNet-sized
     rounds over loopback TCP beside it, flat out, `--repeats` times: its step_cpu_ms, and the
     bytes the loopback device sent meanwhile (/proc/net/dev) over the time downpour-time ran;
  3. slowdown per GB/s = (beside / alone − 1) / (the loopback's GB/s).

Prints the figures and writes them as one JSON object (--out).

    bench/scaling/corun_transport.py [--build build] [--model configs/models/alexnet_fashion.toml]
        [--batch 64] [--threads 1] [--servers 2] [--repeats 3] [--out FILE]
Needs a build (scripts/bootstrap); run it on a quiet machine.
"""
import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def loopback_tx_bytes():
    """Bytes the loopback device has sent (/proc/net/dev's 'lo' transmit column)."""
    with open("/proc/net/dev") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name.strip() == "lo":
                return int(rest.split()[8])
    sys.exit("corun_transport: no 'lo' device in /proc/net/dev")


def time_net(args):
    """(step_cpu_ms, step_ms, seconds the run took, loopback bytes sent meanwhile)."""
    cmd = [os.path.join(args.build, "client", "engine", "downpour-time"), "--model", args.model, "--batch",
           str(args.batch), "--threads", str(args.threads), "--iterations", str(args.iterations), "--json"]
    b0, t0 = loopback_tx_bytes(), time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    b1, t1 = loopback_tx_bytes(), time.monotonic()
    if r.returncode != 0:
        sys.exit(f"corun_transport: {' '.join(cmd)} failed: {r.stderr.strip()}")
    d = json.loads(r.stdout)
    if "step_cpu_ms" not in d:
        sys.exit("corun_transport: downpour-time --json has no step_cpu_ms (rebuild)")
    return d["step_cpu_ms"], d["step_ms"], t1 - t0, b1 - b0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--model", default=os.path.join(ROOT, "configs", "models", "alexnet_fashion.toml"))
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1, help="the worker's engine threads (worker.threads)")
    ap.add_argument("--iterations", type=int, default=3, help="downpour-time's timed steps")
    ap.add_argument("--servers", type=int, default=2, help="the load benchmark's shard servers")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--port", type=int, default=9850, help="the load benchmark's first loopback port")
    ap.add_argument("--out", help="write the result as JSON here")
    args = ap.parse_args()
    if args.repeats < 1 or args.iterations < 1 or args.servers < 1:
        sys.exit("corun_transport: --repeats, --iterations and --servers must be >= 1")

    alone, beside, rates = [], [], []
    for _ in range(args.repeats):
        cpu, wall, _, _ = time_net(args)
        alone.append(cpu)
        print(f"alone:  step {wall:.1f} ms, CPU {cpu:.1f} ms a step", flush=True)
    bench = [os.path.join(args.build, "bench", "ps", "downpour-bench-ps"), "--servers", str(args.servers),
             "--workers", "1", "--rounds", "100000", "--warmup", "0", "--port", str(args.port)]
    for _ in range(args.repeats):
        load = subprocess.Popen(bench, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
        try:
            # Its servers and workers start and the first rounds move before the timing begins.
            b0 = loopback_tx_bytes()
            for _ in range(300):
                time.sleep(0.1)
                if load.poll() is not None:
                    sys.exit(f"corun_transport: {' '.join(bench)} ended early (exit {load.returncode})")
                if loopback_tx_bytes() - b0 > 1e9:
                    break
            cpu, wall, seconds, sent = time_net(args)
        finally:
            load.send_signal(signal.SIGKILL)
            load.wait()
        beside.append(cpu)
        rates.append(sent / seconds / 1e9)
        print(f"beside: step {wall:.1f} ms, CPU {cpu:.1f} ms a step, loopback {rates[-1]:.3f} GB/s", flush=True)
    a, b, g = statistics.median(alone), statistics.median(beside), statistics.median(rates)
    if g <= 0:
        sys.exit("corun_transport: the load benchmark moved nothing over loopback")
    slowdown = max(0.0, b / a - 1) / g
    result = {"slowdown_per_gbytes": slowdown, "alone_step_cpu_ms": a, "beside_step_cpu_ms": b,
              "loopback_gbytes": g, "model": os.path.relpath(args.model, ROOT), "batch": args.batch,
              "threads": args.threads, "servers": args.servers, "repeats": args.repeats,
              "source": "bench/scaling/corun_transport.py"}
    print(f"compute CPU a step: alone {a:.1f} ms, beside the transport {b:.1f} ms (×{b / a:.3f}) at "
          f"{g:.3f} GB/s over loopback: {slowdown:.3f} more per GB/s")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
