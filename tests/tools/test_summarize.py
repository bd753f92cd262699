#!/usr/bin/env python3
"""downpour-summarize on fabricated run directories: a finished run, old runs without eval
wall_s, resumed runs (async resumed once, a finished run resumed, sync resumed at a lower step),
and its exit codes."""
import json
import os
import unittest

import fabricate as fab


def summarize(run_dir):
    r = fab.run_tool("downpour-summarize", run_dir)
    if r.returncode != 0:
        raise AssertionError(f"downpour-summarize exited {r.returncode}: {r.stderr}")
    with open(os.path.join(run_dir, "summary.json")) as f:
        return json.load(f), r.stdout


TempDirTest = fab.TempDirTest


class AlgorithmIsNamed(TempDirTest):
    """The summary and the one-line report name the update rule (docs/algorithms.md)."""

    def run_with(self, mode, extra):
        run_dir = os.path.join(self.tmp, f"run-{len(os.listdir(self.tmp))}")
        fab.write_config(run_dir, mode=mode, consistency_extra=extra)
        fab.append_jsonl(run_dir, "worker-0", fab.worker_segment(0, 1000.0, 0, 200, eval_every=20, final=True))
        return summarize(run_dir)

    def test_plain_dc_asgd_backups_and_staleness_aware(self):
        s, out = self.run_with("async", "")
        self.assertEqual(s["algorithm"], "sgd")
        self.assertNotIn("[", out)
        s, out = self.run_with("async", 'algorithm = "dc-asgd"\ndc_lambda = 0.1\n')
        self.assertEqual(s["algorithm"], "dc-asgd (lambda 0.1)")
        self.assertIn("async [dc-asgd (lambda 0.1)] W=2", out)
        s, _ = self.run_with("sync", "backup_workers = 1\n")
        self.assertEqual(s["algorithm"], "sgd, 1 backup")
        s, _ = self.run_with("ssp:2", "staleness_aware_lr = true\n")
        self.assertEqual(s["algorithm"], "sgd, lr/staleness")
        s, _ = self.run_with("async", 'algorithm = "easgd"\neasgd_tau = 8\n')
        self.assertEqual(s["algorithm"], "easgd (tau 8)")
        s, _ = self.run_with("async", 'algorithm = "local-sgd"\nlocal_steps = 16\n')
        self.assertEqual(s["algorithm"], "local-sgd (H 16)")
        s, out = self.run_with("async", '\n[solver]\nupdate = "adagrad"\n')
        self.assertEqual(s["algorithm"], "adagrad")
        self.assertIn("async [adagrad] W=2", out)
        s, _ = self.run_with("async", '\n[solver]\nupdate = "momentum"\n')
        self.assertEqual(s["algorithm"], "sgd")


