// param_channel.h — the training loop's view of the parameter service: pull all weights,
// push gradient chunk groups as backward produces them, wait for the pushes.
//
// The distributed implementation (ps_channel.h) wraps client/ps's PsClient; a null channel
// means the single-process reference run (the loop applies the update itself).
//
// Buffer lifetime: a Pull writes into `weights` before it returns. A StartPush reads
// `grads` (the flat gradient buffer, layout order) until WaitPushes() returns, so the
// caller must not modify those floats before then.
//
// Thread-safety: one training thread per channel.
#pragma once

#include <cstdint>
#include <span>

#include "client/worker/push_planner.h"
#include "common/status.h"

namespace downpour::worker {

// Versions of the weights a pull returned (each shard counts its applied updates per chunk).
struct PullInfo {
  int64_t version_min = 0;  // over the chunks pulled
  int64_t version_max = 0;
  int64_t version_sum = 0;  // the "server versions" an evaluation is stamped with
};

// Staleness the servers reported for the pushes since the last WaitPushes(): per applied
// chunk push, (chunk version when applied) − (version the gradient was computed from).
struct PushInfo {
  int64_t chunks = 0;           // chunk pushes acknowledged
  int64_t staleness_sum = 0;
  int64_t staleness_max = 0;
  bool staleness_known = false; // false when the replies carried no versions
};

class ParamChannel {
 public:
  virtual ~ParamChannel() = default;
  // Fetches every chunk from every server (in parallel) into `weights` (all parameters,
  // layout order). `clock` is the caller's iteration (sync/ssp servers may hold the reply
  // until the clock is servable).
  virtual Status Pull(int64_t clock, std::span<float> weights, PullInfo* info) = 0;
  // Sends the gradients of `group`'s chunks, read from `grads` (flat), for `clock`.
  virtual Status StartPush(int64_t clock, const PushGroup& group, std::span<const float> grads) = 0;
  // Waits until every started push is acknowledged; accumulates staleness into `info`.
  virtual Status WaitPushes(PushInfo* info) = 0;
  // The worker finished iteration `clock` (sync/ssp accounting, heartbeats).
  virtual Status Clock(int64_t clock) = 0;
  // The worker leaves the job (training done). Other workers are no longer waited for it.
  virtual Status Leave() = 0;
};

}  // namespace downpour::worker
