// ps_client.cc — see ps_client.h. One I/O thread per connection (a LinkRunner; a server has
// connections_per_server, chunk c on its connection c % n) keeps that connection's operations
// in flight together, in call order: it sends their parts within a byte window,
// matches replies to parts, probes a silent server, registers again and resends after a restart
// or an address move.
#include "client/ps/ps_client.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include <spdlog/spdlog.h>

#include "client/ps/delivery.h"
#include "client/ps/push_encoding.h"
#include "client/ps/send_queue.h"
#include "client/ps/shm_path.h"
#include "common/grad_codec.h"
#include "common/random_id.h"

namespace downpour {

namespace {

// A server's error as the client reports it: "server i: <text>", once (the text may name it).
std::string ServerSaid(int server, const std::string& text) {
  const std::string prefix = fmt::format("server {}: ", server);
  return text.rfind(prefix, 0) == 0 ? text : prefix + text;
}

// One Pull/Push/control call. Done when every per-server op has its reply and the transport
// has released every borrowed payload frame.
struct Request {
  std::mutex mu;
  std::condition_variable cv;
  int pending_ops = 0;
  int pending_buffers = 0;
  Status status;
  MessageHeader reply;  // the last reply (control calls read it)
  // Push: each applied chunk's staleness as its server measured it (the acks' staleness lists,
  // entries of -1, a chunk taken but not applied, left out), for Wait(id, timeout, &staleness).
  std::vector<int64_t> staleness;

  void Fail(const Status& s) {
    if (status.ok()) status = s;
  }
};

void FinishOp(Request& r, const Status& s, MessageHeader* reply) {
  {
    std::lock_guard<std::mutex> lock(r.mu);
    if (!s.ok()) r.Fail(s);
    if (reply) r.reply = std::move(*reply);
    --r.pending_ops;
  }
  r.cv.notify_all();
}

template <typename T>
std::vector<T> Pick(const std::vector<T>& v, const std::vector<size_t>& positions) {
  std::vector<T> out;
  if (v.empty()) return out;
  for (size_t i : positions) out.push_back(v[i]);
  return out;
}

struct Op {
  std::shared_ptr<Request> request;
  RequestId id = 0;
  MessageHeader header;
  Frames payload;
  std::span<float> pull_out;  // pull: the caller's flat buffer
  std::span<uint16_t> pull_out16;  // pull16: the caller's flat 16-bit buffer (pull_out empty)
  bool cast = false;          // push: the payload is the push codec's 16-bit values already
  // Push with sufficient factors (ArrangeFactorOps): the first chunks of `header` form groups,
  // each sent as one message — chunks [previous group's end, end) of one tensor, their payload
  // frames δ column blocks, then that group's activations frame.
  struct FactorGroup {
    size_t end = 0;
    uint32_t batch = 0;
    Frame activations;
  };
  std::vector<FactorGroup> factor_groups;
};

// Sufficient factors (ps_client.h PushChunks): reorders each per-server op so that the chunks of
// each factored tensor come first, grouped by tensor (one message per group, Split), with each
// chunk's frame replaced by its block of the packed δ (batch × rows, common/layout.h
// FactorRowBlocks) and the group's activations a (batch × in), both borrowed under the dense
// frames' keepalive from `flat`, or from `cast` for an op whose chunks the worker's device cast
// (Op::cast): nothing is copied. The other chunks follow, unchanged.
Status ArrangeFactorOps(const ParamLayout& layout, std::span<const float> flat, std::span<const uint16_t> cast,
                        std::span<const FactorTensor> factors, bool checksums, std::vector<Op>* ops) {
  // Per factored tensor: its batch, where each of its chunks' blocks starts in its packed δ (by
  // chunk id − first_chunk: a tensor's chunk ids are consecutive, ascending with the flat offset,
  // as FactorRowBlocks lists them), and where a starts after the blocks.
  struct Packing {
    int64_t batch = 0;  // 0: not factored
    int32_t first_chunk = 0;
    std::vector<int64_t> block_at;
    int64_t a_at = 0;
  };
  std::vector<Packing> packing(layout.tensors().size());
  for (const FactorTensor& f : factors) {
    if (f.tensor < 0 || f.tensor >= static_cast<int>(layout.tensors().size()))
      return InvalidArgument("ps client push: factored tensor index {} outside 0..{}", f.tensor,
                             layout.tensors().size() - 1);
    const TensorSpec& t = layout.tensors()[static_cast<size_t>(f.tensor)];
    const int64_t out = t.shape.empty() ? 0 : t.shape[0], in = out > 0 ? t.numel() / out : 0;
    const std::vector<RowSpan> blocks = t.shape.size() < 2 ? std::vector<RowSpan>{} : FactorRowBlocks(layout, f.tensor);
    const int64_t rows = PackedRows(blocks);
    if (t.shape.size() < 2 || f.batch < 1 || f.batch > 65536 || int64_t{f.batch} * (rows + in) > t.numel())
      return InvalidArgument(
          "ps client push: tensor '{}' (rank {}, {} floats) cannot hold sufficient factors of "
          "batch {} (needs rank >= 2, batch 1..65536, batch × (packed rows {} + in {}) <= {})",
          t.name, t.shape.size(), t.numel(), f.batch, rows, in, t.numel());
    Packing& p = packing[static_cast<size_t>(f.tensor)];
    p = Packing{};  // a tensor listed twice: its last entry counts
    p.batch = f.batch;
    const int64_t begin = layout.tensor_flat_offset(f.tensor);
    p.first_chunk = layout.ChunksInRange(begin, begin + 1).front();
    for (const RowSpan& b : blocks) {
      p.block_at.push_back(p.a_at);
      p.a_at += f.batch * b.rows;
    }
  }
  for (Op& op : *ops) {
    MessageHeader& h = op.header;
    std::map<int32_t, std::vector<size_t>> by_tensor;  // factored tensor → positions in op
    std::vector<size_t> dense;
    for (size_t i = 0; i < h.chunk_ids.size(); ++i) {
      const int32_t t = layout.chunk(static_cast<int32_t>(h.chunk_ids[i])).tensor;
      (packing[static_cast<size_t>(t)].batch > 0 ? by_tensor[t] : dense).push_back(i);
    }
    if (by_tensor.empty()) continue;
    std::vector<size_t> order;
    Frames payload;
    std::vector<uint32_t> crcs;
    for (const auto& [t, idx] : by_tensor) {
      const Packing& p = packing[static_cast<size_t>(t)];
      const TensorSpec& spec = layout.tensors()[static_cast<size_t>(t)];
      const int64_t batch = p.batch, in = spec.numel() / spec.shape[0];
      // [δ packed | a (batch × in)] from the tensor's start, in f32 or as the device cast them.
      const size_t at = static_cast<size_t>(layout.tensor_flat_offset(t)),
                   value = op.cast ? sizeof(uint16_t) : sizeof(float);
      const auto* base = op.cast ? static_cast<const std::byte*>(static_cast<const void*>(cast.data() + at))
                                 : static_cast<const std::byte*>(static_cast<const void*>(flat.data() + at));
      for (size_t i : idx) {
        const Chunk& c = layout.chunk(static_cast<int32_t>(h.chunk_ids[i]));
        const std::byte* block = base + p.block_at[static_cast<size_t>(c.id - p.first_chunk)] * value;
        const size_t bytes = static_cast<size_t>(batch * RowsOf(c, in).rows) * value;
        if (checksums) crcs.push_back(0);  // over the bytes sent: EncodeFactorPart, at the first send
        payload.push_back(Frame::Borrow(block, bytes, op.payload[i].owner()));
        order.push_back(i);
      }
      op.factor_groups.push_back(Op::FactorGroup{
          order.size(), static_cast<uint32_t>(batch),
          Frame::Borrow(base + p.a_at * value, static_cast<size_t>(batch * in) * value, op.payload[idx[0]].owner())});
    }
    for (size_t i : dense) {
      payload.push_back(std::move(op.payload[i]));
      if (checksums) crcs.push_back(h.checksums[i]);
      order.push_back(i);
    }
    h.chunk_ids = Pick(h.chunk_ids, order);
    h.versions = Pick(h.versions, order);
    h.elem_counts = Pick(h.elem_counts, order);
    h.checksums = std::move(crcs);
    h.byte_lengths.clear();
    for (const Frame& f : payload) h.byte_lengths.push_back(f.size());
    op.payload = std::move(payload);
  }
  return Status::Ok();
}

}  // namespace

struct PsClient::Impl {
  struct Link {
    int server = 0;
    int connection = 0;  // which of the server's connections_per_server
    std::unique_ptr<ClientEndpoint> endpoint;  // I/O thread (after Create)
    std::string address;                       // I/O thread: where `endpoint` connects
    std::mutex mu;
    std::condition_variable cv;
    std::deque<Op> queue;
    bool stopping = false;
    std::string new_address;  // guarded by mu: SetServerAddress's request, "" = none
    // I/O thread only: this link registered once (a later "not registered" refusal means the
    // server restarted); the endpoint moved, so register before the next operation; the
    // server's incarnation (0 = unknown) and a few earlier ones (late replies of a previous
    // process are not a new restart).
    bool registered = false;
    bool needs_register = false;
    IncarnationTracker incarnation;
    std::atomic<uint64_t> acked_pushes{0};
    std::atomic<uint64_t> resent_parts{0};
    std::atomic<uint64_t> restarts_seen{0};
    std::atomic<uint64_t> taken_requests{0};
    // Same-host payloads (client/ps/shm_path.h), through the region the server offered at the
    // last register; made in Create.
    std::unique_ptr<ShmPath> shm;
    bool said_no_region = false;
    // Lossy gradient pushes (I/O thread only): the encoder and its per-chunk residuals for this
    // server's chunks; null with compression.push fp32.
    std::unique_ptr<ChunkEncoder> encoder;
    std::thread thread;
  };
  PsClient* owner = nullptr;
  Transport* transport = nullptr;
  std::vector<std::unique_ptr<Link>> links;  // server s's connection j at s × per_server + j
  int per_server = 1;                        // connections per server
  // Server `server`'s connection `j` in `links`; chunk `c` (of that server) travels on connection
  // c % per_server.
  size_t LinkIndex(int server, int j) const { return static_cast<size_t>(server * per_server + j); }
  size_t ChunkLinkIndex(int server, int32_t c) const { return LinkIndex(server, c % per_server); }
  Link& LinkOf(int server, int32_t c) { return *links[ChunkLinkIndex(server, c)]; }
  // Abort: every operation in flight and every later one fails with abort_status.
  std::atomic<bool> aborted{false};
  std::mutex abort_mu;  // guards abort_status
  Status abort_status;
  std::mutex mu;  // guards requests, next_id
  std::map<RequestId, std::shared_ptr<Request>> requests;
  RequestId next_id = 1;

