// ps_client.h — PsClient, a worker's client of the parameter servers: Pull/Push return a RequestId, Wait its Status.
//
// Buffers: flat, layout.total_elems() floats in layout order (common/layout.h), borrowed without
// copying: keep one alive (a pull's unread, a push's unmodified) until Wait(id) returns anything
// but kTimeout, or the client is destroyed.
//
// Concurrency: one I/O thread per connection (connections_per_server per server, each carrying
// a fixed share of the server's chunks) keeps the parts of all requests in flight together (up
// to max_inflight_bytes), in call order on that connection (or by layer, send_order): a Pull
// issued after a Push is served, chunk by chunk, after that push is applied. Every error (argument, refusal, timeout,
// transport) comes from Wait.
//
// Server restarts: a link keeps each part until its reply; on a restart (new incarnation, "not
// registered") or a move (SetServerAddress) it registers again and resends every unanswered part,
// which the servers apply once (docs/operations.md "What a worker does while a server restarts").
//
// Thread-safety: any method, any thread; Wait for one id from one thread. The Transport and
// options.trace are not owned and must outlive the client.
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
#include "common/config/cluster.h"
#include "common/config/compression.h"
#include "common/grad_codec.h"
#include "common/layout.h"
#include "common/status.h"
#include "common/trace.h"
#include "common/transport.h"

namespace downpour {

using RequestId = uint64_t;

// A tensor whose span of a push's buffer holds sufficient factors, not its gradient: δ packed in
// the layout's per-chunk row blocks (common/layout.h FactorRowBlocks, PackRowBlocks), then a
// (batch × in) (docs/factors.md).
struct FactorTensor {
  int tensor = -1;  // index into layout.tensors()
  int batch = 0;    // B, 1..65536
};

struct PsClientOptions {
  std::vector<std::string> server_addresses;  // index = server id; size = layout.servers()
  int32_t worker_id = 0;                      // id given at rendezvous (coordinator)
  Role role = Role::kWorker;  // kEvaluator: a reader that may only pull, served at once in any mode
  uint32_t model_id = 0;                      // model served (multi-model runs, docs/multi_model.md)
  bool checksums = false;                     // send CRC-32C per push frame (servers verify)
  // Chunks per message (0 = a server's share in one). A server validates and applies each
  // message whole, so when one is refused other messages of the same Push may have applied.
  int max_chunks_per_message = 1;
  // Payload outstanding per connection and way (> 0): pushes (and other requests) sent and not
  // answered, and, apart, pulls asked for and not received; a larger part goes alone on an
  // empty window (cluster.inflight_mb).
  uint64_t max_inflight_bytes = uint64_t{128} << 20;
  // Which waiting part goes next when the window has room (cluster.send_order): call order, or
  // by layer — the part whose first chunk comes first in the layout (the next forward reads it
  // first) overtakes parts made before it, except parts of the same chunks, a control request,
  // an init or move push, or (for a push) a push of a lower clock, which keep call order; a
  // request waiting for half of reply_timeout goes first. Through a same-host region: call order.
  SendOrder send_order = SendOrder::kCall;
  // How long a server that answers probes may hold a request, from each (re)send; then kTimeout.
  std::chrono::milliseconds reply_timeout{60000};
  // Silence (dead or restarting server) after which a request fails (kUnavailable); also how
  // long a part the server's write-ahead log refuses is resent before it fails (kIoError).
  std::chrono::milliseconds server_wait{120000};
  std::chrono::milliseconds probe_every{1000};  // silence before a heartbeat probe, and probe period
  std::string token;  // run secret sent with register, Checkpoint, Shutdown (server/access.h); "" = none
  bool shared_memory = false;  // ask same-host servers for a shared-memory region (common/shm_region.h)
  // Connections (each with its I/O thread) to every server, 1..kMaxConnectionsPerServer
  // (cluster.connections_per_server): chunk c of a server travels on its connection c % n, so a
  // chunk's requests keep their order. Each connection registers on its own. 1 with
  // shared_memory (the region carries the payloads).
  int connections_per_server = 1;
  // On an I/O thread per answered part (seconds: its last send to its reply); short; empty = none.
  std::function<void(int server, MsgType type, size_t chunks, double seconds)> on_part_reply;
  // On an I/O thread, once per push part a server acknowledged (init pushes included): the
  // (session, request id) it logged the part under (checkpoint.history, common/ack_history.h).
  std::function<void(int server, uint64_t session, uint64_t request_id)> on_push_acked;
  TraceLog* trace = nullptr;  // not owned; a span per answered part, track "to server i"; null = none
  // [compression] as the run gives it: the push and pull codecs, top-k's fraction and warm-up,
  // error feedback (docs/compression.md). Its factors and factor_threads are the worker's and the
  // servers' business.
  CompressionConfig compression;
};

// Payload bytes of an f32 push of every chunk when `factors` hold sufficient factors
// (docs/factors.md); with compression.push fp16 / bf16 its factors take 2 bytes a value where
// they fit.
uint64_t FactorPushPayloadBytes(const ParamLayout& layout, std::span<const FactorTensor> factors);

class PsClient {
 public:
  // Starts one I/O thread per connection (connections_per_server per server). kInvalidArgument if the address count is not
  // layout.servers() or an option is out of range; the transport's error if a connect fails.
  static Status Create(Transport* transport, const ParamLayout& layout, PsClientOptions options,
                       std::unique_ptr<PsClient>* out);
  ~PsClient();  // stops the I/O threads; requests queued or in flight fail (kUnavailable)

