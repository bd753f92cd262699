#!/usr/bin/env python3
"""The tools on a multi-model run ([[models]], docs/multi_model.md): summary.json gets the
leaderboard (best top-1 first), each model's curve in image order, the images each model saw and
the bytes moved (model payload, data read from other workers' partitions); the run's final top-1
is its best model's; downpour-summarize prints the leaderboard; downpour-compare draws each
model's curve; a one-model run has no multi_model part."""
import json
import os
import re
import unittest

import fabricate as fab

MODELS = ["base_lr=0.01", "base_lr=0.02"]
SWEEP4 = ["base_lr=0.005", "base_lr=0.01", "base_lr=0.02", "base_lr=0.04"]  # configs/runs/multi_model.toml


def multi_model_run(run_dir, scheme="pipeline", t0=1000.0, models=MODELS, workers=2, stage_bytes=None):
    """A finished K = len(models), W = workers run (one pass: K stages of 10 steps) as
    multi-model workers write it: stages, curves, worker 0's final evaluation of every model
    (the last model wins). stage_bytes: {tx_bytes, rx_bytes, shm_tx_bytes, shm_rx_bytes} for
    every stage record (the worker's transport and shared-memory counters over the stage)."""
    K = len(models)
    fab.write_config(run_dir, name="sweep", workers=workers)
    with open(os.path.join(run_dir, "config.toml"), "a") as f:
        f.write(f'\n[rotation]\nscheme = "{scheme}"\npasses = 1\nstage_steps = 10\n')
        for name in models:
            f.write(f'\n[[models]]\nname = "{name}"\nconfig = "m.toml"\n')
    for w in range(workers):
        rec = lambda t, event, **kw: {"t": t0 + t, "role": "worker", "id": w, "event": event, **kw}  # noqa: E731
        records = [rec(0, "mm_start", models=K, workers=workers, scheme=scheme, passes=1, stages=K,
                       batch_size=fab.BATCH)]
        for stage in range(K):
            m = (w + stage) % K
            images = 10 * fab.BATCH * (stage + 1)
            records.append(rec(5 * stage + 4, "model_curve", model=m, name=models[m], stage=stage, train_images=images,
                               epoch=images / 60000, top1=0.5 + 0.1 * stage + 0.05 * m, loss=1.0, run_s=5 * stage + 4))
            records.append(rec(5 * stage + 5, "stage", stage=stage, model=m, name=models[m], partition=w, own=True,
                               group=1, steps=10, images=10 * fab.BATCH, loss=1.0, seconds=5.0, wait_s=0.25,
                               model_bytes=1000, data_bytes_moved=0 if scheme == "pipeline" else 500,
                               **(stage_bytes or {})))
        records.append(rec(5 * K + 1, "done", images=K * 10 * fab.BATCH, wall_s=5.0 * K + 1, train_s=5.0 * K,
                           eval_s=0.5, wait_s=0.5, model_bytes=K * 1000, data_bytes_moved=0))
        if w == 0:
            for m in range(K):
                records.append(rec(5 * K + 2 + m, "model_eval", model=m, name=models[m], top1=0.70 + 0.1 * m,
                                   top5=0.99, loss=0.5 - 0.1 * m, test_images=10000, train_images=K * 10 * fab.BATCH))
        fab.append_jsonl(run_dir, f"worker-{w}", records)
    return run_dir


def plotted_series(gp_path):
    """The (colour, title) of every series of a gnuplot script's plot command."""
    with open(gp_path) as f:
        plot_line = next(line for line in f if line.startswith("plot "))
    return re.findall(r"lc (rgb '#[0-9a-fA-F]{6}'|\d+) .*?title '((?:[^']|'')*)'", plot_line)


