#!/usr/bin/env python3
"""Runs written by a cluster launch: in one shared directory (launch-<task>.jsonl instead of
launch.jsonl) and in parts, one per host, given as RUN_DIR+RUN_DIR2 to downpour-summarize and
downpour-compare. A run in parts summarizes exactly as the same run in one directory; parts of
different runs (configs that differ, two different files of one name) are refused naming both
files; a missing task is a warning naming its files; the launchers' records give the launch wall
time and the failed tasks."""
import json
import os
import shutil
import unittest

import fabricate as fab

PLACE_ONLY = ("run_dir", "parts")  # the summary fields that say where the run lies, not what it did


def summarize(spec, *extra):
    r = fab.run_tool("downpour-summarize", *extra, spec)
    if r.returncode != 0:
        raise AssertionError(f"downpour-summarize exited {r.returncode}: {r.stderr}")
    first = spec if os.path.isdir(spec) else spec.split("+")[0]
    with open(os.path.join(first, "summary.json")) as f:
        return json.load(f), r


def without_place(s):
    return {k: v for k, v in s.items() if k not in PLACE_ONLY}


class TempDirTest(fab.TempDirTest):
    def path(self, *names):
        return os.path.join(self.tmp, *names)


class ClusterRunInOneDirectory(TempDirTest):
    """A shared filesystem: every task wrote into the same directory."""

    def setUp(self):
        super().setUp()
        self.run_dir = self.path("shared", "run")
        fab.cluster_run([self.run_dir])
        self.s, self.r = summarize(self.run_dir)

    def test_no_warning_for_a_complete_run(self):
        self.assertEqual(self.r.stderr, "")
        self.assertEqual(self.s["missing"], [])

    def test_launch_records_of_every_task(self):
        self.assertEqual(self.s["launch_tasks"], 5)
        # First task's start (t0 − 3) to the last task's end (t0 + 100.5 + 1.4).
        self.assertAlmostEqual(self.s["launch_wall_s"], 104.9)
        self.assertEqual(self.s["launch_failed"], [])

    def test_training_summary_as_for_a_local_run(self):
        self.assertEqual(self.s["steps"], 200)
        self.assertEqual(self.s["workers_done"], 2)
        self.assertAlmostEqual(self.s["wall_s"], 100.5)
        self.assertAlmostEqual(self.s["final_top1"], fab.top1_at(100))
        self.assertEqual(self.s["staleness_histogram"], [300, 150, 100, 50])
        self.assertEqual(self.s["parts"], [os.path.abspath(self.run_dir)])


class ClusterRunInParts(TempDirTest):
    """The same job with no shared filesystem: each of three hosts holds its own part."""

    def setUp(self):
        super().setUp()
        self.one, _ = summarize(self.one_directory_run())
        self.parts = [self.path(f"host-{h}", "run") for h in "abc"]
        self.placed = fab.cluster_run(self.parts)
        self.spec = "+".join(self.parts)

    def one_directory_run(self):
        run_dir = self.path("shared", "run")
        fab.cluster_run([run_dir])
        return run_dir

    def test_tasks_are_spread_over_the_parts(self):
        for part in self.parts:
            self.assertLess(len(os.listdir(os.path.join(part, "metrics"))), 5)
        self.assertEqual(self.placed["worker-0"], self.parts[0])
        self.assertEqual(self.placed["worker-1"], self.parts[1])

    def test_same_summary_as_the_run_in_one_directory(self):
        s, r = summarize(self.spec)
        self.assertEqual(r.stderr, "")
        self.assertEqual(without_place(s), without_place(self.one))
        self.assertEqual(s["launch_tasks"], 5)

    def test_parts_in_any_order_give_the_same_summary(self):
        s, _ = summarize("+".join(reversed(self.parts)))
        self.assertEqual(without_place(s), without_place(self.one))

    def test_summary_is_written_to_the_first_part_only(self):
        s, r = summarize(self.spec)
        self.assertEqual(s["run_dir"], os.path.abspath(self.parts[0]))
        self.assertEqual(s["parts"], [os.path.abspath(p) for p in self.parts])
        self.assertFalse(os.path.exists(os.path.join(self.parts[1], "summary.json")))
        self.assertTrue(r.stdout.startswith(f"{self.spec}: async W=2 S=2: final top-1 "), r.stdout)
        self.assertIn(f"summary {os.path.join(self.parts[0], 'summary.json')}", r.stdout)

    def test_a_file_reached_twice_counts_once(self):
        """A shared filesystem named twice, or a part copied into another: byte-identical files."""
        shutil.copy(os.path.join(self.placed["worker-1"], "metrics", "worker-1.jsonl"),
                    os.path.join(self.placed["worker-0"], "metrics"))
        shutil.copy(os.path.join(self.placed["worker-1"], "launch-worker-1.jsonl"), self.placed["worker-0"])
        s, r = summarize(self.spec)
        self.assertEqual(r.stderr, "")
        self.assertEqual(without_place(s), without_place(self.one))
        s, _ = summarize(f"{self.spec}+{self.parts[0]}")
        self.assertEqual(without_place(s), without_place(self.one))

    def test_compare_takes_a_run_in_parts_with_or_without_a_label(self):
        out = self.path("out")
        r = fab.run_tool("downpour-compare", "-o", out, f"split={self.spec}", self.spec,
                         self.path("shared", "run"))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stderr, "")
        with open(os.path.join(out, "summaries.json")) as f:
            summaries = json.load(f)
        self.assertEqual(list(summaries), ["split", "async W=2", "async W=2 #2"])
        self.assertEqual(without_place(summaries["split"]), without_place(summaries["async W=2 #2"]))
        self.assertEqual(summaries["split"]["parts"], [os.path.abspath(p) for p in self.parts])