  PsClient(const PsClient&) = delete;
  PsClient& operator=(const PsClient&) = delete;

  // Registers with every server (a layout hash mismatch is an error naming both); up to `timeout`.
  Status Connect(std::chrono::milliseconds timeout);

  // Pulls every chunk (or `chunk_ids`) into `flat_weights_out`. `clock`: the iteration about to
  // be computed; under sync/ssp a server answers only when its consistency rule allows.
  RequestId Pull(std::span<float> flat_weights_out, int64_t clock = 0);
  RequestId PullChunks(std::span<float> flat_weights_out, std::span<const int32_t> chunk_ids,
                       int64_t clock = 0);
  // The same, the weights kept in compression.pull's 16 bits (fp16 / bf16; kInvalidArgument for
  // fp32) for a worker whose device widens them (engine::Net::SetWeightDType): the replies are
  // checked (finite) and copied as they are. Through a same-host region, which carries f32, the
  // client casts them, so the worker computes on the codec's weights either way.
  RequestId Pull16(std::span<uint16_t> flat_weights_out, int64_t clock = 0);
  RequestId PullChunks16(std::span<uint16_t> flat_weights_out, std::span<const int32_t> chunk_ids, int64_t clock = 0);

  // Pushes the gradients of every chunk (or `chunk_ids`, or tensors [first, end)) computed at `clock`.
  RequestId Push(std::span<const float> flat_grads, int64_t clock);
  // `factors`: tensors whose span holds sufficient factors, sent one message per (tensor,
  // server), each chunk's frame borrowed from its packed block (no copy): from `cast` when given
  // (16-bit, as the device cast them), else f32 from the flat buffer, cast to compression.push's
  // fp16 / bf16 by the link's I/O thread (f32 where a value does not fit). One that cannot hold
  // them fails the request (kInvalidArgument) before any send.
  // `versions` (empty, or one per chunk of the layout): the version each chunk's gradient was
  // computed from, when that is not the last pulled (a worker computing on older weights than
  // it has received); the servers measure staleness from it.
  // `cast` (empty, or one per float of the layout): the gradient already cast to compression.push's
  // 16-bit dtype (fp16 / bf16) by the worker's device (engine::Net::SetGradDType), a factored
  // tensor's factors included, read for every chunk and sent as it is: the I/O thread converts
  // nothing. Any other size or codec fails the request (kInvalidArgument).
  RequestId PushChunks(std::span<const float> flat_grads, std::span<const int32_t> chunk_ids, int64_t clock,
                       std::span<const FactorTensor> factors = {}, std::span<const int64_t> versions = {},
                       std::span<const uint16_t> cast = {});
  RequestId PushTensors(std::span<const float> flat_grads, int first_tensor, int end_tensor,
                        int64_t clock, std::span<const FactorTensor> factors = {});
  // EASGD (kFlagElastic): `flat_diff` = α(x_worker − x_center), added to the servers' center.
  RequestId PushElastic(std::span<const float> flat_diff, int64_t clock);
  // Multi-model move (kFlagMove): `flat_change` is added as is, sent f32; `batches` >= 1.
  RequestId PushMove(std::span<const float> flat_change, uint32_t batches);
  // Initial weights: taken for chunks that have none, ignored otherwise; pulls wait for them.
  RequestId PushInit(std::span<const float> flat_weights);

