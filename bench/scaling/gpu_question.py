#!/usr/bin/env python3
"""gpu_question.py — the users' question of issue 14, answered with tools/downpour_scaling.py:
how many servers and which codec keep W = 8, 16, 64 GPU workers of AlexNet (batch 128) at >= 80%
scaling efficiency on 10 and 25 Gbit/s? (docs/scaling.md "The answer for GPU workers".)

    bench/scaling/gpu_question.py [--step-ms 10,25,50] [--target 0.8] [--json]

Inputs, all in this folder: alexnet_tensors.txt (bvlc_alexnet, 60,965,224 floats), the per-layer
proportions of alexnet_cpu_quiet_b64.json rescaled to each assumed GPU step time, and
rates_tcp_quiet.json (server shards as measured on the quiet VM over loopback TCP). For each
(step time, link, W) it searches the communication period k in 1, 2, 4, 8, 16 — first pulls
every k-th step (worker.pull_every = k), then pulls and pushes every k-th step (also
worker.push_every = k) — then S in 1..128, smallest first, and reports the codecs that reach the
target there. Async, one server shard per host, every host on the same link. What a longer period
costs in accuracy (staler weights) is not modelled: that is the experiment's question.

The servers' write-ahead log is off, as configs/runs/alexnet.toml has it; --wal-ns-per-float X
(and --wal-disk-gbytes G, a server host's sustained log write rate) asks the same with the log
on (checkpoint.wal = true: every shard appends its share of every push before applying it, as the
wire carried it where that is smaller than its f32 gradient: factors and lossy codecs).
"""
import argparse
import dataclasses
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "tools"))
import downpour_scaling as sc  # noqa: E402

CODECS = ["fp32", "fp16+pull=fp16", "factors", "factors+pull=fp16", "topk:0.01+pull=fp16", "onebit+pull=fp16"]
SERVERS = [1, 2, 4, 8, 16, 32, 64, 128]
PULL_EVERY = [1, 2, 4, 8, 16]


def answer(profile, tensors, rates, link, w, target, wal=False):
    """The first (knob, k, S) in the search order where some codec reaches the target: pulls every
    k-th step first (push_every 1), then pulls and pushes every k-th step (the push a mean of k
    gradients, worker.push_every); k and then S smallest first."""
    best = None
    for both in (False, True):
        for k in PULL_EVERY:
            for s in SERVERS:
                ok = []
                for name in CODECS:
                    c = sc.Cluster(w, s, link, "async", batch=128, pull_every=k, push_every=k if both else 1,
                                   wal=wal)
                    p = sc.predict(profile, tensors, rates, c, sc.parse_codec(name))
                    if best is None or p.efficiency > best[0]:
                        best = (p.efficiency, knob(both, k), s, name)
                    if p.efficiency >= target:
                        ok.append((name, p.efficiency))
                if ok:
                    return {"knob": knob(both, k), "servers": s, "codecs": ok}
    return {"knob": None, "servers": None, "codecs": [], "best": best}


def knob(both, k):
    if k == 1:
        return "every step"
    return f"pull_every = push_every = {k}" if both else f"pull_every = {k}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--step-ms", default="10,25,50", help="assumed GPU forward+backward ms at batch 128")
    ap.add_argument("--links", default="10,25")
    ap.add_argument("--workers", default="8,16,64")
    ap.add_argument("--target", type=float, default=0.8)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--wal-ns-per-float", type=float, help="the log on, at this loop cost per pushed float")
    ap.add_argument("--wal-disk-gbytes", type=float, default=0.0, help="with the log: a server host's log disk GB/s")
    args = ap.parse_args()
    tensors = sc.read_tensors(os.path.join(HERE, "alexnet_tensors.txt"))
    rates_path = os.path.join(HERE, "rates_tcp_quiet.json")
    rates = sc.rates_from_json(sc.read_json(rates_path, "rates"), rates_path)
    wal = args.wal_ns_per_float is not None
    if wal:
        rates = dataclasses.replace(rates, wal_ns_per_float=args.wal_ns_per_float, wal_sync_ns_per_float=0.0,
                                    wal_disk_gbytes=args.wal_disk_gbytes)
    base = sc.read_profile(os.path.join(HERE, "alexnet_cpu_quiet_b64.json"))
    out = []
    for ms in [float(x) for x in args.step_ms.split(",")]:
        profile = sc.scaled_profile(base, batch=128, step_ms=ms)
        for link in [float(x) for x in args.links.split(",")]:
            for w in [int(x) for x in args.workers.split(",")]:
                out.append({"step_ms": ms, "link_gbps": link, "workers": w,
                            **answer(profile, tensors, rates, link, w, args.target, wal)})
    if args.json:
        json.dump(out, sys.stdout, indent=1)
        print()
        return
    print(f"| GPU step (ms, batch 128) | link Gbit/s | W | communication | smallest S | codecs reaching "
          f"{100 * args.target:.0f}% there (efficiency) |")
    print("|---:|---:|---:|---|---:|---|")
    for r in out:
        if r["servers"] is None:
            eff, k, s, name = r["best"]
            print(f"| {r['step_ms']:g} | {r['link_gbps']:g} | {r['workers']} | — | — | none up to k = 16, "
                  f"S = {SERVERS[-1]} (best {100 * eff:.0f}%: {name}, S = {s}, {k}) |")
        else:
            codecs = ", ".join(f"{n} ({100 * e:.0f}%)" for n, e in r["codecs"])
            print(f"| {r['step_ms']:g} | {r['link_gbps']:g} | {r['workers']} | {r['knob']} | {r['servers']} | "
                  f"{codecs} |")


if __name__ == "__main__":
    main()
