// shard.cc — see shard.h. Handling order for every message: decode → validate → act → reply.
#include "server/shard.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "common/env.h"
#include "common/finite.h"
#include "common/grad_codec.h"
#include "common/random_id.h"
#include "common/solver/sgd.h"
#include "common/tensor_file.h"
#include "server/elapsed.h"
#include "server/factor_push.h"
#include "server/shard_checkpoint.h"

namespace downpour {

namespace {

// The elements of the chunks `server` holds; whole_rows: of the rows of its 2-D tensors that
// the chunks touch (a factor chunk's dense gradient is formed row by row).
size_t OwnedElems(const ParamLayout& layout, int32_t server, bool whole_rows) {
  size_t total = 0;
  for (int32_t id : layout.ServerChunks(server)) {
    const Chunk& c = layout.chunk(id);
    const TensorSpec& t = layout.tensors()[static_cast<size_t>(c.tensor)];
    int64_t n = c.count;
    if (whole_rows && t.shape.size() >= 2) {
      const int64_t in = t.numel() / t.shape[0];
      n = RowsOf(c, in).rows * in;
    }
    total += static_cast<size_t>(n);
  }
  return total;
}

// The header a coded push record keeps (wal.h kCodedPush): what forming, decoding and checking
// the push read, nothing a peer could pad it with. CRC-32Cs are dropped: they were checked
// before the push was logged, and the log's own CRC-32 covers the record.
Frame LoggedPushHeader(const MessageHeader& wire) {
  MessageHeader h;
  h.type = MsgType::kPush;
  h.sender = wire.sender;
  h.request_id = wire.request_id;
  h.model_id = wire.model_id;
  h.clock = wire.clock;
  h.layout_hash = wire.layout_hash;
  h.role = wire.role;
  h.flags = wire.flags;
  h.chunk_ids = wire.chunk_ids;
  h.versions = wire.versions;
  h.dtype = wire.dtype;
  h.encoding = wire.encoding;
  h.elem_counts = wire.elem_counts;
  h.byte_lengths = wire.byte_lengths;
  h.encodings = wire.encodings;
  h.factor_batch = wire.factor_batch;
  h.move_batches = wire.move_batches;
  h.session = wire.session;
  std::string bytes;
  const Status encoded = EncodeHeader(h, &bytes);
  DP_CHECK(encoded.ok());  // its lists agreed when the push was decoded and checked
  return Frame::Copy(bytes);
}

uint64_t PayloadBytes(const Frames& frames) {
  uint64_t n = 0;
  for (size_t i = 1; i < frames.size(); ++i) n += frames[i].size();
  return n;
}

uint64_t DenseBytes(const std::vector<PushChunk>& chunks) {
  uint64_t n = 0;
  for (const PushChunk& c : chunks) n += static_cast<uint64_t>(c.count) * sizeof(float);
  return n;
}

bool AllFiniteOn(BlockSplit* split, std::span<const float> x) {
  std::atomic<bool> finite{true};
  split->For(static_cast<int64_t>(x.size()), [&](int64_t b, int64_t e) {
    if (!AllFinite(x.subspan(static_cast<size_t>(b), static_cast<size_t>(e - b))))
      finite.store(false, std::memory_order_relaxed);
  });
  return finite.load(std::memory_order_relaxed);
}

}  // namespace

// A pull reply being assembled by the lanes of its chunks; the last lane to fill its slot hands
// it to the loop (done_pulls_), which sends it.
struct ShardServer::PullJob {
  PeerId peer;
  MessageHeader reply;
  Frames payload;  // one slot per chunk (none for a shared-memory reply)
  uint64_t order = UINT64_MAX;
};

struct ShardServer::PendingPull {
  PeerId peer;
  MessageHeader request;
  std::vector<int> locals;
  std::chrono::steady_clock::time_point arrived = std::chrono::steady_clock::now();
  bool reader = false;  // the evaluator's snapshot pull: no consistency wait, no bookkeeping
  uint64_t order = UINT64_MAX;  // its reply's order key: its step's first pull (UINT64_MAX: none)
};

// The policy's view of the shard (consistency.h). Called with mu_ held, on the loop thread.
class ShardServer::Updater : public ShardUpdater {
 public:
  explicit Updater(ShardServer* s) : s_(s) {}
  int num_local() const override { return s_->store_->size(); }
  int64_t version(int local) const override { return s_->store_->version(local); }
  int64_t count(int local) const override { return s_->store_->count(local); }
  void Apply(int local, const float* grad, float grad_scale, float lr_scale, int gradients,
             std::shared_ptr<const void> keep) override {
    s_->store_->Apply(local, grad, grad_scale, lr_scale, gradients, std::move(keep));
    ++s_->stats_.chunk_updates;
  }
  void Accumulate(int local, float* sum, const float* grad, int64_t count, bool first,
                  std::shared_ptr<const void> keep) override {
    s_->store_->OnLane(local, std::move(keep), [sum, grad, n = static_cast<size_t>(count), first] {
      if (first) {
        std::memcpy(sum, grad, n * sizeof(float));
      } else {
        for (size_t i = 0; i < n; ++i) sum[i] += grad[i];
      }
    });
  }
  void RecordStaleness(int local, int64_t staleness) override {
    auto& st = s_->stats_;
    const auto v = static_cast<uint64_t>(std::max<int64_t>(0, staleness));
    s_->push_staleness_[static_cast<size_t>(local)] = static_cast<int64_t>(v);
    st.staleness_sum += v;
    st.staleness_max = std::max(st.staleness_max, v);
    const size_t b = std::min<size_t>(v, st.staleness_histogram.size() - 1);
    ++st.staleness_histogram[b];
    s_->stability_.Note(static_cast<int64_t>(v), s_->policy_->LiveWorkers(), s_->durability_->replaying());
  }

 private:
  ShardServer* s_;
};

// The shard as its rules see it (server/rules/shard_rule.h). Called with mu_ held.
class ShardServer::RuleHost : public RuleShard {
 public:
  explicit RuleHost(ShardServer* s) : s_(s) {}
  ChunkStore& store() override { return *s_->store_; }
  ShardStatsWire& stats() override { return s_->stats_; }
  Status CheckGradients(const PushContext& ctx, std::span<const PushChunk> chunks) override {
    return s_->policy_->CheckPush(*s_->updater_, ctx, chunks);
  }
  PushOutcome TakeGradients(const PushContext& ctx, std::span<const PushChunk> chunks) override {
    return s_->policy_->OnPush(*s_->updater_, ctx, chunks);
  }
  void RecordStaleness(int local, int64_t staleness) override { s_->updater_->RecordStaleness(local, staleness); }

 private:
  ShardServer* s_;
};

// Durability's view of the shard (shard_durability.h). Called with mu_ held.
class ShardServer::Keeper : public DurableShard {
 public:
  explicit Keeper(ShardServer* s) : s_(s) {}
  TensorFile Checkpoint(uint64_t wal_seq) override { return s_->CheckpointFile(wal_seq); }
  Status Restore(TensorFile& file, const std::string& path, uint64_t* wal_seq) override {
    return s_->RestoreFrom(file, path, wal_seq);
  }
  Status Apply(const WalRecord& r, const std::string& path) override { return s_->ApplyRecord(r, path); }
  int64_t updates() const override { return s_->store_->updates(); }

