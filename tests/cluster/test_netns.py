#!/usr/bin/env python3
"""Jobs across hosts made of network namespaces (scripts/netns-cluster): each process of a job
runs on a host of its own, with its own interfaces, address and TCP stack, as on a cluster.

NetnsScript: the script's bad input — not root, too many hosts, a subnet already on an interface,
a prefix already up — is one clear error (exit 2) and leaves nothing behind.
NetnsJob: a Fashion-MNIST job by hand across 5 hosts (coordinator, 2 servers, 2 workers), CurveZMQ
on, every process bound to 0.0.0.0 and advertising its host's address, as a user sets them; then
the same job with a host's link cut for twice the heartbeat timeout and restored: a worker's (it is
declared dead, and when its link is back it is told it is out and stops) and a server's (the
workers wait for it and go on). Every job must end with each task's exit code 0, nothing left
running, and every push each worker saw acknowledged taken exactly once by each server.

Heavy: each job trains a few seconds. Needs root (namespaces) and a build (DOWNPOUR_BUILD_DIR,
set by ctest); skips, with the reason, otherwise."""
import glob
import json
import os
import subprocess
import sys
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BUILD_DIR = os.environ.get("DOWNPOUR_BUILD_DIR")
sys.path.insert(0, os.path.join(ROOT, "tests", "tools"))
import fabricate as fab  # noqa: E402  (the real job's config, shared with the tools' tests)
SCRIPT = os.path.join(ROOT, "scripts", "netns-cluster")
FMNIST = fab.FMNIST
# Names of this test's own, so a leftover of another run cannot collide with them; the subnet is
# the first of 10.231.200-249 (from this pid on) that nothing on the machine uses.
PREFIX = f"dpt{os.getpid() % 1000}"


def free_subnet():
    used = subprocess.run("ip -o -4 addr show; for n in $(ip netns list | cut -d' ' -f1); do "
                          "ip -n $n -o -4 addr show; done", shell=True, capture_output=True, text=True).stdout
    for k in range(50):
        candidate = f"10.231.{200 + (os.getpid() + k) % 50}"
        if f" {candidate}." not in used:
            return candidate
    raise RuntimeError("no free subnet in 10.231.200-249")


SUBNET = free_subnet() if os.geteuid() == 0 else "10.231.200"
HOSTS = {"coordinator": 1, "server 0": 2, "server 1": 3, "worker 0": 4, "worker 1": 5}
STEPS = 300
PORT = 5555  # each host has its own ports: the default ones are free in a namespace


def script(*args, user=None):
    cmd = [SCRIPT, *args]
    if user:
        cmd = ["runuser", "-u", user, "--", *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def namespaces():
    r = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    return [line.split()[0] for line in r.stdout.splitlines() if line.strip()]


def can_run():
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    r = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    if r.returncode != 0:
        return f"ip netns does not work here: {r.stderr.strip()}"
    return None


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


def metrics(run, name, kind):
    path = os.path.join(run, "metrics", name + ".jsonl")
    if not os.path.exists(path):
        return []
    out = []
    with open(path) as f:
        for line in f:
            try:
                r = json.loads(line)
            except ValueError:
                continue
            if r.get("event") == kind:
                out.append(r)
    return out


@unittest.skipIf(can_run(), can_run() or "")
@unittest.skipUnless(BUILD_DIR, "DOWNPOUR_BUILD_DIR is not set (ctest sets it to the build tree)")
@unittest.skipUnless(os.path.exists(os.path.join(FMNIST, "train-images-idx3-ubyte.gz")), "dataset-fashion-mnist missing")
class NetnsJob(unittest.TestCase):
    def setUp(self):
        import tempfile
        self._tmp = tempfile.TemporaryDirectory(prefix="downpour-netns-")
        self.tmp = self._tmp.name
        script("down", "--prefix", PREFIX)
        r = script("up", str(len(HOSTS)), "--prefix", PREFIX, "--subnet", SUBNET)
        self.assertEqual(r.returncode, 0, r.stderr)
        keys = os.path.join(self.tmp, "keys")
        r = subprocess.run([os.path.join(BUILD_DIR, "server", "downpour-keys"), "--out", keys],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.config = fab.real_job_config(
            os.path.join(self.tmp, "job.toml"), workers=2, steps=STEPS, batch_size=32,
            coordinator=f"{SUBNET}.1:{PORT}", base_port=5600, checkpoint_every=100,
            cluster_extra='bind = "0.0.0.0"\nheartbeat_ms = 200\nheartbeat_timeout_ms = 2000\nserver_wait_ms = 60000',
            eval_extra="every_steps = 0", extra=f'[security]\nkeys = "{keys}"\n')
        self.run_dir = os.path.join(self.tmp, "run")
        self.tasks = {}

    def tearDown(self):
        for p in self.tasks.values():
            if p.poll() is None:
                p.kill()
                p.wait()
        script("down", "--prefix", PREFIX)
        self._tmp.cleanup()

    def start(self):
        launch = os.path.join(BUILD_DIR, "server", "downpour-launch")
        for role, host in HOSTS.items():
            kind, _, index = role.partition(" ")
            args = [SCRIPT, "--prefix", PREFIX, "exec", str(host), launch, "--config", self.config, "--run-dir",
                    self.run_dir, "--role", kind, "--coordinator", f"{SUBNET}.1:{PORT}", "--advertise",
                    f"{SUBNET}.{host}"]
            if index:
                args += ["--id", index]
            with open(os.path.join(self.tmp, role.replace(" ", "-") + ".out"), "w") as log:
                self.tasks[role] = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)

    def wait_all(self, limit_s=240):
        deadline = time.monotonic() + limit_s
        codes = {}
        for role, p in self.tasks.items():
            try:
                codes[role] = p.wait(timeout=max(1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                codes[role] = None
        return codes

    def output(self):
        text = ""
        for path in sorted(glob.glob(os.path.join(self.tmp, "*.out"))):
            with open(path, errors="replace") as f:
                text += f"==== {os.path.basename(path)}\n" + f.read()[-6000:]
        return text

    def wait_steps(self, worker, steps, limit_s=120):
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            if len(metrics(self.run_dir, f"worker-{worker}", "step")) >= steps:
                return True
            time.sleep(0.05)
        return False

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
        self.assertEqual(script("--prefix", PREFIX, "cut", str(HOSTS[role])).returncode, 0)
        time.sleep(seconds)  # cluster.heartbeat_timeout_ms is 2 s
        self.assertEqual(script("--prefix", PREFIX, "heal", str(HOSTS[role])).returncode, 0)
        self.healed_at = time.monotonic()

    def test_a_worker_cut_off_past_the_timeout_is_out_and_the_job_ends(self):
        # The job must still run when the link comes back, for someone to tell the worker it is
        # out: worker 0 is slowed to 25 ms a step, so its last 270 steps outlast the 4 s cut (at
        # full speed it once finished first, the run ended during the cut, and the worker came
        # back to nobody and waited its 60 s of server_wait, as designed).
        with open(self.config) as f:
            text = f.read()
        with open(self.config, "w") as f:
            f.write(text.replace("threads = 1\n", "threads = 1\nstraggler = 0\nstraggler_delay_ms = 25\n", 1))
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

if __name__ == "__main__":
    unittest.main()
