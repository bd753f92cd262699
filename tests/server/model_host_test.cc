// model_host_test.cc — several models on one set of servers (server/model_host.h): three models
// of different shapes and solvers on two servers answer each by id with no crosstalk (a model's
// weights byte for byte unchanged by pushes to another), an unknown model id is refused with
// kModelId and counted, checkpoints plus write-ahead logs restore every model, and move pushes
// (kFlagMove, multi-model rotation) add the change, advance the lr schedule by their batches,
// survive a restart, and are refused where they do not belong with the weights unchanged.
#include "server/model_host.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <thread>
#include <vector>

#include "client/ps/ps_client.h"
#include "common/codec.h"
#include "common/env.h"
#include "common/inproc_transport.h"
#include "common/solver/lr_policy.h"
#include "common/solver/sgd.h"
#include "tests/testing/fault_env.h"

namespace downpour {
namespace {

using namespace std::chrono_literals;

constexpr int kServers = 2;

// Three models of different shapes (model 1 is the largest; model 2 has one tensor).
std::vector<std::vector<TensorSpec>> ThreeModels() {
  return {{{"w", {6, 5}, 1.0f, 1.0f}, {"b", {6}, 2.0f, 0.0f}},
          {{"conv", {4, 3, 3, 3}, 1.0f, 1.0f}, {"fc", {10, 40}, 1.0f, 1.0f}, {"fc_b", {10}, 2.0f, 0.0f}},
          {{"v", {17}, 1.0f, 1.0f}}};
}

std::vector<float> Iota(size_t n, float start, float step) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = start + step * static_cast<float>(i);
  return v;
}

class ModelHostTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/model_host_" + ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    for (const auto& specs : ThreeModels()) {
      ParamLayout l;
      ASSERT_TRUE(ParamLayout::Build(specs, kServers, 16, &l).ok());
      layouts_.push_back(std::move(l));
    }
    for (int k = 0; k < 3; ++k) {
      SolverConfig s;
      s.base_lr = 0.01f * static_cast<float>(k + 1);  // a different solver per model
      s.momentum = 0.5f + 0.2f * static_cast<float>(k);
      s.weight_decay = 0.001f * static_cast<float>(k);
      solvers_.push_back(s);
    }
  }
  void TearDown() override { StopHosts(); }

  ShardOptions Options(int server, int model, bool persist) const {
    ShardOptions o;
    o.server_id = server;
    o.model_id = static_cast<uint32_t>(model);
    o.solver = solvers_[static_cast<size_t>(model)];
    o.cluster.workers = 2;
    o.model_moves = moves_;
    if (persist) {
      o.checkpoint_path = fmt::format("{}/server-{}.model-{}.dpt", dir_, server, model);
      o.wal_path = fmt::format("{}/server-{}.model-{}.wal", dir_, server, model);
      o.checkpoint.wal_fsync_ms = wal_fsync_ms_;
    }
    return o;
  }
  // One ModelHost per server, K shards each; `recover` rebuilds them from checkpoint + log.
  void StartHosts(bool persist, bool recover = false) {
    addresses_.clear();
    for (int s = 0; s < kServers; ++s) {
      std::vector<std::unique_ptr<ShardServer>> shards;
      for (int k = 0; k < static_cast<int>(layouts_.size()); ++k) {
        std::unique_ptr<ShardServer> shard;
        ASSERT_TRUE(ShardServer::Create(layouts_[static_cast<size_t>(k)], Options(s, k, persist), &shard).ok());
        if (recover) {
          RecoverReport rep;
          const Status st = shard->Recover(&rep);
          ASSERT_TRUE(st.ok()) << st.ToString();
        }
        shards.push_back(std::move(shard));
      }
      std::unique_ptr<ModelHost> host;
      ASSERT_TRUE(ModelHost::Create(std::move(shards), &host).ok());
      std::unique_ptr<ServerEndpoint> ep;
      ASSERT_TRUE(transport_.Bind(fmt::format("host{}-{}", s, generation_), &ep).ok());
      addresses_.push_back(ep->address());
      host->Start(std::move(ep));
      hosts_.push_back(std::move(host));
    }
    ++generation_;
  }
  void StopHosts() {
    for (auto& h : hosts_) h->Stop();
    for (auto& h : hosts_) EXPECT_TRUE(h->Join().ok());
    hosts_.clear();
  }
  std::unique_ptr<PsClient> Client(int model, int worker) {
    PsClientOptions o;
    o.server_addresses = addresses_;
    o.worker_id = worker;
    o.model_id = static_cast<uint32_t>(model);
    o.reply_timeout = 10000ms;
    std::unique_ptr<PsClient> c;
    EXPECT_TRUE(PsClient::Create(&transport_, layouts_[static_cast<size_t>(model)], o, &c).ok());
    EXPECT_TRUE(c->Connect(5000ms).ok());
    return c;
  }
  // Every float of model `k` as the servers hold it.
  std::vector<float> Weights(int k) const {
    const ParamLayout& l = layouts_[static_cast<size_t>(k)];
    std::vector<float> w(static_cast<size_t>(l.total_elems()));
    for (const Chunk& c : l.chunks()) {
      auto cw = hosts_[static_cast<size_t>(c.server)]->shard(k)->ChunkWeights(c.id);
      EXPECT_EQ(cw.size(), static_cast<size_t>(c.count));
      std::copy(cw.begin(), cw.end(), w.begin() + c.flat_offset);
    }
    return w;
  }
  std::vector<float> History(int k) const {
    const ParamLayout& l = layouts_[static_cast<size_t>(k)];
    std::vector<float> h(static_cast<size_t>(l.total_elems()));
    for (const Chunk& c : l.chunks()) {
      auto ch = hosts_[static_cast<size_t>(c.server)]->shard(k)->ChunkHistory(c.id);
      std::copy(ch.begin(), ch.end(), h.begin() + c.flat_offset);
    }
    return h;
  }
  size_t Floats(int k) const { return static_cast<size_t>(layouts_[static_cast<size_t>(k)].total_elems()); }
  static bool SameBytes(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  }
  // Initial weights for every model, pushed by worker 0.
  void InitAll() {
    for (int k = 0; k < 3; ++k) {
      auto c = Client(k, 0);
      ASSERT_TRUE(c->Wait(c->PushInit(Iota(Floats(k), 0.25f * static_cast<float>(k + 1), 0.125f)), 5000ms).ok());
    }
  }

  InprocTransport transport_;
  std::vector<ParamLayout> layouts_;
  std::vector<SolverConfig> solvers_;
  std::vector<std::string> addresses_;
  std::vector<std::unique_ptr<ModelHost>> hosts_;
  std::string dir_;
  bool moves_ = false;
  int wal_fsync_ms_ = 200;  // the logs' (checkpoint.wal_fsync_ms's default)
  int generation_ = 0;
};

