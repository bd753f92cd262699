// compression_test.cc — the lossy wire codecs end to end (issue 14; common/grad_codec.h) against
// real shard servers in-process (inproc transport, two ShardServers, a worker's PsClient):
//  * every push codec (fp16, bf16, top-k 1% with and without error feedback, 1-bit with error
//    feedback): after several steps the servers' weights equal, bit for bit, SgdUpdate (momentum
//    and weight decay on) applied to the gradient the servers decode — worked out by the test with
//    its own encoder fed the same gradients; nothing refused; lossy parts never go through shared
//    memory (init pushes and f32 pulls do);
//  * fp16 / bf16 pulls decode into the caller's buffer within the codec's bound of the servers'
//    f32 masters (shared memory on: lossy pulls go as frames);
//  * compressed payloads with a bad index, unsorted or duplicate indices, k > n, a wrong length,
//    a NaN or negative scale, a NaN value, sufficient factors, a lossy init push are refused,
//    counted under the reason the reply names, and leave weights, momentum and versions byte for
//    byte unchanged;
//  * the write-ahead log holds each lossy push as the wire carried it (the encoder's bytes, fewer
//    than the f32 gradient): a shard recovered from it equals the killed one byte for byte, and a
//    logged push that does not decode stops the recovery naming the record;
//  * a part resent after its server moved carries the bytes of its first send (not re-encoded,
//    the residual untouched).
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <random>
#include <thread>

#include "client/ps/ps_client.h"
#include "common/grad_codec.h"
#include "common/inproc_transport.h"
#include "server/shard.h"
#include "common/solver/lr_policy.h"
#include "common/solver/sgd.h"

namespace downpour {
namespace {

using namespace std::chrono_literals;

// Chunks of 300 floats: top-k 1% keeps 3 of each (not dense), small tensors go dense.
std::vector<TensorSpec> Model() {
  return {{"conv", {20, 3, 5, 5}, 1.0f, 1.0f}, {"bias", {20}, 2.0f, 0.0f}, {"fc", {10, 130}, 1.0f, 1.0f}};
}

std::vector<float> Gaussian(size_t n, uint32_t seed, float sigma) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

class CompressionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    solver_.base_lr = 0.05f;
    solver_.momentum = 0.9f;
    solver_.weight_decay = 0.01f;
    ASSERT_TRUE(ParamLayout::Build(Model(), 2, 300, &layout_).ok());
    for (int s = 0; s < 2; ++s) {
      ShardOptions o;
      o.server_id = s;
      o.solver = solver_;
      o.shared_memory = true;
      std::unique_ptr<ShardServer> shard;
      ASSERT_TRUE(ShardServer::Create(layout_, o, &shard).ok());
      std::unique_ptr<ServerEndpoint> ep;
      ASSERT_TRUE(transport_.Bind(fmt::format("shard{}", s), &ep).ok());
      addresses_.push_back(ep->address());
      shard->Start(std::move(ep));
      shards_.push_back(std::move(shard));
    }
  }
  void TearDown() override {
    for (auto& s : shards_) s->Stop();
    for (auto& s : shards_) EXPECT_TRUE(s->Join().ok());
  }

  std::unique_ptr<PsClient> Client(WireCodec push, WireCodec pull, bool error_feedback = true, bool checksums = false) {
    PsClientOptions o;
    o.server_addresses = addresses_;
    o.worker_id = 0;
    o.reply_timeout = 10000ms;
    o.max_chunks_per_message = 2;
    o.shared_memory = true;
    o.checksums = checksums;
    o.compression.push = push;
    o.compression.pull = pull;
    o.compression.top_k_fraction = 0.01;
    o.compression.error_feedback = error_feedback;
    std::unique_ptr<PsClient> c;
    EXPECT_TRUE(PsClient::Create(&transport_, layout_, o, &c).ok());
    EXPECT_TRUE(c->Connect(5000ms).ok());
    return c;
  }

  std::vector<float> AllWeights() const {
    std::vector<float> w(static_cast<size_t>(layout_.total_elems()));
    for (const Chunk& c : layout_.chunks()) {
      auto cw = shards_[static_cast<size_t>(c.server)]->ChunkWeights(c.id);
      EXPECT_EQ(cw.size(), static_cast<size_t>(c.count));
      std::copy(cw.begin(), cw.end(), w.begin() + c.flat_offset);
    }
    return w;
  }
  std::vector<float> AllHistory() const {
    std::vector<float> h(static_cast<size_t>(layout_.total_elems()));
    for (const Chunk& c : layout_.chunks()) {
      auto ch = shards_[static_cast<size_t>(c.server)]->ChunkHistory(c.id);
      std::copy(ch.begin(), ch.end(), h.begin() + c.flat_offset);
    }
    return h;
  }
  uint64_t Sum(uint64_t ShardStatsWire::*field) const {
    uint64_t n = 0;
    for (const auto& s : shards_) n += s->Stats().*field;
    return n;
  }
  uint64_t Rejected() const { return Sum(&ShardStatsWire::pushes_rejected); }

