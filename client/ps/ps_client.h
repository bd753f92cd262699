// ps_client.h — the worker's parameter-service client: ps-lite's surface with its gaps closed.
//
//   PsClient::Create(transport, layout, options, &client);
//   client->Connect(timeout);                         // register with every server (layout hash)
//   RequestId r = client->Pull(weights);              // all chunks, all servers in parallel
//   client->Wait(r, 10s);                             // Status; the request is then forgotten
//   RequestId p = client->Push(grads, clock);         // zero-copy from `grads`
//   client->Wait(p, 10s);
//
// Flat buffers. `weights` / `grads` are the model's whole flat parameter space
// (layout.total_elems() floats, tensors in layout order, see common/layout.h); a chunk's
// floats live at [chunk.flat_offset, +chunk.count).
//
// Buffer lifetime (zero copy):
//  * Pull writes each server's reply directly into the caller's buffer from the client's I/O
//    threads. The buffer must stay alive and must not be read in the pulled range until Wait
//    returns (ok or not; after a failed or timed-out Wait call Wait again or destroy the client
//    before freeing it).
//  * Push sends the caller's gradient bytes without copying. The buffer must stay alive and
//    unmodified until Wait(id) returns ok — Wait returns only after the transport has released
//    every borrowed frame, not merely after the server's ack.
//
// Concurrency (full duplex): every Pull/Push is cut per server into parts (messages of at most
// max_chunks_per_message chunks). One I/O thread per server keeps the parts of all of that
// server's requests in flight at once, in call order on one ordered connection, bounded by
// max_inflight_bytes: a Pull issued after a Push leaves after it (so the server, which handles
// one connection's messages in arrival order, answers it after applying the push), while the
// push's acks and the pull's weights travel at the same time. The server applies each part as
// it arrives and serves a pull part by part. Servers work in parallel. Errors (a server's error
// reply, a timeout, a transport failure) are attached to the request and returned by its Wait.
//
// Server restarts (DESIGN.md "Reliability and security"). An I/O thread keeps every part of its
// current operation until that part's reply arrives, and notices a restarted server by
//  (a) a reply whose incarnation (MessageHeader::incarnation, new at each server process start;
//      0 = unknown, never a signal by itself) differs from the one the link has seen,
//  (b) a "not registered" refusal after this link registered once (the server forgot it), or
//  (c) silence: when parts are outstanding and nothing arrived for `probe_every`, it sends the
//      server a heartbeat probe; an answer with a new incarnation is a restart, an answer with
//      the same one means the server is alive and holding the request (sync/ssp pulls).
// On a restart the link registers again and resends every part still unanswered (pushes and
// pulls). A resent push is safe: the server recognises a push it already applied by (sender,
// session, request id) and acknowledges it without applying it again. While the server does
// not answer at all, the I/O thread keeps waiting and logs "worker <id>: waiting for server <i>
// (restarting) for <n> s" every few seconds; it fails the request only after `server_wait` of
// silence (kUnavailable naming the server). `reply_timeout` bounds only the time a server that
// answers probes holds a request. SetServerAddress() moves a link to the server's new address
// (the coordinator tells it), with the same register-and-resend.
//
// A part refused because the server's write-ahead log could not take it (RejectReason::kLogWrite:
// its disk full, an I/O error it survived) was not applied, so it is sent again, after 50 ms,
// then backing off to `probe_every`, with one warning when the refusals start and one line when
// the server takes the part. A part the log keeps refusing for `server_wait` fails with the
// server's error (kIoError) and how long it was refused. A push is thus never half taken because
// the server's disk filled between two of its parts. The register sent after a restart is
// retried the same way: a restarted server logs the return of a worker it counts as dead, and a
// full disk there holds the worker's operations (for up to `server_wait`) instead of failing them.
//
// Shared memory (same host; options.shared_memory). At register the client asks each server for
// a region (common/shm_region.h) and says which machine it runs on (boot id); a server on the
// same machine answers with a sealed memfd of 2 × its share of the model: a push area and a pull
// area, each chunk at its offset in the server's share. A push part then writes its gradients
// into the push area and sends only its header; the server copies them out, validates and
// applies them as if they had been frames. A pull part's weights are written by the server into
// the pull area; the client copies them into the caller's buffer when the header-only reply
// arrives. No chunk has two parts in flight through one area at once (the later part waits, and
// with it every later part, so call order holds). A server that offers no region (another host,
// ShardOptions::shared_memory off) or a region that cannot be opened (another pid namespace)
// leaves that link on the socket, with one log line. A restarted server offers a new region at
// the re-register; resent parts go through it.
//
// Wire codecs (common/grad_codec.h; docs/compression.md). push_codec fp16 / bf16 sends gradient
// chunks as halves; topk sends the top_k_fraction largest |g| of each chunk, onebit its signs and
// one scale (mean |g|), both with error feedback: the client keeps, per chunk, what it has not
// sent yet (the residual) and adds it to the chunk's next gradient. A push part is encoded once,
// on its link's I/O thread, when it is first sent (chunks belong to one server, so one thread
// touches a residual); the encoded bytes are kept for resends after a restart, which neither
// encode again nor touch the residual, and the caller's gradient buffer is released then. Init
// pushes stay f32. pull_codec fp16 / bf16 asks the servers for halves (their masters stay f32)
// and decodes them into the caller's buffer. A lossy part never goes through shared memory.
//
// Sessions: each client draws a random nonzero 64-bit session at creation and sends it in every
// message; request ids are unique within the session, so (worker, session, request id) names one
// push across resends.
//
// Versions: each pull records the version of every chunk it received (last_versions()); each
// push carries, per chunk, the version its gradient was computed from (the last pulled one),
// so the server measures staleness.
//
// Thread-safety: all methods may be called from any thread; Wait(id) for a given id from one
// thread. last_versions() is stable only while no pull is in flight. The Transport must
// outlive the client (SetServerAddress connects new endpoints from it).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/codec.h"
#include "common/layout.h"
#include "common/run_config.h"
#include "common/status.h"
#include "common/trace.h"
#include "common/transport.h"

