#!/usr/bin/env python3
"""The tools on a run evaluated by its evaluator process (metrics/evaluator.jsonl, issue 16):
summary.json takes the evaluator's evaluations (none from workers), places each at the time its
snapshot was pulled on the run's active clock, carries the images all workers had processed and
the global epoch, and downpour-compare plots accuracy against images; a cluster run in parts
without the evaluator's file is reported missing; old runs (no eval.evaluator key) are read as
before."""
import json
import os
import unittest

import fabricate as fab


class EvaluatorRun(fab.TempDirTest):
    def summarize(self, run):
        return fab.summarize(self, run)[0]

    def test_summary_uses_the_evaluators_records_on_the_run_clock(self):
        run = os.path.join(self.tmp, "run")
        evals = fab.evaluator_run(run, steps=100, every=40, lag=3, eval_s=2.0)
        s = self.summarize(run)
        self.assertEqual(s["evaluated_by"], "evaluator")
        self.assertEqual(len(s["evals"]), len(evals))
        first = s["evals"][0]
        # Pulled at t0 + (40 + 3) / 2 s: 21.5 s into the run (its end, t, is eval_s later).
        self.assertAlmostEqual(first["wall_s"], 21.5, places=6)
        self.assertEqual(first["images"], 43 * fab.BATCH)
        self.assertEqual(first["step"], None)
        self.assertAlmostEqual(first["epoch"], 43 * fab.BATCH / 60000, places=9)
        self.assertTrue(s["evals"][-1]["final"])
        self.assertEqual(s["final_top1"], evals[-1]["top1"])
        self.assertEqual(s["images"], 2 * 100 * fab.BATCH)
        self.assertEqual([e["wall_s"] for e in s["evals"]], sorted(e["wall_s"] for e in s["evals"]))

    def test_compare_plots_accuracy_against_images(self):
        run = os.path.join(self.tmp, "run")
        fab.evaluator_run(run)
        old = fab.simple_run(os.path.join(self.tmp, "old"))  # worker 0 evaluated (no eval.evaluator key)
        out = os.path.join(self.tmp, "out")
        r = fab.run_tool("downpour-compare", "-q", "-o", out, run, old)
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(os.path.join(out, "accuracy_vs_images.png"), "rb") as f:
            self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")
        with open(os.path.join(out, "run1.dat")) as f:
            rows = [line.split() for line in f if not line.startswith("#")]
        # A worker-0 evaluation's images: step x batch x workers (step 20 of 2 workers).
        self.assertEqual(rows[0][4], str(20 * fab.BATCH * 2))
        with open(os.path.join(old, "summary.json")) as f:
            self.assertEqual(json.load(f)["evaluated_by"], "worker 0")

    def test_a_cluster_run_without_the_evaluators_file_names_it_missing(self):
        parts = [os.path.join(self.tmp, "a"), os.path.join(self.tmp, "b")]
        fab.cluster_run(parts)
        for d in parts:
            with open(os.path.join(d, "config.toml"), "a") as f:
                f.write('\n[data]\ntest = "test_lmdb"\n\n[eval]\nevaluator = true\n')
        r = fab.run_tool("downpour-summarize", "+".join(parts))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("metrics/evaluator.jsonl", r.stderr)
        with open(os.path.join(parts[0], "summary.json")) as f:
            self.assertEqual(json.load(f)["missing"], ["metrics/evaluator.jsonl"])


if __name__ == "__main__":
    unittest.main()