  // Pushes `steps` gradients with `codec` and checks the servers' weights against SgdUpdate of
  // what the test's own encoder says the servers decode.
  void CheckPushCodec(WireCodec codec, bool error_feedback) {
    const size_t n = static_cast<size_t>(layout_.total_elems());
    auto client = Client(codec, WireCodec::kFp32, error_feedback, /*checksums=*/true);
    const std::vector<float> w0 = Gaussian(n, 1, 0.1f);
    ASSERT_TRUE(client->Wait(client->PushInit(w0), 5000ms).ok());
    const uint64_t region_after_init = Sum(&ShardStatsWire::region_parts);
    ASSERT_GT(region_after_init, 0u) << "the servers offer shared memory: the f32 init push used it";

    ChunkEncoder reference(CompressionConfig{.push = codec, .top_k_fraction = 0.01, .error_feedback = error_feedback});
    std::vector<float> ref = w0, hist(n, 0.0f), pulled(n);
    constexpr int kSteps = 6;
    for (int step = 0; step < kSteps; ++step) {
      const std::vector<float> g = Gaussian(n, 100 + static_cast<uint32_t>(step), 1.0f);
      ASSERT_TRUE(client->Wait(client->Push(g, step), 5000ms).ok());
      for (const Chunk& c : layout_.chunks()) {
        const auto count = static_cast<size_t>(c.count);
        EncodedChunk e;
        reference.Encode(static_cast<uint32_t>(c.id), std::span<const float>(g.data() + c.flat_offset, count), &e);
        std::vector<float> decoded(count);
        CodecFault fault;
        ASSERT_TRUE(
            DecodeChunk(e.encoding, reference.dtype(), e.bytes, decoded, static_cast<uint32_t>(c.id), &fault).ok());
        if (codec == WireCodec::kTopK && count >= 200) {
          EXPECT_EQ(e.encoding, Encoding::kTopK) << "chunk " << c.id;
          EXPECT_EQ(e.bytes.size(), TopKCount(0.01, count) * 8);
        }
        const TensorSpec& t = layout_.tensors()[static_cast<size_t>(c.tensor)];
        const UpdateParams p = MakeUpdateParams(solver_, step, t.lr_mult, t.decay_mult, 1.0f);
        SgdUpdate(p, std::span<const float>(decoded), std::span<float>(ref.data() + c.flat_offset, count),
                  std::span<float>(hist.data() + c.flat_offset, count));
      }
    }
    EXPECT_EQ(AllWeights(), ref);  // bit for bit
    EXPECT_EQ(AllHistory(), hist);
    EXPECT_EQ(Rejected(), 0u);
    EXPECT_EQ(Sum(&ShardStatsWire::region_parts), region_after_init) << "a lossy push part went through shared memory";
    for (const Chunk& c : layout_.chunks()) {
      EXPECT_EQ(shards_[static_cast<size_t>(c.server)]->ChunkVersion(c.id), kSteps);
    }
    // The f32 pull of the same client still goes through shared memory, and is exact.
    ASSERT_TRUE(client->Wait(client->Pull(pulled), 5000ms).ok());
    EXPECT_EQ(pulled, ref);
    EXPECT_GT(Sum(&ShardStatsWire::region_parts), region_after_init);
  }

  // An empty directory of this process under the test temp dir.
  static std::string FreshDir(const std::string& prefix) {
    const std::string dir = ::testing::TempDir() + "/" + prefix + std::to_string(::getpid());
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    return dir;
  }
  // Server 0 of the fixture's layout with its write-ahead log and checkpoint in `dir`.
  ShardOptions LoggedServer0(const std::string& dir) const {
    ShardOptions o;
    o.server_id = 0;
    o.solver = solver_;
    o.wal_path = dir + "/server-0.wal";
    o.checkpoint_path = dir + "/server-0.dpt";
    return o;
  }

