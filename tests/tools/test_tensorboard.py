#!/usr/bin/env python3
"""TensorBoard event files (common/tensorboard.h), read back by a reader of our own that shares no
code with the writer: the TFRecord framing with its masked CRC-32C (computed here bit by bit from
the Castagnoli polynomial) and the Event protobuf decoded from the wire format by hand (field
numbers of TensorFlow's event.proto and summary.proto, which TensorBoard reads).

Needs DOWNPOUR_BUILD_DIR (ctest sets it): a single-process run and a 2 x 2 job write the files,
and every scalar must equal its record in the run's JSONL metrics."""
import glob
import json
import os
import struct
import subprocess
import tempfile
import unittest

import fabricate as fab

BUILD_DIR = os.environ.get("DOWNPOUR_BUILD_DIR")
FMNIST = fab.FMNIST


def _crc32c_table():
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _crc32c_table()


def crc32c(data):
    c = 0xFFFFFFFF
    for b in data:
        c = _TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def masked(crc):
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


class Damaged(Exception):
    pass


def records(path):
    """The payloads of a TFRecord file; Damaged on a bad length, a bad CRC or a short record."""
    with open(path, "rb") as f:
        data = f.read()
    out, at = [], 0
    while at < len(data):
        if len(data) - at < 12:
            raise Damaged(f"{path}: {len(data) - at} bytes left, a record header is 12")
        header = data[at:at + 8]
        (length,) = struct.unpack("<Q", header)
        (length_crc,) = struct.unpack("<I", data[at + 8:at + 12])
        if masked(crc32c(header)) != length_crc:
            raise Damaged(f"{path}: record at byte {at}: the length's CRC does not match")
        body = data[at + 12:at + 12 + length]
        if len(body) != length or len(data) < at + 16 + length:
            raise Damaged(f"{path}: record at byte {at}: cut short")
        (body_crc,) = struct.unpack("<I", data[at + 12 + length:at + 16 + length])
        if masked(crc32c(body)) != body_crc:
            raise Damaged(f"{path}: record at byte {at}: the data's CRC does not match")
        out.append(body)
        at += 16 + length
    return out


def varint(buf, at):
    shift = value = 0
    while True:
        b = buf[at]
        at += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, at
        shift += 7


def fields(buf):
    """(field number, wire type, value) of a protobuf message: ints, bytes, or 4/8 raw bytes."""
    out, at = [], 0
    while at < len(buf):
        key, at = varint(buf, at)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, at = varint(buf, at)
        elif wire == 1:
            value, at = buf[at:at + 8], at + 8
        elif wire == 2:
            length, at = varint(buf, at)
            value, at = buf[at:at + length], at + length
        elif wire == 5:
            value, at = buf[at:at + 4], at + 4
        else:
            raise ValueError(f"wire type {wire}")
        out.append((number, wire, value))
    return out


def event(buf):
    """An Event as a dict: wall_time, step, file_version or scalars {tag: value}."""
    e = {"step": 0, "scalars": {}}
    for number, wire, value in fields(buf):
        if number == 1 and wire == 1:
            (e["wall_time"],) = struct.unpack("<d", value)
        elif number == 2 and wire == 0:
            e["step"] = value - (1 << 64) if value >= 1 << 63 else value
        elif number == 3 and wire == 2:
            e["file_version"] = value.decode()
        elif number == 5 and wire == 2:  # Summary
            for vn, vw, v in fields(value):
                if vn != 1 or vw != 2:
                    continue
                tag, simple = None, None
                for n, w, x in fields(v):  # Summary.Value
                    if n == 1 and w == 2:
                        tag = x.decode()
                    elif n == 2 and w == 5:
                        (simple,) = struct.unpack("<f", x)
                e["scalars"][tag] = simple
    return e


def events(directory):
    files = sorted(glob.glob(os.path.join(directory, "events.out.tfevents.*")))
    if len(files) != 1:
        raise AssertionError(f"{directory}: {len(files)} event files, expected 1")
    return [event(r) for r in records(files[0])]


def metrics(run, name, kind):
    with open(os.path.join(run, "metrics", name + ".jsonl")) as f:
        return [r for r in map(json.loads, f) if r.get("event") == kind]


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


