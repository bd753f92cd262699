#!/usr/bin/env python3
"""downpour-compare on fabricated runs: comparison.md and summaries.json in command-line order,
report.html (the table, an <img> for every PNG, every run's config, escaped text, nothing
external), non-empty PNGs, the gnuplot scripts' axis settings, the help text, exit codes."""
import html.parser
import json
import os
import tempfile
import unittest

import fabricate as fab

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
ALL_PLOTS = {"accuracy_vs_time.png", "accuracy_vs_epoch.png", "accuracy_vs_images.png", "loss_vs_time.png",
             "loss_vs_epoch.png",
             "throughput.png", "staleness_hist.png"}


class ReportParser(html.parser.HTMLParser):
    """Collects what a reader sees in report.html: title, table rows, images, folded configs."""

    def __init__(self):
        super().__init__()
        self.title, self.rows, self.imgs, self.pres, self.tags = "", [], [], [], set()
        self._text, self._in = None, []

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)
        self._in.append(tag)
        if tag == "tr":
            self.rows.append([])
        if tag in ("td", "th", "pre", "title"):
            self._text = ""
        if tag == "img":
            self.imgs.append(dict(attrs)["src"])

    def handle_endtag(self, tag):
        if self._in and self._in[-1] == tag:
            self._in.pop()
        if tag in ("td", "th"):
            self.rows[-1].append(self._text)
        elif tag == "pre":
            self.pres.append(self._text)
        elif tag == "title":
            self.title = self._text
        if tag in ("td", "th", "pre", "title"):
            self._text = None

    def handle_data(self, data):
        if self._text is not None:
            self._text += data


def parse_report(path):
    p = ReportParser()
    with open(path, encoding="utf-8") as f:
        text = f.read()
    p.feed(text)
    return p, text


class CompareTwoRuns(unittest.TestCase):
    """A sync run given first, then an async one whose label holds characters HTML and gnuplot
    treat specially: the order and the text must come out as given."""

    @classmethod
    def setUpClass(cls):
        cls._tmp = tempfile.TemporaryDirectory(prefix="downpour-compare-")
        tmp = cls._tmp.name
        cls.sync_dir = fab.simple_run(os.path.join(tmp, "sync-run"), mode="sync", steps=200)
        cls.async_dir = fab.simple_run(os.path.join(tmp, "async-run"), mode="async", steps=160)
        cls.out = os.path.join(tmp, "out")
        cls.label = "zz <b>async</b> & 'co'"
        cls.result = fab.run_tool("downpour-compare", "-o", cls.out, "--title", "modes <test>",
                                  f"sync_w2={cls.sync_dir}", f"{cls.label}={cls.async_dir}")

    @classmethod
    def tearDownClass(cls):
        cls._tmp.cleanup()

    def test_exit_0_and_prints_table_and_report_path(self):
        self.assertEqual(self.result.returncode, 0, self.result.stderr)
        self.assertIn("| sync_w2 | sync |", self.result.stdout)
        self.assertIn(f"report: {os.path.join(self.out, 'report.html')}", self.result.stdout)

    def test_comparison_md_rows_in_command_line_order(self):
        with open(os.path.join(self.out, "comparison.md")) as f:
            lines = f.read().splitlines()
        self.assertEqual(lines[0], "# modes <test>")
        rows = [line for line in lines if line.startswith("| ") and not line.startswith("| run ")
                and not line.startswith("| ---")]
        self.assertEqual(len(rows), 2)
        self.assertTrue(rows[0].startswith("| sync_w2 | sync | sgd | 2 | 2 | 1 | 160.0 |"), rows[0])
        self.assertTrue(rows[1].startswith(f"| {self.label} | async |"), rows[1])

    def test_summaries_json_keyed_by_label_in_order(self):
        with open(os.path.join(self.out, "summaries.json")) as f:
            summaries = json.load(f)
        self.assertEqual(list(summaries), ["sync_w2", self.label])
        self.assertEqual(summaries["sync_w2"]["steps"], 400)

    def test_every_plot_is_a_non_empty_png(self):
        for name in ALL_PLOTS:
            with self.subTest(plot=name):
                with open(os.path.join(self.out, name), "rb") as f:
                    data = f.read()
                self.assertTrue(data.startswith(PNG_MAGIC))
                self.assertGreater(len(data), 2000)

    def test_report_has_the_table_in_order(self):
        p, _ = parse_report(os.path.join(self.out, "report.html"))
        self.assertEqual(p.title, "modes <test>")
        header, *rows = p.rows
        self.assertEqual(header[:4], ["run", "mode", "algorithm", "workers"])
        self.assertEqual([r[0] for r in rows], ["sync_w2", self.label])
        with open(os.path.join(self.out, "comparison.md")) as f:
            md_header = f.read().splitlines()[2]
        self.assertEqual(md_header, "| " + " | ".join(header) + " |")

    def test_report_shows_every_png_by_relative_path(self):
        p, _ = parse_report(os.path.join(self.out, "report.html"))
        pngs = {n for n in os.listdir(self.out) if n.endswith(".png")}
        self.assertEqual(set(p.imgs), pngs)
        self.assertEqual(pngs, ALL_PLOTS)
        for src in p.imgs:
            self.assertFalse(os.path.isabs(src) or "/" in src, src)

    def test_report_folds_each_runs_config(self):
        p, _ = parse_report(os.path.join(self.out, "report.html"))
        self.assertIn("details", p.tags)
        self.assertEqual(len(p.pres), 2)
        self.assertIn('mode = "sync"', p.pres[0])
        self.assertIn('mode = "async"', p.pres[1])

    def test_report_escapes_text_and_needs_nothing_external(self):
        p, text = parse_report(os.path.join(self.out, "report.html"))
        self.assertNotIn("<b>", text)
        self.assertIn("zz &lt;b&gt;async&lt;/b&gt; &amp;", text)
        self.assertNotIn("b", p.tags)
        self.assertNotIn("script", p.tags)
        self.assertNotIn("http://", text)
        self.assertNotIn("https://", text)

    def test_staleness_histogram_has_integer_ticks_and_room_for_edge_boxes(self):
        with open(os.path.join(self.out, "staleness_hist.gp")) as f:
            gp = f.read()
        self.assertIn("set xtics 1\n", gp)
        self.assertIn("set format x '%.0f'\n", gp)
        # Staleness 0..3, two runs: boxes 0.4 wide, centred at k ± 0.2; half a box more of margin.
        self.assertIn("set xrange [-0.600:3.600]\n", gp)
        self.assertIn("set yrange [0:", gp)

    def test_throughput_bars_in_command_line_order_with_room_for_labels(self):
        with open(os.path.join(self.out, "throughput.gp")) as f:
            gp = f.read()
        self.assertIn("set ytics ('sync_w2' 0, 'zz <b>async</b> & ''co''' 1)\n", gp)
        self.assertIn("set yrange [1.60:-0.60]\n", gp)  # first run on top, half a bar of margin
        self.assertIn("set xrange [0:153.600]\n", gp)  # 128 img/s + 20% room for the value label

    def test_legends_in_command_line_order(self):
        for name in ("accuracy_vs_time", "loss_vs_epoch"):
            with open(os.path.join(self.out, name + ".gp")) as f:
                gp = f.read()
            self.assertLess(gp.index("title 'sync_w2'"), gp.index("title 'zz <b>async</b> & ''co'''"), name)