  // Bytes of a top-k frame.
  static std::vector<std::byte> TopK(const std::vector<uint32_t>& idx, const std::vector<float>& values) {
    std::vector<std::byte> b(idx.size() * 4 + values.size() * 4);
    std::memcpy(b.data(), idx.data(), idx.size() * 4);
    std::memcpy(b.data() + idx.size() * 4, values.data(), values.size() * 4);
    return b;
  }

  SolverConfig solver_;
  InprocTransport transport_;
  ParamLayout layout_;
  std::vector<std::string> addresses_;
  std::vector<std::unique_ptr<ShardServer>> shards_;
};

TEST_F(CompressionTest, Fp16PushesApplyTheDecodedGradient) { CheckPushCodec(WireCodec::kFp16, true); }
TEST_F(CompressionTest, Bf16PushesApplyTheDecodedGradient) { CheckPushCodec(WireCodec::kBf16, true); }
TEST_F(CompressionTest, TopKWithErrorFeedbackAppliesTheDecodedGradient) { CheckPushCodec(WireCodec::kTopK, true); }
TEST_F(CompressionTest, TopKWithoutErrorFeedbackAppliesTheDecodedGradient) { CheckPushCodec(WireCodec::kTopK, false); }
TEST_F(CompressionTest, OneBitWithErrorFeedbackAppliesTheDecodedGradient) { CheckPushCodec(WireCodec::kOneBit, true); }

TEST_F(CompressionTest, HalfPullsDecodeWithinTheirBound) {
  const size_t n = static_cast<size_t>(layout_.total_elems());
  auto init = Client(WireCodec::kFp32, WireCodec::kFp32);
  std::vector<float> w0 = Gaussian(n, 2, 1.0f);
  w0[0] = 1e-6f;  // a half subnormal
  w0[1] = 3000.5f;
  ASSERT_TRUE(init->Wait(init->PushInit(w0), 5000ms).ok());
  for (WireCodec codec : {WireCodec::kFp16, WireCodec::kBf16}) {
    SCOPED_TRACE(WireCodecName(codec));
    auto client = Client(WireCodec::kFp32, codec);
    const uint64_t region_before = Sum(&ShardStatsWire::region_parts);
    std::vector<float> pulled(n, std::numeric_limits<float>::quiet_NaN());
    ASSERT_TRUE(client->Wait(client->Pull(pulled), 5000ms).ok());
    EXPECT_EQ(Sum(&ShardStatsWire::region_parts), region_before) << "a lossy pull went through shared memory";
    const float rel = codec == WireCodec::kFp16 ? 0x1p-11f : 0x1p-8f;
    for (size_t i = 0; i < n; ++i) {
      const float bound = std::max(rel * std::fabs(w0[i]), codec == WireCodec::kFp16 ? 0x1p-25f : 0.0f);
      ASSERT_LE(std::fabs(pulled[i] - w0[i]), bound) << "element " << i << ": " << pulled[i] << " vs " << w0[i];
      // Exactly the servers' conversion, round to nearest even.
      const float want = codec == WireCodec::kFp16 ? HalfToFloat(FloatToHalf(w0[i])) : Bf16ToFloat(FloatToBf16(w0[i]));
      ASSERT_EQ(pulled[i], want) << i;
    }
    EXPECT_EQ(AllWeights(), w0);  // the masters stay f32
    for (const Chunk& c : layout_.chunks()) EXPECT_EQ(client->last_versions()[static_cast<size_t>(c.id)], 0);
  }
}

// The servers convert each half pull into a buffer they reuse once the reply is sent: pulls
// between pushes see each new version's weights, never an earlier reply's.
TEST_F(CompressionTest, HalfPullsBetweenPushesSeeEachNewVersion) {
  const size_t n = static_cast<size_t>(layout_.total_elems());
  auto init = Client(WireCodec::kFp32, WireCodec::kFp32);
  ASSERT_TRUE(init->Wait(init->PushInit(Gaussian(n, 3, 0.5f)), 5000ms).ok());
  auto client = Client(WireCodec::kFp32, WireCodec::kFp16);
  std::vector<float> pulled(n);
  for (int step = 0; step < 4; ++step) {
    SCOPED_TRACE(step);
    ASSERT_TRUE(client->Wait(client->Pull(pulled), 5000ms).ok());
    const std::vector<float> w = AllWeights();
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(pulled[i], HalfToFloat(FloatToHalf(w[i]))) << i;
    ASSERT_TRUE(client->Wait(client->Push(Gaussian(n, 40 + static_cast<uint32_t>(step), 1.0f), step), 5000ms).ok());
  }
}

