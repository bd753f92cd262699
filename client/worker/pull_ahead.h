// pull_ahead.h — the next step's weights, pulled chunk by chunk as this step's pushes go out,
// and taken into the net layer by layer (docs/architecture.md "One training step in a worker").
//
// During backward of step u, each chunk's pull for the next step is started right after its
// push, on the same link, so the server serves it after applying that push. Forward of a later
// step takes the chunk into the net before the first layer that reads it.
//
// `lag` bounds how far a step's weights may be behind this worker's own pushes:
//  * lag 0: forward of step u+1 waits for the pulls started in step u: its weights hold every
//    push of this worker (sync and ssp, whose servers bound staleness by clocks; the overlap of
//    a pull with backward and the next forward is all that is gained). Pulls write the net's
//    weights directly: a chunk is pulled only once its tensor is final (its layer's backward,
//    which reads the weights, is over), and read only after its pull was waited.
//  * lag k >= 1 (async): step u computes on the newest weights that have arrived, waiting only
//    when a chunk's weights would lack a push of step u-1-k or earlier. Pulls land in a staging
//    copy of the weights (the net may be reading the chunk meanwhile) and are copied in at the
//    layer's forward. One pull per chunk is in flight: a chunk pushed while its previous pull is
//    still out is pulled again when that one has landed.
//
// Ownership: borrows the channel, the layout, the layer map and the net's weights (all must
// outlive it); owns the staging copy. Pulls still in flight are waited for by the destructor (the
// channel writes into the staging copy until then). Thread-safety: one thread (the training thread).
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <vector>

#include "client/engine/net.h"
#include "client/worker/param_channel.h"
#include "common/layout.h"
#include "common/status.h"

namespace downpour::worker {

// Per layer of `net`: the chunks of `layout` its parameter tensors live in, ascending.
std::vector<std::vector<int32_t>> ChunksByLayer(const engine::Net& net, const ParamLayout& layout);

class PullAhead {
 public:
  // `weights`: the net's weights (all parameters, layout order); `layer_chunks`: ChunksByLayer.
  // `weights16` (lag 0 only; empty = none): pull into the net's 16-bit weights instead
  // (ParamChannel::StartPull16, engine::Net::params16), which its device widens.
  PullAhead(ParamChannel* channel, const ParamLayout& layout, const std::vector<std::vector<int32_t>>& layer_chunks,
            std::span<float> weights, int lag, std::span<uint16_t> weights16 = {});
  ~PullAhead();
  PullAhead(const PullAhead&) = delete;
  PullAhead& operator=(const PullAhead&) = delete;

  // A whole pull wrote the weights before step `step`: every chunk holds all earlier pushes.
  void Reset(int64_t step);
  // Whether the last step started the next step's pulls (so no whole pull is needed).
  bool active() const { return active_; }

  // Step `step` begins; with `pull_next` its pushes are followed by pulls for the next step,
  // which carry `next_clock`.
  void BeginStep(int64_t step, int64_t next_clock, bool pull_next);
  // Forward is about to run `layer`: takes in what has arrived for its chunks and waits for
  // what the lag requires.
  Status BeforeForward(int layer);
  // Backward made tensor `tensor` final.
  void TensorFinal(int tensor);
  // These chunks were pushed: start their next pulls (those whose tensors are final).
  Status Pushed(std::span<const int32_t> chunk_ids);
  // Backward is over and every chunk was pushed: start the pulls still held back.
  Status EndBackward();
  // Waits for every pull in flight (before a pull of the same chunks elsewhere, or the end); what
  // landed is taken in at the next forward.
  Status WaitInFlight();
  // Versions of the pulls landed since the last call; false when none landed.
  bool TakeInfo(PullInfo* info);
  // Per chunk, the version of the weights the net holds (what a gradient is computed from, which
  // with a lag is not the last pulled); stable storage, valid while this object lives.
  std::span<const int64_t> held_versions() const { return held_version_; }

 private:
  struct Flight {
    PullHandle handle = 0;
    int64_t step = 0;  // the step whose pushes these weights follow
    std::vector<int32_t> chunks;
  };
  bool staged() const { return lag_ > 0; }
  Status Start(const std::vector<int32_t>& chunk_ids, int64_t step, int64_t clock);
  Status Land(uint64_t flight);
  void TakeIn(int32_t chunk);

  ParamChannel* channel_;
  const ParamLayout& layout_;
  const std::vector<std::vector<int32_t>>& layer_chunks_;
  std::span<float> weights_;
  std::span<uint16_t> weights16_;
  int lag_;
  std::vector<float> staging_;  // lag >= 1: where pulls land

  // Per chunk.
  std::vector<uint64_t> in_flight_;  // the flight pulling it, 0 = none
  std::vector<bool> landed_;         // landed in staging, not yet taken in
  std::vector<int64_t> landed_step_;
  std::vector<int64_t> held_;        // the net's weights hold this worker's pushes through this step
  std::vector<int64_t> held_version_, landed_version_;  // the servers' versions of those weights
  std::vector<int64_t> want_;        // pushed while its pull was out: pull again for this step, -1 = no
  std::vector<int64_t> want_clock_;
  std::vector<bool> pulled_;         // this step's push of it was followed by a pull (or a want)
  std::vector<int32_t> waiting_;     // pushed, its tensor not final yet
  std::vector<bool> tensor_final_;

  std::map<uint64_t, Flight> flights_;
  uint64_t next_flight_ = 1;
  int64_t step_ = 0, next_clock_ = 0;
  bool pull_next_ = false, active_ = false;
  PullInfo info_;
  bool info_set_ = false;
};

}  // namespace downpour::worker