 private:
  ShardServer* s_;
};

Status ShardServer::Create(const ParamLayout& layout, ShardOptions options,
                           std::unique_ptr<ShardServer>* out) {
  if (options.server_id < 0 || options.server_id >= layout.servers()) {
    return InvalidArgument("shard: --id {} is outside 0..{} (layout has {} servers)", options.server_id,
                           layout.servers() - 1, layout.servers());
  }
  if (options.cluster.workers < 1) {
    return InvalidArgument("shard: cluster.workers must be >= 1, got {}", options.cluster.workers);
  }
  if (options.cluster.max_workers != 0 && options.cluster.max_workers < options.cluster.workers) {
    return InvalidArgument("shard: cluster.max_workers {} is below cluster.workers {} (0 = workers)",
                           options.cluster.max_workers, options.cluster.workers);
  }
  if (options.checkpoint.wal_fsync_ms < 0) {
    return InvalidArgument("shard: checkpoint.wal_fsync_ms must be >= 0, got {}", options.checkpoint.wal_fsync_ms);
  }
  if (options.staleness_buckets < 2) options.staleness_buckets = 2;
  out->reset(new ShardServer(layout, std::move(options)));
  return Status::Ok();
}

ShardServer::ShardServer(const ParamLayout& layout, ShardOptions options)
    : layout_(layout),
      options_(std::move(options)),
      max_workers_(options_.cluster.max_workers > 0 ? options_.cluster.max_workers : options_.cluster.workers),
      incarnation_(RandomId()),  // a restarted process draws a new one
      step_order_(max_workers_),
      stability_(options_.server_id, options_.consistency.staleness_aware_lr, options_.solver.base_lr),
      refusal_log_(fmt::format("server {}", options_.server_id), "refusals"),
      reply_log_(fmt::format("server {}", options_.server_id), "failed replies"),
      // Reused buffers for two messages' worth of this shard's chunks (factor chunks' rows
      // reach past the chunk: the f32 pool is bounded by the rows' elements).
      region_scratch_(2 * OwnedElems(layout_, options_.server_id, /*whole_rows=*/false)) {
  ChunkStoreOptions co;
  co.server_id = options_.server_id;
  co.solver = options_.solver;
  co.rule = options_.update_rule != nullptr ? options_.update_rule
                                            : std::shared_ptr<const UpdateRule>(MakeUpdateRule(options_.solver));
  co.lanes = std::max(1, options_.cluster.server_threads);
  co.push_every = options_.worker.push_every;
  store_ = std::make_unique<ChunkStore>(layout_, std::move(co));
  ShardSessionsOptions so;
  so.server_id = options_.server_id;
  so.model_id = options_.model_id;
  so.layout_hash = layout_.hash();
  so.max_workers = max_workers_;
  so.access = options_.access;
  so.shared_memory = options_.shared_memory;
  so.heartbeat_timeout = std::chrono::milliseconds(options_.cluster.heartbeat_timeout_ms);
  sessions_ = std::make_unique<ShardSessions>(std::move(so), store_->share());
  rules_.layout = &layout_;
  rules_.local_of = store_->locals();
  rules_.owned = static_cast<size_t>(store_->size());
  rules_.server_id = options_.server_id;
  rules_.algorithm = options_.consistency.algorithm;
  rules_.model_moves = options_.model_moves;
  check_split_ = std::make_unique<BlockSplit>(std::max(1, options_.cluster.server_threads));
  rules_.all_finite = [split = check_split_.get()](std::span<const float> x) { return AllFiniteOn(split, x); };
  policy_ = MakeConsistencyPolicy(options_.consistency, options_.cluster.workers, max_workers_, options_.round_members);
  updater_ = std::make_unique<Updater>(this);
  ShardRuleOptions ro;
  ro.consistency = options_.consistency;
  ro.max_workers = max_workers_;
  ro.chunks = store_->size();
  for (int k = 0; k < kPushKinds; ++k) {
    const auto kind = static_cast<PushKind>(k);
    std::unique_ptr<ShardRule>& rule = rules_by_kind_[static_cast<size_t>(k)];
    rule = kind == PushKind::kGradient && options_.gradient_rule ? options_.gradient_rule() : MakeShardRule(kind, ro);
    DP_CHECK(rule != nullptr);
  }
  rule_host_ = std::make_unique<RuleHost>(this);
  keeper_ = std::make_unique<Keeper>(this);
  ShardDurabilityOptions d;
  d.server_id = options_.server_id;
  d.checkpoint_path = options_.checkpoint_path;
  d.every_rounds = options_.checkpoint.every_updates;
  d.owned_chunks = store_->size();
  d.log.server_id = options_.server_id;
  d.log.path = options_.wal_path;
  d.log.fsync_ms = std::chrono::milliseconds(options_.checkpoint.wal_fsync_ms);
  d.log.io = options_.checkpoint.wal_io;
  d.log.max_bytes = WalMaxBytes(options_.checkpoint);
  // A checkpoint holds the weights, the update rule's state (f32 each) and the shard rules' own.
  int rule_floats = 0;
  for (const auto& rule : rules_by_kind_) rule_floats += rule->state_name().empty() ? 0 : 1;
  d.log.checkpoint_bytes = store_->share().floats * sizeof(float) * static_cast<uint64_t>(2 + rule_floats);
  d.log.checkpoint_path = options_.checkpoint_path;
  d.log.on_progress = [this] { CallWake(); };  // the log wrote more, or failed: held replies are due
  d.log.keep_segments = options_.checkpoint.history;
  durability_ = std::make_unique<ShardDurability>(std::move(d), keeper_.get());
  stats_.rejected_by_reason.assign(static_cast<size_t>(RejectReason::kCount), 0);
  stats_.staleness_histogram.assign(static_cast<size_t>(options_.staleness_buckets), 0);
  push_staleness_.assign(static_cast<size_t>(store_->size()), -1);
  stats_.pushes_by_worker.assign(static_cast<size_t>(max_workers_), 0);
}

ShardServer::~ShardServer() {
  Stop();
  if (thread_.joinable()) thread_.join();
  expander_.reset();    // finishes its jobs (dropped: never acknowledged), joins; it calls the wake function
  store_.reset();       // runs what was posted, while everything its tasks touch is still here
  durability_.reset();  // its log's thread calls the wake function (wake_mu_, wake_) until it stops
}

// ---------------------------------------------------------------------------------------------
// Loop.

Status ShardServer::Serve(ServerEndpoint* ep) {
  SetWake([ep] { ep->Wake(); });
  DP_RETURN_IF_ERROR(OpenLog());
  while (!stop_.load() && !durability_->log().failed()) {
    PeerId peer;
    PeerInfo info;
    Frames frames;
    Status s = ep->Receive(&peer, &frames, options_.poll_interval, &info);
    if (s.ok()) {
      Handle(ep, peer, info, frames);
    } else if (s.code() != StatusCode::kTimeout) {
      return s;
    }
    Tick(ep);
  }
  const Status finished = Finish(ep);
  SetWake(nullptr);
  return durability_->log().failed() ? LogFailure() : finished;
}

Status ShardServer::LogFailure() const {
  if (!durability_->log().failed()) return Status::Ok();
  return IoError(
      "server {}: stopped: its write-ahead log {} takes nothing more ({}); restart it from its checkpoint "
      "and log (--recover)",
      options_.server_id, options_.wal_path, durability_->log().Failure().message());
}

void ShardServer::Handle(ServerEndpoint* ep, const PeerId& peer, const PeerInfo& info, Frames& frames) {
  const auto t0 = std::chrono::steady_clock::now();
  HandleMessage(ep, peer, info, frames);
  const uint64_t busy = NanosSince(t0);
  std::lock_guard<std::mutex> lock(mu_);
  stats_.busy_ns += busy;
  ReleaseHeld(ep);
}

void ShardServer::Tick(ServerEndpoint* ep) {
  SendDonePulls(ep);
  {
    std::lock_guard<std::mutex> lock(mu_);
    FinishExpansions(ep);
  }
  ServePending(ep);
  {
    std::lock_guard<std::mutex> lock(mu_);
    durability_->Tick();  // a checkpoint at the log's bound that failed, tried again when due
    ReleaseHeld(ep);
  }
  refusal_log_.Flush();
  reply_log_.Flush();
}

Status ShardServer::Finish(ServerEndpoint* ep) {
  refusal_log_.FlushFinal();
  reply_log_.FlushFinal();
  std::lock_guard<std::mutex> lock(mu_);
  if (expander_ != nullptr) {
    // Pushes still being expanded, and what their peers sent after them, are dropped: none was
    // logged or acknowledged, so their senders send them again to whoever serves next.
    expander_->WaitAll();
    (void)expander_->TakeDone();
  }
  deferred_.clear();
  store_->Drain();
  ShardLog& log = durability_->log();
  (void)log.CheckOwned();  // replaced while it was stopped or cut off: no held reply goes out
  if (fenced()) {  // out of the run: its log is another process's now
    log.Abandon();
    return Status::Ok();
  }
  if (ep != nullptr) SendDonePulls(ep);
  if (!log.open()) return Status::Ok();
  const Status s = log.Sync();
  if (ep != nullptr) ReleaseHeld(ep);
  return s;
}

void ShardServer::Start(std::unique_ptr<ServerEndpoint> endpoint) {
  owned_endpoint_ = std::move(endpoint);
  thread_ = std::thread([this] { thread_status_ = Serve(owned_endpoint_.get()); });
}

Status ShardServer::Join() {
  if (thread_.joinable()) thread_.join();
  return thread_status_;
}

void ShardServer::Stop() { stop_.store(true); }

void ShardServer::MarkWorkerGone(int32_t worker, bool finished) {
  if (!KnownWorker(worker)) return;  // not accounted for here: nothing to drop (and nothing to queue)
  std::lock_guard<std::mutex> lock(mu_);
  const std::pair<int32_t, bool> item{worker, finished};
  if (std::find(gone_queue_.begin(), gone_queue_.end(), item) == gone_queue_.end()) gone_queue_.push_back(item);
  // Declared dead: the process that was silent is out of the run, whatever it sends if it wakes.
  if (!finished) sessions_->DeclaredDead(worker);
}

void ShardServer::Reply(ServerEndpoint* ep, const PeerId& peer, MessageHeader h, Frames payload, uint64_t order) {
  h.incarnation = incarnation_;  // every reply: a client tells a restarted server by it
  Frames frames;
  frames.reserve(payload.size() + 1);
  frames.emplace_back();
  Status s = HeaderFrame(h, &frames[0]);
  if (!s.ok()) {
    spdlog::error("shard {}: cannot encode a {} reply: {}", options_.server_id, MsgTypeName(h.type), s.ToString());
    return;
  }
  for (auto& f : payload) frames.push_back(std::move(f));
  s = ep->SendOrdered(peer, std::move(frames), order);
  if (!s.ok()) reply_log_.Log(fmt::format("server {}: reply to a peer failed: {}", options_.server_id, s.ToString()));
}

void ShardServer::Reject(ServerEndpoint* ep, const PeerId& peer, const PeerInfo& info, const MessageHeader& request,
                         const Status& status, RejectReason reason) {
  ++stats_.rejected_by_reason[static_cast<size_t>(reason)];
  if (request.type == MsgType::kPush) ++stats_.pushes_rejected;
  if (reason == RejectReason::kUnauthorized || reason == RejectReason::kOutsideRunDir) {
    // Refusals of who the peer is are worth a line (an attack, or a misconfigured process),
    // but a stranger can provoke them at will: bounded rate.
    refusal_log_.Log(fmt::format("server {}: refused {} from {}: {}", options_.server_id, MsgTypeName(request.type),
                                 DescribePeer(info), status.message()));
  } else {
    spdlog::debug("shard {}: rejected {} ({}): {}", options_.server_id, MsgTypeName(request.type),
                  RejectReasonName(reason), status.message());
  }
  MessageHeader reply = ErrorReply(request, status);
  reply.flags = static_cast<uint32_t>(reason);  // lets a client react (e.g. register again)
  Reply(ep, peer, reply);
}

void ShardServer::HandleMessage(ServerEndpoint* ep, const PeerId& peer, const PeerInfo& info, Frames& frames) {
  std::lock_guard<std::mutex> lock(mu_);
  if (auto waiting = deferred_.find(peer); waiting != deferred_.end()) {
    // Its factor push is being expanded: this message comes after it, as it was sent.
    waiting->second.push_back(DeferredMessage{info, std::move(frames)});
    if (waiting->second.size() >= kMaxDeferred) {  // bounded: wait for the expander
      expander_->WaitAll();
      FinishExpansions(ep);
    }
    return;
  }
  HandleOne(ep, peer, info, frames);
}

MessageHeader ShardServer::ReplyTo(const MessageHeader& h) const {
  MessageHeader reply;
  reply.request_id = h.request_id;
  reply.model_id = options_.model_id;
  reply.sender = options_.server_id;
  reply.layout_hash = layout_.hash();
  return reply;
}

void ShardServer::HandleOne(ServerEndpoint* ep, const PeerId& peer, const PeerInfo& info, Frames& frames) {
  MessageHeader h;
  Status s = ParseHeader(frames, &h);
  if (!s.ok()) {
    ++stats_.undecodable;
    Reject(ep, peer, info, MessageHeader{}, s, RejectReason::kUndecodable);
    return;
  }
  if (h.type == MsgType::kPush) ++stats_.pushes_received;
  // The timeline's span of this message (a pull's serving nests in it when served at once).
  TraceSpan span(options_.trace, options_.trace_track, "server", MsgTypeName(h.type));
  span.Arg("worker", h.sender);
  span.Arg("chunks", static_cast<double>(h.chunk_ids.size()));
  MessageHeader reply = ReplyTo(h);
  RejectReason reason = RejectReason::kBadType;
  bool deferred = false;
  switch (h.type) {
    case MsgType::kRegister:
      s = HandleRegister(peer, info, h, &reply, &reason);
      break;
    case MsgType::kPush:
      s = ReceivePush(peer, info, &h, &frames, &reply, &reason, &deferred);
      if (deferred) return;  // its factors are being expanded: ContinuePush answers it
      break;
    case MsgType::kPull:
      s = TakePull(ep, peer, info, h, &reason);
      if (s.ok()) return;  // answered, or waiting: ServePull replies
      break;
    case MsgType::kClock:
      s = HandleClock(peer, info, h, &reply, &reason);
      break;
    case MsgType::kStats:
      reply.type = MsgType::kStatsReply;
      reply.stats = StatsLocked();
      break;
    case MsgType::kHeartbeat:
      reply.type = MsgType::kHeartbeat;
      break;
    case MsgType::kCheckpoint:
      s = HandleCheckpoint(info, h, &reply, &reason);
      break;
    case MsgType::kShutdown:
      s = HandleShutdown(info, h, &reply, &reason);
      break;
    default:
      s = InvalidArgument("server {} does not serve message type {}", options_.server_id, MsgTypeName(h.type));
      reason = RejectReason::kBadType;
      break;
  }
  if (!s.ok()) {
    // A log that takes nothing more stops the server like a crash: the message goes unanswered,
    // and its sender's client resends it to the restarted server, which replays its log.
    if (!durability_->log().failed()) Reject(ep, peer, info, h, s, reason);
    return;
  }
  // What changed the shard (or repeats a change it took) is acknowledged once the log holds it.
  if (h.type == MsgType::kPush || h.type == MsgType::kClock || h.type == MsgType::kRegister) {
    ReplyWhenLogged(ep, peer, reply, h.type);
  } else {
    Reply(ep, peer, reply);
  }
}

Status ShardServer::ReceivePush(const PeerId& peer, const PeerInfo& info, MessageHeader* h, Frames* frames,
                                MessageHeader* reply, RejectReason* reason, bool* deferred) {
  DP_RETURN_IF_ERROR(sessions_->CheckWorker(peer, info, *h, reason));
  if ((h->flags & kFlagShm) != 0) DP_RETURN_IF_ERROR(ReadRegionPush(peer, *h, frames, reason));
  if (HasFactorChunks(*h)) {
    // Forming the gradients is an sgemm per chunk: off the loop, which goes on serving the other
    // peers; this peer's later messages wait behind the push (HandleMessage).
    auto job = std::make_unique<FactorJob>();
    job->peer = peer;
    job->info = info;
    job->keep_wire = durability_->logging();
    if (job->keep_wire) {
      job->wire_header = *h;
      job->wire_frames = *frames;
    }
    job->header = std::move(*h);
    job->frames = std::move(*frames);
    deferred_[peer];
    Expander().Submit(std::move(job));
    *deferred = true;
    return Status::Ok();
  }
  // Lossy chunks become f32 dense first: validation, policy and SGD see f32 (those chunks known
  // finite already); the push as it came is kept for the log.
  std::vector<bool> finite;
  WirePush wire;
  const bool coded = CodedPush(*h);
  if (coded && durability_->logging()) wire = WirePush{*h, *frames};
  if (coded) DP_RETURN_IF_ERROR(DensifyPush(h, frames, &finite, reason));
  return HandlePush(*h, *frames, reply, reason, finite, durability_->logging() && coded ? &wire : nullptr);
}

FactorExpander& ShardServer::Expander() {
  if (expander_ == nullptr) {
    FactorExpanderOptions o;
    // Reused buffers for two messages' worth of this shard's chunks (a factor chunk's rows reach
    // past the chunk: bounded by the rows' elements).
    o.scratch_elems = 2 * OwnedElems(layout_, options_.server_id, /*whole_rows=*/true);
    o.threads = options_.compression.factor_threads;
    o.trace = options_.trace;
    o.track = fmt::format("factors of server {}", options_.server_id);
    o.wake = [this] { CallWake(); };
    expander_ = std::make_unique<FactorExpander>(layout_, std::move(o));
  }
  return *expander_;
}

void ShardServer::FinishExpansions(ServerEndpoint* ep) {
  if (expander_ == nullptr) return;
  for (const std::unique_ptr<FactorJob>& job : expander_->TakeDone()) {
    const auto t0 = std::chrono::steady_clock::now();
    ContinuePush(ep, job.get());
    // Then what the peer sent meanwhile, in order, until one of them is deferred in its turn.
    std::vector<DeferredMessage> waiting = std::move(deferred_[job->peer]);
    deferred_.erase(job->peer);
    for (size_t i = 0; i < waiting.size(); ++i) {
      if (auto again = deferred_.find(job->peer); again != deferred_.end()) {
        for (size_t j = i; j < waiting.size(); ++j) again->second.push_back(std::move(waiting[j]));
        break;
      }
      HandleOne(ep, job->peer, waiting[i].info, waiting[i].frames);
    }
    stats_.busy_ns += NanosSince(t0);
  }
}

void ShardServer::ContinuePush(ServerEndpoint* ep, FactorJob* job) {
  TraceSpan span(options_.trace, options_.trace_track, "server", "push");
  span.Arg("worker", job->header.sender);
  span.Arg("chunks", static_cast<double>(job->header.chunk_ids.size()));
  MessageHeader reply = ReplyTo(job->header);
  RejectReason reason = job->reason;
  Status s = job->status;
  if (s.ok()) s = DensifyPush(&job->header, &job->frames, &job->finite, &reason);  // its lossy chunks, if any
  if (s.ok()) {
    const WirePush wire{std::move(job->wire_header), std::move(job->wire_frames)};
    s = HandlePush(job->header, job->frames, &reply, &reason, job->finite, job->keep_wire ? &wire : nullptr);
  }
  if (!s.ok()) {
    if (!durability_->log().failed()) Reject(ep, job->peer, job->info, job->header, s, reason);
    return;
  }
  ReplyWhenLogged(ep, job->peer, reply, MsgType::kPush);
}

Status ShardServer::TakePull(ServerEndpoint* ep, const PeerId& peer, const PeerInfo& info, const MessageHeader& h,
                             RejectReason* reason) {
  const bool reader = h.role == Role::kEvaluator;
  DP_RETURN_IF_ERROR(reader ? sessions_->CheckReader(peer, h, reason) : sessions_->CheckWorker(peer, info, h, reason));
  PendingPull p{peer, h, {}, std::chrono::steady_clock::now(), reader};
  DP_RETURN_IF_ERROR(ResolveChunkIds(rules_, h, /*all_if_empty=*/true, &p.locals, reason));
  if (h.encoding != Encoding::kDense || !h.encodings.empty()) {
    *reason = RejectReason::kDType;  // a pull asks only for a dtype (f32 / f16 / bf16)
    return InvalidArgument("pull: encoding {} / {} per-chunk encodings asked; pulls are dense",
                           static_cast<int>(h.encoding), h.encodings.size());
  }
  if ((h.flags & kFlagShm) != 0 && sessions_->Region(peer) == nullptr) {
    *reason = RejectReason::kFrameCount;
    return InvalidArgument("pull: asked for shared memory, but this connection has no region (register asking for one)");
  }
  if (!reader) {
    p.order = step_order_.Key(h.sender, h.clock, static_cast<uint64_t>(p.arrived.time_since_epoch().count()));
  }
  if (PullReady(p)) {
    ServePull(ep, p);
  } else {
    pending_.push_back(std::move(p));
  }
  return Status::Ok();
}

Status ShardServer::HandleClock(const PeerId& peer, const PeerInfo& info, const MessageHeader& h,
                                MessageHeader* reply, RejectReason* reason) {
  DP_RETURN_IF_ERROR(sessions_->CheckWorker(peer, info, h, reason));
  WalRecord r;
  r.kind = WalKind::kClock;
  r.worker = h.sender;
  r.clock = h.clock;
  *reason = RejectReason::kLogWrite;  // the log could not be written: nothing was taken
  DP_RETURN_IF_ERROR(durability_->Stage(&r));
  policy_->OnClock(h.sender, h.clock);
  reply->type = MsgType::kAck;
  return Status::Ok();
}

Status ShardServer::HandleShutdown(const PeerInfo& info, const MessageHeader& h, MessageHeader* reply,
                                   RejectReason* reason) {
  *reason = RejectReason::kUnauthorized;
  DP_RETURN_IF_ERROR(Authorize(options_.access, info, h, Privilege::kAdmin));
  spdlog::info("server {}: shutdown requested by {}", options_.server_id, DescribePeer(info));
  reply->type = MsgType::kAck;
  shutdown_.store(true);
  stop_.store(true);
  return Status::Ok();
}

Status ShardServer::HandleCheckpoint(const PeerInfo& info, const MessageHeader& h, MessageHeader* reply,
                                     RejectReason* reason) {
  *reason = RejectReason::kUnauthorized;
  DP_RETURN_IF_ERROR(Authorize(options_.access, info, h, Privilege::kAdmin));
  // A path from the wire is a place to write 2.6 MB+ of the peer's choosing: it must stay in the
  // run directory. The server's own checkpoint path (no path in the request) is trusted.
  std::string path = options_.checkpoint_path;
  if (!h.text.empty()) {
    *reason = RejectReason::kOutsideRunDir;
    DP_RETURN_IF_ERROR(ConfineToRunDir(options_.access.run_dir, h.text, &path));
  }
  *reason = RejectReason::kBadType;
  if (path.empty()) return InvalidArgument("checkpoint: no path in the request and the server has no --run-dir");
  DP_RETURN_IF_ERROR(durability_->Save(path));
  reply->type = MsgType::kAck;
  reply->text = path;
  return Status::Ok();
}

Status ShardServer::HandleRegister(const PeerId& peer, const PeerInfo& info, const MessageHeader& h,
                                   MessageHeader* reply, RejectReason* reason) {
  if (h.role == Role::kEvaluator) {
    DP_RETURN_IF_ERROR(sessions_->RegisterReader(peer, info, h, reason));
    RegisterReply(h, reply);
    return Status::Ok();
  }
  DP_RETURN_IF_ERROR(sessions_->CheckRegister(info, h, reason));
  if (policy_->CanJoin(h.sender)) {  // an elastic joiner, or a dead worker back: logged, then taken
    WalRecord r;
    r.kind = WalKind::kJoin;
    r.worker = h.sender;
    *reason = RejectReason::kLogWrite;
    DP_RETURN_IF_ERROR(durability_->Stage(&r));
    policy_->OnJoin(h.sender);
    spdlog::info("server {}: worker {} joined the consistency accounting", options_.server_id, h.sender);
  }
  if (const Status region = sessions_->RegisterWorker(peer, info, h, reply); !region.ok()) {
    reply_log_.Log(fmt::format("server {}: no shared memory for worker {} (payloads over the socket): {}",
                               options_.server_id, h.sender, region.ToString()));
  }
  RegisterReply(h, reply);
  return Status::Ok();
}

void ShardServer::RegisterReply(const MessageHeader& h, MessageHeader* reply) const {
  reply->type = MsgType::kRegisterReply;
  reply->assigned_id = h.sender;
  reply->server_count = layout_.servers();
  reply->worker_count = options_.cluster.workers;
}

Status ShardServer::ReadRegionPush(const PeerId& peer, const MessageHeader& h, Frames* frames, RejectReason* reason) {
  *reason = RejectReason::kFrameCount;
  const std::shared_ptr<SharedRegion> region = sessions_->Region(peer);
  if (region == nullptr) {
    return InvalidArgument("push: payload in shared memory, but this connection has no region (register asking for one)");
  }
  if (frames->size() != 1) {
    return InvalidArgument("push: payload in shared memory and {} payload frames", frames->size() - 1);
  }
  std::vector<int> locals;
  DP_RETURN_IF_ERROR(ResolveChunkIds(rules_, h, /*all_if_empty=*/false, &locals, reason));
  uint64_t total = 0;
  for (int l : locals) total += static_cast<uint64_t>(store_->count(l));
  // Copied out first: the worker can write the region at any time, so what is validated and
  // applied must be a private copy (as a received frame is), kept until the lanes have applied it.
  std::shared_ptr<float[]> copy = region_scratch_.Take(total);
  const auto* area = reinterpret_cast<const float*>(region->payload());
  uint64_t at = 0;
  for (int l : locals) {
    const int32_t id = store_->id(l);
    const auto n = static_cast<uint64_t>(layout_.chunk(id).count);
    std::memcpy(copy.get() + at, area + store_->share().offset[static_cast<size_t>(id)], n * sizeof(float));
    frames->push_back(Frame::Borrow(copy.get() + at, n * sizeof(float), copy));
    at += n;
  }
  ++stats_.region_parts;
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
// Push: validate every chunk, then hand the whole push to the policy.

Status ShardServer::DensifyPush(MessageHeader* h, Frames* frames, std::vector<bool>* finite, RejectReason* reason) {
  if (HasFactorChunks(*h)) {  // replay: nothing is served meanwhile, so the loop waits for it
    FactorExpander& expander = Expander();
    DP_CHECK(expander.in_flight() == 0);  // no live push: this one's result is the only one
    auto job = std::make_unique<FactorJob>();
    job->header = std::move(*h);
    job->frames = std::move(*frames);
    expander.Submit(std::move(job));
    expander.WaitAll();
    std::vector<std::unique_ptr<FactorJob>> done = expander.TakeDone();
    DP_CHECK(done.size() == 1);
    *h = std::move(done[0]->header);
    *frames = std::move(done[0]->frames);
    *finite = std::move(done[0]->finite);
    *reason = done[0]->reason;
    DP_RETURN_IF_ERROR(done[0]->status);
  }
  if (CodedPush(*h)) {  // lossy: decoded to f32 dense, then checked and applied as one
    MessageHeader dense;
    Frames decoded;
    DP_RETURN_IF_ERROR(DecodeCodedPush(rules_, *h, *frames, &dense, &decoded, reason));
    *h = std::move(dense);
    *frames = std::move(decoded);
    // DecodeChunk refuses every non-finite value it would write: the decoded chunks are finite.
    finite->assign(h->chunk_ids.size(), true);
  }
  return Status::Ok();
}

Status ShardServer::HandlePush(const MessageHeader& h, const Frames& frames, MessageHeader* reply, RejectReason* reason,
                               const std::vector<bool>& finite, const WirePush* wire) {
  CheckedPush checked;
  DP_RETURN_IF_ERROR(CheckDensePush(rules_, h, frames, ChunkFactsOf(), finite, &checked, reason));
  const bool init = (h.flags & kFlagInit) != 0;
  const bool move = (h.flags & kFlagMove) != 0;
  const size_t n = h.chunk_ids.size();
  const std::vector<int>& locals = checked.locals;
  std::vector<PushChunk>& chunks = checked.chunks;
  reply->type = MsgType::kAck;
  reply->chunk_ids = h.chunk_ids;
  if (sessions_->duplicates().Seen(h.sender, h.session, h.request_id)) {  // a resend of a push already taken
    ++stats_.duplicates;
    for (int l : locals) reply->versions.push_back(store_->version(l));
    return Status::Ok();
  }
  // The rule of the push's kind (server/rules/shard_rule.h; CheckDensePush took the kind); an
  // init push has none.
  ShardRule* rule = init ? nullptr : RuleFor(h.flags);
  const PushContext ctx{h.sender, move ? int64_t{h.move_batches} : h.clock};  // a move's clock: its batches
  if (rule != nullptr) {
    Status rule_ok = rule->Check(*rule_host_, ctx, chunks);
    if (!rule_ok.ok()) {
      *reason = RejectReason::kClock;
      return rule_ok;
    }
  }
  // A rule that rewrites the gradients (DC-ASGD) has them logged and applied as rewritten, so a
  // replay repeats them; the raw gradients go into the record too when it keeps them.
  const bool rewrites = rule != nullptr && rule->rewrites();
  const bool keeps_raw = rewrites && rule->keeps_raw();
  std::vector<const float*> raw;  // the pushed gradients, before the rule rewrote them, for the log
  if (keeps_raw && durability_->logging()) {
    for (const PushChunk& c : chunks) raw.push_back(c.grad);
  }
  if (rule != nullptr) rule->Prepare(*rule_host_, h.sender, &chunks);
  // Logged before it is applied and acknowledged: an ack means the push is in the log.
  WalRecord r;
  r.kind = WalKind::kPush;
  r.worker = h.sender;
  r.flags = (h.flags & (kFlagInit | kFlagElastic | kFlagMove)) | (keeps_raw ? kWalFlagRaw : 0u);
  r.session = h.session;
  r.request_id = h.request_id;
  r.clock = ctx.clock;  // a move's log record keeps its batches there
  if (durability_->logging() && wire != nullptr && !rewrites && PayloadBytes(wire->frames) < DenseBytes(chunks)) {
    // The push as the wire carried it: fewer bytes, and replay forms the same floats from it.
    r.kind = WalKind::kCodedPush;
    r.frames.reserve(wire->frames.size());
    r.frames.push_back(LoggedPushHeader(wire->header));
    r.frames.insert(r.frames.end(), wire->frames.begin() + 1, wire->frames.end());
  } else if (durability_->logging()) {
    r.chunks.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      // The first init of a chunk wins: one that finds weights there changes nothing and is
      // logged without its floats (every worker offers the initial weights, so a job of W workers
      // would log the model W times). The record stays, for the duplicate window replay rebuilds.
      if (init && store_->initialized(chunks[i].local)) continue;
      r.chunks.push_back(WalChunk{h.chunk_ids[i], chunks[i].version_from, chunks[i].grad,
                                  static_cast<uint32_t>(chunks[i].count), keeps_raw ? raw[i] : nullptr});
    }
  }
  *reason = RejectReason::kLogWrite;  // the log could not be written: nothing was taken
  DP_RETURN_IF_ERROR(durability_->Stage(&r));
  if (!rewrites) {  // the message's buffers live until the lanes have applied it (a rule's: applied now)
    struct Kept {
      Frames frames;
      std::vector<std::vector<float>> aligned;  // the chunks CheckDensePush copied to align them
    };
    auto keep = std::make_shared<Kept>(Kept{frames, std::move(checked.scratch)});
    for (PushChunk& c : chunks) c.keep = keep;
  }
  for (int l : locals) push_staleness_[static_cast<size_t>(l)] = -1;
  if (rule != nullptr) rule->Commit(chunks);  // taken: what the rule staged for it is the rule's
  ApplyPush(h.sender, h.session, h.request_id, r.clock, r.flags & ~kWalFlagRaw, chunks);
  for (int l : locals) reply->versions.push_back(store_->version(l));
  if (!init) {
    for (int l : locals) reply->staleness.push_back(push_staleness_[static_cast<size_t>(l)]);
  }
  durability_->AfterChange();
  return Status::Ok();
}

void ShardServer::ApplyPush(int32_t worker, uint64_t session, uint64_t request_id, int64_t clock, uint32_t flags,
                            const std::vector<PushChunk>& chunks) {
  sessions_->duplicates().Remember(worker, session, request_id);
  const bool init = (flags & kFlagInit) != 0;
  if (init) {
    // The first init wins; later ones (or after restore) are no-ops.
    for (const PushChunk& c : chunks) store_->Init(c.local, c.grad, c.keep);
  } else {
    RuleFor(flags)->Apply(*rule_host_, PushContext{worker, clock}, chunks);
    ++stats_.pushes_by_worker[static_cast<size_t>(worker)];  // persisted: counts across restarts
  }
  if (!durability_->replaying()) ++stats_.pushes_applied;  // this process's traffic; replay is counted in `replayed`
}

void ShardServer::ReplyWhenLogged(ServerEndpoint* ep, const PeerId& peer, const MessageHeader& reply,
                                  MsgType request_type) {
  durability_->log().ReplyWhenLogged(peer, reply, request_type, SendTo(ep), RefuseTo(ep));
}

void ShardServer::ReleaseHeld(ServerEndpoint* ep) { durability_->log().ReleaseHeld(SendTo(ep), RefuseTo(ep)); }

ShardLog::Send ShardServer::SendTo(ServerEndpoint* ep) {
  return [this, ep](const PeerId& peer, const MessageHeader& reply) { Reply(ep, peer, reply); };
}

ShardLog::Refuse ShardServer::RefuseTo(ServerEndpoint* ep) {
  return [this, ep](const PeerId& peer, const MessageHeader& request, const Status& why) {
    Reject(ep, peer, PeerInfo{}, request, why, RejectReason::kLogWrite);
  };
}

// ---------------------------------------------------------------------------------------------
// Pull.

bool ShardServer::PullReady(const PendingPull& p) const {
  for (int l : p.locals) {
    if (!store_->initialized(l)) return false;
  }
  return p.reader || policy_->PullReady(*updater_, p.request.sender, p.request.clock, p.locals);
}

void ShardServer::ServePull(ServerEndpoint* ep, const PendingPull& p) {
  TraceSpan span(options_.trace, options_.trace_track, "server", "serve pull");
  span.Arg("worker", p.request.sender);
  span.Arg("chunks", static_cast<double>(p.locals.size()));
  span.Arg("waited_ms", 1e3 * std::chrono::duration<double>(std::chrono::steady_clock::now() - p.arrived).count());
  auto job = std::make_shared<PullJob>();
  job->peer = p.peer;
  job->order = p.reader ? UINT64_MAX : p.order;
  MessageHeader& reply = job->reply;
  reply.type = MsgType::kPullReply;
  reply.request_id = p.request.request_id;
  reply.model_id = options_.model_id;
  reply.sender = options_.server_id;
  reply.layout_hash = layout_.hash();
  reply.clock = p.request.clock;
  std::shared_ptr<SharedRegion> region;
  if ((p.request.flags & kFlagShm) != 0) {
    region = sessions_->Region(p.peer);
    if (region == nullptr) {  // the region went while the pull waited (HandleMessage checks on arrival)
      ++stats_.rejected_by_reason[static_cast<size_t>(RejectReason::kFrameCount)];
      MessageHeader error =
          ErrorReply(p.request, InvalidArgument("pull: asked for shared memory, but this connection has no region"));
      error.flags = static_cast<uint32_t>(RejectReason::kFrameCount);
      Reply(ep, p.peer, error);
      return;
    }
    reply.flags |= kFlagShm;
    ++stats_.region_parts;
  }
  // The dtype the pull asked for; shared memory carries f32 (the client asks f32 there).
  reply.dtype = region != nullptr ? DType::kF32 : p.request.dtype;
  if (!p.reader) {  // a worker's pull, at the versions this reply carries
    for (const auto& rule : rules_by_kind_) rule->OnPullServed(*rule_host_, p.request.sender, p.locals);
  }
  // The header now, from the loop's versions; the floats from each chunk's lane, after the
  // updates posted before this pull and before any posted after it.
  for (int l : p.locals) {
    const auto n = static_cast<uint64_t>(store_->count(l));
    reply.chunk_ids.push_back(static_cast<uint32_t>(store_->id(l)));
    reply.versions.push_back(store_->version(l));
    reply.iters.push_back(store_->iter(l));
    reply.elem_counts.push_back(n);
    reply.byte_lengths.push_back(n * DTypeSize(reply.dtype));
  }
  if (p.reader) {
    ++stats_.evaluator_pulls;
  } else {
    ++stats_.pulls_served;
    if (options_.on_pull_served) {
      PullServedEvent e;
      e.worker = p.request.sender;
      e.clock = p.request.clock;
      e.min_live_clock = policy_->MinLiveClock();
      e.waited_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - p.arrived).count();
      e.chunks = static_cast<int>(p.locals.size());
      for (int64_t v : reply.versions) e.version_sum += v;
      options_.on_pull_served(e);
    }
  }
  const bool now = store_->Read(p.locals, reply.dtype, std::move(region), &job->payload, [this, job] {
    {
      std::lock_guard<std::mutex> lock(done_mu_);
      done_pulls_.push_back(job);
    }
    CallWake();
  });
  if (now) Reply(ep, job->peer, job->reply, std::move(job->payload), job->order);
}

