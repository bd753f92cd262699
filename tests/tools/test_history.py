#!/usr/bin/env python3
"""downpour-history on a real 2 x 2 job that kept its history (checkpoint.history), and on copies
of it with one thing broken each: the checker must call the real history valid and name each
breakage — an acknowledged push that no log holds (lost), a push logged twice, an acknowledgement
recorded twice, a logged gradient changed after the fact (the replay then differs from the
checkpoint), a kept log segment removed, a run that kept no history.

The log records are edited as server/wal.h lays them out (24-byte header, CRC-32 of its first
20 bytes and the payload), independently of the C++ reader.

Needs DOWNPOUR_BUILD_DIR (ctest sets it) and the Fashion-MNIST files; ~10 s."""
import glob
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import unittest
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import fabricate as fab  # noqa: E402

BUILD_DIR = os.environ.get("DOWNPOUR_BUILD_DIR")
HEADER = struct.Struct("<IHHQII")  # magic, version, kind, seq, length, crc
KIND_PUSH = 1
FLAG_INIT = 1  # common/codec.h kFlagInit


def records(path):
    """[(offset, kind, seq, payload)] of a log file (server/wal.h)."""
    out = []
    with open(path, "rb") as f:
        data = f.read()
    pos = 0
    while pos + HEADER.size <= len(data):
        magic, _, kind, seq, length, crc = HEADER.unpack_from(data, pos)
        if magic != 0x4C575044:
            break
        payload = data[pos + HEADER.size:pos + HEADER.size + length]
        assert zlib.crc32(payload, zlib.crc32(data[pos:pos + 20])) == crc, f"{path}: bad CRC at {pos}"
        out.append((pos, kind, seq, payload))
        pos += HEADER.size + length
    return out


def encode(kind, seq, payload):
    head = struct.pack("<IHHQI", 0x4C575044, 1, kind, seq, len(payload))
    return head + struct.pack("<I", zlib.crc32(payload, zlib.crc32(head))) + payload


def gradient_push(payload):
    """Whether a push payload (worker i32, flags u32, ...) is a gradient, not initial weights."""
    _, flags = struct.unpack_from("<iI", payload, 0)
    return flags & FLAG_INIT == 0


