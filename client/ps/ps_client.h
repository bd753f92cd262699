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
// Concurrency: one in-flight request per server (DESIGN.md); requests are queued per server in
// call order and run on one I/O thread per server, so servers work in parallel. Errors (a
// server's error reply, a timeout, a transport failure) are attached to the request and
// returned by its Wait; errors not tied to a request surface at the next Wait.
//
// Server restarts: a restarted server (same address, e.g. from --restore) has forgotten this
// client's registration; after Connect() succeeded once, the client registers again on its own
// and resends exactly the parts the server refused for that reason (refused parts were not
// applied, so nothing is applied twice).
//
// Versions: each pull records the version of every chunk it received (last_versions()); each
// push carries, per chunk, the version its gradient was computed from (the last pulled one),
// so the server measures staleness.
//
// Thread-safety: all methods may be called from any thread; Wait(id) for a given id from one
// thread. last_versions() is stable only while no pull is in flight. The Transport must
// outlive the client.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/codec.h"
#include "common/layout.h"
#include "common/status.h"
#include "common/transport.h"

namespace downpour {

using RequestId = uint64_t;

struct PsClientOptions {
  std::vector<std::string> server_addresses;  // index = server id; size = layout.servers()
  int32_t worker_id = 0;                      // id given at rendezvous (coordinator)
  uint32_t model_id = 0;                      // several models on one set of servers (later)
  bool checksums = false;                     // send CRC-32C per push frame (servers verify)
  // A request to one server is sent as messages of at most this many chunks (0 = one message),
  // so the server applies part k while part k+1 is on the wire. The server validates and
  // applies each message as a whole: a rejected part never applies, but the other parts of the
  // same Push may have been applied (Wait reports the first error).
  int max_chunks_per_message = 4;
  // How long an I/O thread waits for one server reply before failing the request.
  std::chrono::milliseconds reply_timeout{60000};
  // The run's secret (runs without keys), sent with register, Checkpoint and Shutdown so the
  // server can tell this process from a stranger (server/access.h). "" = none.
  std::string token;
};

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
  RequestId PushChunks(std::span<const float> flat_grads, std::span<const int32_t> chunk_ids,
                       int64_t clock);
  RequestId PushTensors(std::span<const float> flat_grads, int first_tensor, int end_tensor,
                        int64_t clock);
  // Initial weights (Caffe-like: worker 0 pushes its filler's weights once). Servers take them
  // for chunks that have none yet and ignore them otherwise (e.g. after a restore), so every
  // worker may push init; pulls wait until a chunk is initialised.
  RequestId PushInit(std::span<const float> flat_weights);

  // Waits for a request. Ok, the request's error, or kTimeout (the request stays pending and
  // can be waited again). Unknown ids (already waited) are kInvalidArgument.
  Status Wait(RequestId id, std::chrono::milliseconds timeout);

  // Versions of each chunk (index = chunk id) as of the last completed pull; -1 = never pulled.
  std::span<const int64_t> last_versions() const { return versions_; }

  // Control requests to one server, blocking up to `timeout`.
  Status Stats(int server, ShardStatsWire* out, std::chrono::milliseconds timeout);
  Status Checkpoint(int server, const std::string& path, std::chrono::milliseconds timeout);
  Status Shutdown(int server, std::chrono::milliseconds timeout);
  // Tells every server that this worker has finished iteration `finished_iteration` (a clock
  // message), so sync/ssp accounting knows where a resumed worker stands before it pulls.
  Status ReportClock(int64_t finished_iteration, std::chrono::milliseconds timeout);

  const ParamLayout& layout() const { return layout_; }

  struct Impl;  // per-server links and request table (ps_client.cc)

 private:
  PsClient(const ParamLayout& layout, PsClientOptions options);
  RequestId Submit(MsgType type, std::span<float> out, std::span<const float> in,
                   std::span<const int32_t> chunk_ids, bool all_chunks, int64_t clock,
                   uint32_t flags);

  ParamLayout layout_;
  PsClientOptions options_;
  std::vector<int64_t> versions_;  // per chunk, written by the owning server's I/O thread
  std::atomic<bool> connected_{false};  // Connect() succeeded: re-register after a server restart
  std::unique_ptr<Impl> impl_;
};

}  // namespace downpour
