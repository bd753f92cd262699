"""downpour_runs — what the Python tools (tools/downpour-*) share: reading a run directory into
one summary, the version string, and one error and exit-code scheme.

A run directory holds (docs/operations.md "The run directory"): config.toml, logs/, launch.jsonl,
metrics/<role>-<id>.jsonl (one JSON object per line: t, role, id, event, fields),
model_final.dpt, summary.json.

Runs in parts. A cluster launch (downpour-launch --slurm / --mpi / --role) needs no shared
filesystem: every task writes its own part of a run directory of the same name on its own host
(config.toml, identical in every task; logs/<role>-<i>.log; metrics/<role>-<i>.jsonl; and its
launcher's records launch-<role>[-<i>].jsonl instead of a local run's one launch.jsonl). The
tools read such a run as RUN_DIR+RUN_DIR2+... (the parts copied back from the hosts, in any
order; a directory whose own name holds '+' is taken whole). The parts are merged as if they were
one directory:
  - config.toml must say the same in every part (compared as parsed TOML), else a usage error
    naming both files and the first key that differs;
  - metrics/*.jsonl and launch*.jsonl are the union of the parts' files; one file name in two
    parts is a usage error naming both, unless the two are byte-identical (a shared filesystem
    reached twice), which count once;
  - summary.json is written to the first part.
A cluster run (launch-*.jsonl files, in one shared directory or in parts) or any run in several
parts is checked for completeness: every task's launch-<role>[-<i>].jsonl and
metrics/<role>-<i>.jsonl (coordinator, servers 0..S-1, workers 0..W-1) should be there. What is
missing is not an error — a task that died before writing leaves a hole too — but the tools warn,
naming each file, and summary.json lists them under "missing".

Launch records. Each launch*.jsonl holds one task's launcher records (start, exit per child,
end; a resumed run appends another start..end). The run's launch segment k spans from the
earliest k-th start to the latest k-th end over all tasks (a task without an end: its last
record); launch_wall_s adds the segments up. A task whose last segment ended with a non-zero
code, or has no end (an empty file: no start either), is listed in launch_failed.

Resumed runs. A run directory may hold several segments: the first launch, then one per
`downpour-launch --resume`. Worker files are appended to; a resumed worker's `start` record
carries "resumed": true, "resume_step": S (the step it continues after) and "wall_offset_s": X
(training time it had before), and its later `step`/`eval` records have step > S and a `wall_s`
that continues from X. When a worker resumes at a step below what it had already logged (sync
mode: the servers' checkpoint was older), its earlier records with step > S are superseded and
dropped. A worker's k-th `start` record opens its k-th segment; the run's segment k is the k-th
segment of every worker (a resume restarts the whole job).

The evaluator. A run with an evaluator process (config eval.evaluator = true and a data.test;
runs from before it have no such key and were evaluated by worker 0) has
metrics/evaluator.jsonl (role "evaluator"): its eval records are the run's evaluations, and
worker 0's (none, normally) are not used. An evaluator record has no wall_s: it is placed on the
run's active clock by when its snapshot was pulled, t − eval_s (the run segment that falls in,
measured from that segment's first worker start); it carries train_images (images all workers had processed, from the servers'
lr-schedule iteration) and a global epoch (train_images / training-set size). A worker-0
evaluation's images are estimated as its step × batch_size × workers.

Diverged runs. A run whose final top-1 is at most 1.5 / num_classes (chance; num_classes from the
model file's layer feeding SoftmaxWithLoss), or that logged a non-finite (null, NaN, Inf) training
or final test loss, is marked "diverged": true in summary.json, with "diverged_reason"; the
comparison table has a "diverged" column, and downpour-experiment / downpour-summarize print one
line naming the run, the reason and what to try (diverged_line).

Exit codes, the same for every tool:
  0  ok
  1  runtime failure: a run failed, a file could not be read or written, gnuplot failed
  2  usage or config error: bad arguments, a bad experiment file, a directory that is not a
     run directory, parts of different runs
"""
import bisect
import filecmp
import glob
import json
import math
import os
import subprocess
import sys
import tomllib

TARGET_TOP1 = 0.89  # the Fashion-MNIST accuracy the default job must reach


def interpolated_target(evals, target=TARGET_TOP1):
    """When the run crossed `target` top-1 between its evaluations, from `evals` [(active time,
    record)] in time order: the time and epoch where the straight line between the last
    evaluation below the target and the first at or above it crosses it, and the gap between
    those two evaluations (the bracket the crossing lies in; 0 when the first one reached it).
    Nones when it never reached it."""
    none = {"time_to_target_interp_s": None, "epochs_to_target_interp": None, "target_bracket_s": None}
    for i, (t, r) in enumerate(evals):
        a = r.get("top1") or 0
        if a < target:
            continue
        if i == 0:
            return {"time_to_target_interp_s": t, "epochs_to_target_interp": r.get("epoch"), "target_bracket_s": 0.0}
        t0, r0 = evals[i - 1]
        a0 = r0.get("top1") or 0
        f = (target - a0) / (a - a0) if a > a0 else 1.0
        e, e0 = r.get("epoch"), r0.get("epoch")
        return {"time_to_target_interp_s": t0 + f * (t - t0),
                "epochs_to_target_interp": e0 + f * (e - e0) if e is not None and e0 is not None else e,
                "target_bracket_s": t - t0}
    return none


