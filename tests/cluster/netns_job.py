"""netns_job — a downpour job by hand across hosts made of network namespaces
(scripts/netns-cluster), and the faults a cluster has: a host's link cut and healed, a process
frozen (SIGSTOP) and woken. Shared by tests/cluster/test_netns.py and the fault table
(bench/faults/run_faults.py).

Each process runs in its own host's namespace through `downpour-launch --role`, bound to
0.0.0.0 and advertising its host's address, with CurveZMQ keys, as a user sets them up. Needs
root; can_run() says why not otherwise."""
import glob
import json
import os
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "tools"))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import downpour_netns  # noqa: E402  (hosts made of namespaces, shared with the experiments)
import fabricate as fab  # noqa: E402  (the real job's config, shared with the tools' tests)

SCRIPT = os.path.join(ROOT, "scripts", "netns-cluster")
HOSTS = {"coordinator": 1, "server 0": 2, "server 1": 3, "worker 0": 4, "worker 1": 5}
PORT = 5555  # each host has its own ports: the default ones are free in a namespace
BINARY = {"coordinator": "downpour-coordinator", "server": "downpour-server", "worker": "downpour-worker"}


def script(*args, user=None):
    cmd = [SCRIPT, *args]
    if user:
        cmd = ["runuser", "-u", user, "--", *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def namespaces():
    r = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    return [line.split()[0] for line in r.stdout.splitlines() if line.strip()]


can_run = downpour_netns.can_run


def free_subnet():
    """A /24 of 10.231.200-249 that nothing on the machine uses (the experiments take 150-199)."""
    return downpour_netns.free_subnet(first=200)


def metrics(run, name, kind):
    """The records of one event kind in RUN/metrics/<name>.jsonl (torn lines skipped)."""
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


def make_keys(build_dir, tmp):
    keys = os.path.join(tmp, "keys")
    r = subprocess.run([os.path.join(build_dir, "server", "downpour-keys"), "--out", keys],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(r.stderr)
    return keys


def job_config(path, subnet, keys, *, steps, mode="async", history=False, checkpoint_every=100, seed=3,
               worker_extra="", whole_test_set=False, cluster_extra=""):
    """A 2 x 2 Fashion-MNIST job (fmnist_small) for HOSTS: heartbeats every 200 ms, declared dead
    after 2 s of silence; the final evaluation on 200 test images, or all 10,000."""
    fab.real_job_config(
        path, workers=2, steps=steps, batch_size=32, coordinator=f"{subnet}.1:{PORT}", base_port=5600,
        checkpoint_every=checkpoint_every,
        cluster_extra='bind = "0.0.0.0"\nheartbeat_ms = 200\nheartbeat_timeout_ms = 2000\nserver_wait_ms = 60000\n' +
        cluster_extra,
        eval_extra="every_steps = 0", extra=("history = true\n" if history else "") + f'[security]\nkeys = "{keys}"\n')
    with open(path) as f:
        text = f.read()
    text = text.replace("seed = 3\n", f"seed = {seed}\n", 1)
    if whole_test_set:
        text = text.replace("test_batches = 2\n", "test_batches = 0\n", 1)
    text = text.replace("threads = 1\n", "threads = 1\n" + worker_extra, 1)
    if mode != "async":
        text += f'[consistency]\nmode = "{mode}"\n'
    with open(path, "w") as f:
        f.write(text)
    return path


class Job:
    """One job's processes, one per host of HOSTS, and the faults injected into it."""

    def __init__(self, build_dir, prefix, subnet, config, run_dir, log_dir):
        self.build_dir, self.prefix, self.subnet = build_dir, prefix, subnet
        self.config, self.run_dir, self.log_dir = config, run_dir, log_dir
        self.tasks = {}
        self.started_at = None

    def start(self):
        launch = os.path.join(self.build_dir, "server", "downpour-launch")
        self.started_at = time.monotonic()
        for role, host in HOSTS.items():
            kind, _, index = role.partition(" ")
            args = [SCRIPT, "--prefix", self.prefix, "exec", str(host), launch, "--config", self.config, "--run-dir",
                    self.run_dir, "--role", kind, "--coordinator", f"{self.subnet}.1:{PORT}", "--advertise",
                    f"{self.subnet}.{host}"]
            if index:
                args += ["--id", index]
            with open(os.path.join(self.log_dir, role.replace(" ", "-") + ".out"), "w") as log:
                self.tasks[role] = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)

    def wait_all(self, limit_s=240):
        """Each task's exit code (None: still running at the limit); the wall time of the last."""
        deadline = time.monotonic() + limit_s
        codes = {}
        for role, p in self.tasks.items():
            try:
                codes[role] = p.wait(timeout=max(1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                codes[role] = None
        return codes

    def kill_all(self):
        for p in self.tasks.values():
            if p.poll() is None:
                p.kill()
                p.wait()

    def output(self):
        text = ""
        for path in sorted(glob.glob(os.path.join(self.log_dir, "*.out"))):
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

    def cut(self, role, seconds):
        """Takes the link of `role`'s host down for `seconds`, then up again."""
        if script("--prefix", self.prefix, "cut", str(HOSTS[role])).returncode != 0:
            raise RuntimeError(f"cannot cut {role}")
        time.sleep(seconds)
        if script("--prefix", self.prefix, "heal", str(HOSTS[role])).returncode != 0:
            raise RuntimeError(f"cannot heal {role}")
        self.healed_at = time.monotonic()

    def process_of(self, role):
        """The pid of `role`'s own process (the launcher's child: the server, worker or coordinator)."""
        kind, _, index = role.partition(" ")
        launcher = self.tasks[role].pid
        r = subprocess.run(["pgrep", "-f", BINARY[kind]], capture_output=True, text=True)
        for pid in r.stdout.split():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    argv = f.read().decode(errors="replace").split("\0")
                with open(f"/proc/{pid}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            if self.run_dir not in argv or (index and ("--id" not in argv or argv[argv.index("--id") + 1] != index)):
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            if self.descends_from(ppid, launcher):
                return int(pid)
        raise RuntimeError(f"no {BINARY[kind]} process of {role} under launcher {launcher}")

    @staticmethod
    def descends_from(pid, ancestor):
        for _ in range(8):  # netns-cluster exec, ip netns exec, the launcher
            if pid == ancestor:
                return True
            if pid <= 1:
                return False
            try:
                with open(f"/proc/{pid}/stat") as f:
                    pid = int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                return False
        return False

    def freeze(self, role, seconds):
        """SIGSTOPs `role`'s process for `seconds`, then SIGCONTs it (a hung process that comes back)."""
        pid = self.process_of(role)
        os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(seconds)
        finally:
            os.kill(pid, signal.SIGCONT)
        self.healed_at = time.monotonic()
