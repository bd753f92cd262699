#!/usr/bin/env python3
"""The scaling model against the H200 jobs of bench/RESULTS.md §11.4.1 (AlexNet async, S = 2,
W = 2 GPU workers on one 16-core host, every process paced to 10 Gbit/s, batch 128), now that
it knows cluster.server_threads and compression.factor_threads, out of phase and in lockstep.
Inputs: run 1's own GPU profile, tensor list and load-benchmark rates (S = 2, W = 1), as the
section's first comparison; the measured images/s are the section's table.

  python3 bench/scaling/h200_rows.py          # a markdown table
"""
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import downpour_scaling as sc  # noqa: E402

RUN1 = os.path.join(ROOT, "bench", "gpu", "out-2026-11-28-h200", "run1")
# (codec, server_threads, factor_threads, measured images/s of every job at those settings)
ROWS = [("fp32", 1, 1, [1069, 1077, 793, 796, 917, 779, 797, 1091, 788, 778, 777]),
        ("factors+pull=fp16", 1, 1, [721]),
        ("factors+pull=fp16", 1, 4, [1064, 1096]),
        ("factors+pull=fp16", 1, 8, [1035, 1107]),
        ("factors+pull=fp16", 2, 4, [1297]),
        ("factors+pull=fp16", 4, 4, [1467, 1376, 1432]),
        ("factors+pull=fp16", 4, 8, [1471]),
        ("factors+pull=fp16", 8, 4, [1234, 1305]),
        ("factors+pull=fp16", 8, 8, [941, 1045, 1043])]


def main():
    with open(os.path.join(RUN1, "bench-ps.txt")) as f:
        rates = sc.rates_from_bench(f.read(), "run1/bench-ps.txt", servers=2, workers=1)
    with open(os.path.join(RUN1, "alexnet-gpu-b128.time.json")) as f:
        profile = sc.parse_time_json(json.load(f), "run1/alexnet-gpu-b128.time.json")
    with open(os.path.join(RUN1, "alexnet.tensors.txt")) as f:
        tensors = sc.parse_tensors(f.read(), "run1/alexnet.tensors.txt")
    print("| codec | server / factor threads | measured img/s | out of phase | error | lockstep | error |")
    print("| --- | --- | --- | ---: | --- | ---: | --- |")
    for codec, st, ft, measured in ROWS:
        cells = []
        for lockstep in (False, True):
            c = sc.Cluster(workers=2, servers=2, link_gbps=10, batch=128, colocated=True, emulated=True,
                           cores_per_host=16, server_threads=st, factor_threads=ft, lockstep=lockstep)
            p = sc.predict(profile, tensors, rates, c, sc.parse_codec(codec))
            errs = [100 * (p.images_per_s / m - 1) for m in measured]
            cells += [f"{p.images_per_s:.0f}", f"{min(errs):+.0f} … {max(errs):+.0f}%"]
        print(f"| {codec} | {st} / {ft} | {', '.join(map(str, measured))} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
