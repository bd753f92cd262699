#!/usr/bin/env python3
"""Kernel-shaped links between hosts made of network namespaces, as the experiments use them
(tools/downpour_netns.py, scripts/netns-cluster --rate).

ShapedLinks: a host's link is shaped each way — what it sends, and what it receives from two
senders at once, both take at least bytes / rate.
ShapedJob: a 1-server, 1-worker Fashion-MNIST job across three hosts whose links are shaped to
0.2 Gbit/s: every payload crossed the wire (nothing through shared memory), and a step took at
least a push's bytes at the link's rate; a config that still asks for an emulated link is refused.
ShapedExperiment: downpour-experiment --network netns runs each run on its own hosts with its
cluster.link_gbps as the shaped link, the run's config without the key, network.json beside it.

Needs root (namespaces) and a build (DOWNPOUR_BUILD_DIR, set by ctest); skips, with the reason,
otherwise. ~30 s."""
import json
import os
import subprocess
import sys
import tempfile
import time
import tomllib
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tools"))
sys.path.insert(0, os.path.join(ROOT, "tests", "tools"))
import downpour_netns as netns  # noqa: E402
import downpour_runs as dr  # noqa: E402
import fabricate as fab  # noqa: E402

BUILD_DIR = os.environ.get("DOWNPOUR_BUILD_DIR")
HAS_DATA = os.path.exists(os.path.join(fab.FMNIST, "train-images-idx3-ubyte.gz"))

# Sends N bytes from this host to HOST:PORT (client), or receives everything sent to PORT and
# prints how many bytes (server).
PIPE = r"""
import socket, sys
mode, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
if mode == "server":
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind((host, port)); s.listen(1)
    c, _ = s.accept(); n = 0
    while True:
        b = c.recv(1 << 16)
        if not b: break
        n += len(b)
    print(n)
else:
    c = socket.create_connection((host, port)); c.sendall(b"x" * int(sys.argv[4])); c.close()
"""


@unittest.skipIf(netns.can_run(), netns.can_run() or "")
class ShapedLinks(unittest.TestCase):
    RATE_MBIT = 100
    BYTES = 2_500_000  # 0.2 s at 100 Mbit/s

    def test_each_host_is_shaped_both_ways(self):
        with netns.Cluster(3, self.RATE_MBIT / 1000) as c:
            def pipe(receiver, senders):
                """Seconds for every sender to send BYTES to `receiver` at once."""
                servers = [subprocess.Popen(c.exec_args(receiver, [sys.executable, "-c", PIPE, "server", "0.0.0.0",
                                                                   str(7000 + k)]),
                                            stdout=subprocess.PIPE, text=True) for k in range(len(senders))]
                time.sleep(0.5)
                t0 = time.monotonic()
                clients = [subprocess.Popen(c.exec_args(s, [sys.executable, "-c", PIPE, "client", c.address(receiver),
                                                            str(7000 + k), str(self.BYTES)]))
                           for k, s in enumerate(senders)]
                for p in clients + servers:
                    p.wait(timeout=60)
                elapsed = time.monotonic() - t0
                received = []
                for p in servers:
                    received.append(int(p.stdout.read()))
                    p.stdout.close()
                self.assertEqual(received, [self.BYTES] * len(senders))
                return elapsed

            at_rate = self.BYTES * 8 / (self.RATE_MBIT * 1e6)
            # Host 2's uplink: one flow out.
            self.assertGreater(pipe(1, [2]), 0.8 * at_rate)
            # Host 1's downlink: two senders with links of their own, one receiver.
            self.assertGreater(pipe(1, [2, 3]), 0.8 * 2 * at_rate)