  void Enqueue(Link& link, Op op) {
    {
      std::lock_guard<std::mutex> lock(link.mu);
      link.queue.push_back(std::move(op));
    }
    link.cv.notify_one();
  }
  void RunLink(Link& link);
  class LinkRunner;
  // Takes a pending SetServerAddress request (I/O thread): connects the new endpoint. True if
  // the link moved.
  bool MoveLink(Link& link);
  Status AcceptPullReply(const Link& link, const Op& op, const std::vector<uint32_t>& expected,
                         const MessageHeader& h, const Frames& frames);
  // A register reply: maps the region it offers (or drops the link's old one).
  void AdoptRegion(Link& link, const MessageHeader& reply);
};

PsClient::PsClient(const ParamLayout& layout, PsClientOptions options)
    : layout_(layout), options_(std::move(options)),
      versions_(static_cast<size_t>(layout.num_chunks()), -1),
      iters_(static_cast<size_t>(layout.num_chunks()), -1),
      impl_(std::make_unique<Impl>()) {
  impl_->owner = this;
  // A random session, so (worker, session, request id) names one push even across a restart of
  // this worker (request ids start at 1 again).
  session_ = RandomId();
}

Status PsClient::Create(Transport* transport, const ParamLayout& layout, PsClientOptions options,
                        std::unique_ptr<PsClient>* out) {
  if (static_cast<int>(options.server_addresses.size()) != layout.servers()) {
    return InvalidArgument("ps client: {} server addresses given, layout has {} servers",
                           options.server_addresses.size(), layout.servers());
  }
  if (options.max_inflight_bytes == 0) return InvalidArgument("ps client: max_inflight_bytes must be > 0");
  const CompressionConfig& co = options.compression;
  if (static_cast<size_t>(co.pull) >= kDenseWireCodecs) {
    return InvalidArgument("ps client: compression.pull {} is not one of fp32|fp16|bf16", WireCodecName(co.pull));
  }
  if (!(co.top_k_fraction > 0 && co.top_k_fraction <= 1)) {
    return InvalidArgument("ps client: compression.top_k_fraction {} is outside (0, 1]", co.top_k_fraction);
  }
  if (options.connections_per_server < 1 || options.connections_per_server > kMaxConnectionsPerServer) {
    return InvalidArgument("ps client: connections_per_server {} is outside 1..{}", options.connections_per_server,
                           kMaxConnectionsPerServer);
  }
  std::unique_ptr<PsClient> c(new PsClient(layout, std::move(options)));
  c->impl_->transport = transport;
  c->impl_->per_server = c->options_.shared_memory ? 1 : c->options_.connections_per_server;
  for (int at = 0; at < layout.servers() * c->impl_->per_server; ++at) {
    const int s = at / c->impl_->per_server;
    auto link = std::make_unique<Impl::Link>();
    link->server = s;
    link->connection = at % c->impl_->per_server;
    link->address = c->options_.server_addresses[static_cast<size_t>(s)];
    link->shm = std::make_unique<ShmPath>(c->layout_, s, c->options_.shared_memory);
    if (IsLossy(c->options_.compression.push)) link->encoder = std::make_unique<ChunkEncoder>(c->options_.compression);
    DP_RETURN_IF_ERROR(transport->Connect(link->address, &link->endpoint));
    c->impl_->links.push_back(std::move(link));
  }
  for (auto& link : c->impl_->links) {
    Impl::Link* l = link.get();
    l->thread = std::thread([impl = c->impl_.get(), l] { impl->RunLink(*l); });
  }
  *out = std::move(c);
  return Status::Ok();
}

PsClient::~PsClient() {
  for (auto& link : impl_->links) {
    {
      std::lock_guard<std::mutex> lock(link->mu);
      link->stopping = true;
    }
    link->cv.notify_all();
  }
  for (auto& link : impl_->links) {
    if (link->thread.joinable()) link->thread.join();
  }
}

namespace {

// Part k of a request travels with request id (id << 16) | k, so replies are matched to the
// part they answer. Id 0 is the link's own traffic: registers after a restart (sub = their
// sequence number) and probes (kProbeSub).
constexpr int kSubBits = 16;
constexpr uint64_t kSubMask = (uint64_t{1} << kSubBits) - 1;
constexpr uint64_t kProbeSub = kSubMask;
constexpr uint64_t kMaxRegisterSub = kSubMask - 1;
// Operations a link takes from its queue at once (the byte window bounds what is on the wire).
constexpr size_t kMaxActiveOps = 256;
// A server that forgets this client again and again with no operation completing in between is
// not restarting, it is broken (or refuses this worker): fail rather than loop.
constexpr int kMaxRecoveries = 16;
// A staleness an ack may report (versions behind): beyond any real run (kMaxClock), so a forged value
// cannot skew the worker's mean.
constexpr int64_t kMaxReportedStaleness = int64_t{1} << 40;

template <typename T>
std::vector<T> Slice(const std::vector<T>& v, size_t begin, size_t end) {
  if (v.empty()) return {};
  return std::vector<T>(v.begin() + static_cast<std::ptrdiff_t>(begin), v.begin() + static_cast<std::ptrdiff_t>(end));
}

bool Transient(const Status& s) { return s.code() == StatusCode::kUnavailable || s.code() == StatusCode::kTimeout; }

double Seconds(std::chrono::steady_clock::duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

// The I/O thread of one link. It takes operations from the link's queue, cuts each into parts
// (messages of at most max_chunks_per_message chunks) and keeps many parts of many operations
// in flight at once on the one ordered connection, in call order (or by layer, send_order), and
// a chunk's own parts always in call order: a pull issued after a push leaves after it (the
// server answers it after applying the push), while the push's acks and the pull's weights
// travel at the same time. Replies are matched to their part by request id; an operation is done
// when every part is answered. What is on the wire is bounded by max_inflight_bytes each way:
// payload sent and unanswered (the egress a lower layer cannot overtake once handed over), and
// apart, payload asked for by pulls and not received (the server's reply queue for this worker).
//
// A silent server is probed; a restarted or moved one gets a fresh register and every
// unanswered part again (see ps_client.h).
class PsClient::Impl::LinkRunner {
 public:
  using Clock = std::chrono::steady_clock;

  LinkRunner(Impl& impl, Link& link)
      : impl_(impl),
        link_(link),
        o_(impl.owner->options_),
        per_(static_cast<uint64_t>(impl.per_server)),
        trace_track_(o_.trace != nullptr && o_.trace->on() ? o_.trace->Thread(TrackName(link)) : -1) {}

  static std::string TrackName(const Link& link) {
    if (link.connection == 0) return fmt::format("to server {}", link.server);
    return fmt::format("to server {} #{}", link.server, link.connection);
  }

  void Run() {
    while (true) {
      if (!Admit()) return;  // stopping
      if (active_.empty() && !registering_) continue;  // Admit waited and found only a move
      if (impl_.MoveLink(link_)) {
        heard_ = Clock::now();  // a fresh server_wait for the new address
        Check(Recover(fmt::format("moved to {}", link_.address), true));
      }
      Check(CheckDeadlines());
      const auto now = Clock::now();
      if (now - heard_ >= o_.probe_every && now - probed_ >= o_.probe_every) {
        Probe();
        Check(SendPending());  // sends that failed while the server was away
      } else {
        Check(SendPending());
      }
      Frames got;
      // Short: new operations are taken from the queue between receives.
      Status s = link_.endpoint->Receive(&got, active_.empty() ? tick_ : std::min(tick_, kBusyTick));
      if (s.code() == StatusCode::kTimeout) continue;
      if (s.ok()) s = HandleReply(got);
      Check(s);
    }
  }

 private:
  static constexpr std::chrono::milliseconds kBusyTick{1};

  struct Part {
    MessageHeader header;  // encoded at each send
    Frames payload;        // push: borrowed caller bytes, kept until the operation ends (resends)
    uint64_t bytes = 0;    // payload bytes sent (push) or asked for (pull)
    enum class State { kToSend, kSent, kDone } state = State::kToSend;
    bool sent_once = false;
    bool encoded = false;       // a lossy or factor push part: payload holds its encoded bytes (resends)
    bool via_region = false;    // the last send went through the shared region
    Clock::time_point sent_at;  // the last send
    LogRefusals refusals;  // by the server's write-ahead log (RetryRefusedByLog; delivery.h)
  };
  struct Active {
    Op op;
    std::vector<Part> parts;
    size_t open = 0;  // parts not answered yet
    Status first_error;
    MessageHeader last_reply;
    std::vector<int64_t> staleness;    // push: from the acks of its parts
    Clock::time_point reply_deadline;  // the last (re)send of a part + reply_timeout
  };

  // An error no operation can outlive (a transport failure, an undecodable reply, a server that
  // keeps forgetting us): every active operation fails with it.
  void Check(const Status& s) {
    if (s.ok()) return;
    FailAll(s);
  }

  void FailAll(const Status& s) {
    for (auto& [id, a] : active_) Complete(a, s);
    active_.clear();
    queue_->Clear();
    window_.Clear();
    pull_window_.Clear();
    if (registering_) link_.needs_register = link_.registered;
    registering_ = register_unsent_ = false;
    register_refusals_ = {};
  }

  void Complete(Active& a, const Status& s) {
    a.parts.clear();  // drop our references to borrowed buffers before finishing
    a.op.payload.clear();
    if (!a.staleness.empty()) {
      std::lock_guard<std::mutex> lock(a.op.request->mu);
      a.op.request->staleness.insert(a.op.request->staleness.end(), a.staleness.begin(), a.staleness.end());
    }
    FinishOp(*a.op.request, s.ok() ? a.first_error : s, s.ok() && a.first_error.ok() ? &a.last_reply : nullptr);
  }

  // Takes queued operations (up to kMaxActiveOps active). With nothing active, waits for the
  // queue, an address move or stop. False when stopping (everything failed).
  bool Admit() {
    std::unique_lock<std::mutex> lock(link_.mu);
    if (active_.empty() && !registering_) {
      link_.cv.wait(lock, [&] { return link_.stopping || !link_.queue.empty() || !link_.new_address.empty(); });
    }
    if (link_.stopping) {
      for (Op& q : link_.queue) FinishOp(*q.request, Unavailable("ps client destroyed before the request ran"), nullptr);
      link_.queue.clear();
      lock.unlock();
      FailAll(Unavailable("ps client destroyed while waiting for a reply"));
      return false;
    }
    if (active_.empty() && link_.queue.empty()) {  // moved while idle: register with the next operation
      lock.unlock();
      if (impl_.MoveLink(link_)) link_.needs_register = link_.registered;
      return true;
    }
    while (!link_.queue.empty() && active_.size() < kMaxActiveOps) {
      Op op = std::move(link_.queue.front());
      link_.queue.pop_front();
      link_.taken_requests.fetch_add(1);
      if (active_.empty() && !registering_) Fresh();
      const bool is_register = op.header.type == MsgType::kRegister;
      Active a;
      a.op = std::move(op);
      const Status s = Split(a);
      if (!s.ok()) {
        Complete(a, s);
        continue;
      }
      const auto now = Clock::now();
      a.reply_deadline = now + o_.reply_timeout;
      const RequestId id = a.op.id;
      Queue(a, now);
      active_.emplace(id, std::move(a));
      if (link_.needs_register && link_.registered && !is_register && !registering_) BeginRegister();
    }
    return true;
  }

  // The first operation after an idle spell starts a fresh wait.
  void Fresh() {
    const auto now = Clock::now();
    heard_ = probed_ = now;
    heard_any_ = false;
    said_waiting_ = false;
    recoveries_ = 0;
  }

  // Splits an operation into messages of at most max_chunks_per_message chunks: the server
  // validates and applies part k while part k+1 is still on the wire, and pull replies are
  // copied out as they arrive.
  Status Split(Active& a) {
    const MessageHeader& base = a.op.header;
    const size_t n = base.chunk_ids.size();
    const size_t per = o_.max_chunks_per_message > 0 ? static_cast<size_t>(o_.max_chunks_per_message)
                                                     : std::max<size_t>(n, 1);
    // Chunk ranges [b, e) per message: each group of sufficient factors whole (its chunks share
    // the activations frame), then the rest `per` at a time.
    std::vector<std::pair<size_t, size_t>> ranges;
    size_t start = 0;
    for (const Op::FactorGroup& g : a.op.factor_groups) {
      ranges.emplace_back(start, g.end);
      start = g.end;
    }
    for (size_t b = start; b < n; b += per) ranges.emplace_back(b, std::min(n, b + per));
    if (ranges.empty()) ranges.emplace_back(0, 0);
    const size_t parts = ranges.size();
    if (parts * per_ >= kSubMask) return InvalidArgument("ps client: {} sub-messages is too many", parts);
    const ParamLayout& layout = impl_.owner->layout_;
    a.parts.resize(parts);
    for (size_t k = 0; k < parts; ++k) {
      const auto [b, e] = ranges[k];
      Part& p = a.parts[k];
      MessageHeader& h = p.header;
      h = base;
      // A request's parts to one server are numbered across its connections, so that no two
      // carry the same request id (the server takes a repeated id as a resend: sessions.h).
      h.request_id = (a.op.id << kSubBits) | (k * per_ + static_cast<uint64_t>(link_.connection));
      h.chunk_ids = Slice(base.chunk_ids, b, e);
      h.versions = Slice(base.versions, b, e);
      h.elem_counts = Slice(base.elem_counts, b, e);
      h.byte_lengths = Slice(base.byte_lengths, b, e);
      h.checksums = Slice(base.checksums, b, e);
      if (!a.op.payload.empty()) {
        for (size_t i = b; i < e; ++i) p.payload.push_back(std::move(a.op.payload[i]));
      }
      if (k < a.op.factor_groups.size()) {
        Op::FactorGroup& g = a.op.factor_groups[k];
        h.encodings.assign(e - b, Encoding::kFactors);
        h.factor_batch = g.batch;
        h.encoding = Encoding::kDense;
        h.dtype = DType::kF32;  // until EncodeFactorPart, at the first send
        p.payload.push_back(std::move(g.activations));
        for (const Frame& f : p.payload) p.bytes += f.size();
        continue;
      }
      p.encoded = a.op.cast;  // cast by the worker's device: sent as they are
      // f32 (a push before it is encoded) or the dtype a pull asks for.
      for (uint32_t c : h.chunk_ids) {
        p.bytes += static_cast<uint64_t>(layout.chunk(static_cast<int32_t>(c)).count) * DTypeSize(h.dtype);
      }
    }
    a.op.payload.clear();
    a.op.factor_groups.clear();
    a.open = parts;
    return Status::Ok();
  }

  std::string What(const Active& a) const {
    return fmt::format("{} (request {})", MsgTypeName(a.op.header.type), a.op.id);
  }

  size_t OpenParts() const {
    size_t n = 0;
    for (const auto& [id, a] : active_) n += a.open;
    return n;
  }

  // server_wait bounds silence (every active operation fails); reply_timeout bounds a server
  // that answers but holds an operation (that operation fails).
  Status CheckDeadlines() {
    if (impl_.aborted.load()) {
      std::lock_guard<std::mutex> lock(impl_.abort_mu);
      return impl_.abort_status;
    }
    const auto now = Clock::now();
    const auto silent = now - heard_;
    if (silent >= o_.server_wait) {
      return Unavailable(
          "server {} at {}: unreachable for {:.1f} s (no reply, no answer to probes; cluster.server_wait_ms = {}): "
          "{} parts of {} operation(s) unanswered",
          link_.server, link_.address, Seconds(silent), o_.server_wait.count(), OpenParts(), active_.size());
    }
    // Reachable: it answered something recently (probes, when it holds a request). A server
    // never heard from is waited for under server_wait.
    const bool reachable = heard_any_ && silent < 2 * o_.probe_every;
    if (reachable) {
      for (auto it = active_.begin(); it != active_.end();) {
        Active& a = it->second;
        if (now < a.reply_deadline) {
          ++it;
          continue;
        }
        const Status t = Timeout("server {}: no reply to {} ({} of {} parts outstanding) within {} ms", link_.server,
                                 What(a), a.open, a.parts.size(), o_.reply_timeout.count());
        for (Part& p : a.parts) Release(p);
        Complete(a, t);
        queue_->Remove(it->first);
        it = active_.erase(it);
      }
    }
    if (silent >= 2 * o_.probe_every) {
      if (!said_waiting_ || now - said_at_ >= 5 * o_.probe_every) {
        if (!said_waiting_) waiting_since_ = heard_;
        said_waiting_ = true;
        said_at_ = now;
        spdlog::info("worker {}: server {} unreachable for {:.1f} s (no reply, no answer to probes); waiting up to "
                     "cluster.server_wait_ms = {}",
                     o_.worker_id, link_.server, Seconds(silent), o_.server_wait.count());
      }
    }
    return Status::Ok();
  }

  MessageHeader OwnHeader(MsgType type, uint64_t sub) const {
    MessageHeader h;
    h.type = type;
    h.request_id = sub;  // operation id 0: the link's own
    h.sender = o_.worker_id;
    h.model_id = o_.model_id;
    h.layout_hash = impl_.owner->layout_.hash();
    h.role = o_.role;
    h.session = impl_.owner->session_;
    return h;
  }

  // A heartbeat to the server: its answer tells alive (same incarnation) from restarted.
  void Probe() {
    probed_ = Clock::now();
    Frames frames(1);
    if (!HeaderFrame(OwnHeader(MsgType::kHeartbeat, kProbeSub), &frames[0]).ok()) return;
    (void)link_.endpoint->Send(std::move(frames));  // a failed probe is silence, counted by heard_
  }

  void BeginRegister() {
    registering_ = true;
    register_unsent_ = true;
    register_refusals_ = {};
  }

  // Part `p` of `a` is to be sent again (a failed send, a restart, a refusal by the log): off the
  // wire, and back in the send queue (after the log's backoff, if it refused it).
  void SendAgain(Active& a, Part& p) {
    Release(p);
    p.state = Part::State::kToSend;
    queue_->Unsent(a.op.id, PartIndex(a, p), p.refusals.not_before);
  }

  // Which of a's parts `p` is (the send queue names parts by index).
  static size_t PartIndex(const Active& a, const Part& p) { return static_cast<size_t>(&p - a.parts.data()); }

  // An operation admitted at `now`: its parts join the send queue.
  void Queue(const Active& a, Clock::time_point now) {
    const MessageHeader& h = a.op.header;
    SendQueue::Kind kind = SendQueue::Kind::kBarrier;  // control requests, registers, init and move pushes
    if ((h.flags & (kFlagInit | kFlagMove)) == 0) {
      if (h.type == MsgType::kPush) kind = SendQueue::Kind::kPush;
      if (h.type == MsgType::kPull) kind = SendQueue::Kind::kPull;
    }
    std::vector<std::vector<uint32_t>> chunks;
    chunks.reserve(a.parts.size());
    for (const Part& p : a.parts) chunks.push_back(p.header.chunk_ids);
    queue_->Add(a.op.id, kind, h.clock, now, std::move(chunks));
  }

  // A part no longer on the wire (answered, to be resent, or its operation failed).
  void Release(Part& p) {
    if (p.state != Part::State::kSent) return;
    WindowOf(p).Remove(p.bytes);
    if (p.via_region) {
      link_.shm->Release(p.header);
      p.via_region = false;
    }
  }

  // Sends the register (if one is due) and, once registered, the parts marked to send, in
  // operation order and part order, while the byte window allows. A transient failure (no
  // server at the address, a full queue) leaves the rest for the next round; anything else is
  // an error for every active operation.
  Status SendPending() {
    if (register_unsent_) {
      if (Clock::now() < register_refusals_.not_before) return Status::Ok();  // its log refused it: later
      register_sub_ = register_sub_ % kMaxRegisterSub + 1;
      MessageHeader h = OwnHeader(MsgType::kRegister, register_sub_);
      h.token = o_.token;
      if (o_.shared_memory) {
        h.flags |= kFlagShm;
        h.boot_id = HostBootId();
      }
      Frames frames(1);
      DP_RETURN_IF_ERROR(HeaderFrame(h, &frames[0]));
      const Status s = link_.endpoint->Send(std::move(frames));
      if (!s.ok() && !Transient(s)) return SendError("register", s);
      if (!s.ok()) return Status::Ok();
      register_unsent_ = false;
    }
    if (registering_) return Status::Ok();
    const bool by_queue = !link_.shm->on();  // a same-host region keeps call order (shm_path.h)
    while (true) {
      const auto now = Clock::now();
      const std::optional<SendQueue::Pick> pick = by_queue ? queue_->Next(now) : queue_->NextInCallOrder(now);
      if (!pick) return Status::Ok();
      auto it = active_.find(pick->op);
      if (it == active_.end() || pick->part >= it->second.parts.size() ||
          it->second.parts[pick->part].state != Part::State::kToSend) {  // cannot be: the queue follows active_
        return Internal("server {}: the send queue names part {} of request {}, which is not waiting", link_.server,
                        pick->part, pick->op);
      }
      bool stop = false;
      DP_RETURN_IF_ERROR(SendPart(it->second, it->second.parts[pick->part], &stop));
      if (stop) return Status::Ok();
    }
  }

  // Sends part `p` of `a` if the window and the shared region let it go now; `*stop` when it did
  // not (or a transient failure left it unsent): no later part may overtake it this round.
  Status SendPart(Active& a, Part& p, bool* stop) {
    *stop = true;
    if (!WindowOf(p).Fits(p.bytes)) return Status::Ok();  // the window is full
    // A part whose chunks' area still holds an unanswered one waits, and every later part
    // with it, to keep call order (shm_path.h).
    bool wait = false;
    const bool via_region = link_.shm->Usable(p.header, &wait);
    if (wait) return Status::Ok();
    // Once, at the first send (resends reuse the bytes), outside the link's lock: a lossy
    // part's chunks, a part of sufficient factors in its dtype.
    if (!p.encoded && p.header.type == MsgType::kPush && (p.header.flags & (kFlagInit | kFlagMove)) == 0) {
      if (p.header.factor_batch > 0) {
        p.bytes =
            EncodeFactorPart(FactorDType(impl_.owner->options_.compression.push), a.op.cast, &p.header, &p.payload);
        p.encoded = true;
      } else if (link_.encoder) {
        p.bytes = EncodePushPart(*link_.encoder, &p.header, &p.payload);
        p.encoded = true;
      }
    }
    Frames frames;
    frames.reserve(p.payload.size() + 1);
    if (via_region) {
      DP_RETURN_IF_ERROR(link_.shm->Send(p.header, p.payload, &frames));
      p.via_region = true;
    } else {
      frames.emplace_back();
      DP_RETURN_IF_ERROR(HeaderFrame(p.header, &frames[0]));
      for (const Frame& f : p.payload) frames.push_back(f);  // copies Frame handles, not bytes
    }
    p.state = Part::State::kSent;  // on the wire unless the send fails (then SendAgain undoes it)
    queue_->Gone(a.op.id, PartIndex(a, p));
    WindowOf(p).Add(p.bytes);
    const Status s = link_.endpoint->Send(std::move(frames));
    if (!s.ok()) {
      SendAgain(a, p);
      if (!Transient(s)) return SendError(What(a), s);
      return Status::Ok();
    }
    p.sent_at = Clock::now();
    if (p.sent_once) link_.resent_parts.fetch_add(1);
    p.sent_once = true;
    a.reply_deadline = p.sent_at + o_.reply_timeout;
    *stop = false;
    return Status::Ok();
  }

  Status SendError(const std::string& what, const Status& s) const {
    return Status(s.code(), fmt::format("server {}: {} failed: {}", link_.server, what, s.message()));
  }

  // The server restarted (or the link moved): register again, then send every unanswered part.
  // A register operation is itself the part to resend. `new_process`: a register already on its
  // way went to the previous process (or address) and is sent again.
  Status Recover(const std::string& why, bool new_process) {
    size_t resend = 0;
    for (auto& [id, a] : active_) {
      for (Part& p : a.parts) {
        if (p.state == Part::State::kSent) SendAgain(a, p);
        if (p.state == Part::State::kToSend) ++resend;
      }
    }
    if (!link_.registered) return SendPending();  // the register operation itself is resent
    if (!registering_) {
      if (++recoveries_ > kMaxRecoveries) {
        return Unavailable("server {}: forgot this worker {} times while {} operation(s) waited; giving up",
                           link_.server, recoveries_ - 1, active_.size());
      }
      spdlog::info("worker {}: server {} {}: registering again and resending {} part(s) of {} operation(s)",
                   o_.worker_id, link_.server, why, resend, active_.size());
      BeginRegister();
    } else if (new_process) {
      register_unsent_ = true;
    }
    return SendPending();
  }

  Status HandleReply(const Frames& got) {
    MessageHeader h;
    Status s = ParseHeader(got, &h);
    if (!s.ok()) return Status(s.code(), fmt::format("server {}: bad reply: {}", link_.server, s.message()));
    heard_ = back_at_ = Clock::now();
    heard_any_ = true;
    if (said_waiting_) {
      spdlog::info("worker {}: server {} answers again after {:.1f} s", o_.worker_id, link_.server,
                   Seconds(back_at_ - waiting_since_));
      said_waiting_ = false;
    }
    const bool restarted = link_.incarnation.Observe(h.incarnation);
    if (restarted) link_.restarts_seen.fetch_add(1);
    const uint64_t id = h.request_id >> kSubBits;
    const uint64_t sub = h.request_id & kSubMask;
    if (id == 0 && sub == register_sub_ && registering_ && !register_unsent_) {
      if (restarted) return Recover("restarted (new incarnation)", true);
      return HandleRegisterReply(h);
    }
    auto it = active_.find(id);
    // A probe's answer, an older register's, a reply to an operation that already failed (or an
    // error about an undecodable message): it shows the server is there, and may show it restarted.
    if (id == 0 || it == active_.end()) return restarted ? Recover("restarted (new incarnation)", true) : Status::Ok();
    if (restarted) DP_RETURN_IF_ERROR(Recover("restarted (new incarnation)", true));
    Active& a = it->second;
    const uint64_t k = sub / per_;  // the part (numbered across the server's connections)
    if (sub % per_ != static_cast<uint64_t>(link_.connection) || k >= a.parts.size() ||
        a.parts[k].state == Part::State::kDone) {
      return Status::Ok();
    }
    Part& part = a.parts[k];
    if (h.type == MsgType::kError) {
      if (h.flags == static_cast<uint32_t>(RejectReason::kNotRegistered) && link_.registered &&
          a.op.header.type != MsgType::kRegister) {
        // It forgot this connection: a restart (refused parts were not applied).
        SendAgain(a, part);
        if (!registering_ && !restarted) link_.restarts_seen.fetch_add(1);
        return Recover("forgot this worker (restarted)", false);
      }
      Status e = StatusFromReply(h);
      if (h.flags == static_cast<uint32_t>(RejectReason::kLogWrite) && RetryRefusedByLog(a, part, &e)) {
        return SendPending();
      }
      Finish(a, part);
      if (a.first_error.ok()) a.first_error = Status(e.code(), ServerSaid(link_.server, e.message()));
    } else {
      if (part.refusals.count > 0) NoteLogTakes(part.refusals, What(a));  // What() only then: every reply passes here
      Finish(a, part);
      if (o_.on_part_reply) {
        o_.on_part_reply(link_.server, a.op.header.type, part.header.chunk_ids.size(), Seconds(Clock::now() - part.sent_at));
      }
      TracePart(a.op.header.type, part);
      if (a.op.header.type == MsgType::kPull) {
        s = impl_.AcceptPullReply(link_, a.op, part.header.chunk_ids, h, got);
        if (!s.ok() && a.first_error.ok()) a.first_error = s;
      }
      if (a.op.header.type == MsgType::kPush && o_.on_push_acked) {
        o_.on_push_acked(link_.server, impl_.owner->session_, h.request_id);
      }
      if (a.op.header.type == MsgType::kPush && (a.op.header.flags & kFlagInit) == 0) {
        link_.acked_pushes.fetch_add(1);
        for (int64_t v : h.staleness) {  // a server's word: kept only when plausible
          if (v >= 0 && v <= kMaxReportedStaleness) a.staleness.push_back(v);
        }
      }
      if (a.op.header.type == MsgType::kRegister) {
        link_.registered = true;
        link_.needs_register = false;
        impl_.AdoptRegion(link_, h);
      }
      a.last_reply = std::move(h);
    }
    if (a.open == 0) {
      if (a.first_error.ok()) recoveries_ = 0;  // progress: earlier restarts are forgiven
      Complete(a, Status::Ok());
      queue_->Remove(it->first);
      active_.erase(it);
    }
    return SendPending();  // the window has room again
  }

  // The server's write-ahead log could not take `part` (nothing of it was applied): marks it to
  // be sent again after a backoff (50 ms doubling to probe_every) and returns true, or, once the
  // log has refused it for server_wait, returns false with *e saying so (the part then fails).
  bool RetryRefusedByLog(Active& a, Part& part, Status* e) {
    if (!NoteLogRefusal(&part.refusals, What(a), e)) return false;
    SendAgain(a, part);
    return true;
  }

  // Counts a refusal by the server's log of `what` (LogRefusals::Refuse sets when to send it
  // again); false (with the count and time added to *e) once it has been refused for server_wait.
  bool NoteLogRefusal(LogRefusals* r, const std::string& what, Status* e) {
    const auto now = Clock::now();
    if (!r->Refuse(now, o_.probe_every, o_.server_wait)) {
      *e = Status(e->code(),
                  fmt::format("{} (its log refused it {} times over {:.1f} s; cluster.server_wait_ms = {})",
                              e->message(), r->count, Seconds(r->refused_for(now)), o_.server_wait.count()));
      return false;
    }
    if (!log_refused_) {
      log_refused_ = true;
      spdlog::warn(
          "worker {}: server {}'s log refused {} ({}); sending it again for up to {:.1f} s "
          "(cluster.server_wait_ms)",
          o_.worker_id, link_.server, what, e->message(), Seconds(o_.server_wait));
    }
    return true;
  }

  // The one line after a warned refusal, once the log takes the message.
  void NoteLogTakes(const LogRefusals& r, const std::string& what) {
    if (r.count == 0 || !log_refused_) return;
    log_refused_ = false;
    spdlog::info("worker {}: server {}'s log takes {} again, after {:.1f} s", o_.worker_id, link_.server, what,
                 Seconds(Clock::now() - r.since));
  }

  // The reply to a register sent after a restart. A refusal by the server's log (a worker the
  // restarted server counts as dead rejoins, and its return is logged) is sent again like a
  // refused part, for up to server_wait; any other refusal fails every operation.
  Status HandleRegisterReply(const MessageHeader& h) {
    if (h.type == MsgType::kError) {
      Status e = StatusFromReply(h);
      if (h.flags == static_cast<uint32_t>(RejectReason::kLogWrite) &&
          NoteLogRefusal(&register_refusals_, "its register", &e)) {
        register_unsent_ = true;
        // The server answers; its log holds the operations waiting for the register.
        for (auto& [id, a] : active_) a.reply_deadline = std::max(a.reply_deadline, Clock::now() + o_.reply_timeout);
        return Status::Ok();
      }
      if (h.flags == static_cast<uint32_t>(RejectReason::kRemoved)) {  // out of the run: not a restart
        return Status(e.code(), ServerSaid(link_.server, e.message()));
      }
      return Status(e.code(), fmt::format("server {}: registering again after a restart: {}", link_.server,
                                          e.message()));
    }
    NoteLogTakes(register_refusals_, "its register");
    register_refusals_ = {};
    registering_ = false;
    link_.needs_register = false;
    impl_.AdoptRegion(link_, h);
    return SendPending();
  }

  void Finish(Active& a, Part& part) {
    Release(part);
    part.state = Part::State::kDone;
    queue_->Gone(a.op.id, PartIndex(a, part));
    part.payload.clear();  // a borrowed push buffer is released as soon as its part is answered
    --a.open;
  }

  // The timeline's span of an answered part: from its last send to its reply.
  void TracePart(MsgType type, const Part& part) const {
    if (trace_track_ < 0) return;
    const char* name = type == MsgType::kPush ? "push part" : type == MsgType::kPull ? "pull part" : MsgTypeName(type);
    o_.trace->Async(trace_track_, "client", name, 0, part.sent_at, Clock::now(),
                    {{"server", static_cast<double>(link_.server)},
                     {"chunks", static_cast<double>(part.header.chunk_ids.size())},
                     {"bytes", static_cast<double>(part.bytes)}});
  }

  Impl& impl_;
  Link& link_;
  const PsClientOptions& o_;
  const uint64_t per_;  // the server's connections (part numbers interleave over them)
  const int trace_track_;  // -1 = no timeline
  std::map<RequestId, Active> active_;  // by id = call order
  // A pull's bytes come back the other way: its own window, so that pulls waiting for their
  // pushes' apply do not hold the pushes (bench/RESULTS.md §11.5.10).
  ByteWindow& WindowOf(const Part& p) { return p.header.type == MsgType::kPull ? pull_window_ : window_; }
  ByteWindow window_{o_.max_inflight_bytes};       // payload of pushes (and the rest) sent, unanswered
  ByteWindow pull_window_{o_.max_inflight_bytes};  // payload pulls asked for, not received
  // Which unsent part goes next (cluster.send_order); follows active_.
  std::unique_ptr<SendQueue> queue_ =
      SendQueue::Make(o_.send_order, impl_.owner->layout_.num_chunks(), o_.reply_timeout);
  const std::chrono::milliseconds tick_ =
      std::clamp(o_.probe_every / 2, std::chrono::milliseconds(1), std::chrono::milliseconds(200));
  bool registering_ = false;      // a register is due or in flight: parts wait for its reply
  bool register_unsent_ = false;  // ... and it has not gone out yet
  LogRefusals register_refusals_;  // of the register in flight, by the server's log
  uint64_t register_sub_ = 0;     // the sub id of the register in flight
  int recoveries_ = 0;
  bool log_refused_ = false;                // the server's log refuses parts: warned once, until it takes one
  Clock::time_point heard_ = Clock::now();  // the last message from the server (or the start)
  bool heard_any_ = false;                  // ... and whether there was one
  Clock::time_point back_at_;               // when it was heard after a silence
  Clock::time_point probed_ = Clock::now();  // the last probe
  bool said_waiting_ = false;
  Clock::time_point said_at_, waiting_since_;
};

void PsClient::Impl::RunLink(Link& link) {
  LinkRunner runner(*this, link);
  runner.Run();
}

bool PsClient::Impl::MoveLink(Link& link) {
  std::string address;
  {
    std::lock_guard<std::mutex> lock(link.mu);
    address.swap(link.new_address);
  }
  if (address.empty() || address == link.address) return false;
  std::unique_ptr<ClientEndpoint> endpoint;
  const Status s = transport->Connect(address, &endpoint);
  if (!s.ok()) {
    spdlog::error("worker {}: server {} cannot move to {}: {} (staying at {})", owner->options_.worker_id, link.server,
                  address, s.ToString(), link.address);
    return false;
  }
  spdlog::info("worker {}: server {} moves from {} to {}", owner->options_.worker_id, link.server, link.address,
               address);
  link.endpoint = std::move(endpoint);  // replies on the old endpoint are lost: unanswered parts are resent
  link.address = address;
  link.incarnation.Forget();  // whoever answers there first
  link.restarts_seen.fetch_add(1);
  return true;
}

void PsClient::Impl::AdoptRegion(Link& link, const MessageHeader& reply) {
  const std::string none = link.shm->Adopt(reply);
  if (link.shm->on()) {
    spdlog::debug("worker {}: server {}: payloads through shared memory ({})", owner->options_.worker_id, link.server,
                  reply.shm_path);
  } else if (!none.empty() && !link.said_no_region) {
    link.said_no_region = true;
    spdlog::info("worker {}: server {}: no shared memory, payloads over the socket: {}", owner->options_.worker_id,
                 link.server, none);
  }
}

Status PsClient::Impl::AcceptPullReply(const Link& link, const Op& op, const std::vector<uint32_t>& expected,
                                       const MessageHeader& h, const Frames& frames) {
  const ParamLayout& layout = owner->layout_;
  const bool via_region = (h.flags & kFlagShm) != 0;
  if (via_region && !link.shm->on()) return Corrupt("server {}: pull reply in shared memory, but there is no region", link.server);
  const size_t payload_frames = via_region ? 0 : h.chunk_ids.size();
  if (h.type != MsgType::kPullReply || h.chunk_ids != expected ||
      h.versions.size() != h.chunk_ids.size() || frames.size() != payload_frames + 1) {
    return Corrupt("server {}: pull reply of type {} with {} chunks / {} frames does not match the {} requested",
                   link.server, MsgTypeName(h.type), h.chunk_ids.size(), frames.size() - 1, expected.size());
  }
  // atomic_ref: a Push on the caller's thread may read a chunk's version concurrently.
  const auto record_versions = [&] {
    for (size_t i = 0; i < h.chunk_ids.size(); ++i) {
      const auto id = static_cast<size_t>(h.chunk_ids[i]);
      std::atomic_ref<int64_t>(owner->versions_[id]).store(h.versions[i], std::memory_order_relaxed);
      if (!h.iters.empty()) std::atomic_ref<int64_t>(owner->iters_[id]).store(h.iters[i], std::memory_order_relaxed);
    }
  };
  if (via_region) {  // the server wrote the pull area, in f32
    if (op.pull_out16.empty()) {
      link.shm->ReadPull(h, op.pull_out);
    } else {
      link.shm->ReadPull16(h, op.header.dtype, op.pull_out16);
    }
    record_versions();
    return Status::Ok();
  }
  if (h.dtype != op.header.dtype) {
    return Corrupt("server {}: pull reply in dtype {}, {} was asked for", link.server, static_cast<int>(h.dtype),
                   static_cast<int>(op.header.dtype));
  }
  // Check all, then write all: a bad reply leaves the caller's buffer untouched.
  for (size_t i = 0; i < h.chunk_ids.size(); ++i) {
    const Chunk& c = layout.chunk(static_cast<int32_t>(h.chunk_ids[i]));
    if (frames[i + 1].size() != static_cast<size_t>(c.count) * DTypeSize(h.dtype)) {
      return Corrupt("server {}: pull reply chunk {} has {} bytes, expected {}", link.server, c.id,
                     frames[i + 1].size(), c.count * DTypeSize(h.dtype));
    }
    const std::span<const std::byte> bytes(frames[i + 1].data(), frames[i + 1].size());
    if (h.dtype != DType::kF32) {  // halves: finite (a weight beyond f16's range arrives as Inf)
      CodecFault fault;
      const Status s =
          CheckChunk(Encoding::kDense, h.dtype, bytes, static_cast<size_t>(c.count), static_cast<uint32_t>(c.id), &fault);
      if (!s.ok()) return Corrupt("server {}: pull reply: {}", link.server, s.message());
    }
  }
  for (size_t i = 0; i < h.chunk_ids.size(); ++i) {
    const Chunk& c = layout.chunk(static_cast<int32_t>(h.chunk_ids[i]));
    if (!op.pull_out16.empty()) {  // kept in 16 bits: the worker's device widens them
      std::memcpy(op.pull_out16.data() + c.flat_offset, frames[i + 1].data(), frames[i + 1].size());
    } else if (h.dtype != DType::kF32) {
      const std::span<float> out(op.pull_out.data() + c.flat_offset, static_cast<size_t>(c.count));
      const std::span<const std::byte> bytes(frames[i + 1].data(), frames[i + 1].size());
      DecodeCheckedChunk(Encoding::kDense, h.dtype, bytes, out);  // CheckChunk accepted it above
    } else {
      std::memcpy(op.pull_out.data() + c.flat_offset, frames[i + 1].data(), frames[i + 1].size());
    }
  }
  record_versions();
  return Status::Ok();
}

RequestId PsClient::Submit(MsgType type, std::span<float> out, std::span<const float> in,
                           std::span<const int32_t> chunk_ids, bool all_chunks, int64_t clock, uint32_t flags,
                           std::span<const FactorTensor> factors, uint32_t move_batches,
                           std::span<const int64_t> push_versions, std::span<const uint16_t> cast,
                           std::span<uint16_t> out16) {
  auto req = std::make_shared<Request>();
  RequestId id;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    id = impl_->next_id++;
    impl_->requests[id] = req;
  }
  const auto total = static_cast<size_t>(layout_.total_elems());
  const size_t have = type == MsgType::kPull ? (out16.empty() ? out.size() : out16.size()) : in.size();
  if (have != total) {
    req->status = InvalidArgument("ps client {}: flat buffer has {} floats, the layout has {}",
                                  MsgTypeName(type), have, total);
    return id;
  }
  if (!out16.empty() && CodecDType(options_.compression.pull) == DType::kF32) {
    req->status = InvalidArgument("ps client pull: 16-bit weights asked for, but compression.pull is \"{}\"",
                                  WireCodecName(options_.compression.pull));
    return id;
  }
  const DType push_dtype = CodecDType(options_.compression.push);
  if (!cast.empty() && (cast.size() != total || push_dtype == DType::kF32 ||
                        CodecEncoding(options_.compression.push) != Encoding::kDense)) {
    req->status = InvalidArgument(
        "ps client push: {} gradients cast to 16 bits for a layout of {} floats and compression.push = \"{}\" (they "
        "need one per float and fp16 or bf16)",
        cast.size(), total, WireCodecName(options_.compression.push));
    return id;
  }
  // Group chunk ids by the connection that carries them (Impl::LinkOf), keeping order.
  std::vector<std::vector<int32_t>> per_link(impl_->links.size());
  if (all_chunks) {
    for (int s = 0; s < layout_.servers(); ++s) {
      for (int32_t c : layout_.ServerChunks(s)) per_link[impl_->ChunkLinkIndex(s, c)].push_back(c);
    }
  } else {
    for (int32_t c : chunk_ids) {
      if (c < 0 || c >= layout_.num_chunks()) {
        req->status = InvalidArgument("ps client {}: chunk id {} outside 0..{}", MsgTypeName(type), c,
                                      layout_.num_chunks() - 1);
        return id;
      }
      per_link[impl_->ChunkLinkIndex(layout_.chunk(c).server, c)].push_back(c);
    }
  }
  std::vector<Op> ops;
  for (const auto& ids : per_link) {
    if (ids.empty()) continue;
    Op op;
    op.request = req;
    op.id = id;
    MessageHeader& h = op.header;
    h.type = type;
    h.sender = options_.worker_id;
    h.model_id = options_.model_id;
    h.clock = clock;
    h.layout_hash = layout_.hash();
    h.role = options_.role;
    h.flags = flags;
    h.move_batches = move_batches;
    h.session = session_;
    for (int32_t c : ids) h.chunk_ids.push_back(static_cast<uint32_t>(c));
    if (type == MsgType::kPull) {
      op.pull_out = out;
      op.pull_out16 = out16;
      h.dtype = CodecDType(options_.compression.pull);  // fp32 / fp16 / bf16
    } else {
      const bool lossy = (flags & (kFlagInit | kFlagMove)) == 0 && IsLossy(options_.compression.push);
      if (lossy) {  // encoded on the link's I/O thread at the first send (EncodePart)
        h.dtype = push_dtype;
        h.encoding = CodecEncoding(options_.compression.push);
      }
      // Cast already (by the worker's device): the frames are the wire's bytes.
      op.cast = lossy && !cast.empty();
      // Zero-copy: frames borrow the caller's buffer; the keepalive's deleter tells the request
      // when the transport is done with them.
      {
        std::lock_guard<std::mutex> lock(req->mu);
        ++req->pending_buffers;
      }
      std::shared_ptr<const void> keep(static_cast<const void*>(nullptr), [req](const void*) {
        {
          std::lock_guard<std::mutex> lock(req->mu);
          --req->pending_buffers;
        }
        req->cv.notify_all();
      });
      for (int32_t c : ids) {
        const Chunk& ch = layout_.chunk(c);
        const void* p = op.cast ? static_cast<const void*>(cast.data() + ch.flat_offset)
                                : static_cast<const void*>(in.data() + ch.flat_offset);
        const uint64_t bytes = static_cast<uint64_t>(ch.count) * (op.cast ? sizeof(uint16_t) : sizeof(float));
        const int64_t v = !push_versions.empty()
                              ? push_versions[static_cast<size_t>(c)]
                              : std::atomic_ref<int64_t>(versions_[static_cast<size_t>(c)]).load(std::memory_order_relaxed);
        h.versions.push_back(std::max<int64_t>(0, v));
        h.elem_counts.push_back(static_cast<uint64_t>(ch.count));
        h.byte_lengths.push_back(bytes);
        if (options_.checksums) h.checksums.push_back(lossy && !op.cast ? 0 : Crc32c(p, bytes));  // lossy: at encode
        op.payload.push_back(Frame::Borrow(p, bytes, keep));
      }
    }
    ops.push_back(std::move(op));
  }
  if (type == MsgType::kPush && !factors.empty()) {
    const Status s = ArrangeFactorOps(layout_, in, cast, factors, options_.checksums, &ops);
    if (!s.ok()) {
      req->status = s;
      return id;
    }
  }
  {
    std::lock_guard<std::mutex> lock(req->mu);
    req->pending_ops = static_cast<int>(ops.size());
  }
  for (Op& op : ops) {
    const auto c = static_cast<int32_t>(op.header.chunk_ids[0]);
    impl_->Enqueue(impl_->LinkOf(layout_.chunk(c).server, c), std::move(op));
  }
  return id;
}

uint64_t FactorPushPayloadBytes(const ParamLayout& layout, std::span<const FactorTensor> factors) {
  std::vector<int64_t> batch_of(layout.tensors().size(), 0);
  for (const FactorTensor& f : factors) batch_of.at(static_cast<size_t>(f.tensor)) = f.batch;
  uint64_t floats = 0;
  for (size_t t = 0; t < batch_of.size(); ++t) {
    floats += static_cast<uint64_t>(batch_of[t] > 0 ? FactorWireFloats(layout, static_cast<int>(t), batch_of[t])
                                                    : layout.tensors()[t].numel());
  }
  return floats * sizeof(float);
}

RequestId PsClient::Pull(std::span<float> flat_weights_out, int64_t clock) {
  return Submit(MsgType::kPull, flat_weights_out, {}, {}, /*all_chunks=*/true, clock, 0);
}
RequestId PsClient::PullChunks(std::span<float> flat_weights_out, std::span<const int32_t> chunk_ids, int64_t clock) {
  return Submit(MsgType::kPull, flat_weights_out, {}, chunk_ids, false, clock, 0);
}
RequestId PsClient::Pull16(std::span<uint16_t> flat_weights_out, int64_t clock) {
  return Submit(MsgType::kPull, {}, {}, {}, /*all_chunks=*/true, clock, 0, {}, 0, {}, {}, flat_weights_out);
}
RequestId PsClient::PullChunks16(std::span<uint16_t> flat_weights_out, std::span<const int32_t> chunk_ids,
                                 int64_t clock) {
  return Submit(MsgType::kPull, {}, {}, chunk_ids, false, clock, 0, {}, 0, {}, {}, flat_weights_out);
}
RequestId PsClient::Push(std::span<const float> flat_grads, int64_t clock) {
  return Submit(MsgType::kPush, {}, flat_grads, {}, /*all_chunks=*/true, clock, 0);
}
RequestId PsClient::PushElastic(std::span<const float> flat_diff, int64_t clock) {
  return Submit(MsgType::kPush, {}, flat_diff, {}, /*all_chunks=*/true, clock, kFlagElastic);
}
RequestId PsClient::PushMove(std::span<const float> flat_change, uint32_t batches) {
  return Submit(MsgType::kPush, {}, flat_change, {}, /*all_chunks=*/true, 0, kFlagMove, {}, batches);
}
RequestId PsClient::PushChunks(std::span<const float> flat_grads, std::span<const int32_t> chunk_ids, int64_t clock,
                               std::span<const FactorTensor> factors, std::span<const int64_t> versions,
                               std::span<const uint16_t> cast) {
  DP_CHECK(versions.empty() || static_cast<int>(versions.size()) == layout_.num_chunks());
  return Submit(MsgType::kPush, {}, flat_grads, chunk_ids, false, clock, 0, factors, 0, versions, cast);
}
RequestId PsClient::PushTensors(std::span<const float> flat_grads, int first_tensor, int end_tensor, int64_t clock,
                                std::span<const FactorTensor> factors) {
  const int t = static_cast<int>(layout_.tensors().size());
  first_tensor = std::clamp(first_tensor, 0, t);
  end_tensor = std::clamp(end_tensor, first_tensor, t);
  const std::vector<int32_t> ids =
      layout_.ChunksInRange(layout_.tensor_flat_offset(first_tensor), layout_.tensor_flat_offset(end_tensor));
  return Submit(MsgType::kPush, {}, flat_grads, ids, false, clock, 0, factors);
}
RequestId PsClient::PushInit(std::span<const float> flat_weights) {
  return Submit(MsgType::kPush, {}, flat_weights, {}, /*all_chunks=*/true, 0, kFlagInit);
}

void PsClient::Abort(Status why) {
  std::lock_guard<std::mutex> lock(impl_->abort_mu);
  if (impl_->aborted.load()) return;
  impl_->abort_status = std::move(why);
  impl_->aborted.store(true);
}

Status PsClient::Wait(RequestId id, std::chrono::milliseconds timeout) { return Wait(id, timeout, nullptr); }

Status PsClient::Wait(RequestId id, std::chrono::milliseconds timeout, std::vector<int64_t>* staleness) {
  std::shared_ptr<Request> req;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    auto it = impl_->requests.find(id);
    if (it == impl_->requests.end()) {
      return InvalidArgument("ps client: request {} is unknown (never issued or already waited)", id);
    }
    req = it->second;
  }
  {
    std::unique_lock<std::mutex> lock(req->mu);
    if (!req->cv.wait_for(lock, timeout, [&] { return req->pending_ops == 0 && req->pending_buffers == 0; })) {
      return Timeout(
          "ps client: request {} not done within {} ms ({} server "
          "replies outstanding)",
          id, timeout.count(), req->pending_ops);
    }
  }
  if (staleness != nullptr) {
    std::lock_guard<std::mutex> lock(req->mu);
    *staleness = std::move(req->staleness);
  }
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->requests.erase(id);
  return req->status;
}

namespace {

// Sends a control message on one server's connection (its first by default) and waits for its reply.
Status Control(PsClient::Impl& impl, const ParamLayout& layout, const PsClientOptions& o, int server, MsgType type,
               const std::string& text, std::chrono::milliseconds timeout, MessageHeader* reply, int64_t clock = 0,
               int connection = 0) {
  if (server < 0 || server >= layout.servers()) {
    return InvalidArgument("ps client: server {} outside 0..{}", server, layout.servers() - 1);
  }
  auto req = std::make_shared<Request>();
  req->pending_ops = 1;
  Op op;
  op.request = req;
  {
    std::lock_guard<std::mutex> lock(impl.mu);
    op.id = impl.next_id++;
  }
  op.header.type = type;
  op.header.sender = o.worker_id;
  op.header.model_id = o.model_id;
  op.header.layout_hash = layout.hash();
  op.header.role = o.role;
  op.header.text = text;
  op.header.clock = clock;
  op.header.session = impl.owner->session();
  // The run's secret goes only where a server checks it (server/access.h), not with traffic.
  if (type == MsgType::kRegister || type == MsgType::kCheckpoint || type == MsgType::kShutdown)
    op.header.token = o.token;
  if (type == MsgType::kRegister && o.shared_memory) {  // ask for a region (same host only)
    op.header.flags |= kFlagShm;
    op.header.boot_id = HostBootId();
  }
  impl.Enqueue(*impl.links[impl.LinkIndex(server, connection)], std::move(op));
  std::unique_lock<std::mutex> lock(req->mu);
  if (!req->cv.wait_for(lock, timeout, [&] { return req->pending_ops == 0; })) {
    return Timeout("ps client: no {} reply from server {} within {} ms", MsgTypeName(type), server, timeout.count());
  }
  if (reply) *reply = req->reply;
  return req->status;
}

}  // namespace

Status PsClient::Connect(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (int s = 0; s < layout_.servers(); ++s) {
    for (int j = 0; j < impl_->per_server; ++j) {  // every connection registers
      const auto left = std::max(std::chrono::milliseconds(1), std::chrono::duration_cast<std::chrono::milliseconds>(
                                                                   deadline - std::chrono::steady_clock::now()));
      MessageHeader reply;
      DP_RETURN_IF_ERROR(Control(*impl_, layout_, options_, s, MsgType::kRegister, "", left, &reply, 0, j));
      if (reply.type != MsgType::kRegisterReply) {
        return Corrupt("server {}: register answered with {}", s, MsgTypeName(reply.type));
      }
    }
  }
  return Status::Ok();
}

Status PsClient::SetServerAddress(int server, const std::string& address) {
  if (server < 0 || server >= layout_.servers()) {
    return InvalidArgument("ps client: SetServerAddress: server {} outside 0..{}", server, layout_.servers() - 1);
  }
  if (address.empty()) return InvalidArgument("ps client: SetServerAddress: empty address for server {}", server);
  for (int j = 0; j < impl_->per_server; ++j) {
    Impl::Link& link = *impl_->links[impl_->LinkIndex(server, j)];
    {
      std::lock_guard<std::mutex> lock(link.mu);
      link.new_address = address;
    }
    link.cv.notify_all();
  }
  return Status::Ok();
}

namespace {
// Summed over the server's connections.
template <typename Get>
uint64_t LinkCounter(const std::vector<std::unique_ptr<PsClient::Impl::Link>>& links, int server, Get get) {
  uint64_t sum = 0;
  for (const auto& l : links) sum += l->server == server ? get(*l) : 0;
  return sum;
}
}  // namespace

uint64_t PsClient::acked_pushes(int server) const {
  return LinkCounter(impl_->links, server, [](const Impl::Link& l) { return l.acked_pushes.load(); });
}
uint64_t PsClient::resent_parts(int server) const {
  return LinkCounter(impl_->links, server, [](const Impl::Link& l) { return l.resent_parts.load(); });
}
uint64_t PsClient::restarts_seen(int server) const {
  return LinkCounter(impl_->links, server, [](const Impl::Link& l) { return l.restarts_seen.load(); });
}
uint64_t PsClient::taken_requests(int server) const {
  return LinkCounter(impl_->links, server, [](const Impl::Link& l) { return l.taken_requests.load(); });
}
TrafficCounts PsClient::shared_memory_traffic() const {
  TrafficCounts t;
  for (const auto& l : impl_->links) {
    t.sent_bytes += l->shm->sent_bytes();
    t.received_bytes += l->shm->received_bytes();
  }
  return t;
}

Status PsClient::Stats(int server, ShardStatsWire* out, std::chrono::milliseconds timeout) {
  MessageHeader reply;
  DP_RETURN_IF_ERROR(Control(*impl_, layout_, options_, server, MsgType::kStats, "", timeout, &reply));
  *out = reply.stats;
  return Status::Ok();
}

Status PsClient::Checkpoint(int server, const std::string& path, std::chrono::milliseconds timeout) {
  return Control(*impl_, layout_, options_, server, MsgType::kCheckpoint, path, timeout, nullptr);
}

Status PsClient::Shutdown(int server, std::chrono::milliseconds timeout) {
  return Control(*impl_, layout_, options_, server, MsgType::kShutdown, "", timeout, nullptr);
}

Status PsClient::ReportClock(int64_t finished_iteration, std::chrono::milliseconds timeout) {
  for (int s = 0; s < layout_.servers(); ++s) {
    DP_RETURN_IF_ERROR(
        Control(*impl_, layout_, options_, s, MsgType::kClock, "", timeout, nullptr, finished_iteration));
  }
  return Status::Ok();
}

}  // namespace downpour
