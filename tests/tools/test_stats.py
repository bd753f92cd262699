#!/usr/bin/env python3
"""tools/downpour_stats.py against known answers: Student t quantiles from tables, Welch's test
on Wikipedia's worked example, intervals by hand, and a difference that must be called
significant beside one that must not."""
import math
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
import downpour_stats as st  # noqa: E402


class StudentT(unittest.TestCase):
    def test_quantiles_match_the_tables(self):
        # t(0.975, df) from any statistics table.
        for df, t in ((1, 12.706), (2, 4.303), (3, 3.182), (4, 2.776), (10, 2.228), (30, 2.042), (1000, 1.962)):
            self.assertAlmostEqual(st.t_quantile(0.975, df), t, places=3, msg=f"df {df}")
        self.assertAlmostEqual(st.t_quantile(0.025, 5), -st.t_quantile(0.975, 5), places=9)

    def test_cdf_is_symmetric_and_exact_for_one_degree_of_freedom(self):
        for t in (-3.0, -0.5, 0.0, 0.7, 4.0):
            self.assertAlmostEqual(st.t_cdf(t, 1), 0.5 + math.atan(t) / math.pi, places=10)  # Cauchy
            self.assertAlmostEqual(st.t_cdf(t, 7) + st.t_cdf(-t, 7), 1.0, places=12)
        with self.assertRaises(ValueError):
            st.t_quantile(1.0, 3)


class Intervals(unittest.TestCase):
    def test_mean_and_half_width_by_hand(self):
        n, mean, half = st.mean_interval([1, 2, 3, 4, 5])
        self.assertEqual((n, mean), (5, 3.0))
        self.assertAlmostEqual(half, 2.7764 * math.sqrt(2.5) / math.sqrt(5), places=3)
        self.assertEqual(st.mean_interval([7.0]), (1, 7.0, None))
        self.assertEqual(st.mean_interval([]), (0, None, None))

    def test_cells_count_runs_without_a_value(self):
        runs = [{"final_top1": 0.9, "time_to_target_interp_s": 10.0}, {"final_top1": 0.92, "time_to_target_interp_s": None},
                {"final_top1": 0.91}]
        cell = st.cell_stats(runs)
        self.assertAlmostEqual(cell["final_top1"]["mean"], 91.0)
        self.assertEqual((cell["time_to_target_interp_s"]["n"], cell["time_to_target_interp_s"]["missing"]), (1, 2))
        self.assertEqual(st.fmt_cell(cell["time_to_target_interp_s"], 1, "time_to_target_interp_s"), "10.0 (n = 1) (2 not reached)")
        self.assertEqual(st.fmt_cell(cell["staleness_mean"], 2, "staleness_mean"), "— (3 without)")


class InterpolatedTarget(unittest.TestCase):
    """tools/downpour_runs.interpolated_target: where the line between the evaluations around
    the target crosses it, and their gap."""

    def test_crossing_between_two_evaluations(self):
        import downpour_runs as dr
        evals = [(10.0, {"top1": 0.80, "epoch": 1.0}), (20.0, {"top1": 0.88, "epoch": 2.0}),
                 (30.0, {"top1": 0.90, "epoch": 3.0}), (40.0, {"top1": 0.91, "epoch": 4.0})]
        got = dr.interpolated_target(evals)
        self.assertAlmostEqual(got["time_to_target_interp_s"], 25.0)  # halfway from 0.88 to 0.90
        self.assertAlmostEqual(got["epochs_to_target_interp"], 2.5)
        self.assertEqual(got["target_bracket_s"], 10.0)

    def test_reached_at_the_first_evaluation_or_never(self):
        import downpour_runs as dr
        first = dr.interpolated_target([(5.0, {"top1": 0.95, "epoch": 0.5})])
        self.assertEqual((first["time_to_target_interp_s"], first["target_bracket_s"]), (5.0, 0.0))
        never = dr.interpolated_target([(5.0, {"top1": 0.5}), (9.0, {"top1": 0.7})])
        self.assertIsNone(never["time_to_target_interp_s"])


class Band(unittest.TestCase):
    def test_mean_and_interval_on_the_common_span(self):
        a = {"evals": [{"wall_s": 0.0, "top1": 0.5}, {"wall_s": 10.0, "top1": 0.7}]}
        b = {"evals": [{"wall_s": 2.0, "top1": 0.6}, {"wall_s": 12.0, "top1": 0.8}]}
        rows = st.band([a, b], points=3)
        self.assertEqual([round(t, 6) for t, _, _, _ in rows], [2.0, 6.0, 10.0])  # both runs' span
        t, mean, lo, hi = rows[1]  # at t = 6: a is at 62, b at 68
        self.assertAlmostEqual(mean, 65.0)
        self.assertAlmostEqual(hi - mean, 12.706 * 3.0 * math.sqrt(2) / math.sqrt(2), places=2)
        self.assertEqual(st.band([a]), [])
        self.assertEqual(st.band([a, {"evals": [{"wall_s": 20.0, "top1": 0.9}, {"wall_s": 30.0, "top1": 0.9}]}]), [])


