// rate_limiter.cc — see rate_limiter.h.
#include "common/rate_limiter.h"

#include <algorithm>
#include <cmath>

namespace downpour {

LinkPacer::LinkPacer(double gbps, Clock::duration burst) : gbps_(gbps), ns_per_byte_(8.0 / gbps), burst_(burst) {}

LinkPacer::Clock::duration LinkPacer::Duration(size_t bytes) const {
  return std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double, std::nano>(static_cast<double>(bytes) * ns_per_byte_));
}

LinkPacer::Clock::time_point LinkPacer::ReserveAt(size_t bytes, Clock::time_point now) {
  const Clock::duration d = Duration(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  last_finish_ = std::max(last_finish_, now - burst_) + d;
  return last_finish_;
}

LinkPacer::Clock::time_point LinkPacer::BusyUntil() {
  std::lock_guard<std::mutex> lock(mu_);
  return last_finish_;
}

}  // namespace downpour