def target_fields(evals, target=TARGET_TOP1):
    """A summary's fields for reaching `target` top-1, from `evals` [(active time, record)] in
    time order: the target, the first evaluation at or past it (time, epoch) and the crossing
    interpolated before it (interpolated_target)."""
    reached = [(t, r) for t, r in evals if (r.get("top1") or 0) >= target]
    return {"target_top1": target,
            "time_to_target_s": reached[0][0] if reached else None,
            "epochs_to_target": reached[0][1].get("epoch") if reached else None,
            **interpolated_target(evals, target)}


def at_target(summary, target):
    """A summary whose times and epochs to the target are recomputed from its evaluations for
    another target top-1 (downpour-experiment's experiment.target)."""
    if target == summary.get("target_top1"):
        return summary
    return dict(summary, **target_fields([(e["wall_s"], e) for e in summary.get("evals", [])], target))


# A run whose final top-1 is at most this many times chance (1 / num_classes) learned nothing:
# it diverged (e.g. 10.0% for 10 classes; chance plus sampling noise stays well under 15%).
DIVERGED_CHANCE_FACTOR = 1.5
DEFAULT_MODEL = "configs/models/fmnist_small.toml"  # common/run_config.h ModelConfig::config
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository root
LOSS_CURVE_POINTS = 300  # the training-loss curve in summary.json is averaged down to this many points

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_CODES_HELP = """exit codes:
  0  ok
  1  runtime failure: a run failed, a file could not be read or written, gnuplot failed
  2  usage or config error: bad arguments, a bad experiment file, a directory that is not a
     run directory, parts of different runs"""


class ToolError(Exception):
    """A runtime failure: the tool exits 1."""
    exit_code = EXIT_FAILURE


class UsageError(ToolError):
    """Bad arguments or configuration: the tool exits 2."""
    exit_code = EXIT_USAGE


# ---------------------------------------------------------------------------------------------
# Command-line pieces shared by the tools.

def algorithm_label(consistency, solver=None):
    """The update rule of a run's [consistency] and [solver] in words (docs/algorithms.md): "sgd",
    or e.g. "dc-asgd (lambda 0.04)", "dc-asgd-a (lambda0 2)", "sgd, lr/staleness", "sgd, 1 backup",
    "adagrad" (solver.update; momentum SGD is "sgd")."""
    algo = consistency.get("algorithm", "sgd")
    if algo == "sgd" and (solver or {}).get("update", "momentum") == "adagrad":
        algo = "adagrad"
    if algo == "dc-asgd":
        algo = f"dc-asgd (lambda {consistency.get('dc_lambda', 0.04):g})"
    elif algo == "dc-asgd-a":
        algo = f"dc-asgd-a (lambda0 {consistency.get('dc_lambda0', 2.0):g})"
    elif algo == "local-sgd":
        algo = f"local-sgd (H {consistency.get('local_steps', 8)})"
    elif algo == "easgd":
        alpha = consistency.get("easgd_alpha", 0) or 0
        algo = f"easgd (tau {consistency.get('easgd_tau', 4)}, alpha {alpha:g})" if alpha else \
            f"easgd (tau {consistency.get('easgd_tau', 4)})"
    parts = [algo]
    if consistency.get("staleness_aware_lr"):
        parts.append("lr/staleness")
    b = consistency.get("backup_workers", 0) or 0
    if b:
        parts.append(f"{b} backup" + ("s" if b > 1 else ""))
    return ", ".join(parts)


def version_string(tool):
    """`<tool> <version> (commit <short sha>)`: the version is the first line of ROOT/VERSION."""
    try:
        with open(os.path.join(ROOT, "VERSION")) as f:
            version = f.readline().strip() or "unknown"
    except OSError:
        version = "unknown"
    try:
        r = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                           timeout=10)
        commit = r.stdout.strip() if r.returncode == 0 and r.stdout.strip() else "unknown"
    except (OSError, subprocess.SubprocessError):
        commit = "unknown"
    return f"{tool} {version} (commit {commit})"


def add_version_arg(parser, tool):
    parser.add_argument("-V", "--version", action="version", version=version_string(tool),
                        help="print the tool's version and commit, then exit")


def fail(tool, message, code):
    """Prints `<tool>: <message>` to stderr and exits with `code`."""
    print(f"{tool}: {message}", file=sys.stderr)
    sys.exit(code)


def run_main(tool, main):
    """Runs main() and turns its errors into the exit-code scheme above."""
    try:
        main()
    except ToolError as e:
        fail(tool, str(e), e.exit_code)
    except OSError as e:
        where = f"{e.filename}: " if e.filename else ""
        fail(tool, f"{where}{e.strerror or e}", EXIT_FAILURE)


def fmt(v, spec, none="—"):
    return none if v is None else format(v, spec)


# ---------------------------------------------------------------------------------------------
# Reading a run directory.

_TORN_WARNED = set()