namespace downpour {

using RequestId = uint64_t;

// A tensor whose span of a push's flat gradient buffer holds sufficient factors instead of its
// gradient (docs/factors.md): an inner-product weight W (out×in, in = product of the dims after
// the first) whose floats at [tensor_flat_offset, …) are δ (batch×out) then a (batch×in), with
// batch×(out+in) <= out×in (client/engine/net.h SetFactoredParams writes exactly this).
struct FactorTensor {
  int tensor = -1;  // index into layout.tensors()
  int batch = 0;    // B, 1..65536
};

struct PsClientOptions {
  std::vector<std::string> server_addresses;  // index = server id; size = layout.servers()
  int32_t worker_id = 0;                      // id given at rendezvous (coordinator)
  // Who this client is to the servers: a worker, or the run's evaluator (Role::kEvaluator:
  // registers as a reader and may only pull; its pulls are served at once with the weights as
  // they are, whatever the consistency mode, and leave no trace in the workers' accounting).
  Role role = Role::kWorker;
  uint32_t model_id = 0;                      // several models on one set of servers (later)
  bool checksums = false;                     // send CRC-32C per push frame (servers verify)
  // A request to one server is sent as messages of at most this many chunks (0 = one message),
  // so the server applies part k while part k+1 is on the wire. Default: per chunk (a pull is
  // then served and copied out chunk by chunk too). The server validates and
  // applies each message as a whole: a rejected part never applies, but the other parts of the
  // same Push may have been applied (Wait reports the first error).
  int max_chunks_per_message = 1;
  // Payload bytes on the wire per server at once: parts sent (push payload) or asked for (pull)
  // whose replies have not arrived. A part larger than the window goes alone. Keeps the server's
  // per-peer reply queue (cluster.peer_queue_mb) far from its bound.
  uint64_t max_inflight_bytes = uint64_t{128} << 20;
  // How long a server that answers probes may hold a request (sync/ssp pulls wait for the
  // consistency rule) before the request fails with kTimeout. Restarted from each (re)send.
  std::chrono::milliseconds reply_timeout{60000};
  // How long an I/O thread keeps waiting for a server that answers nothing, probes included
  // (dead or restarting), before failing the request with kUnavailable. The worker sets it from
  // cluster.server_wait_ms.
  std::chrono::milliseconds server_wait{120000};
  // Silence (no message from the server while parts are outstanding) after which the I/O thread
  // sends a heartbeat probe, and the period of probes after that. The "waiting for server"
  // line is logged once two probes' time passed unanswered, then every 5 probe periods
  // (1 s → at 2 s, then every 5 s).
  std::chrono::milliseconds probe_every{1000};
  // The run's secret (runs without keys), sent with register, Checkpoint and Shutdown so the
  // server can tell this process from a stranger (server/access.h). "" = none.
  std::string token;
  // Same-host fast path: ask each server at register for a shared-memory region and move
  // payloads through it instead of the socket (see "Shared memory" above). A server that does
  // not offer one (another host, or ShardOptions::shared_memory off) is used over the socket.
  bool shared_memory = false;
  // Called on a link's I/O thread for every part (one message of a request) the server
  // answered: which server, the request's type (kPush / kPull / control), how many chunks the
  // part carried and the seconds from its last send to its reply (the load benchmark's
  // per-chunk latency percentiles). Keep it short; empty = not called.
  std::function<void(int server, MsgType type, size_t chunks, double seconds)> on_part_reply;
  // Timeline (cluster.trace_events; not owned, outlives the client; null = none): every answered
  // part as a "client" span from its last send to its reply ("push part", "pull part", ...),
  // with its server, chunks and payload bytes, on a track per server ("to server i").
  TraceLog* trace = nullptr;
  // Wire codecs (see "Wire codecs" above; the worker sets them from [compression]). Defaults:
  // lossless f32 both ways.
  WireCodec push_codec = WireCodec::kFp32;  // fp32 | fp16 | bf16 | topk | onebit
  WireCodec pull_codec = WireCodec::kFp32;  // fp32 | fp16 | bf16
  double top_k_fraction = 0.01;             // push_codec topk: fraction of each chunk sent, in (0, 1]
  bool error_feedback = true;               // topk / onebit: keep and resend a per-chunk residual
  uint64_t top_k_warmup = 0;                // push_codec topk: warm-up pushes per chunk (TopKWarmupFraction)
};

// Payload bytes of a push of every chunk of `layout` (frames only; headers are a few hundred
// bytes each) when `factors` hold sufficient factors: per chunk of a factored tensor, batch ×
// the rows it touches × 4; per (factored tensor, server holding some of it) the activations,
// batch × in × 4; every other chunk count × 4. With no factors: total_elems × 4. The scaling
// model and the byte tests count with it (docs/factors.md).
uint64_t FactorPushPayloadBytes(const ParamLayout& layout, std::span<const FactorTensor> factors);

class PsClient {
 public:
  // Starts one I/O thread per server and connects its endpoint. Fails if the address count
  // differs from layout.servers().
  static Status Create(Transport* transport, const ParamLayout& layout, PsClientOptions options,
                       std::unique_ptr<PsClient>* out);
  ~PsClient();  // stops the I/O threads; requests still queued fail

