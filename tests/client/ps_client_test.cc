// ps_client_test.cc — the PS client's own contract: request ids and Wait, errors surfacing at
// Wait, buffer lifetime of zero-copy pushes, chunk / tensor subsets, versions, the run's token
// on register, re-register, checkpoint and shutdown (the servers here require it), and riding
// through a server restart: resend of unanswered parts, waiting (and saying so) for a server
// that is down, failing after server_wait, moving to a new address, acknowledged-push counters.
//
// The servers here sit behind a StampingEndpoint that writes a fixed incarnation into every
// reply (what a server process does on its own once it has one), and can lose acks the way a
// server that dies after applying a push does.
#include "client/ps/ps_client.h"

#include <fmt/ranges.h>
#include <gtest/gtest.h>
#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <filesystem>
#include <functional>
#include <mutex>
#include <random>
#include <thread>

#include "common/inproc_transport.h"
#include "common/zmq_transport.h"
#include "server/shard.h"
#include "tests/testing/harness.h"
#include "tests/testing/stamping_endpoint.h"

namespace downpour {
namespace {

using namespace std::chrono_literals;

constexpr const char* kSecret = "5ec2e75ec2e75ec2e75ec2e75ec2e75ec2e75ec2e75ec2e75ec2e75ec2e75ec2";

// A checkpoint path of this test alone: ctest runs a test's Socket and SharedMemory instances
// (and other tests) at once, and a shared name let one load the other's checkpoint. In the
// test's scratch directory (removed when the test passes).
std::string ScratchFile(const std::string& name) { return (test::ScratchDir("ps_client") / (name + ".dpt")).string(); }

// The servers of these tests: the update is w -= g, and the run's secret is required.
ShardOptions TestShardOptions() {
  ShardOptions o;
  o.solver.base_lr = 1.0f;
  o.solver.momentum = 0.0f;
  o.solver.weight_decay = 0.0f;
  o.access.run_secret = kSecret;
  o.access.run_dir = std::filesystem::temp_directory_path().string();  // holds every ScratchFile
  o.cluster.max_workers = 4;  // worker 1 (PullWaitsForInit...) is an elastic id beyond expected_workers = 1
  return o;
}

using test::StampingEndpoint;  // tests/testing/stamping_endpoint.h

// Captures the default logger's lines while alive (the previous logger is kept alive and put
// back, so threads that logged through it are safe).
class LogCapture {
 public:
  // Debug lines too (a worker's further connections), though only info and above reach stderr.
  LogCapture() : previous_(spdlog::default_logger()), ring_(std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(256)) {
    auto console = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
    console->set_level(spdlog::level::info);
    auto logger = std::make_shared<spdlog::logger>("capture", spdlog::sinks_init_list{console, ring_});
    logger->set_level(spdlog::level::debug);
    spdlog::set_default_logger(logger);
  }
  ~LogCapture() { spdlog::set_default_logger(previous_); }
  int Count(const std::string& needle) const {
    int n = 0;
    for (const std::string& line : ring_->last_formatted()) n += line.find(needle) != std::string::npos;
    return n;
  }