def read_jsonl(path):
    """The records of one JSONL file, in file order. Each gets "_line" (its line number).

    A torn line (the start of a line whose write stopped half-way, e.g. on a full disk: it does not
    parse and does not end in "}" as every written line does; common/metrics.h) is skipped with one
    warning on stderr; any other damage is an error naming the file and line."""
    records = []
    torn = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError as e:
                if not line.endswith("}"):
                    torn.append(n)
                    continue
                raise ToolError(f"{path}:{n}: not a JSON object: {e}") from None
            if not isinstance(r, dict):
                raise ToolError(f"{path}:{n}: not a JSON object")
            r["_line"] = n
            records.append(r)
    if torn and path not in _TORN_WARNED:  # once per file, however often a tool reads it
        _TORN_WARNED.add(path)
        warn(os.path.basename(sys.argv[0]), f"warning: {path}: skipped {len(torn)} torn line(s), the first at line "
             f"{torn[0]} (a write that stopped half-way)")
    return records


PART_SEPARATOR = "+"  # RUN_DIR+RUN_DIR2: one run whose parts lie in several directories


def run_parts(spec):
    """RUN_DIR or RUN_DIR+RUN_DIR2+... → the run's directories in the given order. A spec that is
    itself a directory is one part even if its name holds '+'."""
    if os.path.isdir(spec) or PART_SEPARATOR not in spec:
        return [spec]
    parts = spec.split(PART_SEPARATOR)
    if not all(parts):
        raise UsageError(f"{spec!r}: an empty part; expected RUN_DIR or RUN_DIR+RUN_DIR2+...")
    return parts


def read_config(run_dir):
    if not os.path.isdir(run_dir):
        raise UsageError(f"{run_dir}: no such directory")
    config_path = os.path.join(run_dir, "config.toml")
    if not os.path.exists(config_path):
        raise UsageError(f"{run_dir}: no config.toml (not a run directory)")
    with open(config_path, "rb") as f:
        try:
            return tomllib.load(f)
        except tomllib.TOMLDecodeError as e:
            raise UsageError(f"{config_path}: {e}") from None


def config_difference(a, b, prefix=""):
    """The first key (sorted, depth first) where two parsed configs differ, in words; None if equal."""
    for key in sorted(set(a) | set(b)):
        name = prefix + key
        if key not in a or key not in b:
            return f"{name} is set only in the {'second' if key in b else 'first'}"
        if isinstance(a[key], dict) and isinstance(b[key], dict):
            inner = config_difference(a[key], b[key], name + ".")
            if inner:
                return inner
        elif a[key] != b[key]:
            return f"{name} is {a[key]!r} in the first, {b[key]!r} in the second"
    return None


def read_run_config(parts):
    """The run's config: every part's config.toml must say the same (each task of a cluster run
    writes the identical file); a difference means the parts are of different runs."""
    config = read_config(parts[0])
    for part in parts[1:]:
        other = read_config(part)
        diff = config_difference(config, other)
        if diff:
            raise UsageError(f"{os.path.join(parts[0], 'config.toml')} and {os.path.join(part, 'config.toml')} "
                             f"differ ({diff}): the directories are not parts of one run")
    return config


def gather_files(parts, patterns):
    """{name relative to its part: path}, sorted by name, for the parts' files matching the glob
    patterns. One name in two parts must be one file reached twice (byte-identical: counted once);
    two different files would be two tasks claiming one role, or parts of two runs."""
    found = {}
    for part in parts:
        for pattern in patterns:
            for path in sorted(glob.glob(os.path.join(part, pattern))):
                name = os.path.relpath(path, part)
                if name not in found:
                    found[name] = path
                elif not filecmp.cmp(found[name], path, shallow=False):
                    raise UsageError(f"{found[name]} and {path}: two different files named {name} in the parts of "
                                     "one run (only the same file reached twice, on a shared filesystem, may repeat)")
    return dict(sorted(found.items()))


def load_run(parts):
    """Returns (config dict, {path: records in file order} for every metrics/*.jsonl of the parts,
    ordered by file name so that a run reads the same whether in one directory or in parts)."""
    config = read_run_config(parts)
    files = {path: read_jsonl(path) for path in gather_files(parts, ["metrics/*.jsonl"]).values()}
    if not any(files.values()):
        raise ToolError(f"{PART_SEPARATOR.join(parts)}: no metrics/*.jsonl records (did the run start?)")
    return config, files


def split_segments(path, records):
    """One worker's records (file order) → its segments, each opened by a `start` record."""
    segments = [[]]
    for r in records:
        if r.get("event") == "start" and segments[-1]:
            segments.append([])
        if "t" not in r:
            raise ToolError(f"{path}:{r['_line']}: record has no \"t\" field")
        segments[-1].append(r)
    return segments


def drop_superseded(path, segments):
    """Drops `step`/`eval` records that a later segment's resume_step supersedes (in place).

    A resumed start with resume_step S means the worker's history continues after step S, so
    records of earlier segments with step > S never happened as far as the run is concerned."""
    cutoff = math.inf
    for seg in reversed(segments):
        seg[:] = [r for r in seg if not (r.get("event") in ("step", "eval") and (r.get("step") or 0) > cutoff)]
        start = seg[0] if seg and seg[0].get("event") == "start" else None
        if start is not None and start.get("resumed"):
            if not isinstance(start.get("resume_step"), int):
                raise ToolError(f"{path}:{start['_line']}: resumed start record needs an integer \"resume_step\"")
            cutoff = min(cutoff, start["resume_step"])