  PsClient(const PsClient&) = delete;
  PsClient& operator=(const PsClient&) = delete;

  // Registers with every server, which checks the layout hash (a mismatch is an error naming
  // both hashes). Blocks up to `timeout`.
  Status Connect(std::chrono::milliseconds timeout);

  // Pulls every chunk (or `chunk_ids`) into `flat_weights_out` (total_elems floats). `clock` is
  // the iteration the worker is about to compute; in sync/ssp mode the server answers only when
  // the consistency rule allows.
  RequestId Pull(std::span<float> flat_weights_out, int64_t clock = 0);
  RequestId PullChunks(std::span<float> flat_weights_out, std::span<const int32_t> chunk_ids,
                       int64_t clock = 0);

  // Pushes gradients of every chunk (or `chunk_ids`, or the tensors [first, end)) computed at
  // iteration `clock` from `flat_grads` (total_elems floats).
  RequestId Push(std::span<const float> flat_grads, int64_t clock);
  //
  // `factors`: tensors of this push whose span holds sufficient factors (FactorTensor). Each
  // (factored tensor, server) goes as ONE message, never through shared memory: that server's
  // chunks of the tensor, each with its δ column block gathered into a buffer the request owns
  // (batch × the chunk's rows), then the activations a borrowed zero-copy from `flat_grads`.
  // Resends after a server restart send the same bytes. A listed tensor that cannot hold
  // factors (rank < 2, batch outside 1..65536, batch×(out+in) > out×in) fails the request
  // (kInvalidArgument naming it) before anything is sent.
  RequestId PushChunks(std::span<const float> flat_grads, std::span<const int32_t> chunk_ids,
                       int64_t clock, std::span<const FactorTensor> factors = {});
  RequestId PushTensors(std::span<const float> flat_grads, int first_tensor, int end_tensor,
                        int64_t clock, std::span<const FactorTensor> factors = {});
  // EASGD's exchange (kFlagElastic): `flat_diff` (all parameters) is α(x_worker − x_center),
  // which every server adds to its chunks of the center. Versions as for a push.
  RequestId PushElastic(std::span<const float> flat_diff, int64_t clock);
  // A model moves on (kFlagMove; multi-model runs, common/rotation.h): `flat_change` (all
  // parameters) is the change of this worker's copy over a stage divided by the stage's group
  // size, which every server adds to its chunks; `batches` (>= 1) the stage's batches. Always
  // sent f32 (exact). Versions as for a push.
  RequestId PushMove(std::span<const float> flat_change, uint32_t batches);
  // Initial weights (Caffe-like: worker 0 pushes its filler's weights once). Servers take them
  // for chunks that have none yet and ignore them otherwise (e.g. after a restore), so every
  // worker may push init; pulls wait until a chunk is initialised.
  RequestId PushInit(std::span<const float> flat_weights);

