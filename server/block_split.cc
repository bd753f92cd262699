#include "server/block_split.h"

#include <algorithm>

namespace downpour {

BlockSplit::BlockSplit(int threads) {
  for (int i = 1; i < threads; ++i) helpers_.emplace_back([this] { Help(); });
}

BlockSplit::~BlockSplit() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  start_.notify_all();
  for (auto& t : helpers_) t.join();
}

void BlockSplit::RunBlocks() {
  const int64_t blocks = (n_ + kBlock - 1) / kBlock;
  for (int64_t b = next_.fetch_add(1); b < blocks; b = next_.fetch_add(1)) {
    (*f_)(b * kBlock, std::min(n_, (b + 1) * kBlock));
  }
}

void BlockSplit::For(int64_t n, const std::function<void(int64_t, int64_t)>& f) {
  if (helpers_.empty() || n < 2 * kBlock) {
    f(0, n);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    f_ = &f;
    n_ = n;
    next_.store(0);
    busy_ = static_cast<int>(helpers_.size());
    ++generation_;
  }
  start_.notify_all();
  RunBlocks();
  std::unique_lock<std::mutex> lock(mu_);
  done_.wait(lock, [&] { return busy_ == 0; });  // no helper still reads f or n
}

void BlockSplit::Help() {
  uint64_t seen = 0;
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    start_.wait(lock, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
    lock.unlock();
    RunBlocks();
    lock.lock();
    if (--busy_ == 0) done_.notify_one();
  }
}

}  // namespace downpour
