// sessions.h — what a shard remembers of its workers' client sessions (one per process start,
// common/codec.h MessageHeader::session), as two parts the shard asks:
//
//   DuplicateWindows: the requests each session had taken, so that a resend of a push already
//     taken (same worker, session, request id) is acknowledged again, not applied twice. Bounded:
//     kSessions sessions a worker, kIdsPerSession ids a session (oldest dropped). In
//     checkpoints, and rebuilt by replay of the log, so a restarted server knows them too.
//   SessionFence: the sessions that registered (and when), and those of a process the coordinator
//     declared dead, whose every message is refused from then on (RejectReason::kRemoved); a
//     restarted process has a new session and joins again. Bounded by kSessions a worker. In
//     memory only: a restarted server has forgotten its fences (the coordinator still stops the
//     removed process).
//   PullStepOrder: the order key of each worker's current step of pulls, for an endpoint that
//     orders its replies (cluster.reply_order = "step"). In memory only.
//
// Session 0 (a client that sends none) is never remembered or fenced; worker ids outside
// 0..max_workers-1 are ignored.
// Thread-safety: none; the shard calls them under its lock.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <unordered_set>
#include <vector>

#include "server/shard_checkpoint.h"

namespace downpour {

class DuplicateWindows {
 public:
  static constexpr int kSessions = 4;          // sessions remembered per worker
  static constexpr int kIdsPerSession = 4096;  // request ids remembered per session

  explicit DuplicateWindows(int max_workers) : windows_(static_cast<size_t>(max_workers)) {}

  bool Seen(int32_t worker, uint64_t session, uint64_t request_id) const;
  void Remember(int32_t worker, uint64_t session, uint64_t request_id);

  // Per worker id, its sessions oldest first with their ids oldest first (checkpoints).
  std::vector<std::vector<ShardCheckpoint::Session>> Export() const;
  void Import(const std::vector<std::vector<ShardCheckpoint::Session>>& windows);

 private:
  struct Window {
    uint64_t session = 0;
    std::deque<uint64_t> order;  // oldest first
    std::unordered_set<uint64_t> ids;
  };
  bool Known(int32_t worker) const { return worker >= 0 && static_cast<size_t>(worker) < windows_.size(); }
  std::vector<std::deque<Window>> windows_;  // per worker id, oldest session first
};

class SessionFence {
 public:
  using Clock = std::chrono::steady_clock;
  explicit SessionFence(int max_workers)
      : seen_(static_cast<size_t>(max_workers)), removed_(static_cast<size_t>(max_workers)) {}

  // `worker`'s `session` registered at `now`.
  void Registered(int32_t worker, uint64_t session, Clock::time_point now);
  // `worker` was declared dead: its sessions that registered at or before `cutoff` are fenced
  // (returned, for the log line); later ones are a restarted process's and stay.
  std::vector<uint64_t> Fence(int32_t worker, Clock::time_point cutoff);
  bool Removed(int32_t worker, uint64_t session) const;

 private:
  struct Seen {
    uint64_t session = 0;
    Clock::time_point registered;
  };
  bool Known(int32_t worker) const { return worker >= 0 && static_cast<size_t>(worker) < seen_.size(); }
  std::vector<std::deque<Seen>> seen_;        // per worker id, oldest first
  std::vector<std::deque<uint64_t>> removed_;  // per worker id, oldest first
};

// A worker's pulls of one step (one clock) share an order key: when the step's first pull
// arrived. An endpoint that orders replies (ServerEndpoint::SendOrdered) then sends one
// worker's step after another's instead of interleaving them.
class PullStepOrder {
 public:
  explicit PullStepOrder(int max_workers) : steps_(static_cast<size_t>(max_workers), Step{-1, 0}) {}
  // The key of `worker`'s pull at `clock` arriving at `arrived` (ns of steady_clock); UINT64_MAX
  // for an id outside 0..max_workers-1.
  uint64_t Key(int32_t worker, int64_t clock, uint64_t arrived);

 private:
  struct Step {
    int64_t clock = -1;  // of the worker's latest pull
    uint64_t first = 0;  // when that clock's first pull arrived
  };
  std::vector<Step> steps_;  // per worker id
};

}  // namespace downpour
