// chunk_store_test.cc — ChunkStore (server/chunk_store.h): updates, added changes and first
// weights change the loop's view at once and the floats on the chunk's lane; a pull's read sees
// exactly the work posted before it; a borrowed reply keeps its floats while an update writes a
// copy; f16 and shared-region reads; a snapshot restores into another store whole.
#include "server/chunk_store.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <future>
#include <memory>
#include <vector>

#include "common/grad_codec.h"
#include "common/solver/lr_policy.h"

namespace downpour {
namespace {

// w += grad_scale · g, state += 1: exact in floats, so the tests compare with ==.
class CountingRule final : public UpdateRule {
 public:
  std::string_view name() const override { return "counting"; }
  float initial_state() const override { return 7.0f; }
  void Apply(const UpdateParams& p, std::span<const float> g, std::span<float> w,
             std::span<float> state) const override {
    for (size_t i = 0; i < w.size(); ++i) {
      w[i] += p.grad_scale * g[i];
      state[i] += 1.0f;
    }
  }
};

class ChunkStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(
        ParamLayout::Build({{"w", {6, 5}, 1.0f, 1.0f}, {"b", {6}, 2.0f, 0.0f}, {"v", {17}, 1.0f, 1.0f}}, 2, 8, &layout_)
            .ok());
  }
  std::unique_ptr<ChunkStore> Make(int lanes, int push_every = 1) {
    ChunkStoreOptions o;
    o.server_id = 0;
    o.rule = std::make_shared<CountingRule>();
    o.lanes = lanes;
    o.push_every = push_every;
    return std::make_unique<ChunkStore>(layout_, o);
  }
  static std::vector<float> Floats(const Frame& f) {
    std::vector<float> v(f.size() / sizeof(float));
    std::memcpy(v.data(), f.data(), f.size());
    return v;
  }
  ParamLayout layout_;
};

TEST_F(ChunkStoreTest, OwnsTheLayoutsChunksOfItsServerWithTheRulesInitialState) {
  auto store = Make(2);
  const auto mine = layout_.ServerChunks(0);
  ASSERT_EQ(store->owned(), std::vector<int32_t>(mine.begin(), mine.end()));
  for (int l = 0; l < store->size(); ++l) {
    EXPECT_EQ(store->local_of(store->id(l)), l);
    EXPECT_EQ(store->count(l), layout_.chunk(store->id(l)).count);
    EXPECT_FALSE(store->initialized(l));
    EXPECT_EQ(store->state(l), std::vector<float>(static_cast<size_t>(store->count(l)), 7.0f));
  }
  for (int32_t id : layout_.ServerChunks(1)) EXPECT_EQ(store->local_of(id), -1);
  EXPECT_EQ(store->local_of(-1), -1);
  EXPECT_EQ(store->local_of(layout_.num_chunks()), -1);
}

TEST_F(ChunkStoreTest, ApplyAddAndInitChangeTheViewNowAndTheFloatsOnTheLanes) {
  auto store = Make(3, /*push_every=*/2);
  auto keep = std::make_shared<int>(0);
  std::vector<std::vector<float>> g;
  for (int l = 0; l < store->size(); ++l) g.emplace_back(static_cast<size_t>(store->count(l)), float(l + 1));
  for (int l = 0; l < store->size(); ++l) {
    std::vector<float> w0(static_cast<size_t>(store->count(l)), 100.0f);
    EXPECT_TRUE(store->Init(l, w0.data(), nullptr));  // read during the call only: runs now
    EXPECT_FALSE(store->Init(l, g[static_cast<size_t>(l)].data(), keep)) << "the first weights win";
    store->Apply(l, g[static_cast<size_t>(l)].data(), 2.0f, 1.0f, /*gradients=*/3, keep);
    store->Add(l, g[static_cast<size_t>(l)].data(), /*iters=*/5, keep);
    EXPECT_EQ(store->version(l), 2);
    EXPECT_EQ(store->iter(l), ScheduleIterations(3, 2) + 5);
    EXPECT_TRUE(store->initialized(l));
  }
  EXPECT_EQ(store->updates(), 2 * store->size());
  store->Drain();
  for (int l = 0; l < store->size(); ++l) {
    const auto n = static_cast<size_t>(store->count(l));
    EXPECT_EQ(store->weights(l), std::vector<float>(n, 100.0f + 3.0f * float(l + 1))) << "chunk " << l;
    EXPECT_EQ(store->state(l), std::vector<float>(n, 8.0f)) << "Add keeps no state";
  }
}

