// ps_client.cc — see ps_client.h. One I/O thread per server runs that server's queue of
// operations one at a time (send, then wait for the matching reply).
#include "client/ps/ps_client.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

namespace downpour {

namespace {

// One Pull/Push/control call. Done when every per-server op has its reply and the transport
// has released every borrowed payload frame.
struct Request {
  std::mutex mu;
  std::condition_variable cv;
  int pending_ops = 0;
  int pending_buffers = 0;
  Status status;
  MessageHeader reply;  // the last reply (control calls read it)

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

struct Op {
  std::shared_ptr<Request> request;
  RequestId id = 0;
  MessageHeader header;
  Frames payload;
  std::span<float> pull_out;  // pull: the caller's flat buffer
};

}  // namespace

struct PsClient::Impl {
  struct Link {
    int server = 0;
    std::unique_ptr<ClientEndpoint> endpoint;
    std::mutex mu;
    std::condition_variable cv;
    std::deque<Op> queue;
    bool stopping = false;
    std::thread thread;
  };
  PsClient* owner = nullptr;
  std::vector<std::unique_ptr<Link>> links;
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
  Status Execute(Link& link, Op& op, MessageHeader* reply);
  Status Reregister(Link& link, RequestId id, std::chrono::steady_clock::time_point deadline);
  Status AcceptPullReply(const Link& link, const Op& op, const std::vector<uint32_t>& expected,
                         const MessageHeader& h, const Frames& frames);
};

PsClient::PsClient(const ParamLayout& layout, PsClientOptions options)
    : layout_(layout), options_(std::move(options)),
      versions_(static_cast<size_t>(layout.num_chunks()), -1), impl_(std::make_unique<Impl>()) {
  impl_->owner = this;
}

Status PsClient::Create(Transport* transport, const ParamLayout& layout, PsClientOptions options,
                        std::unique_ptr<PsClient>* out) {
  if (static_cast<int>(options.server_addresses.size()) != layout.servers()) {
    return InvalidArgument("ps client: {} server addresses given, layout has {} servers",
                           options.server_addresses.size(), layout.servers());
  }
  std::unique_ptr<PsClient> c(new PsClient(layout, std::move(options)));
  for (int s = 0; s < layout.servers(); ++s) {
    auto link = std::make_unique<Impl::Link>();
    link->server = s;
    DP_RETURN_IF_ERROR(transport->Connect(c->options_.server_addresses[static_cast<size_t>(s)], &link->endpoint));
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

void PsClient::Impl::RunLink(Link& link) {
  while (true) {
    Op op;
    {
      std::unique_lock<std::mutex> lock(link.mu);
      link.cv.wait(lock, [&] { return link.stopping || !link.queue.empty(); });
      if (link.stopping) {
        for (Op& q : link.queue) {
          FinishOp(*q.request, Unavailable("ps client destroyed before the request ran"), nullptr);
        }
        link.queue.clear();
        return;
      }
      op = std::move(link.queue.front());
      link.queue.pop_front();
    }
    MessageHeader reply;
    Status s = Execute(link, op, &reply);
    op.payload.clear();  // drop our references to borrowed buffers before finishing
    FinishOp(*op.request, s, s.ok() ? &reply : nullptr);
  }
}

namespace {

// Sub-message k of a request travels with request id (id << 16) | k, so replies are matched to
// the part they answer.
constexpr int kSubBits = 16;

template <typename T>
std::vector<T> Slice(const std::vector<T>& v, size_t begin, size_t end) {
  if (v.empty()) return {};
  return std::vector<T>(v.begin() + static_cast<std::ptrdiff_t>(begin), v.begin() + static_cast<std::ptrdiff_t>(end));
}

}  // namespace

Status PsClient::Impl::Execute(Link& link, Op& op, MessageHeader* reply) {
  // Split the op into messages of at most max_chunks_per_message chunks: the server validates and
  // applies part k while part k+1 is still on the wire, and pull replies are copied out as they
  // arrive.
  const size_t n = op.header.chunk_ids.size();
  const size_t per = owner->options_.max_chunks_per_message > 0
                         ? static_cast<size_t>(owner->options_.max_chunks_per_message) : std::max<size_t>(n, 1);
  const size_t parts = std::max<size_t>(1, (n + per - 1) / per);
  if (parts + 1 >= (size_t{1} << kSubBits)) return InvalidArgument("ps client: {} sub-messages is too many", parts);
  std::vector<std::vector<uint32_t>> part_chunks(parts);
  std::vector<Frames> part_frames(parts);  // kept until the op ends: a part may be sent again
  for (size_t k = 0; k < parts; ++k) {
    const size_t b = k * per, e = std::min(n, b + per);
    MessageHeader h = op.header;
    h.request_id = (op.id << kSubBits) | k;
    h.chunk_ids = Slice(op.header.chunk_ids, b, e);
    h.versions = Slice(op.header.versions, b, e);
    h.elem_counts = Slice(op.header.elem_counts, b, e);
    h.byte_lengths = Slice(op.header.byte_lengths, b, e);
    h.checksums = Slice(op.header.checksums, b, e);
    part_chunks[k] = h.chunk_ids;
    Frames& frames = part_frames[k];
    frames.reserve(e - b + 1);
    frames.emplace_back();
    DP_RETURN_IF_ERROR(HeaderFrame(h, &frames[0]));
    if (!op.payload.empty()) {
      for (size_t i = b; i < e; ++i) frames.push_back(std::move(op.payload[i]));
    }
  }
  op.payload.clear();

  const auto deadline = std::chrono::steady_clock::now() + owner->options_.reply_timeout;
  std::vector<size_t> to_send(parts);
  for (size_t k = 0; k < parts; ++k) to_send[k] = k;
  Status first_error;
  // Attempt 2 happens only after a server restart: parts refused because this connection is not
  // registered (the restarted server forgot it) are sent again after registering anew. Refused
  // parts were not applied, so nothing is applied twice.
  for (int attempt = 0; attempt < 2 && !to_send.empty(); ++attempt) {
    for (size_t k : to_send) {
      Status s = link.endpoint->Send(part_frames[k]);  // copies Frame handles, not bytes
      if (!s.ok()) {
        return Status(s.code(), fmt::format("server {}: {} failed: {}", link.server, MsgTypeName(op.header.type), s.message()));
      }
    }
    std::vector<bool> waiting(parts, false);
    for (size_t k : to_send) waiting[k] = true;
    size_t pending = to_send.size();
    std::vector<size_t> unregistered;
    while (pending > 0) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) {
        return Timeout(
            "server {}: no reply to {} (request {}, {} of {} parts "
            "outstanding) within {} ms",
            link.server, MsgTypeName(op.header.type), op.id, pending, parts, owner->options_.reply_timeout.count());
      }
      Frames got;
      Status s = link.endpoint->Receive(&got, std::min(left, std::chrono::milliseconds(200)));
      if (s.code() == StatusCode::kTimeout) {
        std::lock_guard<std::mutex> lock(link.mu);
        if (link.stopping) return Unavailable("ps client destroyed while waiting for a reply");
        continue;
      }
      DP_RETURN_IF_ERROR(s);
      MessageHeader h;
      s = ParseHeader(got, &h);
      if (!s.ok()) return Status(s.code(), fmt::format("server {}: bad reply: {}", link.server, s.message()));
      const uint64_t k = h.request_id & ((uint64_t{1} << kSubBits) - 1);
      // A reply to an earlier, timed-out request (or an error about an undecodable one): skip.
      if ((h.request_id >> kSubBits) != op.id || k >= parts || !waiting[k]) continue;
      waiting[k] = false;
      --pending;
      if (h.type == MsgType::kError) {
        if (attempt == 0 && op.header.type != MsgType::kRegister && owner->connected_.load() &&
            h.flags == static_cast<uint32_t>(RejectReason::kNotRegistered)) {
          unregistered.push_back(k);
          continue;
        }
        Status e = StatusFromReply(h);
        if (first_error.ok()) first_error = Status(e.code(), fmt::format("server {}: {}", link.server, e.message()));
        continue;
      }
      if (op.header.type == MsgType::kPull) {
        s = AcceptPullReply(link, op, part_chunks[k], h, got);
        if (!s.ok() && first_error.ok()) first_error = s;
      }
      *reply = std::move(h);
    }
    to_send = std::move(unregistered);
    if (!to_send.empty()) DP_RETURN_IF_ERROR(Reregister(link, op.id, deadline));
  }
  return first_error;
}

Status PsClient::Impl::Reregister(Link& link, RequestId id, std::chrono::steady_clock::time_point deadline) {
  MessageHeader h;
  h.type = MsgType::kRegister;
  h.request_id = (id << kSubBits) | ((uint64_t{1} << kSubBits) - 1);
  h.sender = owner->options_.worker_id;
  h.model_id = owner->options_.model_id;
  h.layout_hash = owner->layout_.hash();
  h.role = Role::kWorker;
  h.token = owner->options_.token;
  Frames frames(1);
  DP_RETURN_IF_ERROR(HeaderFrame(h, &frames[0]));
  DP_RETURN_IF_ERROR(link.endpoint->Send(std::move(frames)));
  while (std::chrono::steady_clock::now() < deadline) {
    Frames got;
    Status s = link.endpoint->Receive(&got, std::chrono::milliseconds(200));
    if (s.code() == StatusCode::kTimeout) continue;
    DP_RETURN_IF_ERROR(s);
    MessageHeader r;
    DP_RETURN_IF_ERROR(ParseHeader(got, &r));
    if (r.request_id != h.request_id) continue;
    if (r.type == MsgType::kError) {
      Status e = StatusFromReply(r);
      return Status(e.code(), fmt::format("server {}: registering again after a restart: {}", link.server, e.message()));
    }
    return Status::Ok();
  }
  return Timeout("server {}: no reply to register (after a restart)", link.server);
}

Status PsClient::Impl::AcceptPullReply(const Link& link, const Op& op, const std::vector<uint32_t>& expected,
                                       const MessageHeader& h, const Frames& frames) {
  const ParamLayout& layout = owner->layout_;
  if (h.type != MsgType::kPullReply || h.chunk_ids != expected ||
      h.versions.size() != h.chunk_ids.size() || frames.size() != h.chunk_ids.size() + 1) {
    return Corrupt("server {}: pull reply of type {} with {} chunks / {} frames does not match the {} requested",
                   link.server, MsgTypeName(h.type), h.chunk_ids.size(), frames.size() - 1, expected.size());
  }
  // Check all, then write all: a bad reply leaves the caller's buffer untouched.
  for (size_t i = 0; i < h.chunk_ids.size(); ++i) {
    const Chunk& c = layout.chunk(static_cast<int32_t>(h.chunk_ids[i]));
    if (frames[i + 1].size() != static_cast<size_t>(c.count) * sizeof(float)) {
      return Corrupt("server {}: pull reply chunk {} has {} bytes, expected {}", link.server, c.id,
                     frames[i + 1].size(), c.count * sizeof(float));
    }
  }
  for (size_t i = 0; i < h.chunk_ids.size(); ++i) {
    const Chunk& c = layout.chunk(static_cast<int32_t>(h.chunk_ids[i]));
    std::memcpy(op.pull_out.data() + c.flat_offset, frames[i + 1].data(), frames[i + 1].size());
    // atomic_ref: a Push on the caller's thread may read this version concurrently.
    std::atomic_ref<int64_t>(owner->versions_[static_cast<size_t>(c.id)]).store(h.versions[i], std::memory_order_relaxed);
  }
  return Status::Ok();
}

RequestId PsClient::Submit(MsgType type, std::span<float> out, std::span<const float> in,
                           std::span<const int32_t> chunk_ids, bool all_chunks, int64_t clock,
                           uint32_t flags) {
  auto req = std::make_shared<Request>();
  RequestId id;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    id = impl_->next_id++;
    impl_->requests[id] = req;
  }
  const auto total = static_cast<size_t>(layout_.total_elems());
  const size_t have = type == MsgType::kPull ? out.size() : in.size();
  if (have != total) {
    req->status = InvalidArgument("ps client {}: flat buffer has {} floats, the layout has {}",
                                  MsgTypeName(type), have, total);
    return id;
  }
  // Group chunk ids by server, keeping order.
  std::vector<std::vector<int32_t>> per_server(static_cast<size_t>(layout_.servers()));
  if (all_chunks) {
    for (int s = 0; s < layout_.servers(); ++s) {
      auto ids = layout_.ServerChunks(s);
      per_server[static_cast<size_t>(s)].assign(ids.begin(), ids.end());
    }
  } else {
    for (int32_t c : chunk_ids) {
      if (c < 0 || c >= layout_.num_chunks()) {
        req->status = InvalidArgument("ps client {}: chunk id {} outside 0..{}", MsgTypeName(type), c,
                                      layout_.num_chunks() - 1);
        return id;
      }
      per_server[static_cast<size_t>(layout_.chunk(c).server)].push_back(c);
    }
  }
  std::vector<Op> ops;
  for (int s = 0; s < layout_.servers(); ++s) {
    const auto& ids = per_server[static_cast<size_t>(s)];
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
    h.role = Role::kWorker;
    h.flags = flags;
    for (int32_t c : ids) h.chunk_ids.push_back(static_cast<uint32_t>(c));
    if (type == MsgType::kPull) {
      op.pull_out = out;
    } else {
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
        const float* p = in.data() + ch.flat_offset;
        const uint64_t bytes = static_cast<uint64_t>(ch.count) * sizeof(float);
        const int64_t v = std::atomic_ref<int64_t>(versions_[static_cast<size_t>(c)]).load(std::memory_order_relaxed);
        h.versions.push_back(std::max<int64_t>(0, v));
        h.elem_counts.push_back(static_cast<uint64_t>(ch.count));
        h.byte_lengths.push_back(bytes);
        if (options_.checksums) h.checksums.push_back(Crc32c(p, bytes));
        op.payload.push_back(Frame::Borrow(p, bytes, keep));
      }
    }
    ops.push_back(std::move(op));
  }
  {
    std::lock_guard<std::mutex> lock(req->mu);
    req->pending_ops = static_cast<int>(ops.size());
  }
  for (Op& op : ops) {
    const int s = layout_.chunk(static_cast<int32_t>(op.header.chunk_ids[0])).server;
    impl_->Enqueue(*impl_->links[static_cast<size_t>(s)], std::move(op));
  }
  return id;
}

