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
    run_dir = args["--run-dir"]
    fab.simple_run(run_dir, steps=120)
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
