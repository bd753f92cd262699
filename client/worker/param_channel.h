// param_channel.h — the training loop's view of the parameter service: pull all weights, or
// pull chunk sets without blocking and wait for each when its layer needs it; push gradient
// chunk groups as backward produces them, wait for the pushes.
//
// The distributed implementation (ps_channel.h) wraps client/ps's PsClient; a null channel
// means the single-process reference run (the loop applies the update itself).
//
// Ordering: requests to one server are sent in call order, and a server handles a link's
// messages in arrival order, so a pull started after a push of the same chunks is served after
// that push was applied (the overlapped loop relies on this and on nothing else).
//
// Buffer lifetime: a Pull writes into `weights` before it returns. A StartPull writes the
// floats of its chunks in `weights` until its WaitPull returns: the caller must not read or
// write them before then, nor free `weights` (after a failed WaitPull, until the channel is
// destroyed). A StartPush reads its chunks' floats of `grads` (the flat gradient buffer, layout
// order) until its WaitPush, or a WaitPushes, returns: the caller must not modify them before.
//
// Thread-safety: one training thread per channel.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "client/worker/push_planner.h"
#include "common/status.h"

namespace downpour::worker {

// Versions of the weights a pull returned (each shard counts its applied updates per chunk).
struct PullInfo {
  int64_t version_min = 0;  // over the chunks pulled
  int64_t version_max = 0;
  int64_t version_sum = 0;  // the "server versions" an evaluation is stamped with
};

using PullHandle = uint64_t;
using PushHandle = uint64_t;

// When one request (a pull or a push) was on the wire: from the call that issued it to the
// moment the channel saw it complete (seconds on the steady clock). Used for the step-time
// breakdown's comm_ms.
struct WireSpan {
  double issued_s = 0;
  double done_s = 0;
};

// Staleness the servers reported in their acks, running totals that WaitPushes() adds to: per
// applied chunk push, (chunk version when applied) − (version the gradient was computed from),
// the same value each server counts in its stats.
struct PushInfo {
  int64_t chunks = 0;           // applied chunk pushes whose ack reported a staleness
  int64_t staleness_sum = 0;
  int64_t staleness_max = 0;
  bool staleness_known = false; // false until an ack carried a staleness
};

// A tensor whose span of the pushed `grads` holds sufficient factors, not its gradient:
// δ packed in the layout's per-chunk row blocks (common/layout.h FactorRowBlocks), then a
// (batch×in) (docs/factors.md; client/engine/net.h SetFactoredParams).
struct PushFactor {
  int tensor = -1;  // index into the layout's tensors
  int batch = 0;
};

class ParamChannel {
 public:
  virtual ~ParamChannel() = default;
  // Fetches every chunk from every server (in parallel) into `weights` (all parameters,
  // layout order). `clock` is the caller's iteration (sync/ssp servers may hold the reply
  // until the clock is servable).
  virtual Status Pull(int64_t clock, std::span<float> weights, PullInfo* info) = 0;
  // Starts fetching the chunks `chunk_ids` (ascending, non-empty) into `weights` (all
  // parameters, layout order) for iteration `clock` and returns at once with a handle for
  // WaitPull. Errors of the pull itself surface at WaitPull.
  virtual Status StartPull(int64_t clock, std::span<const int32_t> chunk_ids, std::span<float> weights,
                           PullHandle* handle) = 0;
  // Pull and StartPull into the weights in the pull codec's 16 bits (fp16 / bf16), for a worker
  // whose device widens them (engine::Net::SetWeightDType); handles as StartPull's. A channel
  // that cannot refuses (FailedPrecondition); so does a run whose pulls are fp32.
  virtual Status Pull16(int64_t clock, std::span<uint16_t> weights, PullInfo* info) {
    (void)clock, (void)weights, (void)info;
    return FailedPrecondition("this parameter channel cannot pull 16-bit weights");
  }
  virtual Status StartPull16(int64_t clock, std::span<const int32_t> chunk_ids, std::span<uint16_t> weights,
                             PullHandle* handle) {
    (void)clock, (void)chunk_ids, (void)weights, (void)handle;
    return FailedPrecondition("this parameter channel cannot pull 16-bit weights");
  }
  virtual bool pulls16() const { return false; }  // whether Pull16 / StartPull16 work
  // Blocks until pull `handle` has written its chunks; `info` gets the versions of those chunks.
  // Each handle is waited once.
  virtual Status WaitPull(PullHandle handle, PullInfo* info) = 0;
  // Whether pull `handle` has completed (written, or failed), without blocking: a WaitPull of it
  // would return at once. A channel that cannot tell answers false, so its callers wait.
  virtual bool PullDone(PullHandle handle) {
    (void)handle;
    return false;
  }
  // Sends the gradients of `group`'s chunks, read from `grads` (flat), for `clock`; `handle`
  // (may be null) gets the push's handle for WaitPush.
  virtual Status StartPush(int64_t clock, const PushGroup& group, std::span<const float> grads,
                           PushHandle* handle) = 0;
  // Blocks until push `handle` is acknowledged (its floats of `grads` are free again); accumulates
  // its staleness into `info`. Each handle is waited once, by WaitPush or by WaitPushes.
  virtual Status WaitPush(PushHandle handle, PushInfo* info) = 0;
  // The tensors whose span of `grads` holds sufficient factors in the pushes started from now
  // on, until the next call (empty = none). A channel that cannot send factors refuses a
  // non-empty list (FailedPrecondition).
  virtual Status SetPushFactors(std::span<const PushFactor> factors) {
    if (factors.empty()) return Status::Ok();
    return FailedPrecondition("this parameter channel cannot send sufficient factors (compression.factors)");
  }
  // The version each chunk's gradient in the pushes started from now on was computed from (one
  // per chunk of the layout, borrowed until the next call; empty = the version of the chunk's
  // last completed pull). For a caller that computes on older weights than it has received.
  virtual void SetPushVersions(std::span<const int64_t> versions) { (void)versions; }
  // The gradient cast to the push codec's 16 bits by the worker's device (one per float of the
  // layout, borrowed until the next call; engine::Net::grads16()), which the pushes started from
  // now on send for every chunk but a factored tensor's, instead of `grads`; empty = none. A
  // channel that cannot send it refuses a non-empty one (FailedPrecondition).
  virtual Status SetPushCast(std::span<const uint16_t> cast) {
    if (cast.empty()) return Status::Ok();
    return FailedPrecondition("this parameter channel cannot send gradients cast on the device");
  }
  // The version of chunk `chunk` in its last completed pull (-1 = none known), read after its
  // WaitPull and before the chunk is pulled again.
  virtual int64_t PulledVersion(int32_t chunk) const {
    (void)chunk;
    return -1;
  }
  // Waits until every started push not yet waited is acknowledged; accumulates staleness into
  // `info`.
  virtual Status WaitPushes(PushInfo* info) = 0;
  // EASGD: sends α(x_worker − x_center) for every chunk to its server, which adds it to the
  // center, and waits for the acknowledgements. Channels without EASGD refuse.
  virtual Status PushElastic(int64_t clock, std::span<const float> diff, PushInfo* info) {
    (void)clock, (void)diff, (void)info;
    return FailedPrecondition("this parameter channel does not do EASGD exchanges");
  }
  // The worker finished iteration `clock` (sync/ssp accounting, heartbeats).
  virtual Status Clock(int64_t clock) = 0;
  // The worker leaves the job (training done). Other workers are no longer waited for it.
  virtual Status Leave() = 0;
  // The wire spans of the requests waited (WaitPull, Pull, WaitPushes) since the last call, and
  // forgets them. A channel that does not measure returns none.
  virtual std::vector<WireSpan> TakeWireSpans() { return {}; }
};

}  // namespace downpour::worker