  // Blocks up to `timeout` for a request: its status, or kTimeout (the request stays pending and
  // may be waited again). An unknown or already-waited id is kInvalidArgument.
  Status Wait(RequestId id, std::chrono::milliseconds timeout);
  // The same; for a push, `staleness` (if not null) gets each applied chunk's staleness, in ack order.
  Status Wait(RequestId id, std::chrono::milliseconds timeout, std::vector<int64_t>* staleness);

  // Per chunk, as of the last completed pull (-1 = never pulled): the version, and the
  // lr-schedule iteration (-1 also from a server that sends none). Stable only while no pull runs.
  std::span<const int64_t> last_versions() const { return versions_; }
  std::span<const int64_t> last_iters() const { return iters_; }

  // Control requests to one server, blocking up to `timeout`. Checkpoint's path "" = the
  // server's own. kInvalidArgument for a server outside the layout.
  Status Stats(int server, ShardStatsWire* out, std::chrono::milliseconds timeout);
  Status Checkpoint(int server, const std::string& path, std::chrono::milliseconds timeout);
  Status Shutdown(int server, std::chrono::milliseconds timeout);
  // Tells every server this worker finished `finished_iteration` (a resumed worker, before pulling).
  Status ReportClock(int64_t finished_iteration, std::chrono::milliseconds timeout);

  // Fails every operation in flight, and every later one, with `why` (not ok), within an I/O
  // tick: for a process that is out of the run and must not wait on servers. Thread-safe; the
  // first reason stays.
  void Abort(Status why);

  // Moves the link to `server` to `address` (registers again, resends); returns at once, the I/O
  // thread switches between messages. kInvalidArgument: server outside the layout, empty address.
  Status SetServerAddress(int server, const std::string& address);

  // Per server (thread-safe; 0 outside the layout): push parts acknowledged (each once, init not
  // counted), parts resent (restart, move, log refusal), restarts and moves noticed, and requests
  // its links' threads have taken from their queues (registers included), sent or not.
  uint64_t acked_pushes(int server) const;
  uint64_t resent_parts(int server) const;
  uint64_t restarts_seen(int server) const;
  uint64_t taken_requests(int server) const;
  // Payload bytes through shared memory (thread-safe): sent = pushes and resends, received = pulls.
  TrafficCounts shared_memory_traffic() const;

  uint64_t session() const { return session_; }  // random, nonzero, fixed; sent in every message

  const ParamLayout& layout() const { return layout_; }
  DType pull_dtype() const { return CodecDType(options_.compression.pull); }  // what Pull16 keeps

  struct Impl;  // per-server links and request table (ps_client.cc)

 private:
  PsClient(const ParamLayout& layout, PsClientOptions options);
  RequestId Submit(MsgType type, std::span<float> out, std::span<const float> in, std::span<const int32_t> chunk_ids,
                   bool all_chunks, int64_t clock, uint32_t flags, std::span<const FactorTensor> factors = {},
                   uint32_t move_batches = 0, std::span<const int64_t> push_versions = {},
                   std::span<const uint16_t> cast = {}, std::span<uint16_t> out16 = {});

  ParamLayout layout_;
  PsClientOptions options_;
  uint64_t session_ = 0;
  std::vector<int64_t> versions_;  // per chunk, written by the owning server's I/O thread
  std::vector<int64_t> iters_;     // per chunk, likewise (pull replies' scheduleIters)
  std::unique_ptr<Impl> impl_;
};

}  // namespace downpour