class Worker:
    """One worker's segments (superseded records dropped) and its id."""

    def __init__(self, path, records):
        self.path = path
        self.id = records[0].get("id") if records else None
        self.segments = split_segments(path, records)
        self.segment_bounds = [self._bounds(seg) for seg in self.segments]  # before dropping: time spent
        drop_superseded(path, self.segments)

    @staticmethod
    def _bounds(seg):
        """(first start t, end t): the end is the segment's last `done`, else its last record."""
        starts = [r["t"] for r in seg if r.get("event") == "start"]
        dones = [r["t"] for r in seg if r.get("event") == "done"]
        return (min(starts) if starts else seg[0]["t"], max(dones) if dones else seg[-1]["t"])

    def records(self, event):
        """(segment index, record) for every kept record of this event."""
        return [(k, r) for k, seg in enumerate(self.segments) for r in seg if r.get("event") == event]


def worker_files(files):
    """{path: records} → [Worker], one per file whose records are worker records."""
    workers = []
    for path, records in files.items():
        if records and records[0].get("role") == "worker":
            workers.append(Worker(path, records))
    return workers


def segment_times(workers):
    """Per run segment: (t0, t_end, active seconds before it). t0 = the segment's first worker
    start, t_end = its last worker end; downtime between segments is not counted."""
    count = max(len(w.segments) for w in workers)
    spans = []
    for k in range(count):
        bounds = [w.segment_bounds[k] for w in workers if k < len(w.segment_bounds)]
        spans.append((min(b[0] for b in bounds), max(b[1] for b in bounds)))
    out, before = [], 0.0
    for t0, t_end in spans:
        out.append((t0, t_end, before))
        before += t_end - t0
    return out


def active_time(record, k, times):
    """A record's time on the run's active clock: its own wall_s (the worker's training clock,
    which a resumed worker continues) when present, else t − t0 of its segment plus the active
    time of the segments before (runs written before wall_s was logged)."""
    if record.get("wall_s") is not None:
        return record["wall_s"]
    t0, _, before = times[k]
    return record["t"] - t0 + before


def staleness_from_server_stats(workers):
    """Servers' own staleness counters: each worker asks every server at its end; per server and
    segment the most complete answer (most chunk updates) counts. A restarted server counts from
    zero, so the segments' counters add up."""
    best = {}
    for w in workers:
        for k, r in w.records("server_stats"):
            if not r.get("ok"):
                continue
            key = (k, r["server"])
            if key not in best or r["chunk_updates"] >= best[key]["chunk_updates"]:
                best[key] = r
    hist = []
    for r in best.values():
        h = r["staleness_histogram"]
        h = json.loads(h) if isinstance(h, str) else h
        hist += [0] * (len(h) - len(hist))
        for i, v in enumerate(h):
            hist[i] += v
    updates = sum(hist)
    stale_sum = sum(r["staleness_sum"] for r in best.values())
    return {
        "staleness_mean": (stale_sum / updates) if updates else None,
        "staleness_max": max((r["staleness_max"] for r in best.values()), default=None),
        "staleness_histogram": hist,
    }


def loss_curve(workers, times, points=LOSS_CURVE_POINTS):
    """Training loss over active time: step records of every worker, averaged per time bucket
    (at most `points` buckets) → [{wall_s, epoch, loss, loss_ema}]."""
    steps = []
    for w in workers:
        for k, r in w.records("step"):
            loss_ema = r.get("loss_ema")
            if loss_ema is None or not math.isfinite(loss_ema):
                continue
            steps.append((active_time(r, k, times), r.get("epoch") or 0.0, r.get("loss"), loss_ema))
    if not steps:
        return []
    t_max = max(s[0] for s in steps) or 1.0
    buckets = {}
    for s in steps:
        buckets.setdefault(min(int(s[0] / t_max * points), points - 1), []).append(s)
    curve = []
    for b in sorted(buckets):
        group = buckets[b]
        losses = [s[2] for s in group if s[2] is not None and math.isfinite(s[2])]
        curve.append({"wall_s": sum(s[0] for s in group) / len(group),
                      "epoch": sum(s[1] for s in group) / len(group),
                      "loss": sum(losses) / len(losses) if losses else None,
                      "loss_ema": sum(s[3] for s in group) / len(group)})
    return curve


def last_done_per_worker(workers):
    """The last `done` record of each worker id: a worker resumed after it finished writes a
    second done with the same totals, so totals come from the last one, never a sum."""
    last = {}
    for w in workers:
        for _, r in w.records("done"):
            last[w.id] = r
    return list(last.values())


def steps_done(workers):
    """Steps of all workers: each worker's last `done` record's steps; a multi-model worker's done
    record has none ([[models]]: it trains in stages, client/worker/multi_model.cc), so its
    stages' steps added up count instead."""
    last, stage_steps = {}, {}
    for w in workers:
        for _, r in w.records("done"):
            last[w.id] = r
        for _, r in w.records("stage"):
            stage_steps[w.id] = stage_steps.get(w.id, 0) + (r.get("steps") or 0)
    return sum(d["steps"] if isinstance(d.get("steps"), int) else stage_steps.get(wid, 0) for wid, d in last.items())


