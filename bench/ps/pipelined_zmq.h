// pipelined_zmq.h — the honest transport reference of the load benchmark: a pipelined,
// per-chunk parameter service over bare ZeroMQ, built the way ps-lite moves a dense model.
//
// What it does (one process; S server threads, W worker threads):
//  * Each server thread owns a ROUTER and the weights (and, with update=sgd, the momentum
//    history) of the chunks ParamLayout deals to it — the same layout and chunk_elems as the
//    parameter service, so the same 4 MiB frames.
//  * Each worker thread has one DEALER per server (one ordered connection per node pair, as
//    ps-lite keeps). A round: the worker sends every push chunk to every server, then, without
//    waiting for a single ack, every pull request. ONE MESSAGE PER CHUNK, each with a tiny header
//    frame (PipeHeader: chunk id + op); a push carries its gradient as a second, zero-copy frame.
//    Push and pull are in flight at once on the one connection: the pull requests queue behind
//    the pushes on the wire, and the server answers each chunk as it reaches it.
//  * The server answers each push chunk with an 8-byte ack, and each pull chunk with its header
//    and the chunk's weights sent zero-copy from the resident buffer (ps-lite's van sends an
//    SArray zero-copy the same way).
//  * update=none: the server only receives. update=sgd: on each push chunk it runs downpour's
//    SgdUpdate (common/solver/sgd.h — the shards' own function, with the same solver scalars and
//    the tensor's lr/decay multipliers, MakeUpdateParams at the chunk's version) on that chunk's
//    weights and history, reading the gradient in place from the received ZeroMQ message, as a
//    ps-lite KVServer request handle reads req_data.vals.
//  * The worker copies each pulled chunk into its flat weight buffer (as a worker would). A
//    round ends when every ack and every pull reply of that round has arrived.
//  * ZeroMQ contexts as in the parameter-service side of the benchmark: one context (2 I/O
//    threads) for all server threads, one context (2 I/O threads) per worker.
//
// What ps-lite does the same: per-key-range messages with a small meta header and zero-copy
// value frames; one connection per node pair; the worker does not wait for one request before
// sending the next; the server's handle sees the received buffer in place and answers each
// request on its own. What ps-lite does differently: its meta is protobuf (bigger and costlier
// than 8 bytes); each node has a receive thread that hands requests to a customer thread through
// a queue (one hop more than this loop); a request slices by key range per server, not by fixed
// chunks (a worker's push of a whole model to one server is one message unless the app splits
// it); its stock server handle copies weights into a fresh array for each pull reply, where this
// one sends the resident buffer zero-copy (cheaper). Like ps-lite, and unlike downpour's shards,
// it validates nothing (no sizes check beyond a CHECK, no NaN scan, no versions, no dedup, no
// copy-on-write pull buffers): it is the transport plus the update, and nothing else.
//
// Known shortcut: with W > 1 and update=sgd, a pull reply's zero-copy frame may still be read by
// ZeroMQ's I/O thread while the server applies another worker's push to the same chunk (a torn
// mix of two versions reaches that worker). Downpour's copy-on-write pull buffers exist to avoid
// exactly that; ps-lite's stock handle avoids it by copying. The reference accepts it: it makes
// the reference faster, never slower.
//
// This file and bare_zmq.cc are the only places outside common/ that include ZeroMQ: they are
// the peers being measured, not part of the system.
//
// Thread-safety: RunPipelinedZmq is self-contained (its own contexts and threads); call it from
// one thread at a time per set of addresses.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/layout.h"
#include "common/config/solver.h"

namespace downpour::bench {

enum class RefUpdate { kNone, kSgd };
const char* RefUpdateName(RefUpdate u);  // "none" / "sgd"

struct PipelinedOptions {
  RefUpdate update = RefUpdate::kSgd;
  SolverConfig solver;  // scalars of the update (update=sgd); the benchmark passes the shards' own
  // Server s binds addresses[s] ("tcp://127.0.0.1:PORT" or "ipc://PATH"); size = layout.servers().
  std::vector<std::string> addresses;
  int warmup_rounds = 2;
  int rounds = 10;  // timed rounds per worker
};

struct PipelinedResult {
  double seconds = 0;       // wall time of the timed rounds (first worker starts .. last ends)
  int rounds = 0;           // timed rounds per worker
  double bytes_moved = 0;   // payload bytes, both directions, all workers, timed rounds
  int64_t updates = 0;      // chunk updates applied by all servers in the timed rounds
  double sgd_seconds = 0;   // all servers, timed rounds: in SgdUpdate
  double busy_seconds = 0;  // all servers, timed rounds: handling messages (not waiting in recv)
  // Seconds from a chunk's send to its ack / pull reply, every chunk of the timed rounds.
  std::vector<double> push_latency, pull_latency;
};

// Runs warmup + timed rounds with `workers` worker threads against layout.servers() server
// threads. Aborts (DP_CHECK) on a ZeroMQ failure: a broken benchmark peer is not a result.
PipelinedResult RunPipelinedZmq(const ParamLayout& layout, int workers, const PipelinedOptions& options);

}  // namespace downpour::bench
