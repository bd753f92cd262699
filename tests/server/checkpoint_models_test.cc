// checkpoint_models_test.cc — every model's shard checkpoints round-trip byte for byte (issue 13,
// "What it must show"). For each configs/models/*.toml, the layout its worker would build
// (engine::InferShapes' parameter list, the default chunk size) at S = 1, 2 and 4 servers; each
// shard is filled through its message path with distinctive state — initial weights that differ
// per chunk and element, 1..3 gradient pushes per chunk (so momentum history and versions differ
// per chunk), one chunk of server 0 left uninitialised — then SaveCheckpoint, LoadCheckpoint into a
// fresh ShardServer, and the fresh shard must hold the same weights and versions (ChunkWeights,
// ChunkVersion) and write a second checkpoint identical to the first byte for byte (which covers
// the history). A checkpoint cut short anywhere in its last KiB and at a handful of other points is
// refused as kCorrupt naming the file, and leaves the loading shard's state as it was.
//
// Built twice from this file: checkpoint_models_test (quick: every model but the AlexNets) and
// checkpoint_models_heavy_test (heavy: alexnet and alexnet_fashion, 61M and 57M parameters,
// ~0.5 GB a checkpoint at S = 1; alexnet_fashion alone took most of the quick test's time).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "client/engine/net_spec.h"
#include "common/inproc_transport.h"
#include "common/run_config.h"
#include "downpour_config.h"
#include "server/shard.h"

#ifndef DOWNPOUR_HEAVY_MODELS
#define DOWNPOUR_HEAVY_MODELS 0
#endif

