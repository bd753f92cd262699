// shard.h — ShardServer, one parameter-server shard: the loop that serves register, pull, push,
// clock, stats, checkpoint, heartbeat and shutdown messages for the chunks the layout
// (common/layout.h) deals to this server. It decides; its parts keep state and do the work:
//   ChunkStore (chunk_store.h)            the chunks' weights, rule state, versions, apply lanes
//   ShardDurability (shard_durability.h)  the write-ahead log, checkpoints, recovery and replay
//   ConsistencyPolicy (consistency.h)     when a gradient applies and a pull is served
//   ShardSessions (shard_sessions.h)      who is who: registrations and their checks, regions,
//                                         duplicate windows, the fence of processes declared dead
//   PullStepOrder (sessions.h)            the order key of each worker's step of pulls
//   StabilityGuard (stability_guard.h)    the warning that updates are too stale for the lr
//   FactorExpander (factor_expander.h)    factor pushes made dense on a thread of its own
//   ShardRule (rules/shard_rule.h)        what each kind of push does: a gradient (DC-ASGD
//                                         compensates it first), an elastic exchange, a model move
//   request_check.h, factor_push.h        checking and densifying pushes
//
// Each message is validated whole before it touches a weight, so a refused push changes nothing;
// a refusal gets an error reply naming the field and is counted by reason (senders must be
// registered and authorised, server/access.h). Pulls of chunks without weights wait; gradients
// for them are refused (kNotInitialized). A push, clock, worker-gone or join is staged in the
// write-ahead log before it is applied, and its reply waits until the log's own thread has
// written it; it is refused (kLogWrite) when the log cannot take it. A push already taken (same
// worker, session, request id) is acked again, not applied. Every reply carries this object's
// incarnation. docs/architecture.md "The server's parts and threads"; docs/operations.md
// "Checkpoints".
//
// Thread-safety: one mutex guards the loop's state. The loop (Serve, or Handle/Tick) runs on one
// thread at a time; it decides everything and posts each chunk's floats work (updates, a pull's
// read) to the store's lane that owns the chunk (cluster.server_threads lanes), so updates apply
// in parallel and in message order per chunk. Stop, MarkWorkerGone, SaveCheckpoint and the const
// accessors may be called from any thread (the snapshots drain the lanes first); Recover,
// LoadCheckpoint and OpenLog before the loop, on one thread. The log's thread, the lanes and the
// factor expander call nothing here but the wake function (SetWake) and, the lanes, the list of
// finished pull replies.
#pragma once

#include <array>
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
#include <vector>

