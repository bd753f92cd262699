// transport.h — how parameter-service processes exchange multipart messages, as an interface
// (gloo-style), so server and client logic never see a socket.
//
//  * ServerEndpoint: ROUTER semantics. Receives from any peer together with the peer's opaque
//    identity, and sends a reply to a peer by that identity. Its Send never blocks the message
//    loop on a peer that does not read (ZeroMQ: queued per peer, the peer dropped past a bound).
//  * ClientEndpoint: DEALER semantics. One per server; sends requests, receives replies in the
//    order the server sent them.
//  * Transport: a factory for both. ZmqTransport (common/zmq_transport.h, tcp:// and ipc://) and
//    InprocTransport (common/inproc_transport.h, threads in one process) implement it.
//
// A message is a vector of Frames: frames[0] is the encoded header (common/codec.h), frames
// 1.. are raw payloads. A Frame either owns its bytes or borrows them:
//  * Frame::Copy(...) owns a private copy.
//  * Frame::Borrow(data, size, keepalive) references the caller's buffer without copying. The
//    transport holds a copy of `keepalive` until it no longer reads the bytes (ZeroMQ: until its
//    I/O thread has written them; inproc: until the receiver drops the message). The caller must
//    not modify or free the buffer until the last copy of `keepalive` is released — attach a
//    deleter to `keepalive` to learn when that happens (the PS client does, see ps_client.h).
//    A borrowed frame with a null keepalive is copied at Send (only safe for small frames).
//  * Received frames own their bytes (ZeroMQ: the zmq message itself, no copy). Their data is
//    not guaranteed to be aligned for float: use AlignedFloats() (below) before reading floats.
//
// Thread-safety: an endpoint is used by one thread at a time (ZeroMQ sockets are not
// thread-safe); different endpoints may be used on different threads concurrently. A
// Transport's Bind/Connect are thread-safe. Endpoints must be destroyed before their Transport.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "common/status.h"

namespace downpour {

class Frame {
 public:
  Frame() = default;
  static Frame Copy(const void* data, size_t size);
  static Frame Copy(const std::string& bytes) { return Copy(bytes.data(), bytes.size()); }
  static Frame Borrow(const void* data, size_t size, std::shared_ptr<const void> keepalive) {
    Frame f;
    f.data_ = static_cast<const std::byte*>(data);
    f.size_ = size;
    f.owner_ = std::move(keepalive);
    return f;
  }

  const std::byte* data() const { return data_; }
  size_t size() const { return size_; }
  // The object that keeps data() alive (may be null for borrowed frames, see above).
  const std::shared_ptr<const void>& owner() const { return owner_; }