RequestId PsClient::Pull(std::span<float> flat_weights_out, int64_t clock) {
  return Submit(MsgType::kPull, flat_weights_out, {}, {}, /*all_chunks=*/true, clock, 0);
}
RequestId PsClient::PullChunks(std::span<float> flat_weights_out, std::span<const int32_t> chunk_ids, int64_t clock) {
  return Submit(MsgType::kPull, flat_weights_out, {}, chunk_ids, false, clock, 0);
}
RequestId PsClient::Push(std::span<const float> flat_grads, int64_t clock) {
  return Submit(MsgType::kPush, {}, flat_grads, {}, /*all_chunks=*/true, clock, 0);
}
RequestId PsClient::PushChunks(std::span<const float> flat_grads, std::span<const int32_t> chunk_ids, int64_t clock) {
  return Submit(MsgType::kPush, {}, flat_grads, chunk_ids, false, clock, 0);
}
RequestId PsClient::PushTensors(std::span<const float> flat_grads, int first_tensor, int end_tensor, int64_t clock) {
  const int t = static_cast<int>(layout_.tensors().size());
  first_tensor = std::clamp(first_tensor, 0, t);
  end_tensor = std::clamp(end_tensor, first_tensor, t);
  const std::vector<int32_t> ids =
      layout_.ChunksInRange(layout_.tensor_flat_offset(first_tensor), layout_.tensor_flat_offset(end_tensor));
  return Submit(MsgType::kPush, {}, flat_grads, ids, false, clock, 0);
}
RequestId PsClient::PushInit(std::span<const float> flat_weights) {
  return Submit(MsgType::kPush, {}, flat_weights, {}, /*all_chunks=*/true, 0, kFlagInit);
}

