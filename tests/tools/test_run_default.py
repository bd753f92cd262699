#!/usr/bin/env python3
"""scripts/run_default as users run it, `scripts/run_default > log 2>&1`, with a tiny config: the
log keeps every line (get_fashion_mnist's, the launcher's, the final accuracy and the report's
path) and holds no NUL bytes (it once reopened its own stdout with O_TRUNC). QUIET=1 silences
the launcher; a failing launcher's exit code is passed on.

Heavy: a real 2-server × 2-worker job. Needs the binaries of a build: DOWNPOUR_BUILD_DIR (ctest
sets it). Makes data-sets/fashion-mnist under the repository root the first time (~10 s)."""
import os
import stat
import subprocess
import sys
import tempfile
import textwrap
import unittest

import fabricate as fab

BUILD_DIR = os.environ.get("DOWNPOUR_BUILD_DIR")
RUN_DEFAULT = os.path.join(fab.ROOT, "scripts", "run_default")


def tiny_config(path, steps=30):
    """Paths inside are relative to the repository root, where run_default runs."""
    base_port, coordinator_port = fab.free_port_pair()
    with open(path, "w") as f:
        f.write(f"""# run_default test: the default job, shortened.
[run]
name = "run-default-test"
seed = 1
[model]
config = "configs/models/fmnist_small.toml"
[cluster]
servers = 2
workers = 2
coordinator = "127.0.0.1:{coordinator_port}"
base_port = {base_port}
bind = "127.0.0.1"
[consistency]
mode = "async"
[worker]
batch_size = 64
steps = {steps}
threads = 1
[data]
train = "data-sets/fashion-mnist/train_lmdb"
test = "data-sets/fashion-mnist/test_lmdb"
scale = 0.00390625
[eval]
every_steps = 1000
test_batches = 5
[checkpoint]
every_updates = 0
""")


@unittest.skipUnless(BUILD_DIR, "DOWNPOUR_BUILD_DIR is not set (ctest sets it to the build tree)")
class RunDefaultLog(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        # The data first (a no-op once made), so the stand-in launchers below need no converter.
        subprocess.run([os.path.join(fab.ROOT, "scripts", "get_fashion_mnist")], check=True, timeout=300,
                       env=dict(os.environ, DOWNPOUR_DATA_BIN=os.path.join(BUILD_DIR, "data", "downpour-data")))

    def setUp(self):
        launcher = os.path.join(BUILD_DIR, "server", "downpour-launch")
        self.assertTrue(os.access(launcher, os.X_OK), f"{launcher} is missing: build the project first")
        self._tmp = tempfile.TemporaryDirectory(prefix="downpour-run-default-")
        self.tmp = self._tmp.name
        self.config = os.path.join(self.tmp, "tiny.toml")
        tiny_config(self.config)

    def tearDown(self):
        self._tmp.cleanup()

    def run_default(self, log_name, *args, build_dir=BUILD_DIR, **env):
        """Runs scripts/run_default with stdout and stderr to one file; (exit code, log bytes, run dir)."""
        run_dir = os.path.join(self.tmp, log_name + "-run")
        log = os.path.join(self.tmp, log_name + ".log")
        full_env = dict(os.environ, SKIP_BOOTSTRAP="1", BUILD_DIR=os.path.abspath(build_dir), CONFIG=self.config,
                        RUN_DIR=run_dir, **env)
        with open(log, "wb") as f:
            rc = subprocess.run([RUN_DEFAULT, *args], stdout=f, stderr=subprocess.STDOUT, env=full_env,
                                timeout=480).returncode
        with open(log, "rb") as f:
            return rc, f.read(), run_dir

    def test_log_keeps_every_line(self):
        rc, data, run_dir = self.run_default("plain")
        text = data.decode("utf-8", errors="replace")
        self.assertEqual(rc, 0, text)
        self.assertNotIn(b"\0", data)
        self.assertRegex(text, r"(?m)^get_fashion_mnist: ")
        self.assertRegex(text, r"(?m)^\[launch\] done after ")
        self.assertRegex(text, r"(?m)^final test accuracy: \d+\.\d\d%  \(async, 2 workers, 2 servers, ")
        report = os.path.realpath(os.path.join(run_dir, "plots", "report.html"))
        self.assertIn(f"report: {report}\n", text)
        self.assertTrue(os.path.getsize(report) > 0)
        self.assertTrue(os.path.exists(os.path.join(run_dir, "summary.json")))

    def test_quiet_silences_the_launcher(self):
        rc, data, _ = self.run_default("quiet", QUIET="1")
        text = data.decode("utf-8", errors="replace")
        self.assertEqual(rc, 0, text)
        self.assertNotIn(b"\0", data)
        self.assertNotIn("[launch]", text)
        self.assertRegex(text, r"(?m)^get_fashion_mnist: ")
        self.assertRegex(text, r"(?m)^final test accuracy: ")

    def test_launcher_failure_exit_code_is_passed_on(self):
        # An unknown launcher option: CLI11 rejects it before anything starts.
        rc, data, run_dir = self.run_default("fail", "--no-such-launch-option")
        text = data.decode("utf-8", errors="replace")
        self.assertNotEqual(rc, 0, text)
        self.assertIn(f"run_default: downpour-launch exited {rc}; logs in {run_dir}/logs", text)
        self.assertNotIn("final test accuracy", text)


    def stand_in_launcher(self, body):
        """A build dir whose server/downpour-launch is a Python script: args = {"--run-dir": ...}."""
        build = os.path.join(self.tmp, "stand-in-build")
        os.makedirs(os.path.join(build, "server"), exist_ok=True)
        path = os.path.join(build, "server", "downpour-launch")
        with open(path, "w") as f:
            f.write(f"#!{sys.executable}\nimport os, sys\nsys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})\n"
                    "import fabricate as fab\nargs = dict(zip(sys.argv[1::2], sys.argv[2::2]))\n" + textwrap.dedent(body))
        os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)
        return build

    def test_launcher_exit_code_7_is_passed_on(self):
        build = self.stand_in_launcher("print('[launch] FAILED'); sys.exit(7)\n")
        rc, data, _ = self.run_default("seven", build_dir=build)
        self.assertEqual(rc, 7, data.decode())
        self.assertIn(b"[launch] FAILED", data)

    def test_run_without_final_accuracy_exits_1_with_a_clear_line(self):
        build = self.stand_in_launcher("""\
            run_dir = args["--run-dir"]
            fab.write_config(run_dir)
            for wid in range(2):  # trained, but no evaluation ever ran
                fab.append_jsonl(run_dir, f"worker-{wid}", fab.worker_segment(wid, 1000.0, 0, 20))
            """)
        rc, data, run_dir = self.run_default("nofinal", build_dir=build)
        text = data.decode()
        self.assertEqual(rc, 1, text)
        self.assertIn(f"run_default: the run finished without a final test accuracy (final_top1 is null in "
                      f"{run_dir}/summary.json)", text)
        self.assertNotIn("Traceback", text)


if __name__ == "__main__":
    unittest.main()
