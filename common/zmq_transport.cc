// zmq_transport.cc — see zmq_transport.h. With common/security.cc (key generation) the only
// files that include ZeroMQ.
#include "common/zmq_transport.h"

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <zmq.hpp>

#include "common/log_limit.h"
#include "common/net_address.h"
#include "common/trace.h"

namespace downpour {

namespace {

// The ZAP handler and the handshake monitors of a curve-enabled transport, on one thread.
//
// The ZAP socket is bound in the constructor, before any curve socket is bound: libzmq accepts
// every CurveZMQ client when no handler is bound at inproc://zeromq.zap.01, so the handler
// must exist first. Monitor sockets are connected by Watch() on the binding thread (so no
// event of a fresh socket is lost) and handed to the security thread under `mu_`.
class CurveGuard {
 public:
  CurveGuard(zmq::context_t& context, const ZmqOptions& options);
  ~CurveGuard();
  // Monitors handshake failures of `bound`, a socket bound at `address`.
  void Watch(zmq::socket_t& bound, const std::string& address);
  uint64_t refused() const { return refused_.load(std::memory_order_relaxed); }

 private:
  struct Monitor {
    zmq::socket_t socket;  // PAIR connected to the bound socket's monitor endpoint
    std::string address;   // the bound socket's address, for messages
  };
  void Run();
  void AdoptPending();
  void HandleZapRequest();
  void HandleMonitorEvent(Monitor& monitor);
  void Refuse(const std::string& what);

