"""downpour_report — the comparison table (one column list for Markdown and HTML) and the
one-page HTML reports of tools/downpour-compare and tools/downpour-experiment.

The pages are plain HTML with inline CSS: no JavaScript, no external URLs, images by relative
path, so a report opens from the file system. Every inserted text goes through html.escape.
"""
import bisect
import datetime
import html
import os
import subprocess
import urllib.parse

import downpour_runs as dr


def _pct(v):
    return None if v is None else 100 * v


def _mb(v):
    return None if v is None else v / 1e6


def _sum2(a, b):
    """a + b, a missing one as 0; None when both are."""
    return None if a is None and b is None else (a or 0) + (b or 0)


# (header, right-aligned, value of (label, summary) as text). One list, so comparison.md and
# report.html always show the same columns.
COLUMNS = [
    ("run", False, lambda label, s: label),
    ("mode", False, lambda label, s: str(s["mode"])),
    ("algorithm", False, lambda label, s: str(s.get("algorithm", "sgd"))),
    ("workers", True, lambda label, s: dr.fmt(s["workers"], "d")),
    ("servers", True, lambda label, s: dr.fmt(s["servers"], "d")),
    ("segments", True, lambda label, s: dr.fmt(s.get("segments", 1), "d")),
    (f"time to {100 * dr.TARGET_TOP1:.0f}% (s)", True, lambda label, s: dr.fmt(s["time_to_target_s"], ".1f", "not reached")),
    (f"epochs to {100 * dr.TARGET_TOP1:.0f}%", True, lambda label, s: dr.fmt(s["epochs_to_target"], ".2f")),
    ("final top-1", True, lambda label, s: dr.fmt(_pct(s["final_top1"]), ".2f") + "%"),
    # A run that collapsed to chance or whose loss blew up (downpour_runs.divergence).
    ("diverged", False, lambda label, s: "DIVERGED" if s.get("diverged") else ""),
    ("images/s", True, lambda label, s: dr.fmt(s["images_per_s"], ".0f")),
    ("wall (s)", True, lambda label, s: dr.fmt(s["wall_s"], ".1f")),
    ("mean staleness", True, lambda label, s: dr.fmt(s["staleness_mean"], ".2f")),
    ("max staleness", True, lambda label, s: dr.fmt(s["staleness_max"], "d")),
    ("max clocks ahead", True, lambda label, s: dr.fmt(s.get("clock_ahead_max"), "d")),
    ("mean pull wait (ms)", True, lambda label, s: dr.fmt(s.get("pull_wait_ms_mean"), ".1f")),
    # Bytes per worker step ("—" for runs without byte counts). push / pull: what the worker moved to
    # and from the servers either way, sockets + same-host shared memory (tx_bytes + shm_tx_bytes,
    # rx_bytes + shm_rx_bytes). socket: push + pull through sockets only (tx_bytes + rx_bytes), what
    # crossed the network; shm: push + pull through shared memory only.
    ("push MB/step", True, lambda label, s: dr.fmt(_mb(s.get("push_bytes_per_step")), ".3f")),
    ("pull MB/step", True, lambda label, s: dr.fmt(_mb(s.get("pull_bytes_per_step")), ".3f")),
    ("socket MB/step", True, lambda label, s: dr.fmt(_mb(_sum2(s.get("socket_push_bytes_per_step"),
                                                                 s.get("socket_pull_bytes_per_step"))), ".3f")),
    ("shm MB/step", True, lambda label, s: dr.fmt(_mb(_sum2(s.get("shm_push_bytes_per_step"),
                                                              s.get("shm_pull_bytes_per_step"))), ".3f")),
    ("median step (ms)", True, lambda label, s: dr.fmt(s.get("step_ms_median"), ".1f")),
]


def table_cells(runs):
    """runs: [(label, summary)] → (headers, rows of cell texts), in the runs' order."""
    return [c[0] for c in COLUMNS], [[c[2](label, s) for c in COLUMNS] for label, s in runs]