class NeverResumedRun(TempDirTest):
    def setUp(self):
        super().setUp()
        self.run_dir = os.path.join(self.tmp, "run")
        fab.write_config(self.run_dir)
        complete = [(0, 300, 300, 3, [100, 100, 50, 50]), (1, 300, 150, 2, [200, 50, 50])]
        partial = [(0, 100, 50, 1, [50, 50]), (1, 100, 20, 1, [80, 20])]  # asked earlier: fewer updates
        for wid, stats in ((0, complete), (1, partial)):
            fab.append_jsonl(self.run_dir, f"worker-{wid}",
                             fab.worker_segment(wid, 1000.0 + 0.5 * wid, 0, 200, eval_every=20, final=True, stats=stats))
        for sid in range(2):
            fab.append_jsonl(self.run_dir, f"server-{sid}", fab.server_records(sid, 1000.0, [(0, 0.0), (2, 4.0)]))
        self.s, self.stdout = summarize(self.run_dir)

    def test_one_segment_not_resumed(self):
        self.assertEqual(self.s["segments"], 1)
        self.assertIs(self.s["resumed"], False)

    def test_wall_time_from_first_start_to_last_done(self):
        self.assertAlmostEqual(self.s["wall_s"], 200.5)

    def test_totals_and_throughput_from_done_records(self):
        self.assertEqual(self.s["steps"], 400)
        self.assertEqual(self.s["images"], 400 * fab.BATCH)
        self.assertEqual(self.s["workers_done"], 2)
        # Each worker: 200 × 64 images in 200 s of training.
        self.assertAlmostEqual(self.s["images_per_s"], 2 * 64.0)

    def test_final_and_time_to_target_from_evals(self):
        self.assertAlmostEqual(self.s["final_top1"], fab.top1_at(200))
        self.assertAlmostEqual(self.s["final_test_loss"], fab.loss_at(200))
        self.assertEqual([e["step"] for e in self.s["evals"]], list(range(20, 201, 20)))
        # 0.89 is first reached at the step-160 evaluation, 160 s into training.
        self.assertAlmostEqual(self.s["time_to_target_s"], 160.0)
        self.assertAlmostEqual(self.s["epochs_to_target"], 160 * fab.BATCH / fab.SHARD)

    def test_staleness_from_the_most_complete_server_stats(self):
        self.assertEqual(self.s["staleness_histogram"], [300, 150, 100, 50])
        self.assertAlmostEqual(self.s["staleness_mean"], 450 / 600)
        self.assertEqual(self.s["staleness_max"], 3)

    def test_pull_log_aggregates(self):
        self.assertEqual(self.s["pulls_logged"], 4)
        self.assertEqual(self.s["clock_ahead_max"], 2)
        self.assertAlmostEqual(self.s["pull_wait_ms_mean"], 2.0)

    def test_training_loss_curve_is_downsampled_and_ordered(self):
        curve = self.s["train_loss"]
        self.assertGreater(len(curve), 100)
        self.assertLessEqual(len(curve), 300)
        times = [p["wall_s"] for p in curve]
        self.assertEqual(times, sorted(times))
        self.assertAlmostEqual(curve[0]["loss_ema"], fab.loss_at(1), places=3)
        self.assertAlmostEqual(curve[-1]["loss_ema"], fab.loss_at(200), places=3)
        self.assertAlmostEqual(curve[-1]["epoch"], 200 * fab.BATCH / fab.SHARD, places=3)

    def test_prints_one_line_naming_the_summary(self):
        self.assertIn("final top-1 ", self.stdout)
        self.assertIn(os.path.join(self.run_dir, "summary.json"), self.stdout)


class OldRunWithoutEvalWallTime(TempDirTest):
    def test_eval_time_falls_back_to_t_minus_first_worker_start(self):
        run_dir = os.path.join(self.tmp, "old")
        fab.write_config(run_dir)
        # Worker 1 starts first (t=1000); worker 0, the evaluator, 3 s later.
        fab.append_jsonl(run_dir, "worker-0", fab.worker_segment(0, 1003.0, 0, 40, eval_every=20, final=True,
                                                                  eval_wall=False))
        fab.append_jsonl(run_dir, "worker-1", fab.worker_segment(1, 1000.0, 0, 40))
        s, _ = summarize(run_dir)
        self.assertEqual([e["wall_s"] for e in s["evals"]], [23.0, 43.0])


class AsyncRunResumedOnce(TempDirTest):
    """Segment 1: steps 1..100, then the job dies (no done). 1000 s later it is resumed after
    step 100 and runs to step 200."""

    def setUp(self):
        super().setUp()
        self.run_dir = os.path.join(self.tmp, "resumed")
        fab.write_config(self.run_dir)
        for wid in range(2):
            fab.append_jsonl(self.run_dir, f"worker-{wid}",
                             fab.worker_segment(wid, 1000.0 + 0.5 * wid, 0, 100, eval_every=20, done=False))
        t_resume = 1100.5 + 1000.0  # a 1000 s gap after the last record of segment 1
        for wid in range(2):
            fab.append_jsonl(self.run_dir, f"worker-{wid}",
                             fab.worker_segment(wid, t_resume + 0.5 * wid, 100, 200, wall0=100.0, resumed=True,
                                                eval_every=20, final=True))
        self.s, self.stdout = summarize(self.run_dir)

    def test_two_segments(self):
        self.assertEqual(self.s["segments"], 2)
        self.assertIs(self.s["resumed"], True)
        self.assertIn("2 segments", self.stdout)

    def test_wall_time_excludes_the_gap(self):
        self.assertAlmostEqual(self.s["wall_s"], 100.5 + 100.5)

    def test_steps_not_double_counted(self):
        self.assertEqual(self.s["steps"], 400)
        self.assertEqual(self.s["images"], 400 * fab.BATCH)
        self.assertAlmostEqual(self.s["images_per_s"], 2 * 64.0)

    def test_eval_curve_continues_across_the_resume(self):
        evals = self.s["evals"]
        self.assertEqual([e["step"] for e in evals], [20, 40, 60, 80, 120, 140, 160, 180, 200])
        self.assertEqual([e["wall_s"] for e in evals], [20, 40, 60, 80, 120, 140, 160, 180, 200])
        self.assertAlmostEqual(self.s["time_to_target_s"], 160.0)
        self.assertAlmostEqual(self.s["final_top1"], fab.top1_at(200))

    def test_loss_curve_continues_without_the_gap(self):
        times = [p["wall_s"] for p in self.s["train_loss"]]
        self.assertEqual(times, sorted(times))
        self.assertLess(times[0], 2.0)
        self.assertGreater(times[-1], 199.0)
        self.assertLessEqual(times[-1], 200.0)


