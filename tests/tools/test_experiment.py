#!/usr/bin/env python3
"""downpour-experiment without a build: a stand-in downpour-launch (a script in a temporary
build dir) writes fabricated run directories, so the whole path runs — configs with the
overrides, summaries, one comparison per group, the index report.html — plus the experiment
file checks (exit 2) and a failing launch (exit 1)."""
import json
import os
import stat
import sys
import tempfile
import textwrap
import tomllib
import unittest

import fabricate as fab
from test_compare import parse_report

# Stand-in for build/server/downpour-launch: copies --config to RUN_DIR/config.toml, records its
# arguments in RUN_DIR/launch-args.txt and writes a finished 2-worker run; exits FAKE_LAUNCH_EXIT
# when that is set (a failing job).
FAKE_LAUNCH = textwrap.dedent(f"""\
    #!{sys.executable}
    import os, shutil, sys
    sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
    import fabricate as fab
    args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
    if os.environ.get("FAKE_LAUNCH_EXIT"):
        sys.exit(int(os.environ["FAKE_LAUNCH_EXIT"]))
    import tomllib
    with open(args["--config"], "rb") as f:
        cfg = tomllib.load(f)
    seed = cfg.get("run", {{}}).get("seed", 1)
    if os.environ.get("FAKE_FAIL_SEED") == str(seed):
        sys.exit(3)
    # FAKE_TOP1_BY_SEED: each seed's accuracy curve shifted by 0.01 x seed; a sync run's by
    # FAKE_SYNC_SHIFT more (a difference the statistics must call, or not).
    shift = 0.0
    if os.environ.get("FAKE_TOP1_BY_SEED"):
        shift = 0.01 * seed
        if cfg.get("consistency", {{}}).get("mode") == "sync":
            shift += float(os.environ.get("FAKE_SYNC_SHIFT", "0"))
    run_dir = args["--run-dir"]
    fab.simple_run(run_dir, steps=120, top1=lambda step: min(1.0, fab.top1_at(step) + shift))
    shutil.copy(args["--config"], os.path.join(run_dir, "config.toml"))
    with open(os.path.join(run_dir, "launch-args.txt"), "w") as f:
        f.write(" ".join(sys.argv[1:]))
    print("[launch] done")
""")

# Stand-in for build/client/worker/downpour-worker, which the tool asks to validate every run's
# config (--write-tensors): accepts everything.
FAKE_WORKER = f"#!{sys.executable}\nimport sys\nsys.exit(0)\n"

# The real worker, for the tests of --set validation (skipped without a build).
BUILD = os.environ.get("DOWNPOUR_BUILD_DIR", "")
REAL_WORKER = os.path.join(BUILD, "client", "worker", "downpour-worker") if BUILD else ""

EXPERIMENT = textwrap.dedent("""\
    [experiment]
    name = "tiny"
    base = "configs/runs/default.toml"
    [experiment.overrides]
    worker = { steps = 10 }

    [[run]]
    label = "sync-w2"
    group = "modes"
    consistency = { mode = "sync" }

    [[run]]
    label = "async-w2"
    group = ["modes", "workers"]
    consistency = { mode = "async" }
""")


class ExperimentTest(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory(prefix="downpour-experiment-")
        self.tmp = self._tmp.name
        self.build = os.path.join(self.tmp, "build")
        os.makedirs(os.path.join(self.build, "server"))
        os.makedirs(os.path.join(self.build, "client", "worker"))
        for path, text in ((os.path.join(self.build, "server", "downpour-launch"), FAKE_LAUNCH),
                           (os.path.join(self.build, "client", "worker", "downpour-worker"), FAKE_WORKER)):
            with open(path, "w") as f:
                f.write(text)
            os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)
        self.out = os.path.join(self.tmp, "out")

    def tearDown(self):
        self._tmp.cleanup()

    def write_experiment(self, text=EXPERIMENT):
        path = os.path.join(self.tmp, "exp.toml")
        with open(path, "w") as f:
            f.write(text)
        return path

    def experiment(self, *args, env=None):
        return fab.run_tool("downpour-experiment", *args, "--build-dir", self.build, "-o", self.out, "-q", env=env)