// The write-ahead log holds what the server decoded (dense f32): a shard killed after
// compressed pushes and recovered from its log equals the killed one byte for byte.
// Every lossy codec's pushes, logged by a shard with a write-ahead log: each gradient record is
// the push as the wire carried it (kCodedPush) wherever that is fewer bytes than its f32
// gradient, byte for byte what the client's encoder made of each chunk (fp16: half; top-k 1%: 3
// indices and values of 300 floats; 1-bit: the signs and a scale), and dense where the codec sends
// f32 (the small chunks top-k leaves dense, the init push); a shard recovered from the log alone
// equals the live one byte for byte (weights, momentum, versions).
TEST_F(CompressionTest, CompressedPushesAreLoggedAsTheyCameAndReplayByteForByte) {
  const size_t n = static_cast<size_t>(layout_.total_elems());
  for (WireCodec codec : {WireCodec::kFp16, WireCodec::kBf16, WireCodec::kTopK, WireCodec::kOneBit}) {
    SCOPED_TRACE(WireCodecName(codec));
    const std::string dir = FreshDir("compression_wal_");
    const ShardOptions o = LoggedServer0(dir);
    std::unique_ptr<ShardServer> logged;
    ASSERT_TRUE(ShardServer::Create(layout_, o, &logged).ok());
    ASSERT_TRUE(logged->OpenLog().ok());
    std::unique_ptr<ServerEndpoint> ep;
    ASSERT_TRUE(transport_.Bind(fmt::format("logged-{}", WireCodecName(codec)), &ep).ok());
    PsClientOptions co;
    co.server_addresses = {ep->address(), addresses_[1]};
    co.reply_timeout = 10000ms;
    co.compression.push = codec;
    co.compression.top_k_fraction = 0.01;
    logged->Start(std::move(ep));
    std::unique_ptr<PsClient> c;
    ASSERT_TRUE(PsClient::Create(&transport_, layout_, co, &c).ok());
    ASSERT_TRUE(c->Connect(5000ms).ok());
    ASSERT_TRUE(c->Wait(c->PushInit(Gaussian(n, 5, 0.1f)), 5000ms).ok());
    constexpr int kSteps = 3;
    for (int step = 0; step < kSteps; ++step) {
      ASSERT_TRUE(c->Wait(c->Push(Gaussian(n, 300 + static_cast<uint32_t>(step), 1.0f), step), 5000ms).ok());
    }
    c.reset();
    logged->Stop();
    ASSERT_TRUE(logged->Join().ok());

    // What the client's encoder sends of each of server 0's chunks (sizes do not depend on values).
    std::map<uint32_t, std::pair<WalKind, uint64_t>> expect;  // chunk -> record kind, payload bytes
    uint64_t coded_bytes = 0, dense_bytes = 0;
    for (int32_t id : layout_.ServerChunks(0)) {
      const auto count = static_cast<size_t>(layout_.chunk(id).count);
      ChunkEncoder encoder(CompressionConfig{.push = codec, .top_k_fraction = 0.01, .error_feedback = true});
      EncodedChunk e;
      const std::vector<float> g = Gaussian(count, 7, 1.0f);
      encoder.Encode(static_cast<uint32_t>(id), g, &e);
      const bool f32 = e.encoding == Encoding::kDense && encoder.dtype() == DType::kF32;
      expect[static_cast<uint32_t>(id)] = {f32 ? WalKind::kPush : WalKind::kCodedPush, f32 ? 0 : e.bytes.size()};
      if (!f32) {
        EXPECT_LT(e.bytes.size(), count * 4);
        coded_bytes += kSteps * e.bytes.size();
        dense_bytes += kSteps * count * 4;
      }
    }
    int inits = 0, gradients = 0;
    WalScanInfo info;
    const Status scanned = ScanWal(o.wal_path, [&](const WalRecord& r) {
      const MessageHeader& h = r.header;  // a coded push's, decoded by the scan
      const uint32_t chunk = r.kind == WalKind::kCodedPush ? h.chunk_ids.at(0) : r.chunks.at(0).chunk_id;
      if ((r.flags & kFlagInit) != 0) {
        ++inits;
        EXPECT_EQ(r.kind, WalKind::kPush);
        return Status::Ok();
      }
      ++gradients;
      EXPECT_EQ(r.kind, expect.at(chunk).first) << "chunk " << chunk;
      if (r.kind == WalKind::kCodedPush) {
        EXPECT_EQ(r.frames.size(), 2u);  // one chunk per message (max_chunks_per_message 1)
        EXPECT_EQ(r.frames[1].size(), expect.at(chunk).second) << "chunk " << chunk;
        EXPECT_TRUE(h.checksums.empty());
      }
      return Status::Ok();
    }, &info);
    ASSERT_TRUE(scanned.ok()) << scanned.ToString();
    EXPECT_EQ(inits, static_cast<int>(layout_.ServerChunks(0).size()));
    EXPECT_EQ(gradients, kSteps * static_cast<int>(layout_.ServerChunks(0).size()));
    std::printf("%s: the coded chunks' log payload %llu bytes, %.1fx fewer than their f32 gradients\n",
                WireCodecName(codec), static_cast<unsigned long long>(coded_bytes),
                static_cast<double>(dense_bytes) / static_cast<double>(coded_bytes));

    std::unique_ptr<ShardServer> recovered;
    ASSERT_TRUE(ShardServer::Create(layout_, o, &recovered).ok());
    RecoverReport report;
    ASSERT_TRUE(recovered->Recover(&report).ok());
    EXPECT_EQ(report.replayed_pushes, (kSteps + 1) * layout_.ServerChunks(0).size());
    for (int32_t id : layout_.ServerChunks(0)) {
      const auto wa = logged->ChunkWeights(id), wb = recovered->ChunkWeights(id);
      ASSERT_EQ(wa.size(), wb.size());
      EXPECT_EQ(std::memcmp(wa.data(), wb.data(), wa.size() * 4), 0) << "weights of chunk " << id;
      const auto ha = logged->ChunkHistory(id), hb = recovered->ChunkHistory(id);
      EXPECT_EQ(std::memcmp(ha.data(), hb.data(), ha.size() * 4), 0) << "momentum of chunk " << id;
      EXPECT_EQ(logged->ChunkVersion(id), kSteps);
      EXPECT_EQ(recovered->ChunkVersion(id), kSteps);
    }
    std::filesystem::remove_all(dir);
  }
}

