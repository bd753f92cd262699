# messages.capnp — the one schema for every parameter-service message (STYLE.md §5).
#
# A message on the wire is multipart: frame 1 is a Header (flat Cap'n Proto, unpacked),
# frames 2.. are raw tensor payloads, one per chunk, in the order of `chunkIds`. Payloads never
# pass through the Cap'n Proto builder; the header only describes them (dtype, encoding,
# element count, byte length, optional checksum). The C++ mirror and the only codec live in
# common/codec.h.
@0xcbf1b5fc57cf82f2;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("downpour::capnpwire");

enum MsgType {
  invalid @0;
  register @1;        # process -> coordinator / worker -> server: role, layoutHash
  registerReply @2;   # assignedId, serverAddresses, serverCount, workerCount (the layout view)
  pull @3;            # worker -> server: chunkIds wanted (empty = all of the server's), clock
  pullReply @4;       # server -> worker: chunkIds, versions, payload frames (weights)
  push @5;            # worker -> server: chunkIds, versions computed from, payload frames (grads)
  ack @6;             # server -> worker: push applied / accepted (versions = new versions)
  clock @7;           # worker -> coordinator / server: worker finished iteration `clock`
  heartbeat @8;       # any -> coordinator; reply carries deadWorkers, finishedWorkers, shutdown
  stats @9;           # anyone -> server: ask for counters
  statsReply @10;     # server -> asker: stats
  checkpoint @11;     # -> server: write a checkpoint now (text = optional path)
  shutdown @12;       # -> server / coordinator: stop serving after replying
  error @13;          # reply to a bad request: errorCode + errorText
}

# Element type of the payload frames. f32 today; f16/bf16 later (a field, not a message type).
enum DType {
  f32 @0;
  f16 @1;
  bf16 @2;
}

# How a payload frame encodes its elements (common/grad_codec.h has the byte formats).
#  dense    count elements of `dtype`
#  topK     k uint32 indices (strictly ascending, < count) then k values of `dtype` (push only)
#  oneBit   one f32 scale, then ceil(count/8) bytes of sign bits (1 = negative) (push only)
#  factors  sufficient factors of an inner-product weight chunk (push only; `dtype` f32, or
#           f16 / bf16 in a message of factor chunks only): the chunk's rows of delta,
#           factorBatch x rows; the layer's input activations are one extra frame at the end
#           of the message (factorBatch x in), shared by its factor chunks
enum Encoding {
  dense @0;
  topK @1;
  oneBit @2;
  factors @3;
}

enum Role {
  unknown @0;
  server @1;
  worker @2;
  observer @3;   # benchmarks / tools that only read stats
  evaluator @4;  # the run's evaluator (downpour-evaluator): reads weight snapshots, never writes
}

struct Stats {
  pushesReceived @0 :UInt64;   # push messages that arrived
  pushesApplied @1 :UInt64;    # push messages whose chunks were all applied (or accumulated)
  pushesRejected @2 :UInt64;   # refused by validation (counted by reason below)
  rejectedByReason @3 :List(UInt64);  # indexed by downpour::RejectReason
  chunkUpdates @4 :UInt64;     # chunk updates applied (SgdUpdate calls)
  pullsServed @5 :UInt64;
  stalenessSum @6 :UInt64;     # sum over applied chunk pushes of (version now - version from)
  stalenessMax @7 :UInt64;
  stalenessHistogram @8 :List(UInt64);  # bucket i = staleness i, last bucket = ">= last"
  droppedLate @9 :UInt64;      # sync: pushes for an already applied clock (backup workers)
  checkpointsWritten @10 :UInt64;
  undecodable @11 :UInt64;     # messages whose header did not decode (answered with an error reply:
                               # the ZeroMQ peer is known even when the bytes are garbage)
  duplicates @12 :UInt64;      # pushes recognised as already taken (same worker, session and
                               # request id: a resend after a restart): acknowledged, not applied again
  droppedPeers @13 :UInt64;    # peers dropped because they did not read their replies
  pushesByWorker @14 :List(UInt64);  # gradient push messages taken (applied, accumulated or
                               # dropped late), each once, indexed by worker id: what every
                               # worker's acknowledged pushes must equal (no loss, no double apply)
  walRecords @15 :UInt64;      # records appended to the write-ahead log by this process
  replayed @16 :UInt64;        # pushes replayed from the write-ahead log at start
  sgdNanos @17 :UInt64;        # time spent in the update rule (SgdUpdate) by this process, ns
  busyNanos @18 :UInt64;       # time the message loop spent handling messages (decode, validate,
                               # log, apply, reply) by this process, ns: busy / wall = loop load
  regionParts @19 :UInt64;     # push and pull messages whose payload went through shared memory
  dcCompensated @20 :UInt64;   # DC-ASGD: chunk gradients compensated for their delay
  dcUncompensated @21 :UInt64; # DC-ASGD: chunk gradients applied as pushed (no pull copy of their version)
  evaluatorPulls @22 :UInt64;  # pull messages served to the run's evaluator (snapshots; not in pullsServed)
  walNanos @23 :UInt64;        # time the message loop spent appending to the write-ahead log (CRC-32 and
                               # write(2) into the page cache; with fsync every ack, the fsyncs too), ns
  walSyncCpuNanos @24 :UInt64; # CPU time of the log's own fsync thread (checkpoint.wal_fsync_ms > 0), ns
  factorNanos @25 :UInt64;     # time the message loop spent forming sufficient-factor pushes' dense
                               # gradients (δᵀ·a, compression.factors; part of busyNanos), ns
  walBytes @26 :UInt64;        # bytes appended to the write-ahead log by this process
  walCodedRecords @27 :UInt64; # of walRecords, pushes logged as the wire carried them (factors,
                               # lossy codecs: fewer bytes than their f32 gradients)
}

