// Tests of server/request_check.h without a shard: a valid dense push is resolved to its chunks
// (payload read in place, or copied once when misaligned), and every malformed one is refused
// with the reason the shard counts and a message naming the field. The shard's own tests and the
// fuzz test check the same refusals through the wire; these pin each rule to its reason.
#include "server/request_check.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "common/finite.h"
#include "common/grad_codec.h"

namespace downpour {
namespace {

using ::testing::HasSubstr;

// Its state is public: the cases below change it through a reference.
class RequestCheck : public ::testing::Test {
 public:
  void SetUp() override {
    ASSERT_TRUE(
        ParamLayout::Build({{"w", {6, 5}, 1.0f, 1.0f}, {"b", {6}, 2.0f, 0.0f}, {"v", {17}, 1.0f, 1.0f}}, 2, 8, &layout_)
            .ok());
    local_of_.assign(static_cast<size_t>(layout_.num_chunks()), -1);
    owned_.clear();
    rules_ = PushRules{};
    for (int32_t id : layout_.ServerChunks(0)) {
      local_of_[static_cast<size_t>(id)] = static_cast<int>(owned_.size());
      owned_.push_back(id);
    }
    ASSERT_GE(owned_.size(), 3u);
    rules_.layout = &layout_;
    rules_.local_of = local_of_;
    rules_.owned = owned_.size();
    rules_.server_id = 0;
    rules_.all_finite = [](std::span<const float> x) { return AllFinite(x); };
    facts_.assign(owned_.size(), ChunkFacts{true, 5});
  }

  // A gradient push of server 0's first three chunks, computed from version 3.
  void ValidPush(MessageHeader* h, Frames* frames) const {
    h->type = MsgType::kPush;
    frames->clear();
    frames->emplace_back();  // the header frame
    for (size_t i = 0; i < 3; ++i) {
      const int32_t id = owned_[i];
      const int64_t count = layout_.chunk(id).count;
      h->chunk_ids.push_back(static_cast<uint32_t>(id));
      h->versions.push_back(3);
      h->elem_counts.push_back(static_cast<uint64_t>(count));
      h->byte_lengths.push_back(static_cast<uint64_t>(count) * sizeof(float));
      std::vector<float> g(static_cast<size_t>(count), 0.5f + static_cast<float>(i));
      frames->push_back(Frame::Copy(g.data(), g.size() * sizeof(float)));
    }
  }

  Status Check(const MessageHeader& h, const Frames& frames, CheckedPush* out, RejectReason* reason,
               const std::vector<bool>& finite = {}) const {
    return CheckDensePush(
        rules_, h, frames, [this](int local) { return facts_[static_cast<size_t>(local)]; }, finite, out, reason);
  }