// A coded push record that is whole on disk but does not decode (here: its frame is shorter
// than its header says) stops the recovery with an error naming the log, the record and the
// reason, instead of applying a guess.
TEST_F(CompressionTest, ALoggedCodedPushThatDoesNotDecodeStopsTheRecoveryNamingTheRecord) {
  const std::string dir = FreshDir("compression_wal_bad_");
  const ShardOptions o = LoggedServer0(dir);
  const int32_t id = layout_.ServerChunks(0)[0];
  const auto count = static_cast<size_t>(layout_.chunk(id).count);
  const std::vector<float> w0(count, 0.5f);
  std::string bytes, rec;
  WalRecord init;
  init.kind = WalKind::kPush;
  init.seq = 1;
  init.flags = kFlagInit;
  init.chunks = {WalChunk{static_cast<uint32_t>(id), 0, w0.data(), static_cast<uint32_t>(count)}};
  EncodeWalRecord(init, &bytes);
  MessageHeader h;
  h.type = MsgType::kPush;
  h.layout_hash = layout_.hash();
  h.chunk_ids = {static_cast<uint32_t>(id)};
  h.versions = {0};
  h.dtype = DType::kF16;
  h.elem_counts = {count};
  h.byte_lengths = {count * 2};
  Frame head;
  ASSERT_TRUE(HeaderFrame(h, &head).ok());
  WalRecord coded;
  coded.kind = WalKind::kCodedPush;
  coded.seq = 2;
  coded.frames = {head, Frame::Copy(std::string(count, '\0'))};  // half the f16 bytes it claims
  EncodeWalRecord(coded, &rec);
  bytes += rec;
  { std::ofstream(o.wal_path, std::ios::binary) << bytes; }
  std::unique_ptr<ShardServer> shard;
  ASSERT_TRUE(ShardServer::Create(layout_, o, &shard).ok());
  RecoverReport report;
  const Status s = shard->Recover(&report);
  EXPECT_EQ(s.code(), StatusCode::kCorrupt) << s.ToString();
  EXPECT_NE(s.message().find(o.wal_path + ": record seq 2"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("byte_length"), std::string::npos) << s.message();
  std::printf("%s\n", s.ToString().c_str());
  std::filesystem::remove_all(dir);
}

// A weight beyond f16's range arrives as Inf: the pull fails naming the chunk, and the caller's
// buffer keeps what it had for that chunk (check all, then write all).
TEST_F(CompressionTest, Fp16PullOfAWeightBeyondItsRangeFailsNamingTheChunk) {
  const size_t n = static_cast<size_t>(layout_.total_elems());
  auto init = Client(WireCodec::kFp32, WireCodec::kFp32);
  std::vector<float> w0(n, 0.5f);
  w0[n - 1] = 1e6f;
  ASSERT_TRUE(init->Wait(init->PushInit(w0), 5000ms).ok());
  auto client = Client(WireCodec::kFp32, WireCodec::kFp16);
  std::vector<float> pulled(n, -7.0f);
  const Status s = client->Wait(client->Pull(pulled), 5000ms);
  ASSERT_FALSE(s.ok());
  const Chunk& last = layout_.chunk(layout_.num_chunks() - 1);
  EXPECT_NE(s.message().find(fmt::format("chunk {}", last.id)), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("NaN or Inf"), std::string::npos) << s.ToString();
  EXPECT_EQ(pulled[n - 1], -7.0f);
  EXPECT_EQ(pulled[0], 0.5f);  // other chunks arrived
  // bf16 has f32's range.
  auto wide = Client(WireCodec::kFp32, WireCodec::kBf16);
  ASSERT_TRUE(wide->Wait(wide->Pull(pulled), 5000ms).ok());
  EXPECT_EQ(pulled[n - 1], 999424.0f);  // 1e6 to 8 significant bits, to nearest even
}

TEST_F(CompressionTest, ClientRefusesAPullCodecOrTopKFractionItCannotUse) {
  PsClientOptions o;
  o.server_addresses = addresses_;
  std::unique_ptr<PsClient> c;
  o.compression.pull = WireCodec::kTopK;
  Status s = PsClient::Create(&transport_, layout_, o, &c);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("compression.pull topk"), std::string::npos) << s.ToString();
  o.compression.pull = WireCodec::kFp16;
  for (double f : {0.0, -0.5, 1.5, std::numeric_limits<double>::quiet_NaN()}) {
    o.compression.top_k_fraction = f;
    s = PsClient::Create(&transport_, layout_, o, &c);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << f;
    EXPECT_NE(s.message().find("top_k_fraction"), std::string::npos) << s.ToString();
  }
}