@unittest.skipUnless(BUILD_DIR, "DOWNPOUR_BUILD_DIR is not set (ctest sets it to the build tree)")
@unittest.skipUnless(os.path.exists(os.path.join(fab.FMNIST, "train-images-idx3-ubyte.gz")), "dataset-fashion-mnist missing")
class HistoryOfAJob(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls._tmp = tempfile.TemporaryDirectory(prefix="downpour-history-")
        cls.tmp = cls._tmp.name
        config = fab.real_job_config(os.path.join(cls.tmp, "job.toml"), workers=2, steps=60, batch_size=32,
                                     checkpoint_every=20, eval_extra="every_steps = 0", extra="history = true\n")
        cls.run_dir = os.path.join(cls.tmp, "run")
        r = subprocess.run([os.path.join(BUILD_DIR, "server", "downpour-launch"), "--config", config, "--run-dir",
                            cls.run_dir], capture_output=True, text=True, timeout=240)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]

    @classmethod
    def tearDownClass(cls):
        cls._tmp.cleanup()

    def check(self, run_dir):
        return fab.history_report(BUILD_DIR, run_dir, os.path.join(self.tmp, "report.json"))

    def copy(self, name):
        dst = os.path.join(self.tmp, name)
        shutil.copytree(self.run_dir, dst)
        return dst

    def segments(self, run_dir, server=0):
        return sorted(glob.glob(os.path.join(run_dir, "checkpoints", f"server-{server}.wal.*")))

    def test_the_real_history_is_valid(self):
        r, report = self.check(self.run_dir)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("history: valid: 0 acknowledged pushes lost, 0 applied twice, the replay equals the last "
                      "checkpoint on 2 of 2 servers", r.stdout)
        self.assertTrue(report["valid"])
        for s in report["servers"]:
            self.assertTrue(s["equal"])
            self.assertGreater(s["segments"], 2)  # checkpoints every 20 rounds moved the log aside
            self.assertGreater(s["floats_compared"], 0)
            self.assertEqual(s["checkpoint_seq"], s["last_seq"])
        # Every gradient push the servers counted is in the history, acknowledged: the ack files
        # hold each worker's 60 steps x 2 servers plus worker 0's initial weights.
        for w in report["workers"]:
            self.assertEqual((w["lost"], w["applied_twice"], w["acked_twice"]), (0, 0, 0))
            self.assertEqual(w["acked"], w["applied"])
            self.assertGreaterEqual(w["acked"], 60 * 2)

    def test_an_acknowledgement_no_log_holds_is_a_lost_push(self):
        run = self.copy("lost")
        path = os.path.join(run, "history", "worker-1.acks")
        with open(path) as f:
            server, session, _ = f.readline().split()
        with open(path, "a") as f:
            f.write(f"{server} {session} 987654321\n")
        r, report = self.check(run)
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn(f"VIOLATION: worker 1: server {server} acknowledged its push (session {int(session):#x}, "
                      "request 987654321), which is in none of the server's log files: lost", r.stdout)
        self.assertEqual(report["workers"][1]["lost"], 1)
        self.assertIn("history: VIOLATED: 1 acknowledged pushes lost", r.stdout)

    def test_a_push_logged_twice_is_applied_twice(self):
        run = self.copy("twice")
        logged = [x for path in self.segments(run) for x in records(path)]
        _, kind, seq, payload = [x for x in logged if x[1] == KIND_PUSH and gradient_push(x[3])][-1]
        live = os.path.join(run, "checkpoints", "server-0.wal")
        last_seq = logged[-1][2]
        self.assertEqual(records(live), [])  # the last checkpoint moved everything aside
        with open(live, "ab") as f:
            f.write(encode(kind, last_seq + 1, payload))
        r, report = self.check(run)
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn(f"is logged again at seq {last_seq + 1} (first at seq {seq}): applied twice", r.stdout)
        self.assertEqual(sum(w["applied_twice"] for w in report["workers"]), 1)
        # ... and the last checkpoint no longer covers the whole log: the final state is unknown.
        self.assertIn(f"not checked: server 0: its last checkpoint covers its log up to seq {last_seq}, and the log "
                      f"goes on to seq {last_seq + 1}", r.stdout)

    def test_an_acknowledgement_recorded_twice_is_named(self):
        run = self.copy("acked-twice")
        path = os.path.join(run, "history", "worker-0.acks")
        with open(path) as f:
            first = f.readline()
        with open(path, "a") as f:
            f.write(first)
        r, _ = self.check(run)
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("is recorded twice", r.stdout)

    def test_a_gradient_changed_in_the_log_makes_the_replay_differ(self):
        run = self.copy("changed")
        path = self.segments(run)[1]
        offset, kind, seq, payload = [x for x in records(path) if x[1] == KIND_PUSH and gradient_push(x[3])][0]
        # worker, flags, session, request id, clock, n, then chunk id, version_from, count, floats
        first_float = 4 + 4 + 8 + 8 + 8 + 4 + 4 + 8 + 4
        (g,) = struct.unpack_from("<f", payload, first_float)
        changed = bytearray(payload)
        struct.pack_into("<f", changed, first_float, g + 0.5)
        with open(path, "r+b") as f:
            f.seek(offset)
            f.write(encode(kind, seq, bytes(changed)))
        r, report = self.check(run)
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("server 0: its last checkpoint", r.stdout)
        self.assertIn("differs from a replay of its log", r.stdout)
        self.assertFalse(report["servers"][0]["equal"])
        self.assertTrue(report["servers"][1]["equal"])

    def test_a_missing_segment_is_an_input_error_naming_the_gap(self):
        run = self.copy("gap")
        os.remove(self.segments(run)[0])
        r, report = self.check(run)
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIsNone(report)
        self.assertIn("are in none of its log files", r.stderr)
        self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)

    def test_a_run_without_history_is_told_so(self):
        run = self.copy("none")
        config = os.path.join(run, "config.toml")
        with open(config) as f:
            text = f.read()
        self.assertIn("history = true", text)
        with open(config, "w") as f:
            f.write(text.replace("history = true", "history = false"))
        r, _ = self.check(run)
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIn("checkpoint.history is false: the run kept no history to check", r.stderr)


if __name__ == "__main__":
    unittest.main()
