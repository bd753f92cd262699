#!/usr/bin/env python3
"""scaling_validate.py — tools/downpour-scaling's predictions against real jobs on this machine
(issue 14: "prediction within 20% of measured"), from a build tree.

    bench/train/scaling_validate.py [--build build] [--nets fmnist,alexnet] [--workers 1,2,4]
        [--servers 2] [--links 1,10] [--codecs fp32] [--send-orders call,layer [--inflight-mb 16]]
        [--network netns|pacer] [--rates FILE | --rates-from-bench FILE | --bench] [--work DIR]
        [--repeats N] [--dry-run]
    bench/train/scaling_validate.py --rejoin RUNS/validation.json [--work DIR]   (re-predict, no job)

Where the jobs run (--network): netns (the default where namespaces can be made, i.e. as root)
puts every process of a job on a host of its own made of a network namespace, each host's link
shaped each way by the kernel to the row's Gbit/s (tools/downpour_netns.py, scripts/netns-cluster
--rate), shared memory off; the model predicts hosts with a NIC each whose CPUs are this machine's
cores (downpour-scaling --netns). pacer puts every process on this host and emulates the links
with cluster.link_gbps, which paces each process's egress (downpour-scaling --colocated).

For each net it first times one worker's step on this machine (`downpour-time --json` at the
run config's batch and worker.threads), and takes transport rates from --rates (JSON),
--rates-from-bench (saved downpour-bench-ps output), --bench (runs `downpour-bench-ps --servers 1
--workers 1 --rounds 6` now, again with the log on, and again at 64 KiB chunks for the cost of a
message) or the model's defaults. With --network netns it then measures the transport's CPU across
namespace hosts at each link of the grid (netns_transport: two probe jobs per link with an
emulated worker, the machine's busy CPU per step), which replaces the load benchmark's loopback
figures. For CPU workers it times W copies of the net at once for each W of the grid (corun_factors:
how much slower a worker computes beside the others than sharing the cores explains) and predicts
each W with that. Then per (net, link, codec, W, send order) it prints the prediction BEFORE it runs the job, runs it
(async, S servers, W workers, a few steps, one test batch at the end), and reads the measured
images/s from the workers' step records:
  measured = sum over workers of batch × 1000 / median step_ms (steps 2.., the tools' breakdown),
  whole run = the summary's images/s (every step, the first cold one included).
Prints a table (prediction, both measurements, error of the prediction against the median-step
figure, within 20%?) and writes it to <work>/validation.md and validation.json. With --repeats N
every prediction is printed first, then the whole grid runs N times, pass after pass; a row's
measured figure is the median of its N jobs, its range beside it (on a shared VM the same job
moves by tens of percent from one hour to the next: one job per row cannot tell that from the
model's error).

Nets: fmnist = configs/runs/default.toml with fmnist_small (data-sets/fashion-mnist, 300 steps);
alexnet = configs/runs/alexnet.toml (alexnet_fashion on data-sets/fashion-256 when it exists,
else a synthetic 256×256 LMDB made here as bench/train/overlap_alexnet.py does; 8 steps).
A link of 0 means no link limit (no cluster.link_gbps, or hosts not shaped; the model then uses
--transport-gbytes from the rates as the only limit). Codecs are downpour-scaling names (fp32, factors,
factors+pull=fp16, topk:0.01, onebit, ...), turned into [compression] settings.

A 2-core machine shared with other work makes compute swing (bench/RESULTS.md §8-§10) and takes
cores the model assumes the jobs have (--cores, default nproc): run this on a quiet machine; the
table shows the load average before and after each job.
"""
import argparse
import dataclasses
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import downpour_netns as netns  # noqa: E402
import downpour_report as report  # noqa: E402
import downpour_runs as dr  # noqa: E402
import downpour_scaling as sc  # noqa: E402

NETS = {
    # fmnist_small, as measured in bench/RESULTS.md §11.5 (the default job now trains fmnist_fast)
    "fmnist": {"base": "configs/runs/default.toml", "model": "configs/models/fmnist_small.toml", "steps": 300,
               "time_iterations": 20},
    "alexnet": {"base": "configs/runs/alexnet.toml", "steps": 8, "time_iterations": 2},
}
NO_LINK_GBPS = 1e4  # "no limit" for the model: far above what loopback moves
# The small chunks that measure what a message costs, beside the same bytes at the usual chunks:
# 64 KiB, ~3,700 a round in --bench's load benchmark where the usual 4 MiB chunks make ~70, and
# 46 a step in the transport probe where fmnist_small's tensors make 8.
SMALL_CHUNK_ELEMS = 16384
DEFAULT_INFLIGHT_MB = 128  # cluster.inflight_mb when a config does not set it (docs/config.md)


def load_base(net):
    with open(os.path.join(ROOT, NETS[net]["base"]), "rb") as f:
        base = tomllib.load(f)
    if "model" in NETS[net]:
        base["model"]["config"] = NETS[net]["model"]
    return base


def data_sets(args, net):
    """--set arguments for the net's data: the config's own paths under --data-root, or for AlexNet
    without Fashion-256 a synthetic LMDB (no test set)."""
    root = os.path.abspath(args.data_root)
    if net == "fmnist":
        d = os.path.join(root, "fashion-mnist")
        if not os.path.isdir(os.path.join(d, "train_lmdb")):
            sys.exit(f"scaling_validate: {d}/train_lmdb missing: run scripts/run_default once (it makes it)")
        return [f"data.train={d}/train_lmdb", f"data.test={d}/test_lmdb", "eval.test_batches=1",
                f"model.config={NETS[net]['model']}"]
    d = os.path.join(root, "fashion-256")
    if os.path.isdir(os.path.join(d, "train_lmdb")):
        return [f"data.train={d}/train_lmdb", f"data.test={d}/test_lmdb", f"data.mean_file={d}/mean.tensor",
                "eval.test_batches=1"]
    import overlap_alexnet  # the synthetic 256×256 LMDB of the overlap benchmark
    synthetic = os.path.join(args.work, "synthetic")
    if not os.path.isdir(os.path.join(synthetic, "train_lmdb")):
        shutil.rmtree(synthetic, ignore_errors=True)
        os.makedirs(synthetic)
        overlap_alexnet.make_dataset(synthetic, args.build, 128, 10)
    return [f"data.train={synthetic}/train_lmdb", 'data.test=""', 'data.mean_file=""', "data.scale=0.00390625"]


