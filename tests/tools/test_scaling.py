#!/usr/bin/env python3
"""tools/downpour-scaling and its model (tools/downpour_scaling.py): AlexNet's bytes per worker
step for every codec, the layout replicated from common/layout.cc, more servers never slower,
a two-worker case computed by hand, the command line (table, --json, --png, --run-dir,
--rates-from-bench) and bad input refused with exit 2 naming the flag."""
import contextlib
import io
import dataclasses
import json
import math
import os
import shutil
import sys
import tempfile
import unittest

import fabricate as fab

sys.path.insert(0, fab.TOOLS)
import downpour_runs as dr  # noqa: E402
import downpour_scaling as sc  # noqa: E402

# bvlc_alexnet (configs/models/alexnet.toml, 1000 classes) as downpour-worker --write-tensors
# writes it: 60,965,224 floats.
ALEXNET_TENSORS = """# tensors of alexnet (configs/models/alexnet.toml)
conv1.weight 96x3x11x11 1 1
conv1.bias 96 2 0
conv2.weight 256x48x5x5 1 1
conv2.bias 256 2 0
conv3.weight 384x256x3x3 1 1
conv3.bias 384 2 0
conv4.weight 384x192x3x3 1 1
conv4.bias 384 2 0
conv5.weight 256x192x3x3 1 1
conv5.bias 256 2 0
fc6.weight 4096x9216 1 1
fc6.bias 4096 2 0
fc7.weight 4096x4096 1 1
fc7.bias 4096 2 0
fc8.weight 1000x4096 1 1
fc8.bias 1000 2 0
"""
ALEXNET_FLOATS = 60965224
CONV_WEIGHTS = 96 * 3 * 11 * 11 + 256 * 48 * 25 + 384 * 256 * 9 + 384 * 192 * 9 + 256 * 192 * 9  # 2,332,704
BIASES = 96 + 256 + 384 + 384 + 256 + 4096 + 4096 + 1000                                          # 10,568
ALEXNET_LAYERS = ["conv1", "relu1", "norm1", "pool1", "conv2", "relu2", "norm2", "pool2", "conv3", "relu3",
                  "conv4", "relu4", "conv5", "relu5", "pool5", "fc6", "relu6", "drop6", "fc7", "relu7", "drop7",
                  "fc8", "loss"]


def alexnet_time(batch=128, device="gpu:0", step_ms=20.0):
    """A downpour-time --json object: compute spread over the layers, forward 1/3 of it."""
    types = {"conv": "Convolution", "fc": "InnerProduct", "relu": "ReLU", "norm": "LRN", "pool": "Pooling",
             "drop": "Dropout", "loss": "SoftmaxWithLoss"}
    per = step_ms / len(ALEXNET_LAYERS)
    layers = [{"layer": n, "type": types[n.rstrip("0123456789")], "forward_ms": per / 3, "backward_ms": 2 * per / 3}
              for n in ALEXNET_LAYERS]
    return {"model": "alexnet", "config": "configs/models/alexnet.toml", "backend": "cudnn", "device": device,
            "batch": batch, "threads": None, "iterations": 10, "warmup": 1, "params": ALEXNET_FLOATS,
            "layers": layers, "forward_ms": step_ms / 3, "backward_ms": 2 * step_ms / 3, "step_ms": step_ms,
            "images_per_s": batch / step_ms * 1e3}


def alexnet():
    return sc.parse_tensors(ALEXNET_TENSORS, "alexnet")


def colocated_fc_case(workers, servers, link_gbps):
    """One-thread CPU workers of 30 ms (an fc of 250,000 floats, 1 MB) and S servers at 100 ns per
    float, every process on one 2-core host, the transport's own CPU left out."""
    profile = sc.Profile([("fc", "InnerProduct", 0.010, 0.020)], batch=64, threads=1, source="hand")
    tensors = sc.parse_tensors("fc.weight 1000x250 1 1\n", "hand")
    c = sc.Cluster(workers=workers, servers=servers, link_gbps=link_gbps, batch=64, workers_per_host=workers,
                   cores_per_host=2, emulated=True, colocated=True)
    rates = sc.Rates(sgd_ns_per_float=100.0, server_ns_per_float=100.0, io_ns_per_byte=0.0)
    return profile, tensors, c, rates


def push_bytes(codec, servers=1, batch=128, chunk_elems=sc.DEFAULT_CHUNK_ELEMS):
    layers = sc.step_bytes(alexnet(), {}, servers, batch, sc.parse_codec(codec), chunk_elems)
    return sum(lb.push for lb in layers.values()), sum(lb.pull for lb in layers.values())


class Layout(unittest.TestCase):
    def test_alexnet_chunks_cover_every_float_once_within_one_float_of_n_over_s(self):
        for servers in (1, 2, 3, 4, 7, 16):
            chunks = sc.layout_chunks(alexnet(), servers)
            self.assertEqual(sum(c.count for c in chunks), ALEXNET_FLOATS)
            self.assertTrue(all(1 <= c.count <= sc.DEFAULT_CHUNK_ELEMS for c in chunks))
            per_server = [sum(c.count for c in chunks if c.server == s) for s in range(servers)]
            self.assertLessEqual(max(per_server) - min(per_server), 1, servers)

    def test_fc6_is_36_chunks_of_4_mib_at_one_server(self):
        """The config's comment: fc6's 37.7M floats become 36 chunks of 1 Mi floats."""
        fc6 = [c for c in sc.layout_chunks(alexnet(), 1) if c.tensor == 10]
        self.assertEqual(len(fc6), 36)
        self.assertEqual({c.count for c in fc6}, {1 << 20})


class AlexNetBytes(unittest.TestCase):
    def test_fp32_moves_every_float_both_ways(self):
        self.assertEqual(push_bytes("fp32"), (ALEXNET_FLOATS * 4, ALEXNET_FLOATS * 4))
        self.assertEqual(ALEXNET_FLOATS * 4, 243860896)

    def test_fp16_and_bf16_halve_the_push_and_pull_codecs_halve_the_pull(self):
        for codec in ("fp16", "bf16"):
            self.assertEqual(push_bytes(codec), (ALEXNET_FLOATS * 2, ALEXNET_FLOATS * 4))
            self.assertEqual(push_bytes(f"fp32+pull={codec}"), (ALEXNET_FLOATS * 4, ALEXNET_FLOATS * 2))

    def test_onebit_is_a_scale_and_a_bit_per_element_per_chunk(self):
        chunks = sc.layout_chunks(alexnet(), 2)
        expected = sum(4 + math.ceil(c.count / 8) for c in chunks)
        self.assertEqual(push_bytes("onebit", servers=2)[0], expected)
        self.assertAlmostEqual(expected / (ALEXNET_FLOATS / 8), 1.0, places=3)

    def test_topk_sends_k_indices_and_values_per_chunk(self):
        chunks = sc.layout_chunks(alexnet(), 1)
        expected = sum(math.ceil(0.01 * c.count) * (4 + 4) for c in chunks)
        self.assertEqual(push_bytes("topk:0.01")[0], expected)
        self.assertAlmostEqual(expected / (0.01 * ALEXNET_FLOATS * 8), 1.0, places=2)
        self.assertEqual(push_bytes("topk:1")[0], ALEXNET_FLOATS * 8)  # k = n: indices double the bytes

    def test_factors_send_batch_times_out_plus_in_per_fc_layer(self):
        """One chunk per tensor (chunk_elems above fc6's size), one server: every fc weight is
        B × (out + in) floats; convolutions and biases stay dense."""
        big = 1 << 26
        fc = 128 * (4096 + 9216) + 128 * (4096 + 4096) + 128 * (1000 + 4096)
        self.assertEqual(push_bytes("factors", chunk_elems=big), ((CONV_WEIGHTS + BIASES + fc) * 4, ALEXNET_FLOATS * 4))
        self.assertEqual(CONV_WEIGHTS + BIASES + fc, 5748072)

    def test_factors_go_in_the_push_codecs_16_bits_and_f32_beside_topk(self):
        """docs/factors.md "The wire": fp16 / bf16 halve the factors as they halve the rest;
        top-k and 1-bit leave them f32."""
        big = 1 << 26
        fc = 128 * (4096 + 9216) + 128 * (4096 + 4096) + 128 * (1000 + 4096)
        for codec in ("fp16", "bf16"):
            self.assertEqual(push_bytes(f"factors+{codec}", chunk_elems=big)[0], (CONV_WEIGHTS + BIASES + fc) * 2)
        topk = push_bytes("factors+topk:0.01", chunk_elems=big)[0]
        self.assertEqual(topk - push_bytes("topk:0.01", chunk_elems=big)[0],
                         fc * 4 - sum(math.ceil(0.01 * n) * 8 for n in (4096 * 9216, 4096 * 4096, 1000 * 4096)))

    def test_factors_copy_the_activations_to_every_server_holding_the_layer(self):
        big = 1 << 26
        one, _ = push_bytes("factors", servers=1, chunk_elems=big)
        two, _ = push_bytes("factors", servers=2, chunk_elems=big)
        # At S=2 fc6 straddles the server boundary (server 0 ends at float 30,482,612 of the flat space).
        self.assertEqual(two - one, 128 * 9216 * 4 + 128 * 4, "activations once more, plus the split row")

    def test_factors_cut_alexnet_push_more_than_8x_at_batch_128(self):
        """The issue's target (S=2). At S=4 fc6 spans three servers, each getting its 128 × 9216
        activations: 7.1×, the price of the copies."""
        for servers, least in ((1, 10.5), (2, 8.7), (4, 7.0)):
            fp32, _ = push_bytes("fp32", servers)
            factors, _ = push_bytes("factors", servers)
            self.assertGreaterEqual(fp32 / factors, least, servers)
            self.assertLess(fp32 / factors, least + 0.2, servers)
        fp32, pull32 = push_bytes("fp32", 2)
        factors, pull16 = push_bytes("factors+pull=fp16", 2)
        self.assertGreaterEqual((fp32 + pull32) / (factors + pull16), 3.0)

    def test_factors_fall_back_to_dense_where_they_do_not_pay(self):
        """fmnist_small's fc2 (10×256) at batch 64: 64 × 266 factor floats > 2,560 dense."""
        tensors = sc.parse_tensors("fc1.weight 256x2304 1 1\nfc2.weight 10x256 1 1\n", "t")
        layers = sc.step_bytes(tensors, {}, 1, 64, sc.parse_codec("factors"))
        self.assertTrue(layers["fc1"].factored)
        self.assertEqual(layers["fc1"].push, 64 * (256 + 2304) * 4)
        self.assertFalse(layers["fc2"].factored)
        self.assertEqual(layers["fc2"].push, 10 * 256 * 4)

    def test_factors_at_many_servers_go_dense_where_the_activations_copies_outweigh_the_gradient(self):
        """The worker's rule (client/worker/factor_choice.h): the same floats as FactorWireFloats
        (tests/integration/factors_test.cc, FactorBytes.AlexNetsFc6OverManyServersCostsMoreAsFactorsThanDense)."""
        tensors = alexnet()
        fc6 = next(i for i, t in enumerate(tensors) if t.name == "fc6.weight")
        for servers, holders, floats in ((2, 2, 2888192), (64, 41, 48894976), (128, 81, 96086016)):
            mine = [c for c in sc.layout_chunks(tensors, servers) if c.tensor == fc6]
            self.assertEqual(sc.factor_plan(tensors[fc6], mine, 128), (floats, holders), servers)
        layers = sc.step_bytes(tensors, {}, 64, 128, sc.parse_codec("factors"))
        self.assertEqual([k for k, lb in layers.items() if lb.factored], ["fc7", "fc8"])
        self.assertEqual(push_bytes("factors", servers=128), push_bytes("fp32", servers=128))

    def test_only_inner_products_are_factored(self):
        tensors = sc.parse_tensors("emb.weight 4096x4096 1 1\n", "t")
        layers = sc.step_bytes(tensors, {"emb": "Embedding"}, 1, 8, sc.parse_codec("factors"))
        self.assertFalse(layers["emb"].factored)