class FullExperiment(ExperimentTest):
    def test_runs_compares_each_group_and_writes_an_index(self):
        r = self.experiment(self.write_experiment())
        self.assertEqual(r.returncode, 0, r.stderr)
        exp = os.path.join(self.out, "tiny")
        # Each run's config: the base, the experiment's overrides, the run's own keys.
        with open(os.path.join(exp, "sync-w2", "config.toml")) as f:
            config = f.read()
        self.assertIn('mode = "sync"', config)
        self.assertIn("steps = 10", config)
        self.assertIn('name = "sync-w2"', config)
        for group, labels in (("modes", ["sync-w2", "async-w2"]), ("workers", ["async-w2"])):
            with open(os.path.join(exp, group, "summaries.json")) as f:
                self.assertEqual(list(json.load(f)), labels)
            p, _ = parse_report(os.path.join(exp, group, "report.html"))
            self.assertEqual([row[0] for row in p.rows[1:]], labels)
        index, text = parse_report(os.path.join(exp, "report.html"))
        self.assertIn('href="modes/report.html"', text)
        self.assertIn('href="workers/report.html"', text)
        self.assertEqual([row[0] for row in index.rows if row[0] != "run"], ["sync-w2", "async-w2", "async-w2"])
        self.assertIn(f"report: {os.path.join(exp, 'report.html')}", r.stdout)

    def test_compare_only_remakes_the_reports_from_existing_runs(self):
        path = self.write_experiment()
        self.assertEqual(self.experiment(path).returncode, 0)
        os.remove(os.path.join(self.out, "tiny", "report.html"))
        os.remove(os.path.join(self.out, "tiny", "modes", "report.html"))
        r = fab.run_tool("downpour-experiment", path, "--build-dir", os.path.join(self.tmp, "no-build"),
                         "-o", self.out, "--compare-only", "-q")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertTrue(os.path.exists(os.path.join(self.out, "tiny", "report.html")))
        self.assertTrue(os.path.exists(os.path.join(self.out, "tiny", "modes", "report.html")))

    def test_set_reaches_every_launch(self):
        r = self.experiment(self.write_experiment(), "--set", "worker.steps=7", "--set", "data.mirror=true")
        self.assertEqual(r.returncode, 0, r.stderr)
        for label in ("sync-w2", "async-w2"):
            with open(os.path.join(self.out, "tiny", label, "launch-args.txt")) as f:
                args = f.read()
            self.assertIn("--set worker.steps=7 --set data.mirror=true", args)

    def test_failed_launch_exits_1_naming_the_run(self):
        r = self.experiment(self.write_experiment(), env=dict(os.environ, FAKE_LAUNCH_EXIT="3"))
        self.assertEqual(r.returncode, 1)
        self.assertIn("downpour-experiment: sync-w2: downpour-launch exited 3", r.stderr)