class FinishedRunResumed(TempDirTest):
    """Both workers finished in segment 1; a resume finds nothing left to do and each worker
    writes a second done record with the same totals. The restarted servers count from zero."""

    def setUp(self):
        super().setUp()
        self.run_dir = os.path.join(self.tmp, "finished")
        fab.write_config(self.run_dir)
        stats1 = [(0, 100, 100, 3, [50, 0, 0, 50])]
        stats2 = [(0, 30, 30, 4, [0, 30])]
        for wid in range(2):
            fab.append_jsonl(self.run_dir, f"worker-{wid}",
                             fab.worker_segment(wid, 1000.0 + 0.5 * wid, 0, 100, eval_every=20, final=True,
                                                stats=stats1))
        for wid in range(2):
            fab.append_jsonl(self.run_dir, f"worker-{wid}",
                             fab.worker_segment(wid, 1600.0 + 0.5 * wid, 100, 100, wall0=100.0, resumed=True,
                                                final=True, stats=stats2))
        self.s, _ = summarize(self.run_dir)

    def test_totals_from_the_last_done_per_worker(self):
        self.assertEqual(self.s["segments"], 2)
        self.assertEqual(self.s["steps"], 200)
        self.assertEqual(self.s["images"], 200 * fab.BATCH)
        self.assertEqual(self.s["workers_done"], 2)
        self.assertAlmostEqual(self.s["images_per_s"], 2 * 64.0)

    def test_wall_time_is_the_two_segments_spans(self):
        self.assertAlmostEqual(self.s["wall_s"], 100.5 + 0.5)

    def test_server_counters_of_both_segments_add_up(self):
        self.assertEqual(self.s["staleness_histogram"], [50, 30, 0, 50])
        self.assertAlmostEqual(self.s["staleness_mean"], 130 / 130)
        self.assertEqual(self.s["staleness_max"], 4)


class SyncRunResumedAtLowerStep(TempDirTest):
    """Segment 1 logged steps 1..130 (evals up to step 120) before dying, but the servers'
    checkpoint was at step 100: segment 2 resumes after step 100, so segment 1's records of steps
    101..130 are superseded. They carry values (loss 9, top-1 0.11) that must not show up."""

    def setUp(self):
        super().setUp()
        self.run_dir = os.path.join(self.tmp, "sync")
        fab.write_config(self.run_dir, mode="sync")
        lost_loss = lambda step: 9.0 if step > 100 else fab.loss_at(step)  # noqa: E731
        lost_top1 = lambda step: 0.11 if step > 100 else fab.top1_at(step)  # noqa: E731
        for wid in range(2):
            fab.append_jsonl(self.run_dir, f"worker-{wid}",
                             fab.worker_segment(wid, 1000.0 + 0.5 * wid, 0, 130, eval_every=20, done=False,
                                                loss=lost_loss, top1=lost_top1))
        for wid in range(2):
            fab.append_jsonl(self.run_dir, f"worker-{wid}",
                             fab.worker_segment(wid, 1430.0 + 0.5 * wid, 100, 200, wall0=100.0, resumed=True,
                                                eval_every=20, final=True))
        self.s, _ = summarize(self.run_dir)

    def test_superseded_evals_dropped(self):
        evals = self.s["evals"]
        self.assertEqual([e["step"] for e in evals], list(range(20, 201, 20)))
        self.assertNotIn(0.11, [e["top1"] for e in evals])
        self.assertAlmostEqual(evals[5]["top1"], fab.top1_at(120))
        times = [e["wall_s"] for e in evals]
        self.assertEqual(times, sorted(times))

    def test_superseded_steps_dropped_from_the_loss_curve(self):
        self.assertLess(max(p["loss_ema"] for p in self.s["train_loss"]), 9.0)

    def test_totals_and_time(self):
        self.assertEqual(self.s["segments"], 2)
        self.assertEqual(self.s["mode"], "sync")
        self.assertEqual(self.s["steps"], 400)
        # Time spent counts, superseded or not: 130.5 s in segment 1, 100.5 s in segment 2.
        self.assertAlmostEqual(self.s["wall_s"], 130.5 + 100.5)
        self.assertAlmostEqual(self.s["time_to_target_s"], 160.0)