class PartsOfDifferentRuns(TempDirTest):
    def setUp(self):
        super().setUp()
        self.parts = [self.path("host-a", "run"), self.path("host-b", "run")]
        self.placed = fab.cluster_run(self.parts)
        self.spec = "+".join(self.parts)

    def assert_usage_error(self, tool_args, *fragments):
        r = fab.run_tool(*tool_args)
        self.assertEqual(r.returncode, 2, r.stderr)
        for fragment in fragments:
            self.assertIn(fragment, r.stderr)
        self.assertEqual(r.stderr.count("\n"), 1, r.stderr)
        for part in self.parts:
            self.assertFalse(os.path.exists(os.path.join(part, "summary.json")))

    def test_configs_that_differ_name_both_files_and_the_key(self):
        fab.write_config(self.parts[1], workers=4)
        self.assert_usage_error(("downpour-summarize", self.spec), os.path.join(self.parts[0], "config.toml"),
                                os.path.join(self.parts[1], "config.toml"),
                                "cluster.workers is 2 in the first, 4 in the second", "not parts of one run")

    def test_a_key_in_one_config_only_is_named(self):
        with open(os.path.join(self.parts[1], "config.toml"), "a") as f:
            f.write("seed = 7\n")
        self.assert_usage_error(("downpour-summarize", self.spec), "worker.seed is set only in the second")

    def test_configs_that_differ_only_in_layout_are_the_same(self):
        with open(os.path.join(self.parts[1], "config.toml"), "a") as f:
            f.write("\n# a comment\n")
        s, _ = summarize(self.spec)
        self.assertEqual(s["steps"], 200)

    def test_two_different_metrics_files_of_one_name_are_refused_naming_both(self):
        self.assertEqual(self.placed["worker-1"], self.parts[0])
        fab.append_jsonl(self.parts[1], "worker-1", fab.worker_segment(1, 5000.0, 0, 10))  # a second worker 1
        first, second = (os.path.join(part, "metrics", "worker-1.jsonl") for part in self.parts)
        self.assert_usage_error(("downpour-summarize", self.spec), f"{first} and {second}",
                                "two different files named metrics/worker-1.jsonl")

    def test_two_different_launch_files_of_one_name_are_refused(self):
        fab.append_launch(self.parts[1], "launch-worker-1", fab.launch_records(1.0, 2.0, "worker 1"))
        self.assert_usage_error(("downpour-compare", "-o", self.path("out"), self.spec),
                                "two different files named launch-worker-1.jsonl")


class MissingTasks(TempDirTest):
    def test_a_part_not_given_is_a_warning_naming_its_files(self):
        parts = [self.path("host-a", "run"), self.path("host-b", "run")]
        placed = fab.cluster_run(parts)
        self.assertEqual([task for task, d in placed.items() if d == parts[1]], ["server-0", "worker-0"])
        s, r = summarize(parts[0])
        self.assertEqual(s["missing"], ["launch-server-0.jsonl", "metrics/server-0.jsonl", "launch-worker-0.jsonl",
                                        "metrics/worker-0.jsonl"])
        self.assertEqual(r.stderr, f"downpour-summarize: warning: {parts[0]}: no launch-server-0.jsonl, "
                                   "metrics/server-0.jsonl, launch-worker-0.jsonl, metrics/worker-0.jsonl: a task "
                                   "that never started, or a part of the run directory not given (name every "
                                   "host's copy: RUN_DIR+RUN_DIR2...)\n")
        self.assertEqual(s["workers_done"], 1)

    def test_quiet_still_warns(self):
        run_dir = self.path("run")
        fab.cluster_run([run_dir], omit=("coordinator",))
        _, r = summarize(run_dir, "-q")
        self.assertEqual(r.stdout, "")
        self.assertIn("warning: ", r.stderr)
        self.assertIn("no launch-coordinator.jsonl, metrics/coordinator.jsonl: ", r.stderr)

    def test_compare_warns_too(self):
        run_dir = self.path("run")
        fab.cluster_run([run_dir], omit=("server-1",))
        r = fab.run_tool("downpour-compare", "-o", self.path("out"), "-q", f"x={run_dir}")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stderr.count("downpour-compare: warning: "), 1, r.stderr)
        self.assertIn("launch-server-1.jsonl, metrics/server-1.jsonl", r.stderr)

    def test_local_run_in_one_directory_is_not_checked(self):
        """A local launch has one launch.jsonl and no per-task files; fabricated local runs also
        lack the coordinator's metrics."""
        run_dir = fab.simple_run(self.path("run"))
        fab.append_launch(run_dir, "launch", fab.launch_records(997.0, 1102.0, "worker 1"))
        s, r = summarize(run_dir)
        self.assertEqual((s["missing"], r.stderr), ([], ""))

    def test_local_run_in_parts_checks_metrics_only(self):
        parts = [fab.simple_run(self.path("a", "run")), self.path("b", "run")]
        fab.write_config(parts[1])
        fab.append_launch(parts[0], "launch", fab.launch_records(997.0, 1102.0, "worker 1"))
        s, _ = summarize("+".join(parts))
        self.assertEqual(s["missing"], ["metrics/coordinator.jsonl"])


