"""downpour_scaling — the scaling model behind tools/downpour-scaling (docs/scaling.md).

Predicts a job's step time, images/s and scaling efficiency for W workers, S servers, a link
speed, a consistency mode and a wire codec, from
  - per-layer compute times on the user's device (`downpour-time --json`),
  - the model's learnable tensors (`tensors.txt`, as downpour-worker --write-tensors writes it),
  - transport rates measured by the load benchmark (Rates: the servers' update and loop time
    per float, their write-ahead log's time per float, the transport's own ceiling, the server's
    GEMM rate for sufficient factors).

Pure functions over plain data, no I/O except the readers at the bottom; every error is a
downpour_runs.UsageError naming the flag or file and field (the tool exits 2 on it).

Units inside: seconds, bytes, floats. Link speeds are given in Gbit/s (1 Gbit/s = 1e9/8 B/s).
"""
import dataclasses
import json
import math
import os
import re

import downpour_runs as dr

FLOAT_BYTES = 4
PUSH_CODECS = ("fp32", "fp16", "bf16", "topk", "onebit")
PULL_CODECS = ("fp32", "fp16", "bf16")
DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}
MODES = ("async", "sync", "ssp")
SEND_ORDERS = ("call", "layer")  # cluster.send_order
DEFAULT_CHUNK_ELEMS = 1 << 20  # common/layout.h kDefaultChunkElems
# The share of a real link's bits that carries TCP payload: Ethernet with a 1,500-byte MTU sends
# 1,448 payload bytes (1,500 less 20 of IP, 20 of TCP and 12 of TCP timestamps) per 1,538 bytes
# of wire time (14 of header, 4 of FCS, 8 of preamble, 12 of inter-frame gap). tc tbf on a veth
# (hosts made of namespaces) counts the 1,514 bytes of the frame it queues. The emulated pacer
# counts payload bytes (its messages' frames): 1.
ETHERNET_PAYLOAD = 1448 / 1538
TBF_PAYLOAD = 1448 / 1514
# An emulated link's idle credit the model assumes: none. The pacer's 5 ms burst
# (common/rate_limiter.h kDefaultBurst) exists to absorb late wake-ups and millisecond polls, which
# spend it; over back-to-back sends the rate is the set one (docs/scaling.md).
DEFAULT_LINK_BURST_MS = 0.0
CODEC_HELP = ("fp32 | fp16 | bf16 | topk:F | onebit, optionally with factors and pull=fp16|bf16, "
              "joined by '+': e.g. factors, factors+pull=fp16, topk:0.01, onebit+pull=bf16")


# ---------------------------------------------------------------------------------------------
# Codecs: what one name means on the wire and in a run config ([compression], docs/config.md).

@dataclasses.dataclass(frozen=True)
class Codec:
    name: str
    factors: bool = False        # compression.factors
    push: str = "fp32"           # compression.push
    top_k_fraction: float = 0.01  # compression.top_k_fraction (push = topk)
    pull: str = "fp32"           # compression.pull

    def config_sets(self):
        """The run-config overrides (`--set` arguments) that select this codec."""
        sets = [f"compression.factors={'true' if self.factors else 'false'}", f'compression.push="{self.push}"',
                f'compression.pull="{self.pull}"']
        if self.push == "topk":
            sets.append(f"compression.top_k_fraction={self.top_k_fraction:g}")
        return sets


def parse_codec(text, flag="--codec"):
    """'factors+pull=fp16' → Codec. Tokens joined by '+': at most one push codec (fp32, fp16,
    bf16, topk:F with F in (0, 1], onebit), 'factors', at most one pull=fp32|fp16|bf16."""
    if not isinstance(text, str) or not text.strip():
        raise dr.UsageError(f"{flag} {text!r}: empty codec; expected {CODEC_HELP}")
    factors, push, fraction, pull = False, None, 0.01, None
    for token in text.strip().split("+"):
        token = token.strip()
        if token == "factors":
            if factors:
                raise dr.UsageError(f"{flag} {text!r}: 'factors' given twice")
            factors = True
        elif token.startswith("pull="):
            value = token[len("pull="):]
            if value not in PULL_CODECS:
                raise dr.UsageError(f"{flag} {text!r}: unknown pull codec {value!r} (expected one of "
                                    f"{', '.join(PULL_CODECS)})")
            if pull is not None:
                raise dr.UsageError(f"{flag} {text!r}: two pull codecs")
            pull = value
        else:
            name, _, arg = token.partition(":")
            if name not in PUSH_CODECS:
                raise dr.UsageError(f"{flag} {text!r}: unknown codec {token!r}; expected {CODEC_HELP}")
            if push is not None:
                raise dr.UsageError(f"{flag} {text!r}: two push codecs ({push} and {name})")
            if name == "topk":
                try:
                    fraction = float(arg) if arg else 0.01
                except ValueError:
                    raise dr.UsageError(f"{flag} {text!r}: topk fraction {arg!r} is not a number") from None
                if not (0 < fraction <= 1) or not math.isfinite(fraction):
                    raise dr.UsageError(f"{flag} {text!r}: topk fraction {fraction:g} must be in (0, 1]")
            elif arg:
                raise dr.UsageError(f"{flag} {text!r}: codec {name} takes no argument")
            push = name
    return Codec(text.strip(), factors, push or "fp32", fraction, pull or "fp32")


def codec_from_config(config):
    """The codec a run config's [compression] table selects (absent keys: the lossless default)."""
    c = config.get("compression", {})
    push = c.get("push", "fp32")
    parts = (["factors"] if c.get("factors") else []) + \
        [f"topk:{c.get('top_k_fraction', 0.01):g}" if push == "topk" else push] + \
        ([f"pull={c['pull']}"] if c.get("pull", "fp32") != "fp32" else [])
    if parts[0] == "factors" and parts[1] == "fp32":
        parts.pop(1)
    return parse_codec("+".join(parts), "[compression] in the run config")


def wal_from_config(config):
    """A run config's checkpoint.wal (absent: on, the run config's default, docs/config.md)."""
    return bool(config.get("checkpoint", {}).get("wal", True))


# ---------------------------------------------------------------------------------------------
# Tensors and the parameter layout (common/layout.cc, replicated exactly).

@dataclasses.dataclass(frozen=True)
class Tensor:
    name: str
    shape: tuple

    @property
    def numel(self):
        return math.prod(self.shape)

    @property
    def layer(self):
        return self.name.rsplit(".", 1)[0]


def parse_tensors(text, where):
    """tensors.txt: '<name> <AxBx...> <lr_mult> <decay_mult>' per line, '#' comments."""
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        fields = line.split()
        try:
            shape = tuple(int(d) for d in fields[1].split("x"))
        except (IndexError, ValueError):
            raise dr.UsageError(f"{where}:{n}: expected '<name> <AxBx...> ...', got {line!r}") from None
        if not shape or min(shape) < 1:
            raise dr.UsageError(f"{where}:{n}: tensor {fields[0]} has a dimension < 1")
        out.append(Tensor(fields[0], shape))
    if not out:
        raise dr.UsageError(f"{where}: no tensors")
    return out


@dataclasses.dataclass(frozen=True)
class Chunk:
    tensor: int        # index into the tensor list
    offset: int        # first float within its tensor
    count: int
    server: int