TEST_F(ModelHostTest, ThreeModelsAnswerByIdWithNoCrosstalk) {
  StartHosts(/*persist=*/false);
  InitAll();
  std::vector<std::vector<float>> before;
  for (int k = 0; k < 3; ++k) before.push_back(Weights(k));
  // Pushes to model 1 leave models 0 and 2 byte for byte as they were; model 1 follows its own
  // solver (SgdUpdate with model 1's lr, momentum and decay per tensor).
  auto c1 = Client(1, 1);
  std::vector<float> ref = before[1], hist(Floats(1), 0.0f), pulled(Floats(1));
  for (int step = 0; step < 3; ++step) {
    ASSERT_TRUE(c1->Wait(c1->Pull(pulled), 5000ms).ok());
    ASSERT_TRUE(SameBytes(pulled, ref)) << "step " << step;
    const std::vector<float> g = Iota(Floats(1), 0.5f - 0.1f * static_cast<float>(step), -0.01f);
    ASSERT_TRUE(c1->Wait(c1->Push(g, step), 5000ms).ok());
    const ParamLayout& l = layouts_[1];
    for (size_t t = 0; t < l.tensors().size(); ++t) {
      const auto off = static_cast<size_t>(l.tensor_flat_offset(static_cast<int>(t)));
      const auto len = static_cast<size_t>(l.tensors()[t].numel());
      const UpdateParams p = MakeUpdateParams(solvers_[1], step, l.tensors()[t].lr_mult, l.tensors()[t].decay_mult, 1.0f);
      SgdUpdate(p, std::span<const float>(g.data() + off, len), std::span<float>(ref.data() + off, len),
                std::span<float>(hist.data() + off, len));
    }
  }
  EXPECT_TRUE(SameBytes(Weights(1), ref));
  EXPECT_TRUE(SameBytes(Weights(0), before[0]));
  EXPECT_TRUE(SameBytes(Weights(2), before[2]));
  EXPECT_TRUE(SameBytes(History(0), std::vector<float>(Floats(0), 0.0f)));
  // And the other way: pushes to model 2 leave model 1 where model 1's own pushes left it.
  auto c2 = Client(2, 0);
  ASSERT_TRUE(c2->Wait(c2->Push(std::vector<float>(Floats(2), 1.0f), 0), 5000ms).ok());
  EXPECT_TRUE(SameBytes(Weights(1), ref));
  EXPECT_FALSE(SameBytes(Weights(2), before[2]));
  // Counters are per model: gradient push messages taken, per worker id.
  uint64_t applied[3] = {0, 0, 0};
  uint64_t updates[3] = {0, 0, 0};
  for (const auto& h : hosts_) {
    for (int k = 0; k < 3; ++k) {
      const ShardStatsWire st = h->shard(k)->Stats();
      applied[k] += st.pushes_by_worker.at(0) + st.pushes_by_worker.at(1);
      updates[k] += st.chunk_updates;
    }
  }
  EXPECT_EQ(applied[0], 0u);
  EXPECT_GT(applied[1], 0u);
  EXPECT_GT(applied[2], 0u);
  EXPECT_EQ(updates[0], 0u);
  EXPECT_EQ(updates[1], 3u * static_cast<uint64_t>(layouts_[1].num_chunks()));
  EXPECT_EQ(updates[2], 1u * static_cast<uint64_t>(layouts_[2].num_chunks()));
}

