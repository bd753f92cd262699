"""downpour_stats — the statistics of repeated runs (downpour-experiment --seeds).

For a cell (one configuration run over several seeds): the mean of each metric and its 95%
interval, mean ± t(0.975, n−1) · s / √n (Student's t; s the sample standard deviation). Between
two cells: Welch's unequal-variance t-test, two-sided, with the Welch–Satterthwaite degrees of
freedom; a difference is called significant at p < 0.05, otherwise "no difference shown". Pure
Python: Student's t distribution from the regularized incomplete beta function (Numerical
Recipes' continued fraction), as a fresh Debian machine has no SciPy.

What the numbers do not show: seeds vary the data order and the initial weights, not the
machine; a cell whose runs did not reach the target has no time-to-target for them, and the mean
is over the runs that did (the count of those that did not is reported beside it). A run that
diverged (downpour_runs: final top-1 at chance, or a non-finite loss) is counted in its cell's
"diverged" column and left out of its means and tests: how often a configuration diverges is a
finding of its own, and averaging a chance-level run into the others would hide both.
"""
import math

ALPHA = 0.05  # two-sided significance level; intervals are 1 − ALPHA = 95%

# (summary key, column heading, scale, digits): the metrics a cell reports.
# Time and epochs to the target are interpolated between the two evaluations around the crossing
# (downpour_runs.interpolated_target); target_bracket_s, the gap between them, says how far the
# interpolation could be off (reported, not added to the interval).
METRICS = [
    ("final_top1", "final top-1 %", 100.0, 2),
    ("time_to_target_interp_s", "s to target", 1.0, 1),
    ("target_bracket_s", "eval gap s", 1.0, 1),
    ("epochs_to_target_interp", "epochs to target", 1.0, 2),
    ("images_per_s", "img/s", 1.0, 0),
    ("staleness_mean", "staleness", 1.0, 2),
]


