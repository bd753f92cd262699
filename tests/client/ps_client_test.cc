// ps_client_test.cc — the PS client's own contract: request ids and Wait, errors surfacing at
// Wait, buffer lifetime of zero-copy pushes, chunk / tensor subsets, versions, and the run's
// token on register, re-register, checkpoint and shutdown (the servers here require it).
#include "client/ps/ps_client.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <thread>

#include "common/inproc_transport.h"
#include "server/shard.h"

namespace downpour {
namespace {

using namespace std::chrono_literals;

constexpr const char* kSecret = "5ec2e75ec2e75ec2e75ec2e75ec2e75ec2e75ec2e75ec2e75ec2e75ec2e75ec2";

// The servers of these tests: the update is w -= g, and the run's secret is required.
ShardOptions TestShardOptions() {
  ShardOptions o;
  o.solver.base_lr = 1.0f;
  o.solver.momentum = 0.0f;
  o.solver.weight_decay = 0.0f;
  o.access.run_secret = kSecret;
  o.access.run_dir = ::testing::TempDir();
  o.max_workers = 4;  // worker 1 (PullWaitsForInit...) is an elastic id beyond expected_workers = 1
  return o;
}

class PsClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(ParamLayout::Build({{"a", {10, 10}, 1, 1}, {"b", {10}, 1, 1}, {"c", {50}, 1, 1}}, 2, 32, &layout_).ok());
    ShardOptions o = TestShardOptions();
    for (int s = 0; s < 2; ++s) {
      o.server_id = s;
      std::unique_ptr<ShardServer> shard;
      ASSERT_TRUE(ShardServer::Create(layout_, o, &shard).ok());
      std::unique_ptr<ServerEndpoint> ep;
      ASSERT_TRUE(transport_.Bind(fmt::format("s{}", s), &ep).ok());
      shard->Start(std::move(ep));
      shards_.push_back(std::move(shard));
    }
    PsClientOptions co = ClientOptions(kSecret);
    ASSERT_TRUE(PsClient::Create(&transport_, layout_, co, &client_).ok());
    ASSERT_TRUE(client_->Connect(5000ms).ok());
    n_ = static_cast<size_t>(layout_.total_elems());
  }
  static PsClientOptions ClientOptions(const std::string& token) {
    PsClientOptions co;
    co.server_addresses = {"s0", "s1"};
    co.reply_timeout = 5000ms;
    co.max_chunks_per_message = 4;
    co.token = token;
    return co;
  }
  void TearDown() override {
    client_.reset();
    for (auto& s : shards_) s->Stop();
    for (auto& s : shards_) EXPECT_TRUE(s->Join().ok());
  }
  InprocTransport transport_;
  ParamLayout layout_;
  std::vector<std::unique_ptr<ShardServer>> shards_;
  std::unique_ptr<PsClient> client_;
  size_t n_ = 0;
};

TEST_F(PsClientTest, WaitForgetsFinishedRequests) {
  const std::vector<float> init(n_, 1.0f);  // must outlive the Wait (zero-copy push)
  const RequestId id = client_->PushInit(init);
  ASSERT_TRUE(client_->Wait(id, 5000ms).ok());
  Status again = client_->Wait(id, 10ms);
  EXPECT_EQ(again.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(again.message().find("already waited"), std::string::npos);
}

TEST_F(PsClientTest, WrongBufferSizeSurfacesAtWait) {
  std::vector<float> small(n_ - 1);
  Status s = client_->Wait(client_->Pull(small), 1000ms);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find(std::to_string(n_)), std::string::npos) << s.message();
}

TEST_F(PsClientTest, ServerErrorSurfacesAtWaitWithTheServerNamed) {
  // A gradient before any init is refused by the server.
  std::vector<float> g(n_, 1.0f);
  Status s = client_->Wait(client_->Push(g, 0), 5000ms);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("server "), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("initialised"), std::string::npos) << s.message();
}

TEST_F(PsClientTest, PullWaitsForInitThenTimesOutCleanly) {
  // Requests to one server run one at a time, so the init comes from another worker's client.
  PsClientOptions co = ClientOptions(kSecret);
  co.worker_id = 1;
  std::unique_ptr<PsClient> other;
  ASSERT_TRUE(PsClient::Create(&transport_, layout_, co, &other).ok());
  ASSERT_TRUE(other->Connect(5000ms).ok());
  std::vector<float> w(n_);
  const RequestId id = other->Pull(w);
  EXPECT_EQ(other->Wait(id, 100ms).code(), StatusCode::kTimeout);  // no init yet
  ASSERT_TRUE(client_->Wait(client_->PushInit(std::vector<float>(n_, 3.0f)), 5000ms).ok());
  ASSERT_TRUE(other->Wait(id, 5000ms).ok());  // the same request completes after init
  EXPECT_EQ(w, std::vector<float>(n_, 3.0f));
}

