// delivery.cc — see delivery.h.
#include "client/ps/delivery.h"

#include <algorithm>

namespace downpour {

bool IncarnationTracker::Observe(uint64_t incarnation) {
  if (incarnation == 0 || incarnation == current_) return false;
  if (current_ == 0) {  // the first one this link hears
    current_ = incarnation;
    return false;
  }
  if (std::find(past_.begin(), past_.end(), incarnation) != past_.end()) {
    return false;  // a late reply of a process that has since been replaced
  }
  past_.push_back(current_);
  if (past_.size() > kRemembered) past_.pop_front();
  current_ = incarnation;
  return true;
}

bool LogRefusals::Refuse(Clock::time_point now, Clock::duration cap, Clock::duration give_up) {
  if (count++ == 0) since = now;
  if (now - since >= give_up) return false;
  const int doublings = std::min(count - 1, 10);
  not_before = now + std::min<Clock::duration>(cap, std::chrono::milliseconds(50) * (1 << doublings));
  return true;
}

}  // namespace downpour