class Seeds(ExperimentTest):
    """--seeds N: every cell N times, seed by seed; statistics per group; reuse; failures left out."""

    def launches(self, r):
        return [line for line in r.stdout.splitlines() if line.startswith("== ") and "seed" in line
                and "comparison" not in line]

    def seed_of(self, label, seed):
        with open(os.path.join(self.out, "tiny", label, f"seed-{seed}", "config.toml"), "rb") as f:
            return tomllib.load(f)["run"]["seed"]

    def test_every_cell_runs_each_seed_seed_by_seed_and_gets_an_interval(self):
        env = dict(os.environ, FAKE_TOP1_BY_SEED="1")
        r = self.experiment(self.write_experiment(), "--seeds", "3", env=env)
        self.assertEqual(r.returncode, 0, r.stderr)
        order = [line.split(":")[0][3:] for line in self.launches(r)]
        self.assertEqual(order, ["sync-w2 seed 1", "async-w2 seed 1", "sync-w2 seed 2", "async-w2 seed 2",
                                 "sync-w2 seed 3", "async-w2 seed 3"])
        self.assertEqual([self.seed_of("sync-w2", s) for s in (1, 2, 3)], [1, 2, 3])
        with open(os.path.join(self.out, "tiny", "modes", "stats.json")) as f:
            st = json.load(f)["cells"]
        top1 = st["sync-w2"]["metrics"]["final_top1"]
        self.assertEqual((st["sync-w2"]["runs"], top1["n"]), (3, 3))
        # Final top-1 = the curve at step 120 plus 1, 2, 3 points: mean +2, s = 1, t(0.975, 2) = 4.303.
        self.assertAlmostEqual(top1["mean"], 100 * (fab.top1_at(120) + 0.02), places=3)
        self.assertAlmostEqual(top1["half"], 4.3027 * 1.0 / 3 ** 0.5, places=2)
        self.assertEqual(st["sync-w2"]["metrics"]["time_to_target_interp_s"]["missing"], 3)  # 0.89 never reached
        with open(os.path.join(self.out, "tiny", "modes", "stats.md")) as f:
            table = f.read()
        self.assertIn("| sync-w2 vs async-w2 | no difference shown (Welch p = 1) |", table)
        self.assertIn("(3 not reached)", table)
        self.assertIn("accuracy_band.png", table)
        self.assertTrue(os.path.getsize(os.path.join(self.out, "tiny", "modes", "accuracy_band.png")) > 0)

    def test_a_real_difference_is_called_significant(self):
        env = dict(os.environ, FAKE_TOP1_BY_SEED="1", FAKE_SYNC_SHIFT="0.05")
        r = self.experiment(self.write_experiment(), "--seeds", "3", env=env)
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(os.path.join(self.out, "tiny", "modes", "stats.md")) as f:
            table = f.read()
        self.assertRegex(table, r"\| sync-w2 vs async-w2 \| significant \(Welch p = [0-9.e-]+\) \|")

    def test_the_map_names_a_winner_only_where_the_test_calls_one(self):
        two_points = EXPERIMENT.replace('group = ["modes", "workers"]', 'group = "modes"') + textwrap.dedent("""\
            [[run]]
            label = "sync-w4"
            group = "w4"
            consistency = { mode = "sync" }
            cluster = { workers = 4 }
            [[run]]
            label = "async-w4"
            group = "w4"
            consistency = { mode = "async" }
            cluster = { workers = 4 }
        """)
        env = dict(os.environ, FAKE_TOP1_BY_SEED="1", FAKE_SYNC_SHIFT="0.05")
        r = self.experiment(self.write_experiment(two_points), "--seeds", "3", env=env)
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(os.path.join(self.out, "tiny", "map.md")) as f:
            rows = [line for line in f if line.startswith("| modes") or line.startswith("| w4")]
        # Each group placed by what sets it apart (the workers), sync 5 points above async.
        self.assertEqual(len(rows), 2, rows)
        self.assertTrue(rows[0].startswith("| modes: workers=2 | sync-w2 / async-w2 | "), rows[0])
        self.assertTrue(rows[1].startswith("| w4: workers=4 | sync-w4 / async-w4 | "), rows[1])
        self.assertRegex(rows[0], r"\| \*\*sync-w2\*\* \+5\.00 \(p = [0-9.e-]+\) \|")
        self.assertIn("| only sync-w2 reaches it, 1 of 3 runs (not tested) |", rows[0])  # seed 3 alone
        r = self.experiment(self.write_experiment(two_points), "--seeds", "3", "--rerun",
                            env=dict(os.environ, FAKE_TOP1_BY_SEED="1"))
        with open(os.path.join(self.out, "tiny", "map.md")) as f:
            self.assertIn("| no difference shown (p = 1) |", f.read())

    def test_the_target_is_the_experiments_and_times_every_run_that_reaches_it(self):
        env = dict(os.environ, FAKE_TOP1_BY_SEED="1")
        r = self.experiment(self.write_experiment(EXPERIMENT.replace('name = "tiny"', 'name = "tiny"\ntarget = 0.8')),
                            "--seeds", "3", env=env)
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(os.path.join(self.out, "tiny", "modes", "stats.json")) as f:
            st = json.load(f)
        self.assertEqual(st["target_top1"], 0.8)
        # 0.89 is out of reach (above); 0.80 is crossed by every seed before its last evaluation.
        time = st["cells"]["sync-w2"]["metrics"]["time_to_target_interp_s"]
        self.assertEqual((time["n"], time["missing"]), (3, 0))
        with open(os.path.join(self.out, "tiny", "map.md")) as f:
            self.assertIn("the target is 80% top-1", f.read())
        with open(os.path.join(self.out, "tiny", "runs.json")) as f:
            runs = json.load(f)
        self.assertEqual([r["run"] for r in runs], [f"{m}-w2/seed-{s}" for m in ("async", "sync") for s in (1, 2, 3)])
        self.assertTrue(all(r["target_top1"] == 0.8 and r["time_to_target_interp_s"] for r in runs), runs)
        for args, where in ((["--target", "0"], "--target 0: "), (["--target", "1"], "--target 1: ")):
            r = self.experiment(self.write_experiment(), *args)
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn(where + "must be a top-1 fraction in (0, 1)", r.stderr)
        r = self.experiment(self.write_experiment(EXPERIMENT.replace('name = "tiny"', 'name = "tiny"\ntarget = "high"')))
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("experiment.target = 'high': must be a top-1 fraction", r.stderr)

    def test_a_run_of_its_own_network_and_the_flag_over_it(self):
        own = EXPERIMENT.replace('label = "async-w2"', 'label = "async-w2"\nnetwork = "bogus"')
        r = self.experiment(self.write_experiment(own))
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("run async-w2: network = 'bogus': expected \"netns\" or \"pacer\"", r.stderr)
        r = self.experiment(self.write_experiment(own.replace("bogus", "netns")), "--network", "pacer")
        self.assertEqual(r.returncode, 0, r.stderr)  # --network pacer runs it on this host
        self.assertTrue(os.path.exists(os.path.join(self.out, "tiny", "async-w2", "launch-args.txt")))

    def test_a_second_pass_reuses_what_finished_and_rerun_runs_it_again(self):
        path = self.write_experiment()
        self.assertEqual(self.experiment(path, "--seeds", "2").returncode, 0)
        r = self.experiment(path, "--seeds", "2")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.count("reused (finished earlier"), 4, r.stdout)
        r = self.experiment(path, "--seeds", "2", "--set", "worker.steps=5")  # another config: run again
        self.assertEqual(r.stdout.count("reused"), 0, r.stdout)
        r = self.experiment(path, "--seeds", "2", "--set", "worker.steps=5", "--rerun")
        self.assertEqual(r.stdout.count("reused"), 0, r.stdout)

    def test_a_failed_seed_is_left_out_with_a_warning_and_the_tool_exits_1(self):
        env = dict(os.environ, FAKE_FAIL_SEED="2")
        r = self.experiment(self.write_experiment(), "--seeds", "3", env=env)
        self.assertEqual(r.returncode, 1)
        self.assertIn("warning: sync-w2 seed 2: downpour-launch exited 3", r.stderr)
        self.assertEqual(len(self.launches(r)), 6, "the other runs still ran")
        with open(os.path.join(self.out, "tiny", "modes", "stats.json")) as f:
            self.assertEqual(json.load(f)["cells"]["sync-w2"]["runs"], 2)
        with open(os.path.join(self.out, "tiny", "modes", "stats.md")) as f:
            self.assertIn("Excluded: sync-w2 seed 2 failed", f.read())

    def test_a_group_whose_cells_differ_in_more_than_one_key_is_warned(self):
        r = self.experiment(self.write_experiment(EXPERIMENT.replace(
            'consistency = { mode = "async" }', 'consistency = { mode = "async" }\ncluster = { workers = 4 }')))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("warning: group modes: its cells differ in cluster.workers, consistency.mode (not one axis", r.stderr)
        self.assertNotIn("group workers", r.stderr, "a group of one cell varies nothing")
        r = self.experiment(self.write_experiment())
        self.assertNotIn("warning: group", r.stderr, "sync vs async differ in the mode alone")

    def test_fewer_than_one_seed_is_a_usage_error(self):
        for bad in ("0", "-2"):
            r = self.experiment(self.write_experiment(), "--seeds", bad)
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn(f"--seeds {bad}: must be an integer >= 1", r.stderr)
        r = self.experiment(self.write_experiment(EXPERIMENT.replace('name = "tiny"', 'name = "tiny"\nseeds = 0')))
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("experiment.seeds = 0: must be an integer >= 1", r.stderr)