TEST_F(PsClientTest, PushTensorsTouchesOnlyThoseTensors) {
  ASSERT_TRUE(client_->Wait(client_->PushInit(std::vector<float>(n_, 0.0f)), 5000ms).ok());
  std::vector<float> w(n_);
  ASSERT_TRUE(client_->Wait(client_->Pull(w), 5000ms).ok());
  std::vector<float> g(n_, 1.0f);
  ASSERT_TRUE(client_->Wait(client_->PushTensors(g, 1, 2, 0), 5000ms).ok());  // tensor "b" only
  ASSERT_TRUE(client_->Wait(client_->Pull(w), 5000ms).ok());
  for (size_t i = 0; i < n_; ++i) {
    const bool in_b = i >= 100 && i < 110;
    EXPECT_EQ(w[i], in_b ? -1.0f : 0.0f) << i;
  }
  for (const Chunk& c : layout_.chunks()) {
    EXPECT_EQ(client_->last_versions()[static_cast<size_t>(c.id)], c.tensor == 1 ? 1 : 0);
  }
  // An empty tensor range pushes nothing.
  ASSERT_TRUE(client_->Wait(client_->PushTensors(g, 2, 2, 0), 5000ms).ok());
  uint64_t updates = 0;
  for (int s = 0; s < 2; ++s) {
    ShardStatsWire st;
    ASSERT_TRUE(client_->Stats(s, &st, 5000ms).ok());
    updates += st.chunk_updates;
  }
  EXPECT_EQ(updates, layout_.ChunksInRange(100, 110).size());
}

TEST_F(PsClientTest, PushCarriesThePulledVersionsSoStalenessIsMeasured) {
  ASSERT_TRUE(client_->Wait(client_->PushInit(std::vector<float>(n_, 0.0f)), 5000ms).ok());
  std::vector<float> w(n_), g(n_, 1.0f);
  ASSERT_TRUE(client_->Wait(client_->Pull(w), 5000ms).ok());  // versions 0
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(client_->Wait(client_->Push(g, i), 5000ms).ok());
  // Pushes 2 and 3 were computed from version 0 while the chunks were at 1 and 2.
  for (int s = 0; s < 2; ++s) {
    ShardStatsWire st;
    ASSERT_TRUE(client_->Stats(s, &st, 5000ms).ok());
    const uint64_t chunks = layout_.ServerChunks(s).size();
    EXPECT_EQ(st.staleness_histogram[0], chunks);
    EXPECT_EQ(st.staleness_histogram[1], chunks);
    EXPECT_EQ(st.staleness_histogram[2], chunks);
    EXPECT_EQ(st.staleness_max, 2u);
  }
}

TEST_F(PsClientTest, ManyRequestsInFlightAcrossServers) {
  ASSERT_TRUE(client_->Wait(client_->PushInit(std::vector<float>(n_, 0.0f)), 5000ms).ok());
  std::vector<float> g(n_, 1.0f);
  std::vector<RequestId> ids;
  for (int i = 0; i < 50; ++i) ids.push_back(client_->Push(g, i));
  for (RequestId id : ids) ASSERT_TRUE(client_->Wait(id, 5000ms).ok());
  std::vector<float> w(n_);
  ASSERT_TRUE(client_->Wait(client_->Pull(w), 5000ms).ok());
  EXPECT_EQ(w, std::vector<float>(n_, -50.0f));
}