void ShardServer::SendDonePulls(ServerEndpoint* ep) {
  std::vector<std::shared_ptr<PullJob>> done;
  {
    std::lock_guard<std::mutex> lock(done_mu_);
    done.swap(done_pulls_);
  }
  for (const auto& job : done) Reply(ep, job->peer, job->reply, std::move(job->payload), job->order);
}

void ShardServer::CallWake() {
  std::lock_guard<std::mutex> lock(wake_mu_);
  if (wake_) wake_();
}

void ShardServer::ServePending(ServerEndpoint* ep) {
  std::lock_guard<std::mutex> lock(mu_);
  bool changed = false;
  for (const auto& [w, finished] : gone_queue_) {
    // Ids this server does not account for, and workers already gone (the coordinator repeats
    // itself), change nothing: no record, no line. (A dead or never-seen worker reported
    // finished becomes finished: it may not rejoin.)
    if (!KnownWorker(w) || !(policy_->IsLive(w) || (finished && policy_->CanJoin(w)))) continue;
    WalRecord r;
    r.kind = WalKind::kGone;
    r.worker = w;
    r.finished = finished;
    Status s = durability_->Stage(&r);
    if (!s.ok()) {
      spdlog::error("shard {}: {}; worker {} stays in the accounting", options_.server_id, s.ToString(), w);
      continue;
    }
    ApplyGone(w, finished);
    changed = true;
    if (finished) {
      spdlog::info("shard {}: worker {} finished; no longer waited for", options_.server_id, w);
    } else {
      spdlog::info("shard {}: worker {} declared dead; dropped from consistency accounting", options_.server_id, w);
    }
  }
  if (changed) durability_->AfterChange();
  gone_queue_.clear();
  if (pending_.empty()) return;
  std::vector<PendingPull> still;
  for (auto& p : pending_) {
    if (PullReady(p)) {
      ServePull(ep, p);
    } else {
      still.push_back(std::move(p));
    }
  }
  pending_ = std::move(still);
}

