"""fabricate — hand-written run directories for the tools' tests (config.toml + metrics JSONL in
the format the worker, server and launcher write; see tools/downpour_runs.py), and a way to run
a tool as a user does."""
import json
import math
import os
import socket
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TOOLS = os.path.join(ROOT, "tools")
BATCH = 64
SHARD = 30000  # images per worker shard: epoch = images / SHARD


class TempDirTest(unittest.TestCase):
    """A test with a fresh temporary directory, self.tmp, removed after it."""

    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory(prefix="downpour-tools-")
        self.tmp = self._tmp.name

    def tearDown(self):
        self._tmp.cleanup()


def free_port_pair():
    """Two consecutive free TCP ports (servers listen on base_port + i), and a third for the
    coordinator. Bound to port 0 so the kernel picks them; a tiny race remains, as for any test."""
    for _ in range(50):
        with socket.socket() as a:
            a.bind(("127.0.0.1", 0))
            base = a.getsockname()[1]
            if base >= 65534:
                continue
            with socket.socket() as b, socket.socket() as c:
                try:
                    b.bind(("127.0.0.1", base + 1))
                except OSError:
                    continue
                c.bind(("127.0.0.1", 0))
                return base, c.getsockname()[1]
    raise RuntimeError("no two consecutive free ports on 127.0.0.1")


FMNIST = "/usr/share/datasets/fashion-mnist"


def real_job_config(path, *, workers, steps, batch_size, cluster_extra="", eval_extra="", coordinator=None,
                    base_port=None, checkpoint_every=0, extra=""):
    """Writes the run config of a real Fashion-MNIST job of fmnist_small over 2 servers (for the
    tests that launch one with DOWNPOUR_BUILD_DIR's binaries); returns path. The coordinator
    ("host:port") and the servers' base port default to free loopback ports; `extra` is appended
    (tables of its own, e.g. [security])."""
    if coordinator is None or base_port is None:
        base_port, port = free_port_pair()
        coordinator = f"127.0.0.1:{port}"
    with open(path, "w") as f:
        f.write(f"""[run]
seed = 3
[model]
config = "{ROOT}/configs/models/fmnist_small.toml"
[cluster]
servers = 2
workers = {workers}
coordinator = "{coordinator}"
base_port = {base_port}
{cluster_extra}
[worker]
batch_size = {batch_size}
steps = {steps}
threads = 1
[data]
train = "{FMNIST}/train-images-idx3-ubyte.gz"
test = "{FMNIST}/t10k-images-idx3-ubyte.gz"
[eval]
test_batches = 2
{eval_extra}
[checkpoint]
every_updates = {checkpoint_every}
{extra}""")
    return path


def summarize(test, run, *args):
    """Runs downpour-summarize on `run` (asserting it exits 0 in `test`); returns the summary.json
    it wrote and its stdout."""
    r = run_tool("downpour-summarize", *args, run)
    test.assertEqual(r.returncode, 0, r.stderr)
    with open(os.path.join(run, "summary.json")) as f:
        return json.load(f), r.stdout


def history_report(build_dir, run_dir, out, timeout=300):
    """Runs build_dir's downpour-history on run_dir with --json out; returns (the CompletedProcess,
    the JSON report or None when it wrote none)."""
    if os.path.exists(out):
        os.remove(out)
    r = subprocess.run([os.path.join(build_dir, "server", "downpour-history"), run_dir, "--json", out],
                       capture_output=True, text=True, timeout=timeout)
    report = None
    if os.path.exists(out):
        with open(out) as f:
            report = json.load(f)
    return r, report


def run_tool(tool, *args, env=None, cwd=None):
    """Runs tools/<tool> with this interpreter; returns the CompletedProcess (text)."""
    return subprocess.run([sys.executable, os.path.join(TOOLS, tool), *args], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=120)


def write_config(run_dir, mode="async", workers=2, servers=2, name="fabricated", consistency_extra=""):
    os.makedirs(os.path.join(run_dir, "metrics"), exist_ok=True)
    with open(os.path.join(run_dir, "config.toml"), "w") as f:
        f.write(f'[run]\nname = "{name}"\n\n[cluster]\nservers = {servers}\nworkers = {workers}\n\n'
                f'[consistency]\nmode = "{mode}"\n{consistency_extra}\n[worker]\nbatch_size = {BATCH}\nsteps = 200\n')


def append_jsonl(run_dir, name, records):
    """Appends records to metrics/<name>.jsonl, as the processes do (files are never rewritten)."""
    with open(os.path.join(run_dir, "metrics", name + ".jsonl"), "a") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")


def top1_at(step):
    """A made-up accuracy curve: 0.50 at step 0, 0.89 reached at step 150, at most 0.93."""
    return round(min(0.5 + 0.39 * step / 150, 0.93), 6)