class BadExperimentFiles(ExperimentTest):
    def assert_usage_error(self, text, message, *args):
        r = self.experiment(self.write_experiment(text), *args)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertTrue(r.stderr.startswith("downpour-experiment: "), r.stderr)
        self.assertIn(message, r.stderr)

    def test_not_toml(self):
        self.assert_usage_error("[experiment\n", "exp.toml: ")

    def test_missing_name_or_base(self):
        self.assert_usage_error('[experiment]\nname = "x"\n[[run]]\nlabel = "a"\n', "[experiment] needs name and base")

    def test_no_runs(self):
        self.assert_usage_error('[experiment]\nname = "x"\nbase = "configs/runs/default.toml"\n', "no [[run]] entries")

    def test_run_without_label(self):
        self.assert_usage_error(EXPERIMENT + "[[run]]\ngroup = \"modes\"\n", "[[run]] number 3 has no label")

    def test_duplicate_labels(self):
        self.assert_usage_error(EXPERIMENT + "[[run]]\nlabel = \"sync-w2\"\n", "run labels must be unique")

    def test_missing_base_config(self):
        self.assert_usage_error(EXPERIMENT.replace("configs/runs/default.toml", "configs/runs/nope.toml"),
                                "nope.toml: no such base run config")

    def test_unknown_only_label(self):
        self.assert_usage_error(EXPERIMENT, "--only: no run labelled nope", "--only", "nope")

    def test_build_dir_without_launcher(self):
        os.remove(os.path.join(self.build, "server", "downpour-launch"))
        self.assert_usage_error(EXPERIMENT, "downpour-launch is missing")

    def test_malformed_set(self):
        self.assert_usage_error(EXPERIMENT, "--set steps=5: expected section.key=value", "--set", "steps=5")

    @unittest.skipUnless(REAL_WORKER and os.access(REAL_WORKER, os.X_OK), "needs a build (DOWNPOUR_BUILD_DIR)")
    def test_bad_set_value_is_refused_before_any_run_by_the_config_loader(self):
        os.symlink(REAL_WORKER, os.path.join(self.build, "client", "worker", "real-worker"))
        os.replace(os.path.join(self.build, "client", "worker", "real-worker"),
                   os.path.join(self.build, "client", "worker", "downpour-worker"))
        r = self.experiment(self.write_experiment(), "--set", "worker.steps=0")
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("run sync-w2: ", r.stderr)
        self.assertIn("--set worker.steps=0: worker.steps = 0: must be >= 1", r.stderr)
        self.assertFalse(os.path.exists(os.path.join(self.out, "tiny", "sync-w2")), "a run was started")


if __name__ == "__main__":
    unittest.main()