void ShardServer::ApplyGone(int32_t worker, bool finished) { policy_->OnWorkerDead(*updater_, worker, finished); }

// ---------------------------------------------------------------------------------------------
// Stats, snapshots.

ShardStatsWire ShardServer::StatsLocked() const {
  ShardStatsWire s = stats_;
  s.sgd_ns = store_->apply_ns();
  if (expander_ != nullptr) s.factor_ns = expander_->busy_ns();
  durability_->AddStats(&s);
  return s;
}

ShardStatsWire ShardServer::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return StatsLocked();
}

std::vector<float> ShardServer::ChunkWeights(int32_t chunk) const {
  std::lock_guard<std::mutex> lock(mu_);
  const int local = store_->local_of(chunk);
  if (local < 0 || !store_->initialized(local)) return {};
  store_->Drain();
  return store_->weights(local);
}

std::vector<float> ShardServer::ChunkHistory(int32_t chunk) const {
  std::lock_guard<std::mutex> lock(mu_);
  const int local = store_->local_of(chunk);
  if (local < 0) return {};
  store_->Drain();
  return store_->state(local);
}

std::vector<float> ShardServer::ChunkRuleState(int32_t chunk) const {
  std::lock_guard<std::mutex> lock(mu_);
  const int local = store_->local_of(chunk);
  if (local < 0) return {};
  return rules_by_kind_[static_cast<size_t>(PushKind::kGradient)]->ChunkState(local);
}