@unittest.skipIf(netns.can_run(), netns.can_run() or "")
@unittest.skipUnless(BUILD_DIR, "DOWNPOUR_BUILD_DIR not set (ctest sets it)")
@unittest.skipUnless(HAS_DATA, "dataset-fashion-mnist missing")
class ShapedJob(unittest.TestCase):
    GBPS = 0.2
    STEPS = 20

    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory(prefix="downpour-shaped-")
        self.tmp = self._tmp.name
        self.config = fab.real_job_config(os.path.join(self.tmp, "job.toml"), workers=1, steps=self.STEPS,
                                          batch_size=32, eval_extra="every_steps = 0")
        with open(self.config) as f:
            text = f.read()
        with open(self.config, "w") as f:
            f.write(text.replace("servers = 2", "servers = 1"))

    def tearDown(self):
        self._tmp.cleanup()

    def test_every_payload_crosses_the_shaped_link(self):
        run = os.path.join(self.tmp, "run")
        codes = netns.run_job(BUILD_DIR, self.config, run, [], self.GBPS, timeout_s=240,
                              log_dir=os.path.join(self.tmp, "out"))
        outputs = ""
        for n in sorted(os.listdir(os.path.join(self.tmp, "out"))):
            with open(os.path.join(self.tmp, "out", n)) as f:
                outputs += f.read()[-3000:]
        self.assertEqual(codes, {"coordinator": 0, "server-0": 0, "worker-0": 0}, outputs)
        steps = [r for r in dr.read_jsonl(os.path.join(run, "metrics", "worker-0.jsonl")) if r["event"] == "step"]
        self.assertEqual(len(steps), self.STEPS)
        later = steps[2:]
        # fmnist_small's 644,746 floats each way a step, all of it on the wire (a step's records
        # count what left or arrived during it: a part of one push may fall into the next step).
        for key in ("tx_bytes", "rx_bytes"):
            self.assertGreater(sum(r[key] for r in later) / len(later), 2_550_000, key)
        for r in later:
            self.assertEqual(r.get("shm_tx_bytes", 0), 0, r)
            self.assertEqual(r.get("shm_rx_bytes", 0), 0, r)
        # A step moves its push out at the link's rate at best (its pull comes in beside it).
        at_rate_ms = 1e3 * sum(r["tx_bytes"] for r in later) / len(later) * 8 / (self.GBPS * 1e9)
        median = sorted(r["step_ms"] for r in later)[len(later) // 2]
        self.assertGreater(median, 0.8 * at_rate_ms, f"median step {median:.1f} ms, the push at the rate "
                           f"{at_rate_ms:.1f} ms")
        with open(os.path.join(self.tmp, "out", "netns-worker-0.out")) as f:
            self.assertIn("done", f.read())

    def test_an_emulated_link_in_the_config_is_refused(self):
        with self.assertRaises(ValueError) as e:
            netns.run_job(BUILD_DIR, self.config, os.path.join(self.tmp, "run"), ["cluster.link_gbps=1"], 1.0)
        self.assertIn("cluster.link_gbps = 1", str(e.exception))


@unittest.skipIf(netns.can_run(), netns.can_run() or "")
@unittest.skipUnless(BUILD_DIR, "DOWNPOUR_BUILD_DIR not set (ctest sets it)")
@unittest.skipUnless(HAS_DATA, "dataset-fashion-mnist missing")
class ShapedExperiment(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory(prefix="downpour-shaped-exp-")
        self.tmp = self._tmp.name
        base = fab.real_job_config(os.path.join(self.tmp, "base.toml"), workers=1, steps=20, batch_size=32,
                                   eval_extra="every_steps = 0")
        self.experiment = os.path.join(self.tmp, "exp.toml")
        with open(self.experiment, "w") as f:
            f.write(f"""[experiment]
name = "shaped"
base = "{base}"
out_dir = "{self.tmp}/out"
network = "netns"
[experiment.overrides]
cluster = {{ servers = 1, workers = 1 }}
[[run]]
label = "slow"
cluster = {{ link_gbps = 0.2 }}
[[run]]
label = "unshaped"
""")

    def tearDown(self):
        self._tmp.cleanup()

    def experiment_tool(self, *args):
        return subprocess.run([sys.executable, os.path.join(ROOT, "tools", "downpour-experiment"), self.experiment,
                               "--build-dir", BUILD_DIR, "--quiet", *args], capture_output=True, text=True,
                              timeout=400)

    def test_each_run_on_hosts_shaped_to_its_link(self):
        r = self.experiment_tool()
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("across 3 namespace hosts, links shaped to 0.2 Gbit/s each way", r.stdout)
        self.assertIn("across 3 namespace hosts, links not shaped", r.stdout)
        steps = {}
        for label, gbps in (("slow", 0.2), ("unshaped", 0.0)):
            run = os.path.join(self.tmp, "out", "shaped", label)
            with open(os.path.join(run, "network.json")) as f:
                self.assertEqual(json.load(f), {"network": "netns", "link_gbps": gbps, "hosts": 3})
            with open(os.path.join(run, "config.toml"), "rb") as f:
                self.assertNotIn("link_gbps", tomllib.load(f)["cluster"])
            self.assertTrue(os.path.exists(os.path.join(run, "logs", "netns-worker-0.out")))
            with open(os.path.join(run, "summary.json")) as f:
                steps[label] = json.load(f)["images_per_s"]
        self.assertLess(steps["slow"], steps["unshaped"])
        # Run again: both reused (same config, same network); --network pacer is another key.
        again = self.experiment_tool()
        self.assertEqual(again.stdout.count("reused (finished earlier"), 2, again.stdout)

    def test_a_bad_network_names_the_key(self):
        with open(self.experiment) as f:
            text = f.read()
        with open(self.experiment, "w") as f:
            f.write(text.replace('network = "netns"', 'network = "wifi"'))
        r = self.experiment_tool()
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIn("experiment.network = 'wifi'", r.stderr)


if __name__ == "__main__":
    unittest.main()