#include "common/buffer_pool.h"
#include "common/codec.h"
#include "common/config/checkpoint.h"
#include "common/config/cluster.h"
#include "common/config/compression.h"
#include "common/config/consistency.h"
#include "common/config/solver.h"
#include "common/config/worker.h"
#include "common/layout.h"
#include "common/log_limit.h"
#include "common/shm_region.h"
#include "common/solver/update_rule.h"
#include "common/trace.h"
#include "common/transport.h"
#include "server/access.h"
#include "server/block_split.h"
#include "server/chunk_store.h"
#include "server/consistency.h"
#include "server/factor_expander.h"
#include "server/peers.h"
#include "server/request_check.h"
#include "server/rules/shard_rule.h"
#include "server/sessions.h"
#include "server/shard_durability.h"
#include "server/shard_log.h"
#include "server/shard_sessions.h"
#include "server/stability_guard.h"
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
  SolverConfig solver;                 // update rule (solver.update) and lr policy
  // The update rule; null = MakeUpdateRule(solver) (common/solver/update_rule.h). A test may hand
  // any rule here.
  std::shared_ptr<const UpdateRule> update_rule;
  // Makes what the shard does with a gradient push (server/rules/shard_rule.h); null =
  // MakeShardRule(kGradient, ...), by consistency.algorithm. A test may hand any rule here. Each
  // shard made from these options calls it once: a rule keeps state and is its shard's alone.
  std::function<std::unique_ptr<ShardRule>()> gradient_rule;
  ConsistencyConfig consistency;       // async / sync / ssp:s
  // The run's sections as it gives them (no key copied): what the shard reads of each is
  //   cluster.workers         W: worker ids 0..W-1 (sync/ssp accounting); >= 1
  //   cluster.max_workers     worker ids accounted for: 0..max_workers-1; 0 = W, else >= W
  //   cluster.server_threads  apply lanes: threads owning the chunks' updates and pull reads; the
  //                           loop splits a push's finite check over as many
  //   cluster.heartbeat_timeout_ms  a worker declared dead has been silent this long, so only its
  //                           client sessions registered at least half of it before the notice are
  //                           fenced out (MarkWorkerGone); 0 = every session registered so far
  //   cluster.reply_order     "step": a ModelHost takes waiting messages one worker's step at a time
  //   compression.factor_threads  threads forming factor chunks' gradients
  //   worker.push_every       worker batches per push: the lr-schedule iteration's step per gradient
  ClusterConfig cluster;
  CompressionConfig compression;
  WorkerConfig worker;
  TraceLog* trace = nullptr;  // timeline (not owned, outlives the shard); null = none
  int trace_track = 0;        // the loop's track in `trace`
  // [checkpoint] as the run gives it: periodic checkpoints every every_updates rounds of this
  // shard's chunk updates (0 = off), and the log's fsync interval, I/O and bound (a log reaching
  // wal_max_mb makes the shard checkpoint, which empties it; OpenLog and Recover first check that
  // the log's directory has room for it and two checkpoints, kFailedPrecondition if not). Its dir
  // and wal are the run's: the shard writes to checkpoint_path and wal_path below.
  CheckpointConfig checkpoint;
  std::string checkpoint_path;         // where periodic / default checkpoints go ("" = none)
  std::chrono::milliseconds poll_interval{20};  // loop wakes this often to check Stop / waits
  int staleness_buckets = 32;          // histogram buckets; the last one is ">= buckets-1"
  // Called for every served pull, on the loop thread with the shard's lock held: keep it short.
  std::function<void(const PullServedEvent&)> on_pull_served;
  // Sync: who each round waits for (server/consistency.h RoundMembers); empty = every live worker.
  RoundMembers round_members;
  // Who may checkpoint, shut down, register and push (server/access.h). Default: no token
  // checked, and checkpoint paths from the wire refused (empty run_dir).
  AccessPolicy access;
  // Write-ahead log (server/wal.h); "" = none: a dying server loses the updates since its last checkpoint.
  std::string wal_path;
  bool shared_memory = true;  // offer same-host workers that ask a shared-memory region at register
  bool model_moves = false;   // take move pushes (kFlagMove, multi-model servers); off: refused
};

class ShardServer {
 public:
  // kInvalidArgument for an option out of range (server_id, cluster.workers and max_workers, checkpoint.wal_fsync_ms).
  static Status Create(const ParamLayout& layout, ShardOptions options, std::unique_ptr<ShardServer>* out);
  ~ShardServer();

  // Opens the log (OpenLog) and runs the loop on the calling thread until a shutdown message or
  // Stop(). Returns OpenLog's error, the endpoint's (a receive failing other than by timeout), or,
  // once the log takes nothing more (log_failed(): the shard fails-stop), LogFailure().
  Status Serve(ServerEndpoint* endpoint);
  // Runs Serve on a thread of its own, owning `endpoint`; Join() waits and returns its status.
  void Start(std::unique_ptr<ServerEndpoint> endpoint);
  Status Join();
  void Stop();  // thread-safe; Serve returns within poll_interval

  // Serve's parts, for several models on one endpoint (server/model_host.h), from one thread at a
  // time: Handle one received message; Tick after every receive or timeout (serves released
  // pulls); Finish once the loop has ended (syncs the log). Call OpenLog before the first Handle.
  void Handle(ServerEndpoint* ep, const PeerId& peer, const PeerInfo& info, Frames& frames);
  void Tick(ServerEndpoint* ep);
  // `ep` (if given) gets the replies that waited for the log.
  Status Finish(ServerEndpoint* ep = nullptr);
  // Called (from the log's thread) when the log has written more, or failed: a loop waiting in
  // Receive should come back and Tick (ServerEndpoint::Wake). Serve sets its endpoint's.
  void SetWake(std::function<void()> wake);
  const ShardOptions& options() const { return options_; }

  // Thread-safe. `worker` finished or was declared dead: the loop drops it from sync/ssp accounting.
  void MarkWorkerGone(int32_t worker, bool finished);

