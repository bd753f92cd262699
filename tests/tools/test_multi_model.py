#!/usr/bin/env python3
"""The tools on a multi-model run ([[models]], docs/multi_model.md): summary.json gets the
leaderboard (best top-1 first), each model's curve in image order, the images each model saw and
the bytes moved (model payload, data read from other workers' partitions); the run's final top-1
is its best model's; downpour-summarize prints the leaderboard; downpour-compare draws each
model's curve; a one-model run has no multi_model part."""
import json
import os
import tempfile
import unittest

import fabricate as fab

MODELS = ["base_lr=0.01", "base_lr=0.02"]


def multi_model_run(run_dir, scheme="pipeline", t0=1000.0):
    """A finished K = 2, W = 2 run as multi-model workers write it: stages, curves, worker 0's
    final evaluation of both models."""
    fab.write_config(run_dir, name="sweep")
    with open(os.path.join(run_dir, "config.toml"), "a") as f:
        f.write(f'\n[rotation]\nscheme = "{scheme}"\npasses = 1\nstage_steps = 10\n')
        for name in MODELS:
            f.write(f'\n[[models]]\nname = "{name}"\nconfig = "m.toml"\n')
    final_top1 = {0: 0.70, 1: 0.80}  # model 1 wins
    for w in range(2):
        rec = lambda t, event, **kw: {"t": t0 + t, "role": "worker", "id": w, "event": event, **kw}  # noqa: E731
        records = [rec(0, "mm_start", models=2, workers=2, scheme=scheme, passes=1, stages=2, batch_size=fab.BATCH)]
        for stage in range(2):
            m = (w + stage) % 2
            images = 10 * fab.BATCH * (stage + 1)
            records.append(rec(5 * stage + 4, "model_curve", model=m, name=MODELS[m], stage=stage, train_images=images,
                               epoch=images / 60000, top1=0.5 + 0.1 * stage + 0.05 * m, loss=1.0, run_s=5 * stage + 4))
            records.append(rec(5 * stage + 5, "stage", stage=stage, model=m, name=MODELS[m], partition=w, own=True,
                               group=1, steps=10, images=10 * fab.BATCH, loss=1.0, seconds=5.0, wait_s=0.25,
                               model_bytes=1000, data_bytes_moved=0 if scheme == "pipeline" else 500))
        records.append(rec(11, "done", images=20 * fab.BATCH, wall_s=11.0, train_s=10.0, eval_s=0.5, wait_s=0.5,
                           model_bytes=2000, data_bytes_moved=0))
        if w == 0:
            for m in range(2):
                records.append(rec(12 + m, "model_eval", model=m, name=MODELS[m], top1=final_top1[m], top5=0.99,
                                   loss=0.5 - 0.1 * m, test_images=10000, train_images=20 * fab.BATCH))
        fab.append_jsonl(run_dir, f"worker-{w}", records)
    return run_dir


class MultiModelRun(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory(prefix="downpour-multimodel-")
        self.tmp = self._tmp.name

    def tearDown(self):
        self._tmp.cleanup()

    def summarize(self, run):
        r = fab.run_tool("downpour-summarize", run)
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(os.path.join(run, "summary.json")) as f:
            return json.load(f), r.stdout

    def test_summary_has_the_leaderboard_curves_and_bytes_moved(self):
        run = multi_model_run(os.path.join(self.tmp, "run"), scheme="independent")
        s, out = self.summarize(run)
        mm = s["multi_model"]
        self.assertEqual(mm["scheme"], "independent")
        self.assertEqual(mm["models"], 2)
        self.assertEqual([r["name"] for r in mm["leaderboard"]], ["base_lr=0.02", "base_lr=0.01"])
        self.assertEqual([r["rank"] for r in mm["leaderboard"]], [1, 2])
        self.assertAlmostEqual(s["final_top1"], 0.80)
        self.assertEqual(s["evaluated_by"], "worker 0 (every model)")
        self.assertEqual(mm["model_bytes"], 4 * 1000)
        self.assertEqual(mm["data_bytes_moved"], 4 * 500)
        self.assertAlmostEqual(mm["wait_s"], 1.0)
        self.assertEqual(mm["images_per_model"], {name: 2 * 10 * fab.BATCH for name in MODELS})
        for name in MODELS:
            images = [p["images"] for p in mm["curves"][name]]
            self.assertEqual(images, sorted(images))
            self.assertEqual(len(images), 2)
        self.assertIn("leaderboard:", out)
        self.assertIn("1. base_lr=0.02: top-1 80.00%", out)
        self.assertEqual(s["images_per_s"], 2 * 20 * fab.BATCH / 10.0)

    def test_compare_draws_each_models_curve(self):
        run = multi_model_run(os.path.join(self.tmp, "run"))
        out = os.path.join(self.tmp, "out")
        r = fab.run_tool("downpour-compare", "-q", "-o", out, f"sweep={run}")
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(os.path.join(out, "models_accuracy_vs_images.png"), "rb") as f:
            self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")
        with open(os.path.join(out, "run0-model1.dat")) as f:
            rows = [line.split() for line in f if not line.startswith("#")]
        self.assertEqual(len(rows), 2)

    def test_a_one_model_run_has_no_multi_model_part(self):
        run = fab.simple_run(os.path.join(self.tmp, "one"))
        s, _ = self.summarize(run)
        self.assertIsNone(s["multi_model"])
        out = os.path.join(self.tmp, "out")
        self.assertEqual(fab.run_tool("downpour-compare", "-q", "-o", out, run).returncode, 0)
        self.assertFalse(os.path.exists(os.path.join(out, "models_accuracy_vs_images.png")))


if __name__ == "__main__":
    unittest.main()
