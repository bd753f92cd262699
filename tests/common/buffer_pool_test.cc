// BufferPool (common/buffer_pool.h): a held buffer is never handed out again, a released one is,
// a larger request replaces a free smaller buffer, and the elements kept stay within the bound.
#include "common/buffer_pool.h"

#include <gtest/gtest.h>

#include <thread>

namespace downpour {
namespace {

TEST(BufferPool, HeldBuffersAreNeverHandedOutAgainReleasedOnesAre) {
  BufferPool<float> pool(100);
  std::shared_ptr<float[]> a = pool.Take(10), b = pool.Take(10);
  ASSERT_NE(a.get(), b.get());
  EXPECT_EQ(pool.blocks(), 2u);
  float* const first = a.get();
  a.reset();
  std::shared_ptr<float[]> c = pool.Take(8);  // a's buffer: free and large enough
  EXPECT_EQ(c.get(), first);
  EXPECT_EQ(pool.blocks(), 2u);
  EXPECT_EQ(pool.elements(), 20u);
}

TEST(BufferPool, AFreeSmallerBufferIsReplacedByALargerOne) {
  BufferPool<uint16_t> pool(100);
  pool.Take(10).reset();
  std::shared_ptr<uint16_t[]> big = pool.Take(40);
  EXPECT_EQ(pool.blocks(), 1u);
  EXPECT_EQ(pool.elements(), 40u);
}

TEST(BufferPool, BeyondTheBoundTheCallerGetsABufferOfItsOwn) {
  BufferPool<float> pool(25);
  std::shared_ptr<float[]> a = pool.Take(10), b = pool.Take(10);
  std::shared_ptr<float[]> c = pool.Take(10);  // 30 > 25: not kept
  EXPECT_EQ(pool.blocks(), 2u);
  EXPECT_EQ(pool.elements(), 20u);
  ASSERT_NE(c.get(), a.get());
  ASSERT_NE(c.get(), b.get());
  EXPECT_EQ(c.use_count(), 1);  // the pool does not hold it
  c.reset();
  // A free buffer too small, replaced by one past the bound: the free one stays, the caller's is
  // its own.
  a.reset();
  std::shared_ptr<float[]> d = pool.Take(20);
  EXPECT_EQ(d.use_count(), 1);
  EXPECT_LE(pool.elements(), 25u);
}

// A reference released on another thread (the transport's I/O thread) frees the buffer for the
// pool's thread.
TEST(BufferPool, AReferenceReleasedOnAnotherThreadFreesTheBuffer) {
  BufferPool<float> pool(100);
  std::shared_ptr<float[]> a = pool.Take(16);
  float* const p = a.get();
  for (int i = 0; i < 16; ++i) a[i] = static_cast<float>(i);
  std::thread t([held = std::move(a)]() mutable { held.reset(); });
  t.join();
  EXPECT_EQ(pool.Take(16).get(), p);
}

}  // namespace
}  // namespace downpour