struct Header {
  magic @0 :UInt32;            # 0x44504D31 "DPM1"
  version @1 :UInt16;          # schema version, 1
  type @2 :MsgType;
  sender @3 :Int32 = -1;       # id given at rendezvous (-1 before it)
  requestId @4 :UInt64;        # echoed in the reply
  modelId @5 :UInt32;          # several models on one set of servers (0 today)
  clock @6 :Int64;             # worker iteration the message belongs to
  layoutHash @7 :UInt64;
  role @8 :Role;
  flags @9 :UInt32;            # push: bit 0 = init (sets weights, not a gradient step);
                               # heartbeat: bit 1 = the worker finished training,
                               #   bit 2 = the worker is done (evaluated, saved) and exits;
                               # register / push / pull / pull reply: bit 3 = shared memory (below);
                               # heartbeat reply to a worker: bit 6 = it was declared dead and is
                               #   out of the run (kFlagRemoved);
                               # error reply from a server: the RejectReason (common/codec.h)

  # Payload description, one entry per payload frame, in frame order.
  chunkIds @10 :List(UInt32);
  versions @11 :List(Int64);   # pull reply / ack: current; push: version the grads came from
  dtype @12 :DType;
  encoding @13 :Encoding;
  elemCounts @14 :List(UInt64);
  byteLengths @15 :List(UInt64);
  checksums @16 :List(UInt32); # optional CRC-32C per frame; empty = not checked

  # Errors.
  errorCode @17 :UInt16;       # downpour::StatusCode
  errorText @18 :Text;

  # Rendezvous / membership.
  assignedId @19 :Int32 = -1;
  serverAddresses @20 :List(Text);
  serverCount @21 :Int32;
  workerCount @22 :Int32;
  deadWorkers @23 :List(Int32);
  shutdown @24 :Bool;          # heartbeat reply: the run is over
  text @25 :Text;              # free-form argument (checkpoint path, address)

  stats @26 :Stats;
  finishedWorkers @27 :List(Int32);  # heartbeat reply: the gone workers (deadWorkers) that
                                     # finished normally rather than fell silent
  token @28 :Data;             # register / admin messages of a run without keys: the run's
                               # secret (server/access.h); empty otherwise
  session @29 :UInt64;         # worker -> server: a random id of the sending PsClient, fixed for
                               # its lifetime, so (sender, session, requestId) names one push across
                               # server restarts and worker restarts (duplicates are not applied twice)
  incarnation @30 :UInt64;     # every reply of a server or the coordinator: a random id of that
                               # process, new at each start, so a client can tell a restart
  goneSeq @31 :UInt64;         # heartbeat: the last membership change the sender has seen; the
                               # reply carries the coordinator's newest and the changes after it
  sliceIndex @32 :Int32 = -1;  # heartbeat reply to a live worker: its rank among the live workers
                               # (ids ascending), with workerCount = their number: the data slice
                               # it reads from its next epoch on (slice sharding); -1 = none
  # Same-host shared memory (common/shm_region.h). register with flags bit 3: the worker asks
  # for a region and says which machine it runs on (bootId); the reply offers one (shmPath,
  # shmBytes, shmNonce; empty path = none). push / pull / pull reply with flags bit 3: the
  # payload is in that region (no payload frames), at each chunk's offset in the server's share.
  bootId @33 :Text;
  shmPath @34 :Text;
  shmBytes @35 :UInt64;
  shmNonce @36 :UInt64;
  # Per-chunk encodings (push), one per chunk id; empty = every chunk uses `encoding`. A pull
  # asks for its reply's `dtype` (f32 / f16 / bf16); the reply says what it carries.
  encodings @37 :List(Encoding);
  factorBatch @38 :UInt32;     # push with factor chunks: the batch rows of delta and of the activations
  staleness @39 :List(Int64);  # ack of a gradient push, one per chunk id: the versions applied to the
                               # chunk since the push's version when the server took it (what it
                               # counts in Stats), -1 for a chunk it did not apply (a late sync
                               # push); empty for init pushes and resent duplicates
  scheduleIters @40 :List(Int64);  # pull reply, one per chunk id: the chunk's lr-schedule iteration
                               # (worker batches applied to it, docs/config.md#solver) when served
  moveBatches @41 :UInt32;     # push with the move flag (a multi-model run's stage ends): the worker
                               # batches the stage trained; the chunks' lr-schedule iteration advances by it
}
