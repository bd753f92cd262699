// shard.h — one parameter-server shard: fp32 master weights + momentum history for the chunks
// the layout (common/layout.h) deals to this server, per-chunk version counters, the message
// loop over a ServerEndpoint, validation, consistency (server/consistency.h) and checkpoints.
//
// Messages served (common/messages.capnp): register, pull, push (gradients, or initial weights
// with kFlagInit), clock, stats, checkpoint, heartbeat (liveness probe), shutdown.
//
// Validation. Every message is validated before it touches a weight: decodable header, a type
// this server serves, registered sender (the peer that registered under that id), layout hash,
// model id, chunk ids known and owned here (no duplicates), dtype/encoding (f32 dense today),
// element count vs the layout, payload byte length vs the header and the frame, optional
// CRC-32C, finite values, and the consistency policy's clock rules. A push is checked whole
// before any chunk is applied, so a bad push never partially applies. A bad message gets an
// error reply naming the field and the values (undecodable headers too: the peer is known);
// every refusal is counted by reason (ShardStatsWire::rejected_by_reason).
//
// Authorisation (server/access.h, ShardOptions::access): checkpoint and shutdown only from the
// admin role (keys) or with the run's secret (no keys); a checkpoint path from the wire must
// resolve inside the run directory; register as a worker needs the worker role / the secret;
// with keys, push / pull / clock also need the worker role. Stats and heartbeat are open (they
// change nothing). Refusals are counted (kUnauthorized, kOutsideRunDir), answered with an error
// reply that says what was refused, and logged at a bounded rate (common/log_limit.h).
//
// Initial weights. Chunks start uninitialised; the first init push for a chunk sets its weights
// (Caffe-like: worker 0 pushes its filler's weights), later init pushes are acknowledged and
// ignored. A restored checkpoint initialises every chunk. Pulls of uninitialised chunks wait,
// gradients for them are refused (kNotInitialized).
//
// Update. Async/ssp: each validated gradient is applied on arrival with SgdUpdate at
// lr = LearningRateAt(solver, chunk version) (× 1/staleness if staleness_aware_lr); sync
// averages a clock's gradients first. Staleness = chunk version now − version the push was
// computed from (≥ 0), counted in a histogram. Gradient clipping by global norm is not
// applied here (it needs every shard's norm): each worker clips before pushing.
//
// Checkpoints: SaveCheckpoint/LoadCheckpoint (common/tensor_file.h, atomic), on a checkpoint
// message, and every `checkpoint_every_updates` applied updates of the shard.
//
// Pull replies are zero-copy: a reply frame shares the chunk's weight buffer; an update that
// finds the buffer still shared with an in-flight reply first gives the chunk a fresh copy
// (copy-on-write), so a reply is never torn and the hot path copies nothing when the
// transport has finished.
//
// Thread-safety: Serve() runs the loop on one thread; Stop(), MarkWorkerGone(), Stats(),
// ChunkWeights() and ChunkVersion() may be called from any thread (one mutex guards the state).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/codec.h"
#include "common/layout.h"
#include "common/log_limit.h"
#include "common/run_config.h"
#include "common/transport.h"
#include "server/access.h"
#include "server/consistency.h"

namespace downpour {

// One served pull, as the consistency log records it (ShardOptions::on_pull_served).
struct PullServedEvent {
  int32_t worker = 0;        // who pulled
  int64_t clock = 0;         // the clock the pull was made at (iterations the worker finished)
  int64_t min_live_clock = 0;  // slowest live worker's clock when served; INT64_MAX if none
  double waited_s = 0;       // time the pull was held back by the consistency policy
  int chunks = 0;            // chunks served
  int64_t version_sum = 0;   // sum of the served chunks' versions
};

struct ShardOptions {
  int server_id = 0;                   // which of layout.servers() this is
  uint32_t model_id = 0;               // model served (several models later)
  SolverConfig solver;                 // update rule and lr policy
  ConsistencyConfig consistency;       // async / sync / ssp:s
  int expected_workers = 1;            // W: worker ids 0..W-1 (sync/ssp accounting)
  int64_t checkpoint_every_updates = 0;  // 0 = off; else save after every n updates of the shard
  std::string checkpoint_path;         // where periodic / default checkpoints go ("" = none)
  std::chrono::milliseconds poll_interval{20};  // loop wakes this often to check Stop / waits
  int staleness_buckets = 32;          // histogram buckets; the last one is ">= buckets-1"
  // Called for every served pull, on the loop thread with the shard's lock held: keep it short
  // (downpour-server appends one JSONL line, which is how the ssp bound is checked from logs).
  std::function<void(const PullServedEvent&)> on_pull_served;
  // Who may checkpoint, shut down, register and push (server/access.h). The default checks no
  // token and confines wire checkpoint paths to an empty run_dir (i.e. refuses them).
  AccessPolicy access;
};

class ShardServer {
 public:
  // Fails (InvalidArgument) if server_id is outside the layout's servers.
  static Status Create(const ParamLayout& layout, ShardOptions options, std::unique_ptr<ShardServer>* out);
  ~ShardServer();

