// zmq_transport.h — Transport over ZeroMQ: a ROUTER per server endpoint, a DEALER per client
// endpoint, tcp (or ipc/inproc addresses ZeroMQ understands). Payload frames of at least
// kZeroCopyMinBytes are sent zero-copy (zmq_msg_init_data with the frame's bytes and a free
// function that releases the frame's keepalive); smaller frames are copied. Received frames
// keep their zmq message as owner (no copy).
//
// A server no client can stall. A ROUTER's Send never waits: it tries a non-blocking send
// (router_mandatory: EAGAIN when the peer's pipe is full, at most ZmqOptions::server_sndhwm
// messages, plus what the kernel buffers); a reply that cannot go now is queued for that peer,
// behind any earlier queued reply, so a peer's replies keep their order. Every Receive first
// flushes the queues (in order, until a pipe is full again) and, while some remain, waits in
// short slices so a peer that starts reading gets its replies promptly. A peer whose queue would
// grow past ZmqOptions::peer_queue_bytes is dropped: its queue is freed (so are the zero-copy
// frames' keepalives), its later messages are discarded unread, later sends to it fail
// (kUnavailable), it is counted (dropped_peers()) and one line is logged per peer at a bounded
// rate. What ZeroMQ already holds for it (server_sndhwm messages) stays until it disconnects.
// Client (DEALER) sends are unchanged: they wait up to send_timeout_ms.
//
// An emulated link (cluster.link_gbps, experiments only) is not part of this transport: it is a
// decorator around it (common/emulated_link.h). Replies leave in the order they were sent;
// SendOrdered's key is for that decorator.
//
// Traffic (traffic()): bytes and messages this transport's endpoints handed to ZeroMQ and took
// from it, all frames of a message (header + payloads), not ZMTP framing nor the ROUTER identity.
//
// Security (ZmqOptions::curve, keys from common/security.h): with curve.enabled every bound
// socket is a CurveZMQ server and every connection a CurveZMQ client, so traffic is
// authenticated and encrypted. A ZAP handler (RFC 27) owned by the transport accepts a client
// only if its public key is in curve.allowed and sets the connection's User-Id to the mapped
// role, which arrives as PeerInfo::user_id. A client refused by the ZAP handler, and any
// handshake that fails on a bound socket (a plaintext client, one that expects another
// endpoint key), gets no reply and is counted in refused_connections(); on_refused hears of
// each. A refused client that keeps reconnecting is counted once per attempt, so at most
// about ten times a second for a ZeroMQ client (its reconnect interval); programs log the
// callback at a bounded rate.
//
// Addresses: "tcp://HOST:PORT" or "ipc://PATH" (below). An IPv6 literal ("tcp://[::1]:5600", bind "tcp://[::]:5600")
// works when ZmqOptions::ipv6 is on: ZMQ_IPV6 is set on exactly the sockets whose address (or
// connect_source) is an IPv6 literal, so a host name keeps resolving to its IPv4 address as it
// always did ("localhost" stays 127.0.0.1 even where /etc/hosts also lists ::1).
//
// ipc ("ipc://PATH", a Unix domain socket: processes on one host, no TCP stack). Before a bind,
// PATH is checked (common/net_address.h CheckIpcBindPath): it must fit in sun_path (107 bytes),
// its directory must exist and take files, and nothing but a dead socket may be at PATH — a live
// server there is refused (FailedPrecondition), not silently replaced as ZeroMQ alone would do; a
// socket file left by a killed process is replaced. The endpoint's address() is "ipc://PATH"; its
// socket file is removed when the endpoint is destroyed (by the endpoint: libzmq 4.3.4 leaves it;
// only the file this endpoint bound, never one bound there since). A process killed with SIGKILL
// leaves its file; the next bind at that path replaces it (nobody listens). connect_source and ipv6 apply to tcp
// only. PeerInfo::address of a peer over ipc is "ipc" (a Unix socket has no network address).
// CurveZMQ works over ipc exactly as over tcp.
//
// Thread-safety: see transport.h. The ZmqTransport owns the ZeroMQ context (no global one) and,
// with curve on, one security thread (ZAP handler and handshake monitors), started by the first
// Bind and stopped by the destructor before the context ends. It must outlive its endpoints.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "common/security.h"
#include "common/transport.h"

namespace downpour {

class TraceLog;

struct ZmqOptions {
  int io_threads = 2;                       // ZeroMQ I/O threads of the context
  int send_timeout_ms = 30000;              // a client send blocked this long (queue full) fails
  // Per peer of a bound (ROUTER) socket: replies queued while its connection is full, in bytes;
  // a peer whose queue would exceed it is dropped (see above). From cluster.peer_queue_mb.
  size_t peer_queue_bytes = size_t{256} << 20;
  // Messages ZeroMQ itself buffers per peer of a bound socket before a send to it would block
  // (ZMQ_SNDHWM); beyond them replies wait in the bounded per-peer queue.
  int server_sndhwm = 64;
  // Messages a client (DEALER) socket takes off the network before its application reads them
  // (ZMQ_RCVHWM); 0 = ZeroMQ's default (1000). Tests set it low to make a client that does not
  // read push back on its server at once.
  int client_rcvhwm = 0;
  int linger_ms = 500;                      // how long close waits for unsent messages
  int64_t max_message_bytes = int64_t{256} << 20;  // per received frame; larger = peer dropped
  size_t zero_copy_min_bytes = 4096;        // frames smaller than this are copied at send
  CurveOptions curve;                       // CurveZMQ keys; curve.enabled = false: plaintext
  bool ipv6 = true;                         // allow IPv6 literal addresses (see above)
  // Source address of outgoing tcp connections (ignored for ipc) ("127.0.0.5", "::1"); "" = any (the OS picks).
  // Servers then see this process at that address (PeerInfo::address).
  std::string connect_source;
  // Timeline (cluster.trace_events; not owned, must outlive the transport; null or off = none):
  // every reply that waited in a server's queue for its peer's full pipe is recorded as a
  // "link"/"egress" span from its Send to the moment ZeroMQ took it, with its bytes, link_ms 0 and
  // the wait as late_ms, on a track per endpoint (an emulated link records its own share:
  // common/emulated_link.h).
  TraceLog* trace = nullptr;
  // Called on the security thread for each refused connection with one line saying what was
  // refused and why. Must be quick and must not call into this transport. Empty = not called.
  std::function<void(const std::string& what)> on_refused;
};

class ZmqTransport : public Transport {
 public:
  explicit ZmqTransport(ZmqOptions options = {});
  ~ZmqTransport() override;
  Status Bind(const std::string& address, std::unique_ptr<ServerEndpoint>* out) override;
  Status Connect(const std::string& address, std::unique_ptr<ClientEndpoint>* out) override;

  // Connections refused so far on this transport's bound sockets (ZAP denials and failed
  // CurveZMQ handshakes). Always 0 with curve off. Thread-safe.
  uint64_t refused_connections() const;
  // Bytes and messages sent and received so far by this transport's endpoints. Thread-safe.
  TrafficCounts traffic() const override;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace downpour
