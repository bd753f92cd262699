#include "server/apply_lanes.h"

#include <algorithm>
#include <chrono>
#include <numeric>

#include "common/status.h"
#include "server/elapsed.h"

namespace downpour {

ApplyLanes::ApplyLanes(int lanes, const std::vector<int64_t>& chunk_elems, size_t max_queued_bytes)
    : max_queued_bytes_(max_queued_bytes) {
  DP_CHECK_GE(lanes, 1);
  // Largest chunk first onto the lane with the fewest floats so far: lanes carry equal work
  // whatever the mix of chunk sizes (a layout's last chunk of a tensor is short).
  std::vector<size_t> order(chunk_elems.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return chunk_elems[a] > chunk_elems[b]; });
  std::vector<int64_t> load(static_cast<size_t>(lanes), 0);
  lane_of_.assign(chunk_elems.size(), 0);
  for (size_t c : order) {
    const auto lightest = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    lane_of_[c] = static_cast<int>(lightest);
    load[lightest] += chunk_elems[c];
  }
  for (int i = 0; i < lanes; ++i) lanes_.push_back(std::make_unique<Lane>());
  for (auto& lane : lanes_) lane->thread = std::thread([this, l = lane.get()] { Run(l); });
}

ApplyLanes::~ApplyLanes() {
  for (auto& lane : lanes_) {
    {
      std::lock_guard<std::mutex> lock(lane->mu);
      lane->stop = true;
    }
    lane->cv.notify_one();
  }
  for (auto& lane : lanes_) lane->thread.join();
}

void ApplyLanes::Post(int local, size_t bytes, std::function<void()> task) {
  Lane& lane = *lanes_[static_cast<size_t>(LaneOf(local))];
  std::unique_lock<std::mutex> lock(lane.mu);
  const auto fits = [&] { return lane.queue.empty() || lane.queued_bytes + bytes <= max_queued_bytes_; };
  if (!fits()) {
    const auto t0 = std::chrono::steady_clock::now();
    lane.progress.wait(lock, fits);
    post_wait_ns_.fetch_add(static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                                      std::chrono::steady_clock::now() - t0)
                                                      .count()),
                            std::memory_order_relaxed);
  }
  lane.queue.emplace_back(bytes, std::move(task));
  lane.queued_bytes += bytes;
  lock.unlock();
  lane.cv.notify_one();
}

void ApplyLanes::DrainLane(int index) {
  Lane& lane = *lanes_[static_cast<size_t>(index)];
  std::unique_lock<std::mutex> lock(lane.mu);
  lane.progress.wait(lock, [&] { return lane.queue.empty() && !lane.running; });
}

bool ApplyLanes::Idle(int index) const {
  const Lane& lane = *lanes_[static_cast<size_t>(index)];
  std::lock_guard<std::mutex> lock(lane.mu);
  return lane.queue.empty() && !lane.running;
}

void ApplyLanes::Drain() {
  for (int i = 0; i < lanes(); ++i) DrainLane(i);
}

uint64_t ApplyLanes::busy_ns() const {
  uint64_t sum = 0;
  for (const auto& lane : lanes_) {
    std::lock_guard<std::mutex> lock(lane->mu);
    sum += lane->busy_ns;
  }
  return sum;
}

void ApplyLanes::Run(Lane* lane) {
  std::unique_lock<std::mutex> lock(lane->mu);
  while (true) {
    lane->cv.wait(lock, [&] { return lane->stop || !lane->queue.empty(); });
    if (lane->queue.empty()) return;  // stopping, and everything posted has run
    auto [bytes, task] = std::move(lane->queue.front());
    lane->queue.pop_front();
    lane->running = true;
    lock.unlock();
    const auto t0 = std::chrono::steady_clock::now();
    task();
    task = nullptr;  // what it kept alive goes before the lane says it is done
    const uint64_t ns = NanosSince(t0);
    lock.lock();
    lane->busy_ns += ns;
    lane->queued_bytes -= bytes;
    lane->running = false;
    lane->progress.notify_all();
  }
}

}  // namespace downpour
