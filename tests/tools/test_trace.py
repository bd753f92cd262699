#!/usr/bin/env python3
"""downpour-trace: the summary of fabricated timelines (counts, shares, percentiles, egress args),
the merged file (one pid per file, every event kept), a run in parts, and its exit codes (no
timeline: 1; a file that is not one: 2, named).

TraceOfAJob (needs DOWNPOUR_BUILD_DIR, which ctest sets): a real 2 x 2 Fashion-MNIST job on an
emulated 1 Gbit/s link with cluster.trace_events on. Every server's timeline has one "push" span
per push it received (its server_end line), every worker's one step, forward+backward and push
wait span per step; the servers' and workers' egress spans carry the link's share of the wait.
A tiny cluster.trace_events keeps that many events and reports the rest as dropped."""
import json
import os
import subprocess
import unittest

import fabricate as fab

BUILD_DIR = os.environ.get("DOWNPOUR_BUILD_DIR")
FMNIST = "/usr/share/datasets/fashion-mnist"


def write_trace(run_dir, name, process, events, dropped=0):
    os.makedirs(os.path.join(run_dir, "trace"), exist_ok=True)
    doc = {"traceEvents": [{"ph": "M", "name": "process_name", "pid": 7, "args": {"name": process}}] + events,
           "displayTimeUnit": "ms",
           "otherData": {"process": process, "pid": 7, "events": len(events), "dropped": dropped, "capacity": 100}}
    with open(os.path.join(run_dir, "trace", name + ".json"), "w") as f:
        json.dump(doc, f)


