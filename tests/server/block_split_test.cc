// block_split_test.cc — BlockSplit (server/block_split.h): every block runs exactly once, at any
// thread count and size, call after call, and small work stays on the caller.
#include "server/block_split.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace downpour {
namespace {

TEST(BlockSplit, EveryElementIsVisitedOnceWhateverTheThreadCount) {
  for (int threads : {1, 2, 3, 8}) {
    BlockSplit split(threads);
    for (int64_t n : {int64_t{0}, int64_t{5}, BlockSplit::kBlock * 2 - 1, BlockSplit::kBlock * 7 + 13}) {
      for (int call = 0; call < 20; ++call) {
        std::vector<std::atomic<int>> seen(static_cast<size_t>(n));
        split.For(n, [&](int64_t b, int64_t e) {
          for (int64_t i = b; i < e; ++i) seen[static_cast<size_t>(i)].fetch_add(1);
        });
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(seen[static_cast<size_t>(i)].load(), 1) << threads << " " << n << " " << i;
      }
    }
  }
}

TEST(BlockSplit, UnderTwoBlocksRunsOnTheCaller) {
  BlockSplit split(4);
  const auto me = std::this_thread::get_id();
  int calls = 0;
  split.For(BlockSplit::kBlock * 2 - 1, [&](int64_t b, int64_t e) {
    EXPECT_EQ(std::this_thread::get_id(), me);
    EXPECT_EQ(b, 0);
    EXPECT_EQ(e, BlockSplit::kBlock * 2 - 1);
    ++calls;
  });
  EXPECT_EQ(calls, 1);
}

}  // namespace
}  // namespace downpour
