"""downpour_netns — a job across hosts made of network namespaces (scripts/netns-cluster), for the
experiments that need a network between hosts: the scaling model's validation
(bench/train/scaling_validate.py) and downpour-experiment --network netns.

A namespace is a host to the kernel's network stack (its own interface, address, routes and TCP
stack); `scripts/netns-cluster up N --rate R` joins N of them to a bridge, each with a link of R
each way shaped by tc tbf (docs/cluster.md "Hosts as network namespaces"). Here every process
of a job gets a host of its own: the coordinator (with the evaluator, which the launcher runs
beside it) on host 1, server i on host 2 + i, worker i on host 2 + S + i. Each runs
`downpour-launch --role` in its host, bound to 0.0.0.0 and advertising its host's address, as a
user runs a job by hand on a cluster. The run directory is one shared directory (the namespaces
share this machine's filesystem). The hosts' CPUs are this machine's cores: only the network is
separate.

The job runs without CurveZMQ keys, `security.insecure = true`: the bridge reaches nothing but the
hosts made here, and the experiments measure the transport, not encryption (bench/RESULTS.md §12
has CurveZMQ's cost). Needs root: can_run() says why not otherwise.
"""
import os
import signal
import subprocess
import sys
import time
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "netns-cluster")
PORT = 5555       # the coordinator's port on its host (each host has its own ports)
BASE_PORT = 5600  # cluster.base_port: a server's port on its host


def can_run():
    """None when namespaces can be made here; else why not (one line)."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, veth pairs, a bridge)"
    r = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    if r.returncode != 0:
        return f"ip netns does not work here: {r.stderr.strip()}"
    if subprocess.run(["tc", "-V"], capture_output=True).returncode != 0:
        return "the tc command (iproute2) is missing"
    return None


def free_subnet(first=150, count=50):
    """The first of 10.231.<first>..<first+count-1> (from this pid on) no interface of this
    machine or of any namespace uses."""
    used = subprocess.run("ip -o -4 addr show; for n in $(ip netns list | cut -d' ' -f1); do "
                          "ip -n $n -o -4 addr show; done", shell=True, capture_output=True, text=True).stdout
    for k in range(count):
        candidate = f"10.231.{first + (os.getpid() + k) % count}"
        if f" {candidate}." not in used:
            return candidate
    raise RuntimeError(f"no free subnet in 10.231.{first}-{first + count - 1}")


def exit_on_sigterm():
    """Makes SIGTERM raise SystemExit in this process, so that a Cluster being used is taken down
    (its `with` block left) when the experiment is stopped with kill, not left behind."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


def rate_text(gbps):
    """tc's rate for a link of `gbps` Gbit/s (whole Mbit/s)."""
    return f"{max(1, round(gbps * 1000))}mbit"


class Cluster:
    """`with Cluster(hosts, gbps) as c:` — hosts up (links shaped to gbps each way; 0 = not
    shaped), removed on leaving, whatever happened inside."""

    def __init__(self, hosts, gbps=0.0, prefix=None, subnet=None):
        self.hosts, self.gbps = hosts, gbps
        self.prefix = prefix or f"dpx{os.getpid() % 100000}"
        self.subnet = subnet or free_subnet()

    def script(self, *args):
        return subprocess.run([SCRIPT, "--prefix", self.prefix, *args], capture_output=True, text=True, timeout=120)

    def __enter__(self):
        self.script("down")  # a leftover of a killed run with this prefix
        args = ["--subnet", self.subnet, "up", str(self.hosts)]
        if self.gbps > 0:
            args += ["--rate", rate_text(self.gbps)]
        r = self.script(*args)
        if r.returncode != 0:
            raise RuntimeError(f"scripts/netns-cluster up {self.hosts}: {(r.stderr or r.stdout).strip()}")
        return self

    def __exit__(self, *exc):
        self.script("down")
        return False

    def address(self, host):
        return f"{self.subnet}.{host}"

    def exec_args(self, host, argv):
        return [SCRIPT, "--prefix", self.prefix, "exec", str(host), *argv]