def two_worker_case(**over):
    """One 1000×250 inner product (250,000 floats = 1 MB in fp32), forward 10 ms, backward 20 ms,
    batch 64; W = 2, S = 1 on a real 8 Gbit/s (= 1e9 B/s) link whose every bit is payload (a real
    Ethernet carries 1,448 of every 1,538 bytes: test_ethernet_framing_takes_its_share); no server
    cost unless given.
    Out of phase, the other workers' 1 MB a step each way loads the server's NIC by ~3% and slows
    each transfer by as much (< 0.1 ms: the tests below compare to 0.1 ms where it applies;
    test_a_busy_server_nic_slows_each_transfer has the exact figure)."""
    profile = sc.Profile([("fc", "InnerProduct", 0.010, 0.020)], batch=64, threads=0, device="gpu:0", source="hand")
    tensors = sc.parse_tensors("fc.weight 1000x250 1 1\n", "hand")
    rates = sc.Rates(**{"sgd_ns_per_float": 0.0, "server_ns_per_float": 0.0, **over.pop("rates", {})})
    codec = sc.parse_codec(over.pop("codec", "fp32"))
    cluster = sc.Cluster(**{"workers": 2, "servers": 1, "link_gbps": 8.0, "batch": 64, "payload": 1.0, **over})
    return sc.predict(profile, tensors, rates, cluster, codec)


