// codec_test.cc — one round trip per message type; bad header bytes give an error Status.
#include <gtest/gtest.h>

#include <random>
#include <string>

#include "common/codec.h"

namespace downpour {
namespace {

MessageHeader Sample(MsgType type) {
  MessageHeader h;
  h.type = type;
  h.sender = 3;
  h.request_id = 0x1234567890ull;
  h.model_id = 2;
  h.clock = 77;
  h.layout_hash = 0xfeedfacecafebeefull;
  h.role = Role::kWorker;
  switch (type) {
    case MsgType::kPull:
      h.chunk_ids = {4, 5};
      break;
    case MsgType::kPush:
    case MsgType::kPullReply:
      h.flags = kFlagInit;
      h.chunk_ids = {1, 9, 200000};
      h.versions = {0, 12, -1};
      h.elem_counts = {10, 1 << 20, 3};
      h.byte_lengths = {40, 4 << 20, 12};
      h.checksums = {1, 2, 0xffffffffu};
      h.dtype = DType::kBf16;
      h.encoding = Encoding::kTopK;
      break;
    case MsgType::kAck:
      h.chunk_ids = {7};
      h.versions = {8};
      break;
    case MsgType::kError:
      h.error_code = 5;
      h.error_text = "chunk 99 is not owned by server 1";
      break;
    case MsgType::kRegisterReply:
      h.assigned_id = 4;
      h.server_addresses = {"tcp://127.0.0.1:5000", "tcp://127.0.0.1:5001"};
      h.server_count = 2;
      h.worker_count = 8;
      break;
    case MsgType::kHeartbeat:
      h.flags = kFlagFinished | kFlagDone;
      h.dead_workers = {1, 6};
      h.finished_workers = {6};
      h.shutdown = true;
      break;
    case MsgType::kCheckpoint:
      h.text = "/tmp/run/ckpt";
      h.token = "0f1e2d3c4b5a69788796a5b4c3d2e1f0";
      break;
    case MsgType::kRegister:
    case MsgType::kShutdown:
      // Bytes, not text: any byte value survives, NULs included.
      h.token = std::string("\x00\xff token \x01", 10);
      break;
    case MsgType::kStatsReply:
      h.stats.pushes_received = 10;
      h.stats.pushes_applied = 8;
      h.stats.pushes_rejected = 2;
      h.stats.rejected_by_reason = std::vector<uint64_t>(static_cast<size_t>(RejectReason::kCount), 0);
      h.stats.rejected_by_reason[3] = 2;
      h.stats.chunk_updates = 40;
      h.stats.pulls_served = 5;
      h.stats.staleness_sum = 9;
      h.stats.staleness_max = 4;
      h.stats.staleness_histogram = {1, 2, 3};
      h.stats.dropped_late = 1;
      h.stats.checkpoints_written = 2;
      h.stats.undecodable = 7;
      h.stats.wal_ns = 123456789;
      h.stats.wal_sync_cpu_ns = 987654;
      h.stats.factor_ns = 24680;
      h.stats.wal_bytes = 13579;
      h.stats.wal_coded_records = 11;
      break;
    default:
      break;
  }
  return h;
}

TEST(WireCodec, RoundTripEveryMessageType) {
  for (uint16_t t = 1; t <= kMaxMsgType; ++t) {
    const MessageHeader in = Sample(static_cast<MsgType>(t));
    std::string bytes;
    ASSERT_TRUE(EncodeHeader(in, &bytes).ok()) << MsgTypeName(in.type);
    MessageHeader out;
    Status s = DecodeHeader(bytes.data(), bytes.size(), &out);
    ASSERT_TRUE(s.ok()) << MsgTypeName(in.type) << ": " << s.ToString();
    EXPECT_EQ(in, out) << MsgTypeName(in.type);
  }
}

TEST(WireCodec, InconsistentListLengthsAreRefusedOnEncode) {
  MessageHeader h = Sample(MsgType::kPush);
  h.versions.pop_back();
  std::string bytes;
  Status s = EncodeHeader(h, &bytes);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("versions"), std::string::npos) << s.message();
}

TEST(WireCodec, GarbageIsAnErrorNotACrash) {
  std::mt19937 rng(42);
  for (int trial = 0; trial < 2000; ++trial) {
    std::string bytes(static_cast<size_t>(8 * (1 + rng() % 64)), '\0');
    for (char& c : bytes) c = static_cast<char>(rng());
    MessageHeader out;
    EXPECT_FALSE(DecodeHeader(bytes.data(), bytes.size(), &out).ok());
  }
  MessageHeader out;
  EXPECT_FALSE(DecodeHeader("abc", 3, &out).ok());
  EXPECT_FALSE(DecodeHeader("", 0, &out).ok());
}

TEST(WireCodec, EveryTruncationIsAnError) {
  std::string bytes;
  ASSERT_TRUE(EncodeHeader(Sample(MsgType::kPush), &bytes).ok());
  for (size_t n = 0; n < bytes.size(); ++n) {
    MessageHeader out;
    EXPECT_FALSE(DecodeHeader(bytes.data(), n, &out).ok()) << "prefix of " << n << " bytes";
  }
}

TEST(WireCodec, BitFlipsNeverCrash) {
  std::string good;
  ASSERT_TRUE(EncodeHeader(Sample(MsgType::kStatsReply), &good).ok());
  std::mt19937 rng(7);
  for (int trial = 0; trial < 5000; ++trial) {
    std::string bytes = good;
    bytes[rng() % bytes.size()] ^= static_cast<char>(1 << (rng() % 8));
    MessageHeader out;
    (void)DecodeHeader(bytes.data(), bytes.size(), &out);  // ok or error; must not crash
  }
  SUCCEED();
}

TEST(WireCodec, OversizedAndWrongMagicAreRefused) {
  std::string big(kMaxHeaderBytes + 8, '\0');
  MessageHeader out;
  Status s = DecodeHeader(big.data(), big.size(), &out);
  EXPECT_EQ(s.code(), StatusCode::kCorrupt);
  EXPECT_NE(s.message().find("limit"), std::string::npos) << s.message();

  std::string bytes;
  ASSERT_TRUE(EncodeHeader(Sample(MsgType::kPull), &bytes).ok());
  bytes += std::string(8, '\0');  // trailing word
  EXPECT_FALSE(DecodeHeader(bytes.data(), bytes.size(), &out).ok());
}

TEST(WireCodec, Crc32cKnownValue) {
  // RFC 3720 test vector: CRC-32C of "123456789" is 0xE3069283.
  EXPECT_EQ(Crc32c("123456789", 9), 0xE3069283u);
}

}  // namespace
}  // namespace downpour
