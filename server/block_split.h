// block_split.h — BlockSplit, element-wise work over [0, n) split into blocks of 64Ki elements
// across the calling thread and helper threads that sleep between calls.
//
// The shard's loop checks a push's gradients for non-finite values with it (over
// cluster.server_threads threads) before anything else may touch them. OpenMP did this before;
// its idle threads spin after each region and took the CPU the apply lanes needed on a host with
// few cores (bench/RESULTS.md §10.3). The blocks are disjoint and each element is computed alone,
// so the result is the same whatever the thread count.
//
// Thread-safety: For from one thread at a time; f must be safe to call concurrently on disjoint
// blocks.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace downpour {

class BlockSplit {
 public:
  static constexpr int64_t kBlock = int64_t{1} << 16;

  explicit BlockSplit(int threads);  // the caller plus threads − 1 helpers; threads >= 1
  ~BlockSplit();
  BlockSplit(const BlockSplit&) = delete;
  BlockSplit& operator=(const BlockSplit&) = delete;

  // f(begin, end) over every block of [0, n); returns when all have run. One call f(0, n) with
  // no helpers or under two blocks.
  void For(int64_t n, const std::function<void(int64_t, int64_t)>& f);

 private:
  void Help();
  void RunBlocks();

  std::mutex mu_;
  std::condition_variable start_, done_;
  const std::function<void(int64_t, int64_t)>* f_ = nullptr;  // the current call's
  int64_t n_ = 0;
  std::atomic<int64_t> next_{0};  // the next block to take
  uint64_t generation_ = 0;       // calls so far: a helper runs each once
  int busy_ = 0;                  // helpers still in the current call
  bool stop_ = false;
  std::vector<std::thread> helpers_;
};

}  // namespace downpour