  zmq::context_t& context_;
  const ZmqOptions& options_;
  zmq::socket_t zap_;
  std::mutex mu_;
  std::vector<Monitor> pending_;   // guarded by mu_; watched sockets not yet adopted
  int next_monitor_ = 0;           // guarded by mu_
  std::vector<Monitor> monitors_;  // security thread only
  std::atomic<uint64_t> refused_{0};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace

struct ZmqTransport::Impl {
  ZmqOptions options;
  zmq::context_t context;
  std::mutex guard_mu;
  // Made by the first curve Bind. Declared after `context`, so destroyed (thread joined, its
  // sockets closed) before the context terminates.
  std::unique_ptr<CurveGuard> guard;
  std::atomic<uint64_t> sent_bytes{0}, received_bytes{0}, sent_messages{0}, received_messages{0};
  explicit Impl(const ZmqOptions& o) : options(o), context(o.io_threads) {}
  void CountSent(size_t bytes) {
    sent_bytes.fetch_add(bytes, std::memory_order_relaxed);
    sent_messages.fetch_add(1, std::memory_order_relaxed);
  }
  void CountReceived(const Frames& frames);
  // A track for one endpoint's egress spans on the timeline; -1 when there is no timeline.
  int TraceTrack(const std::string& name) {
    return options.trace != nullptr && options.trace->on() ? options.trace->Thread(name) : -1;
  }
  // The timeline's span of a reply that waited in its peer's queue from `queued` (its Send) to now.
  void TraceEgress(int track, size_t bytes, std::chrono::steady_clock::time_point queued) {
    if (track < 0) return;
    const auto now = std::chrono::steady_clock::now();
    options.trace->Async(track, "link", "egress", 0, queued, now,
                         {{"bytes", static_cast<double>(bytes)},
                          {"link_ms", 0.0},
                          {"late_ms", std::max(0.0, std::chrono::duration<double, std::milli>(now - queued).count())}});
  }
};

namespace {

Status ZmqError(const char* what, const std::string& address, const zmq::error_t& e) {
  return Unavailable("zmq {} '{}': {} (errno {})", what, address, e.what(), e.num());
}

// ---- addresses and socket options ------------------------------------------------------------

// The host of "tcp://HOST:PORT" (brackets kept), or "" for other transports.
std::string TcpHost(const std::string& address) {
  constexpr std::string_view kTcp = "tcp://";
  if (address.rfind(kTcp, 0) != 0) return "";
  std::string rest = address.substr(kTcp.size());
  if (const size_t semi = rest.find(';'); semi != std::string::npos) rest = rest.substr(semi + 1);
  const size_t colon = rest.rfind(':');
  return colon == std::string::npos ? rest : rest.substr(0, colon);
}

bool HasColon(const std::string& host) { return host.find(':') != std::string::npos; }

// "127.0.0.5" -> "127.0.0.5", "::1" -> "[::1]": a host as it goes before ":PORT".
std::string HostForAddress(const std::string& host) {
  if (HasColon(host) && host.front() != '[') return "[" + host + "]";
  return host;
}

// "::ffff:127.0.0.5" (an IPv4 peer of a dual-stack socket) -> "127.0.0.5".
std::string UnmapPeerAddress(const std::string& address) {
  constexpr std::string_view kMapped = "::ffff:";
  if (address.rfind(kMapped, 0) == 0 && address.find('.') != std::string::npos) return address.substr(kMapped.size());
  return address;
}

// "tcp://HOST:PORT" from `source` -> "tcp://SOURCE:0;HOST:PORT" (ZeroMQ binds the outgoing
// connection to SOURCE, any port). Other addresses, or no source, unchanged.
std::string WithSource(const std::string& address, const std::string& source) {
  constexpr std::string_view kTcp = "tcp://";
  if (source.empty() || address.rfind(kTcp, 0) != 0) return address;
  return fmt::format("{}{}:0;{}", kTcp, HostForAddress(source), address.substr(kTcp.size()));
}

// Called by ZeroMQ's I/O thread once it no longer reads a zero-copy frame's bytes.
void ReleaseKeepalive(void* /*data*/, void* hint) {
  delete static_cast<std::shared_ptr<const void>*>(hint);
}

zmq::message_t ToMessage(const Frame& f, size_t zero_copy_min) {
  // use_count, not operator bool: a keepalive may own a deleter with a null pointer (the ps
  // client's per-request completion signal); only a frame with no keepalive at all is copied.
  if (f.owner().use_count() > 0 && f.size() >= zero_copy_min) {
    auto* hint = new std::shared_ptr<const void>(f.owner());
    return zmq::message_t(const_cast<std::byte*>(f.data()), f.size(), &ReleaseKeepalive, hint);
  }
  return zmq::message_t(f.data(), f.size());
}

// Sends frames as one multipart message (the first `prefix` frame, if any, is the ROUTER
// identity). ZeroMQ delivers multipart messages atomically.
Status SendAll(zmq::socket_t& socket, const std::string* prefix, Frames& frames,
               size_t zero_copy_min, const std::string& address) {
  try {
    if (frames.empty()) return InvalidArgument("zmq send to '{}': a message needs a frame", address);
    if (prefix) {
      zmq::message_t id(prefix->data(), prefix->size());
      if (!socket.send(id, zmq::send_flags::sndmore)) {
        return Timeout("zmq send to '{}' timed out", address);
      }
    }
    for (size_t i = 0; i < frames.size(); ++i) {
      zmq::message_t m = ToMessage(frames[i], zero_copy_min);
      const auto flags = i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none;
      if (!socket.send(m, flags)) {
        return Timeout("zmq send to '{}' timed out", address);
      }
    }
  } catch (const zmq::error_t& e) {
    return ZmqError("send", address, e);
  }
  return Status::Ok();
}

// Receives one multipart message, waiting up to `timeout` for its first frame.
// `wake_fd` (an eventfd, or -1): readable = come back now, kTimeout, unless a message is there.
Status ReceiveAll(zmq::socket_t& socket, PeerId* identity, Frames* frames, std::chrono::milliseconds timeout,
                  const std::string& address, PeerInfo* info = nullptr, int wake_fd = -1) {
  // Over ipc libzmq's Peer-Address is ":uid:gid:pid" (SO_PEERCRED), not an address.
  const bool ipc = IsIpcAddress(address);
  try {
    zmq::pollitem_t items[2] = {{socket.handle(), 0, ZMQ_POLLIN, 0}, {nullptr, wake_fd, ZMQ_POLLIN, 0}};
    if (zmq::poll(items, wake_fd >= 0 ? 2 : 1, timeout) == 0) {
      return Timeout("zmq '{}': no message within {} ms", address, timeout.count());
    }
    if ((items[0].revents & ZMQ_POLLIN) == 0) {  // woken
      uint64_t count = 0;
      (void)::read(wake_fd, &count, sizeof(count));
      return Timeout("zmq '{}': woken", address);
    }
    frames->clear();
    bool first = true;
    while (true) {
      auto msg = std::make_shared<zmq::message_t>();
      if (!socket.recv(*msg, zmq::recv_flags::dontwait)) {
        return Internal("zmq '{}': multipart message cut short", address);
      }
      const bool more = msg->more();
      // Metadata rides on the frames that came over the wire; a ROUTER's identity frame is made
      // locally and carries none, so read it from the first payload frame.
      const bool is_identity = first && identity != nullptr;
      if (!is_identity && frames->empty() && info != nullptr) {
        // Connection metadata (ZMTP): the ZAP handler's user id and the peer's address.
        const char* user = zmq_msg_gets(msg->handle(), "User-Id");
        const char* peer = zmq_msg_gets(msg->handle(), "Peer-Address");
        info->user_id = user != nullptr ? user : "";
        info->address = ipc ? "ipc" : (peer != nullptr ? UnmapPeerAddress(peer) : "");
      }
      if (is_identity) {
        identity->assign(static_cast<const char*>(msg->data()), msg->size());
      } else {
        const void* data = msg->data();
        const size_t size = msg->size();
        frames->push_back(Frame::Borrow(data, size, std::move(msg)));
      }
      first = false;
      if (!more) break;
    }
  } catch (const zmq::error_t& e) {
    return ZmqError("receive", address, e);
  }
  return Status::Ok();
}

// Offers one message to a ROUTER without waiting. *sent = false (and nothing sent, `frames`
// intact) when the peer's pipe is full: router_mandatory makes ZeroMQ say EAGAIN at the
// identity frame, and later parts of a message whose identity went through always go.
Status TrySendRouted(zmq::socket_t& socket, const std::string& to, const Frames& frames, size_t zero_copy_min,
                     const std::string& address, bool* sent) {
  *sent = false;
  try {
    if (frames.empty()) return InvalidArgument("zmq send to '{}': a message needs a frame", address);
    zmq::message_t id(to.data(), to.size());
    if (!socket.send(id, zmq::send_flags::sndmore | zmq::send_flags::dontwait)) {
      // The pipe may only look full: the I/O thread's notes of what it has taken are commands
      // the socket processes lazily. Reading ZMQ_EVENTS processes them; then one more try.
      (void)socket.get(zmq::sockopt::events);
      if (!socket.send(id, zmq::send_flags::sndmore | zmq::send_flags::dontwait)) return Status::Ok();
    }
    for (size_t i = 0; i < frames.size(); ++i) {
      zmq::message_t m = ToMessage(frames[i], zero_copy_min);
      const auto more = i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none;
      if (!socket.send(m, more | zmq::send_flags::dontwait)) {
        return Internal("zmq send to '{}': part {} of a routed message refused", address, i);
      }
    }
  } catch (const zmq::error_t& e) {
    return ZmqError("send", address, e);
  }
  *sent = true;
  return Status::Ok();
}

}  // namespace

void ZmqTransport::Impl::CountReceived(const Frames& frames) {
  received_bytes.fetch_add(MessageBytes(frames), std::memory_order_relaxed);
  received_messages.fetch_add(1, std::memory_order_relaxed);
}

namespace {

class ZmqServer : public ServerEndpoint {
 public:
  ZmqServer(ZmqTransport::Impl* impl, zmq::socket_t socket, std::string address)
      : impl_(impl),
        socket_(std::move(socket)),
        address_(std::move(address)),
        drop_log_("zmq '" + address_ + "'", "dropped-peer lines"),
        trace_track_(impl_->TraceTrack("egress of " + address_)) {
    struct stat st {};
    if (IsIpcAddress(address_) && ::lstat(IpcPath(address_).c_str(), &st) == 0) {
      ipc_inode_ = st.st_ino;
      ipc_device_ = st.st_dev;
    }
  }
  // libzmq 4.3.4 leaves an ipc socket file behind when the socket closes (measured: the file
  // outlives the process), so the endpoint removes it — only if it is still the file this
  // endpoint bound (same device and inode), never one another server has bound there since.
  ~ZmqServer() override {
    if (wake_fd_ >= 0) ::close(wake_fd_);
    socket_.close();
    if (ipc_inode_ == 0) return;
    const std::string path = IpcPath(address_);
    struct stat st {};
    if (::lstat(path.c_str(), &st) == 0 && st.st_ino == ipc_inode_ && st.st_dev == ipc_device_) {
      ::unlink(path.c_str());
    }
  }
  using ServerEndpoint::Receive;
  Status Receive(PeerId* from, Frames* frames, std::chrono::milliseconds timeout, PeerInfo* info) override {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    const uint64_t woken_before = wakes_.load();
    while (true) {
      Flush();
      // While replies wait, wake often to offer them again (a peer may start reading any time).
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() < 0) left = std::chrono::milliseconds(0);
      const auto wait = std::min(left, NextFlush());
      PeerId who;
      Status s = ReceiveAll(socket_, &who, frames, wait, address_, info, wake_fd_);
      if (s.code() == StatusCode::kTimeout) {
        if (wait < left && !WokenSince(woken_before)) continue;
        drop_log_.Flush();
        return Timeout("zmq '{}': no message within {} ms", address_, timeout.count());
      }
      if (s.ok() && dropped_.Contains(who)) {  // a dropped peer is not heard any more
        if (std::chrono::steady_clock::now() >= deadline) {
          return Timeout("zmq '{}': no message within {} ms", address_, timeout.count());
        }
        continue;
      }
      if (s.ok() && frames->empty()) return Corrupt("zmq '{}': message without frames", address_);
      if (s.ok()) impl_->CountReceived(*frames);
      if (from != nullptr) *from = std::move(who);
      return s;
    }
  }
  Status Send(const PeerId& to, Frames frames) override { return SendOrdered(to, std::move(frames), kNoOrder); }
  void Wake() override {
    wakes_.fetch_add(1);
    const uint64_t one = 1;
    if (wake_fd_ >= 0) (void)::write(wake_fd_, &one, sizeof(one));
  }
  Status SendOrdered(const PeerId& to, Frames frames, uint64_t order) override {
    if (dropped_.Contains(to)) {
      return Unavailable("zmq '{}': peer {} was dropped (it did not read its replies)", address_, PeerHex(to));
    }
    (void)order;  // replies leave in the order they were sent (an emulated link orders by key)
    const size_t bytes = MessageBytes(frames);
    auto q = queues_.find(to);
    if (q == queues_.end()) {
      bool sent = false;
      DP_RETURN_IF_ERROR(TrySendRouted(socket_, to, frames, impl_->options.zero_copy_min_bytes, address_, &sent));
      if (sent) {
        impl_->CountSent(bytes);
        return Status::Ok();
      }
      q = queues_.emplace(to, PeerQueue{}).first;
    }
    if (q->second.bytes + bytes > impl_->options.peer_queue_bytes) {
      Drop(q, bytes);
      return Unavailable("zmq '{}': peer {} dropped: its unsent replies exceed {} bytes", address_, PeerHex(to),
                         impl_->options.peer_queue_bytes);
    }
    q->second.bytes += bytes;
    q->second.messages.push_back(Queued{std::move(frames), std::chrono::steady_clock::now(), bytes});
    return Status::Ok();
  }
  void ReleaseDue() override {
    if (!queues_.empty()) Flush();
  }
  uint64_t dropped_peers() const override { return dropped_.count(); }
  std::string address() const override { return address_; }

