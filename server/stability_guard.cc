// stability_guard.cc — see stability_guard.h.
#include "server/stability_guard.h"

#include <spdlog/spdlog.h>

#include <algorithm>

namespace downpour {

bool StabilityGuard::Note(int64_t staleness, int live_workers, bool replaying) {
  if (ring_.size() < static_cast<size_t>(kWindow)) {
    ring_.push_back(staleness);
  } else {
    sum_ -= ring_[next_];
    ring_[next_] = staleness;
    next_ = (next_ + 1) % ring_.size();
  }
  sum_ += staleness;
  if (warned_ || replaying || staleness_aware_lr_ || ring_.size() < static_cast<size_t>(kWindow)) return false;
  const double m = mean();
  if (m < 4.0 || m < static_cast<double>(live_workers)) return false;
  warned_ = true;
  spdlog::warn(
      "server {}: mean staleness over the last {} updates is {:.1f} versions with {} live workers (a healthy "
      "async run of W workers shows about W-1): gradients this stale can make training diverge; set "
      "consistency.staleness_aware_lr = true or lower solver.base_lr (now {})",
      server_id_, ring_.size(), m, live_workers, base_lr_);
  return true;
}

double StabilityGuard::mean() const {
  return ring_.empty() ? 0.0 : static_cast<double>(sum_) / static_cast<double>(ring_.size());
}

}  // namespace downpour