std::string ShardServer::RuleStateName() const {
  std::lock_guard<std::mutex> lock(mu_);
  return std::string(rules_by_kind_[static_cast<size_t>(PushKind::kGradient)]->state_name());
}

int64_t ShardServer::ChunkVersion(int32_t chunk) const {
  std::lock_guard<std::mutex> lock(mu_);
  const int local = store_->local_of(chunk);
  return local < 0 ? -1 : store_->version(local);
}

int64_t ShardServer::ChunkScheduleIter(int32_t chunk) const {
  std::lock_guard<std::mutex> lock(mu_);
  const int local = store_->local_of(chunk);
  return local < 0 ? -1 : store_->iter(local);
}

uint64_t ShardServer::log_seq() const {
  std::lock_guard<std::mutex> lock(mu_);
  return durability_->seq();
}

int64_t ShardServer::updates() const {
  std::lock_guard<std::mutex> lock(mu_);
  return store_->updates();
}

// ---------------------------------------------------------------------------------------------
// Durability: the log, checkpoints and recovery are ShardDurability's; what a checkpoint holds
// and how a log record applies are here.

Status ShardServer::OpenLog() {
  std::lock_guard<std::mutex> lock(mu_);
  return durability_->Open();
}

void ShardServer::SetWake(std::function<void()> wake) {
  std::lock_guard<std::mutex> lock(wake_mu_);
  wake_ = std::move(wake);
}