def roles(servers, workers):
    """[(role, id or None, host)] of a job: coordinator on 1, servers on 2.., workers after."""
    out = [("coordinator", None, 1)]
    out += [("server", i, 2 + i) for i in range(servers)]
    out += [("worker", i, 2 + servers + i) for i in range(workers)]
    return out


def job_sets(cluster):
    """--set overrides that put a job on the cluster's hosts. Shared memory off: the hosts share
    this machine's /dev/shm and its boot id, so a worker would take its servers for same-host ones
    and move every payload through memory, around the links."""
    return [f"cluster.coordinator={cluster.address(1)}:{PORT}", f"cluster.base_port={BASE_PORT}",
            "cluster.bind=0.0.0.0", "cluster.shared_memory=false", "security.insecure=true"]


def config_value(config, sets, key):
    """A run-config key ("section.key") as the job will see it: the last --set of it in `sets`
    (a string), else the config file's value, else None."""
    for x in reversed(sets):
        if x.startswith(key + "="):
            return x.partition("=")[2]
    with open(config, "rb") as f:
        section, _, name = key.partition(".")
        return tomllib.load(f).get(section, {}).get(name)


def job_size(config, sets):
    """(servers, workers) of a job: cluster.servers and cluster.workers as it will see them."""
    return tuple(int(config_value(config, sets, f"cluster.{k}")) for k in ("servers", "workers"))


def failures(codes):
    """run_job's exit codes as one phrase naming every task that did not exit 0; "" if none."""
    return ", ".join(f"{k} {'timed out' if v is None else f'exit {v}'}" for k, v in codes.items() if v != 0)


def run_job(build, config, run_dir, sets, gbps, timeout_s=900, cwd=ROOT, log_dir=None):
    """Runs one job (its config file with the --set overrides `sets`) across 1 + S + W namespace
    hosts whose links are shaped to `gbps` (0: not shaped). Each task's output (its launcher's)
    goes to <log_dir>/netns-<task>.out, or without log_dir beside the run directory as
    <run_dir>-<task>.out. Returns {task: exit code (None: killed at timeout_s)} once every task
    has ended; task is coordinator, server-<i> or worker-<i>. A job that still sets
    cluster.link_gbps is refused (ValueError): it must not also pace itself."""
    link = config_value(config, sets, "cluster.link_gbps")
    if link is not None:
        raise ValueError(f"{config}: cluster.link_gbps = {link}: a job on namespace hosts has shaped links; "
                         "leave the emulated link out")
    servers, workers = job_size(config, sets)
    launch = os.path.join(build, "server", "downpour-launch")
    set_args = []
    tasks = {}
    if log_dir:
        os.makedirs(log_dir, exist_ok=True)
    with Cluster(1 + servers + workers, gbps) as c:
        for x in list(sets) + job_sets(c):
            set_args += ["--set", x]
        deadline = time.monotonic() + timeout_s
        for role, index, host in roles(servers, workers):
            argv = [launch, "--config", config, "--run-dir", run_dir, "--role", role, "--coordinator",
                    f"{c.address(1)}:{PORT}", "--advertise", c.address(host), *set_args]
            if index is not None:
                argv += ["--id", str(index)]
            name = role if index is None else f"{role}-{index}"
            log = open(os.path.join(log_dir, f"netns-{name}.out") if log_dir else f"{run_dir}-{name}.out", "w")
            tasks[name] = (subprocess.Popen(c.exec_args(host, argv), stdout=log, stderr=subprocess.STDOUT, cwd=cwd),
                           log)
        codes = {}
        for name, (p, log) in tasks.items():
            try:
                codes[name] = p.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                codes[name] = None
            log.close()
        # A task killed at the deadline leaves its child in the namespace: end everything there.
        if any(code is None for code in codes.values()):
            subprocess.run(["pkill", "-KILL", "-f", run_dir], capture_output=True)
    return codes
