#!/usr/bin/env python3
"""Diverged runs (issue 13, item 6) on fabricated run directories: a run whose final top-1 is at
chance (<= 1.5 / num_classes, the classes read from the model file) or that logged a non-finite
loss is "diverged": true in summary.json, marked in downpour-compare's comparison.md and
report.html, and named in one line by downpour-summarize and downpour-experiment with what to try;
a healthy run, and one just above the margin, are not."""
import json
import os
import stat
import sys
import textwrap
import unittest

import fabricate as fab
from test_compare import parse_report

TRY = "try consistency.staleness_aware_lr = true or a smaller solver.base_lr"


def at_chance(step):
    return 0.1


def summarize(run_dir):
    r = fab.run_tool("downpour-summarize", run_dir)
    if r.returncode != 0:
        raise AssertionError(f"downpour-summarize exited {r.returncode}: {r.stderr}")
    with open(os.path.join(run_dir, "summary.json")) as f:
        return json.load(f), r


class TempDirTest(fab.TempDirTest):
    def run_dir(self, name, **kwargs):
        return fab.simple_run(os.path.join(self.tmp, name), **kwargs)


class Summarize(TempDirTest):
    def test_run_at_chance_is_diverged_with_one_line_saying_what_to_try(self):
        d = self.run_dir("collapsed", top1=at_chance)
        s, r = summarize(d)
        self.assertTrue(s["diverged"])
        self.assertEqual(s["num_classes"], 10)  # the default model, fmnist_small
        self.assertEqual(s["diverged_reason"], "final top-1 10.00% = chance for 10 classes")
        self.assertIn("; DIVERGED (final top-1 10.00% = chance for 10 classes)", r.stdout)
        self.assertIn(f"downpour-summarize: run {d} diverged: final top-1 10.00% = chance for 10 classes; {TRY}",
                      r.stderr)

    def test_healthy_run_is_not_diverged_and_says_nothing(self):
        s, r = summarize(self.run_dir("healthy"))
        self.assertFalse(s["diverged"])
        self.assertIsNone(s["diverged_reason"])
        self.assertNotIn("DIVERGED", r.stdout)
        self.assertEqual(r.stderr, "")

    def test_margin_is_one_and_a_half_times_chance(self):
        s, _ = summarize(self.run_dir("below", top1=lambda step: 0.149))
        self.assertTrue(s["diverged"])
        s, _ = summarize(self.run_dir("above", top1=lambda step: 0.151))
        self.assertFalse(s["diverged"])

    def test_classes_come_from_the_models_loss_layer(self):
        # A 4-class model (relative to the run directory): chance is 25%, so 30% has diverged.
        d = self.run_dir("four_classes", top1=lambda step: 0.30)
        with open(os.path.join(d, "four.toml"), "w") as f:
            f.write(textwrap.dedent("""\
                name = "four"
                [[layer]]
                name = "fc"
                type = "InnerProduct"
                bottom = ["data"]
                top = ["scores"]
                num_output = 4
                [[layer]]
                name = "loss"
                type = "SoftmaxWithLoss"
                bottom = ["scores", "label"]
                top = ["loss"]
                """))
        with open(os.path.join(d, "config.toml"), "a") as f:
            f.write('\n[model]\nconfig = "four.toml"\n')
        s, _ = summarize(d)
        self.assertEqual(s["num_classes"], 4)
        self.assertTrue(s["diverged"])
        self.assertEqual(s["diverged_reason"], "final top-1 30.00% = chance for 4 classes")

    def test_non_finite_training_loss_is_diverged_even_with_a_good_accuracy(self):
        # The metrics writer logs a NaN or Inf loss as null.
        d = self.run_dir("nan_loss", loss=lambda step: None if step >= 90 else fab.loss_at(step))
        s, _ = summarize(d)
        self.assertTrue(s["diverged"])
        self.assertEqual(s["diverged_reason"], "training loss null (NaN or Inf) at step 90 of worker 0")

    def test_non_finite_final_test_loss_is_diverged(self):
        d = self.run_dir("inf_test_loss")
        for name in ("worker-0", "worker-1"):
            path = os.path.join(d, "metrics", name + ".jsonl")
            with open(path) as f:
                records = [json.loads(line) for line in f]
            for r in records:
                if r["event"] == "eval" and r.get("final"):
                    r["test_loss"] = float("inf")  # Python's json writes Infinity, which it reads back
            with open(path, "w") as f:
                f.writelines(json.dumps(r) + "\n" for r in records)
        s, _ = summarize(d)
        self.assertTrue(s["diverged"])
        self.assertEqual(s["diverged_reason"], "final test loss inf")