Status ShardServer::SaveCheckpoint(const std::string& path) {
  std::lock_guard<std::mutex> lock(mu_);
  return durability_->Save(path);
}

Status ShardServer::LoadCheckpoint(const std::string& path) {
  std::lock_guard<std::mutex> lock(mu_);
  return durability_->Load(path);
}

Status ShardServer::Recover(RecoverReport* report) {
  std::lock_guard<std::mutex> lock(mu_);
  return durability_->Recover(report);
}

Status ShardServer::Replay(const WalRecord& r, const std::string& path) {
  std::lock_guard<std::mutex> lock(mu_);
  return durability_->Replay(r, path);
}

TensorFile ShardServer::CheckpointFile(uint64_t wal_seq) {
  ShardCheckpoint c;
  c.server_id = options_.server_id;
  c.server_count = layout_.servers();
  c.layout_hash = layout_.hash();
  c.model_id = options_.model_id;
  c.updates = store_->updates();
  c.wal_seq = wal_seq;
  c.has_state = true;
  c.max_workers = max_workers_;
  c.update_rule = std::string(store_->rule().name());
  c.pushes_by_worker.assign(stats_.pushes_by_worker.begin(), stats_.pushes_by_worker.end());
  c.dedup = sessions_->duplicates().Export();
  store_->Snapshot(&c.chunks);  // drains the lanes: every taken update is in it
  for (const auto& rule : rules_by_kind_) {  // a rule's own state (a chunk without one has none yet)
    if (rule->state_name().empty()) continue;
    for (size_t i = 0; i < c.chunks.size(); ++i) {
      c.chunks[i].rule_state[std::string(rule->state_name())] = rule->ChunkState(static_cast<int>(i));
    }
  }
  TensorFile file = EncodeShardCheckpoint(std::move(c));
  policy_->SaveState(&file);
  return file;
}