def x(name, ts_us, dur_us, cat="worker", **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": 7, "tid": 0, "ts": ts_us, "dur": dur_us, "args": args}


def pair(name, ident, ts_us, end_us, cat="link", **args):
    return [{"ph": "b", "cat": cat, "name": name, "id": ident, "pid": 7, "tid": 1, "ts": ts_us, "args": args},
            {"ph": "e", "cat": cat, "name": name, "id": ident, "pid": 7, "tid": 1, "ts": end_us}]


def trace_tool(*args):
    return fab.run_tool("downpour-trace", *args)


def rows(summary, process):
    for p in summary["processes"]:
        if p["process"] == process:
            return {f"{r['cat']}/{r['name']}": r for r in p["spans"]}
    raise AssertionError(f"no process {process!r} in {summary}")


class Summary(fab.TempDirTest):
    def test_counts_shares_percentiles_and_egress_args(self):
        run = os.path.join(self.tmp, "run")
        # Ten 100 ms steps over 1 s, each with a 60 ms forward+backward; two egress waits.
        events = []
        for i in range(10):
            events.append(x("step", 1e6 + i * 1e5, 1e5))
            events.append(x("forward+backward", 1e6 + i * 1e5, 6e4))
        events += pair("egress", "0x1", 1e6, 1e6 + 4e3, bytes=1000, link_ms=3.0, late_ms=1.0)
        events += pair("egress", "0x2", 1e6, 1e6 + 8e3, bytes=3000, link_ms=5.0, late_ms=3.0)
        write_trace(run, "worker-0", "worker 0", events)
        r = trace_tool(run, "--json")
        self.assertEqual(r.returncode, 0, r.stderr)
        s = json.loads(r.stdout)
        w = rows(s, "worker 0")
        self.assertEqual(w["worker/step"]["count"], 10)
        self.assertAlmostEqual(w["worker/step"]["share"], 1.0, places=6)
        self.assertAlmostEqual(w["worker/forward+backward"]["share"], 0.6, places=6)
        self.assertAlmostEqual(w["worker/forward+backward"]["mean_ms"], 60.0, places=6)
        egress = w["link/egress"]
        self.assertIsNone(egress["share"])  # message spans overlap: no share
        self.assertEqual(egress["count"], 2)
        self.assertAlmostEqual(egress["mean_ms"], 6.0, places=6)
        self.assertAlmostEqual(egress["max_ms"], 8.0, places=6)
        self.assertAlmostEqual(egress["mean_link_ms"], 4.0, places=6)
        self.assertAlmostEqual(egress["mean_late_ms"], 2.0, places=6)
        self.assertAlmostEqual(egress["mean_bytes"], 2000.0, places=6)
        table = trace_tool(run).stdout
        self.assertIn("worker 0 (worker-0.json): 1.00 s traced", table)
        self.assertIn("link 4.000 ms, late 2.000 ms", table)

    def test_merge_gives_each_file_a_pid_and_keeps_every_event(self):
        a = os.path.join(self.tmp, "host-a")
        b = os.path.join(self.tmp, "host-b")
        write_trace(a, "server-0", "server 0", [x("push", 1e6, 10, cat="server")])
        write_trace(b, "worker-1", "worker 1", [x("step", 1e6, 10), x("step", 2e6, 10)], dropped=5)
        write_trace(a, "worker-0", "worker 0", [x("step", 1e6, 10)])
        out = os.path.join(self.tmp, "all.json")
        r = trace_tool(f"{a}+{b}", "-o", out)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("5 events dropped past cluster.trace_events", r.stdout)
        with open(out) as f:
            merged = json.load(f)["traceEvents"]
        self.assertEqual(len(merged), 3 + 4)
        names = {e["pid"]: e["args"]["name"] for e in merged if e["name"] == "process_name"}
        self.assertEqual(sorted(names.values()), ["server 0", "worker 0", "worker 1"])
        self.assertEqual(names[1], "server 0")  # servers first
        for e in merged:
            if e["ph"] == "X":
                self.assertIn(e["pid"], names)

    def test_no_timeline_is_1_and_a_bad_file_is_2_naming_it(self):
        run = os.path.join(self.tmp, "run")
        os.makedirs(run)
        r = trace_tool(run)
        self.assertEqual(r.returncode, 1)
        self.assertIn("no trace/*.json", r.stderr)
        self.assertIn("cluster.trace_events", r.stderr)
        os.makedirs(os.path.join(run, "trace"))
        bad = os.path.join(run, "trace", "worker-0.json")
        with open(bad, "w") as f:
            f.write('{"traceEvents": [')
        r = trace_tool(run)
        self.assertEqual(r.returncode, 2)
        self.assertIn(bad, r.stderr)
        with open(bad, "w") as f:
            json.dump({"traceEvents": [{"ph": "X", "name": "step", "ts": 1}]}, f)
        r = trace_tool(run)
        self.assertEqual(r.returncode, 2)
        self.assertIn("event 0 (step) has no dur", r.stderr)
        r = trace_tool(os.path.join(self.tmp, "missing"))
        self.assertEqual(r.returncode, 2)
        self.assertIn("not a directory", r.stderr)


def metrics(run_dir, name, event):
    out = []
    with open(os.path.join(run_dir, "metrics", name + ".jsonl")) as f:
        for line in f:
            r = json.loads(line)
            if r.get("event") == event:
                out.append(r)
    return out


@unittest.skipUnless(BUILD_DIR, "DOWNPOUR_BUILD_DIR is not set (ctest sets it to the build tree)")
@unittest.skipUnless(os.path.exists(os.path.join(FMNIST, "train-images-idx3-ubyte.gz")),
                     "dataset-fashion-mnist missing")
class TraceOfAJob(fab.TempDirTest):
    STEPS = 30

    def job(self, name, trace_events):
        cfg = fab.real_job_config(os.path.join(self.tmp, name + ".toml"), workers=2, steps=self.STEPS, batch_size=64,
                                  cluster_extra=f"link_gbps = 1\ntrace_events = {trace_events}",
                                  eval_extra="every_steps = 0")
        run = os.path.join(self.tmp, name)
        launch = os.path.join(BUILD_DIR, "server", "downpour-launch")
        r = subprocess.run([launch, "--config", cfg, "--run-dir", run], capture_output=True, text=True, timeout=300)
        self.assertEqual(r.returncode, 0, r.stdout[-4000:] + r.stderr[-4000:])
        return run

    def test_every_push_step_and_egress_is_on_the_timeline(self):
        run = self.job("traced", 100000)
        out = os.path.join(self.tmp, "all.json")
        r = trace_tool(run, "--json", "-o", out)
        self.assertEqual(r.returncode, 0, r.stderr)
        s = json.loads(r.stdout)
        self.assertEqual(sorted(p["process"] for p in s["processes"]),
                         ["server 0", "server 1", "worker 0", "worker 1"])
        for p in s["processes"]:
            self.assertEqual(p["dropped"], 0, p["process"])
        for i in range(2):
            srv = rows(s, f"server {i}")
            received = metrics(run, f"server-{i}", "server_end")[-1]["pushes_received"]
            self.assertEqual(srv["server/push"]["count"], received, f"server {i}")
            self.assertGreater(srv["server/serve pull"]["count"], 0)
            # Each server's weights (1.08 and 1.28 MB of fmnist_small) are more than the pacer's
            # 5 ms burst at 1 Gbit/s (625 kB), so every pull reply waits for the link; at 2 Gbit/s
            # server 0's fit the burst and waited only when two workers' pulls met (none, once,
            # on a loaded 2-core CI machine).
            self.assertGreater(srv["link/egress"]["count"], 0)
            self.assertGreater(srv["link/egress"]["mean_link_ms"], 0)
            wk = rows(s, f"worker {i}")
            for span in ("worker/step", "worker/forward+backward", "worker/push wait"):
                self.assertEqual(wk[span]["count"], self.STEPS, f"worker {i} {span}")
            self.assertGreaterEqual(wk["worker/step"]["share"], 0.5)
            acked = sum(r["pushes_acked"] for r in metrics(run, f"worker-{i}", "ps_acks"))
            self.assertGreaterEqual(wk["client/push part"]["count"], acked)  # + the init pushes
            self.assertGreater(wk["client/pull part"]["count"], 0)
        with open(out) as f:
            merged = json.load(f)["traceEvents"]
        pids = {e["pid"] for e in merged if e["name"] == "process_name"}
        self.assertEqual(len(pids), 4)

    def test_a_small_capacity_keeps_the_first_events_and_counts_the_rest(self):
        run = self.job("small", 50)
        for name in ("server-0", "worker-1"):
            with open(os.path.join(run, "trace", name + ".json")) as f:
                d = json.load(f)
            self.assertEqual(d["otherData"]["events"], 50, name)
            self.assertGreater(d["otherData"]["dropped"], 0, name)
        with open(os.path.join(run, "logs", "worker-1.log")) as f:
            self.assertIn("more dropped past cluster.trace_events", f.read())


if __name__ == "__main__":
    unittest.main()