  ParamLayout layout_;
  std::vector<int> local_of_;
  std::vector<int32_t> owned_;
  PushRules rules_;
  std::vector<ChunkFacts> facts_;
};

TEST_F(RequestCheck, AValidPushResolvesToItsChunksReadInPlaceOrCopiedOnceWhenMisaligned) {
  MessageHeader h;
  Frames frames;
  ValidPush(&h, &frames);
  // The third chunk's payload one byte into a buffer: not float-aligned.
  std::vector<char> odd(frames[3].size() + 1);
  std::memcpy(odd.data() + 1, frames[3].data(), frames[3].size());
  frames[3] = Frame::Borrow(odd.data() + 1, frames[3].size(), nullptr);
  CheckedPush out;
  RejectReason reason = RejectReason::kCount;
  const Status s = Check(h, frames, &out, &reason);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(out.locals, (std::vector<int>{0, 1, 2}));
  ASSERT_EQ(out.chunks.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(out.chunks[i].local, static_cast<int>(i));
    EXPECT_EQ(out.chunks[i].count, layout_.chunk(owned_[i]).count);
    EXPECT_EQ(out.chunks[i].version_from, 3);
    EXPECT_EQ(out.chunks[i].grad[0], 0.5f + static_cast<float>(i));
  }
  EXPECT_EQ(static_cast<const void*>(out.chunks[0].grad), static_cast<const void*>(frames[1].data()));
  EXPECT_EQ(out.chunks[2].grad, out.scratch[2].data()) << "the misaligned payload was not copied";
  // An init push names no versions and takes version 0, initialised or not.
  h.flags = kFlagInit;
  h.versions.clear();
  facts_[1].initialized = false;
  ASSERT_TRUE(Check(h, frames, &out, &reason).ok());
  EXPECT_EQ(out.chunks[1].version_from, 0);
}

TEST_F(RequestCheck, EveryMalformedPushIsRefusedWithItsReasonNamingTheField) {
  struct Case {
    const char* what;
    std::function<void(MessageHeader&, Frames&, RequestCheck&)> damage;
    RejectReason reason;
    const char* says;
  };
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<Case> cases = {
      {"dtype", [](MessageHeader& h, Frames&, RequestCheck&) { h.dtype = DType::kF16; }, RejectReason::kDType,
       "not supported (server takes f32 dense)"},
      {"no chunks",
       [](MessageHeader& h, Frames& f, RequestCheck&) {
         h = MessageHeader{};
         h.type = MsgType::kPush;
         f.resize(1);
       },
       RejectReason::kFrameCount, "push: no chunks"},
      {"frames", [](MessageHeader&, Frames& f, RequestCheck&) { f.pop_back(); }, RejectReason::kFrameCount,
       "3 chunk ids but 2 payload frames"},
      {"versions", [](MessageHeader& h, Frames&, RequestCheck&) { h.versions.pop_back(); }, RejectReason::kFrameCount,
       "2 versions"},
      {"unknown id", [](MessageHeader& h, Frames&, RequestCheck&) { h.chunk_ids[1] = 1000; },
       RejectReason::kUnknownChunk, "chunk id 1000 is unknown"},
      {"another server's",
       [](MessageHeader& h, Frames&, RequestCheck& t) {
         h.chunk_ids[1] = static_cast<uint32_t>(t.layout_.ServerChunks(1)[0]);
       },
       RejectReason::kUnknownChunk, "belongs to server 1, not server 0"},
      {"twice", [](MessageHeader& h, Frames&, RequestCheck&) { h.chunk_ids[2] = h.chunk_ids[0]; },
       RejectReason::kDuplicateChunk, "listed twice"},
      {"elements", [](MessageHeader& h, Frames&, RequestCheck&) { h.elem_counts[1] += 1; }, RejectReason::kElemCount,
       "elements in the layout, header says"},
      {"byte length", [](MessageHeader& h, Frames&, RequestCheck&) { h.byte_lengths[2] -= 4; },
       RejectReason::kByteLength, "bytes; header says"},
      {"short frame",
       [](MessageHeader&, Frames& f, RequestCheck&) { f[1] = Frame::Copy(f[1].data(), f[1].size() - 4); },
       RejectReason::kByteLength, "frame has"},
      {"checksum",
       [](MessageHeader& h, Frames& f, RequestCheck&) {
         for (size_t i = 1; i < f.size(); ++i) h.checksums.push_back(Crc32c(f[i].data(), f[i].size()));
         h.checksums[2] ^= 1;
       },
       RejectReason::kChecksum, "CRC-32C"},
      {"NaN",
       [nan](MessageHeader&, Frames& f, RequestCheck&) {
         std::vector<float> g(f[2].size() / sizeof(float), 1.0f);
         g.back() = nan;
         f[2] = Frame::Copy(g.data(), f[2].size());
       },
       RejectReason::kNonFinite, "holds NaN or Inf"},
      {"not initialised", [](MessageHeader&, Frames&, RequestCheck& t) { t.facts_[2].initialized = false; },
       RejectReason::kNotInitialized, "before its weights were initialised"},
      {"version ahead", [](MessageHeader& h, Frames&, RequestCheck&) { h.versions[0] = 6; }, RejectReason::kVersion,
       "computed from version 6, but the chunk is at version 5"},
      {"version negative", [](MessageHeader& h, Frames&, RequestCheck&) { h.versions[1] = -1; }, RejectReason::kVersion,
       "computed from version -1"},
      {"elastic to an SGD server", [](MessageHeader& h, Frames&, RequestCheck&) { h.flags = kFlagElastic; },
       RejectReason::kClock, "an elastic exchange, but this run's consistency.algorithm is \"sgd\""},
      {"gradient to an EASGD server",
       [](MessageHeader&, Frames&, RequestCheck& t) { t.rules_.algorithm = Algorithm::kEasgd; }, RejectReason::kClock,
       "a gradient push to a \"easgd\" server"},
      {"move to a one-model server", [](MessageHeader& h, Frames&, RequestCheck&) { h.flags = kFlagMove; },
       RejectReason::kClock, "this server serves one model"},
      {"move batches",
       [](MessageHeader& h, Frames&, RequestCheck& t) {
         t.rules_.model_moves = true;
         h.flags = kFlagMove;
         h.move_batches = 0;
       },
       RejectReason::kClock, "a model move of 0 batches"},
      {"move and init",
       [](MessageHeader& h, Frames&, RequestCheck& t) {
         t.rules_.model_moves = true;
         h.flags = kFlagMove | kFlagInit;
         h.move_batches = 1;
       },
       RejectReason::kClock, "cannot also be an init push"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    SetUp();  // fresh rules and facts
    MessageHeader h;
    Frames frames;
    ValidPush(&h, &frames);
    c.damage(h, frames, *this);
    CheckedPush out;
    RejectReason reason = RejectReason::kCount;
    const Status s = Check(h, frames, &out, &reason);
    EXPECT_FALSE(s.ok());
    EXPECT_EQ(reason, c.reason) << s.ToString();
    EXPECT_THAT(s.message(), HasSubstr(c.says));
  }
}

// Chunks the caller already knows finite (a lossy push, decoded and checked as it was written)
// are not scanned again; the others are.
TEST_F(RequestCheck, OnlyChunksNotKnownFiniteAreScanned) {
  MessageHeader h;
  Frames frames;
  ValidPush(&h, &frames);
  int scans = 0;
  rules_.all_finite = [&scans](std::span<const float> x) {
    ++scans;
    return AllFinite(x);
  };
  CheckedPush out;
  RejectReason reason = RejectReason::kCount;
  ASSERT_TRUE(Check(h, frames, &out, &reason, {true, false, true}).ok());
  EXPECT_EQ(scans, 1);
}

// An fp16 push decodes to the floats it carried and then passes the dense checks; a lossy push
// the server does not take, or one whose frame does not decode, is refused under its reason.
TEST_F(RequestCheck, ALossyPushDecodesToDenseOrIsRefusedWithItsReason) {
  MessageHeader h;
  Frames frames;
  ValidPush(&h, &frames);
  h.dtype = DType::kF16;
  for (size_t i = 1; i < frames.size(); ++i) {
    std::vector<float> g(frames[i].size() / sizeof(float));
    std::memcpy(g.data(), frames[i].data(), frames[i].size());
    std::vector<uint16_t> half(g.size());
    FloatsToHalf(g, half.data());
    frames[i] = Frame::Copy(half.data(), half.size() * sizeof(uint16_t));
    h.byte_lengths[i - 1] = half.size() * sizeof(uint16_t);
  }
  ASSERT_TRUE(CodedPush(h));
  MessageHeader dense;
  Frames decoded;
  RejectReason reason = RejectReason::kCount;
  Status s = DecodeCodedPush(rules_, h, frames, &dense, &decoded, &reason);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_FALSE(CodedPush(dense));
  CheckedPush out;
  s = Check(dense, decoded, &out, &reason);
  ASSERT_TRUE(s.ok()) << s.ToString();
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(out.chunks[i].grad[0], 0.5f + static_cast<float>(i));  // exact in fp16

  struct Case {
    const char* what;
    std::function<void(MessageHeader&, Frames&)> damage;
    RejectReason reason;
    const char* says;
  };
  const std::vector<Case> cases = {
      {"init", [](MessageHeader& c, Frames&) { c.flags = kFlagInit; }, RejectReason::kDType,
       "initial weights must be f32 dense"},
      {"shared memory", [](MessageHeader& c, Frames&) { c.flags = kFlagShm; }, RejectReason::kDType,
       "a payload in shared memory must be f32 dense"},
      {"factors",
       [](MessageHeader& c, Frames&) {
         c.encodings = {Encoding::kDense, Encoding::kFactors, Encoding::kDense};
       },
       RejectReason::kDType, "is sufficient factors"},
      {"byte length", [](MessageHeader& c, Frames&) { c.byte_lengths[0] += 2; }, RejectReason::kByteLength,
       "frame has"},
      {"frames", [](MessageHeader&, Frames& f) { f.pop_back(); }, RejectReason::kFrameCount, "payload frames"},
      {"odd frame",
       [](MessageHeader& c, Frames& f) {
         f[1] = Frame::Copy(f[1].data(), f[1].size() - 2);
         c.byte_lengths[0] -= 2;
       },
       RejectReason::kByteLength, "push: "},
      {"NaN",
       [](MessageHeader&, Frames& f) {
         std::vector<uint16_t> half(f[2].size() / 2, 0x3c00);  // 1.0
         half[0] = 0x7e00;                                     // NaN
         f[2] = Frame::Copy(half.data(), f[2].size());
       },
       RejectReason::kNonFinite, "push: "},
      {"another server's",
       [this](MessageHeader& c, Frames&) { c.chunk_ids[0] = static_cast<uint32_t>(layout_.ServerChunks(1)[0]); },
       RejectReason::kUnknownChunk, "belongs to server 1"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    MessageHeader bad = h;
    Frames bad_frames = frames;
    c.damage(bad, bad_frames);
    s = DecodeCodedPush(rules_, bad, bad_frames, &dense, &decoded, &reason);
    EXPECT_FALSE(s.ok());
    EXPECT_EQ(reason, c.reason) << s.ToString();
    EXPECT_THAT(s.message(), HasSubstr(c.says));
  }
}

TEST_F(RequestCheck, AnEmptyPullNamesEveryChunkOfTheShard) {
  MessageHeader h;
  h.type = MsgType::kPull;
  std::vector<int> locals;
  RejectReason reason = RejectReason::kCount;
  ASSERT_TRUE(ResolveChunkIds(rules_, h, /*all_if_empty=*/true, &locals, &reason).ok());
  EXPECT_EQ(locals.size(), owned_.size());
  h.chunk_ids = {static_cast<uint32_t>(owned_[1]), static_cast<uint32_t>(owned_[1])};
  const Status s = ResolveChunkIds(rules_, h, /*all_if_empty=*/true, &locals, &reason);
  EXPECT_EQ(reason, RejectReason::kDuplicateChunk);
  EXPECT_THAT(s.message(), HasSubstr("pull: chunk"));
}

}  // namespace
}  // namespace downpour