def layout_chunks(tensors, servers, chunk_elems=DEFAULT_CHUNK_ELEMS):
    """The chunks of ParamLayout::Build: server s owns flat [s*N/S, (s+1)*N/S); each server's
    range is cut into near-equal pieces of <= chunk_elems that never straddle a tensor."""
    offsets = [0]
    for t in tensors:
        offsets.append(offsets[-1] + t.numel)
    n = offsets[-1]
    chunks, t = [], 0
    for s in range(servers):
        pos, end = n * s // servers, n * (s + 1) // servers
        while pos < end:
            while offsets[t + 1] <= pos:
                t += 1
            seg_end = min(end, offsets[t + 1])
            seg_len = seg_end - pos
            pieces = -(-seg_len // chunk_elems)
            for i in range(pieces):
                b, e = pos + seg_len * i // pieces, pos + seg_len * (i + 1) // pieces
                chunks.append(Chunk(t, b - offsets[t], e - b, s))
            pos = seg_end
    return chunks


# ---------------------------------------------------------------------------------------------
# Bytes per worker step.

@dataclasses.dataclass
class LayerBytes:
    """One layer's traffic per worker step (all its tensors)."""
    floats: int = 0         # learnable floats (dense gradient size = weights pulled)
    push: int = 0           # bytes a worker sends
    pull: int = 0           # bytes a worker receives
    factored: bool = False  # sufficient factors used for its weight
    factor_flops: float = 0.0  # server GEMM flops to form deltaᵀ·a (per push, all servers)
    push_by_server: dict = dataclasses.field(default_factory=dict)  # {server: push bytes}
    pull_by_server: dict = dataclasses.field(default_factory=dict)  # {server: pull bytes}
    # {server: chunks}: a worker pushes and pulls each chunk as one message of its own
    # (PsClientOptions::max_chunks_per_message = 1)
    chunks_by_server: dict = dataclasses.field(default_factory=dict)
    # bytes the servers' write-ahead logs append per push of it: per message the smaller of what
    # the wire carried and the f32 gradient (server/wal.h kCodedPush; the log's own record
    # headers, a few dozen bytes a message, are left out)
    logged: int = 0


def is_inner_product(tensor, layer_types):
    """A 2-D '<layer>.weight' whose layer is an InnerProduct (from the time JSON's types; without
    them, any 2-D weight: the engine's only 2-D parameters are inner products)."""
    if len(tensor.shape) != 2 or not tensor.name.endswith(".weight"):
        return False
    kind = layer_types.get(tensor.layer)
    return kind is None or kind == "InnerProduct"


def factor_plan(tensor, chunks, batch, by_server=None):
    """(factor floats, servers holding the weight) for sufficient factors of an out×in weight:
    each chunk carries batch × (the rows it touches) of delta, and every server holding a chunk of
    it gets the layer's input activations (batch × in) once. by_server (a dict), when given,
    receives each server's share of those floats."""
    out_dim, in_dim = tensor.shape
    delta = 0
    holders = set()
    for c in chunks:
        first_row, last_row = c.offset // in_dim, (c.offset + c.count - 1) // in_dim
        rows = batch * (last_row - first_row + 1)
        delta += rows
        if by_server is not None:
            by_server[c.server] = by_server.get(c.server, 0) + rows + (0 if c.server in holders else batch * in_dim)
        holders.add(c.server)
    return delta + batch * in_dim * len(holders), len(holders)


def dense_push_bytes(count, codec):
    if codec.push in DTYPE_BYTES:
        return count * DTYPE_BYTES[codec.push]
    if codec.push == "topk":  # k uint32 indices + k f32 values (messages.capnp topK)
        k = max(1, math.ceil(codec.top_k_fraction * count))
        return k * (4 + FLOAT_BYTES)
    return FLOAT_BYTES + -(-count // 8)  # onebit: an f32 scale + one sign bit per element


def factor_value_bytes(codec):
    """Bytes of one factor value: the push codec's 16 bits for fp16 / bf16, else f32 (top-k and
    1-bit apply to dense chunks only; docs/factors.md "The wire")."""
    return DTYPE_BYTES[codec.push] if codec.push in ("fp16", "bf16") else FLOAT_BYTES


def step_bytes(tensors, layer_types, servers, batch, codec, chunk_elems=DEFAULT_CHUNK_ELEMS):
    """{layer: LayerBytes} for one worker step, layers in tensor order. Sufficient factors are used
    for an inner-product weight only where they are fewer floats than the dense gradient (the
    worker's rule, docs/config.md compression.factors); biases and everything else go dense."""
    chunks = layout_chunks(tensors, servers, chunk_elems)
    by_tensor = {}
    for c in chunks:
        by_tensor.setdefault(c.tensor, []).append(c)
    layers = {}
    for i, t in enumerate(tensors):
        lb = layers.setdefault(t.layer, LayerBytes())
        mine = by_tensor.get(i, [])
        lb.floats += t.numel
        lb.pull += t.numel * DTYPE_BYTES[codec.pull]
        for c in mine:
            lb.pull_by_server[c.server] = lb.pull_by_server.get(c.server, 0) + c.count * DTYPE_BYTES[codec.pull]
            lb.chunks_by_server[c.server] = lb.chunks_by_server.get(c.server, 0) + 1
        if codec.factors and is_inner_product(t, layer_types):
            shares = {}
            floats, _ = factor_plan(t, mine, batch, shares)
            if floats < t.numel:
                value = factor_value_bytes(codec)
                lb.push += floats * value
                dense_on = {}
                for c in mine:
                    dense_on[c.server] = dense_on.get(c.server, 0) + c.count
                for server, n in shares.items():
                    lb.push_by_server[server] = lb.push_by_server.get(server, 0) + n * value
                    lb.logged += min(n * value, dense_on[server] * FLOAT_BYTES)
                lb.factored = True
                lb.factor_flops += 2.0 * batch * t.numel
                continue
        for c in mine:
            n = dense_push_bytes(c.count, codec)
            lb.push += n
            lb.push_by_server[c.server] = lb.push_by_server.get(c.server, 0) + n
            lb.logged += min(n, c.count * FLOAT_BYTES)
    return layers


# ---------------------------------------------------------------------------------------------
# Compute profile and rates.

@dataclasses.dataclass
class Profile:
    """Per-layer compute of one training step at `batch` on one worker (forward order)."""
    layers: list            # [(name, type, forward_s, backward_s)]
    batch: int
    threads: int            # CPU threads the timing used; 0 = a GPU
    device: str = "cpu"
    source: str = ""

    @property
    def compute_s(self):
        return sum(f + b for _, _, f, b in self.layers)

    def types(self):
        return {name: kind for name, kind, _, _ in self.layers}


def parse_time_json(data, where):
    """downpour-time --json → Profile."""
    try:
        layers = [(str(l["layer"]), str(l["type"]), float(l["forward_ms"]) / 1e3, float(l["backward_ms"]) / 1e3)
                  for l in data["layers"]]
        batch = int(data["batch"])
    except (KeyError, TypeError, ValueError) as e:
        raise dr.UsageError(f"{where}: not a downpour-time --json object ({e!r} missing or bad)") from None
    if not layers or batch < 1:
        raise dr.UsageError(f"{where}: no layers or batch < 1")
    if any(f < 0 or b < 0 or not math.isfinite(f + b) for _, _, f, b in layers):
        raise dr.UsageError(f"{where}: a layer time is negative or not finite")
    device = str(data.get("device") or "cpu")
    threads = 0 if device.startswith("gpu") else int(data.get("threads") or 1)
    return Profile(layers, batch, threads, device, where)


def scaled_profile(profile, batch=None, step_ms=None):
    """The profile at another batch (times scale linearly with the batch: an assumption, fine for
    GEMM-bound layers at batches >= 32) and/or rescaled so forward + backward = step_ms (e.g. a
    GPU step time from elsewhere with this profile's layer proportions)."""
    factor = 1.0
    if batch is not None and batch != profile.batch:
        factor *= batch / profile.batch
    if step_ms is not None:
        factor = step_ms / 1e3 / profile.compute_s
    layers = [(n, k, f * factor, b * factor) for n, k, f, b in profile.layers]
    return dataclasses.replace(profile, layers=layers, batch=batch or profile.batch)


@dataclasses.dataclass(frozen=True)
class Rates:
    """Transport and server rates (docs/scaling.md "Rates"). Defaults: bench/RESULTS.md §10, the
    quiet 2-core VM over shared memory at S=1, W=1 (the server loop's time per round, and the
    share of it in SgdUpdate); server_gflops is half §2 / §10's 2-thread sgemm (one thread)."""
    sgd_ns_per_float: float = 0.55       # server: update rule per pushed float
    server_ns_per_float: float = 1.4     # server: whole message loop per float of a push+pull round (incl. sgd)
    transport_gbytes: float = 0.0        # software ceiling of one process, GB/s per direction; 0 = none
    server_gflops: float = 100.0         # server GEMM rate for sufficient factors (one thread)
    latency_ms: float = 0.0              # per-layer request latency (round trip)
    loader_us_per_image: float = 0.0     # worker: data loader CPU per image (downpour-bench-data's
    #                                      images per CPU-second, inverted); 0 = not measured
    # checkpoint.wal (Cluster.wal): a server appends every push it takes to its log, as the wire
    # carried it where that is smaller than the f32 gradient (factors, lossy codecs), else as the
    # gradient (server/wal.h). Per logged float (4 bytes): the loop's append (CRC-32 and write(2)
    # into the page cache), and the CPU of the log's fsync thread beside it.
    # Default: downpour-bench-ps --servers 1 --workers 1 --rounds 6 --wal on a 2-core VM (its
    # "wal append" and "wal fsync thread cpu" per round over the round's floats, docs/scaling.md
    # "Inputs"; a virtualized guest whose page-cache writes are slow): measure yours.
    wal_ns_per_float: float = 14.1
    wal_sync_ns_per_float: float = 0.28
    wal_disk_gbytes: float = 0.0         # a server host's sustained log write rate, GB/s; 0 = not a limit
    # The transport's CPU per payload byte outside the servers' loops: both ends' ZeroMQ I/O
    # threads and kernel, the client's threads. Paid on a shared host (colocated) beside the
    # jobs' compute; elsewhere on cores of its own. downpour-bench-ps --servers 1 --workers 1
    # --rounds 6 over loopback TCP on a 2-core VM: process cpu less the loop's busy time, over
    # the round's 60,965,224 × 8 bytes (docs/scaling.md "Inputs"; less through shared memory,
    # --transport shm).
    io_ns_per_byte: float = 2.08
    # The CPU a message costs beside its bytes, per chunk of a push + pull round (a worker's push
    # and pull of one chunk: two requests, two replies): the servers' loops (receive, decode,
    # dispatch, reply), and the rest of the transport (both ends' I/O threads and kernel, the
    # client's threads; counted on a shared host only). From a load benchmark at small chunks
    # beside the usual one (rates_from_bench); 0 = not measured. Small models (fmnist: ~10 chunks
    # of ~0.3 MB a step) pay it on every message, AlexNet's 4 MiB chunks hardly.
    msg_server_us: float = 0.0
    msg_io_us: float = 0.0
    source: str = "defaults (bench/RESULTS.md §10, quiet VM, shared memory)"

    @property
    def handling_ns_per_byte(self):
        """The loop's non-update work per payload byte (receive, validate, copy, reply): the
        round moves 8 bytes per float (4 in, 4 out)."""
        return max(0.0, self.server_ns_per_float - self.sgd_ns_per_float) / (2 * FLOAT_BYTES)


RATE_KEYS = {f.name for f in dataclasses.fields(Rates)} - {"source"}


def rates_from_json(data, where):
    unknown = sorted(set(data) - RATE_KEYS - {"source", "comment"})
    if unknown:
        raise dr.UsageError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(sorted(RATE_KEYS))})")
    values = {}
    for k in RATE_KEYS & set(data):
        v = data[k]
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < 0:
            raise dr.UsageError(f"{where}: {k} = {v!r}: must be a number >= 0")
        values[k] = float(v)
    return Rates(**values, source=str(data.get("source", where)))