  // Rebuilds a dead process's shard: loads options.checkpoint_path and replays options.wal_path
  // past it (either may be missing), drops a torn last record. With a checkpoint path, what was
  // replayed is checkpointed at once and the log goes on in a new file (the old one unlinked, or
  // with checkpoint.history kept as a segment), so a process that still holds the old file open
  // cannot write into the log this one writes; else the log goes on in the old file. Leaves the
  // log open. Call before Serve/Start. Errors name the file, offset and field; after one the shard
  // must not serve.
  Status Recover(RecoverReport* report);
  // Applies one record of a log as Recover does, through the live apply path, whatever its seq
  // (downpour-history replays a whole run's kept log into a fresh shard). Before Serve/Start, with
  // the log closed. Errors as Recover's, naming `path` and the record.
  Status Replay(const WalRecord& r, const std::string& path);
  // Opens the log for a fresh start: empties it, seq continuing after a loaded checkpoint's.
  // No-op when the log is off or already open (Recover). Serve calls it.
  Status OpenLog();
  // Random nonzero id of this ShardServer object (one per process start), on every reply.
  uint64_t incarnation() const { return incarnation_; }

  // Thread-safe snapshots (tests, benchmarks, logging).
  ShardStatsWire Stats() const;
  std::vector<float> ChunkWeights(int32_t chunk) const;  // empty if not owned / not initialised
  std::vector<float> ChunkHistory(int32_t chunk) const;  // the update rule's state; empty if not owned
  // The gradient rule's own state of the chunk (DC-ASGD-a's running mean square of g); empty if
  // not owned, a rule without state, or none yet.
  std::vector<float> ChunkRuleState(int32_t chunk) const;
  // The name of that state (ShardRule::state_name: "dc_mean_square" under DC-ASGD-a); "" = none.
  std::string RuleStateName() const;
  int64_t ChunkVersion(int32_t chunk) const;             // -1 if not owned
  int64_t ChunkScheduleIter(int32_t chunk) const;        // the lr schedule's iteration; -1 if not owned
  int64_t updates() const;                               // applied chunk updates
  uint64_t log_seq() const;  // the last log record in the state (applied, replayed or checkpointed)
  // Nanoseconds the loop waited for a full apply lane (apply_lanes.h): in stats busy_ns, but time
  // the lanes, not the loop, were the bound.
  uint64_t lane_wait_ns() const { return store_->lane_wait_ns(); }
  bool shutdown_requested() const { return shutdown_.load(); }
  // Thread-safe. Fencing: another process took this server's id (the coordinator says so, or its
  // log was taken over: ShardLog::CheckOwned), so this one must take and answer nothing more.
  // Finish then closes the log without writing anything more and sends no held reply; no
  // checkpoint may follow (the caller's part; SaveCheckpoint refuses one anyway).
  void Fence() { fenced_.store(true); }
  bool fenced() const { return fenced_.load() || durability_->log().superseded(); }
  // The write-ahead log takes nothing more: the loop has stopped or is stopping (see Serve).
  bool log_failed() const { return durability_->log().failed(); }
  // Ok unless log_failed(); then the error, naming the log. On the loop's thread, or after Join.
  Status LogFailure() const;

  // Atomic checkpoint of everything the shard's behaviour depends on (server/shard_checkpoint.h;
  // docs/architecture.md "Checkpoints and tensor files"). A save to options.checkpoint_path
  // empties the log. Load checks the whole file first and refuses another layout, server, model
  // or max_workers.
  Status SaveCheckpoint(const std::string& path);
  Status LoadCheckpoint(const std::string& path);

  const ParamLayout& layout() const { return layout_; }

  static constexpr int kPeersPerWorker = PeerTable::kPeersPerWorker;  // registered connections kept per worker id
  static constexpr int kMaxReaders = PeerTable::kMaxReaders;          // evaluator connections kept
  static constexpr int kStalenessWindow = StabilityGuard::kWindow;    // chunk updates the stability guard averages

 private:
  struct PendingPull;
  struct PullJob;
  class Updater;
  class RuleHost;
  class Keeper;

  ShardServer(const ParamLayout& layout, ShardOptions options);