def _betacf(a, b, x):
    """The continued fraction of the incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return h


def betai(a, b, x):
    """The regularized incomplete beta function I_x(a, b), 0 <= x <= 1."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    ln = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log(1.0 - x)
    front = math.exp(ln)
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t, df):
    """P(T <= t) for Student's t with df > 0 degrees of freedom."""
    if math.isinf(t):
        return 1.0 if t > 0 else 0.0
    tail = 0.5 * betai(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


def t_quantile(p, df):
    """The t with P(T <= t) = p (0 < p < 1), by bisection."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"t_quantile: p = {p} is outside (0, 1)")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if t_cdf(mid, df) < p else (lo, mid)
    return 0.5 * (lo + hi)


def mean_interval(values):
    """(n, mean, half-width of the 95% interval); the half-width is None below two values."""
    n = len(values)
    if n == 0:
        return 0, None, None
    mean = sum(values) / n
    if n < 2:
        return n, mean, None
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return n, mean, t_quantile(1.0 - ALPHA / 2.0, n - 1) * sd / math.sqrt(n)


def welch(a, b):
    """Welch's t-test of two samples: (t, df, two-sided p); None below two values on a side."""
    if len(a) < 2 or len(b) < 2:
        return None
    na, nb = len(a), len(b)
    ma, mb = sum(a) / na, sum(b) / nb
    va = sum((x - ma) ** 2 for x in a) / (na - 1)
    vb = sum((x - mb) ** 2 for x in b) / (nb - 1)
    se2 = va / na + vb / nb
    if se2 == 0.0:  # both without spread: equal means are no difference, others are certain
        return (0.0, float(na + nb - 2), 1.0) if ma == mb else (math.copysign(math.inf, ma - mb), float(na + nb - 2), 0.0)
    t = (ma - mb) / math.sqrt(se2)
    df = se2 ** 2 / ((va / na) ** 2 / (na - 1) + (vb / nb) ** 2 / (nb - 1))
    return t, df, 2.0 * (1.0 - t_cdf(abs(t), df))


def _at(curve, t):
    """A curve [(t, y)] joined by straight lines, at t (within its span)."""
    for (t0, y0), (t1, y1) in zip(curve, curve[1:]):
        if t0 <= t <= t1:
            return y0 if t1 == t0 else y0 + (y1 - y0) * (t - t0) / (t1 - t0)
    return curve[-1][1]


def band(summaries, points=60):
    """A cell's test top-1 (%) against active time as its runs' mean and 95% interval, on a
    common grid from the latest first evaluation to the earliest last one, each run's evaluations
    joined by straight lines: [(t, mean, low, high)]; [] below two runs with two evaluations."""
    curves = [[(e["wall_s"], 100.0 * e["top1"]) for e in s.get("evals", []) if e.get("top1") is not None]
              for s in summaries]
    curves = [c for c in curves if len(c) >= 2]
    if len(curves) < 2:
        return []
    start, end = max(c[0][0] for c in curves), min(c[-1][0] for c in curves)
    if end <= start:
        return []
    out = []
    for k in range(points):
        t = start + (end - start) * k / (points - 1)
        _, mean, half = mean_interval([_at(c, t) for c in curves])
        out.append((t, mean, mean - half, mean + half))
    return out


def values(summaries, key, scale=1.0):
    """The metric's values over a cell's runs (runs without it left out)."""
    return [scale * s[key] for s in summaries if s.get(key) is not None]


def converged(summaries):
    """The runs that did not diverge."""
    return [s for s in summaries if not s.get("diverged")]


def cell_stats(summaries):
    """Per metric: {n, mean, half, missing} over a cell's runs that did not diverge (missing:
    runs without a value, e.g. that did not reach the target); "diverged": how many did."""
    out = {"diverged": len(summaries) - len(converged(summaries))}
    summaries = converged(summaries)
    for key, _, scale, _ in METRICS:
        xs = values(summaries, key, scale)
        n, mean, half = mean_interval(xs)
        out[key] = {"n": n, "mean": mean, "half": half, "missing": len(summaries) - n}
    return out


def compare(a, b, key, scale=1.0):
    """Welch's test of one metric between two cells' runs: {t, df, p, significant} or None."""
    r = welch(values(converged(a), key, scale), values(converged(b), key, scale))
    if r is None:
        return None
    t, df, p = r
    return {"t": t, "df": df, "p": p, "significant": p < ALPHA}


def fmt_cell(stat, digits, key=""):
    """"mean ± half", "mean (n = 1)" or "—", with the count of runs that have no value: for a
    metric to the target "not reached", else "without"."""
    if stat["n"] == 0:
        text = "—"
    elif stat["half"] is None:
        text = f"{stat['mean']:.{digits}f} (n = 1)"
    else:
        text = f"{stat['mean']:.{digits}f} ± {stat['half']:.{digits}f}"
    if stat["missing"]:
        reached_metric = "_to_target" in key or key == "target_bracket_s"
        text += f" ({stat['missing']} {'not reached' if reached_metric else 'without'})"
    return text


def fmt_p(r, digits=3):
    """A comparison's p: "p = 0.0164" (`digits` significant), or "p < 1e-4"."""
    return f"p = {r['p']:.{digits}g}" if r["p"] >= 1e-4 else "p < 1e-4"


def fmt_comparison(r):
    """A comparison's words: "significant (Welch p = 0.003)" or "no difference shown (p = 0.41)"."""
    if r is None:
        return "too few runs to test"
    p = fmt_p(r)
    return f"significant (Welch {p})" if r["significant"] else f"no difference shown (Welch {p})"


def markdown(group, cells, failed, target=0.89):
    """The group's table: a row per cell, a row per pair of cells for final top-1 and time to
    target; `cells` is [(label, [summaries])], `failed` [(label, seed, why)] (excluded)."""
    lines = [f"## {group}", "",
             f"Mean ± 95% interval (Student t) over each cell's seeds that did not diverge; pairs by Welch's "
             f"t-test at p < {ALPHA}. Target: {100 * target:g}% top-1.", "",
             "| cell | runs | diverged | " + " | ".join(h for _, h, _, _ in METRICS) + " |",
             "| --- | ---: | ---: | " + " | ".join("---:" for _ in METRICS) + " |"]
    for label, runs in cells:
        st = cell_stats(runs)
        lines.append(f"| {label} | {len(runs)} | {st['diverged']} | "
                     + " | ".join(fmt_cell(st[k], d, k) for k, _, _, d in METRICS) + " |")
    pairs = [(a, b) for i, a in enumerate(cells) for b in cells[i + 1:]]
    if pairs:
        lines += ["", "| pair | final top-1 | time to target |", "| --- | --- | --- |"]
        for (la, ra), (lb, rb) in pairs:
            lines.append(f"| {la} vs {lb} | {fmt_comparison(compare(ra, rb, 'final_top1', 100.0))} | "
                         f"{fmt_comparison(compare(ra, rb, 'time_to_target_interp_s'))} |")
    for label, seed, why in failed:
        lines.append(f"\nExcluded: {label} seed {seed} failed ({why}).")
    return "\n".join(lines) + "\n"


def pair(a, b):
    """What a map row says of cell b against cell a (each [summaries]): on final top-1 the
    difference b − a in points and its test; on time to target the ratio of the slower mean to
    the faster and its test. A winner is named only where Welch's test calls it (p < ALPHA): a
    cell some of whose runs reach the target while the other's never do is not named one (with
    three runs a side not even 3 of 3 against 0 of 3 would pass Fisher's exact test)."""
    sa, sb = cell_stats(a), cell_stats(b)
    out = {"a": sa, "b": sb, "top1": compare(a, b, "final_top1", 100.0), "time": None,
           "top1_winner": None, "time_winner": None, "time_ratio": None}
    ta, tb = sa["final_top1"], sb["final_top1"]
    if out["top1"] and out["top1"]["significant"]:
        out["top1_winner"] = "b" if tb["mean"] > ta["mean"] else "a"
    xa, xb = sa["time_to_target_interp_s"], sb["time_to_target_interp_s"]
    if xa["n"] and xb["n"]:
        out["time_ratio"] = max(xa["mean"], xb["mean"]) / min(xa["mean"], xb["mean"])
        out["time"] = compare(a, b, "time_to_target_interp_s")
        if out["time"] and out["time"]["significant"]:
            out["time_winner"] = "b" if xb["mean"] < xa["mean"] else "a"
    return out


def map_markdown(rows):
    """The map: a row per compared pair; `rows` is [(point, label a, runs a, label b, runs b)],
    point a text naming where the pair sits (e.g. "workers=4, straggler_delay_ms=25")."""
    lines = ["| point | cells a / b | final top-1 %: a / b | winner on top-1 | s to target: a / b | "
             "winner on time | img/s: a / b |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for point, la, ra, lb, rb in rows:
        if not ra or not rb:
            lines.append(f"| {point} | {la} / {lb} | " + " | ".join(["not run"] * 5) + " |")
            continue
        r = pair(ra, rb)
        name = {"a": la, "b": lb}
        ta, tb = r["a"]["final_top1"], r["b"]["final_top1"]
        if r["top1_winner"]:
            diff = abs(tb["mean"] - ta["mean"])
            top1 = f"**{name[r['top1_winner']]}** +{diff:.2f} ({fmt_p(r['top1'], 2)})"
        elif r["top1"] is None:
            top1 = "too few runs to test"
        else:
            top1 = f"no difference shown ({fmt_p(r['top1'], 2)})"
        xa, xb = r["a"]["time_to_target_interp_s"], r["b"]["time_to_target_interp_s"]
        if r["time_winner"]:
            time = f"**{name[r['time_winner']]}**, {r['time_ratio']:.2f}× sooner ({fmt_p(r['time'], 2)})"
        elif not xa["n"] and not xb["n"]:
            time = "neither reaches the target"
        elif not xa["n"] or not xb["n"]:
            k, x = ("a", xa) if xa["n"] else ("b", xb)
            time = f"only {name[k]} reaches it, {x['n']} of {x['n'] + x['missing']} runs (not tested)"
        elif r["time"] is None:
            time = "too few runs to test"
        else:
            time = f"no difference shown ({fmt_p(r['time'], 2)})"
        diverged = [f"{name[k]}: {r[k]['diverged']} diverged" for k in ("a", "b") if r[k]["diverged"]]
        lines.append(f"| {point}{' (' + '; '.join(diverged) + ')' if diverged else ''} | {la} / {lb} | "
                     f"{fmt_cell(ta, 2)} / {fmt_cell(tb, 2)} | {top1} | "
                     f"{fmt_cell(xa, 1, 'time_to_target_interp_s')} / {fmt_cell(xb, 1, 'time_to_target_interp_s')} | "
                     f"{time} | {fmt_cell(r['a']['images_per_s'], 0)} / {fmt_cell(r['b']['images_per_s'], 0)} |")
    return "\n".join(lines) + "\n"

