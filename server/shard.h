// shard.h — one parameter-server shard: fp32 master weights + momentum history for the chunks
// the layout (common/layout.h) deals to this server, per-chunk version counters, the message
// loop over a ServerEndpoint, validation, consistency (server/consistency.h) and checkpoints.
//
// Messages served (common/messages.capnp): register, pull, push (gradients, or initial weights
// with kFlagInit), clock, stats, checkpoint, heartbeat (liveness probe), shutdown.
//
// Validation. Every message is validated before it touches a weight: decodable header, a type
// this server serves, registered sender (the peer that registered under that id), layout hash,
// model id, chunk ids known and owned here (no duplicates), dtype/encoding, element count vs
// the layout, payload byte length vs the header and the frame, optional CRC-32C, finite values,
// and the consistency policy's clock rules. A lossy push (f16 / bf16, top-k, 1-bit:
// common/grad_codec.h) is decoded to f32 dense first, every frame validated whole (lengths,
// indices, k, finite values and scales), so the checks after it and the update see f32 dense
// (the write-ahead log keeps it as it came when that is smaller: below); init pushes and
// shared-memory pushes must be f32 dense. A pull asking
// for dtype f16 / bf16 gets its weights converted (masters stay f32), except through shared
// memory, which carries f32. A push is checked whole
// before any chunk is applied, so a bad push never partially applies. A bad message gets an
// error reply naming the field and the values (undecodable headers too: the peer is known);
// every refusal is counted by reason (ShardStatsWire::rejected_by_reason).
//
// Authorisation (server/access.h, ShardOptions::access): checkpoint and shutdown only from the
// admin role (keys) or with the run's secret (no keys); a checkpoint path from the wire must
// resolve inside the run directory; register as a worker needs the worker role / the secret;
// with keys, push / pull / clock also need the worker role. Stats and heartbeat are open (they
// change nothing).
//
// The evaluator (Role::kEvaluator, downpour-evaluator): registers as a reader (Privilege
// kEvaluate: the worker key, or the run's secret), at most kMaxReaders connections (the oldest
// is dropped). A reader's pull is served as soon as its chunks have weights, whatever the
// consistency rule (a snapshot, not a step of training), records nothing in the policy or
// DC-ASGD's pulled copies and is counted in stats.evaluator_pulls, not pulls_served. A reader
// may not push or clock: those need a worker registration on the connection. Every pull reply
// carries each chunk's lr-schedule iteration (scheduleIters), which places a snapshot on the
// run's images-processed axis. Refusals are counted (kUnauthorized, kOutsideRunDir), answered with an error
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
// Model moves (multi-model runs, ShardOptions::model_moves; common/rotation.h): a push with
// kFlagMove carries a model's change over a stage of local training, which is added as it is
// (no lr, momentum or decay), counts as one update of every chunk it names and advances the
// chunks' lr-schedule iteration by header.move_batches (1..kMaxMoveBatches); it is logged (the
// batches in the record's clock) and replayed like any push, and refused by a one-model server.
//
// Checkpoints: SaveCheckpoint/LoadCheckpoint (the file's codec: shard_checkpoint.h; written
// atomically, common/tensor_file.h), on a checkpoint
// message, and every `checkpoint_every_updates` applied updates of the shard. A checkpoint holds
// everything the shard's behaviour depends on: weights, history, versions, the consistency
// policy's state (membership, sync's partial sums), DC-ASGD-a's running mean squares, the
// duplicate-push window, pushes_by_worker, and the write-ahead log seq it covers ("wal_seq").
// Not DC-ASGD's per-worker pulled copies (as big as the model per worker): after a restart a
// worker's pushes go uncompensated, and counted, until it pulls again. The log holds a DC-ASGD
// push as compensated (what was applied) and, for DC-ASGD-a, the raw gradient as well (its
// mean square is made of those): replay rebuilds both exactly.
//
// Write-ahead log (server/wal.h, ShardOptions::wal_path): every push (init pushes too), clock,
// worker-gone and elastic join the shard takes is appended to the log BEFORE it is applied and
// acknowledged (a lossy or sufficient-factor push as the wire carried it, kCodedPush, when that
// is fewer bytes than its f32 gradient and the algorithm is not DC-ASGD; replay forms and
// decodes it again through DensifyPush); the log is fsynced at least every wal_fsync_ms, on the
// log's own thread (0: before every ack). After a checkpoint to the shard's own path the log restarts empty. Recover() = load the checkpoint
// (if any) + replay the log records it does not cover, through the same apply code as the
// live path: the shard is then byte for byte what it was when the process died, and every
// acknowledged push is in it. A torn last record (never acknowledged) is dropped with one log
// line; any other damage is an error naming the file, offset and field. A message the log
// cannot take (disk full, I/O error) is refused with an I/O error reply, not applied and counted
// under kLogWrite. Once the log takes nothing more (a failed fsync, a record it could not cut
// off: WalWriter::Append), the shard fails-stop as a crash would: that message goes unanswered,
// Serve returns the log's error, and the process is to be restarted from its checkpoint and log
// (downpour-launch does), where the sender's client resends what was not acknowledged.
//
// Idempotent pushes: a push is named by (sender, header.session, header.request_id). The shard
// keeps, per worker, the request ids of its last kDedupSessions sessions, at most
// kDedupIdsPerSession each (oldest forgotten first); a push whose name is there is answered
// with an ordinary ack (current versions) and not applied (stats.duplicates). The window is
// ample: a client resends only its outstanding parts, a few dozen messages, within seconds.
// It is saved in checkpoints and rebuilt by replay, so a push resent to a restarted server is
// not applied twice. session 0 (a client that names no session) is never deduplicated.
//
// Version range: a gradient whose version_from is < 0 or > the chunk's version is refused
// (RejectReason::kVersion), so a forged version cannot wrap the staleness arithmetic.
//
// Workers: ids 0..max_workers-1 (ShardOptions::max_workers; 0 = expected_workers). A register
// with an id outside that range is refused (kNotRegistered), so every per-worker table is
// bounded; at most kPeersPerWorker connections stay registered per id (the oldest is dropped:
// a restarted worker registers on a new connection). Ids >= expected_workers are elastic and
// join the sync/ssp accounting when they register (consistency.h).
//
// Stability guard: over the last kStalenessWindow chunk updates, when the mean staleness is
// >= 4 and >= the number of live workers (more than the ~W-1 a healthy async run of W workers
// shows) and consistency.staleness_aware_lr is off, one warning names the numbers and the
// settings that help (consistency.staleness_aware_lr = true, or a smaller solver.base_lr).
//
// Incarnation: every reply (errors, heartbeats and register replies included) carries a
// random nonzero incarnation chosen when the ShardServer is created, so a client can tell a
// restarted server from the one it talked to.
//
// Pull replies are zero-copy: a reply frame shares the chunk's weight buffer; an update that
// finds the buffer still shared with an in-flight reply first gives the chunk a fresh copy
// (copy-on-write), so a reply is never torn and the hot path copies nothing when the
// transport has finished.
//
// Thread-safety: Serve() runs the loop on one thread; Stop(), MarkWorkerGone(), Stats(),
// ChunkWeights(), ChunkHistory() and ChunkVersion() may be called from any thread (one mutex
// guards the state). Recover() and OpenLog() before Serve, on one thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/buffer_pool.h"
#include "common/codec.h"
#include "common/layout.h"
#include "common/log_limit.h"
#include "common/run_config.h"
#include "common/shm_region.h"
#include "common/trace.h"
#include "common/transport.h"
#include "server/access.h"
#include "server/consistency.h"
#include "server/request_check.h"
#include "server/wal.h"

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
  uint32_t model_id = 0;               // model served (a ModelHost routes by it: server/model_host.h)
  SolverConfig solver;                 // update rule and lr policy
  ConsistencyConfig consistency;       // async / sync / ssp:s
  int expected_workers = 1;            // W: worker ids 0..W-1 (sync/ssp accounting)
  // Worker batches one push's gradient averages (the run's worker.push_every): the lr schedule's
  // iteration advances by this per worker gradient applied (common/solver/lr_policy.h).
  int batches_per_push = 1;
  int factor_threads = 1;  // threads forming factor chunks' gradients (compression.factor_threads)
  // Threads for a shard's element-wise work: updates, finite checks of pushes, fp16/bf16 pull
  // conversion (cluster.server_threads; the same floats at any count).
  int server_threads = 1;
  // Timeline (cluster.trace_events; not owned, outlives the shard; null = none): the loop's
  // spans go on track `trace_track` (common/trace.h, docs/operations.md "Timelines").
  TraceLog* trace = nullptr;
  int trace_track = 0;
  int64_t checkpoint_every_updates = 0;  // 0 = off; else save after every n updates of the shard
  std::string checkpoint_path;         // where periodic / default checkpoints go ("" = none)
  std::chrono::milliseconds poll_interval{20};  // loop wakes this often to check Stop / waits
  int staleness_buckets = 32;          // histogram buckets; the last one is ">= buckets-1"
  // Called for every served pull, on the loop thread with the shard's lock held: keep it short
  // (downpour-server appends one JSONL line, which is how the ssp bound is checked from logs).
  std::function<void(const PullServedEvent&)> on_pull_served;
  // Sync: who each round waits for (server/consistency.h RoundMembers); empty = every live worker.
  // Set for a multi-model pipeline whose stages' holders of this model train it together.
  RoundMembers round_members;
  // Who may checkpoint, shut down, register and push (server/access.h). The default checks no
  // token and confines wire checkpoint paths to an empty run_dir (i.e. refuses them).
  AccessPolicy access;
  // Worker ids accounted for: 0..max_workers-1; 0 = expected_workers. Must be >= it otherwise.
  int max_workers = 0;
  // cluster.reply_order = "step": a ModelHost's loop (server/model_host.h) takes the messages
  // waiting for it one worker's step at a time (read from model 0's shard).
  bool serve_by_step = false;
  // Write-ahead log (server/wal.h); "" = none (checkpoints only: a dying server loses the
  // updates since its last checkpoint). downpour-server: ServerWalPath (server/run_dir.h).
  std::string wal_path;
  std::chrono::milliseconds wal_fsync_ms{200};  // fsync the log at least this often; 0 = every ack
  // Offer a shared-memory region to workers on this host that ask for one at register
  // (PsClientOptions::shared_memory): payloads then skip the socket.
  bool shared_memory = true;
  // A multi-model server (server/model_host.h): take move pushes (kFlagMove), the change of a
  // model's weights over a stage of local training, as a model moves between workers.
  bool model_moves = false;
};