  // The dispatcher: a message of a peer whose factor push is being expanded waits behind it
  // (deferred_); any other is parsed, routed by type to one handler below, and replied to or
  // refused (HandleOne).
  void HandleMessage(ServerEndpoint* ep, const PeerId& peer, const PeerInfo& info, Frames& frames);
  void HandleOne(ServerEndpoint* ep, const PeerId& peer, const PeerInfo& info, Frames& frames);
  // The reply's fields every answer to `h` carries.
  MessageHeader ReplyTo(const MessageHeader& h) const;
  // A push from its sender's connection: checked, read from shared memory, then handed to the
  // factor expander (*deferred: ContinuePush answers it) or densified and given to HandlePush.
  Status ReceivePush(const PeerId& peer, const PeerInfo& info, MessageHeader* h, Frames* frames, MessageHeader* reply,
                     RejectReason* reason, bool* deferred);
  // Pushes the expander has finished: each goes on to HandlePush and its reply, then the messages
  // its peer sent meanwhile are handled in order.
  void FinishExpansions(ServerEndpoint* ep);
  void ContinuePush(ServerEndpoint* ep, FactorJob* job);
  FactorExpander& Expander();  // made on the first factor push
  // A pull: checked, then served now (ServePull) or held until the policy lets it (pending_).
  Status TakePull(ServerEndpoint* ep, const PeerId& peer, const PeerInfo& info, const MessageHeader& h,
                  RejectReason* reason);
  Status HandleClock(const PeerId& peer, const PeerInfo& info, const MessageHeader& h, MessageHeader* reply,
                     RejectReason* reason);
  Status HandleShutdown(const PeerInfo& info, const MessageHeader& h, MessageHeader* reply, RejectReason* reason);
  Status HandleRegister(const PeerId& peer, const PeerInfo& info, const MessageHeader& h, MessageHeader* reply,
                        RejectReason* reason);
  Status HandleCheckpoint(const PeerInfo& info, const MessageHeader& h, MessageHeader* reply, RejectReason* reason);
  void RegisterReply(const MessageHeader& h, MessageHeader* reply) const;  // the fields both registers fill
  bool KnownWorker(int32_t w) const { return w >= 0 && w < max_workers_; }
  // A push's payload in the sender's shared region (common/shm_region.h): copied out, then
  // validated like frames.
  Status ReadRegionPush(const PeerId& peer, const MessageHeader& h, Frames* frames, RejectReason* reason);
  // A push as the wire carried it, before it was densified: what the log keeps of a lossy or
  // sufficient-factor push when that is fewer bytes (wal.h kCodedPush).
  struct WirePush {
    MessageHeader header;
    Frames frames;  // header frame first; shares the received buffers
  };
  // Turns a push's factor chunks (server/factor_push.h; on the expander, waited for: replay
  // only, live ones are deferred) and lossy chunks (DecodeCodedPush) into f32 dense ones;
  // `finite[i]`: chunk i is known finite. Before the checks and the log, live and in replay.
  Status DensifyPush(MessageHeader* h, Frames* frames, std::vector<bool>* finite, RejectReason* reason);
  // A dense f32 push from an accepted sender: validated whole, then logged and applied. `finite`
  // chunks are not scanned again. `wire`: the push before DensifyPush (null: it came dense),
  // logged instead of the f32 chunks when smaller and not DC-ASGD.
  Status HandlePush(const MessageHeader& h, const Frames& frames, MessageHeader* reply, RejectReason* reason,
                    const std::vector<bool>& finite = {}, const WirePush* wire = nullptr);
  // What CheckDensePush asks of the shard's chunks (initialised, version), live and in replay.
  std::function<ChunkFacts(int)> ChunkFactsOf() const;
  // One push, validated (live) or read from the log (replay): dedup window, then first weights,
  // or the rule of its kind (RuleFor: a gradient, an elastic exchange or a model's move).
  void ApplyPush(int32_t worker, uint64_t session, uint64_t request_id, int64_t clock, uint32_t flags,
                 const std::vector<PushChunk>& chunks);
  void ApplyGone(int32_t worker, bool finished);
  // The rule for a non-init push with these flags (never null).
  ShardRule* RuleFor(uint32_t flags) const { return rules_by_kind_[static_cast<size_t>(PushKindOf(flags))].get(); }
  bool PullReady(const PendingPull& p) const;
  // Fills the reply's header and has the store read the chunks (ChunkStore::Read); a reply the
  // lanes finish goes to the loop, which sends it (SendDonePulls).
  void ServePull(ServerEndpoint* ep, const PendingPull& p);
  void SendDonePulls(ServerEndpoint* ep);
  void CallWake();
  void ServePending(ServerEndpoint* ep);
  // `order`: the reply's key on an endpoint that orders replies (SendOrdered); UINT64_MAX = Send.
  void Reply(ServerEndpoint* ep, const PeerId& peer, MessageHeader h, Frames payload = {}, uint64_t order = UINT64_MAX);
  void Reject(ServerEndpoint* ep, const PeerId& peer, const PeerInfo& info, const MessageHeader& request,
              const Status& status, RejectReason reason);
  // A reply to a message whose change is staged in the log leaves once the log has written it
  // (ShardLog); others at once. ReleaseHeld sends those now durable. With mu_ held.
  void ReplyWhenLogged(ServerEndpoint* ep, const PeerId& peer, const MessageHeader& reply, MsgType request_type);
  void ReleaseHeld(ServerEndpoint* ep);
  ShardLog::Send SendTo(ServerEndpoint* ep);      // Reply on `ep`
  ShardLog::Refuse RefuseTo(ServerEndpoint* ep);  // Reject on `ep`, as the log's (kLogWrite)
  ShardStatsWire StatsLocked() const;
  // What durability asks (DurableShard, through Keeper): the checkpoint, its adoption, and one
  // log record applied through the live path.
  TensorFile CheckpointFile(uint64_t wal_seq);
  Status RestoreFrom(TensorFile& file, const std::string& path, uint64_t* wal_seq);
  Status ApplyRecord(const WalRecord& r, const std::string& path);
  Status ApplyCodedRecord(const WalRecord& r, const std::string& path);