namespace downpour {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

// The models this build of the test covers: the AlexNets in the heavy one, the others in the quick one.
std::vector<fs::path> Models() {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(fs::path(DOWNPOUR_SOURCE_DIR) / "configs" / "models")) {
    if (e.path().extension() != ".toml") continue;
    const bool heavy = e.path().stem().string().starts_with("alexnet");
    if (heavy == (DOWNPOUR_HEAVY_MODELS != 0)) out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// The layout a worker builds for `model` with S servers (worker_app.cc WriteTensorList's list).
ParamLayout ModelLayout(const fs::path& model, int servers) {
  engine::NetSpec spec;
  Status s = engine::ParseNetSpecFile(model.string(), &spec);
  EXPECT_TRUE(s.ok()) << s.ToString();
  engine::NetShapes shapes;
  s = engine::InferShapes(spec, 1, &shapes);
  EXPECT_TRUE(s.ok()) << s.ToString();
  ParamLayout layout;
  s = ParamLayout::Build(shapes.params, servers, ClusterConfig{}.chunk_elems, &layout);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return layout;
}

// Byte-for-byte equality of two files, read 1 MiB at a time (AlexNet's are 0.5 GB).
bool SameBytes(const fs::path& a, const fs::path& b) {
  if (fs::file_size(a) != fs::file_size(b)) return false;
  std::ifstream fa(a, std::ios::binary), fb(b, std::ios::binary);
  std::vector<char> ba(1 << 20), bb(1 << 20);
  while (fa && fb) {
    fa.read(ba.data(), static_cast<std::streamsize>(ba.size()));
    fb.read(bb.data(), static_cast<std::streamsize>(bb.size()));
    if (fa.gcount() != fb.gcount() || std::memcmp(ba.data(), bb.data(), static_cast<size_t>(fa.gcount())) != 0) {
      return false;
    }
  }
  return true;
}

class CheckpointModels : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           fmt::format("downpour_ckpt_models_{}_{}", ::getpid(),
                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // One message from `ep`, which must be answered with `expect`.
  static void Exchange(ClientEndpoint* ep, const MessageHeader& h, const std::vector<float>* payload, MsgType expect) {
    Frames f(1);
    ASSERT_TRUE(HeaderFrame(h, &f[0]).ok());
    if (payload != nullptr) f.push_back(Frame::Copy(payload->data(), payload->size() * 4));
    ASSERT_TRUE(ep->Send(std::move(f)).ok());
    Frames reply;
    ASSERT_TRUE(ep->Receive(&reply, 30000ms).ok());
    MessageHeader r;
    ASSERT_TRUE(ParseHeader(reply, &r).ok());
    ASSERT_EQ(r.type, expect) << r.error_text;
  }

  // Fills server `s`'s shard through its message path: every owned chunk but (on server 0, when
  // it owns two or more) the last gets initial weights w[i] = id + i / 2^20 - 0.5 (distinct per
  // chunk and element) and 1 + id % 3 gradient pushes g[i] = (i % 7 - 3) / 64 + step / 8.
  void Fill(const ParamLayout& layout, ShardServer* shard, int s, InprocTransport* t, const std::string& address) {
    std::unique_ptr<ClientEndpoint> ep;
    ASSERT_TRUE(t->Connect(address, &ep).ok());
    MessageHeader reg;
    reg.type = MsgType::kRegister;
    reg.sender = 0;
    reg.layout_hash = layout.hash();
    Exchange(ep.get(), reg, nullptr, MsgType::kRegisterReply);
    std::span<const int32_t> owned = layout.ServerChunks(s);
    const size_t init_count = (s == 0 && owned.size() >= 2) ? owned.size() - 1 : owned.size();
    for (size_t k = 0; k < init_count; ++k) {
      const int32_t id = owned[k];
      const auto n = static_cast<size_t>(layout.chunk(id).count);
      MessageHeader h;
      h.type = MsgType::kPush;
      h.sender = 0;
      h.layout_hash = layout.hash();
      h.chunk_ids = {static_cast<uint32_t>(id)};
      h.elem_counts = {n};
      h.byte_lengths = {n * 4};
      h.flags = kFlagInit;
      std::vector<float> v(n);
      for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>(id) + static_cast<float>(i) / 1048576.0f - 0.5f;
      Exchange(ep.get(), h, &v, MsgType::kAck);
      h.flags = 0;
      for (int step = 0; step <= id % 3; ++step) {
        h.versions = {step};
        for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>(static_cast<int>(i % 7) - 3) / 64.0f + step / 8.0f;
        Exchange(ep.get(), h, &v, MsgType::kAck);
      }
      ASSERT_EQ(shard->ChunkVersion(id), 1 + id % 3);
    }
    if (init_count < owned.size()) {
      ASSERT_TRUE(shard->ChunkWeights(owned.back()).empty());
    }
  }

  // `b` holds exactly `a`'s state: weights byte for byte (or both uninitialised) and versions.
  static void ExpectSameShard(const ParamLayout& layout, int s, const ShardServer& a, const ShardServer& b) {
    for (int32_t id : layout.ServerChunks(s)) {
      const std::vector<float> wa = a.ChunkWeights(id), wb = b.ChunkWeights(id);
      ASSERT_EQ(wa.size(), wb.size()) << "chunk " << id;
      EXPECT_EQ(std::memcmp(wa.data(), wb.data(), wa.size() * 4), 0) << "chunk " << id << " weights differ";
      EXPECT_EQ(a.ChunkVersion(id), b.ChunkVersion(id)) << "chunk " << id;
    }
  }

  fs::path dir_;
};

TEST_F(CheckpointModels, EveryModelsShardsRoundTripByteForByteAtOneTwoAndFourServers) {
  const std::vector<fs::path> models = Models();
  ASSERT_FALSE(models.empty());
  for (const fs::path& model : models) {
    for (int servers : {1, 2, 4}) {
      SCOPED_TRACE(fmt::format("{} S={}", model.stem().string(), servers));
      const ParamLayout layout = ModelLayout(model, servers);
      ASSERT_FALSE(HasFailure());
      InprocTransport transport;
      for (int s = 0; s < servers; ++s) {
        SCOPED_TRACE(fmt::format("server {}", s));
        ShardOptions o;
        o.server_id = s;
        o.solver.base_lr = 0.01f;
        o.solver.momentum = 0.9f;
        o.solver.weight_decay = 0.0005f;
        std::unique_ptr<ShardServer> shard;
        ASSERT_TRUE(ShardServer::Create(layout, o, &shard).ok());
        std::unique_ptr<ServerEndpoint> ep;
        const std::string name = fmt::format("{}-{}-{}", model.stem().string(), servers, s);
        ASSERT_TRUE(transport.Bind(name, &ep).ok());
        const std::string address = ep->address();
        shard->Start(std::move(ep));
        Fill(layout, shard.get(), s, &transport, address);
        shard->Stop();
        ASSERT_TRUE(shard->Join().ok());
        ASSERT_FALSE(HasFatalFailure());

        const fs::path first = dir_ / (name + ".dpt"), second = dir_ / (name + ".again.dpt");
        ASSERT_TRUE(shard->SaveCheckpoint(first.string()).ok());
        std::unique_ptr<ShardServer> fresh;
        ASSERT_TRUE(ShardServer::Create(layout, o, &fresh).ok());
        const Status load = fresh->LoadCheckpoint(first.string());
        ASSERT_TRUE(load.ok()) << load.ToString();
        ExpectSameShard(layout, s, *shard, *fresh);
        ASSERT_TRUE(fresh->SaveCheckpoint(second.string()).ok());
        EXPECT_TRUE(SameBytes(first, second)) << "the restored shard's checkpoint differs from the original's";
        fs::remove(first);
        fs::remove(second);
      }
    }
  }
}

#if !DOWNPOUR_HEAVY_MODELS
// A checkpoint cut short is refused as corrupt, naming the file, and the shard that tried to load
// it keeps the state it had: every cut in the last KiB (the last tensors' data, CRCs and ends)
// and a handful elsewhere (inside the header and meta, at its CRC, in the first tensor, halfway).
TEST_F(CheckpointModels, TruncatedCheckpointIsCorruptNamingTheFileAndLeavesTheShardAsItWas) {
  const ParamLayout layout = ModelLayout(fs::path(DOWNPOUR_SOURCE_DIR) / "configs/models/fmnist_small.toml", 2);
  ShardOptions o;
  o.solver.momentum = 0.9f;
  InprocTransport transport;
  std::unique_ptr<ShardServer> shard;
  ASSERT_TRUE(ShardServer::Create(layout, o, &shard).ok());
  std::unique_ptr<ServerEndpoint> ep;
  ASSERT_TRUE(transport.Bind("truncated", &ep).ok());
  const std::string address = ep->address();
  shard->Start(std::move(ep));
  Fill(layout, shard.get(), 0, &transport, address);
  shard->Stop();
  ASSERT_TRUE(shard->Join().ok());
  ASSERT_FALSE(HasFatalFailure());
  const fs::path path = dir_ / "shard0.dpt";
  ASSERT_TRUE(shard->SaveCheckpoint(path.string()).ok());
  const auto size = static_cast<size_t>(fs::file_size(path));
  ASSERT_GT(size, 8192u);

  std::vector<size_t> cuts;
  for (size_t k = 1; k <= 1024; ++k) cuts.push_back(size - k);
  for (size_t c : {size_t{0}, size_t{1}, size_t{15}, size_t{16}, size_t{19}, size_t{20}, size_t{64}, size_t{200},
                   size_t{4096}, size / 3, size / 2, 2 * size / 3, size - 4096}) {
    cuts.push_back(c);
  }
  std::sort(cuts.rbegin(), cuts.rend());  // shrinking the one file, longest cut first
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  // The loading shard holds a state of its own (a good load of the full file) that must survive.
  std::unique_ptr<ShardServer> loader;
  ASSERT_TRUE(ShardServer::Create(layout, o, &loader).ok());
  ASSERT_TRUE(loader->LoadCheckpoint(path.string()).ok());
  for (size_t cut : cuts) {
    fs::resize_file(path, cut);
    const Status s = loader->LoadCheckpoint(path.string());
    ASSERT_EQ(s.code(), StatusCode::kCorrupt) << "cut at " << cut << " of " << size << ": " << s.ToString();
    ASSERT_NE(s.message().find(path.string()), std::string::npos) << s.message();
    ASSERT_NE(s.message().find("truncated"), std::string::npos) << "cut at " << cut << ": " << s.message();
  }
  ExpectSameShard(layout, 0, *shard, *loader);
  std::printf("%zu cut points of a %zu-byte checkpoint refused as truncated\n", cuts.size(), size);
}
#endif

}  // namespace
}  // namespace downpour