class LaunchRecords(TempDirTest):
    def test_local_launch_jsonl_is_one_task(self):
        run_dir = fab.simple_run(self.path("run"))
        fab.append_launch(run_dir, "launch", fab.launch_records(997.0, 1102.0, "worker 1"))
        s, _ = summarize(run_dir)
        self.assertEqual((s["launch_tasks"], s["launch_failed"]), (1, []))
        self.assertAlmostEqual(s["launch_wall_s"], 105.0)

    def test_resumed_launch_adds_the_segments_without_the_gap(self):
        run_dir = fab.simple_run(self.path("run"))
        fab.append_launch(run_dir, "launch", fab.launch_records(997.0, 1050.0, "worker 0", code=1))
        fab.append_launch(run_dir, "launch", fab.launch_records(2000.0, 2060.0, "worker 0", resumed=True))
        s, _ = summarize(run_dir)
        self.assertAlmostEqual(s["launch_wall_s"], 53.0 + 60.0)
        self.assertEqual(s["launch_failed"], [])  # the last segment ended well

    def test_run_without_launch_records(self):
        s, _ = summarize(fab.simple_run(self.path("run")))
        self.assertEqual((s["launch_tasks"], s["launch_wall_s"], s["launch_failed"]), (0, None, []))

    def test_failed_and_unfinished_tasks_are_listed_and_printed(self):
        parts = [self.path("host-a", "run"), self.path("host-b", "run")]
        placed = fab.cluster_run(parts, codes={"worker-1": 3})
        with open(os.path.join(placed["server-1"], "launch-server-1.jsonl")) as f:
            lines = f.readlines()
        with open(os.path.join(placed["server-1"], "launch-server-1.jsonl"), "w") as f:
            f.writelines(lines[:1])  # killed: a start and nothing after it
        open(os.path.join(placed["server-0"], "launch-server-0.jsonl"), "w").close()  # failed before its start
        s, r = summarize("+".join(parts))
        self.assertEqual(s["launch_tasks"], 5)
        self.assertEqual(s["launch_failed"], [
            {"task": "server-0", "code": None, "reason": "no records: the launcher stopped before its start"},
            {"task": "server-1", "code": None, "reason": "no end record: still running, or killed"},
            {"task": "worker-1", "code": 3, "reason": "worker 1 exited 3"}])
        self.assertIn("; task server-0 FAILED (no end); task server-1 FAILED (no end); task worker-1 FAILED (3); "
                      "summary ", r.stdout)


class Syntax(TempDirTest):
    def test_a_directory_whose_name_holds_a_plus_is_one_run(self):
        run_dir = fab.simple_run(self.path("a+b"))
        s, _ = summarize(run_dir)
        self.assertEqual(s["parts"], [os.path.abspath(run_dir)])

    def test_an_empty_part_is_a_usage_error(self):
        run_dir = fab.simple_run(self.path("run"))
        r = fab.run_tool("downpour-summarize", run_dir + "+")
        self.assertEqual(r.returncode, 2)
        self.assertIn("an empty part; expected RUN_DIR or RUN_DIR+RUN_DIR2+...", r.stderr)

    def test_a_part_that_does_not_exist_is_named(self):
        run_dir = fab.simple_run(self.path("run"))
        r = fab.run_tool("downpour-summarize", f"{run_dir}+{self.path('nope')}")
        self.assertEqual(r.returncode, 2)
        self.assertEqual(r.stderr, f"downpour-summarize: {self.path('nope')}: no such directory\n")

    def test_a_part_that_is_not_a_run_directory_is_named(self):
        run_dir = fab.simple_run(self.path("run"))
        r = fab.run_tool("downpour-compare", "-o", self.path("out"), f"L={run_dir}+{self.tmp}")
        self.assertEqual(r.returncode, 2)
        self.assertEqual(r.stderr, f"downpour-compare: {self.tmp}: no config.toml (not a run directory)\n")

    def test_help_shows_the_syntax(self):
        for tool in ("downpour-summarize", "downpour-compare"):
            with self.subTest(tool=tool):
                r = fab.run_tool(tool, "--help")
                self.assertEqual(r.returncode, 0)
                self.assertIn("RUN_DIR+RUN_DIR2", r.stdout)


if __name__ == "__main__":
    unittest.main()
