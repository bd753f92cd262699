// apply_lanes.h — ApplyLanes, the threads that apply a shard's updates: each lane is one thread
// that owns a fixed set of the shard's chunks (LaneOf, dealt by size so lanes carry equal floats)
// and runs the work posted for them in the order it was posted.
//
// The shard's loop posts a chunk's work (an update, a model move, a pull reply's read of the
// weights) to that chunk's lane and goes on to its next message: the chunks of one push, and the
// pushes of different workers, apply on every lane at once, and a chunk's work still happens in
// message order, so the weights are float for float those of a serial loop and a pull posted
// after an update sees it whole (never half of it). The loop keeps every decision (validation,
// versions, the consistency policy, the log); a lane touches only its chunks' floats. A reader
// that is not a lane (a checkpoint, a test's snapshot) calls Drain first. docs/architecture.md
// "The server's parts and threads".
//
// Bounded: a lane holds at most max_queued_bytes of posted work (the bytes each post declares;
// at least one post always fits); Post waits, on the loop's thread, while its lane is full. So a
// server that applies slower than its links deliver pushes back on them through the transport's
// own bounds instead of buffering whole models.
//
// Thread-safety: Post, Drain and DrainLane from one thread at a time (the shard's loop, under the
// shard's lock); tasks must not call back into ApplyLanes. The destructor drains and joins.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace downpour {

class ApplyLanes {
 public:
  // `lanes` >= 1 threads; `chunk_elems`: the shard's chunks' sizes, by local index.
  ApplyLanes(int lanes, const std::vector<int64_t>& chunk_elems, size_t max_queued_bytes = size_t{128} << 20);
  ~ApplyLanes();
  ApplyLanes(const ApplyLanes&) = delete;
  ApplyLanes& operator=(const ApplyLanes&) = delete;

  int lanes() const { return static_cast<int>(lanes_.size()); }
  // The lane that owns local chunk `local`.
  int LaneOf(int local) const { return lane_of_[static_cast<size_t>(local)]; }
  // Runs `task` on the lane of `local` after everything posted there before; `bytes`: what it
  // keeps alive or touches, counted against the lane's bound.
  void Post(int local, size_t bytes, std::function<void()> task);
  // Returns once everything posted before the call (every lane; one lane) has run.
  void Drain();
  void DrainLane(int lane);
  // Nothing posted to `lane` is waiting or running: until the next Post to it, the poster may
  // touch that lane's chunks itself.
  bool Idle(int lane) const;
  // Nanoseconds the lanes spent running tasks, summed over lanes. Thread-safe.
  uint64_t busy_ns() const;
  // Nanoseconds Post waited for a full lane: the poster was bound by the lanes. Thread-safe.
  uint64_t post_wait_ns() const { return post_wait_ns_.load(std::memory_order_relaxed); }

 private:
  struct Lane {
    mutable std::mutex mu;
    std::condition_variable cv;        // work posted, or stopping (the lane waits on it)
    std::condition_variable progress;  // a task finished (Post and Drain wait on it)
    std::deque<std::pair<size_t, std::function<void()>>> queue;
    size_t queued_bytes = 0;
    bool running = false;  // a task taken off the queue is running
    bool stop = false;
    uint64_t busy_ns = 0;
    std::thread thread;
  };
  void Run(Lane* lane);

  std::vector<std::unique_ptr<Lane>> lanes_;
  std::vector<int> lane_of_;
  const size_t max_queued_bytes_;
  std::atomic<uint64_t> post_wait_ns_{0};
};

}  // namespace downpour