def time_profile(args, net, base, repeats=3, path=None):
    """downpour-time --json for one worker of this net on this machine: the median (by forward +
    backward) of `repeats` timings, as other work on a shared machine swings a single one 2×."""
    path = path or os.path.join(args.work, f"{net}.time.json")
    batch = base["worker"]["batch_size"]
    threads = base["worker"].get("threads", 1)
    cmd = [os.path.join(args.build, "client", "engine", "downpour-time"), "--model",
           os.path.join(ROOT, base["model"]["config"]), "--batch", str(batch), "--threads", str(threads),
           "--iterations", str(NETS[net]["time_iterations"]), "--json"]
    timings = []
    for _ in range(repeats):
        r = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT)
        data = json.loads(r.stdout)
        timings.append((data["forward_ms"] + data["backward_ms"], r.stdout))
    timings.sort(key=lambda t: t[0])
    with open(path, "w") as f:
        f.write(timings[len(timings) // 2][1])
    print(f"{net}: downpour-time forward+backward over {repeats} repeat{'s' if repeats > 1 else ''}: "
          + ", ".join(f"{t[0]:.1f}" for t in timings) + " ms" + (" (the median is the profile)" if repeats > 1 else ""),
          flush=True)
    return sc.read_profile(path), path


CORUN_SECONDS = 3.0


def corun_factors(args, net, base, profile, workers, path=None):
    """{W: how much slower a worker computes beside W - 1 others than alone, beyond sharing the
    cores}: W copies of downpour-time at once (the net, batch and threads of the jobs), their
    median forward + backward t_W against the profile's t_1, as CPU: t_W × min(cores, W × threads)
    / (W × threads × t_1), at least 1 (below 1 is noise: W copies cannot compute faster than
    sharing the cores allows). Shared caches and memory bandwidth: bench/RESULTS.md §11.5.3 had
    four AlexNet workers at 2.28× on 2 cores where sharing gives 2× (1.14). Written to
    <work>/<net>.corun.json for --rejoin."""
    batch = base["worker"]["batch_size"]
    threads = base["worker"].get("threads", 1)
    # At least CORUN_SECONDS of timed steps each: the copies start together, but a short timing
    # (fmnist's 20 steps, 0.3 s) overlaps the others' start-up and measured ×1.37 for two copies
    # on two cores (bench/RESULTS.md §11.5.6).
    iterations = max(NETS[net]["time_iterations"], math.ceil(CORUN_SECONDS / profile.compute_s))
    cmd = [os.path.join(args.build, "client", "engine", "downpour-time"), "--model",
           os.path.join(ROOT, base["model"]["config"]), "--batch", str(batch), "--threads", str(threads),
           "--iterations", str(iterations), "--json"]
    out = {1: 1.0}
    for w in sorted(set(workers)):
        if w <= 1:
            continue
        copies = [subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=ROOT) for _ in range(w)]
        times = []
        for p in copies:
            data = json.loads(p.communicate()[0])
            times.append(1e-3 * (data["forward_ms"] + data["backward_ms"]))
        t_w = statistics.median(times)
        busy = min(args.cores, w * threads)
        out[w] = max(1.0, t_w * busy / (w * threads * profile.compute_s))
        print(f"{net}: {w} workers computing at once: {1e3 * t_w:.1f} ms a step each (alone "
              f"{1e3 * profile.compute_s:.1f}): ×{out[w]:.3f} beyond sharing {args.cores} cores", flush=True)
    with open(path or os.path.join(args.work, f"{net}.corun.json"), "w") as f:
        json.dump({str(k): v for k, v in out.items()}, f)
    return out


def corun_profile(profile, factor):
    """The profile of a worker computing `factor` slower (corun_factors), every layer alike."""
    if factor == 1.0 or profile.threads == 0:
        return profile
    return sc.scaled_profile(profile, step_ms=1e3 * profile.compute_s * factor)


def tensors_of(args, net, base):
    # The job's model (base["model"]["config"]: fmnist_small for fmnist), not the run config's own
    # default (the default job trains fmnist_fast, whose layers have the same names).
    path = os.path.join(args.work, f"{net}.tensors.txt")
    subprocess.run([os.path.join(args.build, "client", "worker", "downpour-worker"), "--config",
                    os.path.join(ROOT, NETS[net]["base"]), "--set", f"model.config={base['model']['config']}",
                    "--write-tensors", path], check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    return sc.read_tensors(path), path


def rates_of(args):
    if args.rates:
        return sc.rates_from_json(sc.read_json(args.rates, "--rates"), args.rates)
    if args.rates_from_bench:
        return sc.rates_from_bench(sc.read_text(args.rates_from_bench, "--rates-from-bench"), args.rates_from_bench,
                                   servers=args.bench_servers)
    if args.bench:
        # The plain run for the update, loop and transport rates, then the same with the
        # write-ahead log on (its log in --work, on the disk the jobs' logs go to) for its rates.
        # With --bench-servers S the one synthetic worker talks to S shards, as the jobs' workers
        # do: its transport ceiling is then a worker's with S connections.
        # A third run at small chunks (SMALL_CHUNK_ELEMS floats, ~50× the messages for the same
        # floats) gives the CPU a message costs beside its bytes.
        path = os.path.join(args.work, "bench-ps.txt")
        bench = [os.path.join(args.build, "bench", "ps", "downpour-bench-ps"), "--servers", str(args.bench_servers),
                 "--workers", "1", "--rounds", "6"]
        with open(path, "w") as f:
            subprocess.run(bench, stdout=f, check=True)
            f.flush()
            subprocess.run(bench + ["--wal", "--wal-dir", os.path.abspath(args.work)], stdout=f, check=True)
            f.flush()
            subprocess.run(bench + ["--chunk-elems", str(SMALL_CHUNK_ELEMS)], stdout=f, check=True)
        return sc.rates_from_bench(sc.read_text(path, "--bench"), path, servers=args.bench_servers)
    return sc.Rates()


# The transport probe across namespace hosts (--network netns): fmnist_small's layers, one
# emulated worker (no compute) and one server, links shaped as in the grid's jobs, PROBE_STEPS
# steps of which the middle ones are counted; once at the run config's chunks and once at
# SMALL_CHUNK_ELEMS, for every link of the grid.
PROBE_STEPS = 400
PROBE_WINDOW = (50, 350)
PROBE_STEP_MS = 5.0


def busy_ticks():
    """The machine's busy CPU so far, clock ticks (/proc/stat: every column but idle and iowait)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return sum(fields) - fields[3] - fields[4]


def idle_busy_rate(seconds=2.0):
    """The machine's busy CPU per second with no job running (other work, kernel threads): taken
    off each probe's window in proportion to its length."""
    t0, b0 = time.monotonic(), busy_ticks()
    time.sleep(seconds)
    return (busy_ticks() - b0) / os.sysconf("SC_CLK_TCK") / (time.monotonic() - t0)


def probe_job(args, profile, chunk_elems, work, gbps, idle_rate=0.0):
    """One probe job on links of gbps (0: not shaped); (busy CPU seconds per worker step over the
    window, bytes per step from the worker's records). The machine's busy CPU over the window,
    less this script's own (it polls the worker's records) and the machine's idle rate over the
    window's length."""
    import threading
    run_dir = os.path.join(work, f"probe-{gbps:g}g-{chunk_elems}")
    shutil.rmtree(run_dir, ignore_errors=True)
    sets = ["cluster.workers=1", "cluster.servers=1", f"worker.steps={PROBE_STEPS}", "eval.every_steps=0",
            "checkpoint.every_updates=0", "checkpoint.wal=false", "consistency.mode=async",
            f"cluster.chunk_elems={chunk_elems}", emulate_set(sc.scaled_profile(profile, step_ms=PROBE_STEP_MS))]
    sets += data_sets(args, "fmnist")
    codes = {}
    job = threading.Thread(target=lambda: codes.update(netns.run_job(
        args.build, os.path.join(ROOT, NETS["fmnist"]["base"]), run_dir, sets, gbps, timeout_s=300)))
    job.start()
    steps_file = os.path.join(run_dir, "metrics", "worker-0.jsonl")

    def steps():
        try:
            with open(steps_file) as f:
                return sum(1 for line in f if '"event":"step"' in line)
        except OSError:
            return 0
    marks = []
    for target in PROBE_WINDOW:
        while steps() < target and job.is_alive():
            time.sleep(0.02)
        marks.append((steps(), busy_ticks(), time.process_time(), time.monotonic()))
    job.join()
    if not codes or netns.failures(codes) or marks[1][0] <= marks[0][0]:
        sys.exit(f"scaling_validate: the transport probe {run_dir} failed ({netns.failures(codes) or 'too few steps'}); "
                 f"see {run_dir}-*.out")
    n = marks[1][0] - marks[0][0]
    busy = (marks[1][1] - marks[0][1]) / os.sysconf("SC_CLK_TCK")
    cpu = max(0.0, busy - (marks[1][2] - marks[0][2]) - idle_rate * (marks[1][3] - marks[0][3])) / n
    records = [r for r in dr.read_jsonl(steps_file) if r.get("event") == "step"][2:]
    nbytes = statistics.median(r["tx_bytes"] + r["rx_bytes"] for r in records)
    return cpu, nbytes


def netns_transport(args, rates, profile, tensors, base, links):
    """The transport's CPU across namespace hosts, per byte and per message, at each link speed:
    {link: Rates}. The load benchmark's come from loopback TCP inside one process (64 KiB
    packets, no bridge, no veth, no queueing discipline), where namespace hosts have 1,500-byte
    packets through a veth pair and a bridge, and a shaped link sends them on the qdisc's timer:
    on the VM of bench/RESULTS.md §11.5.6 the same bytes cost ~25% more CPU on a shaped link than
    on an unshaped one. Two probe jobs per link (probe_job), emulated worker, so the machine's busy
    CPU over the window is the transport's, both ends and the kernel's softirqs, plus the server's
    update (taken off at the rates' sgd per float). Per message: the CPU the small chunks add,
    over the chunks they add; per byte: the rest. Replaces io_ns_per_byte and msg_io_us; saved to
    <work>/netns-probe.json for --rejoin."""
    chunk = base["cluster"].get("chunk_elems", sc.DEFAULT_CHUNK_ELEMS)
    floats = sum(t.numel for t in tensors)
    path = os.path.join(args.work, "netns-probe.json")
    probes, by_link = {}, {}
    idle_rate = idle_busy_rate()
    print(f"transport probe: the machine idle {1e3 * idle_rate:.1f} ms of busy CPU a second", flush=True)
    for link in links:
        results = []
        for elems in (chunk, SMALL_CHUNK_ELEMS):
            cpu, nbytes = probe_job(args, profile, elems, args.work, link or 0.0, idle_rate)
            chunks = len(sc.layout_chunks(tensors, 1, elems))
            results.append({"chunk_elems": elems, "chunks": chunks, "cpu_s_per_step": cpu, "bytes_per_step": nbytes,
                            "update_s_per_step": floats * rates.sgd_ns_per_float * 1e-9})
            print(f"transport probe across namespace hosts at {link or 'unshaped'} Gbit/s, chunks of {elems} floats "
                  f"({chunks} a step): {1e3 * cpu:.2f} ms of busy CPU a step, {nbytes / 1e6:.2f} MB a step", flush=True)
        probes[f"{link:g}"] = results
        by_link[link] = rates_from_probe(rates, results, f"{path} at {link:g} Gbit/s")
    with open(path, "w") as f:
        json.dump({"probes": probes, "idle_busy_s_per_s": idle_rate}, f, indent=1)
    return by_link


def probe_rates(rates, path):
    """{link: Rates} from a saved netns-probe.json (--rejoin)."""
    probes = sc.read_json(path, "--rejoin")["probes"]
    return {float(link): rates_from_probe(rates, results, f"{path} at {link} Gbit/s") for link, results in probes.items()}


def rates_from_probe(rates, results, where):
    """The rates with the transport's CPU of two probes (netns_transport) in place of the load
    benchmark's: per chunk and per byte (sc.per_message_split)."""
    big, small = results
    transport = [r["cpu_s_per_step"] - r["update_s_per_step"] for r in results]
    msg, bytes_cost = sc.per_message_split(transport[0], big["chunks"], transport[1], small["chunks"])
    return dataclasses.replace(rates, io_ns_per_byte=bytes_cost / big["bytes_per_step"] * 1e9, msg_io_us=msg * 1e6,
                               source=f"{rates.source}; transport CPU across namespace hosts: {where}")


def sgemm_ceiling(args):
    """The machine's 2-thread sgemm GFLOP/s now (bench-engine --gemm-only), or None without it."""
    bench = os.path.join(args.build, "bench", "engine", "downpour-bench-engine")
    if not os.access(bench, os.X_OK):
        return None
    r = subprocess.run([bench, "--gemm-only", "--threads", "2"], capture_output=True, text=True)
    return r.stdout.strip().splitlines()[-1] if r.returncode == 0 and r.stdout.strip() else None


def predict(profile, tensors, rates, net_base, w, s, link, codec, cores, network="pacer", order=None):
    """The model's prediction for one job here. pacer: every process on this host, links emulated
    by cluster.link_gbps (egress paced per process). netns: every process on a namespace host of
    its own with a link shaped each way (a NIC each: workers_per_host = servers_per_host = 1), the
    machine's cores shared by all. order: (cluster.send_order, cluster.inflight_mb), None = the
    run config's."""
    order = order or config_order(net_base)
    emulated = network == "pacer"
    cluster = sc.Cluster(workers=w, servers=s, link_gbps=link or NO_LINK_GBPS, mode="async", wal=sc.wal_from_config(net_base),
                         batch=net_base["worker"]["batch_size"], workers_per_host=w if emulated else 1,
                         cores_per_host=cores, emulated=emulated, colocated=True, link_burst_ms=0.0,
                         payload=sc.TBF_PAYLOAD,
                         chunk_elems=net_base["cluster"].get("chunk_elems", sc.DEFAULT_CHUNK_ELEMS),
                         send_order=order[0], inflight_mb=order[1])
    return sc.predict(profile, tensors, rates, cluster, codec)


def config_order(base):
    """(cluster.send_order, cluster.inflight_mb) of a run config."""
    cluster = base.get("cluster", {})
    return cluster.get("send_order", "call"), cluster.get("inflight_mb", DEFAULT_INFLIGHT_MB)


def resolved_order(order, base):
    """(send_order, inflight_mb) as the model takes it: a row's window, else the config's."""
    return order[0], order[1] or config_order(base)[1]


def parse_orders(text, inflight_mb):
    """--send-orders: [(send_order, inflight_mb)], by layer with --inflight-mb, call order with the
    config's window (it reorders nothing there)."""
    orders = []
    for name in text.split(","):
        if name not in sc.SEND_ORDERS:
            sys.exit(f"scaling_validate: --send-orders: unknown order {name!r} ({', '.join(sc.SEND_ORDERS)})")
        orders.append((name, inflight_mb if name == "layer" else None))
    return orders


def order_name(order):
    return "call" if order[0] == "call" else f"layer {order[1]:g} MiB"


def emulated_profile(profile, step_ms):
    """The profile of an emulated GPU-like worker (worker.emulate_ms): this machine's per-layer
    proportions scaled to step_ms of forward + backward, on no CPU thread of the host."""
    p = sc.scaled_profile(profile, step_ms=step_ms)
    return dataclasses.replace(p, threads=0, device="emulated", source=f"{profile.source} scaled to {step_ms:g} ms")


def emulate_set(profile):
    """The --set argument that makes a job's workers sleep this profile's layer times."""
    return "worker.emulate_ms=[" + ", ".join(f"{1e3 * f:.4f}, {1e3 * b:.4f}" for _, _, f, b in profile.layers) + "]"


def launch(args, net, run_dir, sets, who, extra=(), shaped=None):
    """Runs the net's run config with `sets` into run_dir: with `shaped` (Gbit/s; 0 = unshaped)
    across namespace hosts, one process each (tools/downpour_netns.py; each task's output in
    run_dir-<role>.out), else with downpour-launch on this host (its output in run_dir.log). Exits
    naming `who` and the job when it fails; writes the run's summary and removes the servers'
    logs and checkpoints (no checkpoint truncates a log here: GBs per fmnist job; not needed for a
    table, and a grid of them fills a disk). Returns (summary, workers)."""
    config = os.path.join(ROOT, NETS[net]["base"])
    if shaped is not None:
        why = netns.failures(netns.run_job(args.build, config, run_dir, sets, shaped, timeout_s=args.timeout_s))
        if why:
            sys.exit(f"{who}: {os.path.basename(run_dir)} failed across namespace hosts ({why}); see {run_dir}-*.out")
    else:
        cmd = [os.path.join(args.build, "server", "downpour-launch"), "--config", config,
               "--run-dir", run_dir, "--timeout-s", str(args.timeout_s), *extra]
        for x in sets:
            cmd += ["--set", x]
        log = run_dir + ".log"
        with open(log, "w") as f:
            r = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT)
        if r.returncode != 0:
            sys.exit(f"{who}: {os.path.basename(run_dir)} failed (exit {r.returncode}); see {log}")
    summary = dr.write_summary(run_dir)
    _, files = dr.load_run([run_dir])
    for folder, _, names in os.walk(run_dir):
        for n in names:
            if n.endswith((".wal", ".dpt")):
                os.remove(os.path.join(folder, n))
    return summary, dr.worker_files(files)


def run_job(args, net, index, w, s, link, codec, data, repeat=0, order=("call", None)):
    """One job; returns (run_dir, summary, measured images/s from median steps)."""
    name = f"{net}-w{w}-s{s}-{'nolink' if not link else f'{link:g}g'}-{codec.name.replace('+', '_').replace(':', '')}"
    if order[0] == "layer":
        name += f"-layer{order[1]:g}"
    if args.repeats > 1:
        name += f"-r{repeat + 1}"
    run_dir = os.path.join(args.work, name)
    shutil.rmtree(run_dir, ignore_errors=True)
    port = 7800 + 20 * (index % 100)
    steps = args.steps or NETS[net]["steps"]
    sets = [f"cluster.workers={w}", f"cluster.servers={s}", f"worker.steps={steps}", "eval.every_steps=0",
            "checkpoint.every_updates=0", "consistency.mode=async"] + data + codec.config_sets()
    if args.network == "pacer":
        sets += [f"cluster.coordinator=127.0.0.1:{port}", f"cluster.base_port={port + 5}"]
    if args.wal:
        sets.append(f"checkpoint.wal={'true' if args.wal == 'on' else 'false'}")
    if args.batch:
        sets.append(f"worker.batch_size={args.batch}")
    sets.append(f'cluster.send_order="{order[0]}"')
    if order[0] == "layer":
        sets.append(f"cluster.inflight_mb={order[1]}")
    if link and args.network == "pacer":
        sets.append(f"cluster.link_gbps={link:g}")
    if args.emulated.get(net) is not None:
        sets.append(emulate_set(args.emulated[net]))
    summary, workers = launch(args, net, run_dir, sets, "scaling_validate",
                              shaped=(link or 0.0) if args.network == "netns" else None)
    measured = report.images_per_s_from_steps(report.step_breakdown(workers), summary["batch_size"])
    return run_dir, summary, measured


def rejoin(args, path):
    """--rejoin validation.json: re-predict every row with the current model from the profiles,
    tensor lists and rates that run saved next to it (<dir>/<net>.time.json, <net>.tensors.txt,
    and --rates / --rates-from-bench, else <dir>/bench-ps.txt), and join with the measured values
    in it. Starts no job. Prints old vs new prediction and error per row and writes
    <dir>/validation-rejoined.md and .json."""
    data = sc.read_json(path, "--rejoin")
    where = os.path.dirname(os.path.abspath(path))
    if args.rates or args.rates_from_bench:
        rates = rates_of(args)
    else:
        bench = os.path.join(where, "bench-ps.txt")
        rates = sc.rates_from_bench(sc.read_text(bench, "--rejoin"), bench, servers=data.get("bench_servers", 1)) \
            if os.path.exists(bench) else sc.Rates()
    probe = os.path.join(where, "netns-probe.json")
    by_link = probe_rates(rates, probe) if data.get("network") == "netns" and os.path.exists(probe) else {}
    profiles, tensors, coruns = {}, {}, {}
    lines = ["| net | W | S | link Gbit/s | codec | order | measured img/s | old predicted | old error | new predicted | "
             "new error | new bound | new within 20% |",
             "| --- | ---: | ---: | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | --- | --- |"]
    rows = []
    for r in data.get("rows", []):
        net = r["net"]
        if net not in profiles:
            profiles[net] = sc.read_profile(os.path.join(where, f"{net}.time.json"), "--rejoin")
            saved = os.path.join(where, f"{net}.corun.json")  # runs before it was measured have none
            coruns[net] = {int(k): v for k, v in sc.read_json(saved, "--rejoin").items()} \
                if os.path.exists(saved) else {}
            if data.get("emulate_step_ms"):
                profiles[net] = emulated_profile(profiles[net], data["emulate_step_ms"])
            tensors[net] = sc.read_tensors(os.path.join(where, f"{net}.tensors.txt"), "--rejoin")
        base = load_base(net)
        base["worker"]["batch_size"] = profiles[net].batch
        if "wal" in r:  # the job's checkpoint.wal (rows written before it was recorded: the config's)
            base.setdefault("checkpoint", {})["wal"] = r["wal"]
        order = (r.get("send_order", "call"), r.get("inflight_mb"))  # rows before orders were recorded: call
        p = predict(corun_profile(profiles[net], coruns[net].get(r["workers"], 1.0)), tensors[net],
                    by_link.get(r["link_gbps"] or 0.0, rates), base, r["workers"], r["servers"], r["link_gbps"],
                    sc.parse_codec(r["codec"]), args.cores, data.get("network", "pacer"),
                    resolved_order(order, base))
        m = r.get("measured_images_per_s")
        new_err = p.images_per_s / m - 1 if m else None
        row = dict(r, old_predicted_images_per_s=r["predicted_images_per_s"], old_error=r.get("error"),
                   old_bound=r.get("predicted_bound"), predicted_images_per_s=p.images_per_s,
                   predicted_step_ms=1e3 * p.step_s, predicted_bound=p.bound, error=new_err)
        rows.append(row)
        lines.append(f"| {net} | {r['workers']} | {r['servers']} | {r['link_gbps'] or 'none'} | {r['codec']} | "
                     f"{order_name(order)} | "
                     f"{dr.fmt(m, '.1f')} | {r['predicted_images_per_s']:.1f} | {percent(r.get('error'))} | "
                     f"{p.images_per_s:.1f} | {percent(new_err)} | {p.bound} | "
                     f"{'—' if new_err is None else ('yes' if abs(new_err) <= 0.2 else 'NO')} |")
    table = "\n".join(lines) + "\n"
    print(f"rates: {rates.source}; cores {args.cores}\n\n" + table)
    out = args.work if args.work_given else where
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "validation-rejoined.md"), "w") as f:
        f.write(table)
    with open(os.path.join(out, "validation-rejoined.json"), "w") as f:
        json.dump({"rates": rates.source, "rejoined_from": path, "rows": rows}, f, indent=1)
    print(f"written: {out}/validation-rejoined.md, validation-rejoined.json")