Status PsClient::Wait(RequestId id, std::chrono::milliseconds timeout) {
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
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->requests.erase(id);
  return req->status;
}

namespace {

// Sends a control message to one server and waits for its reply.
Status Control(PsClient::Impl& impl, const ParamLayout& layout, const PsClientOptions& o, int server, MsgType type,
               const std::string& text, std::chrono::milliseconds timeout, MessageHeader* reply, int64_t clock = 0) {
  if (server < 0 || server >= static_cast<int>(impl.links.size())) {
    return InvalidArgument("ps client: server {} outside 0..{}", server, impl.links.size() - 1);
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
  op.header.role = Role::kWorker;
  op.header.text = text;
  op.header.clock = clock;
  // The run's secret goes only where a server checks it (server/access.h), not with traffic.
  if (type == MsgType::kRegister || type == MsgType::kCheckpoint || type == MsgType::kShutdown)
    op.header.token = o.token;
  impl.Enqueue(*impl.links[static_cast<size_t>(server)], std::move(op));
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
    const auto left = std::max(std::chrono::milliseconds(1), std::chrono::duration_cast<std::chrono::milliseconds>(
                                                                 deadline - std::chrono::steady_clock::now()));
    MessageHeader reply;
    DP_RETURN_IF_ERROR(Control(*impl_, layout_, options_, s, MsgType::kRegister, "", left, &reply));
    if (reply.type != MsgType::kRegisterReply) {
      return Corrupt("server {}: register answered with {}", s, MsgTypeName(reply.type));
    }
  }
  connected_.store(true);
  return Status::Ok();
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