def images_per_s(done):
    train_s = done.get("train_s")
    if train_s:
        return (done.get("images") or 0) / train_s
    return done.get("images_per_s") or 0.0


def server_pulls(files):
    """Servers log every pull they serve: how far ahead of the slowest worker the puller was and
    how long the consistency policy held the pull back."""
    pulls = [r for records in files.values() for r in records
             if r.get("role") == "server" and r.get("event") == "pull"]
    aheads = [r["ahead"] for r in pulls if r.get("ahead") is not None]
    waits = [r.get("wait_ms") or 0 for r in pulls]
    return {
        "pulls_logged": len(pulls),
        "clock_ahead_max": max(aheads) if aheads else None,
        "pull_wait_ms_mean": (sum(waits) / len(waits)) if waits else None,
    }


LAUNCH_PATTERNS = ["launch.jsonl", "launch-*.jsonl"]  # a local run's launcher; a cluster task's


def launch_task(name):
    """launch.jsonl → "launcher" (a local run's one launcher); launch-worker-1.jsonl → "worker-1"."""
    stem = name[:-len(".jsonl")]
    return stem[len("launch-"):] if stem.startswith("launch-") else "launcher"


def launch_summary(launch_files):
    """launch_tasks, launch_wall_s and launch_failed from the launchers' records ({name: path})."""
    tasks = {launch_task(name): split_segments(path, read_jsonl(path)) for name, path in launch_files.items()}
    started = [segs for segs in tasks.values() if segs[0]]
    spans = []
    for k in range(max((len(segs) for segs in started), default=0)):
        bounds = [segment_span(segs[k]) for segs in started if k < len(segs)]
        spans.append(max(b[1] for b in bounds) - min(b[0] for b in bounds))
    failed = []
    for task, segs in tasks.items():
        ends = [r for r in segs[-1] if r.get("event") == "end"]
        if not segs[0]:
            failed.append({"task": task, "code": None, "reason": "no records: the launcher stopped before its start"})
        elif not ends:
            failed.append({"task": task, "code": None, "reason": "no end record: still running, or killed"})
        elif ends[-1].get("code") != 0:
            failed.append({"task": task, "code": ends[-1].get("code"), "reason": ends[-1].get("reason")})
    return {"launch_tasks": len(tasks), "launch_wall_s": sum(spans) if spans else None, "launch_failed": failed}


def segment_span(seg):
    """(first record t, its end record's t, else its last record's t) of one launcher segment."""
    ends = [r["t"] for r in seg if r.get("event") == "end"]
    return seg[0]["t"], ends[-1] if ends else seg[-1]["t"]


def has_evaluator(config):
    """Whether the run had an evaluator process (see the module's docstring)."""
    return bool(config.get("eval", {}).get("evaluator", False) and config.get("data", {}).get("test", ""))


def evaluator_evals(files, times):
    """The evaluator's eval records as (active time, record), by "t" (see the module's
    docstring); [] for a run without an evaluator file."""
    out = []
    for records in files.values():
        if not records or records[0].get("role") != "evaluator":
            continue
        for r in records:
            if r.get("event") == "eval" and isinstance(r.get("t"), (int, float)):
                # The weights are those pulled when the evaluation began (t is its end).
                eval_s = r.get("eval_s") if isinstance(r.get("eval_s"), (int, float)) else 0.0
                out.append((run_clock(r["t"] - eval_s, times), r))
    return out


def run_clock(t, times):
    """Wall-clock time t on the run's active clock: t − t0 of the latest segment that started at or
    before t (the first if none did), plus the active time before that segment."""
    k = 0
    for i, (t0, _, _) in enumerate(times):
        if t0 <= t:
            k = i
    t0, _, before = times[k]
    return max(0.0, t - t0) + before


def expected_tasks(config):
    """The tasks of a cluster run: coordinator, server-0..S-1, worker-0..W-1 (from [cluster])."""
    cluster = config.get("cluster", {})
    servers, workers = cluster.get("servers"), cluster.get("workers")
    if not isinstance(servers, int) or not isinstance(workers, int):
        return []
    return ["coordinator"] + [f"server-{i}" for i in range(servers)] + [f"worker-{j}" for j in range(workers)]


def missing_files(parts, config, launch_files, metric_paths):
    """Files a complete cluster run or run in parts would have and these parts lack (see the
    module's docstring); [] for a local run in one directory, which is not checked."""
    cluster_launch = any(name != "launch.jsonl" for name in launch_files)
    if len(parts) == 1 and not cluster_launch:
        return []
    have = set(launch_files) | {os.path.join("metrics", os.path.basename(p)) for p in metric_paths}
    missing = []
    for task in expected_tasks(config):
        if "launch.jsonl" not in launch_files:
            missing.append(f"launch-{task}.jsonl")
        missing.append(os.path.join("metrics", f"{task}.jsonl"))
    if has_evaluator(config):  # the coordinator's task runs it: no launch file of its own
        missing.append(os.path.join("metrics", "evaluator.jsonl"))
    return [name for name in missing if name not in have]