BENCH_ALEXNET_FLOATS = 60965224  # downpour-bench-ps moves bvlc_alexnet's tensors
_BENCH_RATE = re.compile(r"^S=(\d+) W=(\d+) chunks=(\d+).*\| downpour: ([\d.]+) rounds/s/worker ([\d.]+) GB/s")
_BENCH_SERVER = re.compile(r"^S=(\d+) W=(\d+) downpour \(.*server sgd ([\d.]+) s/round .*loop busy ([\d.]+) s/round")
_BENCH_WAL = re.compile(r"wal append ([\d.]+) s/round, wal fsync thread cpu ([\d.]+) s/round")
_BENCH_CPU = re.compile(r"process cpu ([\d.]+) s/round")
# Output of builds whose update runs on apply lanes says "loop busy ... beside the update" (the
# loop's own work); older output's "loop busy" included the update.
_BENCH_BESIDE = "beside the update"


@dataclasses.dataclass
class _BenchRun:
    """One downpour-bench-ps result (its rate line and its server line), per worker-round."""
    chunks: int
    gbs: float
    sgd: float = None       # the update rule, s
    other: float = None     # the loop's own work, update excluded, s
    io: float = None        # the process's CPU less the loop's and the update's, s (None: not printed)
    wal: tuple = None       # (append s, fsync thread CPU s): a run with the log on


def _bench_runs(text, servers, workers):
    runs, pending = [], None
    for line in text.splitlines():
        line = line.strip()
        m = _BENCH_RATE.match(line)
        if m and (int(m[1]), int(m[2])) == (servers, workers):
            pending = _BenchRun(chunks=int(m[3]), gbs=float(m[5]))
            continue
        m = _BENCH_SERVER.match(line)
        if m and (int(m[1]), int(m[2])) == (servers, workers) and pending is not None:
            sgd, busy = float(m[3]), float(m[4])
            w = _BENCH_WAL.search(line)
            if w:
                pending.wal = (float(w[1]), float(w[2]))
                busy -= pending.wal[0]
            other = busy if _BENCH_BESIDE in line else max(0.0, busy - sgd)
            pending.sgd, pending.other = sgd, other
            c = _BENCH_CPU.search(line)
            if c:
                pending.io = max(0.0, float(c[1]) - other - sgd)
            runs.append(pending)
            pending = None
    return runs


def per_message_split(cost_big, chunks_big, cost_small, chunks_small):
    """(cost per chunk, cost_big less its own chunks' share) from the same bytes measured at two
    chunk counts (chunks_small > chunks_big): what the smaller chunks add, over the chunks they
    add, is what a message costs; a negative difference (noise) counts as none."""
    per_chunk = max(0.0, (cost_small - cost_big) / (chunks_small - chunks_big))
    return per_chunk, max(0.0, cost_big - chunks_big * per_chunk)