// A raw worker connection to server 0, to send payloads no client would.
class RawWorker {
 public:
  RawWorker(InprocTransport* t, const std::string& address, const ParamLayout& layout) : layout_(layout) {
    EXPECT_TRUE(t->Connect(address, &ep_).ok());
    MessageHeader h = Base(MsgType::kRegister);
    EXPECT_EQ(Exchange(h, {}).type, MsgType::kRegisterReply);
  }
  MessageHeader Base(MsgType type) const {
    MessageHeader h;
    h.type = type;
    h.sender = 0;
    h.layout_hash = layout_.hash();
    h.request_id = ++id_;
    return h;
  }
  // A gradient push of one chunk carrying `bytes` as `encoding` / `dtype`.
  MessageHeader Push(int32_t chunk, Encoding encoding, DType dtype, const std::vector<std::byte>& bytes,
                     uint32_t flags = 0) {
    MessageHeader h = Base(MsgType::kPush);
    h.flags = flags;
    h.chunk_ids = {static_cast<uint32_t>(chunk)};
    h.versions = {0};
    h.elem_counts = {static_cast<uint64_t>(layout_.chunk(chunk).count)};
    h.byte_lengths = {bytes.size()};
    h.dtype = dtype;
    h.encoding = encoding;
    return Exchange(h, {Frame::Copy(bytes.data(), bytes.size())});
  }
  MessageHeader Exchange(const MessageHeader& h, Frames payload) {
    Frames f(1);
    EXPECT_TRUE(HeaderFrame(h, &f[0]).ok());
    for (auto& p : payload) f.push_back(std::move(p));
    EXPECT_TRUE(ep_->Send(std::move(f)).ok());
    Frames got;
    MessageHeader r;
    const Status s = ep_->Receive(&got, 5000ms);
    EXPECT_TRUE(s.ok()) << s.ToString();
    if (s.ok()) {
      EXPECT_TRUE(ParseHeader(got, &r).ok());
    }
    return r;
  }

 private:
  const ParamLayout& layout_;
  std::unique_ptr<ClientEndpoint> ep_;
  mutable uint64_t id_ = 0;
};