 private:
  std::shared_ptr<spdlog::logger> previous_;
  std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt> ring_;
};

// How a PsClientTest's client reaches its servers.
enum class Path {
  kSocket,         // payloads over the socket, call order
  kSharedMemory,   // through same-host shared memory
  kSocketByLayer,  // over the socket, cluster.send_order = "layer" (every restart and resend too)
};

// Every test runs three times, once per Path.
class PsClientTest : public ::testing::TestWithParam<Path> {
 protected:
  static bool shm() { return GetParam() == Path::kSharedMemory; }
  void SetUp() override {
    ASSERT_TRUE(ParamLayout::Build({{"a", {10, 10}, 1, 1}, {"b", {10}, 1, 1}, {"c", {50}, 1, 1}}, 2, 32, &layout_).ok());
    shards_.resize(2);
    endpoints_.resize(2);
    for (int s = 0; s < 2; ++s) StartShard(s, fmt::format("s{}", s), "");
    PsClientOptions co = ClientOptions(kSecret);
    ASSERT_TRUE(PsClient::Create(&transport_, layout_, co, &client_).ok());
    ASSERT_TRUE(client_->Connect(5000ms).ok());
    n_ = static_cast<size_t>(layout_.total_elems());
  }
  PsClientOptions ClientOptions(const std::string& token) const {
    PsClientOptions co;
    co.shared_memory = shm();
    co.send_order = GetParam() == Path::kSocketByLayer ? SendOrder::kLayer : SendOrder::kCall;
    co.server_addresses = {"s0", "s1"};
    co.reply_timeout = 5000ms;
    co.server_wait = 5000ms;
    co.probe_every = 50ms;
    co.max_chunks_per_message = 4;
    co.token = token;
    return co;
  }
  // Server `s` as a new process (a new incarnation) at `address`, from `checkpoint` if given.
  void StartShard(int s, const std::string& address, const std::string& checkpoint) {
    ShardOptions o = TestShardOptions();
    o.server_id = s;
    ASSERT_TRUE(ShardServer::Create(layout_, o, &shards_[static_cast<size_t>(s)]).ok());
    if (!checkpoint.empty()) {
      ASSERT_TRUE(shards_[static_cast<size_t>(s)]->LoadCheckpoint(checkpoint).ok());
    }
    std::unique_ptr<ServerEndpoint> ep;
    ASSERT_TRUE(transport_.Bind(address, &ep).ok());
    auto stamping = std::make_unique<StampingEndpoint>(std::move(ep), ++incarnations_ * 1000 + 7);
    endpoints_[static_cast<size_t>(s)] = stamping.get();
    shards_[static_cast<size_t>(s)]->Start(std::move(stamping));
  }
  // Server `s` dies: its loop stops, its endpoint (the address) goes away. Its state is first
  // saved to `checkpoint` (standing in for what its write-ahead log would recover), if given.
  void KillShard(int s, const std::string& checkpoint) {
    auto& shard = shards_[static_cast<size_t>(s)];
    shard->Stop();
    ASSERT_TRUE(shard->Join().ok());
    if (!checkpoint.empty()) {
      ASSERT_TRUE(shard->SaveCheckpoint(checkpoint).ok());
    }
    shard.reset();
    endpoints_[static_cast<size_t>(s)] = nullptr;
  }
  void TearDown() override {
    client_.reset();
    for (auto& s : shards_) {
      if (s) s->Stop();
    }
    for (auto& s : shards_) {
      if (s) {
        EXPECT_TRUE(s->Join().ok());
      }
    }
  }
  InprocTransport transport_;
  ParamLayout layout_;
  std::vector<std::unique_ptr<ShardServer>> shards_;
  std::vector<StampingEndpoint*> endpoints_;  // owned by the shards
  uint64_t incarnations_ = 0;
  std::unique_ptr<PsClient> client_;
  size_t n_ = 0;
};

TEST_P(PsClientTest, WaitForgetsFinishedRequests) {
  const std::vector<float> init(n_, 1.0f);  // must outlive the Wait (zero-copy push)
  const RequestId id = client_->PushInit(init);
  ASSERT_TRUE(client_->Wait(id, 5000ms).ok());
  Status again = client_->Wait(id, 10ms);
  EXPECT_EQ(again.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(again.message().find("already waited"), std::string::npos);
}

TEST_P(PsClientTest, WrongBufferSizeSurfacesAtWait) {
  std::vector<float> small(n_ - 1);
  Status s = client_->Wait(client_->Pull(small), 1000ms);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find(std::to_string(n_)), std::string::npos) << s.message();
}

TEST_P(PsClientTest, ServerErrorSurfacesAtWaitWithTheServerNamed) {
  // A gradient before any init is refused by the server.
  std::vector<float> g(n_, 1.0f);
  Status s = client_->Wait(client_->Push(g, 0), 5000ms);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("server "), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("initialised"), std::string::npos) << s.message();
}

TEST_P(PsClientTest, PullWaitsForInitThenTimesOutCleanly) {
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

TEST_P(PsClientTest, PushTensorsTouchesOnlyThoseTensors) {
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

TEST_P(PsClientTest, PushCarriesThePulledVersionsSoStalenessIsMeasured) {
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

// The payloads that go through shared memory are counted (the socket carries only their
// headers), once per push and per pull: the worker's step records report them.
TEST_P(PsClientTest, SharedMemoryPayloadBytesAreCounted) {
  ASSERT_TRUE(client_->Wait(client_->PushInit(std::vector<float>(n_, 0.0f)), 5000ms).ok());
  std::vector<float> w(n_), g(n_, 1.0f);
  ASSERT_TRUE(client_->Wait(client_->Pull(w), 5000ms).ok());
  ASSERT_TRUE(client_->Wait(client_->Push(g, 0), 5000ms).ok());
  ASSERT_TRUE(client_->Wait(client_->Pull(w), 5000ms).ok());
  const TrafficCounts t = client_->shared_memory_traffic();
  const uint64_t model = n_ * sizeof(float);
  EXPECT_EQ(t.sent_bytes, shm() ? 2 * model : 0u);  // the init push and one gradient
  EXPECT_EQ(t.received_bytes, shm() ? 2 * model : 0u);
  EXPECT_EQ(w[0], -1.0f);
}

TEST_P(PsClientTest, ManyRequestsInFlightAcrossServers) {
  ASSERT_TRUE(client_->Wait(client_->PushInit(std::vector<float>(n_, 0.0f)), 5000ms).ok());
  std::vector<float> g(n_, 1.0f);
  std::vector<RequestId> ids;
  for (int i = 0; i < 50; ++i) ids.push_back(client_->Push(g, i));
  for (RequestId id : ids) ASSERT_TRUE(client_->Wait(id, 5000ms).ok());
  std::vector<float> w(n_);
  ASSERT_TRUE(client_->Wait(client_->Pull(w), 5000ms).ok());
  EXPECT_EQ(w, std::vector<float>(n_, -50.0f));
}

TEST_P(PsClientTest, ClientRegistersAgainAfterAServerRestartAndNothingIsAppliedTwice) {
  ASSERT_TRUE(client_->Wait(client_->PushInit(std::vector<float>(n_, 0.0f)), 5000ms).ok());
  std::vector<float> g(n_, 1.0f), w(n_);
  ASSERT_TRUE(client_->Wait(client_->Push(g, 0), 5000ms).ok());
  const std::string path = ScratchFile("ps_client_restart");
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
  const uint64_t parts0 = (layout_.ServerChunks(0).size() + 3) / 4;
  EXPECT_EQ(shards_[0]->Stats().rejected_by_reason[static_cast<size_t>(RejectReason::kNotRegistered)], parts0);
  // Both pushes counted once per part, the refused-then-resent one included.
  EXPECT_EQ(client_->acked_pushes(0), 2 * parts0);
  EXPECT_EQ(client_->resent_parts(0), parts0);
  EXPECT_EQ(client_->restarts_seen(0), 1u);
  EXPECT_EQ(client_->restarts_seen(1), 0u);
}

// The number of messages one push of every chunk sends to server `s`.
size_t PartsOf(const ParamLayout& layout, int s) { return (layout.ServerChunks(s).size() + 3) / 4; }

TEST_P(PsClientTest, PushWhoseAckDiedWithTheServerIsResentToTheRestartedServerAndCountedOnce) {
  ASSERT_TRUE(client_->Wait(client_->PushInit(std::vector<float>(n_, 0.0f)), 5000ms).ok());
  std::vector<float> g(n_, 1.0f), w(n_);
  ASSERT_TRUE(client_->Wait(client_->Push(g, 0), 5000ms).ok());
  const size_t parts0 = PartsOf(layout_, 0);
  EXPECT_EQ(client_->acked_pushes(0), parts0);
  // Server 0 applies the next push but dies before its acks leave.
  const uint64_t applied_before = shards_[0]->Stats().pushes_applied;  // the init and the first push
  endpoints_[0]->drop_acks.store(true);
  const RequestId id = client_->Push(g, 1);
  for (int i = 0; i < 500 && shards_[0]->Stats().pushes_applied < applied_before + parts0; ++i) {
    std::this_thread::sleep_for(2ms);
  }
  ASSERT_EQ(shards_[0]->Stats().pushes_applied, applied_before + parts0);
  ASSERT_EQ(endpoints_[0]->dropped_acks.load(), static_cast<int>(parts0));
  EXPECT_EQ(client_->Wait(id, 100ms).code(), StatusCode::kTimeout);  // still waiting for the acks
  const std::string path = ScratchFile("ps_client_lost_ack");
  KillShard(0, path);
  StartShard(0, "s0", path);  // a new incarnation at the same address, with the push applied
  // The client probes the silent server, sees the new incarnation, registers and resends.
  ASSERT_TRUE(client_->Wait(id, 5000ms).ok());
  EXPECT_EQ(client_->acked_pushes(0), 2 * parts0);  // the resent parts counted once
  EXPECT_EQ(client_->resent_parts(0), parts0);
  EXPECT_EQ(client_->restarts_seen(0), 1u);
  EXPECT_EQ(client_->acked_pushes(1), 2 * PartsOf(layout_, 1));
  EXPECT_EQ(client_->resent_parts(1), 0u);
  // The restarted server received every resent part under the same session and request id.
  // (Applied once: needs the server's duplicate detection, which recognises them from its
  // write-ahead log; a checkpoint, as here, does not carry it, so this server applies them.)
  const ShardStatsWire st = shards_[0]->Stats();
  EXPECT_EQ(st.pushes_received, parts0);
  EXPECT_EQ(st.rejected_by_reason[static_cast<size_t>(RejectReason::kNotRegistered)], 0u);  // registered first
  ASSERT_TRUE(client_->Wait(client_->Pull(w), 5000ms).ok());
  for (const Chunk& c : layout_.chunks()) {
    if (c.server == 1) {
      EXPECT_EQ(w[static_cast<size_t>(c.flat_offset)], -2.0f) << c.id;
    }
  }
}

TEST_P(PsClientTest, PullWhileTheServerIsDownSaysItIsWaitingAndCompletesWhenItIsBack) {
  ASSERT_TRUE(client_->Wait(client_->PushInit(std::vector<float>(n_, 5.0f)), 5000ms).ok());
  const std::string path = ScratchFile("ps_client_down");
  KillShard(1, path);
  LogCapture log;
  std::vector<float> w(n_);
  const auto t0 = std::chrono::steady_clock::now();
  const RequestId id = client_->Pull(w);
  std::this_thread::sleep_for(400ms);  // down for 8 probe periods: the waiting line is due
  EXPECT_GE(log.Count("worker 0: server 1 unreachable for"), 1);
  EXPECT_EQ(log.Count("waiting for server 0"), 0);
  StartShard(1, "s1", path);
  ASSERT_TRUE(client_->Wait(id, 5000ms).ok());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 3000ms);
  EXPECT_EQ(w, std::vector<float>(n_, 5.0f));
  EXPECT_EQ(client_->restarts_seen(1), 1u);
  EXPECT_EQ(log.Count("worker 0: server 1 answers again after"), 1);
}

TEST_P(PsClientTest, ServerThatStaysDownFailsTheRequestAfterServerWaitNamingIt) {
  PsClientOptions co = ClientOptions(kSecret);
  co.server_wait = 300ms;
  co.reply_timeout = 60000ms;  // not what ends the wait
  std::unique_ptr<PsClient> c;
  ASSERT_TRUE(PsClient::Create(&transport_, layout_, co, &c).ok());
  ASSERT_TRUE(c->Connect(5000ms).ok());
  ASSERT_TRUE(c->Wait(c->PushInit(std::vector<float>(n_, 1.0f)), 5000ms).ok());
  KillShard(1, "");
  std::vector<float> w(n_);
  const auto t0 = std::chrono::steady_clock::now();
  const Status s = c->Wait(c->Pull(w), 5000ms);
  const auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
  EXPECT_NE(s.message().find("server 1 at s1: unreachable"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("server_wait_ms = 300"), std::string::npos) << s.message();
  EXPECT_GE(took, 300ms);
  EXPECT_LT(took, 1500ms);
}

TEST_P(PsClientTest, ServerThatAnswersProbesButHoldsAPullTimesOutAtReplyTimeout) {
  // No weights yet: the servers hold the pull, and answer the probes meanwhile.
  PsClientOptions co = ClientOptions(kSecret);
  co.reply_timeout = 300ms;
  co.server_wait = 60000ms;
  std::unique_ptr<PsClient> c;
  ASSERT_TRUE(PsClient::Create(&transport_, layout_, co, &c).ok());
  ASSERT_TRUE(c->Connect(5000ms).ok());
  std::vector<float> w(n_);
  const auto t0 = std::chrono::steady_clock::now();
  const Status s = c->Wait(c->Pull(w), 5000ms);
  const auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_EQ(s.code(), StatusCode::kTimeout) << s.ToString();
  EXPECT_NE(s.message().find("within 300 ms"), std::string::npos) << s.message();
  EXPECT_GE(took, 300ms);
  EXPECT_LT(took, 1500ms);
  EXPECT_EQ(c->restarts_seen(0) + c->restarts_seen(1), 0u);
}

TEST_P(PsClientTest, SetServerAddressMovesTheClientToTheServersNewAddressMidRun) {
  ASSERT_TRUE(client_->Wait(client_->PushInit(std::vector<float>(n_, 0.0f)), 5000ms).ok());
  std::vector<float> g(n_, 1.0f), w(n_);
  ASSERT_TRUE(client_->Wait(client_->Push(g, 0), 5000ms).ok());
  const std::string path = ScratchFile("ps_client_move");
  KillShard(0, path);
  // A push goes out while server 0 is gone; it comes back elsewhere and the client is told.
  const RequestId id = client_->Push(g, 1);
  EXPECT_EQ(client_->Wait(id, 150ms).code(), StatusCode::kTimeout);
  StartShard(0, "s0-moved", path);
  ASSERT_TRUE(client_->SetServerAddress(0, "s0-moved").ok());
  ASSERT_TRUE(client_->Wait(id, 5000ms).ok());
  ASSERT_TRUE(client_->Wait(client_->Pull(w), 5000ms).ok());
  EXPECT_EQ(w, std::vector<float>(n_, -2.0f));
  EXPECT_EQ(client_->restarts_seen(0), 1u);
  EXPECT_EQ(client_->acked_pushes(0), 2 * PartsOf(layout_, 0));
  EXPECT_EQ(shards_[0]->Stats().pushes_applied, PartsOf(layout_, 0));
  // Moving while idle: the next request registers first.
  KillShard(0, path);
  StartShard(0, "s0-again", path);
  ASSERT_TRUE(client_->SetServerAddress(0, "s0-again").ok());
  ASSERT_TRUE(client_->Wait(client_->Push(g, 2), 5000ms).ok());
  ASSERT_TRUE(client_->Wait(client_->Pull(w), 5000ms).ok());
  EXPECT_EQ(w, std::vector<float>(n_, -3.0f));
  EXPECT_EQ(shards_[0]->Stats().rejected_by_reason[static_cast<size_t>(RejectReason::kNotRegistered)], 0u);
  EXPECT_EQ(client_->restarts_seen(0), 2u);
  EXPECT_EQ(client_->SetServerAddress(2, "x").code(), StatusCode::kInvalidArgument);
}

TEST_P(PsClientTest, EveryMessageCarriesTheClientsSession) {
  PsClientOptions co = ClientOptions(kSecret);
  std::unique_ptr<PsClient> other;
  ASSERT_TRUE(PsClient::Create(&transport_, layout_, co, &other).ok());
  EXPECT_NE(client_->session(), 0u);
  EXPECT_NE(other->session(), client_->session());
  // A server of our own that records the session of each message it gets (and refuses the
  // request, so the next one is sent).
  std::unique_ptr<ServerEndpoint> ep;
  ASSERT_TRUE(transport_.Bind("recorder", &ep).ok());
  co.server_addresses = {"recorder", "s1"};
  std::unique_ptr<PsClient> c;
  ASSERT_TRUE(PsClient::Create(&transport_, layout_, co, &c).ok());
  std::vector<float> w(n_);
  (void)c->Pull(w);
  (void)c->Push(w, 0);
  std::vector<uint64_t> sessions;
  for (int i = 0; i < 50 && sessions.size() < 2; ++i) {
    PeerId from;
    Frames frames;
    if (!ep->Receive(&from, &frames, 100ms).ok()) continue;
    MessageHeader h;
    ASSERT_TRUE(ParseHeader(frames, &h).ok());
    if (h.type == MsgType::kPull || h.type == MsgType::kPush) {
      sessions.push_back(h.session);
      Frames reply(1);
      ASSERT_TRUE(HeaderFrame(ErrorReply(h, InvalidArgument("recorded")), &reply[0]).ok());
      ASSERT_TRUE(ep->Send(from, std::move(reply)).ok());
    }
  }
  ASSERT_EQ(sessions.size(), 2u);
  EXPECT_EQ(sessions[0], c->session());
  EXPECT_EQ(sessions[1], c->session());
}

TEST_P(PsClientTest, WithoutTheRunsTokenAClientCanNeitherRegisterNorCheckpointNorShutDown) {
  ASSERT_TRUE(client_->Wait(client_->PushInit(std::vector<float>(n_, 3.0f)), 5000ms).ok());
  const std::string path = ScratchFile("ps_client_token");
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

// The same ride through a restart over real sockets: the pull sent while the server is down
// waits in ZeroMQ's queue, reaches the restarted server (which has forgotten the client), and
// the client registers again and resends it.
// A pull served chunk by chunk while another worker's pushes change every chunk never returns a
// torn chunk: with w -= g and g = -1 everywhere, a chunk at version v holds init + v in every
// element, so each pulled chunk must be uniform and equal to init + (its reported version).
TEST_P(PsClientTest, PullsServedChunkByChunkDuringPushesNeverReturnATornChunk) {
  ASSERT_TRUE(client_->Wait(client_->PushInit(std::vector<float>(n_, 5.0f)), 5000ms).ok());
  PsClientOptions po = ClientOptions(kSecret);
  po.worker_id = 1;
  po.max_chunks_per_message = 1;
  std::unique_ptr<PsClient> puller;
  ASSERT_TRUE(PsClient::Create(&transport_, layout_, po, &puller).ok());
  ASSERT_TRUE(puller->Connect(5000ms).ok());
  std::atomic<bool> done{false};
  std::thread pusher([&] {
    const std::vector<float> g(n_, -1.0f);
    for (int step = 0; step < 200; ++step) {
      const Status s = client_->Wait(client_->Push(g, step), 5000ms);
      if (!s.ok()) ADD_FAILURE() << s.ToString();
    }
    done = true;
  });
  std::vector<float> w(n_);
  int pulls = 0, torn = 0;
  while (!done.load() || pulls < 5) {
    ASSERT_TRUE(puller->Wait(puller->Pull(w), 5000ms).ok());
    ++pulls;
    for (const Chunk& c : layout_.chunks()) {
      const float expect = 5.0f + static_cast<float>(puller->last_versions()[static_cast<size_t>(c.id)]);
      for (int64_t i = 0; i < c.count; ++i) torn += w[static_cast<size_t>(c.flat_offset + i)] != expect;
    }
  }
  pusher.join();
  EXPECT_EQ(torn, 0) << "over " << pulls << " pulls";
  EXPECT_GT(pulls, 5);
  ShardStatsWire st;
  ASSERT_TRUE(client_->Stats(0, &st, 5000ms).ok());
  EXPECT_EQ(st.region_parts > 0, shm()) << "payloads through shared memory exactly when asked for";
}

// Push and pull of one client are in flight together, and a pull issued after a push is
// answered with that push applied (one ordered connection, the server applies in order).
TEST_P(PsClientTest, APullIssuedRightAfterAPushSeesItWithoutWaitingForItsAck) {
  ASSERT_TRUE(client_->Wait(client_->PushInit(std::vector<float>(n_, 1.0f)), 5000ms).ok());
  std::vector<float> w(n_);
  const std::vector<float> g(n_, -2.0f);
  for (int step = 0; step < 20; ++step) {
    const RequestId push = client_->Push(g, step);
    const RequestId pull = client_->Pull(w, step + 1);
    ASSERT_TRUE(client_->Wait(pull, 5000ms).ok());
    ASSERT_TRUE(client_->Wait(push, 5000ms).ok());
    EXPECT_EQ(w, std::vector<float>(n_, 1.0f + 2.0f * static_cast<float>(step + 1))) << "step " << step;
  }
}

// 16-bit requests from a GPU worker need a 16-bit codec: fp32 pulls and pushes refuse them,
// naming the key, before anything is sent.
TEST_P(PsClientTest, SixteenBitPullsAndCastPushesNeedASixteenBitCodec) {
  std::vector<uint16_t> w16(static_cast<size_t>(n_));
  Status s = client_->Wait(client_->Pull16(w16), 5000ms);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("16-bit weights asked for, but compression.pull is \"fp32\""), std::string::npos)
      << s.message();
  const std::vector<float> g(static_cast<size_t>(n_), 1.0f);
  const std::vector<int32_t> ids{0};
  s = client_->Wait(client_->PushChunks(g, ids, 0, {}, {}, w16), 5000ms);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("compression.push = \"fp32\""), std::string::npos) << s.message();
}

INSTANTIATE_TEST_SUITE_P(Payloads, PsClientTest,
                         ::testing::Values(Path::kSocket, Path::kSharedMemory, Path::kSocketByLayer),
                         [](const ::testing::TestParamInfo<Path>& i) {
                           return i.param == Path::kSocket         ? "Socket"
                                  : i.param == Path::kSharedMemory ? "SharedMemory"
                                                                   : "SocketByLayer";
                         });

// cluster.connections_per_server = 3: each server's chunks go over three connections (chunk id
// modulo 3), each registered on its own; a pull right after a push still sees it on every chunk
// (one chunk, one ordered path), and a restarted server is registered again on every connection
// with nothing applied twice. With shared memory the client keeps one connection.
TEST_P(PsClientTest, SeveralConnectionsPerServerKeepEachChunksOrderAndSurviveARestart) {
  PsClientOptions co = ClientOptions(kSecret);
  co.connections_per_server = 3;
  co.worker_id = 2;
  std::unique_ptr<PsClient> c;
  LogCapture log;
  ASSERT_TRUE(PsClient::Create(&transport_, layout_, co, &c).ok());
  ASSERT_TRUE(c->Connect(5000ms).ok());
  const int connections = shm() ? 1 : 3;
  for (int s = 0; s < 2; ++s) {  // one line for the process, and one at debug level per further connection
    EXPECT_EQ(log.Count(fmt::format("server {}: worker 2 registered", s)), 1);
    EXPECT_EQ(log.Count(fmt::format("server {}: worker 2: another connection of its process", s)), connections - 1);
  }
  const std::vector<float> init(n_, 0.0f);
  ASSERT_TRUE(c->Wait(c->PushInit(init), 5000ms).ok());
  std::vector<float> w(n_);
  for (int k = 0; k < 5; ++k) {
    std::vector<float> g(n_);
    for (size_t i = 0; i < n_; ++i) g[i] = static_cast<float>((i + static_cast<size_t>(k)) % 5);
    const RequestId push = c->Push(g, k);
    const RequestId pull = c->Pull(w, k + 1);  // in flight behind the push, chunk by chunk
    const Status pushed = c->Wait(push, 5000ms);
    ASSERT_TRUE(pushed.ok()) << pushed.ToString();
    const Status pulled = c->Wait(pull, 5000ms);
    ASSERT_TRUE(pulled.ok()) << pulled.ToString();
    for (size_t i = 0; i < n_; ++i) {
      float want = 0;
      for (int j = 0; j <= k; ++j) want -= static_cast<float>((i + static_cast<size_t>(j)) % 5);
      ASSERT_EQ(w[i], want) << "float " << i << " after push " << k;
    }
  }
  // Every part of server 0's pushes, over all its connections, is counted once.
  size_t parts = 0;
  for (int j = 0; j < connections; ++j) {
    size_t chunks = 0;
    for (int32_t id : layout_.ServerChunks(0)) chunks += id % connections == j ? 1 : 0;
    parts += (chunks + 3) / 4;
  }
  EXPECT_EQ(c->acked_pushes(0), 5 * parts);
  // Server 0 restarts from a checkpoint: every connection registers again, each part once.
  const std::string path = ScratchFile("ps_client_connections");
  ASSERT_TRUE(c->Checkpoint(0, path, 5000ms).ok());
  KillShard(0, "");
  StartShard(0, "s0", path);
  const std::vector<float> g(n_, 1.0f);
  ASSERT_TRUE(c->Wait(c->Push(g, 5), 5000ms).ok());
  ASSERT_TRUE(c->Wait(c->Pull(w, 6), 5000ms).ok());
  for (size_t i = 0; i < n_; ++i) {
    float want = -1;
    for (int j = 0; j < 5; ++j) want -= static_cast<float>((i + static_cast<size_t>(j)) % 5);
    ASSERT_EQ(w[i], want) << "float " << i << " after the restart";
  }
  EXPECT_EQ(c->acked_pushes(0), 6 * parts);
  EXPECT_EQ(c->resent_parts(0), parts);
  EXPECT_EQ(c->restarts_seen(0), static_cast<uint64_t>(connections));  // each connection saw it
}

// Over TCP: four connections per server and four ZeroMQ I/O threads carry a push and a pull of
// 640 KB a server, the server seeing four registered peers for the one worker.
TEST(PsClientZmq, FourConnectionsPerServerOverTcpMoveEveryChunk) {
  ParamLayout layout;
  ASSERT_TRUE(ParamLayout::Build({{"a", {400, 400}, 1, 1}}, 2, 8192, &layout).ok());
  ZmqOptions zo;
  zo.io_threads = 4;
  zo.linger_ms = 0;
  ZmqTransport transport(zo);
  LogCapture log;
  std::vector<std::unique_ptr<ShardServer>> shards(2);
  PsClientOptions co;
  for (int s = 0; s < 2; ++s) {
    ShardOptions o = TestShardOptions();
    o.server_id = s;
    o.cluster.server_threads = 2;
    ASSERT_TRUE(ShardServer::Create(layout, o, &shards[static_cast<size_t>(s)]).ok());
    std::unique_ptr<ServerEndpoint> ep;
    ASSERT_TRUE(transport.Bind("tcp://127.0.0.1:0", &ep).ok());
    co.server_addresses.push_back(ep->address());
    shards[static_cast<size_t>(s)]->Start(std::move(ep));
  }
  co.token = kSecret;
  co.connections_per_server = 4;
  co.max_chunks_per_message = 2;
  std::unique_ptr<PsClient> c;
  ASSERT_TRUE(PsClient::Create(&transport, layout, co, &c).ok());
  ASSERT_TRUE(c->Connect(5000ms).ok());
  for (int s = 0; s < 2; ++s) {
    EXPECT_EQ(log.Count(fmt::format("server {}: worker 0 registered", s)), 1);
    EXPECT_EQ(log.Count(fmt::format("server {}: worker 0: another connection of its process", s)), 3);
  }
  const size_t n = static_cast<size_t>(layout.total_elems());
  std::vector<float> init(n), g(n), w(n);
  for (size_t i = 0; i < n; ++i) {
    init[i] = static_cast<float>(i % 13);
    g[i] = static_cast<float>(i % 3);
  }
  Status st = c->Wait(c->PushInit(init), 5000ms);
  ASSERT_TRUE(st.ok()) << st.ToString();
  st = c->Wait(c->Push(g, 0), 5000ms);
  ASSERT_TRUE(st.ok()) << st.ToString();
  st = c->Wait(c->Pull(w, 1), 5000ms);
  ASSERT_TRUE(st.ok()) << st.ToString();
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(w[i], init[i] - g[i]) << i;
  c.reset();
  for (auto& s : shards) {
    s->Stop();
    EXPECT_TRUE(s->Join().ok());
  }
}

TEST(PsClientZmq, PullInFlightAcrossAServerRestartOnTheSamePortCompletes) {
  ParamLayout layout;
  ASSERT_TRUE(ParamLayout::Build({{"a", {10, 10}, 1, 1}}, 1, 32, &layout).ok());
  ZmqOptions zo;
  zo.linger_ms = 0;
  ZmqTransport transport(zo);
  const std::string path = ScratchFile("ps_client_zmq");
  auto start = [&](const std::string& address, uint64_t incarnation, bool restore, std::unique_ptr<ShardServer>* out,
                   std::string* bound) {
    ASSERT_TRUE(ShardServer::Create(layout, TestShardOptions(), out).ok());
    if (restore) {
      ASSERT_TRUE((*out)->LoadCheckpoint(path).ok());
    }
    std::unique_ptr<ServerEndpoint> ep;
    Status s = transport.Bind(address, &ep);
    for (int i = 0; i < 100 && !s.ok(); ++i) {  // the old socket's port may take a moment to free
      std::this_thread::sleep_for(20ms);
      s = transport.Bind(address, &ep);
    }
    ASSERT_TRUE(s.ok()) << s.ToString();
    *bound = ep->address();
    (*out)->Start(std::make_unique<StampingEndpoint>(std::move(ep), incarnation));
  };
  std::unique_ptr<ShardServer> shard;
  std::string address;
  start("tcp://127.0.0.1:0", 11, false, &shard, &address);
  PsClientOptions co;
  co.server_addresses = {address};
  co.token = kSecret;
  co.probe_every = 50ms;
  co.server_wait = 5000ms;
  std::unique_ptr<PsClient> c;
  ASSERT_TRUE(PsClient::Create(&transport, layout, co, &c).ok());
  ASSERT_TRUE(c->Connect(5000ms).ok());
  const size_t n = static_cast<size_t>(layout.total_elems());
  ASSERT_TRUE(c->Wait(c->PushInit(std::vector<float>(n, 4.0f)), 5000ms).ok());
  shard->Stop();
  ASSERT_TRUE(shard->Join().ok());
  ASSERT_TRUE(shard->SaveCheckpoint(path).ok());
  shard.reset();
  std::vector<float> w(n);
  const RequestId id = c->Pull(w);
  EXPECT_EQ(c->Wait(id, 200ms).code(), StatusCode::kTimeout);
  std::string again;
  start(address, 22, true, &shard, &again);
  ASSERT_EQ(again, address);
  ASSERT_TRUE(c->Wait(id, 5000ms).ok());
  EXPECT_EQ(w, std::vector<float>(n, 4.0f));
  EXPECT_EQ(c->restarts_seen(0), 1u);
  c.reset();
  shard->Stop();
  EXPECT_TRUE(shard->Join().ok());
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

TEST(PsClientCreate, ConnectionsPerServerMustBeInRange) {
  ParamLayout layout;
  ASSERT_TRUE(ParamLayout::Build({{"a", {10}, 1, 1}}, 1, 32, &layout).ok());
  InprocTransport t;
  for (int n : {0, kMaxConnectionsPerServer + 1}) {
    PsClientOptions o;
    o.server_addresses = {"s0"};
    o.connections_per_server = n;
    std::unique_ptr<PsClient> c;
    const Status s = PsClient::Create(&t, layout, o, &c);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << n;
    EXPECT_NE(s.message().find("connections_per_server"), std::string::npos) << s.ToString();
  }
}

// A server's endpoint that can stop taking messages (kept aside until it opens) or take each one
// late, and records the pushes and pulls it takes, in order, as "push 4" / "pull 5" (one chunk a
// message).
class GatedEndpoint : public ServerEndpoint {
 public:
  explicit GatedEndpoint(std::unique_ptr<ServerEndpoint> inner) : inner_(std::move(inner)) {}
  using ServerEndpoint::Receive;
  Status Receive(PeerId* from, Frames* frames, std::chrono::milliseconds timeout, PeerInfo* info) override {
    if (!held.load() && !stash_.empty()) {  // what came in while held, first
      *from = stash_.front().from;
      *frames = std::move(stash_.front().frames);
      if (info != nullptr) *info = stash_.front().info;
      stash_.pop_front();
    } else {
      if (held.load()) std::this_thread::sleep_for(std::min(timeout, std::chrono::milliseconds(2)));
      DP_RETURN_IF_ERROR(inner_->Receive(from, frames, held.load() ? std::chrono::milliseconds(0) : timeout, info));
      if (held.load()) {  // a Receive already waiting when the gate closed keeps its message too
        MessageHeader h;
        if (ParseHeader(*frames, &h).ok() && (h.type == MsgType::kPush || h.type == MsgType::kPull)) {
          stashed.fetch_add(1);
        }
        stash_.push_back({*from, std::move(*frames), info != nullptr ? *info : PeerInfo{}});
        return Timeout("held");
      }
      if (!stash_.empty()) {  // the gate opened while this Receive waited: what came first goes first
        stash_.push_back({*from, std::move(*frames), info != nullptr ? *info : PeerInfo{}});
        *from = stash_.front().from;
        *frames = std::move(stash_.front().frames);
        if (info != nullptr) *info = stash_.front().info;
        stash_.pop_front();
      }
    }
    if (const int ms = slow_ms.load(); ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    MessageHeader h;
    if (ParseHeader(*frames, &h).ok() && (h.type == MsgType::kPush || h.type == MsgType::kPull)) {
      if (const int n = refuse_one_in.load(); n > 0 && ++data_messages_ % n == 0) {  // as a full log does
        MessageHeader r = ErrorReply(h, IoError("the log's disk is full"));
        r.flags = static_cast<uint32_t>(RejectReason::kLogWrite);
        Frames reply(1);
        DP_RETURN_IF_ERROR(HeaderFrame(r, &reply[0]));
        DP_RETURN_IF_ERROR(inner_->Send(*from, std::move(reply)));
        refused.fetch_add(1);
        return Timeout("refused");
      }
      std::lock_guard<std::mutex> lock(mu);
      for (int32_t c : h.chunk_ids)
        taken.push_back(fmt::format("{} {}", h.type == MsgType::kPush ? "push" : "pull", c));
    }
    return Status::Ok();
  }
  Status Send(const PeerId& to, Frames frames) override { return inner_->Send(to, std::move(frames)); }
  std::string address() const override { return inner_->address(); }
  void Wake() override { inner_->Wake(); }

  std::atomic<bool> held{false};
  std::atomic<int> slow_ms{0};  // each message taken this late (a slow link)
  std::atomic<int> refuse_one_in{0};  // > 0: every n-th push or pull refused by "the log" (kLogWrite)
  std::atomic<int> refused{0};
  std::atomic<int> stashed{0};  // pushes and pulls kept aside while held (not probes)
  std::mutex mu;
  std::vector<std::string> taken;  // guarded by mu

 private:
  struct Held {
    PeerId from;
    Frames frames;
    PeerInfo info;
  };
  std::unique_ptr<ServerEndpoint> inner_;
  std::deque<Held> stash_;  // the shard's loop thread only
  uint64_t data_messages_ = 0;  // the shard's loop thread only
};

// Send order with a window of one part: while push 4 is on the wire, a push of chunks 5..7, a pull
// of 5 and a push of 0..1 wait. In call order they leave as made; by layer the parts the next
// forward reads first (the lowest chunks) overtake, but a chunk's own pull stays behind its push,
// so the pull still sees it. Either way every push is applied once.
class SendOrderTest : public ::testing::TestWithParam<SendOrder> {
 protected:
  // One server (chunks 0..7 of 16 floats) behind a gate, and a client whose window takes one
  // chunk's part at a time, initialised to zeros.
  void Start(std::chrono::milliseconds reply_timeout = 5000ms) {
    ASSERT_TRUE(ParamLayout::Build({{"a", {64}, 1, 1}, {"b", {64}, 1, 1}}, 1, 16, &layout_).ok());
    std::unique_ptr<ServerEndpoint> ep;
    ASSERT_TRUE(t_.Bind("gated", &ep).ok());
    auto gated = std::make_unique<GatedEndpoint>(std::move(ep));
    gate_ = gated.get();
    ASSERT_TRUE(ShardServer::Create(layout_, TestShardOptions(), &shard_).ok());
    shard_->Start(std::move(gated));
    PsClientOptions o;
    o.server_addresses = {"gated"};
    o.token = kSecret;
    o.max_chunks_per_message = 1;
    o.max_inflight_bytes = 16 * sizeof(float);
    o.send_order = GetParam();
    o.reply_timeout = reply_timeout;
    ASSERT_TRUE(PsClient::Create(&t_, layout_, o, &c_).ok());
    ASSERT_TRUE(c_->Connect(5000ms).ok());
    n_ = static_cast<size_t>(layout_.total_elems());
    ASSERT_TRUE(c_->Wait(c_->PushInit(std::vector<float>(n_, 0.0f)), 5000ms).ok());
    std::lock_guard<std::mutex> lock(gate_->mu);
    gate_->taken.clear();
  }
  std::vector<std::string> Taken() {
    std::lock_guard<std::mutex> lock(gate_->mu);
    return gate_->taken;
  }
  // Waits (5 s at most) until `done`; false if it never was.
  static bool Until(const std::function<bool()>& done) {
    for (int i = 0; i < 5000 && !done(); ++i) std::this_thread::sleep_for(1ms);
    return done();
  }
  // Until the held gate keeps `n` messages aside: the window of one part is full.
  bool Stashed(int n) const {
    return Until([&] { return gate_->stashed.load() >= n; });
  }
  // Until the link's thread has taken `n` requests more than `before` (they wait in its queue).
  bool TakenRequests(uint64_t before, uint64_t n) const {
    return Until([&] { return c_->taken_requests(0) >= before + n; });
  }
  void TearDown() override {
    c_.reset();
    if (shard_) {
      shard_->Stop();
      EXPECT_TRUE(shard_->Join().ok());
    }
  }
  ParamLayout layout_;
  InprocTransport t_;
  GatedEndpoint* gate_ = nullptr;  // owned by the shard
  std::unique_ptr<ShardServer> shard_;
  std::unique_ptr<PsClient> c_;
  size_t n_ = 0;
};

TEST_P(SendOrderTest, PartsLeaveByTheOrderSetAndEachChunkKeepsItsOwn) {
  ASSERT_NO_FATAL_FAILURE(Start());
  gate_->held = true;
  std::vector<float> g(n_, 1.0f), w(n_, 7.0f);
  const std::vector<int32_t> late = {4, 5, 6, 7}, pulled = {5}, early = {0, 1};
  const uint64_t before = c_->taken_requests(0);
  const RequestId push_late = c_->PushChunks(g, late, 0);
  ASSERT_TRUE(Stashed(1));  // part "push 4" sent: the window is full
  const RequestId pull = c_->PullChunks(w, pulled);
  const RequestId push_early = c_->PushChunks(g, early, 0);
  ASSERT_TRUE(TakenRequests(before, 3));  // both wait in the link's queue
  gate_->held = false;
  ASSERT_TRUE(c_->Wait(push_late, 5000ms).ok());
  ASSERT_TRUE(c_->Wait(pull, 5000ms).ok());
  ASSERT_TRUE(c_->Wait(push_early, 5000ms).ok());
  const std::vector<std::string> taken = Taken();
  const std::vector<std::string> by_call = {"push 4", "push 5", "push 6", "push 7", "pull 5", "push 0", "push 1"};
  const std::vector<std::string> by_layer = {"push 4", "push 0", "push 1", "push 5", "pull 5", "push 6", "push 7"};
  EXPECT_EQ(taken, GetParam() == SendOrder::kCall ? by_call : by_layer) << fmt::format("{}", fmt::join(taken, ", "));
  for (size_t i = 80; i < 96; ++i) EXPECT_EQ(w[i], -1.0f) << i;  // chunk 5 pulled after its push
  EXPECT_EQ(w[0], 7.0f);                                         // only chunk 5 was pulled
  std::vector<float> all(n_);
  ASSERT_TRUE(c_->Wait(c_->Pull(all), 5000ms).ok());
  for (size_t i = 0; i < n_; ++i) EXPECT_EQ(all[i], i >= 32 && i < 64 ? 0.0f : -1.0f) << i;
}

// A server counts a worker's clock from its pushes, so a push of a later step never overtakes one
// of an earlier step, whatever its chunks; a pull may (it moves no clock).
TEST_P(SendOrderTest, ALaterStepsPushWaitsForTheEarlierStepsButAPullDoesNot) {
  ASSERT_NO_FATAL_FAILURE(Start());
  gate_->held = true;
  std::vector<float> g(n_, 1.0f), w(n_, 7.0f);
  const std::vector<int32_t> step0 = {4, 5, 6, 7}, step1 = {0}, pulled = {1};
  const uint64_t before = c_->taken_requests(0);
  const RequestId first = c_->PushChunks(g, step0, 0);
  ASSERT_TRUE(Stashed(1));  // part "push 4" sent: the window is full
  const RequestId second = c_->PushChunks(g, step1, 1);
  const RequestId pull = c_->PullChunks(w, pulled);
  ASSERT_TRUE(TakenRequests(before, 3));
  gate_->held = false;
  ASSERT_TRUE(c_->Wait(first, 5000ms).ok());
  ASSERT_TRUE(c_->Wait(second, 5000ms).ok());
  ASSERT_TRUE(c_->Wait(pull, 5000ms).ok());
  const std::vector<std::string> taken = Taken();
  const std::vector<std::string> by_call = {"push 4", "push 5", "push 6", "push 7", "push 0", "pull 1"};
  const std::vector<std::string> by_layer = {"push 4", "pull 1", "push 5", "push 6", "push 7", "push 0"};
  EXPECT_EQ(taken, GetParam() == SendOrder::kCall ? by_call : by_layer) << fmt::format("{}", fmt::join(taken, ", "));
}

// A connection's window holds pushes and pulls apart (each way its own): by layer, chunk 4's pull
// goes right behind its push while the pushes' window is full, and waits only for that push's
// apply on the server; in call order it still waits behind push 5.
TEST_P(SendOrderTest, APullHasAWindowOfItsOwn) {
  ASSERT_NO_FATAL_FAILURE(Start());
  gate_->held = true;
  std::vector<float> g(n_, 1.0f), w(n_, 7.0f);
  const std::vector<int32_t> pushed = {4, 5}, pulled = {4};
  const uint64_t before = c_->taken_requests(0);
  const RequestId push = c_->PushChunks(g, pushed, 0);
  const RequestId pull = c_->PullChunks(w, pulled);
  ASSERT_TRUE(TakenRequests(before, 2));
  if (GetParam() == SendOrder::kLayer) EXPECT_TRUE(Stashed(2));  // "push 4" and "pull 4", held
  gate_->held = false;
  ASSERT_TRUE(c_->Wait(push, 5000ms).ok());
  ASSERT_TRUE(c_->Wait(pull, 5000ms).ok());
  const std::vector<std::string> taken = Taken();
  const std::vector<std::string> by_call = {"push 4", "push 5", "pull 4"};
  const std::vector<std::string> by_layer = {"push 4", "pull 4", "push 5"};
  EXPECT_EQ(taken, GetParam() == SendOrder::kCall ? by_call : by_layer) << fmt::format("{}", fmt::join(taken, ", "));
  for (size_t i = 64; i < 80; ++i) EXPECT_EQ(w[i], -1.0f) << i;  // chunk 4 pulled after its push
}

// Parts of low chunks that never stop coming do not starve a high chunk's part past its reply
// timeout: a request waiting for half of it goes first.
TEST_P(SendOrderTest, AHighChunkIsNotStarvedPastItsReplyTimeout) {
  ASSERT_NO_FATAL_FAILURE(Start(600ms));
  gate_->slow_ms = 1;  // the low pushes come faster than they leave
  std::vector<float> g(n_, 1.0f);
  const std::vector<int32_t> low = {0}, high = {7};
  std::deque<RequestId> feeding;
  for (int i = 0; i < 32; ++i) feeding.push_back(c_->PushChunks(g, low, 0));
  const RequestId starved = c_->PushChunks(g, high, 0);
  const auto t0 = std::chrono::steady_clock::now();
  Status done = Timeout("not yet");
  while (std::chrono::steady_clock::now() - t0 < 3s) {  // keep 32 low pushes waiting
    ASSERT_TRUE(c_->Wait(feeding.front(), 5000ms).ok());
    feeding.pop_front();
    feeding.push_back(c_->PushChunks(g, low, 0));
    done = c_->Wait(starved, 0ms);
    if (done.code() != StatusCode::kTimeout) break;
  }
  EXPECT_TRUE(done.ok()) << done.ToString();
  for (RequestId id : feeding) ASSERT_TRUE(c_->Wait(id, 5000ms).ok());
}

// A log that refuses every seventh message: each refused part waits out its backoff and goes
// again (nothing of it was applied), while up to 16 requests of random chunks are in flight
// through a one-part window. Every request completes and every push is applied exactly once.
TEST_P(SendOrderTest, PartsTheLogRefusedGoAgainAndEachPushIsAppliedOnce) {
  ASSERT_NO_FATAL_FAILURE(Start(20000ms));
  gate_->refuse_one_in = 7;
  const int chunks = layout_.num_chunks();
  std::vector<float> g(n_, 1.0f);
  std::vector<std::vector<float>> pulled(16, std::vector<float>(n_));
  std::vector<int> pushes(static_cast<size_t>(chunks), 0);
  std::mt19937 rng(11);
  std::deque<RequestId> inflight;
  int64_t clock = 0;
  for (int i = 0; i < 60; ++i) {
    std::vector<int32_t> ids;
    for (int c = 0; c < chunks; ++c)
      if (rng() % 3 == 0) ids.push_back(c);
    if (ids.empty()) ids.push_back(static_cast<int32_t>(rng() % chunks));
    if (rng() % 4 == 0) std::shuffle(ids.begin(), ids.end(), rng);
    if (rng() % 3 == 0) {
      inflight.push_back(c_->PullChunks(pulled[static_cast<size_t>(i % 16)], ids, clock));
    } else {
      if (rng() % 4 == 0) ++clock;
      for (int32_t c : ids) ++pushes[static_cast<size_t>(c)];
      inflight.push_back(c_->PushChunks(g, ids, clock));
    }
    for (; inflight.size() > 15; inflight.pop_front()) ASSERT_TRUE(c_->Wait(inflight.front(), 20000ms).ok());
  }
  for (; !inflight.empty(); inflight.pop_front()) ASSERT_TRUE(c_->Wait(inflight.front(), 20000ms).ok());
  EXPECT_GT(gate_->refused.load(), 10);
  gate_->refuse_one_in = 0;
  std::vector<float> w(n_);
  ASSERT_TRUE(c_->Wait(c_->Pull(w), 5000ms).ok());
  for (int c = 0; c < chunks; ++c) {  // lr 1, gradient 1, no momentum: -1 per push applied
    const auto& chunk = layout_.chunk(c);
    for (int64_t i = 0; i < chunk.count; ++i)
      ASSERT_EQ(w[static_cast<size_t>(chunk.flat_offset + i)], -static_cast<float>(pushes[static_cast<size_t>(c)]))
          << "chunk " << c;
  }
}

INSTANTIATE_TEST_SUITE_P(Orders, SendOrderTest, ::testing::Values(SendOrder::kCall, SendOrder::kLayer),
                         [](const ::testing::TestParamInfo<SendOrder>& i) {
                           return std::string(SendOrderName(i.param));
                         });

TEST(PsClientCreate, SilentServerFailsAfterServerWaitNotReplyTimeoutNamingTheServer) {
  ParamLayout layout;
  ASSERT_TRUE(ParamLayout::Build({{"a", {10}, 1, 1}}, 1, 32, &layout).ok());
  InprocTransport t;
  std::unique_ptr<ServerEndpoint> silent;  // bound but never answers, probes neither
  ASSERT_TRUE(t.Bind("silent", &silent).ok());
  PsClientOptions o;
  o.server_addresses = {"silent"};
  o.reply_timeout = 100ms;  // a server that never answered is not one holding a request
  o.server_wait = 300ms;
  o.probe_every = 50ms;
  std::unique_ptr<PsClient> c;
  ASSERT_TRUE(PsClient::Create(&t, layout, o, &c).ok());
  std::vector<float> w(10);
  const auto t0 = std::chrono::steady_clock::now();
  Status s = c->Wait(c->Pull(w), 5000ms);
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_NE(s.message().find("server 0"), std::string::npos) << s.message();
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 300ms);
}

// Abort (a worker put out of the run): an operation waiting on a silent server fails at once with
// the reason given, not after server_wait, and so does every later one.
TEST(PsClientCreate, AbortFailsWhatWaitsAndWhatComesAfterWithItsReason) {
  ParamLayout layout;
  ASSERT_TRUE(ParamLayout::Build({{"a", {10}, 1, 1}}, 1, 32, &layout).ok());
  InprocTransport t;
  std::unique_ptr<ServerEndpoint> silent;  // bound but never answers
  ASSERT_TRUE(t.Bind("silent", &silent).ok());
  PsClientOptions o;
  o.server_addresses = {"silent"};
  o.server_wait = 60s;
  o.probe_every = 50ms;
  std::unique_ptr<PsClient> c;
  ASSERT_TRUE(PsClient::Create(&t, layout, o, &c).ok());
  std::vector<float> w(10);
  const RequestId pull = c->Pull(w);
  EXPECT_EQ(c->Wait(pull, 100ms).code(), StatusCode::kTimeout);  // still waiting on the server
  const auto t0 = std::chrono::steady_clock::now();
  c->Abort(FailedPrecondition("out of the run"));
  c->Abort(InvalidArgument("a second reason"));  // the first stays
  Status s = c->Wait(pull, 5000ms);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  EXPECT_EQ(s.message(), "out of the run");
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s);
  s = c->Wait(c->Pull(w), 5000ms);
  EXPECT_EQ(s.message(), "out of the run");
}

}  // namespace
}  // namespace downpour
