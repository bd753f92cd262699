// shard_sessions.h — ShardSessions, who a shard talks to: the registration of workers and of the
// evaluator, the checks every later message of theirs passes (authorised, from the connection
// that registered, this layout and model, a clock in range, not from a process declared dead),
// the shared-memory region a same-host connection asked for, and what the shard remembers of
// each worker's sessions (server/sessions.h: the requests taken, the fence).
//
// It decides who is who, never what a message changes: the shard's join of the consistency
// accounting and its log record stay the shard's. Refusals come back as a status naming the
// field, with the reason the shard counts and puts on the wire.
//
// Thread-safety: none; the shard calls it under its lock.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/codec.h"
#include "common/shm_region.h"
#include "common/shm_share.h"
#include "common/status.h"
#include "common/transport.h"
#include "server/access.h"
#include "server/peers.h"
#include "server/sessions.h"

namespace downpour {

// The largest clock (iterations) a worker may report; beyond it a message is refused (kClock),
// so forged clocks cannot overflow the consistency arithmetic.
inline constexpr int64_t kMaxClock = int64_t{1} << 48;

struct ShardSessionsOptions {
  int server_id = 0;
  uint32_t model_id = 0;
  uint64_t layout_hash = 0;
  int max_workers = 1;        // worker ids 0..max_workers-1
  AccessPolicy access;        // who may register, push and evaluate
  bool shared_memory = true;  // offer a region to a same-host worker that asks
  // cluster.heartbeat_timeout_ms: a worker declared dead has been silent this long, so only its
  // sessions registered at least half of it before the notice are fenced; 0 = all of them.
  std::chrono::milliseconds heartbeat_timeout{0};
};

class ShardSessions {
 public:
  // `share`: where the shard's chunks lie in a region (outlives this object).
  ShardSessions(ShardSessionsOptions options, const ShmShare& share);

  // A worker's register: authorised to register, this layout and model, a known id, and not a
  // process declared dead.
  Status CheckRegister(const PeerInfo& info, const MessageHeader& h, RejectReason* reason) const;
  // After CheckRegister: `peer` is h.sender's connection (its session noted for the fence), and
  // a region is made for it when it asked and runs on this host (reply's shm fields). A region
  // that cannot be made is returned: the worker goes on over the socket. The first connection of
  // a session is logged ("worker N registered from ..."); the session's others at debug level.
  Status RegisterWorker(const PeerId& peer, const PeerInfo& info, const MessageHeader& h, MessageHeader* reply);
  // The evaluator's register: authorised to evaluate, this layout and model.
  Status RegisterReader(const PeerId& peer, const PeerInfo& info, const MessageHeader& h, RejectReason* reason);

  // A worker's message after its register, and the evaluator's.
  Status CheckWorker(const PeerId& peer, const PeerInfo& info, const MessageHeader& h, RejectReason* reason) const;
  Status CheckReader(const PeerId& peer, const MessageHeader& h, RejectReason* reason) const;

  // The connection's region; null if it has none.
  std::shared_ptr<SharedRegion> Region(const PeerId& peer) const { return peers_.Region(peer); }
  // `worker` was declared dead: its sessions registered before its silence began are out of
  // the run, whatever they send if they wake (a line each).
  void DeclaredDead(int32_t worker);
  DuplicateWindows& duplicates() { return duplicates_; }
  const DuplicateWindows& duplicates() const { return duplicates_; }

 private:
  Status CheckLayoutAndModel(const MessageHeader& h, RejectReason* reason) const;
  Status CheckNotRemoved(int32_t worker, uint64_t session, RejectReason* reason) const;
  Status OfferRegion(const PeerId& peer, const MessageHeader& h, MessageHeader* reply);

  const ShardSessionsOptions o_;
  const ShmShare& share_;
  const std::string boot_id_;  // this host's (regions only for workers on it)
  DuplicateWindows duplicates_;
  SessionFence fence_;
  PeerTable peers_;  // registered connections, readers, and their regions
  std::vector<std::optional<uint64_t>> logged_session_;  // per worker id: the session whose register was logged
};

}  // namespace downpour