TEST_F(CompressionTest, BadCompressedPayloadsAreRefusedCountedAndChangeNothing) {
  const size_t n = static_cast<size_t>(layout_.total_elems());
  auto init = Client(WireCodec::kFp32, WireCodec::kFp32);
  ASSERT_TRUE(init->Wait(init->PushInit(Gaussian(n, 3, 0.1f)), 5000ms).ok());
  // One good top-k push first, so momentum is nonzero and "unchanged" means something.
  RawWorker raw(&transport_, addresses_[0], layout_);
  const int32_t id = layout_.ServerChunks(0)[0];
  const auto count = static_cast<uint32_t>(layout_.chunk(id).count);
  ASSERT_EQ(raw.Push(id, Encoding::kTopK, DType::kF32, TopK({1, 7, 200}, {0.5f, -1.0f, 2.0f})).type, MsgType::kAck);

  const float nan = std::numeric_limits<float>::quiet_NaN();
  auto one_bit = [&](float scale) {
    std::vector<std::byte> b(4 + (count + 7) / 8);
    std::memcpy(b.data(), &scale, 4);
    return b;
  };
  std::vector<std::byte> half_short(count * 2 - 2);
  struct Case {
    const char* what;
    Encoding encoding;
    DType dtype;
    std::vector<std::byte> bytes;
    RejectReason reason;
    uint32_t flags = 0;
  };
  const std::vector<Case> cases = {
      {"index out of range", Encoding::kTopK, DType::kF32, TopK({1, count}, {1, 2}), RejectReason::kElemCount},
      {"unsorted indices", Encoding::kTopK, DType::kF32, TopK({9, 3}, {1, 2}), RejectReason::kElemCount},
      {"duplicate indices", Encoding::kTopK, DType::kF32, TopK({3, 3}, {1, 2}), RejectReason::kElemCount},
      {"k > n", Encoding::kTopK, DType::kF32,
       TopK(std::vector<uint32_t>(count + 1, 0), std::vector<float>(count + 1, 1.0f)), RejectReason::kElemCount},
      {"top-k length not whole entries", Encoding::kTopK, DType::kF16, std::vector<std::byte>(13),
       RejectReason::kByteLength},
      {"f16 dense too short", Encoding::kDense, DType::kF16, half_short, RejectReason::kByteLength},
      {"one-bit wrong length", Encoding::kOneBit, DType::kF32, std::vector<std::byte>(7), RejectReason::kByteLength},
      {"one-bit NaN scale", Encoding::kOneBit, DType::kF32, one_bit(nan), RejectReason::kNonFinite},
      {"one-bit negative scale", Encoding::kOneBit, DType::kF32, one_bit(-1.0f), RejectReason::kNonFinite},
      {"top-k NaN value", Encoding::kTopK, DType::kF32, TopK({1, 2}, {nan, 1}), RejectReason::kNonFinite},
      {"sufficient factors", Encoding::kFactors, DType::kF32, std::vector<std::byte>(count * 4), RejectReason::kDType},
      {"lossy init push", Encoding::kTopK, DType::kF32, TopK({1, 2}, {1, 2}), RejectReason::kDType, kFlagInit},
  };
  const std::vector<float> weights = AllWeights(), history = AllHistory();
  const int64_t version = shards_[0]->ChunkVersion(id);
  ASSERT_EQ(version, 1);
  std::vector<uint64_t> by_reason = shards_[0]->Stats().rejected_by_reason;
  uint64_t rejected = Rejected();
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const MessageHeader r = raw.Push(id, c.encoding, c.dtype, c.bytes, c.flags);
    ASSERT_EQ(r.type, MsgType::kError);
    EXPECT_EQ(r.flags, static_cast<uint32_t>(c.reason)) << r.error_text;
    if (c.flags == 0) {
      EXPECT_NE(r.error_text.find(fmt::format("chunk {}", id)), std::string::npos) << r.error_text;
    }
    ++by_reason[static_cast<size_t>(c.reason)];
    EXPECT_EQ(shards_[0]->Stats().rejected_by_reason, by_reason);
    EXPECT_EQ(Rejected(), ++rejected);
    const std::vector<float> w = AllWeights(), h = AllHistory();
    ASSERT_EQ(std::memcmp(w.data(), weights.data(), w.size() * 4), 0) << "weights changed";
    ASSERT_EQ(std::memcmp(h.data(), history.data(), h.size() * 4), 0) << "momentum changed";
    EXPECT_EQ(shards_[0]->ChunkVersion(id), version);
  }
  // A pull asking for an encoding (pulls are dense) is refused as kDType too.
  MessageHeader pull = raw.Base(MsgType::kPull);
  pull.encoding = Encoding::kTopK;
  const MessageHeader r = raw.Exchange(pull, {});
  ASSERT_EQ(r.type, MsgType::kError);
  EXPECT_EQ(r.flags, static_cast<uint32_t>(RejectReason::kDType)) << r.error_text;
}

