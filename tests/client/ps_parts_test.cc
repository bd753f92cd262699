// Tests of the PS client's parts, each on its own (client/ps/delivery.h, shm_path.h,
// push_encoding.h): the byte window, the incarnations that tell a restart from a late reply, the
// write-ahead-log backoff, the same-host region's areas and busy chunks, and the encoding of a
// lossy push part. ps_client_test drives them together over sockets.
#include <chrono>
#include <cstring>
#include <memory>
#include <numeric>
#include <span>
#include <vector>

#include <gtest/gtest.h>

#include "client/ps/delivery.h"
#include "client/ps/push_encoding.h"
#include "client/ps/shm_path.h"
#include "common/grad_codec.h"
#include "common/layout.h"
#include "common/shm_region.h"

namespace downpour {
namespace {

using namespace std::chrono_literals;

TEST(ByteWindow, BoundsTheBytesOnTheWireButLetsAnOversizePartGoAlone) {
  ByteWindow w(100);
  EXPECT_TRUE(w.Fits(250));  // empty: a part larger than the window goes, alone
  w.Add(60);
  EXPECT_TRUE(w.Fits(40));
  EXPECT_FALSE(w.Fits(41));
  w.Add(40);
  EXPECT_EQ(w.inflight(), 100u);
  w.Remove(70);
  EXPECT_TRUE(w.Fits(70));
  w.Remove(1000);  // more than is in flight: empty, never negative
  EXPECT_EQ(w.inflight(), 0u);
  w.Add(5);
  w.Clear();
  EXPECT_EQ(w.inflight(), 0u);
}

TEST(IncarnationTracker, TellsARestartFromALateReplyOfAReplacedProcess) {
  IncarnationTracker t;
  EXPECT_FALSE(t.Observe(0));   // a reply without one
  EXPECT_FALSE(t.Observe(11));  // the first heard: the server, not a restart
  EXPECT_FALSE(t.Observe(11));
  EXPECT_TRUE(t.Observe(22));   // a new process
  EXPECT_FALSE(t.Observe(11));  // a late reply of the one it replaced
  EXPECT_EQ(t.current(), 22u);
  for (uint64_t i : {33, 44, 55, 66}) EXPECT_TRUE(t.Observe(i));
  EXPECT_TRUE(t.Observe(11)) << "forgotten after " << IncarnationTracker::kRemembered << " newer ones";
  t.Forget();  // the link moved: whoever answers there first
  EXPECT_FALSE(t.Observe(77));
  EXPECT_EQ(t.current(), 77u);
}

TEST(LogRefusals, BacksOffFrom50MsDoublingToTheCapThenGivesUp) {
  LogRefusals r;
  const auto t0 = LogRefusals::Clock::now();
  const auto cap = 300ms, give_up = 2000ms;
  std::vector<long> waits;
  auto now = t0;
  while (r.Refuse(now, cap, give_up)) {
    waits.push_back(std::chrono::duration_cast<std::chrono::milliseconds>(r.not_before - now).count());
    now = r.not_before;
  }
  ASSERT_GE(waits.size(), 4u);
  EXPECT_EQ(waits[0], 50);
  EXPECT_EQ(waits[1], 100);
  EXPECT_EQ(waits[2], 200);
  for (size_t i = 3; i < waits.size(); ++i) EXPECT_EQ(waits[i], 300) << i;
  EXPECT_GE(r.refused_for(now), give_up);
  EXPECT_EQ(r.count, static_cast<int>(waits.size()) + 1);
}

// Four chunks of 10 floats over two servers; the path is server 1's (two of them).
class ShmPathTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(ParamLayout::Build({{"a", {40}, 1, 1}}, 2, 10, &layout_).ok());
    ASSERT_EQ(layout_.ServerChunks(1).size(), 2u);
  }
  // A register reply offering `region`.
  static MessageHeader Offer(const SharedRegion& region) {
    MessageHeader h;
    h.type = MsgType::kRegisterReply;
    h.shm_path = region.path();
    h.shm_bytes = region.payload_bytes();
    h.shm_nonce = region.nonce();
    return h;
  }
  MessageHeader Message(MsgType type) const {
    MessageHeader h;
    h.type = type;
    for (int32_t c : layout_.ServerChunks(1)) h.chunk_ids.push_back(static_cast<uint32_t>(c));
    return h;
  }
  ParamLayout layout_;
};