class Compare(TempDirTest):
    def test_table_marks_the_diverged_run_only(self):
        good, bad = self.run_dir("good"), self.run_dir("bad", top1=at_chance)
        out = os.path.join(self.tmp, "cmp")
        r = fab.run_tool("downpour-compare", "-o", out, "-q", f"good={good}", f"bad={bad}")
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(os.path.join(out, "comparison.md")) as f:
            lines = [line for line in f if line.startswith("|")]
        headers = [c.strip() for c in lines[0].strip("|\n").split("|")]
        col = headers.index("diverged")
        rows = {cells[0]: cells for cells in ([c.strip() for c in line.strip("|\n").split("|")] for line in lines[2:])}
        self.assertEqual(rows["good"][col], "")
        self.assertEqual(rows["bad"][col], "DIVERGED")
        p, _ = parse_report(os.path.join(out, "report.html"))
        col = p.rows[0].index("diverged")
        self.assertEqual({row[0]: row[col] for row in p.rows[1:]}, {"good": "", "bad": "DIVERGED"})
        with open(os.path.join(out, "summaries.json")) as f:
            self.assertEqual({k: v["diverged"] for k, v in json.load(f).items()}, {"good": False, "bad": True})


# Stand-in for build/server/downpour-launch: a finished run, collapsed to chance when its run
# directory's name says "collapsed".
FAKE_LAUNCH = textwrap.dedent(f"""\
    #!{sys.executable}
    import os, shutil, sys
    sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
    import fabricate as fab
    args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
    run_dir = args["--run-dir"]
    collapsed = "collapsed" in os.path.basename(run_dir)
    fab.simple_run(run_dir, steps=120, top1=(lambda step: 0.1) if collapsed else fab.top1_at)
    shutil.copy(args["--config"], os.path.join(run_dir, "config.toml"))
""")

EXPERIMENT = textwrap.dedent("""\
    [experiment]
    name = "lr"
    base = "configs/runs/default.toml"
    [[run]]
    label = "fine"
    [[run]]
    label = "collapsed"
    solver = { base_lr = 5.0 }
""")


class Experiment(TempDirTest):
    def test_runner_prints_one_line_for_the_diverged_run_and_marks_it(self):
        build = os.path.join(self.tmp, "build")
        for rel, text in (("server/downpour-launch", FAKE_LAUNCH),
                          ("client/worker/downpour-worker", f"#!{sys.executable}\nimport sys\nsys.exit(0)\n")):
            path = os.path.join(build, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write(text)
            os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)
        exp = os.path.join(self.tmp, "exp.toml")
        with open(exp, "w") as f:
            f.write(EXPERIMENT)
        out = os.path.join(self.tmp, "out")
        r = fab.run_tool("downpour-experiment", exp, "--build-dir", build, "-o", out, "-q")
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = [line for line in r.stdout.splitlines() if line.startswith("run ")]
        self.assertEqual(lines, [f"run collapsed diverged: final top-1 10.00% = chance for 10 classes; {TRY}"])
        with open(os.path.join(out, "lr", "collapsed", "summary.json")) as f:
            self.assertTrue(json.load(f)["diverged"])
        with open(os.path.join(out, "lr", "fine", "summary.json")) as f:
            self.assertFalse(json.load(f)["diverged"])
        p, _ = parse_report(os.path.join(out, "lr", "all", "report.html"))
        col = p.rows[0].index("diverged")
        self.assertEqual({row[0]: row[col] for row in p.rows[1:]}, {"fine": "", "collapsed": "DIVERGED"})


if __name__ == "__main__":
    unittest.main()