// A resend (after the server moved or restarted) carries the bytes of the first send: the part
// is not encoded again and the residual is not touched. A stand-in server takes the first send
// of server 0's parts and never answers; the client is then moved to the real server 0 and
// resends. If a resend encoded again, error feedback would have advanced the residual twice and
// the weights would differ from the reference (one encode per chunk per step).
TEST_F(CompressionTest, ResentPartsAreNotEncodedAgain) {
  const size_t n = static_cast<size_t>(layout_.total_elems());
  auto init = Client(WireCodec::kFp32, WireCodec::kFp32);
  const std::vector<float> w0 = Gaussian(n, 4, 0.1f);
  ASSERT_TRUE(init->Wait(init->PushInit(w0), 5000ms).ok());

  std::unique_ptr<ServerEndpoint> fake;
  ASSERT_TRUE(transport_.Bind("stand-in", &fake).ok());
  std::atomic<bool> stop{false};
  std::atomic<int> swallowed{0};
  std::thread stand_in([&] {
    while (!stop.load()) {
      PeerId from;
      Frames frames;
      if (!fake->Receive(&from, &frames, 10ms).ok()) continue;
      MessageHeader h;
      if (!ParseHeader(frames, &h).ok()) continue;
      if (h.type == MsgType::kPush) {
        ++swallowed;  // taken, never answered
        continue;
      }
      MessageHeader reply;  // register and probes: answered, so the client sends its parts
      reply.type = h.type == MsgType::kRegister ? MsgType::kRegisterReply : h.type;
      reply.request_id = h.request_id;
      reply.layout_hash = layout_.hash();
      Frames out(1);
      if (HeaderFrame(reply, &out[0]).ok()) (void)fake->Send(from, std::move(out));
    }
  });
  PsClientOptions o;
  o.server_addresses = {fake->address(), addresses_[1]};
  o.reply_timeout = 10000ms;
  o.max_chunks_per_message = 2;
  o.compression.push = WireCodec::kTopK;
  o.compression.top_k_fraction = 0.01;
  std::unique_ptr<PsClient> client;
  ASSERT_TRUE(PsClient::Create(&transport_, layout_, o, &client).ok());
  ASSERT_TRUE(client->Connect(5000ms).ok());

  ChunkEncoder reference(CompressionConfig{.push = WireCodec::kTopK, .top_k_fraction = 0.01, .error_feedback = true});
  std::vector<float> ref = w0, hist(n, 0.0f);
  constexpr int kSteps = 3;
  const size_t parts0 = (layout_.ServerChunks(0).size() + 1) / 2;
  for (int step = 0; step < kSteps; ++step) {
    const std::vector<float> g = Gaussian(n, 200 + static_cast<uint32_t>(step), 1.0f);
    const RequestId id = client->Push(g, step);
    if (step == 0) {  // the first push's parts to server 0 go to the stand-in, then move
      for (int i = 0; i < 500 && static_cast<size_t>(swallowed.load()) < parts0; ++i) std::this_thread::sleep_for(10ms);
      ASSERT_EQ(static_cast<size_t>(swallowed.load()), parts0);
      ASSERT_TRUE(client->SetServerAddress(0, addresses_[0]).ok());
    }
    const Status s = client->Wait(id, 10000ms);
    ASSERT_TRUE(s.ok()) << s.ToString();
    for (const Chunk& c : layout_.chunks()) {
      const auto count = static_cast<size_t>(c.count);
      EncodedChunk e;
      reference.Encode(static_cast<uint32_t>(c.id), std::span<const float>(g.data() + c.flat_offset, count), &e);
      std::vector<float> decoded(count);
      CodecFault fault;
      ASSERT_TRUE(
          DecodeChunk(e.encoding, reference.dtype(), e.bytes, decoded, static_cast<uint32_t>(c.id), &fault).ok());
      const TensorSpec& t = layout_.tensors()[static_cast<size_t>(c.tensor)];
      const UpdateParams p = MakeUpdateParams(solver_, step, t.lr_mult, t.decay_mult, 1.0f);
      SgdUpdate(p, std::span<const float>(decoded), std::span<float>(ref.data() + c.flat_offset, count),
                std::span<float>(hist.data() + c.flat_offset, count));
    }
  }
  stop = true;
  stand_in.join();
  EXPECT_EQ(client->resent_parts(0), parts0);  // every part of server 0's first push went twice
  EXPECT_EQ(AllWeights(), ref);                // bit for bit: each chunk encoded once per step
  EXPECT_EQ(Rejected(), 0u);
}

}  // namespace
}  // namespace downpour
