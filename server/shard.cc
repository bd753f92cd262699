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
#include "common/solver/lr_policy.h"
#include "common/solver/sgd.h"
#include "common/tensor_file.h"
#include "server/factor_push.h"
#include "server/shard_checkpoint.h"

namespace downpour {

namespace {

// A chunk's weights plus the number of pull-reply frames the transport still reads from them.
// `readers` is decremented with release by the frame's keepalive when the transport is done, and
// read with acquire before an update, so an update never races a reply (copy-on-write).
struct WeightBuffer {
  explicit WeightBuffer(std::vector<float> d) : data(std::move(d)) {}
  std::vector<float> data;
  std::atomic<int> readers{0};
};

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

// Nanoseconds since `t0` (the loop's counters: busy, update rule, factors, log).
uint64_t NanosSince(std::chrono::steady_clock::time_point t0) {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
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

// A pull reply's weights converted to f16 / bf16 (the masters stay f32), into a buffer of
// `pool` that the frame holds until the transport has sent it.
Frame ConvertedWeights(const std::vector<float>& w, DType dtype, BufferPool<uint16_t>* pool) {
  std::shared_ptr<uint16_t[]> out = pool->Take(w.size());
  if (dtype == DType::kF16) {
    FloatsToHalf(w, out.get());
  } else {
    FloatsToBf16(w, out.get());
  }
  return Frame::Borrow(out.get(), w.size() * sizeof(uint16_t), out);
}

}  // namespace

struct ShardServer::ChunkState {
  // The chunk's lane's (apply_lanes.h): only tasks on it, or the loop after draining it, touch these.
  // Shared with in-flight pull replies; replaced (copy-on-write) before an update if read.
  std::shared_ptr<WeightBuffer> weights;
  std::shared_ptr<WeightBuffer> spare;  // the buffer replaced last, reused once no reply reads it
  std::vector<float> history;  // the update rule's state, count floats
  // The loop's: what the chunk is once everything posted to its lane has run.
  int64_t version = 0;         // applied updates
  int64_t iter = 0;            // the lr schedule's iteration: worker batches in the applied updates
  bool initialized = false;
};

// A pull reply being assembled by the lanes of its chunks; the last lane to fill its slot hands
// it to the loop (done_pulls_), which sends it.
struct ShardServer::PullJob {
  PeerId peer;
  MessageHeader reply;
  Frames payload;  // one slot per chunk (none for a shared-memory reply)
  uint64_t order = UINT64_MAX;
  std::atomic<int> remaining{0};
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
  int num_local() const override { return static_cast<int>(s_->chunks_.size()); }
  int64_t version(int local) const override { return s_->chunks_[static_cast<size_t>(local)].version; }
  int64_t count(int local) const override {
    return s_->layout_.chunk(s_->owned_[static_cast<size_t>(local)]).count;
  }
  void Apply(int local, const float* grad, float grad_scale, float lr_scale, int gradients,
             std::shared_ptr<const void> keep) override {
    s_->ApplyGradient(local, grad, grad_scale, lr_scale, gradients, std::move(keep));
  }
  void Accumulate(int local, float* sum, const float* grad, int64_t count, bool first,
                  std::shared_ptr<const void> keep) override {
    s_->OnLane(local, std::move(keep), [sum, grad, n = static_cast<size_t>(count), first] {
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
    s_->NoteStaleness(static_cast<int64_t>(v));
  }

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
      share_(layout, options_.server_id),
      boot_id_(HostBootId()),
      duplicates_(max_workers_),
      fence_(max_workers_),
      peers_(max_workers_),
      refusal_log_(fmt::format("server {}", options_.server_id), "refusals"),
      reply_log_(fmt::format("server {}", options_.server_id), "failed replies"),
      // Reused buffers for two messages' worth of this shard's chunks (factor chunks' rows
      // reach past the chunk: the f32 pool is bounded by the rows' elements).
      region_scratch_(2 * OwnedElems(layout_, options_.server_id, /*whole_rows=*/false)),
      factor_scratch_(2 * OwnedElems(layout_, options_.server_id, /*whole_rows=*/true)) {
  local_of_.assign(static_cast<size_t>(layout_.num_chunks()), -1);
  for (int32_t id : layout_.ServerChunks(options_.server_id)) {
    local_of_[static_cast<size_t>(id)] = static_cast<int>(owned_.size());
    owned_.push_back(id);
  }
  rules_.layout = &layout_;
  rules_.local_of = local_of_;
  rules_.owned = owned_.size();
  rules_.server_id = options_.server_id;
  rules_.algorithm = options_.consistency.algorithm;
  rules_.model_moves = options_.model_moves;
  check_split_ = std::make_unique<BlockSplit>(std::max(1, options_.cluster.server_threads));
  rules_.all_finite = [split = check_split_.get()](std::span<const float> x) { return AllFiniteOn(split, x); };
  rule_ = options_.update_rule != nullptr ? options_.update_rule
                                          : std::shared_ptr<const UpdateRule>(MakeUpdateRule(options_.solver));
  chunks_.resize(owned_.size());
  for (size_t i = 0; i < owned_.size(); ++i) {
    const auto n = static_cast<size_t>(layout_.chunk(owned_[i]).count);
    chunks_[i].weights = std::make_shared<WeightBuffer>(std::vector<float>(n, 0.0f));
    chunks_[i].history.assign(n, rule_->initial_state());
  }
  ShardLogOptions lo;
  lo.server_id = options_.server_id;
  lo.path = options_.wal_path;
  lo.fsync_ms = std::chrono::milliseconds(options_.checkpoint.wal_fsync_ms);
  lo.io = options_.checkpoint.wal_io;
  lo.max_bytes = WalMaxBytes(options_.checkpoint);
  // A checkpoint holds the weights and the rule's state (f32 each), and DC-ASGD-a's mean squares.
  lo.checkpoint_bytes = share_.floats * (options_.consistency.algorithm == Algorithm::kDcAsgdAdaptive ? 12 : 8);
  lo.checkpoint_path = options_.checkpoint_path;
  lo.on_progress = [this] { CallWake(); };  // the log wrote more, or failed: held replies are due
  lo.keep_segments = options_.checkpoint.history;
  log_ = std::make_unique<ShardLog>(std::move(lo));
  policy_ = MakeConsistencyPolicy(options_.consistency, options_.cluster.workers, max_workers_, options_.round_members);
  updater_ = std::make_unique<Updater>(this);
  std::vector<int64_t> chunk_elems;
  for (int32_t id : owned_) chunk_elems.push_back(layout_.chunk(id).count);
  lanes_ = std::make_unique<ApplyLanes>(std::max(1, options_.cluster.server_threads), chunk_elems);
  // Each lane converts fp16 / bf16 pull replies into buffers of its own pool (a pool is one
  // thread's): its share of two messages' worth, and room for its largest chunk.
  const size_t pool_elems = 2 * OwnedElems(layout_, options_.server_id, /*whole_rows=*/false);
  int64_t largest = 0;
  for (int64_t n : chunk_elems) largest = std::max(largest, n);
  for (int i = 0; i < lanes_->lanes(); ++i) {
    pull_scratch_.push_back(std::make_unique<BufferPool<uint16_t>>(
        pool_elems / static_cast<size_t>(lanes_->lanes()) + static_cast<size_t>(largest)));
  }
  stats_.rejected_by_reason.assign(static_cast<size_t>(RejectReason::kCount), 0);
  stats_.staleness_histogram.assign(static_cast<size_t>(options_.staleness_buckets), 0);
  push_staleness_.assign(chunks_.size(), -1);
  if (DelayCompensated(options_.consistency.algorithm)) {
    dc_ = std::make_unique<DelayCompensation>(options_.consistency, max_workers_, static_cast<int>(chunks_.size()));
  }
  stats_.pushes_by_worker.assign(static_cast<size_t>(max_workers_), 0);
  pull_step_order_.assign(static_cast<size_t>(max_workers_), {-1, 0});
}

ShardServer::~ShardServer() {
  Stop();
  if (thread_.joinable()) thread_.join();
  lanes_.reset();  // runs what was posted, while everything its tasks touch is still here
  log_.reset();    // its thread calls the wake function (wake_mu_, wake_) until it stops
}

// ---------------------------------------------------------------------------------------------
// Loop.

Status ShardServer::Serve(ServerEndpoint* ep) {
  SetWake([ep] { ep->Wake(); });
  DP_RETURN_IF_ERROR(OpenLog());
  while (!stop_.load() && !log_->failed()) {
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
  return log_->failed() ? LogFailure() : finished;
}

Status ShardServer::LogFailure() const {
  if (!log_->failed()) return Status::Ok();
  return IoError(
      "server {}: stopped: its write-ahead log {} takes nothing more ({}); restart it from its checkpoint "
      "and log (--recover)",
      options_.server_id, options_.wal_path, log_->Failure().message());
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
  ServePending(ep);
  {
    std::lock_guard<std::mutex> lock(mu_);
    ReleaseHeld(ep);
  }
  refusal_log_.Flush();
  reply_log_.Flush();
}

Status ShardServer::Finish(ServerEndpoint* ep) {
  refusal_log_.FlushFinal();
  reply_log_.FlushFinal();
  std::lock_guard<std::mutex> lock(mu_);
  lanes_->Drain();
  if (fenced_.load()) {  // out of the run: its log is another process's now
    log_->Abandon();
    return Status::Ok();
  }
  if (ep != nullptr) SendDonePulls(ep);
  if (!log_->open()) return Status::Ok();
  const Status s = log_->Sync();
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
  if (finished) return;
  // Declared dead: the process that was silent is out of the run, whatever it sends if it wakes.
  // It registered before its silence began, at least the timeout before this notice; a process
  // restarted under the same id registers later, after the coordinator took the id back.
  const auto cutoff =
      std::chrono::steady_clock::now() - std::chrono::milliseconds(options_.cluster.heartbeat_timeout_ms) / 2;
  for (uint64_t session : fence_.Fence(worker, cutoff)) {
    spdlog::info("server {}: worker {} declared dead: its process (client session {:016x}) is out of the run",
                 options_.server_id, worker, session);
  }
}

Status ShardServer::CheckNotRemoved(int32_t worker, uint64_t session, RejectReason* reason) const {
  if (!fence_.Removed(worker, session)) return Status::Ok();
  *reason = RejectReason::kRemoved;
  return FailedPrecondition(
      "worker {} was declared dead by the coordinator (silent past cluster.heartbeat_timeout_ms: the process was "
      "stopped or cut off), so this process is out of the run; a restarted one (--resume) joins again",
      worker);
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
  MessageHeader reply;
  reply.request_id = h.request_id;
  reply.model_id = options_.model_id;
  reply.sender = options_.server_id;
  reply.layout_hash = layout_.hash();
  RejectReason reason = RejectReason::kBadType;
  switch (h.type) {
    case MsgType::kRegister:
      s = HandleRegister(peer, info, h, &reply, &reason);
      break;
    case MsgType::kPush:
      s = ReceivePush(ep, peer, info, &h, &frames, &reply, &reason);
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
    if (!log_->failed()) Reject(ep, peer, info, h, s, reason);
    return;
  }
  // What changed the shard (or repeats a change it took) is acknowledged once the log holds it.
  if (h.type == MsgType::kPush || h.type == MsgType::kClock || h.type == MsgType::kRegister) {
    ReplyWhenLogged(ep, peer, reply, h.type);
  } else {
    Reply(ep, peer, reply);
  }
}

Status ShardServer::ReceivePush(ServerEndpoint* ep, const PeerId& peer, const PeerInfo& info, MessageHeader* h,
                                Frames* frames, MessageHeader* reply, RejectReason* reason) {
  DP_RETURN_IF_ERROR(CheckWorker(peer, info, *h, reason));
  if ((h->flags & kFlagShm) != 0) DP_RETURN_IF_ERROR(ReadRegionPush(peer, *h, frames, reason));
  // Sufficient factors and lossy chunks become f32 dense first: validation, policy and SGD see
  // f32 (those chunks known finite already); the push as it came is kept for the log.
  std::vector<bool> finite;
  WirePush wire;
  const bool coded = HasFactorChunks(*h) || CodedPush(*h);
  if (coded && log_->open()) wire = WirePush{*h, *frames};
  if (coded) DP_RETURN_IF_ERROR(DensifyPush(ep, h, frames, &finite, reason));
  return HandlePush(*h, *frames, reply, reason, finite, log_->open() && coded ? &wire : nullptr);
}

Status ShardServer::TakePull(ServerEndpoint* ep, const PeerId& peer, const PeerInfo& info, const MessageHeader& h,
                             RejectReason* reason) {
  const bool reader = h.role == Role::kEvaluator;
  DP_RETURN_IF_ERROR(reader ? CheckReader(peer, h, reason) : CheckWorker(peer, info, h, reason));
  PendingPull p{peer, h, {}, std::chrono::steady_clock::now(), reader};
  DP_RETURN_IF_ERROR(ResolveChunkIds(rules_, h, /*all_if_empty=*/true, &p.locals, reason));
  if (h.encoding != Encoding::kDense || !h.encodings.empty()) {
    *reason = RejectReason::kDType;  // a pull asks only for a dtype (f32 / f16 / bf16)
    return InvalidArgument("pull: encoding {} / {} per-chunk encodings asked; pulls are dense",
                           static_cast<int>(h.encoding), h.encodings.size());
  }
  if ((h.flags & kFlagShm) != 0 && peers_.Region(peer) == nullptr) {
    *reason = RejectReason::kFrameCount;
    return InvalidArgument("pull: asked for shared memory, but this connection has no region (register asking for one)");
  }
  if (!reader) {
    // A worker's pulls of one step share an order key: when its first one arrived. An endpoint
    // that orders replies (cluster.reply_order = "step") then sends one worker's step after
    // another's instead of interleaving them.
    auto& [clock, first] = pull_step_order_[static_cast<size_t>(h.sender)];
    if (clock != h.clock) {
      clock = h.clock;
      first = static_cast<uint64_t>(p.arrived.time_since_epoch().count());
    }
    p.order = first;
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
  DP_RETURN_IF_ERROR(CheckWorker(peer, info, h, reason));
  WalRecord r;
  r.kind = WalKind::kClock;
  r.worker = h.sender;
  r.clock = h.clock;
  *reason = RejectReason::kLogWrite;  // the log could not be written: nothing was taken
  DP_RETURN_IF_ERROR(LogRecord(&r));
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
  DP_RETURN_IF_ERROR(SaveCheckpointLocked(path));
  reply->type = MsgType::kAck;
  reply->text = path;
  return Status::Ok();
}

Status ShardServer::HandleRegister(const PeerId& peer, const PeerInfo& info, const MessageHeader& h,
                                   MessageHeader* reply, RejectReason* reason) {
  if (h.role == Role::kEvaluator) return RegisterReader(peer, info, h, reply, reason);
  *reason = RejectReason::kUnauthorized;
  DP_RETURN_IF_ERROR(Authorize(options_.access, info, h, Privilege::kRegisterWorker));
  *reason = RejectReason::kLayoutHash;
  if (h.layout_hash != layout_.hash()) {
    return FailedPrecondition(
        "register: layout hash mismatch: worker {} has {:#018x}, server {} has "
        "{:#018x} (different model, server count or chunk size)",
        h.sender, h.layout_hash, options_.server_id, layout_.hash());
  }
  *reason = RejectReason::kNotRegistered;
  if (!KnownWorker(h.sender)) {
    return InvalidArgument("register: worker id {} is outside 0..{} (cluster.max_workers = {})", h.sender,
                           max_workers_ - 1, max_workers_);
  }
  *reason = RejectReason::kModelId;
  if (h.model_id != options_.model_id) {
    return InvalidArgument("register: model id {} is not served here (server serves {})", h.model_id,
                           options_.model_id);
  }
  DP_RETURN_IF_ERROR(CheckNotRemoved(h.sender, h.session, reason));
  if (policy_->CanJoin(h.sender)) {  // an elastic joiner, or a dead worker back: logged, then taken
    WalRecord r;
    r.kind = WalKind::kJoin;
    r.worker = h.sender;
    *reason = RejectReason::kLogWrite;
    DP_RETURN_IF_ERROR(LogRecord(&r));
    policy_->OnJoin(h.sender);
    spdlog::info("server {}: worker {} joined the consistency accounting", options_.server_id, h.sender);
  }
  if (peers_.RegisterWorker(peer, h.sender)) {
    fence_.Registered(h.sender, h.session, std::chrono::steady_clock::now());
    spdlog::info("server {}: worker {} registered from {}", options_.server_id, h.sender, DescribePeer(info));
  }
  OfferRegion(peer, h, reply);
  reply->type = MsgType::kRegisterReply;
  reply->assigned_id = h.sender;
  reply->server_count = layout_.servers();
  reply->worker_count = options_.cluster.workers;
  return Status::Ok();
}

Status ShardServer::RegisterReader(const PeerId& peer, const PeerInfo& info, const MessageHeader& h,
                                   MessageHeader* reply, RejectReason* reason) {
  *reason = RejectReason::kUnauthorized;
  DP_RETURN_IF_ERROR(Authorize(options_.access, info, h, Privilege::kEvaluate));
  *reason = RejectReason::kLayoutHash;
  if (h.layout_hash != layout_.hash()) {
    return FailedPrecondition("register: layout hash mismatch: the evaluator has {:#018x}, server {} has {:#018x}",
                              h.layout_hash, options_.server_id, layout_.hash());
  }
  *reason = RejectReason::kModelId;
  if (h.model_id != options_.model_id) {
    return InvalidArgument("register: model id {} is not served here (server serves {})", h.model_id,
                           options_.model_id);
  }
  if (peers_.RegisterReader(peer)) {
    spdlog::info("server {}: the evaluator registered from {}", options_.server_id, DescribePeer(info));
  }
  reply->type = MsgType::kRegisterReply;
  reply->assigned_id = h.sender;
  reply->server_count = layout_.servers();
  reply->worker_count = options_.cluster.workers;
  return Status::Ok();
}

Status ShardServer::CheckReader(const PeerId& peer, const MessageHeader& h, RejectReason* reason) const {
  if (!peers_.IsReader(peer)) {
    *reason = RejectReason::kNotRegistered;
    return FailedPrecondition("pull: this connection is not registered as the evaluator with server {}",
                              options_.server_id);
  }
  return CheckLayoutAndModel(h, reason);
}

void ShardServer::OfferRegion(const PeerId& peer, const MessageHeader& h, MessageHeader* reply) {
  peers_.DropRegion(peer);  // a register starts over: a region from before is not in use any more
  const bool asked = (h.flags & kFlagShm) != 0;
  if (!asked || !options_.shared_memory || share_.floats == 0) return;
  if (h.boot_id.empty() || h.boot_id != boot_id_) return;  // another machine: the socket it is
  std::unique_ptr<SharedRegion> region;
  const Status s = SharedRegion::Create(fmt::format("downpour-s{}-w{}", options_.server_id, h.sender),
                                        share_.region_bytes(), &region);
  if (!s.ok()) {
    reply_log_.Log(fmt::format("server {}: no shared memory for worker {} (payloads over the socket): {}",
                               options_.server_id, h.sender, s.ToString()));
    return;
  }
  reply->shm_path = region->path();
  reply->shm_bytes = region->payload_bytes();
  reply->shm_nonce = region->nonce();
  peers_.SetRegion(peer, std::move(region));
}

Status ShardServer::ReadRegionPush(const PeerId& peer, const MessageHeader& h, Frames* frames, RejectReason* reason) {
  *reason = RejectReason::kFrameCount;
  const std::shared_ptr<SharedRegion> region = peers_.Region(peer);
  if (region == nullptr) {
    return InvalidArgument("push: payload in shared memory, but this connection has no region (register asking for one)");
  }
  if (frames->size() != 1) {
    return InvalidArgument("push: payload in shared memory and {} payload frames", frames->size() - 1);
  }
  std::vector<int> locals;
  DP_RETURN_IF_ERROR(ResolveChunkIds(rules_, h, /*all_if_empty=*/false, &locals, reason));
  uint64_t total = 0;
  for (int l : locals) total += static_cast<uint64_t>(layout_.chunk(owned_[static_cast<size_t>(l)]).count);
  // Copied out first: the worker can write the region at any time, so what is validated and
  // applied must be a private copy (as a received frame is), kept until the lanes have applied it.
  std::shared_ptr<float[]> copy = region_scratch_.Take(total);
  const auto* area = reinterpret_cast<const float*>(region->payload());
  uint64_t at = 0;
  for (int l : locals) {
    const int32_t id = owned_[static_cast<size_t>(l)];
    const auto n = static_cast<uint64_t>(layout_.chunk(id).count);
    std::memcpy(copy.get() + at, area + share_.offset[static_cast<size_t>(id)], n * sizeof(float));
    frames->push_back(Frame::Borrow(copy.get() + at, n * sizeof(float), copy));
    at += n;
  }
  ++stats_.region_parts;
  return Status::Ok();
}

Status ShardServer::CheckWorker(const PeerId& peer, const PeerInfo& info, const MessageHeader& h,
                                RejectReason* reason) const {
  Status s = Authorize(options_.access, info, h, Privilege::kWorkerTraffic);
  if (!s.ok()) {
    *reason = RejectReason::kUnauthorized;
    return s;
  }
  return CheckSender(peer, h, reason);
}

Status ShardServer::CheckSender(const PeerId& peer, const MessageHeader& h, RejectReason* reason) const {
  DP_RETURN_IF_ERROR(CheckNotRemoved(h.sender, h.session, reason));
  if (!peers_.IsWorker(peer, h.sender)) {
    *reason = RejectReason::kNotRegistered;
    return FailedPrecondition("{}: sender {} is not registered with server {} on this connection", MsgTypeName(h.type),
                              h.sender, options_.server_id);
  }
  DP_RETURN_IF_ERROR(CheckLayoutAndModel(h, reason));
  // A clock is a count of iterations: the consistency arithmetic (clock + 1, clock - s) must not
  // overflow on a forged one.
  if (h.clock < 0 || h.clock > kMaxClock) {
    *reason = RejectReason::kClock;
    return InvalidArgument("{}: clock {} is outside 0..{}", MsgTypeName(h.type), h.clock, kMaxClock);
  }
  return Status::Ok();
}

Status ShardServer::CheckLayoutAndModel(const MessageHeader& h, RejectReason* reason) const {
  if (h.layout_hash != layout_.hash()) {
    *reason = RejectReason::kLayoutHash;
    return FailedPrecondition("{}: layout hash {:#018x} differs from server {}'s {:#018x}", MsgTypeName(h.type),
                              h.layout_hash, options_.server_id, layout_.hash());
  }
  if (h.model_id != options_.model_id) {
    *reason = RejectReason::kModelId;
    return InvalidArgument("{}: model id {} is not served by server {} (serves {})", MsgTypeName(h.type),
                           h.model_id, options_.server_id, options_.model_id);
  }
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
// Push: validate every chunk, then hand the whole push to the policy.

Status ShardServer::DensifyPush(ServerEndpoint* ep, MessageHeader* h, Frames* frames, std::vector<bool>* finite,
                                RejectReason* reason) {
  if (HasFactorChunks(*h)) {
    TraceSpan factors(replaying_ ? nullptr : options_.trace, options_.trace_track, "server", "factors");
    const auto t0 = std::chrono::steady_clock::now();
    std::function<void()> between_chunks;
    if (ep != nullptr) between_chunks = [ep] { ep->ReleaseDue(); };
    DP_RETURN_IF_ERROR(ExpandFactorPush(layout_, h, frames, reason, &factor_scratch_,
                                        options_.compression.factor_threads, between_chunks, finite));
    if (!replaying_) stats_.factor_ns += NanosSince(t0);
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
  if (duplicates_.Seen(h.sender, h.session, h.request_id)) {  // a resend of a push already taken
    ++stats_.duplicates;
    for (int l : locals) reply->versions.push_back(chunks_[static_cast<size_t>(l)].version);
    return Status::Ok();
  }
  if (!init && !move) {
    Status policy_ok = policy_->CheckPush(*updater_, PushContext{h.sender, h.clock}, chunks);
    if (!policy_ok.ok()) {
      *reason = RejectReason::kClock;
      return policy_ok;
    }
  }
  // DC-ASGD: the compensated gradient is what gets logged and applied, so a replay repeats it;
  // DC-ASGD-a's log records keep the raw gradients too, for the mean square's replay.
  const bool dc = !init && !move && DelayCompensated(options_.consistency.algorithm);
  const bool adaptive_dc = dc && options_.consistency.algorithm == Algorithm::kDcAsgdAdaptive;
  std::vector<const float*> raw;  // the pushed gradients, before compensation, for the log
  if (adaptive_dc && log_->open()) {
    for (const PushChunk& c : chunks) raw.push_back(c.grad);
  }
  if (dc) {
    lanes_->Drain();  // compensation reads the weights as they are now
    dc_->Compensate(
        h.sender, &chunks, [this](int l) { return chunks_[static_cast<size_t>(l)].weights->data.data(); },
        &stats_.dc_compensated, &stats_.dc_uncompensated);
  }
  // Logged before it is applied and acknowledged: an ack means the push is in the log.
  WalRecord r;
  r.kind = WalKind::kPush;
  r.worker = h.sender;
  r.flags = (h.flags & (kFlagInit | kFlagElastic | kFlagMove)) | (adaptive_dc ? kWalFlagRaw : 0u);
  r.session = h.session;
  r.request_id = h.request_id;
  r.clock = move ? int64_t{h.move_batches} : h.clock;  // a move's log record keeps its batches there
  if (log_->open() && wire != nullptr && !dc && PayloadBytes(wire->frames) < DenseBytes(chunks)) {
    // The push as the wire carried it: fewer bytes, and replay forms the same floats from it.
    r.kind = WalKind::kCodedPush;
    r.frames.reserve(wire->frames.size());
    r.frames.push_back(LoggedPushHeader(wire->header));
    r.frames.insert(r.frames.end(), wire->frames.begin() + 1, wire->frames.end());
  } else if (log_->open()) {
    r.chunks.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      // The first init of a chunk wins: one that finds weights there changes nothing and is
      // logged without its floats (every worker offers the initial weights, so a job of W workers
      // would log the model W times). The record stays, for the duplicate window replay rebuilds.
      if (init && chunks_[static_cast<size_t>(chunks[i].local)].initialized) continue;
      r.chunks.push_back(WalChunk{h.chunk_ids[i], chunks[i].version_from, chunks[i].grad,
                                  static_cast<uint32_t>(chunks[i].count), adaptive_dc ? raw[i] : nullptr});
    }
  }
  *reason = RejectReason::kLogWrite;  // the log could not be written: nothing was taken
  DP_RETURN_IF_ERROR(LogRecord(&r));
  if (!dc) {  // the message's buffers live until the lanes have applied it (DC's are reused: applied now)
    struct Kept {
      Frames frames;
      std::vector<std::vector<float>> aligned;  // the chunks CheckDensePush copied to align them
    };
    auto keep = std::make_shared<Kept>(Kept{frames, std::move(checked.scratch)});
    for (PushChunk& c : chunks) c.keep = keep;
  }
  for (int l : locals) push_staleness_[static_cast<size_t>(l)] = -1;
  if (adaptive_dc) dc_->Commit(chunks);  // taken: DC-ASGD-a's mean squares move on with it
  ApplyPush(h.sender, h.session, h.request_id, r.clock, r.flags & ~kWalFlagRaw, chunks);
  for (int l : locals) reply->versions.push_back(chunks_[static_cast<size_t>(l)].version);
  if (!init) {
    for (int l : locals) reply->staleness.push_back(push_staleness_[static_cast<size_t>(l)]);
  }
  MaybeCheckpoint();
  return Status::Ok();
}

// EASGD's exchange and a model's move: the chunk's weights += the pushed change (AddRule), on
// the chunk's lane as a gradient's update is.
void ShardServer::AddDelta(const PushChunk& c) {
  OnLane(c.local, c.keep, [this, local = c.local, delta = c.grad, n = static_cast<size_t>(c.count)] {
    static const AddRule kAdd;
    kAdd.Apply(UpdateParams{}, std::span<const float>(delta, n), std::span<float>(MutableWeights(local).data(), n), {});
  });
}

void ShardServer::OnLane(int local, std::shared_ptr<const void> keep, std::function<void()> work) {
  if (keep == nullptr) {  // the data lives only during this call: the lane's earlier work, then this, now
    lanes_->DrainLane(lanes_->LaneOf(local));
    work();  // the lane is idle, and only this thread posts to it
    return;
  }
  const auto bytes = static_cast<size_t>(layout_.chunk(owned_[static_cast<size_t>(local)]).count) * sizeof(float);
  lanes_->Post(local, bytes, [work = std::move(work), keep = std::move(keep)] { work(); });
}

void ShardServer::ApplyPush(int32_t worker, uint64_t session, uint64_t request_id, int64_t clock, uint32_t flags,
                            const std::vector<PushChunk>& chunks) {
  duplicates_.Remember(worker, session, request_id);
  const bool init = (flags & kFlagInit) != 0;
  if (!init && (flags & kFlagMove) != 0) {
    // A model moves on (multi-model runs): its holder's change over the stage, added as it is;
    // `clock` is the batches the stage trained (the lr schedule's place).
    for (const PushChunk& c : chunks) {
      AddDelta(c);
      ChunkState& st = chunks_[static_cast<size_t>(c.local)];
      ++st.version;
      st.iter += clock;
      ++stats_.chunk_updates;
      ++updates_;
    }
    ++stats_.pushes_by_worker[static_cast<size_t>(worker)];
  } else if (!init && (flags & kFlagElastic) != 0) {
    // An elastic exchange (ExchangesModels: EASGD, Zhang, Choromanska, LeCun, NIPS 2015): the
    // center += the difference the worker computed and sent (EASGD's α(x_worker − x_center)).
    for (const PushChunk& c : chunks) {
      AddDelta(c);
      ChunkState& st = chunks_[static_cast<size_t>(c.local)];
      updater_->RecordStaleness(c.local, std::max<int64_t>(0, st.version - c.version_from));
      ++st.version;
      // An exchange stands for the batches the worker trained since its last one: the center's
      // place on the run's images-processed axis (what the evaluator reports).
      st.iter += ScheduleIterations(1, ExchangeBatches(options_.consistency));
      ++stats_.chunk_updates;
      ++updates_;
    }
    ++stats_.pushes_by_worker[static_cast<size_t>(worker)];
  } else if (init) {
    for (const PushChunk& c : chunks) {
      ChunkState& st = chunks_[static_cast<size_t>(c.local)];
      if (st.initialized) continue;  // first init wins; later ones (or after restore) are no-ops
      OnLane(c.local, c.keep, [this, local = c.local, w = c.grad, n = static_cast<size_t>(c.count)] {
        std::memcpy(MutableWeights(local).data(), w, n * sizeof(float));
      });
      st.initialized = true;
    }
  } else {
    if (policy_->OnPush(*updater_, PushContext{worker, clock}, chunks) == PushOutcome::kDroppedLate) {
      ++stats_.dropped_late;
    }
    ++stats_.pushes_by_worker[static_cast<size_t>(worker)];  // persisted: counts across restarts
  }
  if (!replaying_) ++stats_.pushes_applied;  // this process's traffic; replay is counted in `replayed`
}

Status ShardServer::LogRecord(WalRecord* r) {
  if (!log_->open()) return Status::Ok();
  const auto t0 = std::chrono::steady_clock::now();
  const uint64_t bytes0 = log_->bytes();
  Status s = log_->Stage(r, r->kind == WalKind::kPush || r->kind == WalKind::kCodedPush ? "push" : "change");
  stats_.wal_ns += NanosSince(t0);
  DP_RETURN_IF_ERROR(s);
  wal_seq_ = r->seq;
  ++stats_.wal_records;
  stats_.wal_bytes += log_->bytes() - bytes0;
  if (r->kind == WalKind::kCodedPush) ++stats_.wal_coded_records;
  return Status::Ok();
}

void ShardServer::ReplyWhenLogged(ServerEndpoint* ep, const PeerId& peer, const MessageHeader& reply,
                                  MsgType request_type) {
  log_->ReplyWhenLogged(peer, reply, request_type, SendTo(ep), RefuseTo(ep));
}

void ShardServer::ReleaseHeld(ServerEndpoint* ep) { log_->ReleaseHeld(SendTo(ep), RefuseTo(ep)); }

ShardLog::Send ShardServer::SendTo(ServerEndpoint* ep) {
  return [this, ep](const PeerId& peer, const MessageHeader& reply) { Reply(ep, peer, reply); };
}

ShardLog::Refuse ShardServer::RefuseTo(ServerEndpoint* ep) {
  return [this, ep](const PeerId& peer, const MessageHeader& request, const Status& why) {
    Reject(ep, peer, PeerInfo{}, request, why, RejectReason::kLogWrite);
  };
}

void ShardServer::NoteStaleness(int64_t staleness) {
  if (staleness_ring_.size() < static_cast<size_t>(kStalenessWindow)) {
    staleness_ring_.push_back(staleness);
  } else {
    staleness_ring_sum_ -= staleness_ring_[staleness_next_];
    staleness_ring_[staleness_next_] = staleness;
    staleness_next_ = (staleness_next_ + 1) % staleness_ring_.size();
  }
  staleness_ring_sum_ += staleness;
  if (stability_warned_ || replaying_ || options_.consistency.staleness_aware_lr ||
      staleness_ring_.size() < static_cast<size_t>(kStalenessWindow)) {
    return;
  }
  const double mean = static_cast<double>(staleness_ring_sum_) / static_cast<double>(staleness_ring_.size());
  const int live = policy_->LiveWorkers();
  if (mean >= 4.0 && mean >= static_cast<double>(live)) {
    stability_warned_ = true;
    spdlog::warn(
        "server {}: mean staleness over the last {} updates is {:.1f} versions with {} live workers (a healthy "
        "async run of W workers shows about W-1): gradients this stale can make training diverge; set "
        "consistency.staleness_aware_lr = true or lower solver.base_lr (now {})",
        options_.server_id, staleness_ring_.size(), mean, live, options_.solver.base_lr);
  }
}

std::vector<float>& ShardServer::MutableWeights(int local) {
  ChunkState& st = chunks_[static_cast<size_t>(local)];
  auto& w = st.weights;
  if (w->readers.load(std::memory_order_acquire) != 0) {
    // An in-flight pull reply still reads this buffer: the update goes to a copy; the old buffer
    // lives on in the reply's keepalive until the transport lets go of it, and is then the next
    // copy's home (st.spare), so a chunk pulled every step is not a fresh allocation and its
    // page faults every step.
    std::shared_ptr<WeightBuffer> next;
    if (st.spare != nullptr && st.spare.use_count() == 1 && st.spare->readers.load(std::memory_order_acquire) == 0) {
      next = std::move(st.spare);  // the acquire above orders the transport's last read before the writes
      std::memcpy(next->data.data(), w->data.data(), w->data.size() * sizeof(float));
    } else {
      next = std::make_shared<WeightBuffer>(w->data);
    }
    st.spare = std::move(w);
    w = std::move(next);
  }
  return w->data;
}

void ShardServer::ApplyGradient(int local, const float* grad, float grad_scale, float lr_scale, int gradients,
                                std::shared_ptr<const void> keep) {
  ChunkState& st = chunks_[static_cast<size_t>(local)];
  const Chunk& c = layout_.chunk(owned_[static_cast<size_t>(local)]);
  const TensorSpec& t = layout_.tensors()[static_cast<size_t>(c.tensor)];
  // The step is fixed here, at the chunk's place in message order; the lane only does the floats.
  UpdateParams p = MakeUpdateParams(options_.solver, st.iter, t.lr_mult, t.decay_mult, grad_scale);
  p.lr *= lr_scale;
  OnLane(local, std::move(keep), [this, local, grad, p, n = static_cast<size_t>(c.count)] {
    const auto t0 = std::chrono::steady_clock::now();
    float* weights = MutableWeights(local).data();
    float* history = chunks_[static_cast<size_t>(local)].history.data();
    rule_->Apply(p, std::span<const float>(grad, n), std::span<float>(weights, n), std::span<float>(history, n));
    apply_ns_.fetch_add(NanosSince(t0), std::memory_order_relaxed);
  });
  ++st.version;
  st.iter += ScheduleIterations(gradients, options_.worker.push_every);
  ++stats_.chunk_updates;
  ++updates_;
}

// ---------------------------------------------------------------------------------------------
// Pull.

bool ShardServer::PullReady(const PendingPull& p) const {
  for (int l : p.locals) {
    if (!chunks_[static_cast<size_t>(l)].initialized) return false;
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
    region = peers_.Region(p.peer);
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
  if (dc_ != nullptr && !p.reader) {
    lanes_->Drain();  // the copies DC-ASGD keeps are of the weights this reply carries
    for (int l : p.locals) {
      const ChunkState& st = chunks_[static_cast<size_t>(l)];
      dc_->RememberPulled(p.request.sender, l, st.weights->data, st.version);
    }
  }
  // The header now, from the loop's versions; the floats from each chunk's lane, after the
  // updates posted before this pull and before any posted after it.
  for (int l : p.locals) {
    const ChunkState& st = chunks_[static_cast<size_t>(l)];
    const auto n = static_cast<uint64_t>(layout_.chunk(owned_[static_cast<size_t>(l)]).count);
    reply.chunk_ids.push_back(static_cast<uint32_t>(owned_[static_cast<size_t>(l)]));
    reply.versions.push_back(st.version);
    reply.iters.push_back(st.iter);
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
  if (region == nullptr) job->payload.resize(p.locals.size());
  // Lanes with nothing to do: the loop reads the chunks itself and answers now, without a
  // hand-off and a wake (a pull between pushes, an evaluator's snapshot).
  if (std::all_of(p.locals.begin(), p.locals.end(), [&](int l) { return lanes_->Idle(lanes_->LaneOf(l)); })) {
    for (size_t i = 0; i < p.locals.size(); ++i) {
      ReadForPull(p.locals[i], reply.dtype, region.get(), region == nullptr ? &job->payload[i] : nullptr);
    }
    Reply(ep, job->peer, job->reply, std::move(job->payload), job->order);
    return;
  }
  job->remaining.store(static_cast<int>(p.locals.size()), std::memory_order_relaxed);
  for (size_t i = 0; i < p.locals.size(); ++i) {
    const int l = p.locals[i];
    lanes_->Post(l, 0, [this, job, i, l, region, dtype = reply.dtype] {
      ReadForPull(l, dtype, region.get(), region == nullptr ? &job->payload[i] : nullptr);
      if (job->remaining.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        {
          std::lock_guard<std::mutex> lock(done_mu_);
          done_pulls_.push_back(job);
        }
        CallWake();
      }
    });
  }
}

void ShardServer::ReadForPull(int local, DType dtype, SharedRegion* region, Frame* out) {
  const std::shared_ptr<WeightBuffer>& buf = chunks_[static_cast<size_t>(local)].weights;
  if (region != nullptr) {  // the pull area follows the push area
    auto* area = reinterpret_cast<float*>(region->payload()) + share_.floats;
    const int32_t id = owned_[static_cast<size_t>(local)];
    std::memcpy(area + share_.offset[static_cast<size_t>(id)], buf->data.data(), buf->data.size() * sizeof(float));
    return;
  }
  if (dtype != DType::kF32) {
    *out = ConvertedWeights(buf->data, dtype, pull_scratch_[static_cast<size_t>(lanes_->LaneOf(local))].get());
    return;
  }
  buf->readers.fetch_add(1, std::memory_order_relaxed);
  std::shared_ptr<const void> keep(buf->data.data(), [buf](const void*) {
    buf->readers.fetch_sub(1, std::memory_order_release);
  });
  *out = Frame::Borrow(buf->data.data(), buf->data.size() * sizeof(float), std::move(keep));  // zero-copy, COW
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
    Status s = LogRecord(&r);
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
  if (changed) MaybeCheckpoint();
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
  s.sgd_ns = apply_ns_.load(std::memory_order_relaxed);
  if (log_->open()) s.wal_sync_cpu_ns = log_->sync_cpu_ns();
  return s;
}

ShardStatsWire ShardServer::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return StatsLocked();
}

std::vector<float> ShardServer::ChunkWeights(int32_t chunk) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (chunk < 0 || chunk >= layout_.num_chunks() || local_of_[static_cast<size_t>(chunk)] < 0) return {};
  const ChunkState& st = chunks_[static_cast<size_t>(local_of_[static_cast<size_t>(chunk)])];
  if (!st.initialized) return {};
  lanes_->Drain();
  return st.weights->data;
}

std::vector<float> ShardServer::ChunkHistory(int32_t chunk) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (chunk < 0 || chunk >= layout_.num_chunks() || local_of_[static_cast<size_t>(chunk)] < 0) return {};
  lanes_->Drain();
  return chunks_[static_cast<size_t>(local_of_[static_cast<size_t>(chunk)])].history;
}

std::vector<float> ShardServer::ChunkDcMeanSquare(int32_t chunk) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (chunk < 0 || chunk >= layout_.num_chunks() || local_of_[static_cast<size_t>(chunk)] < 0 || dc_ == nullptr ||
      !dc_->adaptive()) {
    return {};
  }
  return dc_->mean_square(local_of_[static_cast<size_t>(chunk)]);
}

int64_t ShardServer::ChunkVersion(int32_t chunk) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (chunk < 0 || chunk >= layout_.num_chunks() || local_of_[static_cast<size_t>(chunk)] < 0) return -1;
  return chunks_[static_cast<size_t>(local_of_[static_cast<size_t>(chunk)])].version;
}

int64_t ShardServer::ChunkScheduleIter(int32_t chunk) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (chunk < 0 || chunk >= layout_.num_chunks() || local_of_[static_cast<size_t>(chunk)] < 0) return -1;
  return chunks_[static_cast<size_t>(local_of_[static_cast<size_t>(chunk)])].iter;
}

uint64_t ShardServer::log_seq() const {
  std::lock_guard<std::mutex> lock(mu_);
  return wal_seq_;
}

int64_t ShardServer::updates() const {
  std::lock_guard<std::mutex> lock(mu_);
  return updates_;
}

// ---------------------------------------------------------------------------------------------
// Checkpoints.

void ShardServer::MaybeCheckpoint() {
  if (replaying_) return;  // replay rebuilds; the next live update may checkpoint
  if (log_->open() && !options_.checkpoint_path.empty() && log_->bytes() >= WalMaxBytes(options_.checkpoint)) {
    // The log's bound (checkpoint.wal_max_mb): a checkpoint covers it all and empties it.
    Status s = SaveCheckpointLocked(options_.checkpoint_path);
    if (!s.ok()) spdlog::error("shard {}: checkpoint at the log's bound failed: {}", options_.server_id, s.ToString());
    updates_at_last_checkpoint_ = updates_ / static_cast<int64_t>(std::max<size_t>(1, owned_.size()));
    return;
  }
  const int64_t every = options_.checkpoint.every_updates;
  if (every <= 0 || options_.checkpoint_path.empty() || owned_.empty()) return;
  // "Updates of the shard" = chunk updates / owned chunks: one full round of the shard.
  const int64_t rounds = updates_ / static_cast<int64_t>(owned_.size());
  if (rounds - updates_at_last_checkpoint_ < every) return;
  Status s = SaveCheckpointLocked(options_.checkpoint_path);
  if (!s.ok()) spdlog::error("shard {}: periodic checkpoint failed: {}", options_.server_id, s.ToString());
  updates_at_last_checkpoint_ = rounds;
}

Status ShardServer::SaveCheckpoint(const std::string& path) {
  std::lock_guard<std::mutex> lock(mu_);
  return SaveCheckpointLocked(path);
}

Status ShardServer::SaveCheckpointLocked(const std::string& path) {
  lanes_->Drain();  // the weights and rule state with every taken update in them
  ShardCheckpoint c;
  c.server_id = options_.server_id;
  c.server_count = layout_.servers();
  c.layout_hash = layout_.hash();
  c.model_id = options_.model_id;
  c.updates = updates_;
  c.wal_seq = wal_seq_;
  c.has_state = true;
  c.max_workers = max_workers_;
  c.update_rule = std::string(rule_->name());
  c.pushes_by_worker.assign(stats_.pushes_by_worker.begin(), stats_.pushes_by_worker.end());
  c.dedup = duplicates_.Export();
  c.chunks.resize(chunks_.size());
  for (size_t i = 0; i < chunks_.size(); ++i) {
    ShardCheckpoint::Chunk& ch = c.chunks[i];
    ch.id = owned_[i];
    ch.version = chunks_[i].version;
    ch.iter = chunks_[i].iter;
    ch.initialized = chunks_[i].initialized;
    ch.weights = chunks_[i].weights->data;
    ch.history = chunks_[i].history;
    // DC-ASGD-a's λ of every later push depends on it (a chunk no gradient has reached has none).
    if (dc_ != nullptr && dc_->adaptive()) ch.dc_mean_square = dc_->mean_square(static_cast<int>(i));
  }
  TensorFile file = EncodeShardCheckpoint(std::move(c));
  policy_->SaveState(&file);
  DP_RETURN_IF_ERROR(WriteTensorFile(path, file));
  ++stats_.checkpoints_written;
  spdlog::info("shard {}: checkpoint written to {} ({} updates, log seq {})", options_.server_id, path, updates_,
               wal_seq_);
  // The checkpoint (renamed into place and fsynced) covers every record so far: the log starts
  // over. A crash before the restart is safe: replay skips seq <= wal_seq.
  if (log_->open() && path == options_.checkpoint_path) DP_RETURN_IF_ERROR(log_->Restart());
  return Status::Ok();
}

Status ShardServer::LoadCheckpoint(const std::string& path) {
  TensorFile file;
  DP_RETURN_IF_ERROR(ReadTensorFile(path, &file));
  ShardCheckpointExpect expect;
  expect.server_id = options_.server_id;
  expect.layout_hash = layout_.hash();
  expect.model_id = options_.model_id;
  expect.max_workers = max_workers_;
  expect.dc_mean_square = dc_ != nullptr && dc_->adaptive();
  expect.update_rule = std::string(rule_->name());
  for (size_t i = 0; i < chunks_.size(); ++i) {
    expect.chunk_ids.push_back(owned_[i]);
    expect.chunk_elems.push_back(chunks_[i].history.size());
  }
  // Check everything before changing anything.
  ShardCheckpoint c;
  DP_RETURN_IF_ERROR(DecodeShardCheckpoint(file, path, expect, &c));
  std::lock_guard<std::mutex> lock(mu_);
  lanes_->Drain();
  if (c.has_state) DP_RETURN_IF_ERROR(policy_->LoadState(file, *updater_, path));
  for (size_t w = 0; w < c.pushes_by_worker.size(); ++w) {
    stats_.pushes_by_worker[w] = static_cast<uint64_t>(c.pushes_by_worker[w]);
  }
  duplicates_.Import(c.dedup);
  wal_seq_ = c.wal_seq;
  for (size_t i = 0; i < chunks_.size(); ++i) {
    ShardCheckpoint::Chunk& ch = c.chunks[i];
    chunks_[i].weights = std::make_shared<WeightBuffer>(std::move(ch.weights));
    chunks_[i].history = std::move(ch.history);
    chunks_[i].version = ch.version;
    chunks_[i].iter = ch.iter;
    chunks_[i].initialized = ch.initialized;
    if (dc_ != nullptr && dc_->adaptive()) dc_->set_mean_square(static_cast<int>(i), std::move(ch.dc_mean_square));
  }
  updates_ = c.updates;
  updates_at_last_checkpoint_ = owned_.empty() ? 0 : updates_ / static_cast<int64_t>(owned_.size());
  spdlog::info("shard {}: restored from {} ({} updates)", options_.server_id, path, updates_);
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
// Write-ahead log: open, recover, replay.

Status ShardServer::OpenLog() {
  std::lock_guard<std::mutex> lock(mu_);
  if (log_->open() || !log_->configured()) return Status::Ok();
  DP_RETURN_IF_ERROR(log_->CheckRoom());
  return log_->Open(wal_seq_ + 1, /*truncate=*/true);
}

void ShardServer::SetWake(std::function<void()> wake) {
  std::lock_guard<std::mutex> lock(wake_mu_);
  wake_ = std::move(wake);
}

Status ShardServer::Recover(RecoverReport* report) {
  *report = RecoverReport{};
  std::error_code ec;
  if (!options_.checkpoint_path.empty() && std::filesystem::exists(options_.checkpoint_path, ec)) {
    DP_RETURN_IF_ERROR(LoadCheckpoint(options_.checkpoint_path));
    report->checkpoint_loaded = true;
  }
  std::lock_guard<std::mutex> lock(mu_);
  report->checkpoint_updates = updates_;
  report->checkpoint_seq = wal_seq_;
  if (options_.wal_path.empty()) return Status::Ok();
  DP_RETURN_IF_ERROR(log_->CheckRoom());
  const std::string& path = options_.wal_path;
  bool truncate = true;  // nothing after the checkpoint: the log starts over
  if (std::filesystem::exists(path, ec)) {
    WalScanInfo info;
    DP_RETURN_IF_ERROR(ScanWal(path, nullptr, &info));  // the whole log checked before anything applies
    if (info.records > 0 && info.first_seq > wal_seq_ + 1) {
      return Corrupt("{}: byte 0: field seq: the log starts at record {} but the checkpoint {} covers up to {}: "
                     "records {}..{} are missing (wrong checkpoint, or a log from another run)",
                     path, info.first_seq, report->checkpoint_loaded ? options_.checkpoint_path : "(none)", wal_seq_,
                     wal_seq_ + 1, info.first_seq - 1);
    }
    replaying_ = true;
    const uint64_t covered = wal_seq_;
    Status s = ScanWal(path, [&](const WalRecord& r) -> Status {
      if (r.seq <= covered) return Status::Ok();  // in the checkpoint already
      DP_RETURN_IF_ERROR(ReplayRecord(r, path));
      wal_seq_ = r.seq;
      ++report->replayed;
      if (r.kind == WalKind::kPush || r.kind == WalKind::kCodedPush) ++report->replayed_pushes;
      return Status::Ok();
    }, &info);
    replaying_ = false;
    DP_RETURN_IF_ERROR(s);
    stats_.replayed += report->replayed;
    if (info.valid_bytes < info.file_bytes) {  // a torn record, or a direct writer's padding
      DP_RETURN_IF_ERROR(TruncateWal(path, info.valid_bytes));
    }
    if (info.torn) {
      report->torn_tail = true;
      spdlog::warn("server {}: {}: dropped a torn last record at byte {} ({} bytes; it was never acknowledged): {}",
                   options_.server_id, path, info.valid_bytes, info.file_bytes - info.valid_bytes, info.torn_reason);
    }
    truncate = info.records == 0 || info.last_seq <= covered;
    if (!options_.checkpoint_path.empty()) {
      // The log goes on in a new file, never in the old one: a process that still holds the old
      // file open (a server replaced while it was cut off or stopped, which may take a message
      // before it hears it is out) can then write only into a file the run no longer reads. What
      // the old file holds past the checkpoint goes into a new checkpoint first.
      if (!truncate) DP_RETURN_IF_ERROR(SaveCheckpointLocked(options_.checkpoint_path));
      DP_RETURN_IF_ERROR(log_->Retire(info.records > 0 ? info.last_seq : 0));
      return log_->Open(wal_seq_ + 1, /*truncate=*/true);
    }
  }
  return log_->Open(wal_seq_ + 1, truncate);
}

Status ShardServer::Replay(const WalRecord& r, const std::string& path) {
  std::lock_guard<std::mutex> lock(mu_);
  replaying_ = true;
  const Status s = ReplayRecord(r, path);
  replaying_ = false;
  DP_RETURN_IF_ERROR(s);
  wal_seq_ = r.seq;
  ++stats_.replayed;
  return Status::Ok();
}

Status ShardServer::ReplayRecord(const WalRecord& r, const std::string& path) {
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
        const int local = c.chunk_id < local_of_.size() ? local_of_[c.chunk_id] : -1;
        if (local < 0 || layout_.chunk(static_cast<int32_t>(c.chunk_id)).count != static_cast<int64_t>(c.count)) {
          return Corrupt("{}: record seq {}: chunk {} ({} floats) is not a chunk of server {} in this layout", path,
                         r.seq, c.chunk_id, c.count, options_.server_id);
        }
        if (!init && !chunks_[static_cast<size_t>(local)].initialized) {
          return Corrupt("{}: record seq {}: gradient for chunk {} before its weights were initialised", path, r.seq,
                         c.chunk_id);
        }
        chunks.push_back(PushChunk{local, c.data, static_cast<int64_t>(c.count), c.version_from, nullptr});
      }
      if ((r.flags & kWalFlagRaw) != 0 && init) {
        return Corrupt("{}: record seq {}: an init push with raw gradients", path, r.seq);
      }
      // DC-ASGD-a's raw gradients (a server resumed with another algorithm has no mean square
      // to rebuild: the applied gradients alone restore its weights).
      if ((r.flags & kWalFlagRaw) != 0 && dc_ != nullptr && dc_->adaptive()) {
        for (size_t i = 0; i < chunks.size(); ++i) dc_->Replay(chunks[i].local, r.chunks[i].raw, chunks[i].count);
      }
      ApplyPush(r.worker, r.session, r.request_id, r.clock, r.flags & ~kWalFlagRaw, chunks);
      return Status::Ok();
    }
    case WalKind::kCodedPush:
      return ReplayCodedPush(r, path);
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
  return [this](int local) {
    const ChunkState& c = chunks_[static_cast<size_t>(local)];
    return ChunkFacts{c.initialized, c.version};
  };
}

// A coded push record: formed and decoded by the live path's code, checked as the live push was
// (against the state replay has rebuilt, which is the state it met), then applied.
Status ShardServer::ReplayCodedPush(const WalRecord& r, const std::string& path) {
  MessageHeader h = r.header;
  Frames frames = r.frames;
  std::vector<bool> finite;
  RejectReason reason = RejectReason::kUndecodable;
  Status s = DensifyPush(nullptr, &h, &frames, &finite, &reason);
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
