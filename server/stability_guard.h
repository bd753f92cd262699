// stability_guard.h — StabilityGuard, a shard's warning that its gradients are too stale for its
// learning rate: once the mean staleness of its last kWindow chunk updates reaches
// max(4, live workers) (a healthy async run of W workers shows about W-1), one warning line
// names the remedies, consistency.staleness_aware_lr and solver.base_lr. It stays quiet with
// staleness_aware_lr on (the lr already shrinks with staleness) and during a replay.
//
// Thread-safety: none; the shard calls it under its lock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace downpour {

class StabilityGuard {
 public:
  static constexpr int kWindow = 200;  // chunk updates averaged

  StabilityGuard(int server_id, bool staleness_aware_lr, float base_lr)
      : server_id_(server_id), staleness_aware_lr_(staleness_aware_lr), base_lr_(base_lr) {}

  // One chunk update of `staleness` versions, with `live_workers` in the run. True when this
  // call wrote the warning (at most once per guard).
  bool Note(int64_t staleness, int live_workers, bool replaying);
  // The mean over the last kWindow updates (fewer before that many); 0 before any.
  double mean() const;

 private:
  const int server_id_;
  const bool staleness_aware_lr_;
  const float base_lr_;
  std::vector<int64_t> ring_;  // the last kWindow values
  size_t next_ = 0;            // the oldest once the ring is full
  int64_t sum_ = 0;
  bool warned_ = false;
};

}  // namespace downpour