  // Runs the message loop on the calling thread until a shutdown message or Stop(). Returns the
  // endpoint's error if receiving fails for another reason than a timeout.
  Status Serve(ServerEndpoint* endpoint);
  // Runs Serve on a thread of its own, owning `endpoint`; Join() waits and returns its status.
  void Start(std::unique_ptr<ServerEndpoint> endpoint);
  Status Join();
  void Stop();  // thread-safe; Serve returns within poll_interval

  // Thread-safe. The coordinator reported `worker` gone — it finished, or it fell silent and
  // was declared dead; either way sync/ssp accounting drops it.
  void MarkWorkerGone(int32_t worker, bool finished);

  // Thread-safe snapshots (tests, benchmarks, logging).
  ShardStatsWire Stats() const;
  std::vector<float> ChunkWeights(int32_t chunk) const;  // empty if not owned / not initialised
  int64_t ChunkVersion(int32_t chunk) const;             // -1 if not owned
  int64_t updates() const;                               // applied chunk updates
  bool shutdown_requested() const { return shutdown_.load(); }

  // Atomic checkpoint of this shard (meta: server id/count, layout hash, model id, versions;
  // tensors: per chunk weights and history). Load refuses a file of another layout / server.
  Status SaveCheckpoint(const std::string& path);
  Status LoadCheckpoint(const std::string& path);

  const ParamLayout& layout() const { return layout_; }

 private:
  struct ChunkState;
  struct PendingPull;
  class Updater;

  ShardServer(const ParamLayout& layout, ShardOptions options);

  void HandleMessage(ServerEndpoint* ep, const PeerId& peer, const PeerInfo& info, Frames& frames);
  Status HandleRegister(const PeerId& peer, const PeerInfo& info, const MessageHeader& h, MessageHeader* reply,
                        RejectReason* reason);
  Status HandleCheckpoint(const PeerInfo& info, const MessageHeader& h, MessageHeader* reply, RejectReason* reason);
  Status CheckWorker(const PeerId& peer, const PeerInfo& info, const MessageHeader& h, RejectReason* reason) const;
  Status CheckSender(const PeerId& peer, const MessageHeader& h, RejectReason* reason) const;
  // A push from a sender CheckWorker has accepted: validated whole, then applied.
  Status HandlePush(const MessageHeader& h, const Frames& frames, MessageHeader* reply, RejectReason* reason);
  Status ResolveChunks(const MessageHeader& h, bool all_if_empty, std::vector<int>* locals,
                       RejectReason* reason) const;
  bool PullReady(const PendingPull& p) const;
  void ServePull(ServerEndpoint* ep, const PendingPull& p);
  void ServePending(ServerEndpoint* ep);
  void Reply(ServerEndpoint* ep, const PeerId& peer, const MessageHeader& h, Frames payload = {});
  void Reject(ServerEndpoint* ep, const PeerId& peer, const PeerInfo& info, const MessageHeader& request,
              const Status& status, RejectReason reason);
  void MaybeCheckpoint();
  ShardStatsWire StatsLocked() const;
  Status SaveCheckpointLocked(const std::string& path);
  std::vector<float>& MutableWeights(int local);
  void ApplyGradient(int local, const float* grad, float grad_scale, float lr_scale);

  const ParamLayout layout_;
  const ShardOptions options_;
  std::vector<int32_t> owned_;        // chunk ids owned, ascending
  std::vector<int> local_of_;         // chunk id -> local index or -1

  mutable std::mutex mu_;  // guards everything below
  std::vector<ChunkState> chunks_;
  std::unique_ptr<ConsistencyPolicy> policy_;
  std::unique_ptr<Updater> updater_;
  std::unordered_map<PeerId, int32_t> registered_;  // peer identity -> worker id
  std::vector<PendingPull> pending_;
  ShardStatsWire stats_;
  int64_t updates_ = 0;
  int64_t updates_at_last_checkpoint_ = 0;
  std::vector<std::pair<int32_t, bool>> gone_queue_;  // (worker, finished) from MarkWorkerGone, for the loop
  RateLimitedLog refusal_log_;                        // refusals a stranger can provoke: a bounded number of lines

  std::atomic<bool> stop_{false};
  std::atomic<bool> shutdown_{false};
  std::thread thread_;
  Status thread_status_;
  std::unique_ptr<ServerEndpoint> owned_endpoint_;
};

}  // namespace downpour