TEST_F(PsClientTest, ClientRegistersAgainAfterAServerRestartAndNothingIsAppliedTwice) {
  ASSERT_TRUE(client_->Wait(client_->PushInit(std::vector<float>(n_, 0.0f)), 5000ms).ok());
  std::vector<float> g(n_, 1.0f), w(n_);
  ASSERT_TRUE(client_->Wait(client_->Push(g, 0), 5000ms).ok());
  const std::string path = ::testing::TempDir() + "/ps_client_restart.dpt";
  ASSERT_TRUE(client_->Checkpoint(0, path, 5000ms).ok());
  // Server 0 dies and comes back from its checkpoint under the same address.
  shards_[0]->Stop();
  ASSERT_TRUE(shards_[0]->Join().ok());
  shards_[0].reset();
  ShardOptions o = TestShardOptions();
  ASSERT_TRUE(ShardServer::Create(layout_, o, &shards_[0]).ok());
  ASSERT_TRUE(shards_[0]->LoadCheckpoint(path).ok());
  std::unique_ptr<ServerEndpoint> ep;
  ASSERT_TRUE(transport_.Bind("s0", &ep).ok());
  shards_[0]->Start(std::move(ep));
  // The same client keeps working: its push is refused as unregistered, it registers again and
  // resends exactly once.
  ASSERT_TRUE(client_->Wait(client_->Push(g, 1), 5000ms).ok());
  ASSERT_TRUE(client_->Wait(client_->Pull(w), 5000ms).ok());
  EXPECT_EQ(w, std::vector<float>(n_, -2.0f));
  for (const Chunk& c : layout_.chunks()) EXPECT_EQ(client_->last_versions()[static_cast<size_t>(c.id)], 2);
  EXPECT_EQ(shards_[0]->Stats().rejected_by_reason[static_cast<size_t>(RejectReason::kNotRegistered)],
            (layout_.ServerChunks(0).size() + 3) / 4);
}

TEST_F(PsClientTest, WithoutTheRunsTokenAClientCanNeitherRegisterNorCheckpointNorShutDown) {
  ASSERT_TRUE(client_->Wait(client_->PushInit(std::vector<float>(n_, 3.0f)), 5000ms).ok());
  const std::string path = ::testing::TempDir() + "/ps_client_token.dpt";
  std::filesystem::remove(path);
  for (const std::string& token : std::vector<std::string>{"", "guess"}) {
    SCOPED_TRACE("token '" + token + "'");
    std::unique_ptr<PsClient> stranger;
    ASSERT_TRUE(PsClient::Create(&transport_, layout_, ClientOptions(token), &stranger).ok());
    const Status c = stranger->Connect(2000ms);
    EXPECT_EQ(c.code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(c.message().find(token.empty() ? "no token" : "wrong token"), std::string::npos) << c.message();
    EXPECT_EQ(stranger->Checkpoint(0, path, 2000ms).code(), StatusCode::kFailedPrecondition);
    EXPECT_EQ(stranger->Shutdown(1, 2000ms).code(), StatusCode::kFailedPrecondition);
    // Never registered: its gradients are refused.
    const std::vector<float> g(n_, 100.0f);
    EXPECT_FALSE(stranger->Wait(stranger->Push(g, 0), 2000ms).ok());
  }
  EXPECT_FALSE(std::filesystem::exists(path));
  for (auto& s : shards_) EXPECT_FALSE(s->shutdown_requested());
  std::vector<float> w(n_);
  ASSERT_TRUE(client_->Wait(client_->Pull(w), 5000ms).ok());
  EXPECT_EQ(w, std::vector<float>(n_, 3.0f));
  EXPECT_GT(shards_[0]->Stats().rejected_by_reason[static_cast<size_t>(RejectReason::kUnauthorized)], 0u);
  // The run's own client, with the token, may do both.
  ASSERT_TRUE(client_->Checkpoint(0, path, 5000ms).ok());
  EXPECT_TRUE(std::filesystem::exists(path));
  ASSERT_TRUE(client_->Shutdown(1, 5000ms).ok());
  EXPECT_TRUE(shards_[1]->shutdown_requested());
}

TEST(PsClientCreate, AddressCountMustMatchTheLayout) {
  ParamLayout layout;
  ASSERT_TRUE(ParamLayout::Build({{"a", {10}, 1, 1}}, 2, 32, &layout).ok());
  InprocTransport t;
  PsClientOptions o;
  o.server_addresses = {"only-one"};
  std::unique_ptr<PsClient> c;
  Status s = PsClient::Create(&t, layout, o, &c);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
}

TEST(PsClientCreate, NoServerGivesATimeoutNamingTheServer) {
  ParamLayout layout;
  ASSERT_TRUE(ParamLayout::Build({{"a", {10}, 1, 1}}, 1, 32, &layout).ok());
  InprocTransport t;
  std::unique_ptr<ServerEndpoint> silent;  // bound but never answers
  ASSERT_TRUE(t.Bind("silent", &silent).ok());
  PsClientOptions o;
  o.server_addresses = {"silent"};
  o.reply_timeout = 100ms;
  std::unique_ptr<PsClient> c;
  ASSERT_TRUE(PsClient::Create(&t, layout, o, &c).ok());
  std::vector<float> w(10);
  Status s = c->Wait(c->Pull(w), 5000ms);
  EXPECT_EQ(s.code(), StatusCode::kTimeout);
  EXPECT_NE(s.message().find("server 0"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace downpour