def model_num_classes(config, run_dir):
    """The number of classes of the run's model: num_output of the layer feeding its
    SoftmaxWithLoss, read from model.config (absolute, or relative to the repository root or the
    run directory). None when the model file cannot be read or has no such layer."""
    path = config.get("model", {}).get("config", DEFAULT_MODEL)
    candidates = [path] if os.path.isabs(path) else [os.path.join(ROOT, path), os.path.join(run_dir, path)]
    for candidate in candidates:
        try:
            with open(candidate, "rb") as f:
                layers = tomllib.load(f).get("layer", [])
        except (OSError, tomllib.TOMLDecodeError):
            continue
        loss = next((layer for layer in layers if layer.get("type") == "SoftmaxWithLoss"), None)
        if not loss or not loss.get("bottom"):
            return None
        scores = next((layer for layer in layers if loss["bottom"][0] in layer.get("top", [])), None)
        n = scores.get("num_output") if scores else None
        return n if isinstance(n, int) and n > 0 else None
    return None


def not_finite(v):
    """A loss the worker could not write as a number (null) or a NaN / Inf one."""
    return v is None or (isinstance(v, float) and not math.isfinite(v))


def loss_text(v):
    """How a non-finite loss is named: the metrics writer logs NaN and Inf as null."""
    return "null (NaN or Inf)" if v is None else str(v)


def divergence(final, workers, num_classes):
    """Why a run diverged — a non-finite training or test loss, or a final top-1 at chance
    (<= DIVERGED_CHANCE_FACTOR / num_classes) — or None."""
    for w in workers:
        for _, r in w.records("step"):
            if "loss" in r and not_finite(r["loss"]):
                return f"training loss {loss_text(r['loss'])} at step {r.get('step')} of worker {w.id}"
    if final is not None and "test_loss" in final and not_finite(final["test_loss"]):
        return f"final test loss {loss_text(final['test_loss'])}"
    top1 = final.get("top1") if final else None
    if top1 is not None and num_classes and top1 <= DIVERGED_CHANCE_FACTOR / num_classes:
        return f"final top-1 {100 * top1:.2f}% = chance for {num_classes} classes"
    return None


def diverged_line(name, s):
    """The runner's line for a diverged run, with what to try next."""
    return (f"run {name} diverged: {s['diverged_reason']}; try consistency.staleness_aware_lr = true "
            f"or a smaller solver.base_lr")


# Per-step bytes in worker step records (issue 14), when present. tx_bytes / rx_bytes: what the
# worker's transport handed to its sockets (pushes, with their headers) and took from them (pulled
# weights, acks) during that step: every frame of every message (common/transport.h,
# TrafficCounts), and nothing else. shm_tx_bytes / shm_rx_bytes: the payloads that went through
# same-host shared memory instead (cluster.shared_memory; the socket then carried only their
# headers), so they are NOT part of tx_bytes / rx_bytes. Records from before these fields have
# none; a null shared-memory field is none moved that way.
BYTE_FIELDS = ("tx_bytes", "rx_bytes")
SHM_BYTE_FIELDS = ("shm_tx_bytes", "shm_rx_bytes")