class CompareWithMissingData(unittest.TestCase):
    def test_plot_without_data_is_left_out_and_an_old_one_removed(self):
        with tempfile.TemporaryDirectory() as tmp:
            run_dir = fab.simple_run(os.path.join(tmp, "run"), with_stats=False)
            out = os.path.join(tmp, "out")
            os.makedirs(out)
            with open(os.path.join(out, "staleness_hist.png"), "wb") as f:
                f.write(PNG_MAGIC + b"stale")
            r = fab.run_tool("downpour-compare", "--out", out, run_dir)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertFalse(os.path.exists(os.path.join(out, "staleness_hist.png")))
            p, _ = parse_report(os.path.join(out, "report.html"))
            self.assertEqual(set(p.imgs), ALL_PLOTS - {"staleness_hist.png"})
            self.assertEqual(p.rows[1][0], "async W=2")  # the default label


class HelpText(unittest.TestCase):
    def test_help_names_positional_runs_and_no_label_option(self):
        r = fab.run_tool("downpour-compare", "--help")
        self.assertEqual(r.returncode, 0)
        self.assertNotIn("--label", r.stdout)
        self.assertIn("LABEL=RUN_DIR", r.stdout)
        r = fab.run_tool("downpour-compare", "-o", "/tmp/x", "--label", "a=b")
        self.assertEqual(r.returncode, 2)


class ExitCodes(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory(prefix="downpour-compare-")
        self.tmp = self._tmp.name
        self.run_dir = fab.simple_run(os.path.join(self.tmp, "run"))

    def tearDown(self):
        self._tmp.cleanup()

    def test_not_a_run_directory_exits_2(self):
        r = fab.run_tool("downpour-compare", "-o", os.path.join(self.tmp, "out"), self.run_dir, self.tmp)
        self.assertEqual(r.returncode, 2)
        self.assertEqual(r.stderr, f"downpour-compare: {self.tmp}: no config.toml (not a run directory)\n")

    def test_missing_out_or_runs_exits_2(self):
        self.assertEqual(fab.run_tool("downpour-compare", self.run_dir).returncode, 2)
        self.assertEqual(fab.run_tool("downpour-compare", "-o", os.path.join(self.tmp, "out")).returncode, 2)

    def test_empty_label_exits_2(self):
        r = fab.run_tool("downpour-compare", "-o", os.path.join(self.tmp, "out"), f"={self.tmp}/nope")
        self.assertEqual(r.returncode, 2)
        self.assertIn("expected RUN_DIR or LABEL=RUN_DIR", r.stderr)

    def test_unwritable_output_exits_1(self):
        blocker = os.path.join(self.tmp, "a-file")
        open(blocker, "w").close()
        r = fab.run_tool("downpour-compare", "-o", os.path.join(blocker, "out"), self.run_dir)
        self.assertEqual(r.returncode, 1)
        self.assertTrue(r.stderr.startswith(f"downpour-compare: {blocker}/out: "), r.stderr)

    def test_gnuplot_missing_exits_1(self):
        empty = os.path.join(self.tmp, "empty-path")
        os.makedirs(empty)
        r = fab.run_tool("downpour-compare", "-o", os.path.join(self.tmp, "out"), self.run_dir,
                         env=dict(os.environ, PATH=empty))
        self.assertEqual(r.returncode, 1)
        self.assertIn("downpour-compare: gnuplot not found", r.stderr)


if __name__ == "__main__":
    unittest.main()