class MultiModelRun(fab.TempDirTest):
    def summarize(self, run):
        return fab.summarize(self, run)

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

    def test_each_model_has_its_own_colour_and_a_legend_entry_naming_it(self):
        run = multi_model_run(os.path.join(self.tmp, "run"), models=SWEEP4, workers=4)
        out = os.path.join(self.tmp, "out")
        r = fab.run_tool("downpour-compare", "-q", "-o", out, run)
        self.assertEqual(r.returncode, 0, r.stderr)
        series = plotted_series(os.path.join(out, "models_accuracy_vs_images.gp"))
        self.assertEqual(len({colour for colour, _ in series}), 4, series)
        self.assertEqual([title for _, title in series], SWEEP4)  # the model's name, in config order

    def test_two_sweeps_keep_every_model_apart(self):
        a = multi_model_run(os.path.join(self.tmp, "a"), scheme="pipeline")
        b = multi_model_run(os.path.join(self.tmp, "b"), scheme="independent")
        out = os.path.join(self.tmp, "out")
        r = fab.run_tool("downpour-compare", "-q", "-o", out, f"models-move={a}", f"data-moves={b}")
        self.assertEqual(r.returncode, 0, r.stderr)
        series = plotted_series(os.path.join(out, "models_accuracy_vs_images.gp"))
        self.assertEqual([title for _, title in series],
                         [f"{label}: {name}" for label in ("models-move", "data-moves") for name in MODELS])
        self.assertEqual(len({colour for colour, _ in series}), 4, series)

    def test_a_sweep_is_labelled_by_what_it_is(self):
        run = multi_model_run(os.path.join(self.tmp, "run"), models=SWEEP4, workers=4)
        baseline = multi_model_run(os.path.join(self.tmp, "seq"), scheme="sequential", models=SWEEP4, workers=4)
        out = os.path.join(self.tmp, "out")
        r = fab.run_tool("downpour-compare", "-q", "-o", out, run, baseline)
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(os.path.join(out, "summaries.json")) as f:
            labels = list(json.load(f))
        self.assertEqual(labels, ["sweep of 4 models (pipeline), W=4", "sweep of 4 models (sequential), W=4"])
        with open(os.path.join(out, "comparison.md")) as f:
            self.assertIn("| sweep of 4 models (pipeline), W=4 |", f.read())

    def test_a_sweeps_steps_are_its_stages_steps(self):
        # A multi-model worker's done record has no "steps": its stages' steps are the count.
        run = multi_model_run(os.path.join(self.tmp, "run"), models=SWEEP4, workers=4)
        s, _ = self.summarize(run)
        self.assertEqual(s["steps"], 4 * 4 * 10)
        self.assertEqual(s["images"], 4 * 4 * 10 * fab.BATCH)

    def test_a_sweeps_socket_and_shared_memory_bytes_are_apart(self):
        run = multi_model_run(os.path.join(self.tmp, "run"), stage_bytes={
            "tx_bytes": 2000, "rx_bytes": 3000, "shm_tx_bytes": 40_000, "shm_rx_bytes": 50_000})
        s, out = self.summarize(run)
        mm = s["multi_model"]
        self.assertEqual(mm["socket_bytes"], 4 * 5000)  # 2 workers x 2 stages
        self.assertEqual(mm["shm_bytes"], 4 * 90_000)
        self.assertIn("through sockets 0.0 MB, through shared memory 0.4 MB", out)
        plain = multi_model_run(os.path.join(self.tmp, "plain"))
        s, _ = self.summarize(plain)
        self.assertIsNone(s["multi_model"]["socket_bytes"])
        self.assertIsNone(s["multi_model"]["shm_bytes"])

    def test_a_one_model_run_has_no_multi_model_part(self):
        run = fab.simple_run(os.path.join(self.tmp, "one"))
        s, _ = self.summarize(run)
        self.assertIsNone(s["multi_model"])
        out = os.path.join(self.tmp, "out")
        self.assertEqual(fab.run_tool("downpour-compare", "-q", "-o", out, run).returncode, 0)
        self.assertFalse(os.path.exists(os.path.join(out, "models_accuracy_vs_images.png")))


if __name__ == "__main__":
    unittest.main()