TEST_F(ChunkStoreTest, AReadSeesTheWorkPostedBeforeItAndNoneAfter) {
  auto store = Make(2);
  const int l = 0;
  const auto n = static_cast<size_t>(store->count(l));
  auto keep = std::make_shared<int>(0);
  std::vector<float> one(n, 1.0f), ten(n, 10.0f), zero(n, 0.0f);
  store->Init(l, zero.data(), nullptr);
  std::promise<void> release;
  std::shared_future<void> gate = release.get_future().share();
  store->OnLane(l, keep, [gate] { gate.wait(); });  // the lane is busy until released
  store->Apply(l, one.data(), 1.0f, 1.0f, 1, keep);
  Frames payload;
  std::promise<void> read;
  const bool now = store->Read({l}, DType::kF32, nullptr, &payload, [&read] { read.set_value(); });
  store->Apply(l, ten.data(), 1.0f, 1.0f, 1, keep);
  EXPECT_EQ(store->version(l), 2);
  release.set_value();
  ASSERT_FALSE(now) << "its lane is busy: the lane reads it";
  ASSERT_EQ(read.get_future().wait_for(std::chrono::seconds(10)), std::future_status::ready);
  ASSERT_EQ(payload.size(), 1u);
  EXPECT_EQ(Floats(payload[0]), one) << "after the update posted before, before the one posted after";
  store->Drain();
  EXPECT_EQ(store->weights(l), std::vector<float>(n, 11.0f));
  EXPECT_EQ(Floats(payload[0]), one) << "the reply's buffer is not written by a later update";
}

TEST_F(ChunkStoreTest, ABorrowedReplyKeepsItsFloatsAcrossUpdatesAndF16IsConverted) {
  auto store = Make(1);
  const int l = 1;
  const auto n = static_cast<size_t>(store->count(l));
  std::vector<float> w0(n), g(n, 0.5f);
  for (size_t i = 0; i < n; ++i) w0[i] = float(i) + 0.25f;
  store->Init(l, w0.data(), nullptr);
  Frames f32, f16;
  ASSERT_TRUE(store->Read({l}, DType::kF32, nullptr, &f32, [] {})) << "an idle lane: read now";
  ASSERT_TRUE(store->Read({l}, DType::kF16, nullptr, &f16, [] {}));
  const std::byte* borrowed = f32[0].data();
  for (int k = 0; k < 3; ++k) store->Apply(l, g.data(), 1.0f, 1.0f, 1, nullptr);
  EXPECT_EQ(Floats(f32[0]), w0) << "copy-on-write: the update went to another buffer";
  EXPECT_NE(static_cast<const void*>(store->weights(l).data()), static_cast<const void*>(borrowed));
  ASSERT_EQ(f16[0].size(), n * sizeof(uint16_t));
  std::vector<float> widened(n);
  HalfToFloats(reinterpret_cast<const uint16_t*>(f16[0].data()), widened);
  EXPECT_EQ(widened, w0) << "these values are exact in f16";
  for (size_t i = 0; i < n; ++i) EXPECT_EQ(store->weights(l)[i], w0[i] + 1.5f);
}

TEST_F(ChunkStoreTest, ARegionReadFillsThePullAreaAtTheShareOffsets) {
  auto store = Make(2);
  std::unique_ptr<SharedRegion> made;
  ASSERT_TRUE(SharedRegion::Create("chunk-store-test", store->share().region_bytes(), &made).ok());
  std::shared_ptr<SharedRegion> region(std::move(made));
  std::vector<int> all;
  for (int l = 0; l < store->size(); ++l) {
    std::vector<float> w(static_cast<size_t>(store->count(l)), float(10 * l + 1));
    store->Init(l, w.data(), nullptr);
    all.push_back(l);
  }
  Frames payload;
  ASSERT_TRUE(store->Read(all, DType::kF32, region, &payload, [] {}));
  EXPECT_TRUE(payload.empty()) << "a region reply carries no frames";
  const auto* pull_area = reinterpret_cast<const float*>(region->payload()) + store->share().floats;
  for (int l : all) {
    const float* at = pull_area + store->share().offset[static_cast<size_t>(store->id(l))];
    for (int64_t i = 0; i < store->count(l); ++i) EXPECT_EQ(at[i], float(10 * l + 1)) << "chunk " << l;
  }
}

TEST_F(ChunkStoreTest, ASnapshotRestoresIntoAnotherStoreWhole) {
  auto a = Make(2);
  auto keep = std::make_shared<int>(0);
  for (int l = 0; l < a->size(); ++l) {
    if (l == 1) continue;  // one chunk never initialised
    std::vector<float> w(static_cast<size_t>(a->count(l)), float(l)), g(static_cast<size_t>(a->count(l)), 0.5f);
    a->Init(l, w.data(), nullptr);
    for (int k = 0; k <= l; ++k) a->Apply(l, g.data(), 1.0f, 1.0f, 1, nullptr);
  }
  std::vector<ShardCheckpoint::Chunk> snap;
  a->Snapshot(&snap);
  ASSERT_EQ(snap.size(), static_cast<size_t>(a->size()));
  ShardCheckpointExpect expect;
  a->Expect(&expect);
  EXPECT_EQ(expect.update_rule, "counting");
  EXPECT_EQ(expect.chunk_ids, a->owned());
  auto b = Make(3);
  b->Restore(&snap);
  b->Drain();
  for (int l = 0; l < a->size(); ++l) {
    EXPECT_EQ(b->version(l), a->version(l));
    EXPECT_EQ(b->iter(l), a->iter(l));
    EXPECT_EQ(b->initialized(l), a->initialized(l));
    EXPECT_EQ(b->weights(l), a->weights(l));
    EXPECT_EQ(b->state(l), a->state(l));
  }
}

}  // namespace
}  // namespace downpour