  // Waits for a request. Ok, the request's error, or kTimeout (the request stays pending and
  // can be waited again). Unknown ids (already waited) are kInvalidArgument.
  Status Wait(RequestId id, std::chrono::milliseconds timeout);
  // The same; for a push, `staleness` (not null) receives each applied chunk's staleness as the
  // servers measured it (versions applied since the version it was computed from, the value
  // they count in their stats), in ack order.
  Status Wait(RequestId id, std::chrono::milliseconds timeout, std::vector<int64_t>* staleness);

  // Versions of each chunk (index = chunk id) as of the last completed pull; -1 = never pulled.
  std::span<const int64_t> last_versions() const { return versions_; }
  // Each chunk's lr-schedule iteration (worker batches the server had applied to it, index =
  // chunk id) as of the last completed pull; -1 = never pulled (or a server that sends none).
  std::span<const int64_t> last_iters() const { return iters_; }

  // Control requests to one server, blocking up to `timeout`.
  Status Stats(int server, ShardStatsWire* out, std::chrono::milliseconds timeout);
  Status Checkpoint(int server, const std::string& path, std::chrono::milliseconds timeout);
  Status Shutdown(int server, std::chrono::milliseconds timeout);
  // Tells every server that this worker has finished iteration `finished_iteration` (a clock
  // message), so sync/ssp accounting knows where a resumed worker stands before it pulls.
  Status ReportClock(int64_t finished_iteration, std::chrono::milliseconds timeout);

  // Moves the link to `server` to `address` (the coordinator reports a restarted server's new
  // address): the link's I/O thread connects a new endpoint, registers again (when it had
  // registered) and resends every part still unanswered. Returns at once; the switch happens on
  // the I/O thread, between messages of an in-flight operation or before the next one. The
  // current address is a no-op. kInvalidArgument for a server outside the layout.
  Status SetServerAddress(int server, const std::string& address);

  // Per server, counted by its link (thread-safe; 0 for a server outside the layout):
  //  acked_pushes   gradient push messages (parts; init pushes not counted) the server
  //                 acknowledged, each part once however often it was sent: with the servers'
  //                 pushes_by_worker it shows that no acknowledged update was lost or doubled.
  //  resent_parts   messages (parts of any request) sent again after a restart, a move or
  //                 a refusal by the server's write-ahead log.
  //  restarts_seen  restarts noticed (new incarnation, a "not registered" refusal after
  //                 registering) and address moves, each answered by registering again.
  uint64_t acked_pushes(int server) const;
  uint64_t resent_parts(int server) const;
  uint64_t restarts_seen(int server) const;
  // Payload bytes that went through shared memory instead of the socket, over all links
  // (thread-safe): push gradients written into regions (sent_bytes, each send of a part, resends
  // too) and pulled weights read out of them (received_bytes). The transport's own counters
  // (Transport::traffic) see only those messages' headers. Message counts stay 0.
  TrafficCounts shared_memory_traffic() const;

  // This client's session (random, nonzero, fixed for its lifetime), sent in every message.
  uint64_t session() const { return session_; }

  const ParamLayout& layout() const { return layout_; }

  struct Impl;  // per-server links and request table (ps_client.cc)

 private:
  PsClient(const ParamLayout& layout, PsClientOptions options);
  RequestId Submit(MsgType type, std::span<float> out, std::span<const float> in,
                   std::span<const int32_t> chunk_ids, bool all_chunks, int64_t clock,
                   uint32_t flags, std::span<const FactorTensor> factors = {}, uint32_t move_batches = 0);

  ParamLayout layout_;
  PsClientOptions options_;
  uint64_t session_ = 0;
  std::vector<int64_t> versions_;  // per chunk, written by the owning server's I/O thread
  std::vector<int64_t> iters_;     // per chunk, likewise (pull replies' scheduleIters)
  std::unique_ptr<Impl> impl_;
};

}  // namespace downpour