def _num(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _cumulative(points):
    """[(t, bytes)] → [(t, bytes up to and including t)] in time order."""
    out, total = [], 0
    for t, b in sorted(points, key=lambda m: m[0]):
        total += b
        out.append((t, total))
    return out


def wire_bytes(workers, times):
    """What the workers' step records say about the bytes they moved (tx_bytes / rx_bytes: the
    bytes through the worker's sockets out (push) and in (pull) during that one step;
    shm_tx_bytes / shm_rx_bytes: the payloads that went through same-host shared memory instead,
    not in tx / rx; runs from before issue 14 have none). Returns (summary fields, curves):

    - socket_push_bytes_per_step / socket_pull_bytes_per_step, socket_bytes_total: through sockets
      only, what crossed the network (the mean per worker step; all workers);
    - shm_push_bytes_per_step / shm_pull_bytes_per_step, shm_bytes_total: through shared memory
      (None when no step record carries the shm fields);
    - push_bytes_per_step / pull_bytes_per_step, bytes_total: the two added up, what the worker
      moved to and from the servers either way (the keys from before the split);
    - step_ms_median: the median step_ms (the first step of each segment left out, as the
      breakdown does);

    and curves {"bytes", "socket_bytes", "shm_bytes"}: [(active time, bytes moved by all workers
    up to then)] for the accuracy-vs-bytes plot. Each value None / [] when the records lack it."""
    push, pull, sock_push, sock_pull, shm_push, shm_pull, step_ms = [], [], [], [], [], [], []
    moved, socket, shm = [], [], []
    any_shm = False
    for w in workers:
        for seg_no, seg in enumerate(w.segments):
            steps = [r for r in seg if r.get("event") == "step"]
            for i, r in enumerate(steps):
                tx, rx = r.get(BYTE_FIELDS[0]), r.get(BYTE_FIELDS[1])
                stx, srx = r.get(SHM_BYTE_FIELDS[0]), r.get(SHM_BYTE_FIELDS[1])
                any_shm = any_shm or _num(stx) or _num(srx)
                stx, srx = (stx if _num(stx) else 0), (srx if _num(srx) else 0)
                if _num(tx):
                    sock_push.append(tx)
                    shm_push.append(stx)
                    push.append(tx + stx)
                if _num(rx):
                    sock_pull.append(rx)
                    shm_pull.append(srx)
                    pull.append(rx + srx)
                if _num(tx) or _num(rx):
                    t = active_time(r, seg_no, times)
                    s_bytes = (tx if _num(tx) else 0) + (rx if _num(rx) else 0)
                    m_bytes = ((stx if _num(tx) else 0) + (srx if _num(rx) else 0))
                    socket.append((t, s_bytes))
                    shm.append((t, m_bytes))
                    moved.append((t, s_bytes + m_bytes))
                if i > 0 and isinstance(r.get("step_ms"), (int, float)):
                    step_ms.append(r["step_ms"])
    curves = {"bytes": _cumulative(moved), "socket_bytes": _cumulative(socket),
              "shm_bytes": _cumulative(shm) if any_shm else []}
    mean = lambda v: sum(v) / len(v) if v else None  # noqa: E731
    last = lambda c: c[-1][1] if c else None  # noqa: E731
    step_ms.sort()
    median = None
    if step_ms:
        mid = len(step_ms) // 2
        median = step_ms[mid] if len(step_ms) % 2 else (step_ms[mid - 1] + step_ms[mid]) / 2
    return {"push_bytes_per_step": mean(push), "pull_bytes_per_step": mean(pull), "step_ms_median": median,
            "bytes_total": last(curves["bytes"]),
            "socket_push_bytes_per_step": mean(sock_push), "socket_pull_bytes_per_step": mean(sock_pull),
            "socket_bytes_total": last(curves["socket_bytes"]),
            "shm_push_bytes_per_step": mean(shm_push) if any_shm else None,
            "shm_pull_bytes_per_step": mean(shm_pull) if any_shm else None,
            "shm_bytes_total": last(curves["shm_bytes"])}, curves


def bytes_until(cumulative, t):
    """Bytes moved by all workers up to active time t (None without byte fields)."""
    if not cumulative:
        return None
    i = bisect.bisect_right([c[0] for c in cumulative], t)
    return cumulative[i - 1][1] if i else 0


def multi_model_summary(config, workers):
    """A multi-model run's part of the summary ([[models]]; docs/multi_model.md), or None: the
    scheme, the leaderboard (worker 0's final evaluation of every model, best top-1 first), each
    model's curve (its evaluations as it moved on: images it had seen, epochs, top-1), images per
    model, and the bytes moved: model payload pulled and pushed, and data read from partitions
    that were not the reader's own."""
    models = config.get("models")
    if not models:
        return None
    rotation = config.get("rotation", {})
    finals = [r for w in workers for _, r in w.records("model_eval")]
    board = sorted(finals, key=lambda r: (-(r.get("top1") or 0), r.get("loss") or math.inf, r.get("model") or 0))
    curves = {}
    for w in workers:
        for _, r in w.records("model_curve"):
            curves.setdefault(r.get("name"), []).append({"images": r.get("train_images"), "epoch": r.get("epoch"),
                                                         "top1": r.get("top1"), "loss": r.get("loss"),
                                                         "run_s": r.get("run_s")})
    for points in curves.values():
        points.sort(key=lambda e: e["images"] or 0)
    stages = [r for w in workers for _, r in w.records("stage")]
    images = {}
    for r in stages:
        images[r.get("name")] = images.get(r.get("name"), 0) + (r.get("images") or 0)

    def stage_bytes(fields):
        # Added up over every stage record that has them (None when none does).
        values = [r[f] for r in stages for f in fields if _num(r.get(f))]
        return sum(values) if values else None
    return {
        "scheme": rotation.get("scheme", "pipeline"),
        "models": len(models),
        "passes": rotation.get("passes", 1),
        "leaderboard": [{"rank": i + 1, "model": r.get("model"), "name": r.get("name"), "top1": r.get("top1"),
                         "top5": r.get("top5"), "loss": r.get("loss"), "train_images": r.get("train_images")}
                        for i, r in enumerate(board)],
        "curves": curves,
        "images_per_model": images,
        "model_bytes": sum(r.get("model_bytes") or 0 for r in stages),
        "data_bytes_moved": sum(r.get("data_bytes_moved") or 0 for r in stages),
        # What the stages' transports counted (all workers): bytes through sockets (tx + rx), and
        # the payloads that went through same-host shared memory instead (shm tx + rx).
        "socket_bytes": stage_bytes(BYTE_FIELDS),
        "shm_bytes": stage_bytes(SHM_BYTE_FIELDS),
        "wait_s": sum(r.get("wait_s") or 0 for r in stages),
    }


def summarize(spec):
    """The summary (the fields of summary.json) of a run: RUN_DIR or RUN_DIR+RUN_DIR2+..."""
    parts = run_parts(spec)
    config, files = load_run(parts)
    workers = worker_files(files)
    if not workers:
        raise ToolError(f"{spec}: no worker records in metrics/ (did any worker start?)")
    times = segment_times(workers)
    evaluated_by = "evaluator"
    evals = sorted(evaluator_evals(files, times), key=lambda e: e[0])
    if not evals:
        evaluated_by = "worker 0"
        evals = sorted(((active_time(r, k, times), r) for w in workers for k, r in w.records("eval")),
                       key=lambda e: e[0])
    finals = [e for e in evals if e[1].get("final")]
    final = finals[-1][1] if finals else None
    dones = last_done_per_worker(workers)
    resumed = any(r.get("resumed") for w in workers for _, r in w.records("start"))
    launch_files = gather_files(parts, LAUNCH_PATTERNS)

    consistency = config.get("consistency", {})
    cluster = config.get("cluster", {})
    summary = {
        "run_dir": os.path.abspath(parts[0]),
        "parts": [os.path.abspath(p) for p in parts],
        "name": config.get("run", {}).get("name", ""),
        "mode": consistency.get("mode", "async"),
        "algorithm": algorithm_label(consistency, config.get("solver", {})),
        "servers": cluster.get("servers"),
        "workers": cluster.get("workers"),
        "batch_size": config.get("worker", {}).get("batch_size"),
        # Active time: the segments' spans added up, downtime between segments excluded.
        "wall_s": sum(t_end - t0 for t0, t_end, _ in times),
        "segments": len(times),
        "resumed": resumed or len(times) > 1,
        "steps": steps_done(workers),
        "images": sum(d.get("images", 0) for d in dones),
        # Aggregate training throughput: every worker's images over its own training time.
        "images_per_s": sum(images_per_s(d) for d in dones),
        "workers_done": len(dones),
        "final_top1": final.get("top1") if final else None,
        "final_top5": final.get("top5") if final else None,
        "final_test_loss": final.get("test_loss") if final else None,
        "final_epoch": final.get("epoch") if final else None,
        **target_fields(evals),
        "num_classes": model_num_classes(config, parts[0]),
    }
    # Collapsed to chance or blew up (tools/downpour_runs.py divergence): marked in the table.
    summary["diverged_reason"] = divergence(final, workers, summary["num_classes"])
    summary["diverged"] = summary["diverged_reason"] is not None
    summary.update(staleness_from_server_stats(workers))
    summary.update(server_pulls(files))
    summary.update(launch_summary(launch_files))
    summary["missing"] = missing_files(parts, config, launch_files, files)
    wire, curves = wire_bytes(workers, times)
    summary.update(wire)
    summary["evaluated_by"] = evaluated_by if evals else None
    batch, nworkers = summary["batch_size"], summary["workers"]

    def images_of(e):
        if e.get("train_images") is not None:
            return e["train_images"]
        if isinstance(e.get("step"), int) and isinstance(batch, int) and isinstance(nworkers, int):
            return e["step"] * batch * nworkers
        return None

    summary["evals"] = [{"wall_s": t, "epoch": e.get("epoch"), "step": e.get("step"), "images": images_of(e),
                         "top1": e.get("top1"),
                         "top5": e.get("top5"), "test_loss": e.get("test_loss"), "final": bool(e.get("final")),
                         "server_versions": e.get("server_versions"),
                         # Up to this evaluation, all workers: moved either way (sockets + shared
                         # memory), through sockets, through shared memory.
                         "bytes": bytes_until(curves["bytes"], t),
                         "socket_bytes": bytes_until(curves["socket_bytes"], t),
                         "shm_bytes": bytes_until(curves["shm_bytes"], t)}
                        for t, e in evals]
    summary["train_loss"] = loss_curve(workers, times)
    summary["multi_model"] = multi_model_summary(config, workers)
    if summary["multi_model"] and summary["multi_model"]["leaderboard"]:
        # The run's result is its best model (the leaderboard has every model's).
        best = summary["multi_model"]["leaderboard"][0]
        summary["final_top1"], summary["final_top5"] = best["top1"], best["top5"]
        summary["evaluated_by"] = "worker 0 (every model)"
    return summary


def default_label(s):
    """A run's label in tables and legends when none is given: "<mode> W=<workers>", or for a
    multi-model run ([[models]] / [sweep]) "sweep of K models (<scheme>), W=<workers>"."""
    mm = s.get("multi_model")
    if mm:
        return f"sweep of {mm['models']} models ({mm['scheme']}), W={s['workers']}"
    return f"{s['mode']} W={s['workers']}"


def write_summary(spec):
    """Summarizes a run (RUN_DIR or RUN_DIR+RUN_DIR2+...) into its first part's summary.json."""
    s = summarize(spec)
    with open(os.path.join(s["run_dir"], "summary.json"), "w") as f:
        json.dump(s, f, indent=1)
    return s


def missing_warning(spec, s):
    """The warning a tool prints for a run with missing files, or None."""
    if not s["missing"]:
        return None
    return (f"warning: {spec}: no {', '.join(s['missing'])}: a task that never started, or a part of the run "
            f"directory not given (name every host's copy: RUN_DIR{PART_SEPARATOR}RUN_DIR2...)")


def warn(tool, message):
    """Prints `<tool>: <message>` to stderr and goes on."""
    print(f"{tool}: {message}", file=sys.stderr)