 private:
  static constexpr auto kFlushSlice = std::chrono::milliseconds(2);
  static constexpr uint64_t kNoOrder = UINT64_MAX;  // Send's order: none
  using TimePoint = std::chrono::steady_clock::time_point;
  struct Queued {
    Frames frames;
    TimePoint queued;  // its Send (the timeline's egress span)
    size_t bytes = 0;
  };
  struct PeerQueue {
    std::deque<Queued> messages;
    size_t bytes = 0;
  };
  using Queues = std::unordered_map<PeerId, PeerQueue>;

  // Offers every queued reply, oldest first per peer, until that peer's pipe is full again.
  void Flush() {
    for (auto it = queues_.begin(); it != queues_.end();) {
      PeerQueue& q = it->second;
      while (!q.messages.empty()) {
        bool sent = false;
        Status s = TrySendRouted(socket_, it->first, q.messages.front().frames, impl_->options.zero_copy_min_bytes,
                                 address_, &sent);
        if (!s.ok()) {  // the peer disconnected: nobody to deliver to
          q.messages.clear();
          break;
        }
        if (!sent) break;
        const size_t bytes = q.messages.front().bytes;
        impl_->CountSent(bytes);
        impl_->TraceEgress(trace_track_, bytes, q.messages.front().queued);
        q.bytes -= bytes;
        q.messages.pop_front();
      }
      it = q.messages.empty() ? queues_.erase(it) : std::next(it);
    }
  }

