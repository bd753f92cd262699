// apply_lanes_test.cc — ApplyLanes (server/apply_lanes.h): chunks dealt so lanes carry equal
// floats, each lane's work in the order it was posted, Drain waits for everything posted before
// it, and a full lane makes Post wait instead of queueing without bound.
#include "server/apply_lanes.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

namespace downpour {
namespace {

using namespace std::chrono_literals;

TEST(ApplyLanes, DealsChunksSoLanesCarryEqualFloats) {
  // 4 chunks of 100 and 4 of 10 on two lanes: 220 floats each.
  ApplyLanes lanes(2, {100, 10, 100, 10, 100, 10, 100, 10});
  int64_t load[2] = {0, 0};
  const int64_t sizes[] = {100, 10, 100, 10, 100, 10, 100, 10};
  for (int c = 0; c < 8; ++c) load[lanes.LaneOf(c)] += sizes[c];
  EXPECT_EQ(load[0], 220);
  EXPECT_EQ(load[1], 220);
  ApplyLanes one(1, {5, 6});
  EXPECT_EQ(one.LaneOf(0), 0);
  EXPECT_EQ(one.LaneOf(1), 0);
}

TEST(ApplyLanes, EachChunksWorkRunsInPostedOrderAndDrainWaitsForIt) {
  constexpr int kChunks = 6, kPosts = 2000;
  ApplyLanes lanes(3, std::vector<int64_t>(kChunks, 1));
  std::vector<std::vector<int>> seen(kChunks);  // each written only by its chunk's lane
  for (int k = 0; k < kPosts; ++k) {
    for (int c = 0; c < kChunks; ++c) lanes.Post(c, 1, [&seen, c, k] { seen[static_cast<size_t>(c)].push_back(k); });
  }
  lanes.Drain();
  for (int c = 0; c < kChunks; ++c) {
    ASSERT_EQ(seen[static_cast<size_t>(c)].size(), static_cast<size_t>(kPosts)) << "chunk " << c;
    for (int k = 0; k < kPosts; ++k) EXPECT_EQ(seen[static_cast<size_t>(c)][static_cast<size_t>(k)], k);
  }
  EXPECT_GT(lanes.busy_ns(), 0u);
}

TEST(ApplyLanes, AFullLaneMakesPostWait) {
  ApplyLanes lanes(1, {1}, /*max_queued_bytes=*/100);
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;
  lanes.Post(0, 60, [&] {  // runs, and holds the lane until opened
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return open; });
  });
  lanes.Post(0, 40, [] {});  // 100 bytes queued: still fits
  std::atomic<bool> posted{false};
  std::thread third([&] {
    lanes.Post(0, 10, [] {});  // 110 > 100: waits
    posted = true;
  });
  std::this_thread::sleep_for(50ms);
  EXPECT_FALSE(posted.load());
  {
    std::lock_guard<std::mutex> lock(mu);
    open = true;
  }
  cv.notify_all();
  third.join();
  EXPECT_TRUE(posted.load());
  lanes.Drain();
}

TEST(ApplyLanes, OnePostLargerThanTheBoundStillRuns) {
  ApplyLanes lanes(2, {1, 1}, /*max_queued_bytes=*/8);
  std::atomic<int> ran{0};
  lanes.Post(1, 1000, [&] { ++ran; });
  lanes.Post(1, 1000, [&] { ++ran; });
  lanes.Drain();
  EXPECT_EQ(ran.load(), 2);
}

}  // namespace
}  // namespace downpour