def rates_from_bench(text, where, servers=1, workers=1):
    """Rates from `downpour-bench-ps --servers S --workers W` output (S=1, W=1 by default), each
    result a line 'S=.. W=.. chunks=N | downpour: ... GB/s' and its 'server sgd ... loop busy ...
    process cpu ...' line (seconds per worker-round, summed over the servers; a round is
    60,965,224 floats each way): the update and the loop's time per float, the transport's
    ceiling (GB/s both directions, all workers → per direction per worker) and the transport's CPU
    per byte (the process's CPU less the loops' and the update's).

    Several results, appended to one file:
      - a run with --wal gives the log's rates (its 'wal append ... wal fsync thread cpu ...');
        without one they keep their defaults, named in the source;
      - a second plain run at another --chunk-elems (more, smaller messages for the same floats)
        gives the cost per message: the loop's and the transport's CPU that grow with the number
        of chunks, not the bytes, per chunk of a push + pull round (msg_server_us, msg_io_us),
        and the per-byte rates are then the large-chunk run's less its own chunks' share.
    The plain run with the fewest chunks gives the per-float rates and the ceiling; a run with the
    log on stands in for it when there is none (its loop less the appends), and the source says
    so."""
    runs = _bench_runs(text, servers, workers)
    plain = sorted((r for r in runs if r.wal is None), key=lambda r: r.chunks)
    logged = [r for r in runs if r.wal is not None]
    if not runs:
        raise dr.UsageError(f"{where}: no downpour-bench-ps result lines for S={servers} W={workers} "
                            "(run build/bench/ps/downpour-bench-ps --servers 1 --workers 1 --rounds 10 > FILE)")
    source = f"{where} (S={servers} W={workers})"
    base = plain[0] if plain else logged[0]
    if not plain:
        source += "; transport ceiling from a run with the log on"
    small = plain[-1] if len(plain) > 1 and plain[-1].chunks > plain[0].chunks else None

    def split(big_cost, small_cost):  # (per chunk, the large run's cost less its chunks' share)
        if small is None or small_cost is None:
            return 0.0, big_cost
        return per_message_split(big_cost, base.chunks, small_cost, small.chunks)
    if small is not None:
        source += f"; per message: chunks={base.chunks} against chunks={small.chunks}"
    floats = BENCH_ALEXNET_FLOATS
    msg_server, loop_bytes = split(base.other, small.other if small else None)
    values = dict(sgd_ns_per_float=base.sgd / floats * 1e9,
                  server_ns_per_float=(base.sgd + loop_bytes) / floats * 1e9,
                  transport_gbytes=base.gbs / (2 * workers),
                  msg_server_us=msg_server * 1e6)
    if base.io is not None:  # per byte of the round: 4 in and 4 out per float
        msg_io, io_bytes = split(base.io, small.io if small else None)
        values.update(io_ns_per_byte=io_bytes / (floats * 2 * FLOAT_BYTES) * 1e9, msg_io_us=msg_io * 1e6)
    else:
        source += "; transport CPU per byte: default (no 'process cpu' in the output)"
    if logged:
        values.update(wal_ns_per_float=logged[0].wal[0] / floats * 1e9,
                      wal_sync_ns_per_float=logged[0].wal[1] / floats * 1e9)
    else:
        source += "; write-ahead log rates: defaults (no --wal run)"
    return Rates(**values, source=source)


# ---------------------------------------------------------------------------------------------
# The model.

@dataclasses.dataclass(frozen=True)
class Cluster:
    workers: int
    servers: int
    link_gbps: float
    mode: str = "async"          # async | sync | ssp (ssp:s is predicted as async: see docs/scaling.md)
    batch: int = 64
    workers_per_host: int = 1
    cores_per_host: int = 0      # 0 = enough cores (no contention)
    servers_per_host: int = 1
    emulated: bool = False       # cluster.link_gbps on one host: per-process egress limits only
    colocated: bool = False      # every process on one host of cores_per_host cores (this VM)
    overlap: bool = True         # async/ssp pull overlapped with backward (downpour-worker default)
    chunk_elems: int = DEFAULT_CHUNK_ELEMS
    pull_every: int = 1          # worker.pull_every: a whole (blocking) pull before every n-th step
    push_every: int = 1          # worker.push_every: one push (mean gradient) per n steps
    # worker.outstanding_steps: k > 1 lets an async step compute without its own last k - 1 steps'
    # pushes (forward does not wait for their pulls); sync and ssp wait whatever k is.
    outstanding_steps: int = 1
    # cluster.send_order: "call" (a worker's egress first in, first out) or "layer" (the waiting
    # part of the lowest layer next, chunk by chunk: the next forward's weights first).
    send_order: str = "call"
    # cluster.inflight_mb: MiB a worker keeps unanswered on each connection (by layer: what a
    # lower layer's push can no longer overtake, and below bandwidth × round trip an idle link).
    inflight_mb: float = 128.0
    link_burst_ms: float = 0.0   # emulated: the pacer's credit of an idle link (common/rate_limiter.h
    #                              kDefaultBurst = 5 ms); 0 = a link that saves no credit
    wal: bool = False            # checkpoint.wal: every server logs every push before applying it
    # Async workers in lockstep (identical, fast workers whose servers bound the step: they push at
    # once, each server applies their pushes interleaved and its egress carries their pulls side by
    # side): a worker's part waits for all W (docs/scaling.md "Lockstep"). False: out of phase.
    lockstep: bool = False
    server_threads: int = 1      # cluster.server_threads: a shard's update spread over threads
    factor_threads: int = 1      # compression.factor_threads: a shard's δᵀa GEMMs spread over threads
    # Real links: the share of link_gbps that carries payload (ETHERNET_PAYLOAD; TBF_PAYLOAD on
    # hosts made of namespaces); emulated links ignore it (the pacer counts payload).
    payload: float = ETHERNET_PAYLOAD

    @property
    def payload_bytes_per_s(self):
        """One link's payload B/s: link_gbps at the payload share (emulated: all of it)."""
        return self.link_gbps * 1e9 / 8 * (1.0 if self.emulated else self.payload)


def check_cluster(c):
    """One UsageError naming the flag for impossible settings."""
    checks = [(c.workers >= 1, f"--workers {c.workers}: must be >= 1"),
              (c.servers >= 1, f"--servers {c.servers}: must be >= 1"),
              (c.link_gbps > 0 and math.isfinite(c.link_gbps), f"--link-gbps {c.link_gbps:g}: must be > 0"),
              (c.batch >= 1, f"--batch {c.batch}: must be >= 1"),
              (c.workers_per_host >= 1, f"--workers-per-host {c.workers_per_host}: must be >= 1"),
              (c.cores_per_host >= 0, f"--cores-per-host {c.cores_per_host}: must be >= 0"),
              (c.servers_per_host >= 1, f"--servers-per-host {c.servers_per_host}: must be >= 1"),
              (c.pull_every >= 1, f"--pull-every {c.pull_every}: must be >= 1"),
              (c.push_every >= 1, f"--push-every {c.push_every}: must be >= 1"),
              (1 <= c.outstanding_steps <= 16, f"--outstanding-steps {c.outstanding_steps}: must be in 1..16"),
              (c.send_order in SEND_ORDERS, f"--send-order {c.send_order}: expected one of {', '.join(SEND_ORDERS)}"),
              (c.inflight_mb > 0, f"--inflight-mb {c.inflight_mb:g}: must be > 0"),
              (c.link_burst_ms >= 0 and math.isfinite(c.link_burst_ms),
               f"--link-burst-ms {c.link_burst_ms:g}: must be >= 0"),
              (1 <= c.server_threads <= 64, f"--server-threads {c.server_threads}: must be in 1..64"),
              (1 <= c.factor_threads <= 64, f"--factor-threads {c.factor_threads}: must be in 1..64"),
              (0 < c.payload <= 1, f"--payload {c.payload:g}: must be in (0, 1]"),
              (c.mode in MODES, f"--mode {c.mode}: expected async, sync or ssp:S")]
    for ok, message in checks:
        if not ok:
            raise dr.UsageError(message)


def parse_mode(text):
    """'async' | 'sync' | 'ssp:S' (S >= 0) → the model's mode name."""
    if text in ("async", "sync"):
        return text
    m = re.fullmatch(r"ssp:(\d+)", text or "")
    if not m:
        raise dr.UsageError(f"--mode {text!r}: expected async, sync or ssp:S")
    return "ssp"


