#!/usr/bin/env python3
"""Jobs across hosts made of network namespaces (scripts/netns-cluster): each process of a job
runs on a host of its own, with its own interfaces, address and TCP stack, as on a cluster.

NetnsScript: the script's bad input — not root, too many hosts, a subnet already on an interface,
a prefix already up — is one clear error (exit 2) and leaves nothing behind.
NetnsJob: a Fashion-MNIST job by hand across 5 hosts (coordinator, 2 servers, 2 workers), CurveZMQ
on, every process bound to 0.0.0.0 and advertising its host's address, as a user sets them; then
the same job with a host's link cut for twice the heartbeat timeout and restored: a worker's (it is
declared dead, and when its link is back it is told it is out and stops) and a server's (the
workers wait for it and go on), and the coordinator's; the three cuts again in sync
(NetnsSyncJob); a server replaced while cut off. Every job must end with each task's exit code 0,
nothing left running, every push each worker saw acknowledged taken exactly once by each server,
and its kept history valid (downpour-history: each acknowledged push logged once, the servers' last
checkpoints equal to the replay of their logs).

Heavy: each job trains a few seconds. Needs root (namespaces) and a build (DOWNPOUR_BUILD_DIR,
set by ctest); skips, with the reason, otherwise."""
import os
import subprocess
import time
import unittest

import netns_job as nj
from netns_job import HOSTS, can_run, metrics, namespaces, script

BUILD_DIR = os.environ.get("DOWNPOUR_BUILD_DIR")
FMNIST = nj.fab.FMNIST
# Names of this test's own, so a leftover of another run cannot collide with them.
PREFIX = f"dpt{os.getpid() % 1000}"
SUBNET = nj.free_subnet() if os.geteuid() == 0 else "10.231.200"
STEPS = 300


@unittest.skipIf(can_run(), can_run() or "")
class NetnsScript(unittest.TestCase):
    def tearDown(self):
        script("down", "--prefix", PREFIX)
        subprocess.run(["ip", "link", "del", PREFIX + "d"], capture_output=True)

    def assert_refused(self, r, words):
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIn(words, r.stderr)
        self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
        self.assertEqual([n for n in namespaces() if n.startswith(PREFIX)], [])
        self.assertNotEqual(subprocess.run(["ip", "link", "show", PREFIX + "br"], capture_output=True).returncode, 0)

    def test_bad_input_is_one_error_and_leaves_nothing(self):
        self.assert_refused(script("up", "2", "--prefix", PREFIX, "--subnet", SUBNET, user="nobody"), "needs root")
        self.assert_refused(script("up", "251", "--prefix", PREFIX, "--subnet", SUBNET), "give 1 to 250 hosts")
        self.assert_refused(script("up", "2", "--prefix", "a-much-too-long-prefix"), "--prefix")
        # A subnet already on an interface of this machine.
        subprocess.run(["ip", "link", "add", PREFIX + "d", "type", "veth", "peer", "name", PREFIX + "e"], check=True)
        subprocess.run(["ip", "addr", "add", SUBNET + ".9/24", "dev", PREFIX + "d"], check=True)
        self.assert_refused(script("up", "2", "--prefix", PREFIX, "--subnet", SUBNET),
                            f"--subnet {SUBNET}: {PREFIX}d {SUBNET}.9/24 is on this machine already")

    def test_hosts_reach_each_other_and_a_cut_host_does_not(self):
        r = script("up", "2", "--prefix", PREFIX, "--subnet", SUBNET)
        self.assertEqual(r.returncode, 0, r.stderr)
        again = script("up", "2", "--prefix", PREFIX, "--subnet", "10.231.199")
        self.assertEqual(again.returncode, 2)
        self.assertIn("is up already", again.stderr)
        probe = ("import socket,sys\ns=socket.socket(); s.settimeout(1.5)\n"
                 f"try:\n s.connect(('{SUBNET}.1', 9)); print('open')\n"
                 "except ConnectionRefusedError: print('reached')\nexcept OSError as e: print('unreachable', e)\n")
        run = lambda: script("--prefix", PREFIX, "exec", "2", "python3", "-c", probe).stdout.strip()
        self.assertEqual(run(), "reached")  # host 1's stack answered (no listener on port 9)
        self.assertEqual(script("--prefix", PREFIX, "cut", "1").returncode, 0)
        self.assertTrue(run().startswith("unreachable"))
        self.assertEqual(script("--prefix", PREFIX, "heal", "1").returncode, 0)
        self.assertEqual(run(), "reached")
        self.assertEqual(script("down", "--prefix", PREFIX).returncode, 0)
        self.assertEqual([n for n in namespaces() if n.startswith(PREFIX)], [])