// What Recover() did.
struct RecoverReport {
  bool checkpoint_loaded = false;
  int64_t checkpoint_updates = 0;  // the checkpoint's applied chunk updates
  uint64_t checkpoint_seq = 0;     // the last log seq the checkpoint covers
  uint64_t replayed = 0;           // log records replayed after the checkpoint
  uint64_t replayed_pushes = 0;    // of which pushes
  bool torn_tail = false;          // a torn last record was dropped
};

// The largest clock (iterations) a worker may report; beyond it a message is refused (kClock),
// so forged clocks cannot overflow the consistency arithmetic.
inline constexpr int64_t kMaxClock = int64_t{1} << 48;

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

  // Serve's parts, for a process that serves several models on one endpoint
  // (server/model_host.h): Handle takes one received message (any thread may call it, one at a
  // time: Serve's loop or the host's), Tick serves the pulls the consistency policy released and
  // flushes the bounded logs (after every receive or timeout), Finish flushes and syncs the
  // write-ahead log once the loop has ended. Call OpenLog before the first Handle.
  void Handle(ServerEndpoint* ep, const PeerId& peer, const PeerInfo& info, Frames& frames);
  void Tick(ServerEndpoint* ep);
  Status Finish();
  const ShardOptions& options() const { return options_; }

  // Thread-safe. The coordinator reported `worker` gone — it finished, or it fell silent and
  // was declared dead; either way sync/ssp accounting drops it.
  void MarkWorkerGone(int32_t worker, bool finished);

  // Rebuilds the state a dead process of this shard had: loads options.checkpoint_path if it
  // exists, then replays options.wal_path if it exists (records after the checkpoint's seq),
  // drops a torn last record, and leaves the log open for appending. Either file may be
  // missing (a server killed before its first checkpoint replays the whole log from empty
  // chunks). Call before Serve/Start. Errors name the file, offset and field; after an error
  // the shard must not serve.
  Status Recover(RecoverReport* report);
  // Opens the write-ahead log for a fresh start: empties it, seq continuing after what a
  // loaded checkpoint covers. No-op when the log is off or already open (Recover). Serve calls
  // it; downpour-server calls it first, to fail before it serves.
  Status OpenLog();
  // Random nonzero id of this ShardServer object (one per process start), on every reply.
  uint64_t incarnation() const { return incarnation_; }

  // Thread-safe snapshots (tests, benchmarks, logging).
  ShardStatsWire Stats() const;
  std::vector<float> ChunkWeights(int32_t chunk) const;  // empty if not owned / not initialised
  std::vector<float> ChunkHistory(int32_t chunk) const;  // momentum; empty if not owned
  // DC-ASGD-a's running mean square of the chunk's gradients; empty if not owned, another
  // algorithm, or no gradient pushed yet.
  std::vector<float> ChunkDcMeanSquare(int32_t chunk) const;
  int64_t ChunkVersion(int32_t chunk) const;             // -1 if not owned
  int64_t ChunkScheduleIter(int32_t chunk) const;        // the lr schedule's iteration; -1 if not owned
  int64_t updates() const;                               // applied chunk updates
  bool shutdown_requested() const { return shutdown_.load(); }
  // The write-ahead log takes nothing more: the loop has stopped or is stopping (see above).
  bool log_failed() const { return log_failed_.load(); }
  // Ok unless log_failed(); then the error, naming the log. On the loop's thread, or after Join.
  Status LogFailure() const;

  // Atomic checkpoint of this shard (meta: server id/count, layout hash, model id, versions,
  // wal_seq, pushes_by_worker, the duplicate window, policy state; tensors: per chunk weights
  // and history, DC-ASGD-a's mean square, sync's partial sums). Load refuses a file of another
  // layout / server / model / worker count. A save to options.checkpoint_path restarts the
  // write-ahead log.
  Status SaveCheckpoint(const std::string& path);
  Status LoadCheckpoint(const std::string& path);

  const ParamLayout& layout() const { return layout_; }

  static constexpr int kDedupSessions = 4;          // sessions remembered per worker
  static constexpr int kDedupIdsPerSession = 4096;  // request ids remembered per session
  static constexpr int kPeersPerWorker = 4;         // registered connections kept per worker id
  static constexpr int kMaxReaders = 4;             // evaluator connections kept (oldest dropped)
  static constexpr int kStalenessWindow = 200;      // chunk updates the stability guard averages

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
  // Same-host shared memory (common/shm_region.h): a region per registered connection that
  // asked for one; a push's payload copied out of it (then validated like received frames);
  // a pull's weights copied into it.
  void OfferRegion(const PeerId& peer, const MessageHeader& h, MessageHeader* reply);
  Status ReadRegionPush(const PeerId& peer, const MessageHeader& h, Frames* frames, RejectReason* reason);
  void ForgetPeer(const PeerId& peer);
  // A push as the wire carried it, before DensifyPush: what the log keeps of a lossy or
  // sufficient-factor push when that is fewer bytes (wal.h kCodedPush).
  struct WirePush {
    MessageHeader header;
    Frames frames;  // header frame first; shares the received buffers
  };
  // The push's sufficient-factor chunks formed (server/factor_push.h) and its lossy chunks decoded
  // (request_check.h DecodeCodedPush) into f32 dense ones, `finite[i]` = chunk i is known finite.
  // Live before the checks and the log; in replay for a coded push record (`ep` null then: the
  // loop's endpoint, which releases due replies between factor chunks).
  Status DensifyPush(ServerEndpoint* ep, MessageHeader* h, Frames* frames, std::vector<bool>* finite,
                     RejectReason* reason);
  // A dense f32 push from a sender CheckWorker has accepted: validated whole, then logged and
  // applied. `finite[i]` true: chunk i is known finite (expanded factors, decoded codecs) and is
  // not scanned again. `wire`: the push before DensifyPush (null: it came dense), logged instead
  // of the f32 chunks when smaller and not DC-ASGD.
  Status HandlePush(const MessageHeader& h, const Frames& frames, MessageHeader* reply, RejectReason* reason,
                    const std::vector<bool>& finite = {}, const WirePush* wire = nullptr);
  bool PullReady(const PendingPull& p) const;
  void ServePull(ServerEndpoint* ep, const PendingPull& p);
  void ServePending(ServerEndpoint* ep);
  // `order`: the reply's order key on an endpoint that orders replies (SendOrdered); the
  // default, UINT64_MAX, is a plain Send.
  void Reply(ServerEndpoint* ep, const PeerId& peer, MessageHeader h, Frames payload = {}, uint64_t order = UINT64_MAX);
  void Reject(ServerEndpoint* ep, const PeerId& peer, const PeerInfo& info, const MessageHeader& request,
              const Status& status, RejectReason reason);
  // One push, validated (live) or read from the log (replay): dedup window, init or policy.
  void ApplyPush(int32_t worker, uint64_t session, uint64_t request_id, int64_t clock, uint32_t flags,
                 const std::vector<PushChunk>& chunks);
  bool IsDuplicate(int32_t worker, uint64_t session, uint64_t request_id) const;
  void RememberRequest(int32_t worker, uint64_t session, uint64_t request_id);
  void ApplyGone(int32_t worker, bool finished);
  Status LogRecord(WalRecord* r);  // appends when the log is on; counts
  Status ReplayRecord(const WalRecord& r, const std::string& path);
  Status ReplayCodedPush(const WalRecord& r, const std::string& path);
  // What CheckDensePush asks of the shard's chunks (initialised, version), live and in replay.
  std::function<ChunkFacts(int)> ChunkFactsOf() const;
  void NoteStaleness(int64_t staleness);
  bool KnownWorker(int32_t w) const { return w >= 0 && w < max_workers_; }
  void MaybeCheckpoint();
  ShardStatsWire StatsLocked() const;
  Status SaveCheckpointLocked(const std::string& path);
  std::vector<float>& MutableWeights(int local);
  void ApplyGradient(int local, const float* grad, float grad_scale, float lr_scale, int gradients);

  const ParamLayout layout_;
  const ShardOptions options_;
  const int max_workers_;
  const uint64_t incarnation_;
  std::vector<int32_t> owned_;        // chunk ids owned, ascending
  std::vector<int> local_of_;         // chunk id -> local index or -1
  PushRules rules_;                   // what this shard takes (request_check.h), over local_of_
  std::vector<uint64_t> share_offset_;  // local index -> float offset in this server's share
  uint64_t share_floats_ = 0;           // floats this server owns
  const std::string boot_id_;           // this host's (regions only for workers on it)

  mutable std::mutex mu_;  // guards everything below
  std::vector<ChunkState> chunks_;
  std::unique_ptr<ConsistencyPolicy> policy_;
  std::unique_ptr<Updater> updater_;
  std::unordered_map<PeerId, int32_t> registered_;  // peer identity -> worker id
  std::deque<PeerId> readers_;                      // evaluator connections, oldest first
  bool IsReader(const PeerId& peer) const;
  Status RegisterReader(const PeerId& peer, const PeerInfo& info, const MessageHeader& h, MessageHeader* reply,
                        RejectReason* reason);
  Status CheckReader(const PeerId& peer, const MessageHeader& h, RejectReason* reason) const;
  // The layout hash and model id of a worker's or the evaluator's message are this server's.
  Status CheckLayoutAndModel(const MessageHeader& h, RejectReason* reason) const;
  std::vector<std::deque<PeerId>> peers_of_worker_;  // per worker id, oldest first (bounds registered_)
  // Registered connections' shared regions: [push area | pull area], each share_floats_ floats.
  // Bounded like registered_ (a region goes with its connection).
  std::unordered_map<PeerId, std::unique_ptr<SharedRegion>> regions_;
  std::vector<float> region_scratch_;  // a shared push copied out before validation (reused)
  struct SessionWindow {
    uint64_t session = 0;
    std::deque<uint64_t> order;            // oldest first
    std::unordered_set<uint64_t> ids;
  };
  std::vector<std::deque<SessionWindow>> dedup_;  // per worker id, oldest session first
  std::unique_ptr<WalWriter> wal_;
  uint64_t wal_seq_ = 0;     // last log seq applied or covered by the loaded checkpoint
  bool replaying_ = false;
  // DC-ASGD: per worker id (up to max_workers), per local chunk, the weights it last pulled and
  // their version (empty until its first pull): memory up to max_workers × this shard.
  struct PulledCopy {
    std::vector<float> weights;
    int64_t version = -1;
  };
  std::vector<std::vector<PulledCopy>> dc_pulled_;
  std::vector<std::vector<float>> dc_scratch_;  // the push being applied: compensated gradients
  std::vector<std::vector<float>> dc_ms_next_;  // ... and DC-ASGD-a's mean squares with it
  // DC-ASGD-a: per local chunk, the running mean of g ⊙ g over every gradient pushed to it
  // (empty until its first push; in checkpoints, and rebuilt by replay from the log's raw
  // gradients).
  std::vector<std::vector<float>> dc_mean_square_;
  void RememberPulled(int32_t worker, const std::vector<int>& locals);
  void CompensateDelay(int32_t worker, std::vector<PushChunk>* chunks);
  // DC-ASGD-a: the chunk's next mean square, m · ms + (1 − m) · g ⊙ g (the first: g ⊙ g), into
  // `next`; committed by swapping it into dc_mean_square_ once the push is taken.
  void NextDcMeanSquare(int local, const float* g, int64_t count, std::vector<float>* next) const;
  std::vector<int64_t> push_staleness_;  // per local chunk: the push being applied's staleness (-1: not applied), for its ack
  std::vector<int64_t> staleness_ring_;  // last kStalenessWindow chunk staleness values
  size_t staleness_next_ = 0;
  int64_t staleness_ring_sum_ = 0;
  bool stability_warned_ = false;
  std::vector<PendingPull> pending_;
  // Per worker id: the clock of its latest pull and when that clock's first pull arrived (ns of
  // steady_clock), the order key of that step's pull replies (ServerEndpoint::SendOrdered).
  std::vector<std::pair<int64_t, uint64_t>> pull_step_order_;
  ShardStatsWire stats_;
  int64_t updates_ = 0;
  int64_t updates_at_last_checkpoint_ = 0;
  std::vector<std::pair<int32_t, bool>> gone_queue_;  // (worker, finished) from MarkWorkerGone, for the loop
  RateLimitedLog refusal_log_;                        // refusals a stranger can provoke: a bounded number of lines
  RateLimitedLog reply_log_;  // failed replies: a peer that went away can cause many
  BufferPool<float> factor_scratch_;   // factor chunks' dense gradients (reused, bounded)
  BufferPool<uint16_t> pull_scratch_;  // f16 / bf16 pull replies' weights (reused, bounded)

  std::atomic<bool> stop_{false};
  std::atomic<bool> shutdown_{false};
  std::atomic<bool> log_failed_{false};  // wal_->Failure() is not Ok (set on the loop's thread)
  std::thread thread_;
  Status thread_status_;
  std::unique_ptr<ServerEndpoint> owned_endpoint_;
  // The endpoint of the message or tick the loop is handling (null outside one, and in replay):
  // long work releases its due replies through it between chunks (ServerEndpoint::ReleaseDue).
  ServerEndpoint* loop_endpoint_ = nullptr;
};

}  // namespace downpour
