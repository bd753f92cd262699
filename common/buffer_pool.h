// buffer_pool.h — large scratch buffers handed out again once nobody holds them.
//
// A shard's loop thread makes a fresh multi-MiB buffer for every factor chunk it expands and for
// every chunk of an fp16 / bf16 pull reply. Allocating them per message cost a server a large
// share of its CPU in a factored AlexNet job with fp16 pulls: zero-filling each buffer, and the
// page faults and munmaps of malloc's thread arenas (perf, bench/RESULTS.md §11.5.5). A BufferPool
// keeps such buffers and hands one out again once the pool holds the only reference to it:
// a frame that borrows it (Frame::Borrow with the shared_ptr as keepalive) keeps it out of the
// pool until the transport and the handler are done with it, on whatever thread they release it.
//
// Thread-safety: Take is called by one thread (the owner's); the buffers' references may be
// released on any thread. Bounded: the buffers kept hold at most max_elements elements together
// (a shard: its own weights' count); when every kept buffer is held and another would pass the
// bound, Take allocates one for the caller alone, freed with its last reference.
#pragma once

#include <atomic>
#include <cstddef>
#include <memory>
#include <vector>

namespace downpour {

template <typename T>
class BufferPool {
 public:
  explicit BufferPool(size_t max_elements) : max_elements_(max_elements) {}

  // At least n elements, not initialized, that nobody but the caller and this pool holds.
  std::shared_ptr<T[]> Take(size_t n) {
    Block* smaller = nullptr;
    for (Block& b : blocks_) {
      if (b.data.use_count() != 1) continue;  // a frame still reads it
      // use_count() is a relaxed load: the fence orders the last holder's reads of the buffer
      // (before its release decrement) before the caller's writes.
      std::atomic_thread_fence(std::memory_order_acquire);
      if (b.n >= n) return b.data;
      if (smaller == nullptr) smaller = &b;
    }
    const size_t freed = smaller != nullptr ? smaller->n : 0;
    if (elements_ - freed + n > max_elements_) return std::shared_ptr<T[]>(new T[n]);
    if (smaller == nullptr) smaller = &blocks_.emplace_back();
    smaller->data.reset();  // the smaller buffer goes before its replacement comes
    smaller->data = std::shared_ptr<T[]>(new T[n]);
    elements_ = elements_ - freed + n;
    smaller->n = n;
    return smaller->data;
  }

  // Buffers kept, and the elements they hold together (<= max_elements).
  size_t blocks() const { return blocks_.size(); }
  size_t elements() const { return elements_; }

 private:
  struct Block {
    std::shared_ptr<T[]> data;
    size_t n = 0;
  };
  size_t max_elements_;
  size_t elements_ = 0;
  std::vector<Block> blocks_;
};

}  // namespace downpour