  // How long Receive may wait before the queues need another Flush: kFlushSlice while a reply
  // waits for its peer's pipe, else as long as it likes.
  std::chrono::milliseconds NextFlush() const {
    return queues_.empty() ? std::chrono::milliseconds::max() : kFlushSlice;
  }

  void Drop(Queues::iterator q, size_t more_bytes) {
    const std::string line = dropped_.Drop(q->first, fmt::format("zmq '{}'", address_), q->second.messages.size(),
                                           q->second.bytes, more_bytes, impl_->options.peer_queue_bytes);
    queues_.erase(q);  // frees the frames, so their keepalives
    drop_log_.Log(line);
  }

  ZmqTransport::Impl* impl_;
  zmq::socket_t socket_;
  std::string address_;
  Queues queues_;  // only peers with replies waiting
  DroppedPeers dropped_;
  RateLimitedLog drop_log_;
  ino_t ipc_inode_ = 0;  // the socket file this endpoint bound (ipc only; 0 = none)
  dev_t ipc_device_ = 0;
  const int trace_track_;  // -1 = no timeline
  // Wake(): an eventfd Receive polls beside the socket (-1 if none could be made: the loop then
  // waits out its poll interval), and a count, so a wake is not lost between two polls.
  const int wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  std::atomic<uint64_t> wakes_{0};
  bool WokenSince(uint64_t before) const { return wakes_.load() != before; }
};

class ZmqClient : public ClientEndpoint {
 public:
  using Clock = std::chrono::steady_clock;
  ZmqClient(ZmqTransport::Impl* impl, zmq::socket_t socket, std::string address)
      : impl_(impl), socket_(std::move(socket)), address_(std::move(address)) {}
  // Waits up to send_timeout_ms while the socket's queue is full.
  Status Send(Frames frames) override {
    const size_t bytes = MessageBytes(frames);
    DP_RETURN_IF_ERROR(SendAll(socket_, nullptr, frames, impl_->options.zero_copy_min_bytes, address_));
    impl_->CountSent(bytes);
    return Status::Ok();
  }
  Status Receive(Frames* frames, std::chrono::milliseconds timeout) override {
    Status s = ReceiveAll(socket_, nullptr, frames, timeout, address_);
    if (s.code() == StatusCode::kTimeout) return Timeout("zmq '{}': no message within {} ms", address_, timeout.count());
    DP_RETURN_IF_ERROR(s);
    impl_->CountReceived(*frames);
    return Status::Ok();
  }