 private:
  const std::byte* data_ = nullptr;
  size_t size_ = 0;
  std::shared_ptr<const void> owner_;
};

using PeerId = std::string;  // opaque routing identity of a client endpoint
using Frames = std::vector<Frame>;

// What the transport knows about the sender of a received message, beyond its routing identity.
struct PeerInfo {
  // The role the sender's key is bound to ("admin", "server", "worker": common/security.h),
  // set only by an authenticating transport (ZeroMQ with CurveZMQ keys, or an inproc client
  // made with InprocTransport::ConnectAs); "" = not authenticated.
  std::string user_id;
  // The sender's network address as the transport saw it ("127.0.0.5", "::1"); "" = unknown.
  std::string address;
};

class ServerEndpoint {
 public:
  virtual ~ServerEndpoint() = default;
  // Waits up to `timeout` for the next message. kTimeout when none arrived. `info` (may be
  // null) receives what the transport knows about the sender.
  virtual Status Receive(PeerId* from, Frames* frames, std::chrono::milliseconds timeout, PeerInfo* info) = 0;
  Status Receive(PeerId* from, Frames* frames, std::chrono::milliseconds timeout) {
    return Receive(from, frames, timeout, nullptr);
  }
  // Sends `frames` to `to` without blocking the caller for long: a reply the peer's connection
  // cannot take now is queued (in order, bounded per peer) and flushed by later Receive calls
  // (ZmqTransport; see zmq_transport.h). kUnavailable when the peer is unknown / gone, or was
  // dropped for not reading its replies.
  virtual Status Send(const PeerId& to, Frames frames) = 0;
  // Send, with the reply's place among those waiting for the link: an endpoint that orders its
  // replies (an emulated link's EmulatedLinkOptions::order_by_key, cluster.reply_order = "step") hands the waiting reply
  // with the lowest `order` to the link first, whichever peer it is for; a peer's own replies
  // still leave in the order they were sent (a lower `order` after a higher one counts as the
  // higher). Other endpoints send as Send does.
  virtual Status SendOrdered(const PeerId& to, Frames frames, uint64_t order) {
    (void)order;
    return Send(to, std::move(frames));
  }
  // Sends queued replies that have fallen due (an emulated link's paced replies, replies that
  // waited for a full pipe), without waiting; the rest stay queued. A loop in the middle of long
  // work may call it between pieces, so its replies leave when due as a kernel's socket buffer
  // would let them, not when it next calls Receive (a shard keeps long work off its loop instead:
  // server/factor_expander.h). The loop's thread only. Transports that queue nothing do nothing.
  virtual void ReleaseDue() {}
  // Thread-safe: a Receive waiting now, or the next one, returns (kTimeout) at once, so that the
  // loop can send what another thread made ready (a shard's acks its log thread has written).
  // Transports that cannot be woken do nothing: the loop then sees it within its poll interval.
  virtual void Wake() {}
  // Peers dropped so far because their queue of unsent replies outgrew its bound (a client that
  // never reads). Thread-safe. Transports without a bound return 0.
  virtual uint64_t dropped_peers() const { return 0; }
  // The address clients connect to, e.g. "tcp://127.0.0.1:41234" (the real port when bound to
  // port 0) or "inproc://shard0".
  virtual std::string address() const = 0;
};

class ClientEndpoint {
 public:
  virtual ~ClientEndpoint() = default;
  virtual Status Send(Frames frames) = 0;
  // Waits up to `timeout` for the next reply. kTimeout when none arrived.
  virtual Status Receive(Frames* frames, std::chrono::milliseconds timeout) = 0;
};

// What a transport's endpoints have sent and received: every frame of every message (header and
// payloads), counted when handed to / taken from the transport. Shared-memory payloads never pass
// through a transport and are not in here.
struct TrafficCounts {
  uint64_t sent_bytes = 0;
  uint64_t received_bytes = 0;
  uint64_t sent_messages = 0;
  uint64_t received_messages = 0;
};

class Transport {
 public:
  virtual ~Transport() = default;
  // Totals so far over all endpoints of this transport; thread-safe. Transports that do not
  // count return zeros.
  virtual TrafficCounts traffic() const { return {}; }
  // address: "tcp://127.0.0.1:0" (port 0 = the OS picks one; see ServerEndpoint::address()),
  // "tcp://*:5555", or for InprocTransport any name.
  virtual Status Bind(const std::string& address, std::unique_ptr<ServerEndpoint>* out) = 0;
  virtual Status Connect(const std::string& address, std::unique_ptr<ClientEndpoint>* out) = 0;
};

// Bytes of a message: every frame's, header included.
size_t MessageBytes(const Frames& frames);
// A peer's routing identity in hex, for log lines.
std::string PeerHex(const PeerId& peer);

// The peers a server endpoint dropped for not reading their replies: later messages from them are
// ignored and sends to them refused. Remembers the last kRemember (oldest forgotten first);
// counts every drop. Thread-safety: the endpoint's thread, except count() (any thread).
class DroppedPeers {
 public:
  static constexpr size_t kRemember = 4096;
  // Records `peer`; returns how many peers were dropped so far, this one included.
  uint64_t Add(const PeerId& peer);
  // Add, and the log line saying so: `endpoint` (e.g. "zmq 'tcp://…'") dropped `peer`, which had
  // `replies` replies of `bytes` bytes queued, and `more_bytes` more would pass `bound`.
  std::string Drop(const PeerId& peer, std::string_view endpoint, size_t replies, size_t bytes, size_t more_bytes,
                   size_t bound);
  bool Contains(const PeerId& peer) const { return ids_.count(peer) != 0; }
  uint64_t count() const { return count_.load(std::memory_order_relaxed); }

 private:
  std::unordered_set<PeerId> ids_;
  std::deque<PeerId> order_;  // oldest first
  std::atomic<uint64_t> count_{0};
};

// A view of a frame's bytes as floats. Returns frame.data() when it is 4-byte aligned,
// otherwise copies into `scratch` (resized as needed) and returns that.
inline const float* AlignedFloats(const Frame& frame, std::vector<float>* scratch) {
  if (reinterpret_cast<uintptr_t>(frame.data()) % alignof(float) == 0) {
    return reinterpret_cast<const float*>(frame.data());
  }
  scratch->resize(frame.size() / sizeof(float));
  std::memcpy(scratch->data(), frame.data(), scratch->size() * sizeof(float));
  return scratch->data();
}

}  // namespace downpour