TEST_F(ModelHostTest, AnUnknownModelIdIsRefusedAndCounted) {
  StartHosts(/*persist=*/false);
  InitAll();
  const auto before = Weights(0);
  uint64_t received[3];
  for (int k = 0; k < 3; ++k) received[k] = hosts_[0]->shard(k)->Stats().pushes_received;
  std::unique_ptr<ClientEndpoint> raw;
  ASSERT_TRUE(transport_.Connect(addresses_[0], &raw).ok());
  for (uint32_t model : {3u, 7u, 0xFFFFFFFFu}) {
    MessageHeader h;
    h.type = model == 3u ? MsgType::kRegister : MsgType::kPush;
    h.sender = 0;
    h.model_id = model;
    h.layout_hash = layouts_[0].hash();
    h.chunk_ids = {0};
    h.versions = {0};
    h.elem_counts = {static_cast<uint64_t>(layouts_[0].chunk(0).count)};
    h.byte_lengths = {h.elem_counts[0] * 4};
    Frames f(1);
    ASSERT_TRUE(HeaderFrame(h, &f[0]).ok());
    std::vector<float> g(h.elem_counts[0], 100.0f);
    f.push_back(Frame::Copy(g.data(), g.size() * 4));
    ASSERT_TRUE(raw->Send(std::move(f)).ok());
    Frames reply;
    ASSERT_TRUE(raw->Receive(&reply, 5000ms).ok());
    MessageHeader r;
    ASSERT_TRUE(ParseHeader(reply, &r).ok());
    EXPECT_EQ(r.type, MsgType::kError);
    EXPECT_EQ(r.flags, static_cast<uint32_t>(RejectReason::kModelId));
    EXPECT_NE(r.error_text.find(fmt::format("model id {} is not served here", model)), std::string::npos) << r.error_text;
  }
  EXPECT_EQ(hosts_[0]->unknown_model(), 3u);
  EXPECT_TRUE(SameBytes(Weights(0), before));
  for (int k = 0; k < 3; ++k) EXPECT_EQ(hosts_[0]->shard(k)->Stats().pushes_received, received[k]);
}