Status ShardServer::RestoreFrom(TensorFile& file, const std::string& path, uint64_t* wal_seq) {
  ShardCheckpointExpect expect;
  expect.server_id = options_.server_id;
  expect.layout_hash = layout_.hash();
  expect.model_id = options_.model_id;
  expect.max_workers = max_workers_;
  store_->Expect(&expect);
  for (const auto& rule : rules_by_kind_) {
    if (!rule->state_name().empty()) expect.rule_states.emplace_back(rule->state_name());
  }
  // Check everything before changing anything.
  ShardCheckpoint c;
  DP_RETURN_IF_ERROR(DecodeShardCheckpoint(file, path, expect, &c));
  store_->Drain();
  if (c.has_state) DP_RETURN_IF_ERROR(policy_->LoadState(file, *updater_, path));
  for (size_t w = 0; w < c.pushes_by_worker.size(); ++w) {
    stats_.pushes_by_worker[w] = static_cast<uint64_t>(c.pushes_by_worker[w]);
  }
  sessions_->duplicates().Import(c.dedup);
  for (const auto& rule : rules_by_kind_) {
    if (rule->state_name().empty()) continue;
    for (size_t i = 0; i < c.chunks.size(); ++i) {
      std::vector<float>& state = c.chunks[i].rule_state[std::string(rule->state_name())];
      rule->SetChunkState(static_cast<int>(i), std::move(state));
    }
  }
  store_->Restore(&c.chunks);
  store_->set_updates(c.updates);
  *wal_seq = c.wal_seq;
  return Status::Ok();
}

