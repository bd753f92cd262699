// sessions_test.cc — a shard's memory of its workers' sessions (server/sessions.h) on its own:
// duplicate windows bounded and round-tripped through a checkpoint's form; the fence takes only
// sessions registered before its cutoff and leaves a restarted process in.
#include "server/sessions.h"

#include <gtest/gtest.h>

namespace downpour {
namespace {

using namespace std::chrono_literals;

TEST(DuplicateWindows, ARequestIsSeenOnceRememberedAndTheWindowsAreBounded) {
  DuplicateWindows d(2);
  EXPECT_FALSE(d.Seen(0, 7, 1));
  d.Remember(0, 7, 1);
  EXPECT_TRUE(d.Seen(0, 7, 1));
  EXPECT_FALSE(d.Seen(0, 8, 1)) << "another session of the same worker";
  EXPECT_FALSE(d.Seen(1, 7, 1)) << "another worker";
  d.Remember(0, 0, 5);  // session 0: never remembered
  EXPECT_FALSE(d.Seen(0, 0, 5));
  d.Remember(5, 7, 1);  // a worker id out of range: ignored
  EXPECT_FALSE(d.Seen(5, 7, 1));
  for (uint64_t id = 2; id <= DuplicateWindows::kIdsPerSession + 1; ++id) d.Remember(0, 7, id);
  EXPECT_FALSE(d.Seen(0, 7, 1)) << "the oldest id left the window";
  EXPECT_TRUE(d.Seen(0, 7, 2));
  for (uint64_t s = 100; s < 100 + DuplicateWindows::kSessions; ++s) d.Remember(0, s, 1);
  EXPECT_FALSE(d.Seen(0, 7, 2)) << "the oldest session left";
  // Through a checkpoint's form and back: the same answers.
  DuplicateWindows back(2);
  back.Import(d.Export());
  for (uint64_t s = 100; s < 100 + DuplicateWindows::kSessions; ++s) EXPECT_TRUE(back.Seen(0, s, 1));
  EXPECT_FALSE(back.Seen(0, 7, 2));
  EXPECT_EQ(back.Export().size(), 2u);
}

TEST(SessionFence, OnlySessionsRegisteredBeforeTheCutoffAreFenced) {
  SessionFence f(2);
  const auto t0 = SessionFence::Clock::now();
  f.Registered(0, 11, t0);            // the process that went silent
  f.Registered(0, 12, t0 + 10s);      // a restarted one, registered after the cutoff
  f.Registered(1, 13, t0);
  const std::vector<uint64_t> fenced = f.Fence(0, t0 + 5s);
  EXPECT_EQ(fenced, std::vector<uint64_t>{11});
  EXPECT_TRUE(f.Removed(0, 11));
  EXPECT_FALSE(f.Removed(0, 12));
  EXPECT_FALSE(f.Removed(1, 13)) << "another worker";
  EXPECT_FALSE(f.Removed(0, 0));
  EXPECT_TRUE(f.Fence(0, t0 + 5s).empty()) << "fenced once";
  EXPECT_TRUE(f.Fence(7, t0).empty()) << "a worker id out of range";
}

TEST(PullStepOrder, AStepsPullsShareTheKeyOfItsFirstPull) {
  PullStepOrder order(2);
  EXPECT_EQ(order.Key(0, 5, 100), 100u);
  EXPECT_EQ(order.Key(0, 5, 130), 100u) << "the same step: its first pull's key";
  EXPECT_EQ(order.Key(1, 5, 110), 110u) << "each worker its own";
  EXPECT_EQ(order.Key(0, 6, 140), 140u) << "the next step starts a new key";
  EXPECT_EQ(order.Key(0, 5, 150), 150u) << "a step pulled again after another is a new step";
  EXPECT_EQ(order.Key(2, 5, 160), UINT64_MAX) << "an id out of range: unordered";
  EXPECT_EQ(order.Key(-1, 5, 160), UINT64_MAX);
}

}  // namespace
}  // namespace downpour