def loss_at(step):
    return 0.3 + 2.0 * math.exp(-step / 60)


def worker_segment(wid, t0, first_step, last_step, wall0=0.0, resumed=False, step_s=1.0, eval_every=0,
                   final=False, done=True, loss=loss_at, top1=top1_at, eval_wall=True, stats=None):
    """One worker's records for one segment: start, then steps first_step+1..last_step, one per
    step_s seconds of both wall clock (t) and training clock (wall_s, continuing from wall0).
    Worker 0 evaluates every eval_every steps, and at the end when final. stats: [(server,
    chunk_updates, staleness_sum, staleness_max, histogram)] for server_stats records after done."""
    def rec(t, event, **fields):
        return {"t": t, "role": "worker", "id": wid, "event": event, **fields}

    start = rec(t0, "start", planned_steps=last_step, batch_size=BATCH, shard_size=SHARD)
    if resumed:
        start.update(resumed=True, resume_step=first_step, wall_offset_s=wall0)
    out = [start]

    def eval_rec(t, wall, step, is_final):
        r = rec(t, "eval", final=is_final, step=step, epoch=step * BATCH / SHARD, test_loss=loss(step),
                top1=top1(step), top5=0.99, test_images=10000, server_versions=step)
        if eval_wall:
            r["wall_s"] = wall
        return r

    for step in range(first_step + 1, last_step + 1):
        t, wall = t0 + (step - first_step) * step_s, wall0 + (step - first_step) * step_s
        out.append(rec(t, "step", wall_s=wall, step=step, epoch=step * BATCH / SHARD, loss=loss(step),
                       loss_ema=loss(step), images=step * BATCH, images_per_s=BATCH / step_s))
        if wid == 0 and eval_every and step % eval_every == 0 and step < last_step:
            out.append(eval_rec(t, wall, step, False))
    t_end = t0 + (last_step - first_step) * step_s
    wall_end = wall0 + (last_step - first_step) * step_s
    if wid == 0 and final:
        out.append(eval_rec(t_end, wall_end, last_step, True))
    if done:
        out.append(rec(t_end, "done", steps=last_step, images=last_step * BATCH, wall_s=wall_end, train_s=wall_end,
                       images_per_s=last_step * BATCH / wall_end if wall_end else 0, final_top1=None))
    for server, updates, stale_sum, stale_max, hist in stats or []:
        out.append(rec(t_end + 0.01, "server_stats", server=server, ok=True, pushes_applied=updates,
                       pushes_rejected=0, chunk_updates=updates, staleness_sum=stale_sum, staleness_max=stale_max,
                       dropped_late=0, staleness_histogram=json.dumps(hist)))
    return out


def server_records(sid, t0, pulls):
    """server_start then one pull record per (ahead, wait_ms)."""
    out = [{"t": t0 - 1, "role": "server", "id": sid, "event": "server_start", "mode": "async"}]
    for k, (ahead, wait_ms) in enumerate(pulls):
        out.append({"t": t0 + k, "role": "server", "id": sid, "event": "pull", "worker": 0, "ahead": ahead,
                    "wait_ms": wait_ms})
    return out


def simple_run(run_dir, mode="async", steps=100, t0=1000.0, with_stats=True, name="fabricated", top1=top1_at,
               loss=loss_at):
    """A finished, never-resumed run: 2 workers, 2 servers, worker 0 evaluates every 20 steps
    (top1 and loss: the curves, e.g. a run collapsed to chance)."""
    write_config(run_dir, mode=mode, name=name)
    stats = [(0, 300, 300, 3, [100, 100, 50, 50]), (1, 300, 150, 2, [200, 50, 50])] if with_stats else None
    for wid in range(2):
        append_jsonl(run_dir, f"worker-{wid}",
                     worker_segment(wid, t0 + 0.5 * wid, 0, steps, eval_every=20, final=True, stats=stats,
                                    top1=top1, loss=loss))
    for sid in range(2):
        append_jsonl(run_dir, f"server-{sid}", server_records(sid, t0, [(0, 0.0), (2, 4.0)]))
    return run_dir


CLUSTER_TASKS = ["coordinator", "server-0", "server-1", "worker-0", "worker-1"]  # ranks 0..4 of a 2 × 2 job


def launch_records(t_start, t_end, child, code=0, resumed=False):
    """One launcher segment as downpour-launch writes it: start, an exit per child, end."""
    rec = lambda t, event, **fields: {"t": t, "role": "launcher", "id": 0, "event": event, **fields}  # noqa: E731
    return [rec(t_start, "start", servers=2, workers=2, mode="async", resumed=resumed),
            rec(t_end, "exit", child=child, code=code, stopped=False),
            rec(t_end, "end", code=code, reason="all primaries exited 0" if code == 0 else f"{child} exited {code}",
                seconds=t_end - t_start)]