TEST_F(ModelHostTest, CheckpointsAndLogsRestoreEveryModel) {
  StartHosts(/*persist=*/true);
  InitAll();
  for (int k = 0; k < 3; ++k) {
    auto c = Client(k, 0);
    for (int step = 0; step < 2 + k; ++step) {
      ASSERT_TRUE(c->Wait(c->Push(Iota(Floats(k), 0.1f * static_cast<float>(step + k), 0.01f), step), 5000ms).ok());
    }
    if (k == 1) {  // model 1 checkpoints midway: its restore is checkpoint + the log after it
      for (const auto& h : hosts_) ASSERT_TRUE(h->shard(1)->SaveCheckpoint(h->shard(1)->options().checkpoint_path).ok());
      ASSERT_TRUE(c->Wait(c->Push(std::vector<float>(Floats(1), 0.5f), 9), 5000ms).ok());
    }
  }
  std::vector<std::vector<float>> weights, history;
  std::vector<std::vector<int64_t>> versions;
  for (int k = 0; k < 3; ++k) {
    weights.push_back(Weights(k));
    history.push_back(History(k));
    std::vector<int64_t> v;
    for (const Chunk& c : layouts_[static_cast<size_t>(k)].chunks()) {
      v.push_back(hosts_[static_cast<size_t>(c.server)]->shard(k)->ChunkVersion(c.id));
    }
    versions.push_back(v);
  }
  StopHosts();  // "killed": nothing saved on the way out
  StartHosts(/*persist=*/true, /*recover=*/true);
  for (int k = 0; k < 3; ++k) {
    SCOPED_TRACE(testing::Message() << "model " << k);
    EXPECT_TRUE(SameBytes(Weights(k), weights[static_cast<size_t>(k)]));
    EXPECT_TRUE(SameBytes(History(k), history[static_cast<size_t>(k)]));
    size_t i = 0;
    for (const Chunk& c : layouts_[static_cast<size_t>(k)].chunks()) {
      EXPECT_EQ(hosts_[static_cast<size_t>(c.server)]->shard(k)->ChunkVersion(c.id), versions[static_cast<size_t>(k)][i++]);
    }
  }
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/server-0.model-1.dpt"));
  // A checkpoint of one model does not load into another (model id and layout are checked).
  EXPECT_FALSE(hosts_[0]->shard(2)->LoadCheckpoint(dir_ + "/server-0.model-1.dpt").ok());
}

// A log that takes nothing more (here a failed fdatasync) stops its host's loop as a crash would,
// and downpour-server exits so that the launcher restarts it with --recover: the push that found
// the failure goes unanswered, Join names the log, and every model comes back from its log with
// each chunk as it was before that push or with it applied once. The logs fsync before every ack here, so the failure is the
// push's own at both servers (with the fsync thread, which server's thread fails before the push
// arrives is a race; wal_test covers that path).
TEST_F(ModelHostTest, AFailedLogStopsTheHostAndEveryModelComesBackFromItsLog) {
  test::FaultEnv env;  // outlives the hosts, which write through it
  wal_fsync_ms_ = 0;
  StartHosts(/*persist=*/true);
  InitAll();
  std::vector<std::vector<float>> weights, stopped;
  for (int k = 0; k < 3; ++k) weights.push_back(Weights(k));
  {
    ScopedEnv scoped(&env);
    env.FailFsync(EIO);
    const std::vector<float> g(Floats(1), 0.25f);  // the client borrows it while the push is open
    auto c = Client(1, 0);
    const RequestId id = c->Push(g, 1);
    EXPECT_EQ(c->Wait(id, 500ms).code(), StatusCode::kTimeout) << "the push that found the failure was answered";
    for (auto& h : hosts_) {
      for (int i = 0; i < 500 && !h->log_failed(); ++i) std::this_thread::sleep_for(10ms);  // bounded: 5 s
      ASSERT_TRUE(h->log_failed());     // before Join, which would wait for a loop that goes on
      const Status joined = h->Join();  // the loop ended by itself
      EXPECT_EQ(joined.code(), StatusCode::kIoError);
      EXPECT_NE(joined.message().find("model-1.wal takes nothing more"), std::string::npos) << joined.message();
    }
    // What the stopped hosts hold: the unacknowledged push applied, message by message, the ones
    // the log wrote before its fdatasync failed and any staged after them.
    for (int k = 0; k < 3; ++k) stopped.push_back(Weights(k));
    hosts_.clear();
  }
  StartHosts(/*persist=*/true, /*recover=*/true);
  // Each chunk comes back as it was before the push or with it applied once (its message was
  // written whole): never torn, never twice. Its client would resend the push, and the restarted
  // servers find the messages they hold duplicates.
  for (int k = 0; k < 3; ++k) {
    const std::vector<float> back = Weights(k);
    for (const Chunk& c : layouts_[static_cast<size_t>(k)].chunks()) {
      auto span = [&](const std::vector<float>& w) {
        return std::vector<float>(w.begin() + c.flat_offset, w.begin() + c.flat_offset + c.count);
      };
      const auto got = span(back);
      EXPECT_TRUE(SameBytes(got, span(weights[static_cast<size_t>(k)])) ||
                  SameBytes(got, span(stopped[static_cast<size_t>(k)])))
          << "model " << k << " chunk " << c.id;
    }
  }
}