Status ShardServer::ApplyRecord(const WalRecord& r, const std::string& path) {
  if (!KnownWorker(r.worker)) {
    return Corrupt("{}: record seq {}: worker {} is outside 0..{} (cluster.max_workers)", path, r.seq, r.worker,
                   max_workers_ - 1);
  }
  switch (r.kind) {
    case WalKind::kPush: {
      const bool init = (r.flags & kFlagInit) != 0;
      std::vector<PushChunk> chunks;
      chunks.reserve(r.chunks.size());
      for (const WalChunk& c : r.chunks) {
        const int local = c.chunk_id < static_cast<uint32_t>(layout_.num_chunks())
                              ? store_->local_of(static_cast<int32_t>(c.chunk_id))
                              : -1;
        if (local < 0 || layout_.chunk(static_cast<int32_t>(c.chunk_id)).count != static_cast<int64_t>(c.count)) {
          return Corrupt("{}: record seq {}: chunk {} ({} floats) is not a chunk of server {} in this layout", path,
                         r.seq, c.chunk_id, c.count, options_.server_id);
        }
        if (!init && !store_->initialized(local)) {
          return Corrupt("{}: record seq {}: gradient for chunk {} before its weights were initialised", path, r.seq,
                         c.chunk_id);
        }
        chunks.push_back(PushChunk{local, c.data, static_cast<int64_t>(c.count), c.version_from, nullptr});
      }
      if ((r.flags & kWalFlagRaw) != 0 && init) {
        return Corrupt("{}: record seq {}: an init push with raw gradients", path, r.seq);
      }
      // The raw gradients, for a rule that rebuilds its state from them (DC-ASGD-a's mean
      // squares; a rule that keeps none, as a server resumed with another algorithm, ignores
      // them: the applied gradients alone restore the weights).
      if ((r.flags & kWalFlagRaw) != 0 && !init) {
        ShardRule* rule = RuleFor(r.flags);
        for (size_t i = 0; i < chunks.size(); ++i) rule->Replay(chunks[i].local, r.chunks[i].raw, chunks[i].count);
      }
      ApplyPush(r.worker, r.session, r.request_id, r.clock, r.flags & ~kWalFlagRaw, chunks);
      return Status::Ok();
    }
    case WalKind::kCodedPush:
      return ApplyCodedRecord(r, path);
    case WalKind::kClock:
      policy_->OnClock(r.worker, r.clock);
      return Status::Ok();
    case WalKind::kGone:
      ApplyGone(r.worker, r.finished);
      return Status::Ok();
    case WalKind::kJoin:
      policy_->OnJoin(r.worker);
      return Status::Ok();
  }
  return Corrupt("{}: record seq {}: unknown kind", path, r.seq);
}

std::function<ChunkFacts(int)> ShardServer::ChunkFactsOf() const {
  return [this](int local) { return ChunkFacts{store_->initialized(local), store_->version(local)}; };
}

// A coded push record: formed and decoded by the live path's code, checked as the live push was
// (against the state replay has rebuilt, which is the state it met), then applied.
Status ShardServer::ApplyCodedRecord(const WalRecord& r, const std::string& path) {
  MessageHeader h = r.header;
  Frames frames = r.frames;
  std::vector<bool> finite;
  RejectReason reason = RejectReason::kUndecodable;
  Status s = DensifyPush(&h, &frames, &finite, &reason);
  CheckedPush checked;
  if (s.ok()) {
    s = CheckDensePush(rules_, h, frames, ChunkFactsOf(), finite, &checked, &reason);
  }
  if (!s.ok()) {
    return Corrupt("{}: record seq {}: the logged push of worker {} is not one this shard takes ({}: {})", path, r.seq,
                   r.worker, RejectReasonName(reason), s.message());
  }
  ApplyPush(r.worker, r.session, r.request_id, r.clock, r.flags, checked.chunks);
  return Status::Ok();
}

}  // namespace downpour