class HandComputed(unittest.TestCase):
    def test_async_two_workers_out_of_phase_and_in_lockstep_on_the_server_link(self):
        """Out of phase (the default) each worker's 1 MB push and pull run at its own NIC's
        1e9 B/s, 1 ms each: 10 + 20 + 1 + 1 = 32 ms; 2 × 64 / 0.032 images/s; efficiency 30 / 32.
        The server host's NIC carries both workers' 1 MB each way in 2 ms a round, well within.
        In lockstep both move at once and share that NIC, 0.5e9 B/s each: 10 + 20 + 2 + 2 = 34 ms."""
        p = two_worker_case()
        self.assertEqual((p.push_bytes, p.pull_bytes), (1_000_000, 1_000_000))
        self.assertAlmostEqual(p.step_s, 0.032, delta=1e-4)
        self.assertAlmostEqual(p.images_per_s, 128 / 0.032, delta=10)
        self.assertAlmostEqual(p.efficiency, 0.030 / p.step_s, places=9)
        self.assertAlmostEqual(p.egress_s, 0.002, places=9)
        self.assertEqual(p.bound, "link")
        lockstep = two_worker_case(lockstep=True)
        self.assertAlmostEqual(lockstep.step_s, 0.034, places=9)
        self.assertEqual(lockstep.egress_s, 0.0)

    def test_a_busy_server_nic_slows_each_transfer(self):
        """W = 4 out of phase on one server host: while a worker's 1 MB part crosses the server's
        NIC the other three load it by 3 MB / t of a step t, so the part moves at L × (1 - 3/t)
        (ms, L = 1 MB/ms) and t = 30 + 2 / (1 - 3/t): t² - 35 t + 90 = 0, t = 32.206 ms. In
        lockstep the four share it at L / 4: 30 + 4 + 4 = 38 ms."""
        p = two_worker_case(workers=4)
        self.assertAlmostEqual(p.step_s, (35 + math.sqrt(35 ** 2 - 360)) / 2 * 1e-3, places=9)
        self.assertAlmostEqual(p.egress_s, 0.004, places=9)
        self.assertAlmostEqual(two_worker_case(workers=4, lockstep=True).step_s, 0.038, places=9)
        # One worker has nobody to share with.
        self.assertAlmostEqual(two_worker_case(workers=1).step_s, 0.032, places=9)

    def test_ethernet_framing_takes_its_share(self):
        """A real link carries 1,448 bytes of TCP payload per 1,538 of wire time (1,514 counted by
        tc tbf): one worker's 1 MB push and pull at 8 Gbit/s take 1 ms / 0.9415 each. The
        emulated pacer counts payload only."""
        one = two_worker_case(workers=1, payload=sc.ETHERNET_PAYLOAD)
        self.assertAlmostEqual(one.step_s, 0.030 + 2 * 1e-3 * 1538 / 1448, places=9)
        self.assertAlmostEqual(two_worker_case(workers=1, payload=sc.TBF_PAYLOAD).step_s,
                               0.030 + 2 * 1e-3 * 1514 / 1448, places=9)
        self.assertAlmostEqual(two_worker_case(workers=1, emulated=True, payload=0.5).step_s, 0.032, places=9)
        with self.assertRaisesRegex(dr.UsageError, "--payload 0: must be in"):
            two_worker_case(payload=0.0)

    def test_a_slow_server_bounds_the_step(self):
        """100 ns per float: 4 workers × 250,000 floats × 100 ns = 100 ms per round, more than a
        worker's own 57 ms (30 of compute; its 1 MB push and pull at 1e9 B/s, 1 ms each; 25 ms
        for the server to apply its push before it acknowledges it and serves the pull)."""
        rates = {"sgd_ns_per_float": 100.0, "server_ns_per_float": 100.0}
        p = two_worker_case(workers=4, rates=rates)
        self.assertAlmostEqual(p.worker_s, 0.057, delta=1e-4)
        self.assertAlmostEqual(p.step_s, 0.100, places=9)
        self.assertEqual(p.bound, "server")
        # With 2 workers the round (50 ms) is shorter than a worker's step with its push's apply
        # on its path: 10 + 20 + push 1 + apply 25 + pull 1 = 57 ms.
        two = two_worker_case(rates=rates)
        self.assertAlmostEqual(two.server_s, 0.050, places=9)
        self.assertAlmostEqual(two.step_s, 0.057, delta=1e-4)

    def test_a_push_is_acknowledged_after_its_apply_behind_the_queued_pull_replies(self):
        """The server's one loop thread applies a push, acknowledges it, then serves the pull that
        follows it; the ack goes back behind the pull replies already queued. One worker, two
        1 MB layers on one server at 1 ns per float (0.25 ms to apply a push), a real 1e9 B/s
        link."""
        profile = sc.Profile([("fc1", "InnerProduct", 0.010, 0.020), ("fc2", "InnerProduct", 0.010, 0.020)],
                             batch=64, threads=0, device="gpu:0", source="hand")
        tensors = sc.parse_tensors("fc1.weight 1000x250 1 1\nfc2.weight 1000x250 1 1\n", "hand")
        rates = sc.Rates(sgd_ns_per_float=1.0, server_ns_per_float=1.0)
        cluster = sc.Cluster(workers=1, servers=1, link_gbps=8.0, batch=64, payload=1.0)
        p = sc.predict(profile, tensors, rates, cluster, sc.parse_codec("fp32"))
        # Backward: fc2 ready at 40 ms (fwd 20 + its bwd 20), fc1 at 60. fc2: push 40 → 41,
        # applied 41.25, pull 41.25 → 42.25. fc1: push 60 → 61, applied 61.25 (after the queued
        # fc2 reply, long gone), ack 61.25; pull 61.25 → 62.25. Next forward waits for fc1's weights
        # at 62.25: the step is 62.25 ms.
        self.assertAlmostEqual(p.worker_s, 0.06225, places=9)
        # Acknowledged on delivery (the server free), it would be 62 ms: the apply is on the path.
        free = sc.predict(profile, tensors, sc.Rates(sgd_ns_per_float=0.0, server_ns_per_float=0.0), cluster,
                          sc.parse_codec("fp32"))
        self.assertAlmostEqual(free.worker_s, 0.062, places=9)

    def test_server_threads_divide_the_update_up_to_the_hosts_cores(self):
        """cluster.server_threads: the 50 ms round (2 × 250,000 floats × 100 ns) on 4 threads takes
        12.5 ms, and so does 8 on a 4-core server host; a worker's push is applied in 6.25 ms, so its
        step is 10 + 20 + 1 + 6.25 + 1 = 38.25 ms. The CPU the loop takes does not shrink."""
        rates = {"sgd_ns_per_float": 100.0, "server_ns_per_float": 100.0}
        self.assertAlmostEqual(two_worker_case(rates=rates).server_s, 0.050, places=9)
        for threads in (4, 8):
            p = two_worker_case(server_threads=threads, cores_per_host=4, rates=rates)
            self.assertAlmostEqual(p.server_s, 0.0125, places=9)
            self.assertAlmostEqual(p.step_s, 0.03825, delta=1e-4)
        self.assertAlmostEqual(two_worker_case(server_threads=8, rates=rates).server_s, 0.00625, places=9)
        one, four = (two_worker_case(server_threads=t, cores_per_host=8, colocated=True, emulated=True, rates=rates)
                     for t in (1, 4))
        self.assertAlmostEqual(one.host_cpu_s, four.host_cpu_s, places=12)
        self.assertGreater(one.host_cpu_s, 0)

    def test_factor_threads_divide_the_gemm(self):
        """compression.factor_threads: a push's δᵀa is 2 × 64 × 250,000 = 32 MFLOP, 32 ms at
        1 GFLOP/s; two workers' take 64 ms of the loop on one thread, 32 on two."""
        rates = {"sgd_ns_per_float": 0.0, "server_ns_per_float": 0.0, "server_gflops": 1.0}
        self.assertAlmostEqual(two_worker_case(codec="factors", rates=rates).server_s, 0.064, places=9)
        self.assertAlmostEqual(two_worker_case(codec="factors", factor_threads=2, rates=rates).server_s, 0.032,
                               places=9)

    def test_the_factor_expander_forms_the_product_beside_the_loop(self):
        """server/factor_expander.h: two workers' δᵀa (2 × 32 MFLOP at 1 GFLOP/s = 64 ms) on the
        expander and the loop's 2 × 250,000 floats at 40 ns (20 ms) overlap: the server keeps pace
        with the longer, 64 ms, not 84; on a shared host the CPU of both counts (84 ms of it).
        Slower floats (200 ns: 100 ms) make the loop the longer."""
        rates = {"sgd_ns_per_float": 40.0, "server_ns_per_float": 40.0, "server_gflops": 1.0}
        self.assertAlmostEqual(two_worker_case(codec="factors", rates=rates).server_s, 0.064, places=9)
        shared = two_worker_case(codec="factors", rates=rates, cores_per_host=1, colocated=True, emulated=True)
        plain = two_worker_case(codec="factors", rates={**rates, "server_gflops": 0.0}, cores_per_host=1,
                                colocated=True, emulated=True)
        self.assertAlmostEqual(shared.host_cpu_s - plain.host_cpu_s, 0.064, places=9)
        slow = {**rates, "sgd_ns_per_float": 200.0, "server_ns_per_float": 200.0}
        self.assertAlmostEqual(two_worker_case(codec="factors", rates=slow).server_s, 0.100, places=9)

    def test_lockstep_workers_wait_for_each_others_parts(self):
        """Emulated links, 4 ns per float (1 ms to apply a push). Out of phase: push 1 ms, apply 1,
        pull 1 (the server's own 1e9 B/s egress): 10 + 20 + 3 = 33 ms. In lockstep the server
        applies both workers' pushes (2 ms) and its egress carries both pulls (2 ms): 35 ms. One
        worker has nobody to wait for."""
        rates = {"sgd_ns_per_float": 4.0, "server_ns_per_float": 4.0}
        self.assertAlmostEqual(two_worker_case(emulated=True, rates=rates).step_s, 0.033, places=9)
        self.assertAlmostEqual(two_worker_case(emulated=True, lockstep=True, rates=rates).step_s, 0.035, places=9)
        self.assertAlmostEqual(two_worker_case(workers=1, emulated=True, lockstep=True, rates=rates).step_s, 0.033,
                               places=9)

    def test_sync_puts_the_apply_of_both_pushes_before_the_pull(self):
        """sync: push 1 ms, apply 2 × 250,000 × 2 ns = 1 ms, pull 1 ms: 10 + 20 + 1 + 1 + 1 = 33 ms."""
        p = two_worker_case(mode="sync", rates={"sgd_ns_per_float": 2.0, "server_ns_per_float": 2.0})
        self.assertAlmostEqual(p.step_s, 0.033, delta=1e-4)

    def test_emulated_links_pace_only_what_each_process_sends(self):
        """cluster.link_gbps on one host: the push runs at the worker's full 1e9 B/s (1 ms), the
        pull leaves the one server's paced egress at its full rate too (1 ms; the other worker's
        pull, out of phase, does not delay it while the egress has time to spare: 2 × 1 ms a
        round): 10 + 20 + 1 + 1 = 32 ms."""
        p = two_worker_case(emulated=True)
        self.assertAlmostEqual(p.step_s, 0.032, places=9)
        self.assertAlmostEqual(p.egress_s, 0.002, places=9)

    def test_emulated_pull_parts_come_from_each_servers_own_egress(self):
        """S = 2 on emulated links: the weight's halves (0.5 MB) leave the worker at 1e9 B/s, 0.5 ms
        each (30.5, 31.0 ms); each half's pull follows its push on that server's connection and is
        paced by that server's egress at 1e9 B/s, 0.5 ms: 31.0 and 31.5 ms."""
        self.assertAlmostEqual(two_worker_case(servers=2, emulated=True).step_s, 0.0315, places=9)

    def test_emulated_a_saturated_servers_egress_is_the_round(self):
        """40 workers pulling 1 MB each from one server's paced 1e9 B/s egress: 40 ms a round,
        longer than a worker's own 32 ms step, so the egress sets the round (bound: link)."""
        p = two_worker_case(workers=40, emulated=True)
        self.assertAlmostEqual(p.worker_s, 0.032, places=9)
        self.assertAlmostEqual(p.egress_s, 0.040, places=9)
        self.assertAlmostEqual(p.step_s, 0.040, places=9)
        self.assertEqual(p.bound, "link")
        # A real cluster out of phase: the server host's NIC carries the 40 pulls, the same round.
        # In lockstep the workers share it in their rates (link_rates) instead.
        self.assertAlmostEqual(two_worker_case(workers=40).egress_s, 0.040, places=9)
        self.assertEqual(two_worker_case(workers=40, lockstep=True).egress_s, 0.0)

    def test_an_idle_links_burst_credit_hides_a_short_transfer(self):
        """With 5 ms of credit the 1 ms push and the 2 ms pull of an otherwise idle link finish at
        once: the step is the 30 ms of compute. Without it (the model's default): 33 ms."""
        p = two_worker_case(emulated=True, link_burst_ms=5.0)
        self.assertAlmostEqual(p.step_s, 0.030, places=9)
        self.assertEqual(p.bound, "compute")

    def test_colocated_cpu_workers_stretch_to_the_hosts_cpu_round(self):
        """2 one-thread workers (30 ms each) and one server (2 × 250,000 floats × 100 ns = 50 ms per
        round) on 2 cores: (60 + 50) / 2 = 55 ms of CPU per round, so each worker's compute takes
        55 ms, and the communication it cannot hide comes on top: its 1 ms push, the server's
        25 ms apply of it before the ack and the pull, the 1 ms pull (the server's egress at its
        full rate: 2 ms of pulls a round leave it time to spare). A loader at 100 µs per image
        adds 64 × 0.1 ms per worker step: (2 × 36.4 + 50) / 2 = 61.4 ms."""
        profile, tensors, c, rates = colocated_fc_case(workers=2, servers=1, link_gbps=8.0)
        p = sc.predict(profile, tensors, rates, c, sc.parse_codec("fp32"))
        self.assertAlmostEqual(p.host_cpu_s, 0.055, places=9)
        self.assertAlmostEqual(p.compute_s, 0.055, places=9)
        self.assertGreater(p.step_s, 0.055)   # + push 1, apply 25, pull 1 ms
        self.assertAlmostEqual(p.step_s, 0.082, places=9)
        self.assertEqual(p.bound, "link")
        # On a link far faster, only the push's apply stays on the path: 55 + 25 ms.
        fast = sc.predict(profile, tensors, rates, dataclasses.replace(c, link_gbps=1e6), sc.parse_codec("fp32"))
        self.assertAlmostEqual(fast.step_s, 0.080, places=6)
        loaded = sc.predict(profile, tensors, dataclasses.replace(rates, loader_us_per_image=100.0), c,
                            sc.parse_codec("fp32"))
        self.assertAlmostEqual(loaded.host_cpu_s, 0.0614, places=9)
        # The transport's own CPU at 10 ns per byte: each worker's 1 MB push and 1 MB pull cost
        # 20 ms of the host's CPU beside the compute: (2 × (30 + 20) + 50) / 2 = 75 ms.
        io = sc.predict(profile, tensors, dataclasses.replace(rates, io_ns_per_byte=10.0), c, sc.parse_codec("fp32"))
        self.assertAlmostEqual(io.host_cpu_s, 0.075, places=9)
        # Not on a cluster's own hosts: there it runs on cores the model does not share out.
        apart = dataclasses.replace(c, colocated=False, cores_per_host=0)
        self.assertEqual(sc.predict(profile, tensors, dataclasses.replace(rates, io_ns_per_byte=10.0), apart,
                                    sc.parse_codec("fp32")).host_cpu_s, 0.0)

    def test_each_message_costs_the_loop_and_the_transport_beside_its_bytes(self):
        """Rates.msg_server_us / msg_io_us per chunk of a push + pull round. The fc's 250,000
        floats in chunks of 50,000 are 5 chunks a step: at 1,000 µs a chunk in the loop, one
        server's round of 2 workers gains 2 × 5 × 1 ms = 10 ms (50 → 60 ms), and a push's ack
        waits for its half, 2.5 ms. Outside the loops, 400 µs a chunk on a shared host adds
        2 × 5 × 0.4 = 4 ms to the host's CPU round: (60 + 60 + 4) / 2 = 62 ms."""
        profile, tensors, c, rates = colocated_fc_case(workers=2, servers=1, link_gbps=8.0)
        c = dataclasses.replace(c, chunk_elems=50_000)
        self.assertEqual(sum(sc.step_bytes(tensors, {}, 1, 64, sc.parse_codec("fp32"), 50_000)["fc"]
                             .chunks_by_server.values()), 5)
        plain = sc.predict(profile, tensors, rates, c, sc.parse_codec("fp32"))
        self.assertAlmostEqual(plain.server_s, 0.050, places=9)
        slow = sc.predict(profile, tensors, dataclasses.replace(rates, msg_server_us=1000.0), c, sc.parse_codec("fp32"))
        self.assertAlmostEqual(slow.server_s, 0.060, places=9)
        self.assertAlmostEqual(slow.host_cpu_s, (60 + 60) / 2 * 1e-3, places=9)
        both = sc.predict(profile, tensors, dataclasses.replace(rates, msg_server_us=1000.0, msg_io_us=400.0), c,
                          sc.parse_codec("fp32"))
        self.assertAlmostEqual(both.host_cpu_s, 0.062, places=9)
        # One chunk (the default chunk_elems): 2 ms of the loop a round, not 10.
        one = sc.predict(profile, tensors, dataclasses.replace(rates, msg_server_us=1000.0),
                         dataclasses.replace(c, chunk_elems=sc.DEFAULT_CHUNK_ELEMS), sc.parse_codec("fp32"))
        self.assertAlmostEqual(one.server_s, 0.052, places=9)

    def test_namespace_hosts_have_a_link_each_and_share_the_cores(self):
        """Every process on a namespace host of its own (downpour-scaling --netns): a worker's
        link is its own, 1e9 B/s each way even with 4 workers on the machine (emulated links
        would pace the pulls at the servers' egress only), while the 4 one-thread workers share
        the 2 cores: each computes at least 2× slower, as in --colocated. The server host's NIC
        carries 4 MB each way a round: 4 ms."""
        profile, tensors, c, rates = colocated_fc_case(workers=4, servers=1, link_gbps=8.0)
        netns = dataclasses.replace(c, emulated=False, workers_per_host=1, payload=1.0)
        self.assertEqual(sc.link_rates(netns, rates), (1e9, 1e9))
        self.assertEqual(sc.contention(netns, profile), 2.0)
        p = sc.predict(profile, tensors, rates, netns, sc.parse_codec("fp32"))
        self.assertAlmostEqual(p.egress_s, 0.004, places=9)
        self.assertGreaterEqual(p.compute_s, 0.060)
        self.assertGreater(p.host_cpu_s, 0.0)

    def test_a_burst_of_server_work_shares_the_cores_with_the_worker(self):
        """shared_host_step by hand: one one-thread worker of 20 ms on 2 cores, 16 ms of the
        servers' CPU per step. Packed perfectly, (20 + 16) / 2 = 18 ms < 20: no cost. As a burst of
        2 streams (2 servers) the scheduler runs 3 threads on 2 cores: the servers take 4/3 of a
        core for 16 / (4/3) = 12 ms, and the worker keeps 2/3 of its core: 4 ms lost, 24 ms."""
        step = sc.shared_host_step
        self.assertAlmostEqual(step(0.020, 0.016, threads=1, cores=2, streams=2, wait=0.0, window=0.004), 0.024)
        # One stream: the worker and the burst each have a core.
        self.assertAlmostEqual(step(0.020, 0.016, threads=1, cores=2, streams=1, wait=0.0, window=0.004), 0.020)
        # 5 ms of exposed waiting per step absorb 10 ms of the burst on both cores: 6 ms left, 1.5 lost.
        self.assertAlmostEqual(step(0.020, 0.016, threads=1, cores=2, streams=2, wait=0.005, window=0.004), 0.0215)
        # A burst paced over 16 ms by the link arrives at one core's rate: it fits beside the worker.
        self.assertAlmostEqual(step(0.020, 0.016, threads=1, cores=2, streams=2, wait=0.0, window=0.016), 0.020)
        # Workers' threads fill the cores: the perfectly packed round, (40 + 16) / 2.
        self.assertAlmostEqual(step(0.040, 0.016, threads=2, cores=2, streams=2, wait=0.0, window=0.004), 0.028)

    def test_colocated_one_worker_beside_two_servers_loses_their_burst(self):
        """One one-thread worker of 30 ms and 2 servers on 2 cores, links far faster than the
        CPU, the transport's CPU at 12.5 ns per byte: 2 MB a step, 25 ms of CPU, off the push's
        ack path (the servers' loops cost nothing here). The packed round (30 + 25) / 2 = 27.5 ms
        left the step at its 30 ms of compute; the burst of the two servers' streams takes
        25 / (4/3) = 18.75 ms at 4/3 of a core, during which the worker has 2/3 of its core:
        6.25 ms lost, a 36.25 ms step bound by the host's CPU."""
        profile, tensors, c, _ = colocated_fc_case(workers=1, servers=2, link_gbps=1e6)
        rates = sc.Rates(sgd_ns_per_float=0.0, server_ns_per_float=0.0, io_ns_per_byte=12.5)
        p = sc.predict(profile, tensors, rates, c, sc.parse_codec("fp32"))
        self.assertAlmostEqual(p.server_s, 0.0, places=9)
        self.assertAlmostEqual(p.compute_s, 0.03625, places=6)
        self.assertAlmostEqual(p.step_s, 0.03625, places=6)
        self.assertEqual(p.bound, "host cpu")
        # One server: its burst has the other core to itself.
        one = sc.predict(profile, tensors, rates, dataclasses.replace(c, servers=1), sc.parse_codec("fp32"))
        self.assertAlmostEqual(one.step_s, 0.030, places=6)
        self.assertEqual(one.bound, "compute")

    def test_the_write_ahead_log_costs_each_server_every_logged_float(self):
        """checkpoint.wal: the server appends both workers' 250,000 floats at 100 ns each before
        applying them (2 ns), four workers: 4 × 250,000 × 102 ns = 102 ms per round, more than a
        worker's 57.5 ms (30 + push 1 + its own push's 25.5 ms before the ack + pull 1). A push
        that came smaller is logged as it came (server/wal.h kCodedPush): 1-bit's 4 + 31,250 bytes
        are 7,813.5 floats' worth, so 4 × (250,000 × 2 + 7,813.5 × 100) ns; factors at batch 64
        log 64 × (1000 + 250) = 80,000 floats and form the product at 100 GFLOP/s (2 × 64 ×
        250,000 flops) on the factor expander beside the loop: 4 × (0.5 + 8) ms, the longer. Off, the
        rate is not charged."""
        rates = {"sgd_ns_per_float": 2.0, "server_ns_per_float": 2.0, "wal_ns_per_float": 100.0}
        p = two_worker_case(workers=4, wal=True, rates=rates)
        self.assertAlmostEqual(p.server_s, 0.102, places=9)
        self.assertAlmostEqual(p.worker_s, 0.0575, delta=1e-4)
        self.assertAlmostEqual(p.step_s, 0.102, places=9)
        self.assertEqual(p.bound, "server")
        self.assertAlmostEqual(two_worker_case(workers=4, wal=True, rates=rates, codec="onebit").server_s,
                               4 * (250_000 * 2 + (4 + 250_000 // 8) / 4 * 100) * 1e-9, places=9)
        self.assertAlmostEqual(two_worker_case(workers=4, wal=True, rates=rates, codec="factors").server_s,
                               4 * (0.5e-3 + 8e-3), places=9)
        self.assertAlmostEqual(two_worker_case(workers=4, rates=rates).server_s, 0.002, places=9)

    def test_sync_logs_every_push_before_it_applies_them(self):
        """sync with the log: the apply on the pull's path is 2 × 250,000 × (2 + 2) ns = 2 ms:
        10 + 20 + push 1 + 2 + pull 1 = 34 ms (33 without the log)."""
        rates = {"sgd_ns_per_float": 2.0, "server_ns_per_float": 2.0, "wal_ns_per_float": 2.0}
        self.assertAlmostEqual(two_worker_case(mode="sync", wal=True, rates=rates).step_s, 0.034, delta=1e-4)

    def test_a_slow_log_disk_bounds_the_step(self):
        """A server host whose disk writes 10 MB/s: both workers' 1 MB pushes take 200 ms to
        reach it, every round."""
        p = two_worker_case(wal=True, rates={"wal_ns_per_float": 0.0, "wal_disk_gbytes": 0.01})
        self.assertAlmostEqual(p.disk_s, 0.2, places=9)
        self.assertAlmostEqual(p.step_s, 0.2, places=9)
        self.assertEqual(p.bound, "disk")

    def test_colocated_the_logs_fsync_threads_take_host_cpu(self):
        """The colocated case below with the log on at 20 ns per float on the loop and 40 ns per
        float in the fsync thread: the server's loop is 2 × 250,000 × 120 ns = 60 ms, the fsync
        threads 2 × 250,000 × 40 ns = 20 ms: (60 + 60 + 20) / 2 = 70 ms of CPU per round."""
        profile = sc.Profile([("fc", "InnerProduct", 0.010, 0.020)], batch=64, threads=1, source="hand")
        tensors = sc.parse_tensors("fc.weight 1000x250 1 1\n", "hand")
        c = sc.Cluster(workers=2, servers=1, link_gbps=8.0, batch=64, workers_per_host=2, cores_per_host=2,
                       emulated=True, colocated=True, wal=True)
        rates = sc.Rates(sgd_ns_per_float=100.0, server_ns_per_float=100.0, wal_ns_per_float=20.0,
                         wal_sync_ns_per_float=40.0, io_ns_per_byte=0.0)
        p = sc.predict(profile, tensors, rates, c, sc.parse_codec("fp32"))
        self.assertAlmostEqual(p.server_s, 0.060, places=9)
        self.assertAlmostEqual(p.host_cpu_s, 0.070, places=9)
        self.assertAlmostEqual(p.compute_s, 0.070, places=9)

    def test_workers_sharing_a_host_share_its_nic(self):
        """Two workers per host on a real cluster with S = 2 server hosts: each worker gets half its
        NIC (0.5e9 B/s), like the servers' share. The weight is split over the two servers, and the
        pull of server 0's half follows its push on that connection while server 1's half is still
        being pushed: push 1 + 1 ms, pulls land at 32 and 33 ms: 33 ms. With 4 workers on one host
        (S = 4, a quarter each): 0.25e9 B/s, 4 parts of 1 ms each way, the last pull lands 1 ms
        after the last push: 30 + 4 + 1 = 35 ms."""
        self.assertAlmostEqual(two_worker_case(servers=2, workers_per_host=2).step_s, 0.033, places=9)
        p = two_worker_case(workers=4, servers=4, workers_per_host=4)
        self.assertAlmostEqual(p.step_s, 0.035, places=9)

    def test_no_overlap_pulls_everything_before_forward(self):
        """--no-overlap (async): the pull leaves at the end of backward, beside the push on the
        other direction: 10 + 20 + 1 = 31 ms."""
        self.assertAlmostEqual(two_worker_case(overlap=False).step_s, 0.031, delta=1e-4)

    def test_two_outstanding_steps_hide_the_round_trip_in_async_only(self):
        """worker.outstanding_steps = 2: forward waits for the pulls that follow the pushes of two
        steps back, long landed, so the async step is its compute, 30 ms, not 10 + 20 + 1 + 1;
        sync still waits for its round whatever k is."""
        self.assertAlmostEqual(two_worker_case(outstanding_steps=2).step_s, 0.030, places=9)
        self.assertAlmostEqual(two_worker_case(mode="sync", outstanding_steps=2).step_s,
                               two_worker_case(mode="sync").step_s, places=12)
        with self.assertRaisesRegex(dr.UsageError, "--outstanding-steps 0: must be in 1..16"):
            two_worker_case(outstanding_steps=0)

    def test_send_order_by_layer_lets_the_first_layer_overtake_within_the_window(self):
        """cluster.send_order = "layer": conv (forward 20 ms, backward 10 ms, 1 MiB) under fc
        (2 + 2 ms, 20 MiB), W = S = 1 on a link of 1 MiB a millisecond, async, k = 1, applies
        free; times from the end of forward; a window each way (pushes, pulls). Call order: fc's
        push runs 2-22, conv's gradient (12) waits behind it, 22-23; fc's pull lands 22-42 and
        conv's behind it at 43, where the next step's forward can start: 65 ms. By layer with a
        128 MiB window nothing waits to be handed over, so conv waits behind what is: fc in one
        message, 65 ms again; fc in 5 chunks of 4 MiB, each chunk's pull behind its push, conv's
        push 22-23 and its pull lands at 27, behind fc's: 49 ms. A 1 MiB window holds fc's one
        message alone (2-22) and its pull, handed over with it, holds the pull window until it
        lands (42): conv's push goes at 22 but its pull waits, 65 ms. With 5 chunks and 4 MiB
        (one push and one pull at a time): conv waits for the third chunk's push (10-14), goes
        14-15, its pull lands 15-16 before the third chunk's pull (16-20): 38 ms, compute + 4.
        8 MiB (two of each): conv waits behind the third and fourth chunks' pushes (to 18), 18-19,
        its pull lands at 20: 42 ms. With k = 2 by layer the step is its compute, 34 ms; in call
        order conv's acknowledgement still queues behind fc's pull on the way back, and conv's
        next backward waits for it (the push wait)."""
        profile = sc.Profile([("conv", "Convolution", 0.020, 0.010), ("fc", "InnerProduct", 0.002, 0.002)],
                             batch=64, threads=0, device="gpu:0", source="hand")
        tensors = sc.parse_tensors("conv.weight 262144 1 1\nfc.weight 5242880 1 1\n", "hand")
        rates = sc.Rates(sgd_ns_per_float=0.0, server_ns_per_float=0.0)

        def step(**over):
            c = sc.Cluster(**{"workers": 1, "servers": 1, "link_gbps": (1 << 20) * 1000 * 8 / 1e9, "payload": 1.0,
                              **over})
            return sc.predict(profile, tensors, rates, c, sc.parse_codec("fp32")).step_s

        one_message = {"send_order": "layer", "chunk_elems": 5242880}
        self.assertAlmostEqual(step(), 0.065, places=9)
        self.assertAlmostEqual(step(**one_message), 0.065, places=9)
        self.assertAlmostEqual(step(send_order="layer"), 0.049, places=9)
        self.assertAlmostEqual(step(**one_message, inflight_mb=1), 0.065, places=9)
        self.assertAlmostEqual(step(send_order="layer", inflight_mb=4), 0.038, places=9)
        self.assertAlmostEqual(step(send_order="layer", inflight_mb=8), 0.042, places=9)
        self.assertAlmostEqual(step(send_order="layer", inflight_mb=8, outstanding_steps=2), 0.034, places=9)
        self.assertGreater(step(outstanding_steps=2), 0.0345)
        with self.assertRaisesRegex(dr.UsageError, "--send-order fifo: expected one of call, layer"):
            step(send_order="fifo")
        with self.assertRaisesRegex(dr.UsageError, "--inflight-mb 0: must be > 0"):
            step(send_order="layer", inflight_mb=0)

    def test_layer_order_egress_hands_over_what_fits_and_never_overtakes_what_it_handed(self):
        """One link, 1e6 B/s, acknowledgements and pulls free (a push's bytes held until it is
        through, a pull's until its request is): layer 2's 8 MB in 4 chunks from 0 s, layer 0's
        1 MB ready at 3 s. A 4 MB window each way holds two chunks' pushes: chunks 0 and 1 go at
        0 s (0-2, 2-4 s), chunk 2 at 2 s (4-6 s); layer 0 waits for room (4 s), behind chunk 2
        (6-7 s), and overtakes chunk 3 (7-9 s). Each pull request leaves as its push is through.
        A window of everything: layer 0 waits behind all four (8-9 s). A 1 MB window sends each
        2 MB chunk alone on an empty window: layer 0 overtakes chunks 2 and 3 (4-5, then 5-7,
        7-9 s)."""
        def run(window):
            return sc.layer_order_egress([(2, 0, 8e6, 8e6, 0.0, 4), (0, 0, 1e6, 1e6, 3.0, 1)], 0.0, lambda j: 1e6,
                                         window, lambda j, server, share, delivered: delivered,
                                         lambda j, server, share, through, pushed: through)

        at, free = run(4e6)
        self.assertEqual({k: [tuple(round(x, 9) for x in d) for d in v] for k, v in at.items()},
                         {(2, 0): [(2.0, 2.0), (4.0, 4.0), (6.0, 6.0), (9.0, 9.0)], (0, 0): [(7.0, 7.0)]})
        self.assertEqual(free, 9.0)
        at, _ = run(100e6)
        self.assertEqual([round(d, 9) for d, _ in at[(0, 0)]], [9.0])
        at, free = run(1e6)
        self.assertEqual([round(d, 9) for d, _ in at[(2, 0)]], [2.0, 4.0, 7.0, 9.0])
        self.assertEqual([round(d, 9) for d, _ in at[(0, 0)]], [5.0])
        self.assertEqual(free, 9.0)

    def test_pull_every_amortizes_a_blocking_pull(self):
        """pull_every 4: 30 ms compute + the 1 ms pull / 4; the 1 ms push hides under compute."""
        p = two_worker_case(pull_every=4)
        self.assertAlmostEqual(p.step_s, 0.03025, delta=1e-4)

    def test_cpu_workers_sharing_cores_compute_slower(self):
        profile = sc.Profile([("fc", "InnerProduct", 0.010, 0.020)], batch=64, threads=1, source="hand")
        tensors = sc.parse_tensors("fc.weight 1000x250 1 1\n", "hand")
        rates = sc.Rates(sgd_ns_per_float=0.0, server_ns_per_float=0.0)
        c = sc.Cluster(workers=4, servers=4, link_gbps=1000.0, batch=64, workers_per_host=4, cores_per_host=2)
        p = sc.predict(profile, tensors, rates, c, sc.parse_codec("fp32"))
        self.assertAlmostEqual(p.compute_s, 0.060, places=9)  # 4 one-thread workers on 2 cores: 2×
        self.assertAlmostEqual(p.solo_compute_s, 0.030, places=9)
        self.assertLess(p.efficiency, 0.51)


class MoreServersNeverSlower(unittest.TestCase):
    def test_step_time_never_grows_with_servers(self):
        """For the dense codecs and the compressed pushes, in every mode, at 1 to 25 Gbit/s. Top-k
        and 1-bit gain a few bytes per extra chunk (ceil(k) and the scale), hence the 1e-4."""
        profile = sc.parse_time_json(alexnet_time(), "t")
        for codec in ("fp32", "fp16", "bf16+pull=bf16", "topk:0.01", "onebit+pull=fp16"):
            for mode in ("async", "sync"):
                for link in (1.0, 10.0, 25.0):
                    for w in (1, 2, 4, 8, 16):
                        steps = [sc.predict(profile, alexnet(), sc.Rates(), sc.Cluster(w, s, link, mode, batch=128),
                                            sc.parse_codec(codec)).step_s for s in (1, 2, 3, 4, 8, 16)]
                        for a, b in zip(steps, steps[1:]):
                            self.assertLessEqual(b, a * (1 + 1e-4), (codec, mode, link, w, steps))

    def test_with_factors_only_the_activation_copies_can_cost(self):
        """Sufficient factors send a layer's activations to every server holding it, so at one
        worker a second server adds bytes; with the activations' bytes at zero (a 1-row input)
        more servers are never slower there either."""
        profile = sc.Profile([("fc", "InnerProduct", 0.010, 0.020)], batch=8, threads=0, device="gpu:0")
        tensors = sc.parse_tensors("fc.weight 4000000x1 1 1\n", "t")
        steps = [sc.predict(profile, tensors, sc.Rates(), sc.Cluster(4, s, 10.0, batch=8),
                            sc.parse_codec("fp32")).step_s for s in (1, 2, 4)]
        self.assertEqual(steps, sorted(steps, reverse=True))


class Codecs(unittest.TestCase):
    def test_names_parse_and_map_to_the_run_config(self):
        c = sc.parse_codec("factors+pull=fp16")
        self.assertEqual((c.factors, c.push, c.pull), (True, "fp32", "fp16"))
        self.assertEqual(c.config_sets(), ["compression.factors=true", 'compression.push="fp32"',
                                           'compression.pull="fp16"'])
        t = sc.parse_codec("topk:0.05")
        self.assertIn("compression.top_k_fraction=0.05", t.config_sets())
        back = sc.codec_from_config({"compression": {"factors": True, "push": "topk", "top_k_fraction": 0.05,
                                                     "pull": "bf16"}})
        self.assertEqual((back.factors, back.push, back.top_k_fraction, back.pull), (True, "topk", 0.05, "bf16"))
        self.assertEqual(sc.codec_from_config({}).name, "fp32")

    def test_bad_codecs_name_the_flag_and_the_token(self):
        for text, message in (("fp8", "unknown codec 'fp8'"), ("topk:0", "must be in (0, 1]"),
                              ("topk:1.5", "must be in (0, 1]"), ("topk:x", "is not a number"),
                              ("fp16+bf16", "two push codecs"), ("pull=fp8", "unknown pull codec"),
                              ("onebit:3", "takes no argument"), ("", "empty codec")):
            with self.subTest(text=text):
                with self.assertRaises(dr.UsageError) as e:
                    sc.parse_codec(text)
                self.assertIn("--codec", str(e.exception))
                self.assertIn(message, str(e.exception))


BENCH_OUTPUT = """model: AlexNet tensors, 60965224 floats (243.9 MB) each way per round
S=1 W=1 chunks=69 | downpour: 4.97 rounds/s/worker 2.42 GB/s | bare zmq: 4.10 rounds/s/worker 2.00 GB/s | ratio 121% \
| pushes recv/applied/rejected 69/69/0
S=1 W=1 downpour (tcp, max 4 chunks/message, 0 via shared memory) parts: push p50 1 ms \
| server sgd 0.061 s/round (30% of wall per server), loop busy 0.122 s/round (60%)
"""
# The same benchmark with --wal, appended to the plain run's output.
BENCH_WAL_OUTPUT = """model: AlexNet tensors, 60965224 floats (243.9 MB) each way per round
S=1 W=1 chunks=69 | downpour: 0.85 rounds/s/worker 0.41 GB/s | bare zmq: 0.58 rounds/s/worker 0.28 GB/s | ratio 146% \
| pushes recv/applied/rejected 621/621/0 | wal records 621 (fsync 200 ms)
S=1 W=1 downpour (tcp, max 1 chunks/message, 0 via shared memory) parts: push p50/p99 492.0/742.7 ms (n=414) \
| server sgd 0.046 s/round (4% of wall per server), loop busy 1.076 s/round (91%), wal append 0.860 s/round, \
wal fsync thread cpu 0.017 s/round
"""


class CommandLine(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory(prefix="downpour-scaling-")
        self.tmp = self._tmp.name
        self.time = os.path.join(self.tmp, "time.json")
        with open(self.time, "w") as f:
            json.dump(alexnet_time(), f)
        self.tensors = os.path.join(self.tmp, "tensors.txt")
        with open(self.tensors, "w") as f:
            f.write(ALEXNET_TENSORS)

    def tearDown(self):
        self._tmp.cleanup()

    def scaling(self, *args):
        return fab.run_tool("downpour-scaling", "--time", self.time, "--tensors", self.tensors, *args)

    def test_json_rows_per_grid_point_and_the_answer(self):
        r = self.scaling("-w", "1,8", "-s", "1,4", "-l", "10,25", "-c", "fp32,factors+pull=fp16", "-b", "128",
                         "--target", "0.8", "--json")
        self.assertEqual(r.returncode, 0, r.stderr)
        out = json.loads(r.stdout)
        self.assertEqual(len(out["predictions"]), 2 * 2 * 2 * 2)
        first = out["predictions"][0]
        self.assertEqual((first["workers"], first["servers"], first["link_gbps"], first["codec"]), (1, 1, 10.0, "fp32"))
        self.assertEqual(first["push_bytes"], ALEXNET_FLOATS * 4)
        self.assertEqual(len(out["answers"]), 2 * 2 * 2)
        self.assertAlmostEqual(out["profile"]["compute_ms"], 20.0, places=6)

    def test_table_and_png(self):
        png = os.path.join(self.tmp, "eff.png")
        r = self.scaling("-w", "1,2,4", "-s", "2", "-l", "10", "-c", "fp32,onebit", "--png", png, "--target", "0.5")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("| W | S | link Gbit/s | mode | codec |", r.stdout)
        self.assertIn("smallest S with efficiency >= 50%", r.stdout)
        if shutil.which("gnuplot"):
            with open(png, "rb") as f:
                self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")

    def test_step_ms_rescales_the_profile(self):
        r = self.scaling("-w", "1", "-s", "1", "-l", "1000", "--step-ms", "40", "--json", "--sgd-ns-per-float", "0",
                         "--server-ns-per-float", "0")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertAlmostEqual(json.loads(r.stdout)["profile"]["compute_ms"], 40.0, places=6)

    def test_run_dir_gives_tensors_and_settings(self):
        run = os.path.join(self.tmp, "run")
        fab.write_config(run, mode="sync", workers=2, servers=2)
        with open(os.path.join(run, "config.toml"), "a") as f:
            f.write("\n[compression]\nfactors = true\npull = \"fp16\"\nfactor_threads = 3\n")
        with open(os.path.join(run, "config.toml")) as f:
            text = f.read().replace("[cluster]\n", "[cluster]\nlink_gbps = 10.0\nserver_threads = 4\n"
                                         "send_order = \"layer\"\ninflight_mb = 16\n")
        with open(os.path.join(run, "config.toml"), "w") as f:
            f.write(text)
        shutil.copy(self.tensors, os.path.join(run, "tensors.txt"))
        r = fab.run_tool("downpour-scaling", "--time", self.time, "--run-dir", run, "--json")
        self.assertEqual(r.returncode, 0, r.stderr)
        (row,) = json.loads(r.stdout)["predictions"]
        self.assertEqual((row["workers"], row["servers"], row["mode"], row["link_gbps"], row["batch"], row["codec"]),
                         (2, 2, "sync", 10.0, fab.BATCH, "factors+pull=fp16"))
        self.assertEqual((row["server_threads"], row["factor_threads"], row["lockstep"]), (4, 3, False))
        self.assertEqual((row["send_order"], row["inflight_mb"]), ("layer", 16))
        r = fab.run_tool("downpour-scaling", "--time", self.time, "--run-dir", run, "--json", "--server-threads", "2",
                         "--lockstep", "--send-order", "call", "--inflight-mb", "8")
        self.assertEqual(r.returncode, 0, r.stderr)
        (row,) = json.loads(r.stdout)["predictions"]
        self.assertEqual((row["server_threads"], row["factor_threads"], row["lockstep"]), (2, 3, True))
        self.assertEqual((row["send_order"], row["inflight_mb"]), ("call", 8))

    def test_rates_from_the_load_benchmark(self):
        bench = os.path.join(self.tmp, "bench.txt")
        with open(bench, "w") as f:
            f.write(BENCH_OUTPUT)
        rates = sc.rates_from_bench(BENCH_OUTPUT, bench)
        self.assertAlmostEqual(rates.sgd_ns_per_float, 0.061 / ALEXNET_FLOATS * 1e9)
        self.assertAlmostEqual(rates.server_ns_per_float, 0.122 / ALEXNET_FLOATS * 1e9)
        self.assertAlmostEqual(rates.transport_gbytes, 1.21)
        r = self.scaling("-w", "1", "-s", "1", "-l", "10", "--rates-from-bench", bench, "--json")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertAlmostEqual(json.loads(r.stdout)["rates"]["transport_gbytes"], 1.21)
        self.assertIn("write-ahead log rates: defaults", rates.source)
        self.assertEqual(rates.wal_ns_per_float, sc.Rates().wal_ns_per_float)
        self.assertIn("transport CPU per byte: default", rates.source)

    def test_transport_cpu_per_byte_from_the_load_benchmarks_process_cpu(self):
        """'process cpu' less the loop's busy time, over the round's 8 bytes per float."""
        text = BENCH_OUTPUT.replace("loop busy 0.122 s/round (60%)", "loop busy 0.122 s/round (60%), process cpu 1.098 s/round")
        rates = sc.rates_from_bench(text, "bench.txt")
        self.assertAlmostEqual(rates.io_ns_per_byte, (1.098 - 0.122) / (ALEXNET_FLOATS * 8) * 1e9)
        self.assertAlmostEqual(rates.server_ns_per_float, 0.122 / ALEXNET_FLOATS * 1e9)
        self.assertNotIn("transport CPU per byte: default", rates.source)

    def test_the_loop_beside_the_update_and_the_cost_per_message_from_a_small_chunk_run(self):
        """Output that says 'beside the update' (the update on apply lanes): the loop's time is
        the update's plus the loop's own. A second plain run at smaller chunks: what grows with
        the chunks, not the bytes, per chunk of a round; the per-byte rates are the large run's
        less its own 69 chunks' share."""
        big = ("S=1 W=1 chunks=69 | downpour: 6.41 rounds/s/worker 3.13 GB/s | bare zmq: x\n"
               "S=1 W=1 downpour (tcp, max 1 chunks/message, 0 via shared memory) parts: x | server sgd 0.024 "
               "s/round (16% of wall per server), loop busy 0.009 s/round (6%) beside the update, process cpu "
               "0.220 s/round\n")
        small = ("S=1 W=1 chunks=3730 | downpour: 4.13 rounds/s/worker 2.01 GB/s | bare zmq: x\n"
                 "S=1 W=1 downpour (tcp, max 1 chunks/message, 0 via shared memory) parts: x | server sgd 0.027 "
                 "s/round (11% of wall per server), loop busy 0.028 s/round (11%) beside the update, process cpu "
                 "0.377 s/round\n")
        alone = sc.rates_from_bench(big, "b.txt")
        self.assertAlmostEqual(alone.server_ns_per_float, (0.024 + 0.009) / ALEXNET_FLOATS * 1e9)
        self.assertAlmostEqual(alone.io_ns_per_byte, (0.220 - 0.009 - 0.024) / (ALEXNET_FLOATS * 8) * 1e9)
        self.assertEqual((alone.msg_server_us, alone.msg_io_us), (0.0, 0.0))
        for text in (big + small, small + big):  # in either order
            rates = sc.rates_from_bench(text, "b.txt")
            msg_loop = (0.028 - 0.009) / (3730 - 69)
            msg_io = ((0.377 - 0.028 - 0.027) - (0.220 - 0.009 - 0.024)) / (3730 - 69)
            self.assertAlmostEqual(rates.msg_server_us, msg_loop * 1e6)
            self.assertAlmostEqual(rates.msg_io_us, msg_io * 1e6)
            self.assertAlmostEqual(rates.server_ns_per_float, (0.024 + 0.009 - 69 * msg_loop) / ALEXNET_FLOATS * 1e9)
            self.assertAlmostEqual(rates.io_ns_per_byte,
                                   (0.220 - 0.009 - 0.024 - 69 * msg_io) / (ALEXNET_FLOATS * 8) * 1e9)
            self.assertAlmostEqual(rates.transport_gbytes, 3.13 / 2)  # the large chunks' ceiling
            self.assertIn("per message: chunks=69 against chunks=3730", rates.source)

    def test_rates_of_the_log_from_a_wal_run_of_the_load_benchmark(self):
        """The log's rates from the --wal run's server line; the rest from the plain run's lines
        (the --wal run's loop includes the appends and moves fewer GB/s). A --wal run alone: its
        loop less the appends, its GB/s, and the source says so."""
        rates = sc.rates_from_bench(BENCH_OUTPUT + BENCH_WAL_OUTPUT, "bench.txt")
        self.assertAlmostEqual(rates.wal_ns_per_float, 0.860 / ALEXNET_FLOATS * 1e9)
        self.assertAlmostEqual(rates.wal_sync_ns_per_float, 0.017 / ALEXNET_FLOATS * 1e9)
        self.assertAlmostEqual(rates.server_ns_per_float, 0.122 / ALEXNET_FLOATS * 1e9)
        self.assertAlmostEqual(rates.transport_gbytes, 1.21)
        alone = sc.rates_from_bench(BENCH_WAL_OUTPUT, "wal.txt")
        self.assertAlmostEqual(alone.server_ns_per_float, (1.076 - 0.860) / ALEXNET_FLOATS * 1e9)
        self.assertAlmostEqual(alone.sgd_ns_per_float, 0.046 / ALEXNET_FLOATS * 1e9)
        self.assertAlmostEqual(alone.transport_gbytes, 0.205)
        self.assertIn("transport ceiling from a run with the log on", alone.source)

    def test_wal_follows_the_run_unless_the_flag_says(self):
        """--run-dir: the run's checkpoint.wal (a config without it has the log on); --wal
        overrides; with neither the log is off."""
        run = os.path.join(self.tmp, "run")
        fab.write_config(run, mode="async", workers=2, servers=2)
        with open(os.path.join(run, "config.toml")) as f:
            text = f.read().replace("[cluster]\n", "[cluster]\nlink_gbps = 10.0\n")
        with open(os.path.join(run, "config.toml"), "w") as f:
            f.write(text)
        shutil.copy(self.tensors, os.path.join(run, "tensors.txt"))

        def wal_of(*args):
            r = fab.run_tool("downpour-scaling", "--time", self.time, *args, "--json")
            self.assertEqual(r.returncode, 0, r.stderr)
            return json.loads(r.stdout)["predictions"][0]

        self.assertTrue(wal_of("--run-dir", run)["wal"])
        off = wal_of("--run-dir", run, "--wal", "off")
        self.assertFalse(off["wal"])
        self.assertGreater(wal_of("--run-dir", run)["server_ms"], off["server_ms"])
        with open(os.path.join(run, "config.toml"), "a") as f:
            f.write("\n[checkpoint]\nwal = false\n")
        self.assertFalse(wal_of("--run-dir", run)["wal"])
        self.assertFalse(wal_of("--tensors", self.tensors, "-w", "1", "-l", "10")["wal"])
        self.assertTrue(wal_of("--tensors", self.tensors, "-w", "1", "-l", "10", "--wal", "on")["wal"])

    def assert_usage(self, r, *parts):
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertTrue(r.stderr.startswith("downpour-scaling: "), r.stderr)
        self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
        for part in parts:
            self.assertIn(part, r.stderr)

    def test_bad_input_is_one_line_naming_the_flag_and_exit_2(self):
        self.assert_usage(self.scaling("-w", "1", "-l", "10", "-c", "fp32,zstd"), "--codec", "unknown codec 'zstd'")
        self.assert_usage(self.scaling("-w", "0", "-l", "10"), "--workers 0: must be >= 1")
        self.assert_usage(self.scaling("-l", "10", "--netns", "--colocated"), "--netns: every process has a shaped link")
        self.assert_usage(self.scaling("-w", "1", "-s", "0", "-l", "10"), "--servers 0: must be >= 1")
        self.assert_usage(self.scaling("-w", "1", "-l", "0"), "--link-gbps 0: must be > 0")
        self.assert_usage(self.scaling("-w", "1", "-l", "-5"), "--link-gbps -5: must be > 0")
        self.assert_usage(self.scaling("-w", "1", "-l", "10", "-c", "topk:2"), "--codec", "must be in (0, 1]")
        self.assert_usage(self.scaling("-w", "x", "-l", "10"), "--workers 'x'")
        self.assert_usage(self.scaling("-w", "1", "-l", "10", "--mode", "bsp"), "--mode 'bsp'")
        self.assert_usage(self.scaling("-w", "1", "-l", "10", "--target", "1.5"), "--target 1.5")
        self.assert_usage(self.scaling("-w", "1", "-l", "10", "--server-threads", "0"),
                          "--server-threads 0: must be in 1..64")
        self.assert_usage(self.scaling("-w", "1", "-l", "10", "--factor-threads", "65"),
                          "--factor-threads 65: must be in 1..64")
        self.assert_usage(self.scaling("-w", "1", "-l", "10", "--inflight-mb", "0"), "--inflight-mb 0: must be > 0")
        self.assert_usage(self.scaling("-w", "1"), "--link-gbps: required")
        self.assert_usage(fab.run_tool("downpour-scaling", "--tensors", self.tensors, "-l", "1"), "--time: required")
        self.assert_usage(fab.run_tool("downpour-scaling", "--time", self.time, "-l", "1"), "--tensors")
        self.assert_usage(self.scaling("-l", "1", "--rates", os.path.join(self.tmp, "nope.json")), "--rates",
                          "no such file")

    def test_bad_files_name_the_file(self):
        with open(self.time, "w") as f:
            json.dump({"layers": []}, f)
        self.assert_usage(self.scaling("-l", "1"), self.time)
        with open(self.tensors, "w") as f:
            f.write("fc6.weight 4096xQ 1 1\n")
        self.assert_usage(fab.run_tool("downpour-scaling", "--time", self.time, "--tensors", self.tensors, "-l", "1"),
                          f"{self.tensors}:1")

    def test_time_and_tensors_of_different_models_are_refused(self):
        with open(self.tensors, "w") as f:
            f.write("conv9.weight 3x3 1 1\n")
        self.assert_usage(self.scaling("-l", "1"), "conv9", "different models")


class ValidateCorun(unittest.TestCase):
    """scaling_validate.corun_profile: a worker measured computing `factor` slower beside the
    others is predicted with every layer that much slower; GPU (threads 0) workers are not."""

    def test_the_factor_scales_every_layer(self):
        sys.path.insert(0, os.path.join(fab.ROOT, "bench", "train"))
        try:
            import scaling_validate as sv
        finally:
            sys.path.remove(os.path.join(fab.ROOT, "bench", "train"))
        cpu = sc.Profile([("a", "Convolution", 0.010, 0.020), ("b", "InnerProduct", 0.001, 0.002)], batch=64,
                         threads=1, source="hand")
        slow = sv.corun_profile(cpu, 1.25)
        self.assertAlmostEqual(slow.compute_s, 1.25 * cpu.compute_s, places=12)
        self.assertAlmostEqual(slow.layers[1][3], 0.0025, places=12)
        self.assertIs(sv.corun_profile(cpu, 1.0), cpu)
        gpu = dataclasses.replace(cpu, threads=0)
        self.assertIs(sv.corun_profile(gpu, 1.5), gpu)


class ValidateRepeats(unittest.TestCase):
    """bench/train/scaling_validate.py --repeats N: every prediction before any job, the grid run N
    times pass after pass, a row's measured figure the median of its jobs with their range, the
    error against that median. The jobs are stubbed (what they return is set here)."""

    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory(prefix="downpour-validate-")
        sys.path.insert(0, os.path.join(fab.ROOT, "bench", "train"))
        import scaling_validate
        self.sv = scaling_validate
        self.saved = {n: getattr(self.sv, n) for n in ("time_profile", "tensors_of", "data_sets", "sgemm_ceiling",
                                                       "run_job", "corun_factors")}
        self.sv.corun_factors = lambda args, net, base, profile, workers, path=None: {}
        self.events = []
        # The grid's profile: 20 ms a step; --retime's, one per job: 4, 1, 2, 8, 3, 5 s (compute-bound).
        self.retimes = iter([4000.0, 1000.0, 2000.0, 8000.0, 3000.0, 5000.0])

        def time_profile(args, net, base, repeats=3, path=None):
            step = 20.0 if path is None else next(self.retimes)
            self.events.append(("time", step))
            return sc.parse_time_json(alexnet_time(batch=64, step_ms=step), "t"), "t"
        self.sv.time_profile = time_profile
        self.sv.tensors_of = lambda args, net, base: (alexnet(), "x")
        self.sv.data_sets = lambda args, net: []
        self.sv.sgemm_ceiling = lambda args: None
        self.calls = []
        self.orders = []
        # W = 1 then W = 2 in each pass; three passes.
        self.measured = iter([10.0, 5.0, 30.0, 7.0, 20.0, 6.0])

        def run_job(args, net, index, w, s, link, codec, data, repeat=0, order=("call", None)):
            self.calls.append((w, repeat, index))
            self.orders.append(order)
            self.events.append(("job", w))
            m = next(self.measured)
            return f"{args.work}/w{w}-r{repeat}", {"images_per_s": m / 2}, m
        self.sv.run_job = run_job

    def tearDown(self):
        for n, f in self.saved.items():
            setattr(self.sv, n, f)
        sys.path.remove(os.path.join(fab.ROOT, "bench", "train"))
        self._tmp.cleanup()

    def test_median_of_passes_with_the_range(self):
        argv = sys.argv
        sys.argv = ["scaling_validate.py", "--nets", "alexnet", "--workers", "1,2", "--links", "10",
                    "--repeats", "3", "--network", "pacer", "--work", self._tmp.name]
        try:
            with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet):
                self.sv.main()
        finally:
            sys.argv = argv
        # Pass after pass: W=1, W=2 of pass 1, then of pass 2, then of pass 3; ports never reused.
        self.assertEqual([(w, r) for w, r, _ in self.calls], [(1, 0), (2, 0), (1, 1), (2, 1), (1, 2), (2, 2)])
        self.assertEqual([i for _, _, i in self.calls], list(range(6)))
        with open(os.path.join(self._tmp.name, "validation.json")) as f:
            out = json.load(f)
        self.assertEqual(out["repeats"], 3)
        one, two = out["rows"]
        self.assertEqual((one["measured_images_per_s"], one["measured_min"], one["measured_max"]), (20.0, 10.0, 30.0))
        self.assertEqual((two["measured_images_per_s"], two["measured_min"], two["measured_max"]), (6.0, 5.0, 7.0))
        self.assertEqual(one["run_dir"], f"{self._tmp.name}/w1-r2")   # the job whose figure is the median
        self.assertEqual(one["whole_run_images_per_s"], 10.0)
        self.assertAlmostEqual(one["error"], one["predicted_images_per_s"] / 20.0 - 1)
        self.assertEqual([r["measured_images_per_s"] for r in one["runs"]], [10.0, 30.0, 20.0])
        with open(os.path.join(self._tmp.name, "validation.md")) as f:
            table = f.read()
        self.assertIn("median of 3 runs", table)
        self.assertIn("| 10.0–30.0 |", table)

    def test_retime_predicts_each_job_from_its_own_timing_before_it_runs(self):
        argv = sys.argv
        sys.argv = ["scaling_validate.py", "--nets", "alexnet", "--workers", "1,2", "--links", "0",
                    "--repeats", "3", "--retime", "--network", "pacer", "--work", self._tmp.name]
        out = io.StringIO()
        try:
            with contextlib.redirect_stdout(out):
                self.sv.main()
        finally:
            sys.argv = argv
        # The grid's profile once, then a timing right before every job.
        self.assertEqual([e for e, _ in self.events], ["time"] + ["time", "job"] * 6)
        with open(os.path.join(self._tmp.name, "validation.json")) as f:
            result = json.load(f)
        self.assertTrue(result["retime"])
        one, two = result["rows"]
        # Each job's re-timed prediction is the model's at that job's step time.
        base = self.sv.load_base("alexnet")
        for row, steps in ((one, (4000.0, 2000.0, 3000.0)), (two, (1000.0, 8000.0, 5000.0))):
            expect = [self.sv.predict(sc.parse_time_json(alexnet_time(batch=64, step_ms=ms), "t"), alexnet(),
                                      sc.Rates(), base, row["workers"], 2, 0, sc.parse_codec("fp32"),
                                      os.cpu_count() or 1).images_per_s for ms in steps]
            got = [r["retimed_predicted_images_per_s"] for r in row["runs"]]
            for g, e in zip(got, expect):
                self.assertAlmostEqual(g, e)
            self.assertAlmostEqual(row["retimed_predicted_images_per_s"], sorted(expect)[1])
            self.assertAlmostEqual(row["retimed_error"], sorted(expect)[1] / row["measured_images_per_s"] - 1)
        # The grid's prediction (20 ms) stays beside it; each re-timed one is printed before its job
        # (no link: the step is compute, so each timing moves its prediction).
        self.assertNotAlmostEqual(two["predicted_images_per_s"], two["retimed_predicted_images_per_s"])
        text = out.getvalue()
        self.assertEqual(text.count("re-timed (4000.0 ms alone)"), 1)  # the first job's timing
        self.assertLess(text.index("re-timed (4000.0 ms alone)"), text.index("measured alexnet W=1"))
        with open(os.path.join(self._tmp.name, "validation.md")) as f:
            self.assertIn("re-timed prediction img/s (median)", f.read())

    def test_send_orders_make_a_row_each_with_its_own_prediction(self):
        """--send-orders call,layer --inflight-mb 16: each cell's jobs in both orders, the layer
        job told its window, each row predicted in its own order (AlexNet at 1 Gbit/s: by layer
        the next forward's weights come first, so it predicts more images/s)."""
        argv = sys.argv
        self.measured = iter([10.0, 12.0])
        sys.argv = ["scaling_validate.py", "--nets", "alexnet", "--workers", "1", "--links", "1",
                    "--send-orders", "call,layer", "--inflight-mb", "16", "--network", "pacer", "--work", self._tmp.name]
        try:
            with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet):
                self.sv.main()
        finally:
            sys.argv = argv
        self.assertEqual(self.orders, [("call", None), ("layer", 16)])
        with open(os.path.join(self._tmp.name, "validation.json")) as f:
            call, layer = json.load(f)["rows"]
        self.assertEqual((call["send_order"], call["inflight_mb"]), ("call", None))
        self.assertEqual((layer["send_order"], layer["inflight_mb"]), ("layer", 16))
        self.assertGreater(layer["predicted_images_per_s"], call["predicted_images_per_s"])
        with open(os.path.join(self._tmp.name, "validation.md")) as f:
            table = f.read()
        self.assertIn("| call |", table)
        self.assertIn("| layer 16 MiB |", table)
        for bad, what in ((["--send-orders", "fifo"], "unknown order 'fifo'"), (["--inflight-mb", "0"], "--inflight-mb 0")):
            sys.argv = ["scaling_validate.py", *bad, "--work", self._tmp.name]
            try:
                with self.assertRaises(SystemExit) as e:
                    self.sv.main()
            finally:
                sys.argv = argv
            self.assertIn(what, str(e.exception.code))

    def test_repeats_below_one_is_refused(self):
        argv = sys.argv
        sys.argv = ["scaling_validate.py", "--repeats", "0", "--work", self._tmp.name]
        try:
            with self.assertRaises(SystemExit) as e:
                self.sv.main()
        finally:
            sys.argv = argv
        self.assertIn("--repeats 0", str(e.exception.code))


if __name__ == "__main__":
    unittest.main()
