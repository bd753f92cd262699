#!/usr/bin/env python3
"""Bytes on the wire in the tools (issue 14): summaries read tx_bytes / rx_bytes from the
workers' step records (bytes per step, the cumulative bytes at each evaluation), downpour-compare
adds the columns and accuracy_vs_bytes.png, downpour-experiment takes a per-run `base`, and
configs/experiments/compression.toml is the grid the issue asks for (validated by the C++ config
loader when a build is given in DOWNPOUR_BUILD_DIR)."""
import importlib.machinery
import importlib.util
import json
import os
import tempfile
import unittest

import fabricate as fab
from test_compare import parse_report
from test_experiment import ExperimentTest

EXPERIMENT_FILE = os.path.join(fab.ROOT, "configs", "experiments", "compression.toml")
BUILD = os.environ.get("DOWNPOUR_BUILD_DIR", "")
REAL_WORKER = os.path.join(BUILD, "client", "worker", "downpour-worker") if BUILD else ""


def load_experiment_module():
    loader = importlib.machinery.SourceFileLoader("downpour_experiment", os.path.join(fab.TOOLS, "downpour-experiment"))
    spec = importlib.util.spec_from_loader("downpour_experiment", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def add_bytes(run_dir, push, pull, **shm):
    """Gives every worker step record tx_bytes / rx_bytes, as the issue-14 worker writes them (and
    shm_tx_bytes / shm_rx_bytes when given)."""
    for wid in range(2):
        path = os.path.join(run_dir, "metrics", f"worker-{wid}.jsonl")
        with open(path) as f:
            records = [json.loads(line) for line in f if line.strip()]
        for r in records:
            if r["event"] == "step":
                r.update(tx_bytes=push, rx_bytes=pull, step_ms=1000.0 + r["step"] % 3, **shm)
        with open(path, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)


class WireBytes(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory(prefix="downpour-bytes-")
        self.tmp = self._tmp.name

    def tearDown(self):
        self._tmp.cleanup()

    def test_summary_reads_bytes_per_step_and_bytes_up_to_each_evaluation(self):
        run = fab.simple_run(os.path.join(self.tmp, "a"), steps=100)
        add_bytes(run, 1000, 3000)
        r = fab.run_tool("downpour-summarize", "-q", run)
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(os.path.join(run, "summary.json")) as f:
            s = json.load(f)
        self.assertEqual((s["push_bytes_per_step"], s["pull_bytes_per_step"]), (1000, 3000))
        self.assertEqual(s["bytes_total"], 2 * 100 * 4000)
        self.assertEqual(s["step_ms_median"], 1001.0)
        # Worker 0 evaluates at step 20, 20 s into its training clock (wall_s, the tools' active
        # time); each worker has taken 20 steps by then on its own clock.
        first = s["evals"][0]
        self.assertEqual(first["step"], 20)
        self.assertEqual(first["bytes"], 2 * 20 * 4000)
        self.assertEqual(s["evals"][-1]["bytes"], 2 * 100 * 4000)

    def summary_of_a_shared_memory_run(self):
        """summary.json of 2 workers x 50 steps whose sockets carried 300 / 500 bytes a step and
        whose pushes went through shared memory (2,448,000 bytes a step; pulls' field null)."""
        run = fab.simple_run(os.path.join(self.tmp, "a"), steps=50)
        add_bytes(run, 300, 500, shm_tx_bytes=2_448_000, shm_rx_bytes=None)
        return fab.summarize(self, run, "-q")[0]

    def test_shared_memory_payloads_count_with_the_wire_headers(self):
        # Same host, shared memory on: the socket carries only headers, the payloads go through
        # the region; the bytes per step are both (null shared-memory fields count as none).
        s = self.summary_of_a_shared_memory_run()
        self.assertEqual((s["push_bytes_per_step"], s["pull_bytes_per_step"]), (2_448_300, 500))
        self.assertEqual(s["bytes_total"], 2 * 50 * (2_448_300 + 500))

    def test_summary_keeps_socket_and_shared_memory_bytes_apart(self):
        # tx_bytes / rx_bytes are what crossed the socket (headers only when shared memory is
        # on); shm_tx_bytes / shm_rx_bytes the payloads that did not. The summary names both.
        s = self.summary_of_a_shared_memory_run()
        self.assertEqual((s["socket_push_bytes_per_step"], s["socket_pull_bytes_per_step"]), (300, 500))
        self.assertEqual((s["shm_push_bytes_per_step"], s["shm_pull_bytes_per_step"]), (2_448_000, 0))
        self.assertEqual(s["socket_bytes_total"], 2 * 50 * 800)
        self.assertEqual(s["shm_bytes_total"], 2 * 50 * 2_448_000)
        self.assertEqual(s["bytes_total"], s["socket_bytes_total"] + s["shm_bytes_total"])  # the old key, both
        first = s["evals"][0]
        self.assertEqual((first["socket_bytes"], first["shm_bytes"]), (2 * 20 * 800, 2 * 20 * 2_448_000))
        self.assertEqual(first["bytes"], first["socket_bytes"] + first["shm_bytes"])

    def test_breakdown_line_names_shared_memory_apart_from_the_wire(self):
        run = fab.simple_run(os.path.join(self.tmp, "a"), steps=30)
        add_bytes(run, 300, 500, shm_tx_bytes=2_448_000, shm_rx_bytes=1_000_000)
        r = fab.run_tool("downpour-summarize", run)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("wire per step: tx 0.000 MB, rx 0.001 MB; shared memory per step: tx 2.448 MB, rx 1.000 MB",
                      r.stdout)

    def test_without_shared_memory_fields_socket_bytes_are_all_and_shm_unknown(self):
        run = fab.simple_run(os.path.join(self.tmp, "a"), steps=40)
        add_bytes(run, 1000, 3000)
        self.assertEqual(fab.run_tool("downpour-summarize", "-q", run).returncode, 0)
        with open(os.path.join(run, "summary.json")) as f:
            s = json.load(f)
        self.assertEqual(s["socket_bytes_total"], s["bytes_total"])
        self.assertIsNone(s["shm_bytes_total"])
        self.assertIsNone(s["shm_push_bytes_per_step"])
        self.assertIsNone(s["evals"][0]["shm_bytes"])

    def test_accuracy_vs_bytes_plots_socket_bytes_and_names_shared_memory_apart(self):
        # A same-host run with shared memory: ~2.45 MB a step went through the region, 800 bytes
        # through the socket. The plot's x axis is what crossed the socket, and says so; the
        # shared-memory bytes are in the legend and the table, named as such.
        shm = fab.simple_run(os.path.join(self.tmp, "shm"), steps=50)
        add_bytes(shm, 300, 500, shm_tx_bytes=2_448_000, shm_rx_bytes=0)
        out = os.path.join(self.tmp, "cmp")
        r = fab.run_tool("downpour-compare", "-q", "-o", out, f"same-host={shm}")
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(os.path.join(out, "run0.bytes")) as f:
            last = f.read().splitlines()[-1].split()
        self.assertAlmostEqual(float(last[0]), 2 * 50 * 800 / 1e9, places=7)
        with open(os.path.join(out, "accuracy_vs_bytes.gp")) as f:
            gp = f.read()
        self.assertNotIn("on the wire", gp)
        self.assertIn("set xlabel 'GB through sockets", gp)
        self.assertIn("same-host (+0.245 GB through shared memory, not on this axis)", gp)
        p, text = parse_report(os.path.join(out, "report.html"))
        header, *rows = p.rows
        col = {name: i for i, name in enumerate(header)}
        self.assertEqual(rows[0][col["socket MB/step"]], "0.001")
        self.assertEqual(rows[0][col["shm MB/step"]], "2.448")
        self.assertEqual(rows[0][col["push MB/step"]], "2.448")  # push MB/step: both ways, as before
        self.assertNotIn("on the wire", text)

    def test_runs_without_byte_fields_say_none(self):
        run = fab.simple_run(os.path.join(self.tmp, "a"), steps=40)
        self.assertEqual(fab.run_tool("downpour-summarize", "-q", run).returncode, 0)
        with open(os.path.join(run, "summary.json")) as f:
            s = json.load(f)
        self.assertIsNone(s["push_bytes_per_step"])
        self.assertIsNone(s["evals"][0]["bytes"])

    def test_compare_tables_bytes_and_plots_accuracy_vs_bytes(self):
        dense = fab.simple_run(os.path.join(self.tmp, "dense"), steps=60)
        add_bytes(dense, 2_580_000, 2_580_000)
        small = fab.simple_run(os.path.join(self.tmp, "small"), steps=60)
        add_bytes(small, 32_000, 1_290_000)
        out = os.path.join(self.tmp, "cmp")
        r = fab.run_tool("downpour-compare", "-q", "-o", out, f"fp32={dense}", f"onebit={small}")
        self.assertEqual(r.returncode, 0, r.stderr)
        p, _ = parse_report(os.path.join(out, "report.html"))
        header, *rows = p.rows
        col = {name: i for i, name in enumerate(header)}
        self.assertEqual([row[col["push MB/step"]] for row in rows], ["2.580", "0.032"])
        self.assertEqual([row[col["pull MB/step"]] for row in rows], ["2.580", "1.290"])
        with open(os.path.join(out, "accuracy_vs_bytes.png"), "rb") as f:
            self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")
        self.assertIn("accuracy_vs_bytes.png", p.imgs)
        with open(os.path.join(out, "run1.bytes")) as f:
            last = f.read().splitlines()[-1].split()
        self.assertAlmostEqual(float(last[0]), 2 * 60 * 1_322_000 / 1e9, places=5)


class PerRunBase(ExperimentTest):
    def test_a_run_may_start_from_its_own_base_config(self):
        text = ('[experiment]\nname = "two-bases"\nbase = "configs/runs/default.toml"\n'
                '[experiment.overrides]\ncluster = { base_port = 6800 }\n'
                '[[run]]\nlabel = "small"\n'
                '[[run]]\nlabel = "alex"\nbase = "configs/runs/alexnet.toml"\nworker = { steps = 3 }\n')
        r = self.experiment(self.write_experiment(text))
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(os.path.join(self.out, "two-bases", "alex", "config.toml")) as f:
            alex = f.read()
        with open(os.path.join(self.out, "two-bases", "small", "config.toml")) as f:
            small = f.read()
        self.assertIn('config = "configs/models/alexnet_fashion.toml"', alex)
        self.assertIn("steps = 3", alex)
        self.assertIn("base_port = 6800", alex)
        self.assertNotIn("base = ", alex)
        self.assertIn('config = "configs/models/fmnist_fast.toml"', small)

    def test_a_missing_run_base_is_a_usage_error_naming_the_run(self):
        text = ('[experiment]\nname = "x"\nbase = "configs/runs/default.toml"\n'
                '[[run]]\nlabel = "alex"\nbase = "configs/runs/nope.toml"\n')
        r = self.experiment(self.write_experiment(text))
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("nope.toml: no such base run config (base of run alex", r.stderr)


class CompressionExperiment(unittest.TestCase):
    """configs/experiments/compression.toml: 2 nets × 6 codecs × 2 links, AlexNet bounded."""

    def configs(self):
        exp = load_experiment_module()
        meta, runs, base = exp.load_experiment(EXPERIMENT_FILE)
        out = {}
        for run in runs:
            own = {k: v for k, v in run.items() if k not in exp.RUN_META_KEYS}
            out[run["label"]] = (run, exp.merge(exp.run_base(EXPERIMENT_FILE, meta, run, base), own))
        return exp, out

    def test_the_grid(self):
        _, configs = self.configs()
        self.assertEqual(len(configs), 24)
        seen = set()
        for label, (run, cfg) in configs.items():
            c = cfg["compression"]
            codec = ("factors" if c["factors"] else "") + c["push"] + "/" + c["pull"]
            model = cfg["model"]["config"]
            seen.add((model, codec, cfg["cluster"]["link_gbps"]))
            self.assertEqual((cfg["cluster"]["servers"], cfg["cluster"]["workers"]), (2, 2), label)
            self.assertEqual(cfg["consistency"]["mode"], "async", label)
            if c["push"] == "topk":
                self.assertEqual(c["top_k_fraction"], 0.01)
            if c["push"] in ("topk", "onebit"):
                self.assertTrue(c["error_feedback"], label)
            if "alexnet" in model:
                # 60 steps per worker: minutes a row on a 2-core VM (bench/RESULTS.md §11.3)
                self.assertLessEqual(cfg["worker"]["steps"], 60, f"{label}: AlexNet rows must stay bounded")
                self.assertGreater(cfg["eval"]["test_batches"], 0, f"{label}: AlexNet evaluates on a test subset")
        codecs = {"fp32/fp32", "factorsfp32/fp32", "factorsfp32/fp16", "topk/fp32", "onebit/fp32", "topk/fp16"}
        models = {"configs/models/fmnist_small.toml", "configs/models/alexnet_fashion.toml"}
        self.assertEqual(seen, {(m, c, l) for m in models for c in codecs for l in (1.0, 10.0)})

    def test_the_links_are_shaped_between_namespace_hosts(self):
        """network = "netns": each run's cluster.link_gbps becomes kernel-shaped links between
        hosts made of namespaces (downpour-experiment --network pacer emulates them instead)."""
        exp = load_experiment_module()
        meta, _, _ = exp.load_experiment(EXPERIMENT_FILE)
        self.assertEqual(meta["network"], "netns")

    def test_groups_compare_the_six_codecs_at_one_net_and_link(self):
        _, configs = self.configs()
        groups = {}
        for label, (run, _) in configs.items():
            groups.setdefault(run["group"], []).append(label)
        self.assertEqual(sorted(groups), ["alexnet-10gbps", "alexnet-1gbps", "fmnist-10gbps", "fmnist-1gbps"])
        self.assertTrue(all(len(v) == 6 for v in groups.values()))

    @unittest.skipUnless(REAL_WORKER and os.access(REAL_WORKER, os.X_OK), "needs a build (DOWNPOUR_BUILD_DIR)")
    def test_every_run_config_passes_the_config_loader(self):
        exp, configs = self.configs()
        with tempfile.TemporaryDirectory() as tmp:
            for label, (_, cfg) in configs.items():
                path = os.path.join(tmp, label + ".toml")
                exp.write_toml(cfg, path, label)
                exp.check_config(REAL_WORKER, label, path, [])


if __name__ == "__main__":
    unittest.main()