def percent(err):
    return "—" if err is None else f"{100 * err:+.0f}%"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"), help="build tree (default ./build)")
    ap.add_argument("--data-root", default=os.path.join(ROOT, "data-sets"),
                    help="where fashion-mnist/ and fashion-256/ are")
    ap.add_argument("--work", help="scratch folder (runs, profiles, tables; default /tmp/downpour-scaling-validate; "
                    "with --rejoin: where the rejoined table goes, default beside the JSON)")
    ap.add_argument("--nets", default="fmnist,alexnet")
    ap.add_argument("--workers", default="1,2,4")
    ap.add_argument("--servers", default="2")
    ap.add_argument("--links", default="1,10", help="Gbit/s per process (its shaped link, or cluster.link_gbps); "
                    "0 = no limit")
    ap.add_argument("--network", choices=("netns", "pacer"),
                    help="netns: every process on a namespace host of its own (scripts/netns-cluster), its link "
                         "shaped each way by the kernel (tc tbf) to --links; pacer: every process on this host, "
                         "links emulated by cluster.link_gbps. Default: netns where namespaces can be made "
                         "(root), else pacer, with a line saying why")
    ap.add_argument("--codecs", default="fp32", help="downpour-scaling codec names, comma-separated")
    ap.add_argument("--send-orders", default="call",
                    help="cluster.send_order of the jobs, comma-separated: call, layer (default call)")
    ap.add_argument("--inflight-mb", type=int, default=16,
                    help="cluster.inflight_mb of the layer jobs (default 16; call order keeps the config's)")
    ap.add_argument("--steps", type=int, help="steps per worker (default: fmnist 300, alexnet 8)")
    ap.add_argument("--batch", type=int, help="batch per worker (default: the run config's)")
    ap.add_argument("--rates", help="rates JSON for the model")
    ap.add_argument("--rates-from-bench", help="saved downpour-bench-ps output for the model's rates")
    ap.add_argument("--bench", action="store_true", help="run downpour-bench-ps (S=1, W=1) for the rates first")
    ap.add_argument("--bench-servers", type=int, default=1,
                    help="the load benchmark's shard servers S for --bench / --rates-from-bench (default 1; the "
                         "jobs' S measures the transport ceiling of a worker that talks to S servers)")
    ap.add_argument("--timeout-s", type=int, default=900, help="per job (default 900)")
    ap.add_argument("--cores", type=int, default=os.cpu_count() or 1,
                    help="cores the model may assume the jobs have (default: nproc; less on a shared machine)")
    ap.add_argument("--wal", choices=("on", "off"),
                    help="checkpoint.wal of every job and its prediction (default: the run config's: "
                         "fmnist on, alexnet off)")
    ap.add_argument("--repeats", type=int, default=1,
                    help="run the whole grid this many times, one pass after another (a slow drift of a shared "
                         "VM then touches every row alike); measured = the median over the passes, with the "
                         "range beside it (default 1)")
    ap.add_argument("--retime", action="store_true",
                    help="also time the net again (one downpour-time) right before each job and print that job's "
                         "own prediction from it before the job starts: a VM whose speed drifts by tens of "
                         "percent from one hour to the next then has its speed measured when the job runs. "
                         "The table gives both predictions (the grid's, from the profile at the start; and the "
                         "median of the re-timed ones)")
    ap.add_argument("--emulate-step-ms", type=float, default=0.0,
                    help="emulated GPU-like workers: every job's workers sleep through the net's layers "
                         "(worker.emulate_ms, this machine's per-layer proportions scaled to this many ms of "
                         "forward + backward) instead of computing, and the model predicts workers whose "
                         "compute takes no host CPU: the communication half of the model, on a host whose "
                         "cores are not shared with compute (default 0: real CPU workers)")
    ap.add_argument("--dry-run", action="store_true", help="profiles and predictions only; start no job")
    ap.add_argument("--rejoin", metavar="JSON", help="re-predict a finished run's validation.json with the current "
                    "model (its saved profiles, tensors and bench-ps.txt) and join with its measurements; no job")
    args = ap.parse_args()
    args.work_given = args.work is not None
    args.emulated = {}
    if args.bench_servers < 1:
        sys.exit(f"scaling_validate: --bench-servers {args.bench_servers}: must be >= 1")
    if args.emulate_step_ms < 0 or args.emulate_step_ms != args.emulate_step_ms:
        sys.exit(f"scaling_validate: --emulate-step-ms {args.emulate_step_ms:g}: must be >= 0")
    if args.emulate_step_ms and args.retime:
        sys.exit("scaling_validate: --retime times the CPU compute, which --emulate-step-ms replaces: give one")
    if args.repeats < 1:
        sys.exit(f"scaling_validate: --repeats {args.repeats}: must be >= 1")
    if not 1 <= args.inflight_mb <= 4096:
        sys.exit(f"scaling_validate: --inflight-mb {args.inflight_mb}: must be in 1..4096 (cluster.inflight_mb)")
    orders = parse_orders(args.send_orders, args.inflight_mb)
    args.work = args.work or "/tmp/downpour-scaling-validate"
    netns.exit_on_sigterm()
    if args.network is None:
        why = netns.can_run()
        args.network = "pacer" if why else "netns"
        if why and not args.rejoin:
            print(f"scaling_validate: links emulated by cluster.link_gbps: namespace hosts {why}", flush=True)
    elif args.network == "netns" and not args.dry_run and not args.rejoin and netns.can_run():
        sys.exit(f"scaling_validate: --network netns: {netns.can_run()}")
    if args.rejoin:
        try:
            rejoin(args, args.rejoin)
        except dr.ToolError as e:
            sys.exit(f"scaling_validate: {e}")
        return
    args.build = os.path.abspath(args.build)
    os.makedirs(args.work, exist_ok=True)
    nets = [n for n in args.nets.split(",") if n]
    for n in nets:
        if n not in NETS:
            sys.exit(f"scaling_validate: --nets: unknown net {n!r} (fmnist, alexnet)")
    workers = [int(x) for x in args.workers.split(",")]
    servers = [int(x) for x in args.servers.split(",")]
    links = [float(x) for x in args.links.split(",")]
    try:
        codecs = [sc.parse_codec(c) for c in args.codecs.split(",")]
        rates = rates_of(args)
    except dr.ToolError as e:
        sys.exit(f"scaling_validate: {e}")
    ceiling = sgemm_ceiling(args)
    print(f"machine: nproc {os.cpu_count()}, load {os.getloadavg()[0]:.2f}; sgemm: {ceiling or 'n/a'}")
    print(f"network: {'namespace hosts, links shaped by tc' if args.network == 'netns' else 'this host, links paced by cluster.link_gbps'}")
    print(f"rates: {rates.source}: sgd {rates.sgd_ns_per_float:.3g} ns/float, loop {rates.server_ns_per_float:.3g} "
          f"ns/float, transport {rates.transport_gbytes:g} GB/s (its CPU {rates.io_ns_per_byte:.3g} ns/byte), "
          f"per message {rates.msg_server_us:.3g} µs in the loop + {rates.msg_io_us:.3g} µs outside, "
          f"write-ahead log {rates.wal_ns_per_float:.3g} + "
          f"{rates.wal_sync_ns_per_float:.3g} ns/float", flush=True)
    # Every prediction first (each is printed before any job runs), then the grid's jobs,
    # --repeats passes of it one after another.
    results, cells, tensors_by_net, bases = [], [], {}, {}
    probed, by_link, corun = False, {}, {}
    for net in nets:
        base = load_base(net)
        if args.wal:
            base.setdefault("checkpoint", {})["wal"] = args.wal == "on"
        if args.batch:
            base["worker"]["batch_size"] = args.batch  # the profile, the prediction and the job
        profile, time_path = time_profile(args, net, base)
        if args.emulate_step_ms:
            profile = emulated_profile(profile, args.emulate_step_ms)
            args.emulated[net] = profile
            print(f"{net}: emulated workers (worker.emulate_ms): the profile's layers scaled to "
                  f"{args.emulate_step_ms:g} ms a step, no CPU compute", flush=True)
        tensors, _ = tensors_of(args, net, base)
        tensors_by_net[net] = tensors
        bases[net] = base
        # CPU workers computing side by side slow each other beyond sharing the cores: measured.
        corun[net] = {} if args.emulate_step_ms else corun_factors(args, net, base, profile, workers)
        if args.network == "netns" and not args.dry_run and not probed:
            fm_base = load_base("fmnist")
            fm_profile, _ = (profile, None) if net == "fmnist" and not args.emulate_step_ms else \
                time_profile(args, "fmnist", fm_base, repeats=1, path=os.path.join(args.work, "probe.time.json"))
            fm_tensors = tensors if net == "fmnist" else tensors_of(args, "fmnist", fm_base)[0]
            by_link = netns_transport(args, rates, fm_profile, fm_tensors, fm_base, links)
            probed = True
            for link, r in by_link.items():
                print(f"rates across namespace hosts at {link or 'unshaped'} Gbit/s: transport {r.io_ns_per_byte:.3g} "
                      f"ns/byte, per message {r.msg_io_us:.3g} µs outside the loops", flush=True)
        print(f"{net}: one worker alone {1e3 * profile.compute_s:.1f} ms forward+backward at batch {profile.batch} "
              f"({time_path})", flush=True)
        data = None if args.dry_run else data_sets(args, net)
        for link in links:
            for codec in codecs:
                for s in servers:
                    for w in workers:
                        for order in orders:
                            model_order = resolved_order(order, base)
                            p = predict(corun_profile(profile, corun[net].get(w, 1.0)), tensors,
                                        by_link.get(link, rates), base, w, s, link, codec, args.cores, args.network,
                                        model_order)
                            row = {"net": net, "workers": w, "servers": s, "link_gbps": link or None,
                                   "codec": codec.name, "send_order": order[0], "inflight_mb": order[1],
                                   "wal": sc.wal_from_config(base),
                                   "predicted_images_per_s": p.images_per_s, "predicted_step_ms": 1e3 * p.step_s,
                                   "predicted_bound": p.bound, "push_bytes": p.push_bytes, "pull_bytes": p.pull_bytes}
                            print(f"  predict {net} W={w} S={s} link={link or 'none'} {codec.name} "
                                  f"{order_name(model_order)}: {p.images_per_s:.1f} img/s "
                                  f"(step {1e3 * p.step_s:.0f} ms, {p.bound})", flush=True)
                            results.append(row)
                            cells.append((row, p, (net, w, s, link, codec, data, order)))
    if not args.dry_run:
        index = 0
        for repeat in range(args.repeats):
            for row, p, (net, w, s, link, codec, data, order) in cells:
                model_order = resolved_order(order, bases[net])
                retimed = None
                if args.retime:
                    base = bases[net]
                    profile, _ = time_profile(args, net, base, repeats=1,
                                              path=os.path.join(args.work, f"{net}.time-job{index}.json"))
                    retimed = predict(corun_profile(profile, corun[net].get(w, 1.0)), tensors_by_net[net],
                                      by_link.get(link, rates), base, w, s, link, codec, args.cores,
                                      args.network, model_order)
                    print(f"  predict {net} W={w} S={s} link={link or 'none'} {codec.name}, re-timed "
                          f"({1e3 * profile.compute_s:.1f} ms alone): {retimed.images_per_s:.1f} img/s "
                          f"(step {1e3 * retimed.step_s:.0f} ms, {retimed.bound})", flush=True)
                load_before = os.getloadavg()[0]
                run_dir, summary, measured = run_job(args, net, index, w, s, link, codec, data, repeat, order)
                index += 1
                row.setdefault("runs", []).append({
                    "run_dir": run_dir, "measured_images_per_s": measured,
                    "whole_run_images_per_s": summary["images_per_s"],
                    "load_average": [load_before, os.getloadavg()[0]],
                    "measured_push_bytes": summary.get("push_bytes_per_step"),
                    "measured_pull_bytes": summary.get("pull_bytes_per_step")})
                if retimed is not None:
                    row["runs"][-1].update(retimed_predicted_images_per_s=retimed.images_per_s,
                                           retimed_compute_ms=1e3 * retimed.compute_s,
                                           retimed_predicted_step_ms=1e3 * retimed.step_s)
                err = (retimed or p).images_per_s / measured - 1 if measured else None
                print(f"  measured {net} W={w} S={s} link={link or 'none'} {codec.name} {order_name(model_order)}"
                      f"{f' (pass {repeat + 1} of {args.repeats})' if args.repeats > 1 else ''}: {measured:.1f} img/s "
                      f"(whole run {summary['images_per_s']:.1f}); "
                      f"{'re-timed ' if retimed else ''}prediction {percent(err)}", flush=True)
        for row in results:
            runs = row["runs"]
            values = sorted(r["measured_images_per_s"] for r in runs)
            measured = statistics.median(values)
            middle = min(runs, key=lambda r: abs(r["measured_images_per_s"] - measured))
            row.update(run_dir=middle["run_dir"], measured_images_per_s=measured,
                       measured_min=values[0], measured_max=values[-1],
                       whole_run_images_per_s=statistics.median(r["whole_run_images_per_s"] for r in runs),
                       measured_push_bytes=middle["measured_push_bytes"],
                       measured_pull_bytes=middle["measured_pull_bytes"],
                       load_average=[runs[0]["load_average"][0], runs[-1]["load_average"][1]],
                       error=row["predicted_images_per_s"] / measured - 1 if measured else None)
            if args.retime:
                retimed = statistics.median(r["retimed_predicted_images_per_s"] for r in runs)
                row.update(retimed_predicted_images_per_s=retimed,
                           retimed_error=retimed / measured - 1 if measured else None)
    lines = ["| net | W | S | link Gbit/s | codec | order | log | predicted img/s | measured img/s (median steps"
             + (f", median of {args.repeats} runs) | runs' range" if args.repeats > 1 else ")")
             + " | whole run img/s | prediction error | within 20% |"
             + (" re-timed prediction img/s" + (" (median)" if args.repeats > 1 else "")
                + " | its error | within 20% |" if args.retime else "")
             + " push MB/step predicted / measured | pull MB/step predicted / measured | load average |",
             "| --- | ---: | ---: | ---: | --- | --- | --- | ---: | ---: |" + (" ---: |" if args.repeats > 1 else "")
             + " ---: | ---: | --- |" + (" ---: | ---: | --- |" if args.retime else "") + " ---: | ---: | --- |"]
    for r in results:
        m = r.get("measured_images_per_s")
        mb = r.get("measured_push_bytes")
        mq = r.get("measured_pull_bytes")
        spread = ""
        if args.repeats > 1:
            spread = (" — |" if m is None else f" {r['measured_min']:.1f}–{r['measured_max']:.1f} |")
        order = resolved_order((r["send_order"], r["inflight_mb"]), bases[r["net"]])
        lines.append(f"| {r['net']} | {r['workers']} | {r['servers']} | {r['link_gbps'] or 'none'} | {r['codec']} | "
                     f"{order_name(order)} | {'on' if r['wal'] else 'off'} | {r['predicted_images_per_s']:.1f} | {dr.fmt(m, '.1f')} |"
                     + spread + f" {dr.fmt(r.get('whole_run_images_per_s'), '.1f')} | "
                     f"{percent(r.get('error'))} | "
                     f"{'—' if r.get('error') is None else ('yes' if abs(r['error']) <= 0.2 else 'NO')} | "
                     + (f"{dr.fmt(r.get('retimed_predicted_images_per_s'), '.1f')} | {percent(r.get('retimed_error'))} | "
                        f"{'—' if r.get('retimed_error') is None else ('yes' if abs(r['retimed_error']) <= 0.2 else 'NO')} | "
                        if args.retime else "")
                     + f"{r['push_bytes'] / 1e6:.2f} / {dr.fmt(None if mb is None else mb / 1e6, '.2f')} | "
                     f"{r['pull_bytes'] / 1e6:.2f} / {dr.fmt(None if mq is None else mq / 1e6, '.2f')} | "
                     + ("—" if "load_average" not in r else "{:.1f} → {:.1f}".format(*r["load_average"])) + " |")
    table = "\n".join(lines) + "\n"
    print("\n" + table)
    with open(os.path.join(args.work, "validation.md"), "w") as f:
        f.write(table)
    with open(os.path.join(args.work, "validation.json"), "w") as f:
        json.dump({"rates": rates.source, "sgemm": ceiling, "repeats": args.repeats, "retime": args.retime,
                   "network": args.network, "rates_used": dataclasses.asdict(rates),
                   "rates_by_link": {f"{k:g}": dataclasses.asdict(v) for k, v in by_link.items()},
                   "emulate_step_ms": args.emulate_step_ms, "bench_servers": args.bench_servers,
                   "rows": results}, f, indent=1)
    print(f"written: {args.work}/validation.md, validation.json")


if __name__ == "__main__":
    main()