 private:
  ZmqTransport::Impl* impl_;
  zmq::socket_t socket_;
  std::string address_;
};

// ---- CurveGuard ------------------------------------------------------------------------------

constexpr char kZapEndpoint[] = "inproc://zeromq.zap.01";  // fixed by RFC 27
constexpr char kZapDomain[] = "downpour";
constexpr auto kGuardPoll = std::chrono::milliseconds(100);  // how soon a new monitor is adopted

CurveGuard::CurveGuard(zmq::context_t& context, const ZmqOptions& options)
    : context_(context), options_(options), zap_(context, zmq::socket_type::rep) {
  zap_.set(zmq::sockopt::linger, 0);
  zap_.bind(kZapEndpoint);
  thread_ = std::thread([this] { Run(); });
}

CurveGuard::~CurveGuard() {
  stop_.store(true);
  thread_.join();
}

void CurveGuard::Watch(zmq::socket_t& bound, const std::string& address) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string endpoint = fmt::format("inproc://downpour-curve-monitor-{}", next_monitor_++);
  const int events =
      ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH;
  if (zmq_socket_monitor(bound.handle(), endpoint.c_str(), events) != 0) throw zmq::error_t();
  zmq::socket_t pair(context_, zmq::socket_type::pair);
  pair.set(zmq::sockopt::linger, 0);
  pair.connect(endpoint);
  pending_.push_back(Monitor{std::move(pair), address});
}

void CurveGuard::AdoptPending() {
  std::lock_guard<std::mutex> lock(mu_);
  for (Monitor& m : pending_) monitors_.push_back(std::move(m));
  pending_.clear();
}

void CurveGuard::Run() {
  std::vector<zmq::pollitem_t> items;
  while (!stop_.load()) {
    AdoptPending();
    items.assign(1, zmq::pollitem_t{zap_.handle(), 0, ZMQ_POLLIN, 0});
    for (Monitor& m : monitors_) items.push_back(zmq::pollitem_t{m.socket.handle(), 0, ZMQ_POLLIN, 0});
    try {
      if (zmq::poll(items.data(), items.size(), kGuardPoll) == 0) continue;
      if (items[0].revents & ZMQ_POLLIN) HandleZapRequest();
      for (size_t i = 0; i < monitors_.size(); ++i) {
        if (items[i + 1].revents & ZMQ_POLLIN) HandleMonitorEvent(monitors_[i]);
      }
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) continue;  // a signal for the program (SIGCHLD, SIGTERM)
      if (e.num() == ETERM) return;
      // Anything else is a bug in this loop, not a peer: a stopped guard would leave every
      // handshake waiting for a ZAP reply, so it is loud.
      std::fprintf(stderr, "downpour: CurveZMQ security thread: unexpected ZeroMQ error: %s\n", e.what());
      std::abort();
    }
  }
}

// One ZAP request (RFC 27): version, request id, domain, address, routing id, mechanism,
// credentials (CURVE: the client's 32-byte public key). Replies 200 with the role as User-Id
// when the key is one of the cluster's, else 400.
void CurveGuard::HandleZapRequest() {
  std::vector<zmq::message_t> request;
  while (true) {
    zmq::message_t part;
    if (!zap_.recv(part, zmq::recv_flags::dontwait)) break;
    const bool more = part.more();
    request.push_back(std::move(part));
    if (!more) break;
  }
  auto frame = [&](size_t i) { return i < request.size() ? request[i].to_string() : std::string(); };
  const std::string address = frame(3);
  const std::string mechanism = frame(5);
  std::string role, why;
  if (mechanism == "CURVE" && request.size() >= 7 && request[6].size() == 32) {
    char z85[41];
    zmq_z85_encode(z85, static_cast<const uint8_t*>(request[6].data()), 32);
    auto it = options_.curve.allowed.find(z85);
    if (it != options_.curve.allowed.end()) {
      role = it->second;
    } else {
      why = fmt::format("client key {}... from {} is not one of this cluster's keys", std::string(z85, 8), address);
    }
  } else {
    why = fmt::format("a {} client from {} (only CurveZMQ clients with this cluster's keys are accepted)",
                      mechanism.empty() ? "keyless" : mechanism, address);
  }
  const bool ok = why.empty();
  const std::string reply[] = {"1.0", frame(1), ok ? "200" : "400", ok ? "OK" : "not a key of this cluster", role, ""};
  for (size_t i = 0; i < std::size(reply); ++i) {
    zap_.send(zmq::buffer(reply[i]), i + 1 < std::size(reply) ? zmq::send_flags::sndmore : zmq::send_flags::none);
  }
  if (!ok) Refuse(why);
}

std::string ProtocolErrorName(uint32_t code) {
  switch (code) {
    case ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
      return "security mechanism mismatch (a plaintext client, or one without CurveZMQ keys)";
    case ZMQ_PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC:
      return "cryptographic error (a client that expects another endpoint key)";
    default:
      return fmt::format("ZMTP protocol error 0x{:x}", code);
  }
}

// One monitor event: a 6-byte frame (uint16 event, uint32 value) and the endpoint address.
void CurveGuard::HandleMonitorEvent(Monitor& monitor) {
  zmq::message_t event, endpoint;
  if (!monitor.socket.recv(event, zmq::recv_flags::dontwait)) return;
  if (event.more()) (void)monitor.socket.recv(endpoint, zmq::recv_flags::dontwait);
  if (event.size() < 6) return;
  // The address the failing connection came in on, as libzmq names it; else the bind address.
  const std::string where = endpoint.size() > 0 ? endpoint.to_string() : monitor.address;
  uint16_t id;
  uint32_t value;
  std::memcpy(&id, event.data(), sizeof(id));
  std::memcpy(&value, static_cast<const char*>(event.data()) + sizeof(id), sizeof(value));
  switch (id) {
    case ZMQ_EVENT_HANDSHAKE_FAILED_AUTH:
      // 400 is this guard's own ZAP denial, counted (with the peer's key) when it was made.
      if (value == 400) return;
      Refuse(fmt::format("handshake on {} refused by ZAP status {}", where, value));
      return;
    case ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL:
      Refuse(fmt::format("handshake on {} failed: {}", where, ProtocolErrorName(value)));
      return;
    case ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL:
      Refuse(fmt::format("handshake on {} failed: {} (a peer that closed or spoke no ZMTP)", where,
                         zmq_strerror(static_cast<int>(value))));
      return;
    default:
      return;
  }
}

void CurveGuard::Refuse(const std::string& what) {
  refused_.fetch_add(1, std::memory_order_relaxed);
  if (options_.on_refused) options_.on_refused(what);
}

void CommonOptions(zmq::socket_t& s, const ZmqOptions& o, const std::string& address) {
  const std::string host = TcpHost(address);  // "" for ipc and inproc: no IPv6, no source
  if (o.ipv6 && !host.empty() && (HasColon(host) || HasColon(o.connect_source))) s.set(zmq::sockopt::ipv6, 1);
  s.set(zmq::sockopt::linger, o.linger_ms);
  s.set(zmq::sockopt::sndtimeo, o.send_timeout_ms);
  s.set(zmq::sockopt::maxmsgsize, o.max_message_bytes);
}

// A bound socket as a CurveZMQ server whose clients the ZAP handler checks.
Status SetCurveServer(zmq::socket_t& s, const CurveOptions& curve, const std::string& address) {
  if (curve.server_secret.empty()) {
    return FailedPrecondition(
        "zmq bind '{}': CurveZMQ is on but this process has no endpoint secret key "
        "(load keys with bind = true: common/security.h LoadCurveKeys)",
        address);
  }
  s.set(zmq::sockopt::curve_server, 1);
  s.set(zmq::sockopt::curve_secretkey, curve.server_secret);
  s.set(zmq::sockopt::zap_domain, kZapDomain);
  return Status::Ok();
}

Status SetCurveClient(zmq::socket_t& s, const CurveOptions& curve, const std::string& address) {
  if (curve.server_public.empty() || curve.client_public.empty() || curve.client_secret.empty()) {
    return FailedPrecondition(
        "zmq connect '{}': CurveZMQ is on but this process lacks the endpoint public "
        "key or its own keypair (common/security.h LoadCurveKeys)",
        address);
  }
  s.set(zmq::sockopt::curve_serverkey, curve.server_public);
  s.set(zmq::sockopt::curve_publickey, curve.client_public);
  s.set(zmq::sockopt::curve_secretkey, curve.client_secret);
  return Status::Ok();
}

}  // namespace

