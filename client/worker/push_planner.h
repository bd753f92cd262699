// push_planner.h — decides WHEN a gradient chunk can go on the wire during backward.
//
// Backward finishes parameter tensors one at a time, later layers first (Net's grad-ready
// callback). A layout chunk never straddles a tensor (common/layout.h), so a chunk is
// pushable as soon as the one tensor it covers is final. Sending every tensor on its own
// would make many tiny messages (biases are a few floats), so the planner collects ready
// chunks per server and releases a server's group when
//   * every chunk of that server is ready (nothing more will come this step), or
//   * the group holds at least `min_push_elems` floats (big enough to be worth a message),
// which keeps communication overlapped with the rest of backward (docs/architecture.md "One
// training step in a worker").
//
// Usage per push step: Reset(); then OnTensorReady(t) for each final tensor, sending the
// groups it returns; after the last tensor every chunk has been released exactly once.
//
// Thread-safety: none; one planner per worker, used on the training thread (the callback
// runs inside Net::ForwardBackward on that thread). Holds a reference to the layout, which
// must outlive it.
#pragma once

#include <cstdint>
#include <vector>

#include "common/layout.h"

namespace downpour::worker {

struct PushGroup {
  int server = 0;                  // destination server
  std::vector<int32_t> chunk_ids;  // ascending chunk ids, all owned by `server`
  int64_t elems = 0;               // floats in the group
};

class PushPlanner {
 public:
  // min_push_elems: release threshold in floats (default 256Ki floats = 1 MiB); <= 0 means
  // "release every tensor's chunks at once" (the most overlap, the most messages).
  explicit PushPlanner(const ParamLayout& layout, int64_t min_push_elems = int64_t{1} << 18);

  // Starts a new step: nothing is ready, nothing released.
  void Reset();
  // Tensor `tensor` (index into layout.tensors()) is final. Returns the groups that became
  // releasable (possibly none). A tensor reported twice in one step is a broken invariant.
  std::vector<PushGroup> OnTensorReady(int tensor);
  // Releases whatever is still pending (e.g. tensors without a callback); empty normally.
  std::vector<PushGroup> Flush();
  // True when every chunk of the layout was released since Reset().
  bool AllReleased() const { return released_chunks_ == layout_.num_chunks(); }

 private:
  void MaybeRelease(int server, bool force, std::vector<PushGroup>* out);

  const ParamLayout& layout_;
  int64_t min_push_elems_;
  std::vector<std::vector<int32_t>> tensor_chunks_;  // per tensor: its chunk ids
  std::vector<int> server_total_chunks_;             // per server: chunks it owns
  // Per-step state.
  std::vector<bool> tensor_ready_;
  std::vector<int> server_ready_chunks_;      // per server: chunks ready so far
  std::vector<PushGroup> pending_;            // per server: ready but not released
  int released_chunks_ = 0;
};

}  // namespace downpour::worker