class MalformedResume(TempDirTest):
    def test_resumed_start_without_resume_step_names_file_and_field(self):
        run_dir = os.path.join(self.tmp, "bad")
        fab.write_config(run_dir)
        fab.append_jsonl(run_dir, "worker-0", fab.worker_segment(0, 1000.0, 0, 10))
        seg2 = fab.worker_segment(0, 1100.0, 10, 20, wall0=10.0, resumed=True)
        del seg2[0]["resume_step"]
        fab.append_jsonl(run_dir, "worker-0", seg2)
        r = fab.run_tool("downpour-summarize", run_dir)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertRegex(r.stderr, r"^downpour-summarize: .*worker-0\.jsonl:\d+: .*resume_step")


class ExitCodes(TempDirTest):
    def test_directory_without_config_is_a_usage_error(self):
        r = fab.run_tool("downpour-summarize", self.tmp)
        self.assertEqual(r.returncode, 2)
        self.assertEqual(r.stderr, f"downpour-summarize: {self.tmp}: no config.toml (not a run directory)\n")

    def test_missing_directory_is_a_usage_error(self):
        r = fab.run_tool("downpour-summarize", os.path.join(self.tmp, "nope"))
        self.assertEqual(r.returncode, 2)
        self.assertIn("no such directory", r.stderr)

    def test_bad_arguments_exit_2(self):
        self.assertEqual(fab.run_tool("downpour-summarize").returncode, 2)
        self.assertEqual(fab.run_tool("downpour-summarize", "--no-such-option", self.tmp).returncode, 2)

    def test_unreadable_metrics_line_is_a_runtime_failure_naming_file_and_line(self):
        run_dir = fab.simple_run(os.path.join(self.tmp, "run"))
        with open(os.path.join(run_dir, "metrics", "worker-1.jsonl"), "a") as f:
            f.write('{"t": 1, "role": "worker", oops}\n')
        r = fab.run_tool("downpour-summarize", run_dir)
        self.assertEqual(r.returncode, 1)
        self.assertRegex(r.stderr, r"^downpour-summarize: .*worker-1\.jsonl:\d+: not a JSON object")

    def test_a_torn_metrics_line_is_skipped_with_a_warning(self):
        # A worker's write that stopped half-way (a full disk), then its next lines whole: the
        # summary is the same as without the torn line, and stderr says which line was skipped.
        run_dir = fab.simple_run(os.path.join(self.tmp, "run"))
        path = os.path.join(run_dir, "metrics", "worker-1.jsonl")
        self.assertEqual(fab.run_tool("downpour-summarize", "-q", run_dir).returncode, 0)
        with open(os.path.join(run_dir, "summary.json")) as f:
            whole = json.load(f)
        with open(path) as f:
            lines = f.read().splitlines(keepends=True)
        lines.insert(2, lines[1][:17] + "\n")
        with open(path, "w") as f:
            f.writelines(lines)
        r = fab.run_tool("downpour-summarize", "-q", run_dir)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertRegex(r.stderr, r"^downpour-summarize: warning: .*worker-1\.jsonl: skipped 1 torn line\(s\), "
                                   r"the first at line 3 \(a write that stopped half-way\)\n$")
        with open(os.path.join(run_dir, "summary.json")) as f:
            self.assertEqual(json.load(f), whole)

    def test_run_without_metrics_is_a_runtime_failure(self):
        run_dir = os.path.join(self.tmp, "empty")
        fab.write_config(run_dir)
        r = fab.run_tool("downpour-summarize", run_dir)
        self.assertEqual(r.returncode, 1)
        self.assertIn("no metrics/*.jsonl records", r.stderr)

    def test_quiet_prints_nothing(self):
        run_dir = fab.simple_run(os.path.join(self.tmp, "run"))
        r = fab.run_tool("downpour-summarize", "-q", run_dir)
        self.assertEqual((r.returncode, r.stdout, r.stderr), (0, "", ""))
        self.assertTrue(os.path.exists(os.path.join(run_dir, "summary.json")))


if __name__ == "__main__":
    unittest.main()