ZmqTransport::ZmqTransport(ZmqOptions options) : impl_(std::make_unique<Impl>(options)) {}
ZmqTransport::~ZmqTransport() = default;

uint64_t ZmqTransport::refused_connections() const {
  std::lock_guard<std::mutex> lock(impl_->guard_mu);
  return impl_->guard ? impl_->guard->refused() : 0;
}

TrafficCounts ZmqTransport::traffic() const {
  TrafficCounts t;
  t.sent_bytes = impl_->sent_bytes.load(std::memory_order_relaxed);
  t.received_bytes = impl_->received_bytes.load(std::memory_order_relaxed);
  t.sent_messages = impl_->sent_messages.load(std::memory_order_relaxed);
  t.received_messages = impl_->received_messages.load(std::memory_order_relaxed);
  return t;
}

Status ZmqTransport::Bind(const std::string& address, std::unique_ptr<ServerEndpoint>* out) {
  const bool curve = impl_->options.curve.enabled;
  if (IsIpcAddress(address)) DP_RETURN_IF_ERROR(CheckIpcBindPath(IpcPath(address), ""));
  try {
    zmq::socket_t s(impl_->context, zmq::socket_type::router);
    CommonOptions(s, impl_->options, address);
    s.set(zmq::sockopt::router_mandatory, 1);  // replies to a vanished peer fail, not vanish;
                                               // to a full one, EAGAIN (queued, see ZmqServer)
    s.set(zmq::sockopt::sndhwm, impl_->options.server_sndhwm);
    if (curve) {
      DP_RETURN_IF_ERROR(SetCurveServer(s, impl_->options.curve, address));
      std::lock_guard<std::mutex> lock(impl_->guard_mu);
      if (!impl_->guard) impl_->guard = std::make_unique<CurveGuard>(impl_->context, impl_->options);
      // Before bind: the monitor must see the first client's handshake.
      impl_->guard->Watch(s, address);
    }
    s.bind(address);
    std::string bound = s.get(zmq::sockopt::last_endpoint);
    *out = std::make_unique<ZmqServer>(impl_.get(), std::move(s), std::move(bound));
  } catch (const zmq::error_t& e) {
    // A port another process holds is a setup error a retry repeats (the caller exits 2, and the
    // launcher does not restart it); other bind errors may pass.
    if (e.num() == EADDRINUSE) {
      return FailedPrecondition("zmq bind '{}': the port is in use (another job, or a process left from an "
                                "earlier one)", address);
    }
    return ZmqError("bind", address, e);
  }
  return Status::Ok();
}

Status ZmqTransport::Connect(const std::string& address, std::unique_ptr<ClientEndpoint>* out) {
  try {
    zmq::socket_t s(impl_->context, zmq::socket_type::dealer);
    CommonOptions(s, impl_->options, address);
    if (impl_->options.client_rcvhwm > 0) s.set(zmq::sockopt::rcvhwm, impl_->options.client_rcvhwm);
    if (impl_->options.curve.enabled) DP_RETURN_IF_ERROR(SetCurveClient(s, impl_->options.curve, address));
    s.connect(WithSource(address, impl_->options.connect_source));
    *out = std::make_unique<ZmqClient>(impl_.get(), std::move(s), address);
  } catch (const zmq::error_t& e) {
    return ZmqError("connect", address, e);
  }
  return Status::Ok();
}

}  // namespace downpour