class Diverged(unittest.TestCase):
    def test_a_diverged_run_is_counted_and_left_out_of_the_means_and_tests(self):
        runs = [{"final_top1": 0.83}, {"final_top1": 0.84}, {"final_top1": 0.10, "diverged": True}]
        cell = st.cell_stats(runs)
        self.assertEqual(cell["diverged"], 1)
        self.assertEqual(cell["final_top1"]["n"], 2)
        self.assertAlmostEqual(cell["final_top1"]["mean"], 83.5)
        table = st.markdown("g", [("a", runs), ("b", [{"final_top1": 0.90}, {"final_top1": 0.91}])], [])
        self.assertIn("| a | 3 | 1 | 83.50 ± ", table)
        self.assertIn("| b | 2 | 0 | 90.50 ± ", table)


class Welch(unittest.TestCase):
    # Wikipedia, "Welch's t-test", example 1: t = -2.46, df = 24.99, p = 0.021.
    A = [27.5, 21.0, 19.0, 23.6, 17.0, 17.9, 16.9, 20.1, 21.9, 22.6, 23.1, 19.6, 19.0, 21.7, 21.4]
    B = [27.1, 22.0, 20.8, 23.4, 23.4, 23.5, 25.8, 22.0, 24.8, 20.2, 21.9, 22.1, 22.9, 20.5, 24.4]

    def test_the_worked_example(self):
        t, df, p = st.welch(self.A, self.B)
        self.assertAlmostEqual(t, -2.46, places=2)
        self.assertAlmostEqual(df, 24.99, places=1)
        self.assertAlmostEqual(p, 0.021, places=3)

    def test_a_difference_that_must_be_called_and_one_that_must_not(self):
        far = st.compare([{"final_top1": v} for v in (0.80, 0.81, 0.79)],
                         [{"final_top1": v} for v in (0.90, 0.91, 0.89)], "final_top1", 100.0)
        self.assertTrue(far["significant"], far)
        self.assertLess(far["p"], 0.001)
        near = st.compare([{"final_top1": v} for v in (0.80, 0.83, 0.79)],
                          [{"final_top1": v} for v in (0.81, 0.80, 0.82)], "final_top1", 100.0)
        self.assertFalse(near["significant"], near)
        self.assertIn("no difference shown", st.fmt_comparison(near))
        self.assertIn("significant (Welch p = ", st.fmt_comparison(far))
        self.assertEqual(st.fmt_comparison(None), "too few runs to test")
        self.assertIsNone(st.welch([1.0], [2.0, 3.0]))

    def test_samples_without_spread(self):
        self.assertEqual(st.welch([1.0, 1.0], [1.0, 1.0])[2], 1.0)
        self.assertEqual(st.welch([1.0, 1.0], [2.0, 2.0])[2], 0.0)


class MapRows(unittest.TestCase):
    """downpour_stats.pair and map_markdown: a winner on time with the ratio of the means, none
    where the test does not call one, and a diverged run named in its row."""

    @staticmethod
    def runs(top1s, times):
        return [{"final_top1": a, "time_to_target_interp_s": t, "images_per_s": 100.0} for a, t in zip(top1s, times)]

    def test_time_winner_and_ratio(self):
        a = self.runs((0.90, 0.90, 0.90), (40.0, 42.0, 38.0))
        b = self.runs((0.90, 0.91, 0.89), (20.0, 21.0, 19.0))
        r = st.pair(a, b)
        self.assertEqual((r["top1_winner"], r["time_winner"]), (None, "b"))
        self.assertAlmostEqual(r["time_ratio"], 2.0)
        row = st.map_markdown([("W=2", "sync", a, "async", b)]).splitlines()[2]
        self.assertIn("| no difference shown (p = 1) |", row)
        self.assertRegex(row, r"\| \*\*async\*\*, 2\.00× sooner \(p = [0-9.e-]+\) \|")

    def test_a_diverged_run_is_named_and_not_averaged(self):
        a = self.runs((0.90, 0.91, 0.89), (30.0, 31.0, 29.0))
        b = self.runs((0.88, 0.87, 0.10), (35.0, None, None))
        b[2]["diverged"] = True
        r = st.pair(a, b)
        self.assertEqual(r["b"]["final_top1"]["n"], 2)
        row = st.map_markdown([("W=4", "sync", a, "async", b)]).splitlines()[2]
        self.assertTrue(row.startswith("| W=4 (async: 1 diverged) | sync / async | "), row)
        self.assertIn("35.0 (n = 1) (1 not reached)", row)
        self.assertIn("| too few runs to test |", row, "one time on a side cannot be tested")


if __name__ == "__main__":
    unittest.main()