def append_launch(run_dir, name, records):
    """Appends records to <run_dir>/<name>.jsonl (launch.jsonl or launch-<task>.jsonl)."""
    with open(os.path.join(run_dir, name + ".jsonl"), "a") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")


def cluster_run(run_dirs, steps=100, t0=1000.0, omit=(), codes=None):
    """A finished 2 × 2 job as a cluster launch leaves it: task i of CLUSTER_TASKS writes its
    metrics and launch-<task>.jsonl into run_dirs[i % len(run_dirs)] (one directory: a shared
    filesystem; several: each host's part), and every part gets the same config.toml. The records
    are the same however the tasks are placed. omit: tasks that wrote nothing; codes: {task: exit
    code}. Returns {task: its directory}."""
    stats = [(0, 300, 300, 3, [100, 100, 50, 50]), (1, 300, 150, 2, [200, 50, 50])]
    for d in run_dirs:
        write_config(d)
    placed = {}
    t_end = t0 + steps + 0.5  # worker 1 starts 0.5 s after worker 0
    for i, task in enumerate(CLUSTER_TASKS):
        d = placed[task] = run_dirs[i % len(run_dirs)]
        if task in omit:
            continue
        role, _, tid = task.partition("-")
        if role == "worker":
            wid = int(tid)
            append_jsonl(d, task, worker_segment(wid, t0 + 0.5 * wid, 0, steps, eval_every=20, final=True, stats=stats))
        elif role == "server":
            append_jsonl(d, task, server_records(int(tid), t0, [(0, 0.0), (2, 4.0)]))
        else:
            append_jsonl(d, task, [{"t": t0 - 1.5, "role": "coordinator", "id": 0, "event": "coordinator_start",
                                    "servers": 2, "workers": 2, "heartbeat_timeout_ms": 5000},
                                   {"t": t_end + 0.2, "role": "coordinator", "id": 0, "event": "coordinator_end",
                                    "dead_workers": 0, "ok": True}])
        # Tasks start 0.1 s apart (the coordinator first) and end as the coordinator's shutdown reaches them.
        append_launch(d, f"launch-{task}", launch_records(t0 - 3 + 0.1 * i, t_end + 1 + 0.1 * i,
                                                          task.replace("-", " "), (codes or {}).get(task, 0)))
    return placed


def evaluator_run(run_dir, steps=100, t0=1000.0, every=40, workers=2, lag=3, eval_s=2.0, name="with-evaluator"):
    """A finished 2 × 2 run evaluated by its evaluator process (eval.evaluator = true): workers
    take a step per second and log no evaluations; metrics/evaluator.jsonl holds an evaluation
    every `every` worker batches (all workers together), each `lag` batches past its point and
    written `eval_s` after its snapshot was pulled, then the final one once both workers were done.
    Returns the evaluator's eval records."""
    write_config(run_dir, name=name)
    with open(os.path.join(run_dir, "config.toml"), "a") as f:
        f.write('\n[data]\ntest = "test_lmdb"\n\n[eval]\nevaluator = true\n')
    for wid in range(workers):
        append_jsonl(run_dir, f"worker-{wid}", worker_segment(wid, t0, 0, steps))
    rec = lambda t, event, **fields: {"t": t, "role": "evaluator", "id": 0, "event": event, **fields}  # noqa: E731
    evals, total = [], steps * workers
    for point in range(every, total, every):
        pulled = t0 + (point + lag) / workers  # workers together do `workers` batches per second
        iter_ = point + lag
        evals.append(rec(pulled + eval_s, "eval", final=False, due="updates", iter=iter_, iter_min=iter_ - 1,
                         train_images=iter_ * BATCH, epoch=iter_ * BATCH / (SHARD * workers), due_iter=point,
                         lag_updates=lag, skipped=0, eval_s=eval_s, test_loss=loss_at(iter_ / workers),
                         top1=top1_at(iter_ / workers), top5=0.99, test_images=10000, server_versions=iter_))
    t_end = t0 + steps
    evals.append(rec(t_end + 0.5 + eval_s, "eval", final=True, due="final", iter=total, iter_min=total,
                     train_images=total * BATCH, epoch=total * BATCH / (SHARD * workers), skipped=0, eval_s=eval_s,
                     test_loss=loss_at(steps), top1=top1_at(steps), top5=0.99, test_images=10000,
                     server_versions=total))
    append_jsonl(run_dir, "evaluator", [rec(t0 - 0.5, "start", servers=2, workers=workers, every_updates=every)] +
                 evals + [rec(t_end + 0.6 + eval_s, "done", final=True, final_top1=top1_at(steps))])
    return evals
