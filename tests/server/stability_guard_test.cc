// stability_guard_test.cc — StabilityGuard (server/stability_guard.h): the mean is over the last
// kWindow updates only; the warning comes once, when a full window's mean reaches max(4, live
// workers), and never with staleness_aware_lr on or during a replay.
#include "server/stability_guard.h"

#include <gtest/gtest.h>

namespace downpour {
namespace {

constexpr int kWindow = StabilityGuard::kWindow;

TEST(StabilityGuard, TheMeanIsOverTheLastWindowOnly) {
  StabilityGuard g(0, /*staleness_aware_lr=*/false, 0.01f);
  EXPECT_EQ(g.mean(), 0.0);
  g.Note(10, 100, false);
  g.Note(20, 100, false);
  EXPECT_EQ(g.mean(), 15.0);
  for (int i = 0; i < kWindow; ++i) g.Note(1, 100, false);
  EXPECT_EQ(g.mean(), 1.0) << "the two early values left the window";
}

TEST(StabilityGuard, WarnsOnceWhenAFullWindowsMeanReachesTheBound) {
  StabilityGuard g(0, false, 0.01f);
  int warnings = 0;
  for (int i = 0; i < kWindow - 1; ++i) warnings += g.Note(50, 2, false) ? 1 : 0;
  EXPECT_EQ(warnings, 0) << "the window is not full yet";
  for (int i = 0; i < 3 * kWindow; ++i) warnings += g.Note(50, 2, false) ? 1 : 0;
  EXPECT_EQ(warnings, 1);

  StabilityGuard many(0, false, 0.01f);
  for (int i = 0; i < 2 * kWindow; ++i) EXPECT_FALSE(many.Note(6, 8, false)) << "6 < 8 live workers: healthy";
  StabilityGuard low(0, false, 0.01f);
  for (int i = 0; i < 2 * kWindow; ++i) EXPECT_FALSE(low.Note(3, 1, false)) << "below 4: quiet";
}

TEST(StabilityGuard, QuietWithStalenessAwareLrAndDuringAReplay) {
  StabilityGuard aware(0, /*staleness_aware_lr=*/true, 0.01f);
  for (int i = 0; i < 2 * kWindow; ++i) EXPECT_FALSE(aware.Note(50, 1, false));
  StabilityGuard replay(0, false, 0.01f);
  for (int i = 0; i < 2 * kWindow; ++i) EXPECT_FALSE(replay.Note(50, 1, /*replaying=*/true));
  EXPECT_TRUE(replay.Note(50, 1, false)) << "live traffic after the replay";
}

}  // namespace
}  // namespace downpour