def server_thread_speedups(cluster):
    """(update, GEMM) speedups of a server's loop from cluster.server_threads and
    compression.factor_threads: each count, at most the host's cores over the servers on it
    (--cores-per-host; no bound when 0). The work is element-wise or one GEMM per chunk, so it
    divides evenly; what it does not model is oversubscription (docs/scaling.md)."""
    cap = math.inf
    if cluster.cores_per_host > 0:
        on_host = cluster.servers if cluster.colocated else min(cluster.servers, cluster.servers_per_host)
        cap = max(1, cluster.cores_per_host // on_host)
    return min(cluster.server_threads, cap), min(cluster.factor_threads, cap)


def contention(cluster, profile):
    """How much slower a worker computes when the host's cores are shared (CPU workers only):
    workers_per_host × threads over cores, at least 1."""
    if profile.threads == 0 or cluster.cores_per_host == 0:
        return 1.0
    on_host = cluster.workers if cluster.colocated else cluster.workers_per_host
    return max(1.0, on_host * profile.threads / cluster.cores_per_host)


def link_rates(cluster, rates):
    """(push B/s, pull B/s) of one worker. A real cluster: its host's NIC, shared by the
    workers_per_host workers on it, each way. Out of phase (the default) a server host's NIC is
    not shared at a fixed W-th: async workers drift apart, a worker's parts rarely meet another's
    until that NIC is saturated, and then the round is that NIC's (server_link_s, a bound beside
    the worker's step), as with emulated links. In lockstep every worker moves at once, and each
    server host's NIC is shared by all W for its shards: L · hosts / W each. Emulated
    (cluster.link_gbps on one host): every process paces only its own egress, so a push is limited
    by the worker's pacing alone and a pull by the servers' (S × link shared by W; the worker's
    step uses server_pull_rate and server_egress_s)."""
    link = cluster.payload_bytes_per_s
    hosts = math.ceil(cluster.servers / cluster.servers_per_host)
    if cluster.emulated:
        push, pull = link, link * min(1.0, cluster.servers / cluster.workers)
    else:
        share = link / cluster.workers_per_host
        if cluster.lockstep:
            share = min(share, link * hosts / cluster.workers)
        push = pull = share
    if rates.transport_gbytes > 0:
        cap = rates.transport_gbytes * 1e9
        push, pull = min(push, cap), min(pull, cap)
    return push, pull


def server_pull_rate(cluster, rates):
    """Emulated links: the B/s a worker's pull parts leave ONE server's paced egress at: the whole
    link. Each server paces only its own egress and the worker's ingress is not paced, so the
    parts of a pull from different servers arrive side by side. The W workers' parts queue FIFO at
    that one egress, which sends at the link's rate whenever it has bytes (work-conserving); async
    workers drift out of phase, so a worker's parts rarely wait behind another's until the egress
    is saturated, and then the round is the egress's (server_egress_s). Run J's fp32 rows at
    1 Gbit/s, W = 2 and 4, match this way and not a fixed link / W each (bench/RESULTS.md
    §11.5.5)."""
    rate = cluster.link_gbps * 1e9 / 8
    if rates.transport_gbytes > 0:
        rate = min(rate, rates.transport_gbytes * 1e9)
    return rate


def server_egress_s(per_layer, cluster, rates):
    """Emulated links: one round's time on the busiest server's paced egress, W workers' pull parts
    (every pull_every steps) and their acknowledgments' few bytes left out."""
    _, pulled = server_host_bytes(per_layer, dataclasses.replace(cluster, servers_per_host=1))
    return cluster.workers * pulled / server_pull_rate(cluster, rates)


def server_host_bytes(per_layer, cluster):
    """(push, pull) bytes of one worker's step to / from the busiest server host (server s on
    host s // servers_per_host), per step (push_every, pull_every amortized)."""
    pushed, pulled = {}, {}
    for lb in per_layer.values():
        for server, nbytes in lb.push_by_server.items():
            host = server // cluster.servers_per_host
            pushed[host] = pushed.get(host, 0) + nbytes / cluster.push_every
        for server, nbytes in lb.pull_by_server.items():
            host = server // cluster.servers_per_host
            pulled[host] = pulled.get(host, 0) + nbytes / cluster.pull_every
    return max(list(pushed.values()) + [0]), max(list(pulled.values()) + [0])


def server_link_s(per_layer, cluster, rates):
    """Real links: one round's time on the busiest server host's NIC, the more loaded way: W
    workers' push parts in (every push_every steps), their pull parts out (every pull_every), for
    the servers_per_host servers on it (server s on host s // servers_per_host)."""
    busiest = max(server_host_bytes(per_layer, cluster))
    rate = cluster.payload_bytes_per_s
    if rates.transport_gbytes > 0:
        rate = min(rate, rates.transport_gbytes * 1e9 * cluster.servers_per_host)
    return cluster.workers * busiest / rate


@dataclasses.dataclass
class Prediction:
    cluster: Cluster
    codec: Codec
    push_bytes: int
    pull_bytes: int
    compute_s: float         # one worker's compute with contention
    solo_compute_s: float    # one worker alone, no communication (the efficiency baseline)
    worker_s: float          # the worker's simulated step (compute + exposed communication)
    server_s: float          # one server per round of W pushes: its loop, or its factor expander if longer
    host_cpu_s: float        # colocated: all processes' CPU work per round / cores
    link_s: float            # bytes / the worker's rates (a lower bound the simulation includes)
    step_s: float
    bound: str
    disk_s: float = 0.0      # checkpoint.wal with a disk rate: a server host's log writes per round
    egress_s: float = 0.0    # the busiest server's link per round (emulated: its paced egress; real: its host's NIC)

    @property
    def images_per_s(self):
        return self.cluster.workers * self.cluster.batch / self.step_s

    @property
    def efficiency(self):
        return self.images_per_s / (self.cluster.workers * self.cluster.batch / self.solo_compute_s)

    def row(self):
        c = self.cluster
        return {"workers": c.workers, "servers": c.servers, "link_gbps": c.link_gbps, "mode": c.mode,
                "codec": self.codec.name, "batch": c.batch, "pull_every": c.pull_every, "push_every": c.push_every,
                "push_bytes": self.push_bytes,
                "pull_bytes": self.pull_bytes, "compute_ms": 1e3 * self.compute_s,
                "worker_ms": 1e3 * self.worker_s, "server_ms": 1e3 * self.server_s,
                "host_cpu_ms": 1e3 * self.host_cpu_s, "link_ms": 1e3 * self.link_s, "step_ms": 1e3 * self.step_s,
                "wal": c.wal, "disk_ms": 1e3 * self.disk_s, "egress_ms": 1e3 * self.egress_s,
                "server_threads": c.server_threads, "factor_threads": c.factor_threads, "lockstep": c.lockstep,
                "send_order": c.send_order, "inflight_mb": c.inflight_mb,
                "images_per_s": self.images_per_s, "efficiency": self.efficiency, "bound": self.bound}


def layer_order_egress(parts, start, rate_of, window, held_push, held_pull):
    """The worker's egress in cluster.send_order = "layer" with cluster.inflight_mb's window.
    Each link (server) cuts its parts into one push message per chunk, each followed by that
    chunk's pull request, and hands the transport, whenever its window has room, its waiting
    message with the lowest (layer, chunk, push before pull); nothing of the link overtakes that
    one while it does not fit (client/ps/send_queue.h). The egress carries what the links handed
    over first in, first out, so a lower layer's push waits behind what is already handed over,
    at most a window's bytes a link, and a window below bandwidth × round trip idles the link.
    A link has a window each way: one counts a push message's bytes until held_push(layer,
    server, share, delivered), its acknowledgement, the other a pull request's pulled bytes until
    held_pull(layer, server, share, through, delivered), when the weights have landed; a message
    larger than its window goes alone on an empty one (client/ps/delivery.h ByteWindow). A pull request's own bytes are not
    counted: it waits only behind its own link's pushes (a host interleaves a small message's
    packets with another flow's). parts: [(layer, server, push bytes, pull bytes, ready,
    chunks)], a part's chunks equal shares of its bytes; rate_of(layer): B/s. held_pull is called
    as each pull request leaves, in that order. Windows start empty: what an earlier call (step)
    left unanswered is not counted. Returns ({(layer, server): [(push delivered, pull request
    through), ...] per chunk}, when the egress is free again)."""
    pending = {}  # server: [(layer, chunk, kind), ...] not yet handed over; kind 0 push, 1 pull
    info = {}
    for j, server, push, pull, ready, n in parts:
        n = max(1, n)
        info[(j, server)] = (push / n, pull / n, ready, 1.0 / n)
        pending.setdefault(server, []).extend((j, c, kind) for c in range(n) for kind in (0, 1))
    for msgs in pending.values():
        msgs.sort()  # (layer, chunk, kind): the link's order; removals keep it
    held = {server: [] for server in pending}  # server: [(until, bytes, kind)]
    out = {(j, server): [] for j, server, _, _, _, _ in parts}
    pushed = {}  # (layer, server, chunk): when its push message was delivered
    link_free = {server: start for server in pending}  # when a link's last push is through
    egress = t = start
    while any(pending.values()):
        while True:  # hand over at t, across links the lowest waiting message first
            best = None
            for server, msgs in pending.items():
                if not msgs:
                    continue
                held[server] = [(u, b, k) for u, b, k in held[server] if u > t]
                for j, c, kind in msgs:
                    push, pull, ready, _ = info[(j, server)]
                    if ready > t or (kind == 1 and (j, server, c) not in pushed):
                        continue  # not made yet; a pull request follows its chunk's push
                    size = push if kind == 0 else pull
                    used = sum(b for _, b, k in held[server] if k == kind)  # a window each way
                    if used == 0 or used + size <= window:
                        if best is None or (j, c, kind, server) < best:
                            best = (j, c, kind, server)
                    break  # the lowest that is ready goes first or nothing of this link does
            if best is None:
                break
            j, c, kind, server = best
            pending[server].remove((j, c, kind))
            push, pull, _, share = info[(j, server)]
            if kind == 0:
                egress = max(egress, t) + push / rate_of(j)
                pushed[(j, server, c)] = link_free[server] = egress
                held[server].append((held_push(j, server, share, egress), push, 0))
            else:
                # A request's own bytes are few: it waits behind its own connection's bytes only
                # (a host interleaves a small message's packets with another flow's).
                through = max(link_free[server], t)
                out[(j, server)].append((pushed[(j, server, c)], through))
                held[server].append((held_pull(j, server, share, through, pushed[(j, server, c)]), pull, 1))
        later = [info[(j, server)][2] for server, msgs in pending.items() for j, _, _ in msgs
                 if info[(j, server)][2] > t]
        later += [u for server in pending for u, _, _ in held[server] if u > t]
        if not later:
            break
        t = min(later)
    return out, egress


def simulate_worker(layers, push_rate, pull_rate, sync, overlap, latency_s, apply_s, steps=12,
                    per_server_pull=False, burst_s=0.0, ack_s=None, lag=0, by_layer=False, chunks=None,
                    window=128 << 20):
    """One worker's steady-state step period. layers: [(forward_s, backward_s, {server: push
    bytes}, {server: pull bytes})] in forward order. Backward runs last layer first; a layer's
    push parts leave when its gradient is ready, FIFO on the worker's egress; with overlap
    (async/ssp) the pull of a server's part is requested when that part is on the wire (it follows
    the push on the same connection; sync: once the server has every worker's push and applied it,
    apply_s[j] later); forward waits layer by layer for its weights. Without overlap the pulls are
    requested at the end of backward and forward waits for all. No step waits for its
    acknowledgements: a layer's backward waits only for the acknowledgement of its previous push,
    which reads the gradients it overwrites (the worker's push wait).
    Pull parts land FIFO on the worker's ingress at pull_rate (a real NIC), or, with
    per_server_pull (emulated links), FIFO per server at pull_rate each (each server's paced
    egress). burst_s: an emulated pacer's credit — a link idle that long sends its next burst_s of
    bytes at once (finish = max(last finish, now - burst) + bytes / rate, never before now).
    ack_s[j]: a server's apply of one worker's push part of layer j (its one loop thread applies a
    push, then acknowledges it, then serves the pull that follows it on the connection): the
    acknowledgment leaves ack_s after delivery, behind the pull replies already queued on the
    same way back (the server's paced egress, or the worker's ingress), and the pull is served
    after the apply. None: acknowledged on delivery.
    lag (overlap only; worker.outstanding_steps - 1): forward of step t waits for the pulls that
    follow step t-1-lag's pushes, not step t-1's (their weights lack its last `lag` pushes).
    by_layer (cluster.send_order = "layer"): each link hands its egress the waiting message of the
    lowest layer first, chunk by chunk (chunks[j]: {server: chunks}), each chunk's pull request
    behind its push, while its `window` bytes (cluster.inflight_mb) allow (layer_order_egress; no
    burst credit), each acknowledgement behind the pull replies already on the way back.
    push_rate and pull_rate may be lists, one rate per layer (real links shared with other
    workers: a layer's parts to several server hosts move side by side)."""
    def send(now, last, nbytes, rate):
        finish = max(last, now - burst_s) + nbytes / rate
        return finish, max(finish, now)

    def at_layer(rate, j):  # a rate, or one per layer
        return rate[j] if isinstance(rate, list) else rate

    n = len(layers)
    ready = [0.0] * n
    t = egress = 0.0
    ingress = {}
    starts = []
    acked = [0.0] * n  # per layer: when its last push was acknowledged
    history = []       # ready times of every step's pulls, oldest first
    for _ in range(steps):
        starts.append(t)
        if not overlap:
            t = max([t] + ready)
        due = (history[-1 - lag] if len(history) > lag else [0.0] * n) if overlap else ready
        for j, (fwd, _, _, _) in enumerate(layers):
            t = max(t, due[j]) + fwd
        grad = [0.0] * n
        for j in reversed(range(n)):
            t = max(t, acked[j]) + layers[j][1]
            grad[j] = t
        new_ready = [0.0] * n
        acked = [0.0] * n

        def applied_at(j, share, delivered):
            return delivered + (ack_s[j] * share if ack_s is not None else 0.0)

        def ack_leaves(server, applied):
            """The ack follows the pull replies already on its way back."""
            return max(applied, ingress.get(server if per_server_pull else 0, 0.0) if ack_s is not None else 0.0)

        def serve(j, server, share, delivered, through=0.0):
            """The part's ack and its pull (requested once its request is `through`): when its
            weights land on the worker."""
            pull = layers[j][3]
            applied = applied_at(j, share, delivered)
            queue = server if per_server_pull else 0
            acked[j] = max(acked[j], ack_leaves(server, applied))
            if sync:  # answered once every worker's push of the layer is applied
                request = max(delivered + apply_s[j], t) + latency_s
            elif overlap:  # the pull follows the layer's push (and its apply) on the connection
                request = max(applied, through) + latency_s
            else:  # --no-overlap: one whole pull at the start of the next step
                request = t + latency_s
            ingress[queue], arrived = send(request, ingress.get(queue, 0.0), pull.get(server, 0) * share,
                                           at_layer(pull_rate, j))
            new_ready[j] = max(new_ready[j], arrived)
            return arrived

        # Each part's push and pull: a whole part in call order (a layer's pull requests leave
        # behind all of its push messages); by layer chunk by chunk, each chunk's pull request
        # overtaking the layer's later chunks' pushes (a lower key).
        order = [(j, server) for j in reversed(range(n)) for server in sorted(set(layers[j][2]) | set(layers[j][3]))]
        if by_layer:
            _, egress = layer_order_egress(
                [(j, server, layers[j][2].get(server, 0), layers[j][3].get(server, 0), grad[j],
                  (chunks[j].get(server, 1) if chunks else 1)) for j, server in order],
                egress, lambda j: at_layer(push_rate, j), window,
                lambda j, server, share, delivered: ack_leaves(server, applied_at(j, share, delivered)) + latency_s,
                lambda j, server, share, through, pushed: serve(j, server, share, pushed, through))
        else:
            for j, server in order:
                egress, delivered = send(grad[j], egress, layers[j][2].get(server, 0), at_layer(push_rate, j))
                serve(j, server, 1.0, delivered)
        ready = new_ready
        history.append(new_ready)
    half = steps // 2
    return (starts[-1] - starts[half]) / (steps - 1 - half)


def shared_host_step(worker_cpu, others, threads, cores, streams, wait, window):
    """The workers' compute period per step on a shared host when the other processes' CPU
    (`others` s per step: the servers' loops, the transport, the logs' write-back) arrives as a
    burst of `streams` parallel streams (the servers), not spread evenly over the step.

    The workers' `threads` threads need `worker_cpu` core-seconds per step and run on
    base = min(threads, cores) cores. The part of the burst that lands while the workers wait
    for communication (`wait` s per step exposed, on min(streams, cores) cores) costs them
    nothing. The rest runs beside their compute: the kernel's fair scheduler gives each of the
    threads + streams runnable threads an equal share, so the streams take at most
    cores × streams / (threads + streams) cores, and no faster than the burst's bytes arrive
    (its work over the exchange's `window` on the link). While it lasts the workers keep
    cores − that rate: the core-seconds they lose, over their base cores, lengthen the period.
    With threads >= cores this is the perfectly packed round (worker_cpu + others) / cores;
    with one stream and a free core per thread, it loses nothing."""
    base = min(threads, cores)
    burst = max(0.0, others - wait * min(streams, cores))
    if burst <= 0 or base <= 0:
        return worker_cpu / max(base, 1)
    rate = cores * streams / (threads + streams)
    if window > 0:
        rate = min(rate, burst / window)
    lost = burst / rate * max(0.0, base - (cores - rate))
    return (worker_cpu + lost) / base


def predict(profile, tensors, rates, cluster, codec):
    """The Prediction for one (cluster, codec); profile already at cluster.batch."""
    check_cluster(cluster)
    per_layer = step_bytes(tensors, profile.types(), cluster.servers, cluster.batch, codec, cluster.chunk_elems)
    slow = contention(cluster, profile)
    sync = cluster.mode == "sync"
    w, s = cluster.workers, cluster.servers
    sgd_cpu = rates.sgd_ns_per_float * 1e-9
    handling = rates.handling_ns_per_byte * 1e-9
    gemm_cpu = 1.0 / (rates.server_gflops * 1e9) if rates.server_gflops > 0 else 0.0
    # The loop's wall time per float / flop with its threads; the CPU it takes stays the same.
    sgd_speedup, gemm_speedup = server_thread_speedups(cluster)
    sgd, gemm = sgd_cpu / sgd_speedup, gemm_cpu / gemm_speedup
    layer_names = [name for name, _, _, _ in profile.layers]
    missing = [name for name in per_layer if name not in layer_names]
    if missing:
        raise dr.UsageError(f"tensor layer {missing[0]!r} has no timing in {profile.source} "
                            "(the time JSON and the tensor list are of different models)")
    push = sum(lb.push for lb in per_layer.values())
    pull = sum(lb.pull for lb in per_layer.values())
    floats = sum(lb.floats for lb in per_layer.values())
    flops = sum(lb.factor_flops for lb in per_layer.values())
    # The write-ahead log: every push is appended in the smaller of its wire form and its f32
    # gradient (LayerBytes.logged), per 4 logged bytes at the log's rate per float.
    logged = sum(lb.logged for lb in per_layer.values()) / FLOAT_BYTES
    # Messages: a chunk's push + pull round costs the servers' loops and the transport a fixed
    # CPU beside its bytes (Rates.msg_server_us, msg_io_us); half of it is the push's.
    chunks = sum(sum(lb.chunks_by_server.values()) for lb in per_layer.values())
    msg_server = rates.msg_server_us * 1e-6
    per_round = (1 / cluster.push_every + 1 / cluster.pull_every) / 2  # chunk rounds per step
    wal = rates.wal_ns_per_float * 1e-9 if cluster.wal else 0.0
    wal_sync = rates.wal_sync_ns_per_float * 1e-9 if cluster.wal else 0.0
    # One server's loop per round: its 1/S share of W workers' pushes and pulls, logged, applied
    # and handled. Its factor expander (server/factor_expander.h), a thread of its own, forms the
    # factor pushes' δᵀa beside the loop: the server keeps pace with the longer of the two, and
    # takes the CPU of both. (A push's ack still waits for its own GEMM: ack_s below.)
    def loop_s(sgd):
        return w / s * ((floats * sgd + logged * wal + push * handling) / cluster.push_every
                        + pull * handling / cluster.pull_every + chunks * msg_server * per_round)

    def expander_s(gemm):
        return w / s * flops * gemm / cluster.push_every

    server_s = max(loop_s(sgd), expander_s(gemm))
    server_cpu_s = loop_s(sgd_cpu) + expander_s(gemm_cpu)
    # A server host's log disk, shared by its servers (on one host: all S), per round.
    disk_s = 0.0
    if cluster.wal and rates.wal_disk_gbytes > 0:
        on_host = s if cluster.colocated else min(s, cluster.servers_per_host)
        disk_s = on_host * w / s * logged * FLOAT_BYTES / (rates.wal_disk_gbytes * 1e9) / cluster.push_every
    host_cpu_s = workers_cpu = others_cpu = 0.0
    if cluster.colocated and cluster.cores_per_host > 0:
        workers_cpu = w * profile.compute_s * profile.threads  # 0 for GPU workers
        # Every worker's compute and its data loader, every server loop (update, factor GEMM,
        # log, handling), and the transport's own CPU for every byte each worker sends and
        # receives (both ends' I/O threads and kernel), on the host's cores.
        worker_io = ((push / cluster.push_every + pull / cluster.pull_every) * rates.io_ns_per_byte * 1e-9
                     + chunks * per_round * rates.msg_io_us * 1e-6)
        loader = cluster.batch * rates.loader_us_per_image * 1e-6
        # The logs' fsync threads write every push back to disk beside the loops.
        syncing = w * logged * wal_sync / cluster.push_every
        others_cpu = w * (loader + worker_io) + s * server_cpu_s + syncing
        host_cpu_s = (workers_cpu + others_cpu) / cluster.cores_per_host
        if profile.threads:
            # A CPU worker on a shared host computes at its share of the cores left by everything
            # else: its compute stretches to the host's CPU round, and the communication it cannot
            # hide comes on top (not max(compute, cpu round) alone).
            slow = max(slow, host_cpu_s / profile.compute_s)
    apply_s, ack_s = [], []
    for name, _, _, _ in profile.layers:
        lb = per_layer.get(name, LayerBytes())
        # The servers holding this layer (its chunks', from the layout) apply W pushes of it
        # (sync: before any pull is served), side by side.
        holders = max(1, len(lb.pull_by_server))
        layer_wal = lb.logged / FLOAT_BYTES * wal
        apply_s.append(w * (lb.floats * sgd + layer_wal + lb.factor_flops * gemm) / holders)
        # One push of it, handled and applied by a holder before its ack (async; per holder).
        layer_msgs = sum(lb.chunks_by_server.values()) * msg_server / 2
        ack_s.append((lb.floats * sgd + layer_wal + lb.factor_flops * gemm + lb.push * handling + layer_msgs)
                     / holders)
    push_rate, pull_rate = link_rates(cluster, rates)
    latency = rates.latency_ms * 1e-3
    overlap = cluster.overlap and not sync
    lag = cluster.outstanding_steps - 1 if cluster.mode == "async" and overlap else 0
    by_layer = cluster.send_order == "layer"
    window = cluster.inflight_mb * (1 << 20)  # by layer only: in call order it could only idle a link

    # Lockstep: every layer's part is applied after the W workers' parts of it (interleaved), and
    # a server's egress carries the W workers' pull parts side by side.
    lockstep = cluster.lockstep and not sync and w > 1
    step_ack_s = [a * w for a in ack_s] if lockstep else ack_s
    egress_share = w if lockstep else 1

    def worker_step(slow, push_rate, pull_rate):
        """The simulated step at compute slowdown `slow` and these rates (B/s, or per layer)."""
        rows, chunks = [], []
        for name, _, fwd, bwd in profile.layers:
            lb = per_layer.get(name, LayerBytes())
            rows.append((fwd * slow, bwd * slow, lb.push_by_server, lb.pull_by_server))
            chunks.append(lb.chunks_by_server)
        if cluster.pull_every == 1 and cluster.push_every == 1:
            if cluster.emulated:
                return simulate_worker(rows, push_rate, server_pull_rate(cluster, rates) / egress_share, sync, overlap,
                                       latency, apply_s, per_server_pull=True, burst_s=cluster.link_burst_ms * 1e-3,
                                       ack_s=step_ack_s, lag=lag, by_layer=by_layer, chunks=chunks,
                                       window=window)
            return simulate_worker(rows, push_rate, pull_rate, sync, overlap, latency, apply_s, ack_s=step_ack_s,
                                   lag=lag, by_layer=by_layer, chunks=chunks, window=window)
        # Amortized: a whole blocking pull before every pull_every-th step (the worker overlaps
        # pulls only when it pulls every step); pushes leave during compute, full duplex, one per
        # push_every steps (sync: the push's apply is on the path as well).
        compute = profile.compute_s * slow
        push_rate, pull_rate = (min(r) if isinstance(r, list) else r for r in (push_rate, pull_rate))
        pull_s = pull / pull_rate + latency + (sum(apply_s) if sync else 0.0)
        return max(compute + pull_s / cluster.pull_every, (push / push_rate) / cluster.push_every)

    base_slow, base_host_cpu_s = slow, host_cpu_s

    def worker_at(push_rate, pull_rate):
        """(worker step, compute slowdown, host CPU round, link time) at these link rates."""
        slow, host_cpu_s = base_slow, base_host_cpu_s
        worker_s = worker_step(slow, push_rate, pull_rate)
        slowest_push, slowest_pull = (min(r) if isinstance(r, list) else r for r in (push_rate, pull_rate))
        link_s = max(push / slowest_push / cluster.push_every, pull / slowest_pull / cluster.pull_every)
        if host_cpu_s > 0 and profile.threads:
            # The round above packs every process's CPU into the cores perfectly. It does not: the
            # servers' work (and the transport's) comes as a burst after the workers' pushes, each
            # of the S servers on the host one stream of it, and while it lasts the kernel's fair
            # scheduler shares the cores among the workers' threads and those streams. See
            # shared_host_step.
            shared = shared_host_step(worker_cpu=workers_cpu, others=others_cpu, threads=w * profile.threads,
                                      streams=s, cores=cluster.cores_per_host,
                                      wait=max(0.0, worker_s - profile.compute_s * slow), window=link_s)
            if shared > profile.compute_s * slow * (1 + 1e-12):
                slow = shared / profile.compute_s
                host_cpu_s = max(host_cpu_s, shared)
                worker_s = worker_step(slow, push_rate, pull_rate)
        return worker_s, slow, host_cpu_s, link_s

    worker_s, slow, host_cpu_s, link_s = worker_at(push_rate, pull_rate)
    if not cluster.emulated and not cluster.lockstep and w > 1:
        # Real links, out of phase: while a worker's part crosses a server host's NIC, the other
        # W - 1 workers' parts cross it too for a share of the time, the more the busier that
        # NIC is. As a link shared by processor sharing: a part moves at L × (1 - ρ), ρ the
        # others' load on the busiest server host's NIC each way at the round's step time (never
        # below the lockstep share L / W; a layer's parts to n server hosts side by side, together
        # at most the worker's own NIC's rate). A longer step loads the NIC less, so the
        # step is the fixed point, found by bisection between the free link's step and the
        # lockstep share's.
        push_host, pull_host = server_host_bytes(per_layer, cluster)
        link = cluster.payload_bytes_per_s
        # The server hosts each layer's parts go to, side by side.
        spread = [max(1, len({srv // cluster.servers_per_host
                              for srv in per_layer.get(name, LayerBytes()).pull_by_server}))
                  for name, _, _, _ in profile.layers]

        def shared_rates(step):
            # A layer's flows to its n server hosts run side by side, each at its share of that
            # host's NIC (at least 1/W of it, the lockstep share), together no faster than the
            # worker's own NIC.
            shares = []
            for rate, nbytes in ((push_rate, push_host), (pull_rate, pull_host)):
                others = min(1.0, (w - 1) * nbytes / (link * step)) if step > 0 else 1.0
                share = max(1.0 / w, 1.0 - others)
                shares.append([min(rate, n * link * share) for n in spread])
            return shares

        def round_at(step):
            ws, _, hc, _ = worker_at(*shared_rates(step))
            return max(ws, hc, server_s, disk_s)
        lo = max(worker_s, host_cpu_s, server_s, disk_s)
        hi = max(lo, round_at(lo))
        for _ in range(48):  # to ~1e-14 of the interval
            if hi - lo <= 1e-12 * hi:
                break
            mid = (lo + hi) / 2
            if round_at(mid) > mid:
                lo = mid
            else:
                hi = mid
        push_rate, pull_rate = shared_rates(hi)
        worker_s, slow, host_cpu_s, link_s = worker_at(push_rate, pull_rate)
    # sync: the simulation already puts each layer's apply of all W pushes on the critical path
    # (identical workers: the barrier waits for no straggler; docs/scaling.md says what that leaves out).
    # Emulated links: the W workers' pulls share each server's one paced egress (server_pull_rate).
    # Real links, out of phase: the W workers' parts share each server host's NIC, whose round
    # bounds the step (in lockstep the shares are in the worker's rates already).
    if cluster.emulated:
        egress_s = server_egress_s(per_layer, cluster, rates)
    elif not cluster.lockstep:
        egress_s = server_link_s(per_layer, cluster, rates)
    else:
        egress_s = 0.0
    candidates = {"worker": worker_s, "server": server_s, "host cpu": host_cpu_s, "disk": disk_s, "link": egress_s}
    step = max(candidates.values())
    bound = max(candidates, key=candidates.get)
    if bound == "worker":
        comm_exposed = worker_s - profile.compute_s * slow
        bound = ("host cpu" if slow > contention(cluster, profile) else "compute") \
            if comm_exposed < 0.02 * worker_s else "link"
    solo = profile.compute_s * contention(dataclasses.replace(cluster, workers_per_host=1), profile)
    return Prediction(cluster, codec, push, pull, profile.compute_s * slow, solo, worker_s, server_s, host_cpu_s,
                      link_s, step, bound, disk_s, egress_s)


# ---------------------------------------------------------------------------------------------
# Readers.

def read_json(path, what):
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        raise dr.UsageError(f"{what} {path}: no such file") from None
    except json.JSONDecodeError as e:
        raise dr.UsageError(f"{what} {path}: not JSON: {e}") from None


def read_text(path, what):
    try:
        with open(path) as f:
            return f.read()
    except FileNotFoundError:
        raise dr.UsageError(f"{what} {path}: no such file") from None


def read_tensors(path, flag="--tensors"):
    return parse_tensors(read_text(path, flag), path)


def read_profile(path, flag="--time"):
    return parse_time_json(read_json(path, flag), path)


def run_dir_inputs(run_dir):
    """(tensors, config) of a run directory (its tensors.txt and config.toml)."""
    config = dr.read_config(run_dir)
    path = os.path.join(run_dir, "tensors.txt")
    if not os.path.exists(path):
        raise dr.UsageError(f"{run_dir}: no tensors.txt (the launcher writes it)")
    return read_tensors(path, "--run-dir"), config