TEST_F(ModelHostTest, MovePushesAddTheChangeAdvanceTheScheduleAndSurviveARestart) {
  moves_ = true;
  StartHosts(/*persist=*/true);
  InitAll();
  const auto start = Weights(0);
  auto c = Client(0, 1);
  const std::vector<float> change = Iota(Floats(0), -0.5f, 0.0625f);
  ASSERT_TRUE(c->Wait(c->PushMove(change, 40), 5000ms).ok());
  ASSERT_TRUE(c->Wait(c->PushMove(change, 2), 5000ms).ok());
  std::vector<float> expect = start;
  for (size_t i = 0; i < expect.size(); ++i) expect[i] = (expect[i] + change[i]) + change[i];
  EXPECT_TRUE(SameBytes(Weights(0), expect));
  for (const Chunk& ch : layouts_[0].chunks()) {
    EXPECT_EQ(hosts_[static_cast<size_t>(ch.server)]->shard(0)->ChunkVersion(ch.id), 2);
    EXPECT_EQ(hosts_[static_cast<size_t>(ch.server)]->shard(0)->ChunkScheduleIter(ch.id), 42);
  }
  EXPECT_TRUE(SameBytes(History(0), std::vector<float>(Floats(0), 0.0f)));  // no momentum, no decay
  // A move of 0 batches is refused, weights unchanged.
  ASSERT_FALSE(c->Wait(c->PushMove(change, 0), 5000ms).ok());
  EXPECT_TRUE(SameBytes(Weights(0), expect));
  // The log replays moves exactly (the batches included).
  StopHosts();
  StartHosts(/*persist=*/true, /*recover=*/true);
  EXPECT_TRUE(SameBytes(Weights(0), expect));
  EXPECT_EQ(hosts_[0]->shard(0)->ChunkScheduleIter(layouts_[0].ServerChunks(0)[0]), 42);
}

TEST_F(ModelHostTest, AOneModelServerRefusesMoves) {
  StartHosts(/*persist=*/false);  // model_moves off
  InitAll();
  const auto before = Weights(0);
  auto c = Client(0, 0);
  const Status s = c->Wait(c->PushMove(std::vector<float>(Floats(0), 1.0f), 5), 5000ms);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("a model move"), std::string::npos) << s.ToString();
  EXPECT_TRUE(SameBytes(Weights(0), before));
}

TEST_F(ModelHostTest, TheSetOfModelsStaysBalancedAcrossServers) {
  // Memory is the sum of the models' shards; each model splits its floats evenly, so every
  // server holds the set's mean within one float per model.
  int64_t total = 0;
  std::vector<int64_t> per_server(kServers, 0);
  for (const ParamLayout& l : layouts_) {
    total += l.total_elems();
    for (int s = 0; s < kServers; ++s) per_server[static_cast<size_t>(s)] += l.ServerElems(s);
  }
  for (int s = 0; s < kServers; ++s) {
    EXPECT_LE(std::abs(per_server[static_cast<size_t>(s)] * kServers - total),
              static_cast<int64_t>(layouts_.size()) * kServers)
        << "server " << s;
  }
}

TEST(ModelHostCreateTest, RefusesMisnumberedShards) {
  ParamLayout l;
  ASSERT_TRUE(ParamLayout::Build({{"w", {8}, 1, 1}}, 1, 16, &l).ok());
  std::vector<std::unique_ptr<ShardServer>> shards(2);
  ShardOptions o;
  ASSERT_TRUE(ShardServer::Create(l, o, &shards[0]).ok());
  ASSERT_TRUE(ShardServer::Create(l, o, &shards[1]).ok());  // model id 0 again
  std::unique_ptr<ModelHost> host;
  const Status s = ModelHost::Create(std::move(shards), &host);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("shard 1 serves model id 0, expected 1"), std::string::npos) << s.ToString();
  EXPECT_FALSE(ModelHost::Create({}, &host).ok());
}

