#!/usr/bin/env python3
"""downpour-summarize's step-time breakdown: per-worker medians of the worker's step records
(step, compute, pull wait, push wait, loader, comm, wire bytes sent and received), the first step of
each segment left out, the overlap ratio step / max(compute, comm), in its output and in
summary.json; runs whose records predate the breakdown get "—"."""
import json
import os
import sys
import tempfile
import unittest

import fabricate as fab


def with_breakdown(records, rows):
    """Puts the breakdown fields of rows[k] into the k-th step record."""
    steps = [r for r in records if r["event"] == "step"]
    for r, row in zip(steps, rows):
        r.update(row)
    return records


class Breakdown(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory(prefix="downpour-tools-")
        self.run_dir = os.path.join(self._tmp.name, "run")
        fab.write_config(self.run_dir)
        # Worker 0: a cold first step (left out), then steps where compute (100 ms) hides comm.
        first = dict(step_ms=900.0, compute_ms=300.0, pull_wait_ms=500.0, push_wait_ms=50.0, loader_wait_ms=40.0,
                     comm_ms=550.0)
        first.update(tx_bytes=999, rx_bytes=999)
        rows0 = [first] + [dict(step_ms=110.0 + k, compute_ms=100.0, pull_wait_ms=3.0, push_wait_ms=5.0,
                                loader_wait_ms=1.0, comm_ms=60.0, tx_bytes=2_000_000 + k, rx_bytes=8_000_000)
                           for k in range(5)]
        fab.append_jsonl(self.run_dir, "worker-0", with_breakdown(fab.worker_segment(0, 1000.0, 0, 6), rows0))
        # Worker 1: records without the breakdown (a run from before it).
        fab.append_jsonl(self.run_dir, "worker-1", fab.worker_segment(1, 1000.0, 0, 6))
        r = fab.run_tool("downpour-summarize", self.run_dir)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.stdout = r.stdout
        with open(os.path.join(self.run_dir, "summary.json")) as f:
            self.s = json.load(f)

    def tearDown(self):
        self._tmp.cleanup()

    def test_medians_leave_out_the_first_step(self):
        row = next(b for b in self.s["step_breakdown"] if b["worker"] == 0)
        self.assertEqual(row["steps"], 5)
        self.assertEqual(row["step_ms"], 112.0)
        self.assertEqual(row["compute_ms"], 100.0)
        self.assertEqual(row["pull_wait_ms"], 3.0)
        self.assertEqual(row["comm_ms"], 60.0)
        self.assertAlmostEqual(row["overlap_ratio"], 1.12)
        self.assertEqual(row["tx_bytes"], 2_000_002)
        self.assertEqual(row["rx_bytes"], 8_000_000)

    def test_images_per_s_sums_batch_over_each_workers_median_step(self):
        """The job's steady images/s (scaling_validate.py, bench/gpu/device_compression.sh): worker 0's
        median step of 112 ms at batch 64; worker 1 has no breakdown and adds nothing."""
        sys.path.insert(0, fab.TOOLS)
        import downpour_report as report
        rows = self.s["step_breakdown"]
        self.assertAlmostEqual(report.images_per_s_from_steps(rows, 64), 64 * 1000.0 / 112.0)

    def test_line_per_worker(self):
        self.assertIn("worker 0: step = 112.0 ms; compute 100.0, pull wait 3.0, push wait 5.0, loader 1.0; "
                      "comm 60.0; overlap ratio step / max(compute, comm) = 1.12", self.stdout)
        self.assertIn("(medians of 5 steps); wire per step: tx 2.000 MB, rx 8.000 MB", self.stdout)
        self.assertIn("worker 1: step = — ms; compute —", self.stdout)
        self.assertIn("wire per step: tx — MB, rx — MB", self.stdout)
        row = next(b for b in self.s["step_breakdown"] if b["worker"] == 1)
        self.assertIsNone(row["overlap_ratio"])


if __name__ == "__main__":
    unittest.main()


class Phase(unittest.TestCase):
    """How far apart two workers' steps end (bench/scaling/reply_order.py, bench/gpu/
    device_compression.sh): 0 in lockstep, 0.5 half a step apart, over worker 0's median step."""

    def workers(self, offset_s, step_s=1.0):
        tmp = tempfile.TemporaryDirectory(prefix="downpour-tools-")
        self.addCleanup(tmp.cleanup)
        run_dir = os.path.join(tmp.name, "run")
        fab.write_config(run_dir)
        rows = [dict(step_ms=step_s * 1e3)] * 8
        fab.append_jsonl(run_dir, "worker-0", with_breakdown(fab.worker_segment(0, 1000.0, 0, 8, step_s=step_s), rows))
        fab.append_jsonl(run_dir, "worker-1",
                         with_breakdown(fab.worker_segment(1, 1000.0 + offset_s, 0, 8, step_s=step_s), rows))
        sys.path.insert(0, fab.TOOLS)
        import downpour_report as report
        import downpour_runs as dr
        _, files = dr.load_run([run_dir])
        workers = dr.worker_files(files)
        return report, workers, report.step_breakdown(workers)

    def test_lockstep_is_zero_and_half_a_step_is_half(self):
        report, workers, rows = self.workers(0.0)
        self.assertEqual(report.workers_phase(workers, rows), 0.0)
        report, workers, rows = self.workers(0.5)
        self.assertAlmostEqual(report.workers_phase(workers, rows), 0.5)
        report, workers, rows = self.workers(0.8, step_s=2.0)  # nearest end: 0.8 s of a 2 s step
        self.assertAlmostEqual(report.workers_phase(workers, rows), 0.4)

    def test_first_step_of_a_segment_is_left_out_and_no_steps_is_none(self):
        report, workers, _ = self.workers(0.25)
        w0 = next(w for w in workers if w.id == 0)
        self.assertEqual(report.step_ends(w0), [1000.0 + k for k in range(2, 9)])
        self.assertIsNone(report.phase([], [1.0], 1.0))
        self.assertIsNone(report.phase([1.0], [1.0], None))

    def test_only_ends_while_the_other_worker_steps_count(self):
        """Worker b steps only from 3.5 to 7.5 s, half a step out of phase with a: counting a's
        eight ends outside that span too would have made the median 1.0 steps, not 0.5."""
        sys.path.insert(0, fab.TOOLS)
        import downpour_report as report
        a = [float(k) for k in range(12)]
        b = [k + 0.5 for k in range(3, 8)]
        self.assertAlmostEqual(report.phase(a, b, 1.0), 0.5)
        self.assertIsNone(report.phase([0.0, 1.0], [5.0, 6.0], 1.0), "never stepping at once: no phase")