def markdown_table(runs):
    headers, rows = table_cells(runs)
    md_cell = lambda text: text.replace("|", "\\|")  # noqa: E731
    lines = ["| " + " | ".join(headers) + " |",
             "| " + " | ".join("---:" if c[1] else "---" for c in COLUMNS) + " |"]
    lines += ["| " + " | ".join(md_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def html_table(runs):
    headers, rows = table_cells(runs)
    align = lambda i: ' class="num"' if COLUMNS[i][1] else ""  # noqa: E731
    out = ["<table>", "<tr>" + "".join(f"<th{align(i)}>{html.escape(h)}</th>" for i, h in enumerate(headers)) + "</tr>"]
    for row in rows:
        out.append("<tr>" + "".join(f"<td{align(i)}>{html.escape(c)}</td>" for i, c in enumerate(row)) + "</tr>")
    out.append("</table>")
    return "\n".join(out)


# The worker's step-time breakdown (metrics "step" records, docs/operations.md): field → label.
# tx_bytes / rx_bytes: the bytes the worker process sent (≈ pushes) and received (≈ pulled weights)
# through its sockets during the step; shm_tx_bytes / shm_rx_bytes: the payloads it wrote to and
# read from same-host shared memory instead, not in tx / rx (docs/operations.md).
BREAKDOWN_FIELDS = [("step_ms", "step"), ("compute_ms", "compute"), ("pull_wait_ms", "pull wait"),
                    ("push_wait_ms", "push wait"), ("loader_wait_ms", "loader"), ("comm_ms", "comm"),
                    ("tx_bytes", "tx bytes"), ("rx_bytes", "rx bytes"),
                    ("shm_tx_bytes", "shm tx bytes"), ("shm_rx_bytes", "shm rx bytes")]


def _median(values):
    v = sorted(values)
    if not v:
        return None
    mid = len(v) // 2
    return v[mid] if len(v) % 2 else (v[mid - 1] + v[mid]) / 2


def step_breakdown(workers):
    """[Worker] (downpour_runs) → one dict per worker with steps: its id, the number of steps, the
    median of each BREAKDOWN_FIELDS field over its steps (None where the records lack it: runs
    from before the breakdown, or comm_ms of a local run), and overlap_ratio = median step /
    max(median compute, median comm) — 1.0 is perfect overlap of compute and communication. The
    first step of every segment is left out (its pull is a blocking whole pull, its kernels cold)."""
    out = []
    for w in workers:
        kept = []
        for seg in w.segments:
            steps = [r for r in seg if r.get("event") == "step"]
            kept += steps[1:] if len(steps) > 1 else steps
        row = {"worker": w.id, "steps": len(kept)}
        for field, _ in BREAKDOWN_FIELDS:
            vals = [r[field] for r in kept if isinstance(r.get(field), (int, float))]
            row[field] = _median(vals)
        bound = max((x for x in (row["compute_ms"], row["comm_ms"]) if x is not None), default=None)
        row["overlap_ratio"] = row["step_ms"] / bound if row["step_ms"] is not None and bound else None
        out.append(row)
    return out


def images_per_s_from_steps(rows, batch):
    """The job's images/s from step_breakdown rows: the sum over workers of batch / median step
    (what the scaling model predicts: steady state, no start-up, no evaluations); workers without
    a median step are left out."""
    return sum(batch * 1000.0 / row["step_ms"] for row in rows if row["step_ms"])


def step_ends(worker):
    """Wall-clock ends (the records' t) of a worker's steps, the first of each segment left out."""
    ends = []
    for seg in worker.segments:
        steps = [r for r in seg if r.get("event") == "step"]
        ends += [r["t"] for r in steps[1:]]
    return sorted(ends)


def phase(a_ends, b_ends, step_s):
    """Median distance from each of a's step ends to the nearest of b's, over step_s: 0 = the two
    workers in lockstep, 0.5 = half a step apart (bench/RESULTS.md §11.4.2). Only a's ends while b
    was stepping count (between b's first and last end): before b starts or after it stops the
    nearest end is no neighbour, and in a short job those would be most of them. None without
    steps, or when the two never stepped at the same time."""
    if not a_ends or not b_ends or not step_s:
        return None
    out = []
    for t in a_ends:
        if t < b_ends[0] or t > b_ends[-1]:
            continue
        i = bisect.bisect_left(b_ends, t)
        near = [abs(t - b_ends[j]) for j in (i - 1, i) if 0 <= j < len(b_ends)]
        out.append(min(near) / step_s)
    return _median(out) if out else None


def workers_phase(workers, rows):
    """phase() of workers 0 and 1 ([Worker] from downpour_runs, their step_breakdown rows), over
    worker 0's median step; None where either has no steps."""
    ends = {w.id: step_ends(w) for w in workers}
    row0 = next((r for r in rows if r["worker"] == 0), None)
    step_s = row0["step_ms"] / 1e3 if row0 and row0["step_ms"] else None
    return phase(ends.get(0, []), ends.get(1, []), step_s)


def breakdown_line(row):
    """"step = X ms; compute Y, pull wait Z, push wait W, loader V; comm C; overlap ratio R (medians
    of N steps); wire per step: tx T MB, rx U MB" (MB = 10^6 bytes; "—" for runs without byte counts),
    then "; shared memory per step: tx T MB, rx U MB" when the records count shared-memory bytes
    (the wire figures are the sockets' alone)."""
    f = lambda key: dr.fmt(row[key], ".1f")  # noqa: E731
    mb = lambda key: dr.fmt(row.get(key) / 1e6 if row.get(key) is not None else None, ".3f")  # noqa: E731
    return (f"worker {row['worker']}: step = {f('step_ms')} ms; compute {f('compute_ms')}, pull wait "
            f"{f('pull_wait_ms')}, push wait {f('push_wait_ms')}, loader {f('loader_wait_ms')}; comm {f('comm_ms')}; "
            f"overlap ratio step / max(compute, comm) = {dr.fmt(row['overlap_ratio'], '.2f')} "
            f"(medians of {row['steps']} steps); wire per step: tx {mb('tx_bytes')} MB, rx {mb('rx_bytes')} MB"
            + (f"; shared memory per step: tx {mb('shm_tx_bytes')} MB, rx {mb('shm_rx_bytes')} MB"
               if row.get("shm_tx_bytes") or row.get("shm_rx_bytes") else ""))


CSS = """
body { font-family: sans-serif; margin: 2em auto; max-width: 1700px; padding: 0 1em; color: #222; }
h1 { font-size: 1.6em; } h2 { font-size: 1.25em; margin-top: 1.6em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; font-size: 0.9em; }
th, td { border: 1px solid #bbb; padding: 0.25em 0.6em; }
th { background: #eee; } td.num, th.num { text-align: right; }
.plots { display: flex; flex-wrap: wrap; gap: 1em; }
.plots figure { margin: 0; } .plots img { max-width: 100%; width: 800px; border: 1px solid #ddd; }
figcaption { font-size: 0.85em; color: #555; }
pre { background: #f6f6f6; padding: 0.6em; overflow-x: auto; font-size: 0.85em; }
.meta { color: #666; font-size: 0.85em; }
"""


def page(title, body, generator):
    """A whole HTML document: `body` is already-escaped HTML."""
    when = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>{html.escape(title)}</title>\n<style>{CSS}</style>\n</head>\n<body>\n"
            f"<h1>{html.escape(title)}</h1>\n"
            f"<p class=\"meta\">written {html.escape(when)} by {html.escape(generator)}</p>\n"
            f"{body}\n</body>\n</html>\n")


def plot_section(out_dir, plots):
    """plots: [(file name, caption)]; the images that exist in out_dir, by relative path."""
    figures = []
    for name, caption in plots:
        if os.path.exists(os.path.join(out_dir, name)):
            figures.append(f"<figure><img src=\"{html.escape(name)}\" alt=\"{html.escape(caption)}\">"
                           f"<figcaption>{html.escape(caption)}</figcaption></figure>")
    if not figures:
        return "<p>No plots: the runs logged no evaluations, training steps or staleness counters.</p>"
    return "<div class=\"plots\">\n" + "\n".join(figures) + "\n</div>"


def config_section(runs):
    """Each run's config.toml, folded."""
    parts = []
    for label, s in runs:
        path = os.path.join(s["run_dir"], "config.toml")
        try:
            with open(path) as f:
                text = f.read()
        except OSError as e:
            text = f"(could not read {path}: {e.strerror})"
        parts.append(f"<details><summary>{html.escape(label)}: {html.escape(path)}</summary>\n"
                     f"<pre>{html.escape(text)}</pre></details>")
    return "\n".join(parts)


def comparison_report(out_dir, title, runs, plots, generator):
    """out_dir/report.html for downpour-compare: table, plots, configs. Returns its path."""
    body = "\n".join([
        "<h2>Summary</h2>", html_table(runs),
        "<h2>Plots</h2>", plot_section(out_dir, plots),
        "<h2>Run configs</h2>", config_section(runs),
    ])
    path = os.path.join(out_dir, "report.html")
    with open(path, "w") as f:
        f.write(page(title, body, generator))
    return path


def experiment_index(out_dir, title, groups, generator):
    """out_dir/report.html for downpour-experiment: per group, a link to its report and its table.
    groups: [(group name, folder relative to out_dir, [(label, summary)])]."""
    parts = []
    for name, folder, runs in groups:
        href = html.escape(urllib.parse.quote(folder) + "/report.html")
        parts.append(f"<h2>{html.escape(name)}</h2>\n<p><a href=\"{href}\">{html.escape(name)}: report with plots</a></p>")
        parts.append(html_table(runs) if runs else "<p>No runs of this group have metrics yet.</p>")
    path = os.path.join(out_dir, "report.html")
    with open(path, "w") as f:
        f.write(page(title, "\n".join(parts) or "<p>No groups.</p>", generator))
    return path


# ---- Charts (gnuplot), shared by downpour-compare and downpour-experiment.

def gp_quote(s):
    """A gnuplot single-quoted string: no escapes inside, '' is a quote."""
    return "'" + str(s).replace("'", "''") + "'"


def color(i):
    """Run i's colour in every chart: gnuplot's linetype i+1."""
    return f"lc {i + 1}"


def plot(out_dir, name, script, size=(800, 500)):
    """Writes out_dir/name.gp and runs gnuplot on it → out_dir/name.png."""
    gp = os.path.join(out_dir, name + ".gp")
    with open(gp, "w") as f:
        f.write(f"set terminal pngcairo noenhanced size {size[0]},{size[1]} font 'sans,10'\n")
        f.write(f"set output {gp_quote(os.path.join(out_dir, name + '.png'))}\n")
        f.write("set grid\n")
        f.write(script)
    try:
        r = subprocess.run(["gnuplot", gp], capture_output=True, text=True)
    except FileNotFoundError:
        raise dr.ToolError("gnuplot not found: install gnuplot-nox (scripts/bootstrap does)") from None
    if r.returncode != 0:
        raise dr.ToolError(f"gnuplot failed on {gp}: {r.stderr.strip()}")


def write_dat(path, header, rows):
    with open(path, "w") as f:
        f.write(f"# {header}\n")
        for row in rows:
            f.write(" ".join(row) + "\n")