// Hands out a script of messages (1 ms apart, so their arrivals differ), then times out; records
// the request id of every reply, i.e. the order the loop handled them in.
class ScriptedEndpoint : public ServerEndpoint {
 public:
  explicit ScriptedEndpoint(std::vector<std::pair<PeerId, Frames>> script) : script_(std::move(script)) {}
  Status Receive(PeerId* from, Frames* frames, std::chrono::milliseconds timeout, PeerInfo* /*info*/) override {
    if (next_ == script_.size()) {
      std::this_thread::sleep_for(std::min<std::chrono::milliseconds>(timeout, 1ms));
      return Timeout("scripted: no more messages");
    }
    std::this_thread::sleep_for(1ms);
    *from = script_[next_].first;
    *frames = std::move(script_[next_].second);
    ++next_;
    return Status::Ok();
  }
  Status Send(const PeerId& /*to*/, Frames frames) override {
    MessageHeader r;
    if (ParseHeader(frames, &r).ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      replies_.push_back(r.request_id);
    }
    return Status::Ok();
  }
  std::string address() const override { return "scripted"; }
  std::vector<uint64_t> replies() const {
    std::lock_guard<std::mutex> lock(mu_);
    return replies_;
  }

 private:
  std::vector<std::pair<PeerId, Frames>> script_;
  size_t next_ = 0;
  mutable std::mutex mu_;
  std::vector<uint64_t> replies_;
};

// The order a host's loop handles six waiting messages in: worker 0's push of step 5 (request
// 1), worker 1's push of step 5 (2), worker 0's pull of step 5 (clock 6, request 3), worker 1's
// pull (4), worker 0's clock report (clock 6, 5), a heartbeat from a third peer (6). (Nobody
// registered: each worker message is refused with one error reply, which carries its request
// id; the heartbeat is answered.)
std::vector<uint64_t> HandlingOrder(bool serve_by_step) {
  ParamLayout layout;
  EXPECT_TRUE(ParamLayout::Build(ThreeModels()[0], 1, 16, &layout).ok());
  ShardOptions o;
  o.cluster.workers = 2;
  o.cluster.reply_order = serve_by_step ? ReplyOrder::kStep : ReplyOrder::kArrival;
  std::unique_ptr<ShardServer> shard;
  EXPECT_TRUE(ShardServer::Create(layout, o, &shard).ok());
  std::vector<std::unique_ptr<ShardServer>> shards;
  shards.push_back(std::move(shard));
  std::unique_ptr<ModelHost> host;
  EXPECT_TRUE(ModelHost::Create(std::move(shards), &host).ok());
  std::vector<std::pair<PeerId, Frames>> script;
  const struct {
    const char* peer;
    MsgType type;
    int32_t sender;
    int64_t clock;
  } messages[] = {{"A", MsgType::kPush, 0, 5}, {"B", MsgType::kPush, 1, 5},  {"A", MsgType::kPull, 0, 6},
                  {"B", MsgType::kPull, 1, 6}, {"A", MsgType::kClock, 0, 6}, {"C", MsgType::kHeartbeat, 0, 0}};
  uint64_t id = 0;
  for (const auto& m : messages) {
    MessageHeader h;
    h.type = m.type;
    h.role = Role::kWorker;
    h.sender = m.sender;
    h.clock = m.clock;
    h.request_id = ++id;
    h.layout_hash = layout.hash();
    Frames f(1);
    EXPECT_TRUE(HeaderFrame(h, &f[0]).ok());
    script.emplace_back(m.peer, std::move(f));
  }
  auto ep = std::make_unique<ScriptedEndpoint>(std::move(script));
  ScriptedEndpoint* scripted = ep.get();
  host->Start(std::move(ep));
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (scripted->replies().size() < 6 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(1ms);
  host->Stop();
  EXPECT_TRUE(host->Join().ok());
  return scripted->replies();
}

// By default the loop handles messages as they come; with serve_by_step (cluster.reply_order =
// "step") the heartbeat first, then worker 0's step (push, pull, clock) before worker 1's, each
// worker's messages in their own order.
TEST(ModelHostOrder, ServeByStepTakesOneWorkersStepBeforeTheNext) {
  EXPECT_EQ(HandlingOrder(false), (std::vector<uint64_t>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(HandlingOrder(true), (std::vector<uint64_t>{6, 1, 3, 5, 2, 4}));
}

}  // namespace
}  // namespace downpour
