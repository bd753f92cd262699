// layout_test.cc — the parameter layout: balance, coverage, determinism, hash.
#include <gtest/gtest.h>

#include <vector>

#include "common/layout.h"

namespace downpour {
namespace {

ParamLayout MustBuild(std::vector<TensorSpec> specs, int servers, int64_t chunk = kDefaultChunkElems) {
  ParamLayout l;
  Status s = ParamLayout::Build(std::move(specs), servers, chunk, &l);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return l;
}

// Every float of the flat space belongs to exactly one chunk; chunks are contiguous, within
// one tensor and one server, and no larger than chunk_elems.
void ExpectExactCover(const ParamLayout& l) {
  int64_t pos = 0;
  for (const Chunk& c : l.chunks()) {
    ASSERT_EQ(c.flat_offset, pos) << "chunk " << c.id;
    ASSERT_GE(c.count, 1);
    ASSERT_LE(c.count, l.chunk_elems());
    const int64_t t0 = l.tensor_flat_offset(c.tensor);
    const int64_t t1 = l.tensor_flat_offset(c.tensor + 1);
    ASSERT_EQ(c.flat_offset - t0, c.tensor_offset);
    ASSERT_LE(c.flat_offset + c.count, t1) << "chunk " << c.id << " straddles a tensor";
    pos += c.count;
  }
  EXPECT_EQ(pos, l.total_elems());
  int64_t sum = 0;
  for (int s = 0; s < l.servers(); ++s) {
    for (int32_t id : l.ServerChunks(s)) EXPECT_EQ(l.chunk(id).server, s);
    sum += l.ServerElems(s);
  }
  EXPECT_EQ(sum, l.total_elems());
}

TEST(WireLayout, AlexNetHasExpectedSize) {
  EXPECT_EQ(AlexNetTensorSpecs().size(), 16u);
  EXPECT_EQ(TotalElements(AlexNetTensorSpecs()), 60965224);
}

TEST(WireLayout, AlexNetBalancedWithinOnePercentForOneToEightServers) {
  for (int s = 1; s <= 8; ++s) {
    ParamLayout l = MustBuild(AlexNetTensorSpecs(), s);
    ExpectExactCover(l);
    const double share = static_cast<double>(l.total_elems()) / s;
    for (int i = 0; i < s; ++i) {
      EXPECT_NEAR(static_cast<double>(l.ServerElems(i)), share, 0.01 * share)
          << "S=" << s << " server " << i;
    }
  }
}

TEST(WireLayout, SingleTensorLargerThanAShareIsSplitAcrossServers) {
  std::vector<TensorSpec> specs = {{"big", {1000, 1000}, 1, 1}, {"small", {10}, 2, 0}};
  ParamLayout l = MustBuild(specs, 3, 4096);
  ExpectExactCover(l);
  const double share = 1000010.0 / 3;
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(l.ServerElems(i), share, 0.01 * share);
  // The big tensor has chunks on every server.
  std::vector<bool> has(3, false);
  for (const Chunk& c : l.chunks()) if (c.tensor == 0) has[c.server] = true;
  EXPECT_TRUE(has[0] && has[1] && has[2]);
}

TEST(WireLayout, DeterministicAndHashSensitive) {
  ParamLayout a = MustBuild(AlexNetTensorSpecs(), 4);
  ParamLayout b = MustBuild(AlexNetTensorSpecs(), 4);
  ASSERT_EQ(a.num_chunks(), b.num_chunks());
  for (int i = 0; i < a.num_chunks(); ++i) {
    EXPECT_EQ(a.chunk(i).flat_offset, b.chunk(i).flat_offset);
    EXPECT_EQ(a.chunk(i).server, b.chunk(i).server);
  }
  EXPECT_EQ(a.hash(), b.hash());
  EXPECT_NE(a.hash(), MustBuild(AlexNetTensorSpecs(), 3).hash());
  auto specs = AlexNetTensorSpecs();
  specs[0].shape = {96, 3, 11, 12};
  EXPECT_NE(a.hash(), MustBuild(specs, 4).hash());
  specs = AlexNetTensorSpecs();
  specs[1].name = "conv1.b";
  EXPECT_NE(a.hash(), MustBuild(specs, 4).hash());
  EXPECT_NE(a.hash(), MustBuild(AlexNetTensorSpecs(), 4, 1 << 19).hash());
}

TEST(WireLayout, ChunksInRangeCoversATensor) {
  ParamLayout l = MustBuild(AlexNetTensorSpecs(), 2);
  const int fc6 = l.TensorIndex("fc6.weight");
  ASSERT_GE(fc6, 0);
  auto ids = l.ChunksInRange(l.tensor_flat_offset(fc6), l.tensor_flat_offset(fc6 + 1));
  int64_t n = 0;
  for (int32_t id : ids) {
    EXPECT_EQ(l.chunk(id).tensor, fc6);
    n += l.chunk(id).count;
  }
  EXPECT_EQ(n, 4096 * 9216);
}

// A factored tensor's packed δ: one block per chunk, in flat order, each the rows its chunk
// touches (a cut row in both), so chunk k's δ columns are one contiguous range; and the packing.
TEST(WireLayout, FactorRowBlocksFollowTheChunksAndPackTheirColumns) {
  // w 6×5 in chunks of 8 floats on 2 servers: [0,8) rows 0-1, [8,16) 1-3, [16,24) 3-4, [24,30) 4-5.
  const ParamLayout l = MustBuild({{"w", {6, 5}, 1, 1}, {"b", {6}, 1, 1}, {"v", {4, 3}, 1, 1}}, 2, 8);
  const std::vector<RowSpan> blocks = FactorRowBlocks(l, 0);
  std::vector<std::pair<int64_t, int64_t>> got;
  for (const RowSpan& r : blocks) got.emplace_back(r.first, r.rows);
  EXPECT_EQ(got, (std::vector<std::pair<int64_t, int64_t>>{{0, 2}, {1, 3}, {3, 2}, {4, 2}}));
  EXPECT_EQ(PackedRows(blocks), 9);
  // δ is 2×6 with δ[b][r] = 10b + r.
  constexpr int64_t kBatch = 2, kOut = 6;
  std::vector<float> delta(kBatch * kOut);
  for (int64_t b = 0; b < kBatch; ++b)
    for (int64_t r = 0; r < kOut; ++r) delta[static_cast<size_t>(b * kOut + r)] = static_cast<float>(10 * b + r);
  std::vector<float> packed(kBatch * 9, -1.0f);
  PackRowBlocks(delta.data(), kBatch, kOut, blocks, packed.data());
  EXPECT_EQ(packed, (std::vector<float>{0, 1, 10, 11,         // rows 0-1
                                        1, 2, 3, 11, 12, 13,  // rows 1-3
                                        3, 4, 13, 14,         // rows 3-4
                                        4, 5, 14, 15}));      // rows 4-5
  // One block of every row is δ as it is.
  std::vector<float> same(delta.size());
  const RowSpan all{0, kOut};
  PackRowBlocks(delta.data(), kBatch, kOut, {&all, 1}, same.data());
  EXPECT_EQ(same, delta);
}

TEST(WireLayout, BadInputIsRefused) {
  ParamLayout l;
  EXPECT_FALSE(ParamLayout::Build(AlexNetTensorSpecs(), 0, 1024, &l).ok());
  EXPECT_FALSE(ParamLayout::Build(AlexNetTensorSpecs(), 2, 0, &l).ok());
  EXPECT_FALSE(ParamLayout::Build({{"a", {0}, 1, 1}}, 1, 1024, &l).ok());
  EXPECT_FALSE(ParamLayout::Build({{"a", {2}, 1, 1}, {"a", {2}, 1, 1}}, 1, 1024, &l).ok());
  EXPECT_FALSE(ParamLayout::Build({{"a", {2}, 1, 1}}, 3, 1024, &l).ok());
}

TEST(WireLayout, TensorListParses) {
  std::vector<TensorSpec> specs;
  ASSERT_TRUE(ParseTensorList("# model\nw 4x3 1 1\nb 4 2 0\n", "t.txt", &specs).ok());
  ASSERT_EQ(specs.size(), 2u);
  EXPECT_EQ(specs[0].shape, (std::vector<int64_t>{4, 3}));
  EXPECT_EQ(specs[1].lr_mult, 2.0f);
  EXPECT_EQ(specs[1].decay_mult, 0.0f);
  Status s = ParseTensorList("w 4xq\n", "t.txt", &specs);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("t.txt:1"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("'q'"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace downpour