  const ParamLayout layout_;
  const ShardOptions options_;
  const int max_workers_;
  const uint64_t incarnation_;

  mutable std::mutex mu_;  // guards everything below
  // The chunks and the lanes that apply to them (server/chunk_store.h). Reset first in the
  // destructor: its lanes' tasks call back into done_pulls_ and the wake function.
  std::unique_ptr<ChunkStore> store_;
  PushRules rules_;  // what this shard takes (request_check.h), over the store's chunks
  std::unique_ptr<ConsistencyPolicy> policy_;
  std::unique_ptr<Updater> updater_;
  // Who is who: registrations, their checks, regions, duplicate windows, the fence (server/shard_sessions.h).
  std::unique_ptr<ShardSessions> sessions_;
  PullStepOrder step_order_;  // the order key of each worker's step of pulls (server/sessions.h)
  std::unique_ptr<Keeper> keeper_;
  // The log, checkpoints and recovery (server/shard_durability.h). Its log's thread calls the
  // wake function until it stops: reset before wake_.
  std::unique_ptr<ShardDurability> durability_;
  std::mutex wake_mu_;  // guards wake_
  std::function<void()> wake_;
  // What each kind of push does (server/rules/shard_rule.h), by PushKind. Their state (DC-ASGD's
  // copies) is under mu_ with the rest.
  std::array<std::unique_ptr<ShardRule>, kPushKinds> rules_by_kind_;
  std::unique_ptr<RuleHost> rule_host_;
  std::vector<int64_t> push_staleness_;  // per local chunk: the applied push's staleness for its ack; -1 = none
  StabilityGuard stability_;             // warns once when updates are too stale for the lr (server/stability_guard.h)
  std::vector<PendingPull> pending_;
  ShardStatsWire stats_;
  std::vector<std::pair<int32_t, bool>> gone_queue_;  // (worker, finished) from MarkWorkerGone, for the loop
  RateLimitedLog refusal_log_;                        // refusals a stranger can provoke: a bounded number of lines
  RateLimitedLog reply_log_;  // failed replies: a peer that went away can cause many
  BufferPool<float> region_scratch_;  // shared pushes copied out before validation (kept until applied)
  // Factor pushes are expanded on a thread of their own (server/factor_expander.h); until one
  // comes back, its peer's later messages wait here, in order (at most kMaxDeferred a peer, then
  // the loop waits for the expander).
  static constexpr size_t kMaxDeferred = 64;
  struct DeferredMessage {
    PeerInfo info;
    Frames frames;
  };
  std::unordered_map<PeerId, std::vector<DeferredMessage>> deferred_;
  // Reset first in the destructor: its thread calls the wake function.
  std::unique_ptr<FactorExpander> expander_;
  std::mutex done_mu_;                 // guards done_pulls_
  std::vector<std::shared_ptr<PullJob>> done_pulls_;  // assembled by the lanes, for the loop to send

  std::atomic<bool> stop_{false};
  std::atomic<bool> fenced_{false};
  std::atomic<bool> shutdown_{false};
  std::thread thread_;
  Status thread_status_;
  std::unique_ptr<ServerEndpoint> owned_endpoint_;
  std::unique_ptr<BlockSplit> check_split_;  // the loop's finite checks, over cluster.server_threads threads
};

}  // namespace downpour