TEST_F(ShmPathTest, PushesGoToThePushAreaPullsComeFromThePullAreaAndBusyChunksWait) {
  const uint64_t area = 20 * sizeof(float);  // server 1 holds 2 chunks of 10 floats
  std::unique_ptr<SharedRegion> region;
  ASSERT_TRUE(SharedRegion::Create("test", 2 * area, &region).ok());
  ShmPath path(layout_, 1, /*asked=*/true);
  EXPECT_FALSE(path.on());
  EXPECT_EQ(path.Adopt(Offer(*region)), "");
  ASSERT_TRUE(path.on());

  MessageHeader push = Message(MsgType::kPush);
  std::vector<std::vector<float>> grads = {std::vector<float>(10, 1.5f), std::vector<float>(10, -2.0f)};
  Frames payload;
  for (auto& g : grads) payload.push_back(Frame::Borrow(reinterpret_cast<const std::byte*>(g.data()), 40, nullptr));
  bool wait = true;
  ASSERT_TRUE(path.Usable(push, &wait));
  EXPECT_FALSE(wait);
  Frames frames;
  ASSERT_TRUE(path.Send(push, payload, &frames).ok());
  ASSERT_EQ(frames.size(), 1u) << "only the header goes on the socket";
  const auto* floats = reinterpret_cast<const float*>(region->payload());
  EXPECT_EQ(floats[0], 1.5f);    // server 1's first chunk at the start of the push area
  EXPECT_EQ(floats[10], -2.0f);  // its second after it
  EXPECT_EQ(path.sent_bytes(), 80u);
  EXPECT_FALSE(path.Usable(push, &wait));
  EXPECT_TRUE(wait) << "a chunk whose area holds an unanswered push waits";
  path.Release(push);
  EXPECT_TRUE(path.Usable(push, &wait));

  // The server's pull reply in the pull area, after the push area.
  auto* pull_area = reinterpret_cast<float*>(region->payload()) + 20;
  std::iota(pull_area, pull_area + 20, 100.0f);
  std::vector<float> out(40, 0.0f);
  path.ReadPull(Message(MsgType::kPull), out);
  const std::span<const int32_t> mine = layout_.ServerChunks(1), theirs = layout_.ServerChunks(0);
  EXPECT_EQ(out[layout_.chunk(mine[0]).flat_offset], 100.0f);
  EXPECT_EQ(out[layout_.chunk(mine[1]).flat_offset + 9], 119.0f);
  EXPECT_EQ(out[layout_.chunk(theirs[0]).flat_offset], 0.0f) << "server 0's chunk is not this path's";
  EXPECT_EQ(path.received_bytes(), 80u);
  // Into 16-bit weights (a GPU worker's fp16 pull): the region's f32 cast as the codec rounds.
  pull_area[0] = 100.0004f;  // not a half: rounds to 100
  std::vector<uint16_t> out16(40, 0);
  path.ReadPull16(Message(MsgType::kPull), DType::kF16, out16);
  EXPECT_EQ(out16[static_cast<size_t>(layout_.chunk(mine[0]).flat_offset)], FloatToHalf(100.0f));
  EXPECT_EQ(out16[static_cast<size_t>(layout_.chunk(mine[1]).flat_offset + 9)], FloatToHalf(119.0f));
  EXPECT_EQ(out16[static_cast<size_t>(layout_.chunk(theirs[0]).flat_offset)], 0);
  EXPECT_EQ(path.received_bytes(), 160u);

  // Lossy and factored messages are frames, never the region.
  MessageHeader half = push;
  half.dtype = DType::kF16;
  EXPECT_FALSE(path.Usable(half, &wait));
  EXPECT_FALSE(wait);
}

TEST_F(ShmPathTest, ARegionOfTheWrongSizeOrNoneLeavesThePathOff) {
  ShmPath path(layout_, 1, /*asked=*/true);
  MessageHeader none;
  EXPECT_NE(path.Adopt(none).find("offered none"), std::string::npos);
  std::unique_ptr<SharedRegion> small;
  ASSERT_TRUE(SharedRegion::Create("small", 8, &small).ok());
  EXPECT_NE(path.Adopt(Offer(*small)).find("this layout needs 160"), std::string::npos);
  EXPECT_FALSE(path.on());
  ShmPath unasked(layout_, 1, /*asked=*/false);
  EXPECT_EQ(unasked.Adopt(Offer(*small)), "");
  EXPECT_FALSE(unasked.on());
}

// Top-k of a chunk big enough goes as top-k; of a chunk so small that indices cost as much as dense
// f32, dense: the header then lists each chunk's encoding. Byte lengths and checksums follow the
// encoded bytes, which are what the encoder makes.
TEST(EncodePushPart, ReplacesThePayloadByTheCodecsBytesAndFixesTheHeader) {
  std::vector<float> big(1000), tiny(2, 0.25f);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<float>(i % 17) - 8.0f;
  MessageHeader h;
  h.type = MsgType::kPush;
  h.encoding = Encoding::kTopK;
  h.chunk_ids = {0, 1};
  h.byte_lengths = {4000, 8};
  h.checksums = {0, 0};
  Frames payload = {Frame::Borrow(reinterpret_cast<const std::byte*>(big.data()), 4000, nullptr),
                    Frame::Borrow(reinterpret_cast<const std::byte*>(tiny.data()), 8, nullptr)};
  const CompressionConfig topk{.push = WireCodec::kTopK, .top_k_fraction = 0.01};
  ChunkEncoder encoder(topk), reference(topk);
  const uint64_t bytes = EncodePushPart(encoder, &h, &payload);
  EncodedChunk a, b;
  reference.Encode(0, big, &a);
  reference.Encode(1, tiny, &b);
  ASSERT_EQ(payload.size(), 2u);
  EXPECT_EQ(bytes, a.bytes.size() + b.bytes.size());
  EXPECT_EQ(h.byte_lengths, (std::vector<uint64_t>{a.bytes.size(), b.bytes.size()}));
  EXPECT_EQ(h.encodings, (std::vector<Encoding>{Encoding::kTopK, Encoding::kDense}));
  EXPECT_EQ(h.checksums[0], Crc32c(a.bytes.data(), a.bytes.size()));
  EXPECT_EQ(std::memcmp(payload[0].data(), a.bytes.data(), a.bytes.size()), 0);
  EXPECT_EQ(std::memcmp(payload[1].data(), b.bytes.data(), b.bytes.size()), 0);
}

}  // namespace
}  // namespace downpour