@unittest.skipIf(can_run(), can_run() or "")
@unittest.skipUnless(BUILD_DIR, "DOWNPOUR_BUILD_DIR is not set (ctest sets it to the build tree)")
@unittest.skipUnless(os.path.exists(os.path.join(FMNIST, "train-images-idx3-ubyte.gz")), "dataset-fashion-mnist missing")
class NetnsJob(unittest.TestCase):
    def setUp(self):
        import tempfile
        self._tmp = tempfile.TemporaryDirectory(prefix="downpour-netns-")
        self.tmp = self._tmp.name
        script("down", "--prefix", PREFIX)
        r = script("up", str(len(HOSTS) + 1), "--prefix", PREFIX, "--subnet", SUBNET)  # and a spare host
        self.assertEqual(r.returncode, 0, r.stderr)
        self.keys = nj.make_keys(BUILD_DIR, self.tmp)
        self.config = os.path.join(self.tmp, "job.toml")
        self.write_config()
        self.run_dir = os.path.join(self.tmp, "run")
        self.job = nj.Job(BUILD_DIR, PREFIX, SUBNET, self.config, self.run_dir, self.tmp)

    MODE = "async"

    def write_config(self, **kw):
        nj.job_config(self.config, SUBNET, self.keys, steps=STEPS, history=True, mode=self.MODE, **kw)

    def tearDown(self):
        self.job.kill_all()
        script("down", "--prefix", PREFIX)
        self._tmp.cleanup()

    def start(self):
        self.job.start()

    def wait_all(self, limit_s=240):
        return self.job.wait_all(limit_s)

    def output(self):
        return self.job.output()

    def wait_steps(self, worker, steps, limit_s=120):
        return self.job.wait_steps(worker, steps, limit_s)

    def assert_every_acked_push_taken_once(self, removed=()):
        """Every push a worker saw acknowledged was taken once by its server. A worker `removed`
        from the run while cut off may have had pushes taken whose acknowledgements it never read
        (they were on the cut link): at most two steps' worth more than it saw, never fewer."""
        for s in range(2):
            ends = metrics(self.run_dir, f"server-{s}", "server_end")
            self.assertTrue(ends, f"server {s} wrote no server_end")
            taken = [int(x) for x in ends[-1]["pushes_by_worker"].strip("[]").split(",")]
            per_step = taken[0] // STEPS  # worker 0 ran every step
            for w in range(2):
                acks = [r for r in metrics(self.run_dir, f"worker-{w}", "ps_acks") if r["server"] == s]
                self.assertTrue(acks, f"worker {w} logged no ps_acks for server {s}")
                acked = acks[-1]["pushes_acked"]
                self.assertGreater(acked, 0)
                what = f"server {s} took {taken[w]} pushes of worker {w}, which saw {acked} acknowledged"
                if w in removed:
                    self.assertGreaterEqual(taken[w], acked, what)
                    self.assertLessEqual(taken[w] - acked, 2 * per_step, what)
                else:
                    self.assertEqual(taken[w], acked, what)

    def assert_ended_well(self, codes, removed=()):
        self.assertEqual(codes, {role: 0 for role in HOSTS}, self.output())
        evals = metrics(self.run_dir, "evaluator", "eval")
        self.assertTrue(evals and evals[-1]["final"], self.output())
        self.assertGreater(evals[-1]["top1"], 0.7)
        self.assert_every_acked_push_taken_once(removed)
        self.assert_history_valid()

    def assert_history_valid(self):
        """downpour-history: every acknowledged push in its server's log once, none logged twice,
        each server's last checkpoint equal to the replay of its log."""
        r = subprocess.run([os.path.join(BUILD_DIR, "server", "downpour-history"), self.run_dir],
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("history: valid: 0 acknowledged pushes lost, 0 applied twice, the replay equals the last "
                      "checkpoint on 2 of 2 servers", r.stdout)

    def test_a_job_across_five_hosts_with_keys(self):
        self.start()
        codes = self.wait_all()
        self.assert_ended_well(codes)
        text = self.output()
        # Each process was reached at its own host's address.
        for w in range(2):
            self.assertIn(f"worker {w} registered from {SUBNET}.{HOSTS[f'worker {w}']}", text)
        for w in range(2):
            self.assertEqual(metrics(self.run_dir, f"worker-{w}", "done")[-1]["steps"], STEPS)

    def cut(self, role, seconds=4.0):
        self.job.cut(role, seconds)  # cluster.heartbeat_timeout_ms is 2 s
        self.healed_at = self.job.healed_at

    def test_a_worker_cut_off_past_the_timeout_is_out_and_the_job_ends(self):
        # The job must still run when the link comes back, for someone to tell the worker it is
        # out: worker 0 is slowed to 25 ms a step, so its last 270 steps outlast the 4 s cut (at
        # full speed it once finished first, the run ended during the cut, and the worker came
        # back to nobody and waited its 60 s of server_wait, as designed).
        self.write_config(worker_extra="straggler = 0\nstraggler_delay_ms = 25\n")
        self.start()
        self.assertTrue(self.wait_steps(1, STEPS // 10), self.output())
        self.cut("worker 1")
        codes = self.wait_all()
        # Told it is out, it stops at once: it does not wait cluster.server_wait_ms (60 s here) for
        # servers that may be gone.
        self.assertLess(time.monotonic() - self.healed_at, 30, self.output())
        self.assert_ended_well(codes, removed=(1,))
        text = self.output()
        self.assertIn("coordinator: worker 1 silent for more than 2000 ms: declared dead", text)
        self.assertIn("out of the run", text)
        self.assertEqual(metrics(self.run_dir, "worker-0", "done")[-1]["steps"], STEPS)
        self.assertEqual(metrics(self.run_dir, "worker-1", "done"), [])

    def test_a_server_cut_off_is_waited_for_and_the_job_goes_on(self):
        self.start()
        self.assertTrue(self.wait_steps(0, STEPS // 10), self.output())
        self.cut("server 1")
        codes = self.wait_all()
        self.assert_ended_well(codes)
        self.assertIn("server 1 unreachable for", self.output())
        for w in range(2):
            self.assertEqual(metrics(self.run_dir, f"worker-{w}", "done")[-1]["steps"], STEPS)


    def test_a_coordinator_cut_off_declares_nobody_dead_and_the_job_goes_on(self):
        self.start()
        self.assertTrue(self.wait_steps(0, STEPS // 10), self.output())
        self.cut("coordinator")
        codes = self.wait_all()
        self.assert_ended_well(codes)
        text = self.output()
        self.assertIn("this process is taken to be cut off", text)
        self.assertNotIn("silent for more than", text)  # nobody declared dead
        for w in range(2):
            self.assertEqual(metrics(self.run_dir, f"worker-{w}", "done")[-1]["steps"], STEPS)

    def test_a_server_replaced_while_cut_off_is_fenced_out_when_it_comes_back(self):
        """Server 1's host is cut off; an operator starts a replacement server 1 on the spare host
        from the shared checkpoint and log (--recover). It takes the id, the workers follow it, and
        when the old host's link is back the old process is told it is out and stops without
        writing anything (its log and checkpoint are the replacement's now). The job finishes,
        every task exits 0, and the history is valid: nothing lost or applied twice."""
        self.write_config(worker_extra="straggler = 0\nstraggler_delay_ms = 20\n")
        self.start()
        self.assertTrue(self.wait_steps(0, STEPS // 10), self.output())
        spare = len(HOSTS) + 1
        self.assertEqual(script("--prefix", PREFIX, "cut", str(HOSTS["server 1"])).returncode, 0)
        time.sleep(1.0)
        replacement_log = os.path.join(self.tmp, "replacement.out")
        with open(replacement_log, "w") as log:
            replacement = subprocess.Popen(
                [nj.SCRIPT, "--prefix", PREFIX, "exec", str(spare), os.path.join(BUILD_DIR, "server", "downpour-server"),
                 "--config", os.path.join(self.run_dir, "config.toml"), "--id", "1", "--run-dir", self.run_dir,
                 "--recover", "--tensors", os.path.join(self.run_dir, "tensors-server-1.txt"), "--coordinator",
                 f"{SUBNET}.1:{nj.PORT}", "--advertise", f"{SUBNET}.{spare}"], stdout=log, stderr=subprocess.STDOUT)
        try:
            steps = len(metrics(self.run_dir, "worker-0", "step"))
            self.assertTrue(self.wait_steps(0, steps + 30, limit_s=60), self.output())  # training goes on
            self.assertEqual(script("--prefix", PREFIX, "heal", str(HOSTS["server 1"])).returncode, 0)
            codes = self.wait_all()
            self.assertEqual(replacement.wait(timeout=60), 0)
        finally:
            if replacement.poll() is None:
                replacement.kill()
                replacement.wait()
        with open(replacement_log) as f:
            text = self.output() + f.read()
        self.assert_ended_well(codes)
        self.assertIn("recovered: checkpoint", text)
        self.assertIn("server 1 is taken over by another process", text)
        self.assertIn(f"coordinator: server 1 moved from tcp://{SUBNET}.{HOSTS['server 1']}:5601 to "
                      f"tcp://{SUBNET}.{spare}:5601", text)  # the workers followed it
        self.assertIn("coordinator: server 1's previous process is heard from again after another took its id: "
                      "told it is out of the run", text)
        with open(os.path.join(self.tmp, "server-1.out")) as f:
            old = f.read()
        self.assertIn("server 1: out of the run (another process serves its id); exiting without a checkpoint", old)
        self.assertNotIn("written on stop", old)
        for w in range(2):
            self.assertEqual(metrics(self.run_dir, f"worker-{w}", "done")[-1]["steps"], STEPS)


class NetnsSyncJob(NetnsJob):
    """The three cuts again in sync mode: a worker cut past the timeout is out and the rounds go on
    without it; a server's or the coordinator's cut stalls the rounds and the job goes on. (The
    other jobs above are the same in both modes.)"""
    MODE = "sync"
    test_a_job_across_five_hosts_with_keys = None
    test_a_server_replaced_while_cut_off_is_fenced_out_when_it_comes_back = None


if __name__ == "__main__":
    unittest.main()
