// push_window.h — the pushes a worker has started and not yet seen acknowledged, by chunk, so
// that no step waits for acknowledgements it does not need (docs/architecture.md "One training
// step in a worker").
//
// A push reads its chunks' floats of the gradient buffer until it is acknowledged
// (param_channel.h). The next step overwrites a layer's gradients in that layer's backward, so
// only there must the previous step's pushes of that layer's chunks be acknowledged: WaitFor
// before the layer's backward, WaitThrough(step) when a step's progress is to be saved (its
// pushes all acknowledged), WaitAll before anything that needs every ack (leaving, a buffer
// reused whole).
//
// Ownership: borrows the channel (must outlive the window). Thread-safety: one thread (the
// training thread).
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <vector>

#include "client/worker/param_channel.h"
#include "common/status.h"

namespace downpour::worker {

class PushWindow {
 public:
  PushWindow(ParamChannel* channel, int num_chunks);

  // Push `handle` of step `step` reads `chunk_ids`.
  void Started(PushHandle handle, int64_t step, std::span<const int32_t> chunk_ids);
  // Waits for every pending push reading any of `chunk_ids`; the acks' staleness goes to `info`.
  // The first error is returned after every wait was made (each push is waited once).
  Status WaitFor(std::span<const int32_t> chunk_ids, PushInfo* info);
  // Waits for every pending push of steps <= `step`.
  Status WaitThrough(int64_t step, PushInfo* info);
  Status WaitAll(PushInfo* info);
  bool empty() const { return pending_.empty(); }
  // Whether a pending push reads any of `chunk_ids`.
  bool Pending(std::span<const int32_t> chunk_ids) const;

 private:
  struct Push {
    int64_t step = 0;
    std::vector<int32_t> chunks;
  };
  Status Wait(PushHandle handle, PushInfo* info);

  ParamChannel* channel_;
  std::vector<PushHandle> chunk_push_;     // per chunk: the pending push reading it, 0 = none
  std::map<PushHandle, Push> pending_;  // started, not waited; handles ascend in start order
};

}  // namespace downpour::worker
