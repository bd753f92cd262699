// emulated_link.h — EmulatedLinkTransport, a Transport decorator that paces every message its
// endpoints send to an emulated egress link (cluster.link_gbps; experiments only,
// docs/emulated_links.md). The transport underneath (ZeroMQ, in-process) knows nothing of it:
// without a link, programs use their transport as it is and no code of this file runs.
//
// Every message any endpoint of the decorator sends reserves its bytes (all frames) on one
// LinkPacer (common/rate_limiter.h) shared by the decorator's endpoints and threads — a process
// has one, so this is the process's egress link — and is handed to the inner endpoint at its
// virtual finish time. No Send waits for the link: a message that is not due yet is queued
// behind the endpoint's earlier ones to the same peer (so order holds) and released when due by
// the endpoint's later Send, Receive and ReleaseDue calls, whose waits end at the next due time.
// A server's queue per peer is bounded (peer_queue_bytes; a peer past it is dropped: its queue
// freed, later sends to it kUnavailable, counted in dropped_peers()), so its loop never waits. A
// client keeps one queue; past client_queue_bytes its Send waits for the link. A client must
// keep calling Receive (or Send) for its queue to drain — the PS client's I/O loop does, every
// millisecond while requests are open — and its replies are read while its sends are paced (full
// duplex, as a real NIC). Queued messages due within linger_ms leave when a client endpoint is
// destroyed; later ones are dropped, as ZeroMQ drops unsent messages at close. A message smaller
// than pace_min_bytes (headers, acks, heartbeats) is charged to the link — later messages leave
// later — but is not itself held back when nothing is queued before it: a real host interleaves
// a small message's packets with a bulk transfer's, it does not wait behind megabytes. Ingress
// is not limited.
//
// Reply order (order_by_key, cluster.reply_order = "step"): by default a server's reply reserves
// its place on the link when it is sent, so replies leave in the order the loop made them, and
// two peers asking at once get theirs interleaved (as a real NIC interleaves two flows). With
// order_by_key a large reply is queued without a place; whenever the link has less than
// kOrderAhead of reserved time left, the endpoint reserves the waiting reply with the lowest
// order key (SendOrdered; ties: the one sent first), whichever peer it is for, and never a peer's
// reply ahead of that peer's earlier ones. The server then decides, up to the last few
// milliseconds, whose bytes the link carries next.
//
// Timeline (trace; not owned, must outlive the decorator; null or off = none): every message
// that waited for the link is a "link"/"egress" span from its Send to its hand-off, with its
// bytes, the link's share of the wait (link_ms: its finish time) and the rest (late_ms: a loop
// busy elsewhere when it fell due), on a track per endpoint.
//
// Thread-safety: as transport.h; an endpoint is used by one thread at a time, the pacer is
// shared. The decorator must outlive its endpoints, and the inner transport the decorator.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

#include "common/rate_limiter.h"
#include "common/transport.h"

namespace downpour {

class TraceLog;

struct EmulatedLinkOptions {
  double gbps = 0;  // > 0: the link's speed in Gbit/s; 0 = no link (SetUpProcessNet leaves it so)
  size_t pace_min_bytes = size_t{64} << 10;  // smaller messages are charged but not held back
  bool order_by_key = false;                 // servers: replies take the link by order key
  size_t peer_queue_bytes = size_t{256} << 20;    // server: paced replies queued per peer
  size_t client_queue_bytes = size_t{256} << 20;  // client: paced messages queued before Send waits
  int linger_ms = 500;       // client: how long its destructor sends queued messages that fall due
  TraceLog* trace = nullptr;  // egress spans (see above); null = none
};

class EmulatedLinkTransport : public Transport {
 public:
  // `inner` (not owned) carries the messages once due; options.gbps > 0.
  EmulatedLinkTransport(Transport* inner, EmulatedLinkOptions options);
  ~EmulatedLinkTransport() override;

  TrafficCounts traffic() const override { return inner_->traffic(); }
  Status Bind(const std::string& address, std::unique_ptr<ServerEndpoint>* out) override;
  Status Connect(const std::string& address, std::unique_ptr<ClientEndpoint>* out) override;
  const EmulatedLinkOptions& options() const { return options_; }
  LinkPacer& pacer() { return pacer_; }

  // Ordered by key: the next waiting reply gets its place once the link has less than this
  // reserved ahead (so the link never idles for want of a reservation, and the choice is made as
  // late as that allows).
  static constexpr std::chrono::milliseconds kOrderAhead{3};

 private:
  Transport* inner_;
  const EmulatedLinkOptions options_;
  LinkPacer pacer_;
};

}  // namespace downpour