class Reader(unittest.TestCase):
    """The reader itself: a known record, and a flipped byte caught by the CRC."""

    def test_a_hand_made_record_reads_back_and_a_flipped_byte_is_caught(self):
        body = bytes([0x09]) + struct.pack("<d", 2.5) + bytes([0x1A, 0x04]) + b"abcd"  # wall_time 2.5, file_version
        header = struct.pack("<Q", len(body))
        blob = header + struct.pack("<I", masked(crc32c(header))) + body + struct.pack("<I", masked(crc32c(body)))
        self.assertEqual(crc32c(b"123456789"), 0xE3069283)  # the CRC-32C check value
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "f")
            with open(path, "wb") as f:
                f.write(blob)
            self.assertEqual(event(records(path)[0]), {"step": 0, "scalars": {}, "wall_time": 2.5, "file_version": "abcd"})
            with open(path, "wb") as f:
                f.write(blob[:14] + bytes([blob[14] ^ 1]) + blob[15:])
            with self.assertRaises(Damaged):
                records(path)


@unittest.skipUnless(BUILD_DIR, "DOWNPOUR_BUILD_DIR is not set (ctest sets it to the build tree)")
@unittest.skipUnless(os.path.exists(os.path.join(FMNIST, "train-images-idx3-ubyte.gz")),
                     "dataset-fashion-mnist missing")
class EventsOfRuns(fab.TempDirTest):
    def config(self, name, workers, steps, eval_extra):
        return fab.real_job_config(os.path.join(self.tmp, name + ".toml"), workers=workers, steps=steps,
                                   batch_size=32, eval_extra=eval_extra)

    def expect_scalars_equal_metrics(self, evs, records, step_field, prefix, keys):
        by_step = {e["step"]: e["scalars"] for e in evs if e["scalars"] and any(t.startswith(prefix) for t in e["scalars"])}
        self.assertEqual(sorted(by_step), sorted(r[step_field] for r in records))
        for r in records:
            scalars = by_step[r[step_field]]
            for key in keys:
                if r[key] is None:  # null in JSONL (not a finite number): no scalar
                    self.assertNotIn(prefix + key, scalars)
                else:
                    self.assertEqual(scalars[prefix + key], f32(r[key]), f"{prefix}{key} at {r[step_field]}")

    def test_a_single_process_run_writes_its_steps_and_evaluations(self):
        run = os.path.join(self.tmp, "local")
        cfg = self.config("local", 1, 12, "every_steps = 6")
        worker = os.path.join(BUILD_DIR, "client", "worker", "downpour-worker")
        r = subprocess.run([worker, "--local", "--quiet", "--config", cfg, "--run-dir", run],
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr[-3000:])
        evs = events(os.path.join(run, "tensorboard", "worker-0"))
        self.assertEqual(evs[0]["file_version"], "brain.Event:2")
        steps = metrics(run, "worker-0", "step")
        self.assertEqual(len(steps), 12)
        self.expect_scalars_equal_metrics(evs, steps, "step", "step/", ["loss", "batch_acc", "images_per_s"])
        evals = metrics(run, "worker-0", "eval")
        self.assertGreaterEqual(len(evals), 2)
        self.expect_scalars_equal_metrics(evs, evals, "step", "eval/", ["top1", "top5", "test_loss"])

    def test_a_job_writes_one_directory_per_worker_and_the_evaluator(self):
        run = os.path.join(self.tmp, "job")
        cfg = self.config("job", 2, 20, "every_steps = 10")
        launch = os.path.join(BUILD_DIR, "server", "downpour-launch")
        r = subprocess.run([launch, "--config", cfg, "--run-dir", run], capture_output=True, text=True, timeout=300)
        self.assertEqual(r.returncode, 0, r.stdout[-4000:] + r.stderr[-4000:])
        self.assertEqual(sorted(os.listdir(os.path.join(run, "tensorboard"))), ["evaluator-0", "worker-0", "worker-1"])
        for w in (0, 1):
            evs = events(os.path.join(run, "tensorboard", f"worker-{w}"))
            self.expect_scalars_equal_metrics(evs, metrics(run, f"worker-{w}", "step"), "step", "step/",
                                              ["loss", "images_per_s", "staleness_mean", "tx_bytes", "rx_bytes"])
        evs = events(os.path.join(run, "tensorboard", "evaluator-0"))
        evals = metrics(run, "evaluator", "eval")
        self.assertTrue(evals and evals[-1]["final"])
        self.expect_scalars_equal_metrics(evs, evals, "iter", "eval/", ["top1", "top5", "test_loss"])


if __name__ == "__main__":
    unittest.main()
