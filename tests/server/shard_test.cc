// shard_test.cc — the shard server through its message path (in-process transport): update math
// equals SgdUpdate, validation of every bad input (version range included), consistency
// policies (elastic joiners, dead and finished workers), checkpoints, recovery from checkpoint +
// write-ahead log equal byte for byte to the uninterrupted shard (async, sync mid-clock, a
// checkpoint midway), duplicate pushes applied once across restarts, incarnation on every reply,
// the stability warning, and who may checkpoint, shut down, register and push
// (server/access.h), with keys and with a token.
#include "server/shard.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <utility>

#include "client/ps/ps_client.h"
#include "common/env.h"
#include "common/grad_codec.h"
#include "common/inproc_transport.h"
#include "common/rotation.h"
#include "common/solver/lr_policy.h"
#include "common/solver/sgd.h"
#include "common/tensor_file.h"
#include "server/rules/gradient.h"
#include "server/shard_log.h"
#include "server/wal.h"
#include "tests/testing/fault_env.h"
#include "tests/testing/harness.h"
#include "tests/testing/release_counting_endpoint.h"

namespace downpour {
namespace {

using namespace std::chrono_literals;

std::vector<TensorSpec> SmallModel() {
  return {{"w", {6, 5}, 1.0f, 1.0f}, {"b", {6}, 2.0f, 0.0f}, {"v", {17}, 1.0f, 1.0f}};
}

// A raw peer that speaks the wire by hand, to send malformed messages.
class RawPeer {
 public:
  RawPeer(Transport* t, const std::string& address) { EXPECT_TRUE(t->Connect(address, &ep_).ok()); }
  // A peer the server sees as `info` (an authenticated key's role, an address).
  RawPeer(InprocTransport* t, const std::string& address, PeerInfo info) {
    EXPECT_TRUE(t->ConnectAs(address, std::move(info), &ep_).ok());
  }
  void SendFrames(Frames f) { ASSERT_TRUE(ep_->Send(std::move(f)).ok()); }
  void Send(const MessageHeader& h, Frames payload = {}) {
    Frames f(1);
    ASSERT_TRUE(HeaderFrame(h, &f[0]).ok());
    for (auto& p : payload) f.push_back(std::move(p));
    SendFrames(std::move(f));
  }
  MessageHeader Receive() {
    Frames f;
    Status s = ep_->Receive(&f, 5000ms);
    EXPECT_TRUE(s.ok()) << s.ToString();
    MessageHeader h;
    if (s.ok()) {
      EXPECT_TRUE(ParseHeader(f, &h).ok());
    }
    last_frames_ = std::move(f);
    return h;
  }
  const Frames& last_frames() const { return last_frames_; }

 private:
  std::unique_ptr<ClientEndpoint> ep_;
  Frames last_frames_;
};

class ShardFixture : public ::testing::Test {
 protected:
  // `wrap`, when set, is given each shard's endpoint and returns the one the shard serves.
  using WrapEndpoint = std::function<std::unique_ptr<ServerEndpoint>(std::unique_ptr<ServerEndpoint>)>;
  void StartShards(std::vector<TensorSpec> specs, int servers, int64_t chunk_elems, ShardOptions base,
                   const WrapEndpoint& wrap = {}) {
    ASSERT_TRUE(ParamLayout::Build(std::move(specs), servers, chunk_elems, &layout_).ok());
    for (int s = 0; s < servers; ++s) {
      ShardOptions o = ForServer(base, s);
      std::unique_ptr<ShardServer> shard;
      ASSERT_TRUE(ShardServer::Create(layout_, o, &shard).ok());
      std::unique_ptr<ServerEndpoint> ep;
      ASSERT_TRUE(transport_.Bind(fmt::format("shard{}", s), &ep).ok());
      addresses_.push_back(ep->address());
      shard->Start(wrap ? wrap(std::move(ep)) : std::move(ep));
      shards_.push_back(std::move(shard));
    }
  }
  // base for server `s`; with persist_dir_ set, its checkpoint and write-ahead log live there.
  ShardOptions ForServer(const ShardOptions& base, int s) const {
    ShardOptions o = base;
    o.server_id = s;
    if (!persist_dir_.empty()) {
      o.checkpoint_path = fmt::format("{}/server-{}.dpt", persist_dir_, s);
      o.wal_path = fmt::format("{}/server-{}.wal", persist_dir_, s);
    }
    return o;
  }
  // A fresh directory for this test's checkpoints and logs.
  void UsePersistDir() {
    persist_dir_ = ::testing::TempDir() + "/shard_wal_" +
                   ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(persist_dir_);
    std::filesystem::create_directories(persist_dir_);
  }
  // "Kills" server `s` (its loop stops; nothing is saved on the way out) and recovers a new
  // ShardServer from its checkpoint + log, as downpour-server --recover does.
  std::unique_ptr<ShardServer> KillAndRecover(int s, const ShardOptions& base, RecoverReport* report) {
    shards_[static_cast<size_t>(s)]->Stop();
    EXPECT_TRUE(shards_[static_cast<size_t>(s)]->Join().ok());
    std::unique_ptr<ShardServer> fresh;
    EXPECT_TRUE(ShardServer::Create(layout_, ForServer(base, s), &fresh).ok());
    Status st = fresh->Recover(report);
    EXPECT_TRUE(st.ok()) << st.ToString();
    return fresh;
  }
  // Weights, history, versions and pushes_by_worker of `a` and `b` are identical, byte for byte.
  void ExpectSameShard(const ShardServer& a, const ShardServer& b, int s) const {
    for (int32_t id : layout_.ServerChunks(s)) {
      const auto wa = a.ChunkWeights(id), wb = b.ChunkWeights(id);
      ASSERT_EQ(wa.size(), wb.size()) << "chunk " << id;
      EXPECT_EQ(std::memcmp(wa.data(), wb.data(), wa.size() * 4), 0) << "weights of chunk " << id;
      const auto ha = a.ChunkHistory(id), hb = b.ChunkHistory(id);
      ASSERT_EQ(ha.size(), hb.size());
      EXPECT_EQ(std::memcmp(ha.data(), hb.data(), ha.size() * 4), 0) << "history of chunk " << id;
      EXPECT_EQ(a.ChunkVersion(id), b.ChunkVersion(id)) << "chunk " << id;
    }
    EXPECT_EQ(a.Stats().pushes_by_worker, b.Stats().pushes_by_worker);
  }
  // One server with one chunk of 8 floats (plain SGD, history kept), checkpointed after worker
  // 0's initial weights and one gradient, then a second gradient logged; then replacement_
  // recovers from its checkpoint and log while it still runs (downpour-server --recover on another
  // host while this one is cut off). Returns its options.
  ShardOptions ServedThenReplaced() {
    UsePersistDir();
    ShardOptions o = PlainSgd();
    o.checkpoint.history = true;  // kept segments: the replacement copies the old log aside
    StartShards({{"a", {8}, 1, 1}}, 1, 8, o);
    auto c = Client(0);
    EXPECT_TRUE(c->Wait(c->PushInit(std::vector<float>(8, 5.0f)), 5000ms).ok());
    EXPECT_TRUE(c->Wait(c->Push(std::vector<float>(8, 1.0f), 0), 5000ms).ok());
    EXPECT_TRUE(shards_[0]->SaveCheckpoint(ForServer(o, 0).checkpoint_path).ok());  // still its own log
    EXPECT_TRUE(c->Wait(c->Push(std::vector<float>(8, 1.0f), 1), 5000ms).ok());
    EXPECT_TRUE(ShardServer::Create(layout_, ForServer(o, 0), &replacement_).ok());
    RecoverReport rep;
    EXPECT_TRUE(replacement_->Recover(&rep).ok());
    EXPECT_EQ(rep.replayed_pushes, 1u);
    return o;
  }
  std::unique_ptr<ShardServer> replacement_;
  // One server with one chunk of 8 floats (plain SGD), its checkpoint and log in a fresh persist
  // directory: worker 0's initial weights (5) and one gradient (1) acknowledged. Returns its options.
  ShardOptions OneChunkInitAndOnePush() {
    UsePersistDir();
    ShardOptions o = PlainSgd();
    StartShards({{"a", {8}, 1, 1}}, 1, 8, o);
    auto c = Client(0);
    EXPECT_TRUE(c->Wait(c->PushInit(std::vector<float>(8, 5.0f)), 5000ms).ok());
    EXPECT_TRUE(c->Wait(c->Push(std::vector<float>(8, 1.0f), 0), 5000ms).ok());
    return o;
  }
  // Serves `shard` (taking ownership) at a new in-process address; returns the address.
  std::string Serve(std::unique_ptr<ShardServer> shard, const std::string& name) {
    std::unique_ptr<ServerEndpoint> ep;
    EXPECT_TRUE(transport_.Bind(name, &ep).ok());
    const std::string address = ep->address();
    shard->Start(std::move(ep));
    shards_.push_back(std::move(shard));
    return address;
  }

  void TearDown() override {
    for (auto& s : shards_) s->Stop();
    for (auto& s : shards_) EXPECT_TRUE(s->Join().ok());
  }

  // StartShards in place of shards an earlier run of the same test stopped (TearDown).
  void RestartShards(std::vector<TensorSpec> specs, int servers, int64_t chunk_elems, ShardOptions base) {
    shards_.clear();
    addresses_.clear();
    StartShards(std::move(specs), servers, chunk_elems, std::move(base));
  }

  // The apply-lane tests' end: every weight pulled at `clock` through `c` must be `want`; then the
  // shards stop. Returns the pulled weights.
  std::vector<float> PullExpectAndStop(PsClient& c, int64_t clock, const std::vector<float>& want, int lanes) {
    std::vector<float> got(want.size());
    EXPECT_TRUE(c.Wait(c.Pull(got, clock), 5000ms).ok());
    EXPECT_EQ(got, want) << lanes << " lanes";
    TearDown();
    return got;
  }

  // The DC-ASGD tests' start: one server, one chunk of 4 floats, lr 1, no momentum or decay
  // (so an update is w − g'), the algorithm's settings from `o`; worker 0 pushes kDcW0 as the
  // initial weights and workers 0 and 1 both pull it, the copy a stale gradient is compensated
  // against.
  static inline const std::vector<float> kDcW0{1.0f, -2.0f, 0.5f, 3.0f};
  // lr 1, no momentum, no weight decay: an update is w − g, for values checked by hand.
  static ShardOptions PlainSgd() {
    ShardOptions o;
    o.solver.base_lr = 1.0f;
    o.solver.momentum = 0.0f;
    o.solver.weight_decay = 0.0f;
    return o;
  }
  // PlainSgd for `workers` workers on `threads` apply lanes.
  static ShardOptions LaneOptions(int workers, int threads) {
    ShardOptions o = PlainSgd();
    o.cluster.workers = workers;
    o.cluster.server_threads = threads;
    return o;
  }

  // DC-ASGD-a with λ0 = 0.5, m = 0.5, two workers, and StartDcAsgd's solver (so a shard
  // recovered from these options applies pushes as the started one did).
  static ShardOptions AdaptiveDcOptions() {
    ShardOptions o = PlainSgd();
    o.consistency.algorithm = Algorithm::kDcAsgdAdaptive;
    o.consistency.dc_lambda0 = 0.5f;
    o.consistency.dc_mean_square_decay = 0.5f;
    o.cluster.workers = 2;
    return o;
  }
  void StartDcAsgd(ShardOptions o, std::unique_ptr<PsClient>* c0, std::unique_ptr<PsClient>* c1) {
    o.solver = PlainSgd().solver;
    StartShards({{"a", {4}, 1, 1}}, 1, 4, o);
    *c0 = Client(0);
    *c1 = Client(1);
    ASSERT_TRUE((*c0)->Wait((*c0)->PushInit(kDcW0), 5000ms).ok());
    std::vector<float> w(4);
    ASSERT_TRUE((*c0)->Wait((*c0)->Pull(w, 0), 5000ms).ok());
    ASSERT_TRUE((*c1)->Wait((*c1)->Pull(w, 0), 5000ms).ok());
  }

  std::unique_ptr<PsClient> Client(int worker, const std::function<void(PsClientOptions&)>& adjust = {}) {
    PsClientOptions o;
    o.server_addresses = addresses_;
    o.worker_id = worker;
    o.reply_timeout = 10000ms;
    o.max_chunks_per_message = 4;  // the counter checks below depend on it
    if (adjust) adjust(o);
    std::unique_ptr<PsClient> c;
    EXPECT_TRUE(PsClient::Create(&transport_, layout_, o, &c).ok());
    EXPECT_TRUE(c->Connect(5000ms).ok());
    return c;
  }
  // What a shard's update of the whole model with gradient g at chunk version `version` makes
  // of (*ref, *hist): SgdUpdate per tensor with its multipliers and the lr at that version.
  void ReferenceUpdate(const SolverConfig& solver, int64_t version, const std::vector<float>& g, std::vector<float>* ref,
                       std::vector<float>* hist) const {
    for (size_t t = 0; t < layout_.tensors().size(); ++t) {
      const TensorSpec& spec = layout_.tensors()[t];
      const auto off = static_cast<size_t>(layout_.tensor_flat_offset(static_cast<int>(t)));
      const auto len = static_cast<size_t>(spec.numel());
      UpdateParams p = MakeUpdateParams(solver, version, spec.lr_mult, spec.decay_mult, 1.0f);
      SgdUpdate(p, std::span<const float>(g.data() + off, len), std::span<float>(ref->data() + off, len),
                std::span<float>(hist->data() + off, len));
    }
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
  // The header of worker 0's f32 push of `count` floats to `chunk`, computed from `version`.
  MessageHeader DensePush(int32_t chunk, int64_t version, size_t count, uint64_t request_id) const {
    MessageHeader h;
    h.type = MsgType::kPush;
    h.sender = 0;
    h.request_id = request_id;
    h.layout_hash = layout_.hash();
    h.chunk_ids = {static_cast<uint32_t>(chunk)};
    h.versions = {version};
    h.elem_counts = {count};
    h.byte_lengths = {count * 4};
    return h;
  }
  // A registered raw peer for server `s`, worker id `worker`.
  std::unique_ptr<RawPeer> Raw(int s, int worker) {
    auto p = std::make_unique<RawPeer>(&transport_, addresses_[static_cast<size_t>(s)]);
    MessageHeader h;
    h.type = MsgType::kRegister;
    h.sender = worker;
    h.layout_hash = layout_.hash();
    p->Send(h);
    EXPECT_EQ(p->Receive().type, MsgType::kRegisterReply);
    return p;
  }

  InprocTransport transport_;
  ParamLayout layout_;
  std::vector<std::string> addresses_;
  std::vector<std::unique_ptr<ShardServer>> shards_;
  std::string persist_dir_;
};

std::vector<float> Iota(size_t n, float start, float step) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = start + step * static_cast<float>(i);
  return v;
}

TEST_F(ShardFixture, UpdateThroughTheMessagePathEqualsSgdUpdate) {
  ShardOptions o;
  o.solver.base_lr = 0.05f;
  o.solver.lr_policy = LrPolicy::kStep;
  o.solver.stepsize = 2;
  o.solver.gamma = 0.5f;
  o.solver.momentum = 0.9f;
  o.solver.weight_decay = 0.01f;
  StartShards(SmallModel(), 2, 8, o);
  auto client = Client(0);
  const size_t n = static_cast<size_t>(layout_.total_elems());
  std::vector<float> w0 = Iota(n, -1.0f, 0.03125f);
  ASSERT_TRUE(client->Wait(client->PushInit(w0), 5000ms).ok());

  // Reference: per tensor, SgdUpdate with that tensor's multipliers and lr at the version.
  std::vector<float> ref = w0, hist(n, 0.0f);
  std::vector<float> pulled(n);
  for (int step = 0; step < 5; ++step) {
    ASSERT_TRUE(client->Wait(client->Pull(pulled), 5000ms).ok());
    EXPECT_EQ(pulled, ref) << "step " << step;
    std::vector<float> g = Iota(n, 0.1f * static_cast<float>(step + 1), -0.0078125f);
    ASSERT_TRUE(client->Wait(client->Push(g, step), 5000ms).ok());
    ReferenceUpdate(o.solver, step, g, &ref, &hist);  // each chunk's version is `step` (one push per step)
  }
  EXPECT_EQ(AllWeights(), ref);  // bit for bit
  ASSERT_TRUE(client->Wait(client->Pull(pulled), 5000ms).ok());
  EXPECT_EQ(pulled, ref);
  for (const Chunk& c : layout_.chunks()) EXPECT_EQ(client->last_versions()[static_cast<size_t>(c.id)], 5);
}

// The loop applies nothing itself (the lanes do, server/apply_lanes.h), so it never calls into
// the transport in the middle of an update: no ReleaseDue from a push of many chunks, and the
// acks and the pull still come back. 8 chunks (tensors of 30, 6 and 17 floats in chunks of up
// to 8) in messages of 4.
TEST_F(ShardFixture, AnUpdateNeverCallsIntoTheTransport) {
  std::atomic<int> releases{0};
  ShardOptions o = PlainSgd();
  o.cluster.server_threads = 3;
  StartShards(SmallModel(), 1, 8, o, [&releases](std::unique_ptr<ServerEndpoint> ep) {
    return std::make_unique<test::ReleaseCountingEndpoint>(std::move(ep), &releases);
  });
  ASSERT_EQ(layout_.chunks().size(), 8u);
  auto client = Client(0);
  const size_t n = static_cast<size_t>(layout_.total_elems());
  ASSERT_TRUE(client->Wait(client->PushInit(std::vector<float>(n, 1.0f)), 5000ms).ok());
  const std::vector<float> g(n, 0.5f);
  ASSERT_TRUE(client->Wait(client->Push(g, 0), 5000ms).ok());
  ASSERT_TRUE(client->Wait(client->Push(g, 1), 5000ms).ok());
  std::vector<float> w(n);
  ASSERT_TRUE(client->Wait(client->Pull(w, 2), 5000ms).ok());
  std::vector<float> want(n, 0.0f);  // 1 − 0.5 − 0.5; b (floats 30..35) has lr_mult 2: 1 − 1 − 1
  std::fill(want.begin() + 30, want.begin() + 36, -1.0f);
  EXPECT_EQ(w, want);
  EXPECT_EQ(releases.load(), 0);
}

// ---------------------------------------------------------------------------------------------
// Apply lanes (server/apply_lanes.h): cluster.server_threads threads apply, each owning chunks.

// Eight workers push integer gradients at once, each push cut into messages of 4 chunks, so the
// chunks of a push and the pushes of different workers apply on four lanes together. With lr 1
// and neither momentum nor decay every update is w − lr_mult·g in exact integers, whatever the
// order: the weights must be the closed form, and those of a one-lane shard, byte for byte.
// Runs `run` (a job at that many lanes, returning the pulled weights) at 1 and at 4 lanes: the
// weights must be the same floats.
void ExpectOneLaneEqualsFour(const std::function<std::vector<float>(int threads)>& run) {
  const std::vector<float> serial = run(1);
  const std::vector<float> parallel = run(4);
  ASSERT_EQ(serial.size(), parallel.size());
  EXPECT_EQ(std::memcmp(serial.data(), parallel.data(), serial.size() * sizeof(float)), 0);
}

TEST_F(ShardFixture, ParallelApplyGivesTheWeightsOfSerialApply) {
  constexpr int kWorkers = 8, kPushes = 12;
  auto grad = [](int w, int k, size_t i) { return static_cast<float>(static_cast<int>((w + 1) * (k + 2) + i) % 7 - 3); };
  auto run = [&](int threads) {
    RestartShards(SmallModel(), 1, 4, LaneOptions(kWorkers, threads));  // 53 floats in 15 chunks
    const size_t n = static_cast<size_t>(layout_.total_elems());
    std::vector<float> init(n);
    for (size_t i = 0; i < n; ++i) init[i] = static_cast<float>(i % 11);
    auto c0 = Client(0);
    EXPECT_TRUE(c0->Wait(c0->PushInit(init), 5000ms).ok());
    std::vector<std::thread> workers;
    for (int w = 0; w < kWorkers; ++w) {
      workers.emplace_back([&, w] {
        auto c = Client(w);
        for (int k = 0; k < kPushes; ++k) {
          std::vector<float> g(n);
          for (size_t i = 0; i < n; ++i) g[i] = grad(w, k, i);
          EXPECT_TRUE(c->Wait(c->Push(g, k), 5000ms).ok());
        }
      });
    }
    for (auto& t : workers) t.join();
    std::vector<float> want = init;
    for (int w = 0; w < kWorkers; ++w) {
      for (int k = 0; k < kPushes; ++k) {
        for (size_t i = 0; i < n; ++i) {
          const float lr_mult = i >= 30 && i < 36 ? 2.0f : 1.0f;  // tensor b
          want[i] -= lr_mult * grad(w, k, i);
        }
      }
    }
    for (const Chunk& c : layout_.chunks()) EXPECT_EQ(shards_[0]->ChunkVersion(c.id), kWorkers * kPushes);
    return PullExpectAndStop(*c0, kPushes, want, threads);
  };
  ExpectOneLaneEqualsFour(run);
}

// Sync: each clock's gradients are summed where the chunk's updates run (its lane) and the mean
// applied once all eight have pushed; with integer gradients the mean is exact (a sum over 8),
// so the weights must be the closed form, and those of one lane, byte for byte.
TEST_F(ShardFixture, SyncSumsOnTheLanesGiveTheWeightsOfSerialApply) {
  constexpr int kWorkers = 8, kClocks = 6;
  auto grad = [](int w, int k, size_t i) { return static_cast<float>(static_cast<int>((w + 3) * (k + 1) + i) % 9 - 4); };
  auto run = [&](int threads) {
    ShardOptions o = LaneOptions(kWorkers, threads);
    o.consistency.mode = ConsistencyMode::kSync;
    RestartShards(SmallModel(), 1, 4, o);
    const size_t n = static_cast<size_t>(layout_.total_elems());
    auto c0 = Client(0);
    EXPECT_TRUE(c0->Wait(c0->PushInit(std::vector<float>(n, 1.0f)), 5000ms).ok());
    std::vector<std::thread> workers;
    for (int w = 0; w < kWorkers; ++w) {
      workers.emplace_back([&, w] {
        auto c = Client(w);
        std::vector<float> g(n), mine(n);
        for (int k = 0; k < kClocks; ++k) {
          for (size_t i = 0; i < n; ++i) g[i] = grad(w, k, i);
          EXPECT_TRUE(c->Wait(c->Push(g, k), 5000ms).ok());
          EXPECT_TRUE(c->Wait(c->Pull(mine, k + 1), 5000ms).ok());  // held until the clock is applied
        }
      });
    }
    for (auto& t : workers) t.join();
    std::vector<float> want(n, 1.0f);
    for (int k = 0; k < kClocks; ++k) {
      for (size_t i = 0; i < n; ++i) {
        float sum = 0;
        for (int w = 0; w < kWorkers; ++w) sum += grad(w, k, i);
        const float lr_mult = i >= 30 && i < 36 ? 2.0f : 1.0f;  // tensor b
        want[i] -= lr_mult * (sum / kWorkers);
      }
    }
    return PullExpectAndStop(*c0, kClocks, want, threads);
  };
  ExpectOneLaneEqualsFour(run);
}

// Pulls served while four workers push into the same chunks on three lanes: every pulled chunk
// is one version of that chunk, never part of one update and part of another. Each push
// subtracts the same integer from every float of a chunk (lr 1, gradient all ones), so a chunk
// read whole is uniform; a torn read would mix two values. Chunks of 64Ki floats, so an update
// takes long enough to be caught in the middle.
TEST_F(ShardFixture, NoPullIsTornWhileOtherWorkersApply) {
  ShardOptions o = PlainSgd();
  o.cluster.workers = 5;
  o.cluster.server_threads = 3;
  StartShards({{"a", {4, 65536}, 1.0f, 1.0f}}, 1, 65536, o);
  const size_t n = static_cast<size_t>(layout_.total_elems());
  auto reader = Client(4);
  ASSERT_TRUE(reader->Wait(reader->PushInit(std::vector<float>(n, 0.0f)), 5000ms).ok());
  std::atomic<bool> done{false};
  std::vector<std::thread> pushers;
  for (int w = 0; w < 4; ++w) {
    pushers.emplace_back([&, w] {
      auto c = Client(w);
      const std::vector<float> g(n, 1.0f);
      for (int k = 0; k < 40; ++k) EXPECT_TRUE(c->Wait(c->Push(g, k), 5000ms).ok());
    });
  }
  std::thread closer([&] {
    for (auto& t : pushers) t.join();
    done = true;
  });
  int pulls = 0, torn = 0;
  std::vector<float> w(n);
  while (!done.load() || pulls == 0) {
    ASSERT_TRUE(reader->Wait(reader->Pull(w, 0), 5000ms).ok());
    ++pulls;
    for (const Chunk& c : layout_.chunks()) {
      const float* x = w.data() + c.flat_offset;
      if (std::any_of(x, x + c.count, [&](float v) { return v != x[0]; })) ++torn;
    }
  }
  closer.join();
  EXPECT_EQ(torn, 0) << "of " << pulls << " pulls";
  ASSERT_TRUE(reader->Wait(reader->Pull(w, 0), 5000ms).ok());
  EXPECT_EQ(w, std::vector<float>(n, -160.0f));  // 4 workers × 40 pushes
}

// An update rule whose updates of one chunk wait for a gate: while the lane that owns that chunk
// waits, the loop still takes messages and a pull of a chunk on another lane is answered.
class GatedRule final : public UpdateRule {
 public:
  std::string_view name() const override { return "momentum"; }
  void Apply(const UpdateParams& p, std::span<const float> grad, std::span<float> w,
             std::span<float> state) const override {
    if (grad[0] == 7.0f) {  // the gated chunk's gradient
      std::unique_lock<std::mutex> lock(mu_);
      entered_ = true;
      cv_.notify_all();
      cv_.wait(lock, [&] { return open_; });
    }
    SgdUpdate(p, grad, w, state);
  }
  void WaitEntered() const {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return entered_; });
  }
  void Open() const {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    cv_.notify_all();
  }

 private:
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  mutable bool entered_ = false, open_ = false;
};

TEST_F(ShardFixture, APullIsServedWhileAnotherChunkApplies) {
  auto rule = std::make_shared<GatedRule>();
  ShardOptions o = PlainSgd();
  o.cluster.server_threads = 2;
  o.update_rule = rule;
  StartShards({{"a", {8}, 1.0f, 1.0f}}, 1, 4, o);  // chunks 0 and 1, one per lane
  auto c = Client(0);
  ASSERT_TRUE(c->Wait(c->PushInit(std::vector<float>(8, 10.0f)), 5000ms).ok());
  const std::vector<float> g{7, 7, 7, 7, 1, 1, 1, 1};
  const RequestId push = c->Push(g, 0);
  rule->WaitEntered();  // chunk 0's update has begun and waits
  std::vector<float> w(8, 0.0f);
  const std::vector<int32_t> chunk1{1};
  ASSERT_TRUE(c->Wait(c->PullChunks(w, chunk1, 0), 5000ms).ok());
  EXPECT_EQ(w, (std::vector<float>{0, 0, 0, 0, 9, 9, 9, 9}));  // chunk 1, its update done
  ShardStatsWire stats;
  EXPECT_TRUE(c->Stats(0, &stats, 5000ms).ok());  // the loop answers too
  rule->Open();
  ASSERT_TRUE(c->Wait(push, 5000ms).ok());
  ASSERT_TRUE(c->Wait(c->Pull(w, 1), 5000ms).ok());
  EXPECT_EQ(w, (std::vector<float>{3, 3, 3, 3, 9, 9, 9, 9}));
}

// Records the order key of every reply (SendOrdered) and who it was for.
class OrderRecordingEndpoint : public ServerEndpoint {
 public:
  using Log = std::vector<std::pair<PeerId, uint64_t>>;
  OrderRecordingEndpoint(std::unique_ptr<ServerEndpoint> inner, std::mutex* mu, Log* log)
      : inner_(std::move(inner)), mu_(mu), log_(log) {}
  Status Receive(PeerId* from, Frames* frames, std::chrono::milliseconds timeout, PeerInfo* info) override {
    return inner_->Receive(from, frames, timeout, info);
  }
  Status Send(const PeerId& to, Frames frames) override { return SendOrdered(to, std::move(frames), UINT64_MAX); }
  Status SendOrdered(const PeerId& to, Frames frames, uint64_t order) override {
    {
      std::lock_guard<std::mutex> lock(*mu_);
      log_->emplace_back(to, order);
    }
    return inner_->Send(to, std::move(frames));
  }
  std::string address() const override { return inner_->address(); }
  void Wake() override { inner_->Wake(); }

 private:
  std::unique_ptr<ServerEndpoint> inner_;
  std::mutex* mu_;
  Log* log_;
};

// cluster.reply_order = "step": a worker's pull replies of one step share an order key, the time
// its first pull of that step arrived, so an endpoint that orders replies sends one worker's step
// before the next one's. Here: worker 0 pulls at clock 3 (2 messages of 4 chunks), worker 1 at
// clock 3, worker 0 again at clock 3, then at clock 4; acknowledgements carry no key.
TEST_F(ShardFixture, PullRepliesOfOneStepShareTheOrderKeyOfItsFirstPull) {
  std::mutex mu;
  OrderRecordingEndpoint::Log log;
  ShardOptions o;
  o.cluster.workers = 2;
  StartShards(SmallModel(), 1, 8, o, [&](std::unique_ptr<ServerEndpoint> ep) {
    return std::make_unique<OrderRecordingEndpoint>(std::move(ep), &mu, &log);
  });
  auto c0 = Client(0);
  auto c1 = Client(1);
  const size_t n = static_cast<size_t>(layout_.total_elems());
  ASSERT_TRUE(c0->Wait(c0->PushInit(std::vector<float>(n, 1.0f)), 5000ms).ok());
  std::vector<float> w(n);
  auto keys = [&](size_t from) {
    std::lock_guard<std::mutex> lock(mu);
    std::vector<uint64_t> k;
    for (size_t i = from; i < log.size(); ++i) k.push_back(log[i].second);
    return k;
  };
  auto size = [&] {
    std::lock_guard<std::mutex> lock(mu);
    return log.size();
  };
  const size_t start = size();
  EXPECT_EQ(keys(0), std::vector<uint64_t>(start, UINT64_MAX));  // registration and the init push's acks
  ASSERT_TRUE(c0->Wait(c0->Pull(w, 3), 5000ms).ok());
  const std::vector<uint64_t> first = keys(start);
  ASSERT_EQ(first.size(), 2u);  // 8 chunks, 4 a message
  EXPECT_EQ(first[0], first[1]);
  EXPECT_NE(first[0], UINT64_MAX);
  const size_t at1 = size();
  ASSERT_TRUE(c1->Wait(c1->Pull(w, 3), 5000ms).ok());
  const std::vector<uint64_t> other = keys(at1);
  ASSERT_EQ(other.size(), 2u);
  EXPECT_GT(other[0], first[0]) << "worker 1's step asked later: a later key";
  const size_t at2 = size();
  ASSERT_TRUE(c0->Wait(c0->Pull(w, 3), 5000ms).ok());
  EXPECT_EQ(keys(at2), std::vector<uint64_t>(2, first[0])) << "the same step keeps its first pull's key";
  const size_t at3 = size();
  ASSERT_TRUE(c0->Wait(c0->Pull(w, 4), 5000ms).ok());
  const std::vector<uint64_t> next = keys(at3);
  ASSERT_EQ(next.size(), 2u);
  EXPECT_GT(next[0], other[0]) << "a new step: the key of its own first pull";
  const size_t at4 = size();
  ASSERT_TRUE(c0->Wait(c0->Push(std::vector<float>(n, 0.5f), 4), 5000ms).ok());
  EXPECT_EQ(keys(at4), std::vector<uint64_t>(2, UINT64_MAX)) << "acknowledgements carry no key";
}

// cluster.server_threads: a shard spreads a chunk's update, a push's finite check and a pull's
// fp16 conversion over threads, in blocks of 64Ki floats. Chunks of 300,000 floats (5 blocks, the
// last one short) on 1, 3 and 4 threads: after several pushes the weights equal SgdUpdate over
// each tensor whole, bit for bit; fp16 pulls are the weights rounded to half; an Inf in the last
// block of a push is refused and applies nothing.
class ServerThreads : public ShardFixture, public ::testing::WithParamInterface<int> {};

TEST_P(ServerThreads, SameFloatsAtAnyCountAndANonFiniteLastBlockIsRefused) {
  ShardOptions o;
  o.solver.base_lr = 0.05f;
  o.solver.momentum = 0.9f;
  o.solver.weight_decay = 0.01f;
  o.cluster.server_threads = GetParam();
  o.cluster.workers = 2;  // worker 1 pulls in fp16
  StartShards({{"w", {600, 1000}, 1.0f, 1.0f}, {"b", {600}, 2.0f, 0.0f}}, 1, 300000, o);
  ASSERT_EQ(layout_.chunks().size(), 3u);
  auto client = Client(0);
  const size_t n = static_cast<size_t>(layout_.total_elems());
  std::vector<float> ref = Iota(n, -1.0f, 3e-6f), hist(n, 0.0f);
  ASSERT_TRUE(client->Wait(client->PushInit(ref), 5000ms).ok());
  std::mt19937 rng(5);
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (int step = 0; step < 4; ++step) {
    std::vector<float> g(n);
    for (float& x : g) x = d(rng);
    ASSERT_TRUE(client->Wait(client->Push(g, step), 5000ms).ok());
    ReferenceUpdate(o.solver, step, g, &ref, &hist);
  }
  const std::vector<float> w = AllWeights();
  ASSERT_EQ(w.size(), n);
  EXPECT_EQ(std::memcmp(w.data(), ref.data(), n * 4), 0) << GetParam() << " threads";

  PsClientOptions half;
  half.server_addresses = addresses_;
  half.worker_id = 1;
  half.reply_timeout = 10000ms;
  half.compression.pull = WireCodec::kFp16;
  std::unique_ptr<PsClient> reader;
  ASSERT_TRUE(PsClient::Create(&transport_, layout_, half, &reader).ok());
  ASSERT_TRUE(reader->Connect(5000ms).ok());
  std::vector<float> pulled(n);
  ASSERT_TRUE(reader->Wait(reader->Pull(pulled), 5000ms).ok());
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(pulled[i], HalfToFloat(FloatToHalf(ref[i]))) << "element " << i;

  const int32_t chunk = layout_.ServerChunks(0)[0];
  const auto count = static_cast<size_t>(layout_.chunk(chunk).count);
  std::vector<float> bad(count, 0.5f);
  bad[count - 1] = INFINITY;  // the last, short block
  auto peer = Raw(0, 0);
  Frames f;
  f.push_back(Frame::Copy(bad.data(), count * 4));
  peer->Send(DensePush(chunk, 4, count, 77), std::move(f));
  const MessageHeader r = peer->Receive();
  EXPECT_EQ(r.type, MsgType::kError);
  EXPECT_NE(r.error_text.find("NaN or Inf"), std::string::npos) << r.error_text;
  EXPECT_EQ(shards_[0]->Stats().rejected_by_reason[static_cast<size_t>(RejectReason::kNonFinite)], 1u);
  const std::vector<float> after = AllWeights();
  EXPECT_EQ(std::memcmp(after.data(), ref.data(), n * 4), 0) << "the refused push changed weights";
}

INSTANTIATE_TEST_SUITE_P(Counts, ServerThreads, ::testing::Values(1, 3, 4));

TEST_F(ShardFixture, AsyncWorkersThreadsExactSum) {
  ShardOptions o = PlainSgd();
  o.cluster.workers = 4;
  std::vector<TensorSpec> specs = {{"a", {1000}, 1, 1}, {"b", {333}, 1, 1}};
  StartShards(specs, 2, 128, o);
  const size_t n = static_cast<size_t>(layout_.total_elems());
  {
    auto c0 = Client(0);
    std::vector<float> init(n, 1024.0f);
    ASSERT_TRUE(c0->Wait(c0->PushInit(init), 5000ms).ok());
  }
  constexpr int kWorkers = 4, kSteps = 20;
  std::vector<std::thread> threads;
  for (int w = 0; w < kWorkers; ++w) {
    threads.emplace_back([&, w] {
      auto c = Client(w);
      std::vector<float> weights(n), g(n);
      for (int step = 0; step < kSteps; ++step) {
        EXPECT_TRUE(c->Wait(c->Pull(weights), 5000ms).ok());
        // Integer gradients: every order of addition gives the same float.
        for (size_t i = 0; i < n; ++i) g[i] = static_cast<float>((w + 1) * ((i + step) % 3));
        EXPECT_TRUE(c->Wait(c->Push(g, step), 5000ms).ok());
      }
    });
  }
  for (auto& t : threads) t.join();
  std::vector<float> expect(n, 1024.0f);
  for (int w = 0; w < kWorkers; ++w)
    for (int step = 0; step < kSteps; ++step)
      for (size_t i = 0; i < n; ++i) expect[i] -= static_cast<float>((w + 1) * ((i + step) % 3));
  EXPECT_EQ(AllWeights(), expect);
  uint64_t received = 0, applied = 0;
  for (auto& s : shards_) {
    ShardStatsWire st = s->Stats();
    received += st.pushes_received;
    applied += st.pushes_applied;
    EXPECT_EQ(st.pushes_rejected, 0u);
  }
  // Every push to a server travels as ceil(its chunks / max_chunks_per_message) messages; each
  // message is counted once. + the init push.
  uint64_t messages_per_push = 0;
  for (int s = 0; s < 2; ++s) messages_per_push += (layout_.ServerChunks(s).size() + 3) / 4;
  EXPECT_EQ(received, messages_per_push * (1 + kWorkers * kSteps));
  EXPECT_EQ(applied, received);
  for (const Chunk& c : layout_.chunks()) {
    EXPECT_EQ(shards_[static_cast<size_t>(c.server)]->ChunkVersion(c.id), kWorkers * kSteps);
  }
}

// --- Bad input: each gets an error reply, is counted, and leaves the weights byte-identical. ---

class BadInput : public ShardFixture {
 protected:
  void SetUp() override {
    ShardOptions o;
    o.solver.base_lr = 1.0f;
    o.solver.momentum = 0.0f;
    o.solver.weight_decay = 0.0f;
    StartShards(SmallModel(), 2, 8, o);
    client_ = Client(0);
    std::vector<float> w0 = Iota(static_cast<size_t>(layout_.total_elems()), 0.5f, 0.25f);
    ASSERT_TRUE(client_->Wait(client_->PushInit(w0), 5000ms).ok());
    before_ = AllWeights();
    peer_ = Raw(0, 0);
    chunk_ = layout_.ServerChunks(0)[0];
    grad_.assign(static_cast<size_t>(layout_.chunk(chunk_).count), 1.0f);
  }
  // A valid push of chunk_ from worker 0 to server 0; tests break one thing.
  MessageHeader GoodPush() const { return DensePush(chunk_, 0, grad_.size(), 99); }
  Frames GradFrames(const std::vector<float>& g) const {
    Frames f;
    f.push_back(Frame::Copy(g.data(), g.size() * 4));
    return f;
  }
  // Expects an error reply counted under `reason`, unchanged weights, and a server that still
  // answers a good pull.
  void ExpectRejected(RejectReason reason, const std::string& text_part) {
    MessageHeader r = peer_->Receive();
    EXPECT_EQ(r.type, MsgType::kError);
    EXPECT_NE(r.error_text.find(text_part), std::string::npos) << r.error_text;
    ShardStatsWire st = shards_[0]->Stats();
    EXPECT_EQ(st.rejected_by_reason[static_cast<size_t>(reason)], 1u) << RejectReasonName(reason);
    std::vector<float> now = AllWeights();
    ASSERT_EQ(now.size(), before_.size());
    EXPECT_EQ(std::memcmp(now.data(), before_.data(), now.size() * 4), 0) << "weights changed";
    std::vector<float> pulled(before_.size());
    EXPECT_TRUE(client_->Wait(client_->Pull(pulled), 5000ms).ok());
    EXPECT_EQ(pulled, before_);
  }

  std::unique_ptr<PsClient> client_;
  std::unique_ptr<RawPeer> peer_;
  std::vector<float> before_;
  std::vector<float> grad_;
  int32_t chunk_ = 0;
};

TEST_F(BadInput, GarbageFrame) {
  Frames f;
  f.push_back(Frame::Copy(std::string("this is not a capnp header!!")));
  peer_->SendFrames(std::move(f));
  ExpectRejected(RejectReason::kUndecodable, "header");
  EXPECT_EQ(shards_[0]->Stats().undecodable, 1u);
}

TEST_F(BadInput, TruncatedHeader) {
  std::string bytes;
  ASSERT_TRUE(EncodeHeader(GoodPush(), &bytes).ok());
  Frames f;
  f.push_back(Frame::Copy(bytes.data(), bytes.size() - 16));
  f.push_back(Frame::Copy(grad_.data(), grad_.size() * 4));
  peer_->SendFrames(std::move(f));
  ExpectRejected(RejectReason::kUndecodable, "header");
}

TEST_F(BadInput, PayloadLengthDisagreesWithHeader) {
  std::vector<float> shorter(grad_.begin(), grad_.end() - 1);
  peer_->Send(GoodPush(), GradFrames(shorter));
  ExpectRejected(RejectReason::kByteLength, "bytes");
}

TEST_F(BadInput, UnknownChunkId) {
  MessageHeader h = GoodPush();
  h.chunk_ids = {100000};
  peer_->Send(h, GradFrames(grad_));
  ExpectRejected(RejectReason::kUnknownChunk, "100000");
}

TEST_F(BadInput, ChunkOwnedByAnotherServer) {
  MessageHeader h = GoodPush();
  const int32_t other = layout_.ServerChunks(1)[0];
  h.chunk_ids = {static_cast<uint32_t>(other)};
  h.elem_counts = {static_cast<uint64_t>(layout_.chunk(other).count)};
  h.byte_lengths = {static_cast<uint64_t>(layout_.chunk(other).count * 4)};
  peer_->Send(h, GradFrames(std::vector<float>(static_cast<size_t>(layout_.chunk(other).count), 1.0f)));
  ExpectRejected(RejectReason::kUnknownChunk, "belongs to server 1");
}

// f16 is taken since issue 14 (common/grad_codec.h): an f16 header over f32-sized frames is a
// length mismatch; an encoding the server does not decode (sufficient factors, for now) is kDType.
TEST_F(BadInput, DTypeMismatch) {
  MessageHeader h = GoodPush();
  h.dtype = DType::kF16;
  peer_->Send(h, GradFrames(grad_));
  ExpectRejected(RejectReason::kByteLength, "dense f16 frame has");
}

TEST_F(BadInput, EncodingNotTaken) {
  MessageHeader h = GoodPush();
  h.encoding = Encoding::kFactors;
  peer_->Send(h, GradFrames(grad_));
  ExpectRejected(RejectReason::kDType, "sufficient factors");
}

TEST_F(BadInput, ElementCountMismatch) {
  MessageHeader h = GoodPush();
  h.elem_counts = {grad_.size() + 1};
  peer_->Send(h, GradFrames(grad_));
  ExpectRejected(RejectReason::kElemCount, "elements");
}

TEST_F(BadInput, NaNGradient) {
  std::vector<float> g = grad_;
  g[g.size() / 2] = std::nanf("");
  peer_->Send(GoodPush(), GradFrames(g));
  ExpectRejected(RejectReason::kNonFinite, "NaN");
}

TEST_F(BadInput, InfGradientInSecondChunkAppliesNothing) {
  // Two chunks; the second is bad: the first must not be applied either (no partial update).
  auto ids = layout_.ServerChunks(0);
  ASSERT_GE(ids.size(), 2u);
  MessageHeader h = GoodPush();
  h.chunk_ids = {static_cast<uint32_t>(ids[0]), static_cast<uint32_t>(ids[1])};
  h.versions = {0, 0};
  const size_t n1 = static_cast<size_t>(layout_.chunk(ids[1]).count);
  h.elem_counts = {grad_.size(), n1};
  h.byte_lengths = {grad_.size() * 4, n1 * 4};
  std::vector<float> g2(n1, 1.0f);
  g2[0] = INFINITY;
  Frames f = GradFrames(grad_);
  f.push_back(Frame::Copy(g2.data(), n1 * 4));
  peer_->Send(h, std::move(f));
  ExpectRejected(RejectReason::kNonFinite, "NaN or Inf");
}

TEST_F(BadInput, WrongLayoutHash) {
  MessageHeader h = GoodPush();
  h.layout_hash ^= 1;
  peer_->Send(h, GradFrames(grad_));
  ExpectRejected(RejectReason::kLayoutHash, "layout hash");
}

TEST_F(BadInput, UnregisteredSender) {
  MessageHeader h = GoodPush();
  h.sender = 7;  // the peer registered as worker 0
  peer_->Send(h, GradFrames(grad_));
  ExpectRejected(RejectReason::kNotRegistered, "not registered");
}

TEST_F(BadInput, FrameCountMismatch) {
  Frames f = GradFrames(grad_);
  f.push_back(Frame::Copy(grad_.data(), 4));
  peer_->Send(GoodPush(), std::move(f));
  ExpectRejected(RejectReason::kFrameCount, "payload frames");
}

TEST_F(BadInput, ChecksumMismatch) {
  MessageHeader h = GoodPush();
  h.checksums = {Crc32c(grad_.data(), grad_.size() * 4) ^ 1u};
  peer_->Send(h, GradFrames(grad_));
  ExpectRejected(RejectReason::kChecksum, "CRC");
}

TEST_F(BadInput, VersionAheadOfTheChunkIsRefused) {
  MessageHeader h = GoodPush();
  h.versions = {1};  // the chunk is at version 0
  peer_->Send(h, GradFrames(grad_));
  ExpectRejected(RejectReason::kVersion, "version 1");
}

TEST_F(BadInput, NegativeVersionIsRefused) {
  MessageHeader h = GoodPush();
  h.versions = {std::numeric_limits<int64_t>::min()};  // would overflow version - version_from
  peer_->Send(h, GradFrames(grad_));
  ExpectRejected(RejectReason::kVersion, "valid: 0..0");
}

TEST_F(BadInput, EveryReplyCarriesTheIncarnationErrorsIncluded) {
  const uint64_t inc = shards_[0]->incarnation();
  EXPECT_NE(inc, 0u);
  MessageHeader h = GoodPush();
  h.versions = {5};
  peer_->Send(h, GradFrames(grad_));
  MessageHeader r = peer_->Receive();
  EXPECT_EQ(r.type, MsgType::kError);
  EXPECT_EQ(r.incarnation, inc);
  MessageHeader hb;
  hb.type = MsgType::kHeartbeat;
  peer_->Send(hb);
  r = peer_->Receive();
  EXPECT_EQ(r.type, MsgType::kHeartbeat);
  EXPECT_EQ(r.incarnation, inc);
  MessageHeader reg;
  reg.type = MsgType::kRegister;
  reg.sender = 0;
  reg.layout_hash = layout_.hash();
  peer_->Send(reg);
  r = peer_->Receive();
  EXPECT_EQ(r.type, MsgType::kRegisterReply);
  EXPECT_EQ(r.incarnation, inc);
  peer_->Send(GoodPush(), GradFrames(grad_));
  r = peer_->Receive();
  EXPECT_EQ(r.type, MsgType::kAck);
  EXPECT_EQ(r.incarnation, inc);
  // Another ShardServer (a restarted process) has another incarnation.
  std::unique_ptr<ShardServer> other;
  ASSERT_TRUE(ShardServer::Create(layout_, ShardOptions{}, &other).ok());
  EXPECT_NE(other->incarnation(), 0u);
  EXPECT_NE(other->incarnation(), inc);
}

TEST_F(BadInput, WorkerIdOutsideMaxWorkersIsRefusedAtRegister) {
  auto p = std::make_unique<RawPeer>(&transport_, addresses_[0]);
  MessageHeader h;
  h.type = MsgType::kRegister;
  h.sender = 1;  // expected_workers = max_workers = 1
  h.layout_hash = layout_.hash();
  p->Send(h);
  MessageHeader r = p->Receive();
  EXPECT_EQ(r.type, MsgType::kError);
  EXPECT_EQ(r.flags, static_cast<uint32_t>(RejectReason::kNotRegistered));
  EXPECT_NE(r.error_text.find("outside 0..0"), std::string::npos) << r.error_text;
}

TEST_F(BadInput, RegistrationsPerWorkerAreBoundedOldestDropped) {
  // peer_ registered first as worker 0; kPeersPerWorker more registrations push it out.
  std::vector<std::unique_ptr<RawPeer>> more;
  for (int i = 0; i < ShardServer::kPeersPerWorker; ++i) more.push_back(Raw(0, 0));
  peer_->Send(GoodPush(), GradFrames(grad_));
  MessageHeader r = peer_->Receive();
  EXPECT_EQ(r.type, MsgType::kError);
  EXPECT_EQ(r.flags, static_cast<uint32_t>(RejectReason::kNotRegistered));
  more.back()->Send(GoodPush(), GradFrames(grad_));
  EXPECT_EQ(more.back()->Receive().type, MsgType::kAck);
}

TEST_F(BadInput, RegisterWithWrongLayoutHashNamesBothHashes) {
  RawPeer p(&transport_, addresses_[0]);
  MessageHeader h;
  h.type = MsgType::kRegister;
  h.sender = 3;
  h.layout_hash = 0x1234;
  p.Send(h);
  MessageHeader r = p.Receive();
  ASSERT_EQ(r.type, MsgType::kError);
  EXPECT_NE(r.error_text.find("0x0000000000001234"), std::string::npos) << r.error_text;
  EXPECT_NE(r.error_text.find(fmt::format("{:#018x}", layout_.hash())), std::string::npos) << r.error_text;
}

// --- Consistency policies. ---

TEST_F(ShardFixture, SyncAveragesLiveWorkersAndPullWaitsForTheClock) {
  ShardOptions o = PlainSgd();
  o.consistency.mode = ConsistencyMode::kSync;
  o.cluster.workers = 2;
  StartShards({{"a", {16}, 1, 1}}, 1, 8, o);
  auto c0 = Client(0), c1 = Client(1);
  const size_t n = 16;
  ASSERT_TRUE(c0->Wait(c0->PushInit(std::vector<float>(n, 10.0f)), 5000ms).ok());
  std::vector<float> w(n);
  ASSERT_TRUE(c0->Wait(c0->Pull(w, 0), 5000ms).ok());
  ASSERT_TRUE(c1->Wait(c1->Pull(w, 0), 5000ms).ok());
  ASSERT_TRUE(c0->Wait(c0->Push(std::vector<float>(n, 2.0f), 0), 5000ms).ok());
  // Worker 0's pull for clock 1 must wait for worker 1's clock-0 gradient.
  RequestId r = c0->Pull(w, 1);
  EXPECT_EQ(c0->Wait(r, 150ms).code(), StatusCode::kTimeout);
  EXPECT_EQ(shards_[0]->ChunkWeights(0), std::vector<float>(8, 10.0f));  // not applied yet
  ASSERT_TRUE(c1->Wait(c1->Push(std::vector<float>(n, 4.0f), 0), 5000ms).ok());
  ASSERT_TRUE(c0->Wait(r, 5000ms).ok());
  EXPECT_EQ(w, std::vector<float>(n, 7.0f));  // 10 - (2 + 4) / 2
  // A second push for clock 0 (late) is dropped and counted, not applied.
  ASSERT_TRUE(c1->Wait(c1->Push(std::vector<float>(n, 100.0f), 0), 5000ms).ok());
  EXPECT_EQ(shards_[0]->Stats().dropped_late, 1u);
  EXPECT_EQ(shards_[0]->ChunkWeights(0), std::vector<float>(8, 7.0f));
}

TEST_F(ShardFixture, SyncDeadWorkerIsDroppedSoTheClockCompletes) {
  ShardOptions o = PlainSgd();
  o.consistency.mode = ConsistencyMode::kSync;
  o.cluster.workers = 3;
  StartShards({{"a", {8}, 1, 1}}, 1, 8, o);
  auto c0 = Client(0), c1 = Client(1);
  ASSERT_TRUE(c0->Wait(c0->PushInit(std::vector<float>(8, 0.0f)), 5000ms).ok());
  ASSERT_TRUE(c0->Wait(c0->Push(std::vector<float>(8, 1.0f), 0), 5000ms).ok());
  ASSERT_TRUE(c1->Wait(c1->Push(std::vector<float>(8, 3.0f), 0), 5000ms).ok());
  std::vector<float> w(8);
  RequestId r = c0->Pull(w, 1);
  EXPECT_EQ(c0->Wait(r, 150ms).code(), StatusCode::kTimeout);  // worker 2 never pushes
  shards_[0]->MarkWorkerGone(2, /*finished=*/false);
  ASSERT_TRUE(c0->Wait(r, 5000ms).ok());
  EXPECT_EQ(w, std::vector<float>(8, -2.0f));
}

TEST_F(ShardFixture, SyncBackupWorkerAppliesAfterWMinusB) {
  ShardOptions o = PlainSgd();
  o.consistency.mode = ConsistencyMode::kSync;
  o.consistency.backup_workers = 1;
  o.cluster.workers = 3;
  StartShards({{"a", {8}, 1, 1}}, 1, 8, o);
  auto c0 = Client(0), c1 = Client(1), c2 = Client(2);
  ASSERT_TRUE(c0->Wait(c0->PushInit(std::vector<float>(8, 0.0f)), 5000ms).ok());
  ASSERT_TRUE(c0->Wait(c0->Push(std::vector<float>(8, 2.0f), 0), 5000ms).ok());
  ASSERT_TRUE(c1->Wait(c1->Push(std::vector<float>(8, 4.0f), 0), 5000ms).ok());
  std::vector<float> w(8);
  ASSERT_TRUE(c0->Wait(c0->Pull(w, 1), 5000ms).ok());
  EXPECT_EQ(w, std::vector<float>(8, -3.0f));
  ASSERT_TRUE(c2->Wait(c2->Push(std::vector<float>(8, 50.0f), 0), 5000ms).ok());  // the backup: late
  EXPECT_EQ(shards_[0]->Stats().dropped_late, 1u);
  EXPECT_EQ(shards_[0]->ChunkVersion(0), 1);
}

// A sync pipeline group (common/rotation.h): with round members, a round waits for the holders
// of the stage it is in, not for every live worker, and a push of the current round by a worker
// that does not hold the model then is refused and counted, weights unchanged. K = 2 models on
// W = 4 workers, 2 steps per stage: model 0's rounds 0-1 belong to workers {0, 2}, 2-3 to {1, 3}.
TEST_F(ShardFixture, SyncRoundsOfAPipelineGroupWaitForTheStagesHoldersOnly) {
  ShardOptions o = PlainSgd();
  o.consistency.mode = ConsistencyMode::kSync;
  o.cluster.workers = 4;
  o.round_members = [](int32_t worker, int64_t version) {
    return HoldsModel(worker, /*model=*/0, version, /*stage_steps=*/2, /*models=*/2, /*workers=*/4, /*passes=*/1);
  };
  StartShards({{"a", {8}, 1, 1}}, 1, 8, o);
  std::vector<std::unique_ptr<PsClient>> c;
  for (int i = 0; i < 4; ++i) c.push_back(Client(i));
  ASSERT_TRUE(c[0]->Wait(c[0]->PushInit(std::vector<float>(8, 0.0f)), 5000ms).ok());
  const auto push = [&](int worker, float g, int64_t clock) {
    return c[static_cast<size_t>(worker)]->Wait(c[static_cast<size_t>(worker)]->Push(std::vector<float>(8, g), clock),
                                                5000ms);
  };
  // Round 0: workers 0 and 2 (1 and 3 are live but not holders: not waited for).
  ASSERT_TRUE(push(0, 2.0f, 0).ok());
  EXPECT_EQ(shards_[0]->ChunkVersion(0), 0);
  ASSERT_TRUE(push(2, 4.0f, 0).ok());
  EXPECT_EQ(shards_[0]->ChunkVersion(0), 1);
  EXPECT_EQ(shards_[0]->ChunkWeights(0), std::vector<float>(8, -3.0f));  // lr 1 x the average 3
  // Worker 1 holds model 1 in stage 0: its push of round 1 is refused, nothing taken.
  const Status refused = push(1, 100.0f, 1);
  EXPECT_FALSE(refused.ok());
  EXPECT_NE(refused.message().find("belongs to other workers"), std::string::npos) << refused.message();
  EXPECT_EQ(shards_[0]->Stats().pushes_rejected, 1u);
  ASSERT_TRUE(push(0, 1.0f, 1).ok());
  ASSERT_TRUE(push(2, 1.0f, 1).ok());
  EXPECT_EQ(shards_[0]->ChunkVersion(0), 2);
  EXPECT_EQ(shards_[0]->ChunkWeights(0), std::vector<float>(8, -4.0f));
  // Stage 1: rounds 2-3 belong to workers 1 and 3; worker 0's push of round 2 is refused.
  EXPECT_FALSE(push(0, 100.0f, 2).ok());
  ASSERT_TRUE(push(1, 6.0f, 2).ok());
  EXPECT_EQ(shards_[0]->ChunkVersion(0), 2);  // waits for worker 3
  ASSERT_TRUE(push(3, 2.0f, 2).ok());
  EXPECT_EQ(shards_[0]->ChunkVersion(0), 3);
  EXPECT_EQ(shards_[0]->ChunkWeights(0), std::vector<float>(8, -8.0f));
  EXPECT_EQ(shards_[0]->Stats().pushes_rejected, 2u);
}

// The lr schedule's iteration is worker batches applied in every mode (common/solver/lr_policy.h):
// after the same four worker gradients, a sync shard (two clocks of two) and an async shard (four
// pushes) are at iteration 4, and both stepped the lr down after the second batch.
TEST_F(ShardFixture, SyncAndAsyncSeeTheSameLrAfterTheSameImages) {
  for (ConsistencyMode mode : {ConsistencyMode::kSync, ConsistencyMode::kAsync}) {
    SCOPED_TRACE(mode == ConsistencyMode::kSync ? "sync" : "async");
    TearDown();
    ShardOptions o;
    o.solver.base_lr = 1.0f;
    o.solver.lr_policy = LrPolicy::kStep;
    o.solver.stepsize = 2;
    o.solver.gamma = 0.5f;
    o.solver.momentum = 0.0f;
    o.solver.weight_decay = 0.0f;
    o.consistency.mode = mode;
    o.cluster.workers = 2;
    RestartShards({{"a", {8}, 1, 1}}, 1, 8, o);
    auto c0 = Client(0), c1 = Client(1);
    ASSERT_TRUE(c0->Wait(c0->PushInit(std::vector<float>(8, 0.0f)), 5000ms).ok());
    const std::vector<float> g(8, 1.0f);
    for (int clock = 0; clock < 2; ++clock) {
      std::vector<float> w(8);
      ASSERT_TRUE(c0->Wait(c0->Pull(w, clock), 5000ms).ok());
      ASSERT_TRUE(c1->Wait(c1->Pull(w, clock), 5000ms).ok());
      ASSERT_TRUE(c0->Wait(c0->Push(g, clock), 5000ms).ok());
      ASSERT_TRUE(c1->Wait(c1->Push(g, clock), 5000ms).ok());
    }
    EXPECT_EQ(shards_[0]->ChunkScheduleIter(0), 4);
    // sync: one update per clock, the average of two: lr 1 at iteration 0, 0.5 at iteration 2.
    // async: four updates at iterations 0, 1, 2, 3: lr 1, 1, 0.5, 0.5.
    const float want = mode == ConsistencyMode::kSync ? -(1.0f + 0.5f) : -(1.0f + 1.0f + 0.5f + 0.5f);
    EXPECT_EQ(shards_[0]->ChunkWeights(0), std::vector<float>(8, want));
    EXPECT_EQ(shards_[0]->ChunkVersion(0), mode == ConsistencyMode::kSync ? 2 : 4);
  }
}

// The iteration advances by worker.push_every per gradient (each averages that many batches),
// and survives a checkpoint.
TEST_F(ShardFixture, ScheduleIterCountsBatchesPerPushAndIsCheckpointed) {
  UsePersistDir();
  ShardOptions o;
  o.solver.base_lr = 0.1f;
  o.worker.push_every = 3;
  StartShards({{"a", {8}, 1, 1}}, 1, 8, o);
  auto c = Client(0);
  ASSERT_TRUE(c->Wait(c->PushInit(std::vector<float>(8, 0.0f)), 5000ms).ok());
  for (int step = 0; step < 2; ++step) ASSERT_TRUE(c->Wait(c->Push(std::vector<float>(8, 1.0f), step), 5000ms).ok());
  EXPECT_EQ(shards_[0]->ChunkScheduleIter(0), 6);
  ASSERT_TRUE(shards_[0]->SaveCheckpoint(ForServer(o, 0).checkpoint_path).ok());
  RecoverReport report;
  auto fresh = KillAndRecover(0, o, &report);
  EXPECT_TRUE(report.checkpoint_loaded);
  EXPECT_EQ(fresh->ChunkScheduleIter(0), 6);
  EXPECT_EQ(fresh->ChunkVersion(0), 2);
}

// Each push's ack carries the staleness the server measured for each of its chunks, the value it
// counts in its stats: the worker sees exactly what the server saw.
TEST_F(ShardFixture, AckCarriesTheStalenessTheServerCounts) {
  ShardOptions o;
  o.solver.base_lr = 0.01f;
  o.cluster.workers = 3;
  StartShards(SmallModel(), 2, 8, o);
  std::vector<std::unique_ptr<PsClient>> c;
  for (int i = 0; i < 3; ++i) c.push_back(Client(i));
  const size_t n = static_cast<size_t>(layout_.total_elems());
  ASSERT_TRUE(c[0]->Wait(c[0]->PushInit(Iota(n, 0.0f, 0.01f)), 5000ms).ok());
  std::mt19937 rng(7);
  std::vector<std::vector<float>> w(3, std::vector<float>(n));
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(c[i]->Wait(c[i]->Pull(w[i], 0), 5000ms).ok());
  int64_t seen_sum = 0, seen_max = 0, seen_chunks = 0;
  std::vector<int64_t> clock(3, 0);
  for (int k = 0; k < 30; ++k) {
    const int i = static_cast<int>(rng() % 3);  // a random worker pushes, then pulls again
    std::vector<int64_t> staleness;
    ASSERT_TRUE(c[i]->Wait(c[i]->Push(Iota(n, 0.1f, 0.001f), clock[i]), 5000ms, &staleness).ok());
    EXPECT_EQ(staleness.size(), static_cast<size_t>(layout_.num_chunks()));
    for (int64_t v : staleness) {
      seen_sum += v;
      seen_max = std::max(seen_max, v);
      ++seen_chunks;
    }
    ++clock[static_cast<size_t>(i)];
    ASSERT_TRUE(c[i]->Wait(c[i]->Pull(w[i], clock[i]), 5000ms).ok());
  }
  uint64_t server_sum = 0, server_max = 0, server_chunks = 0;
  for (auto& s : shards_) {
    const ShardStatsWire st = s->Stats();
    server_sum += st.staleness_sum;
    server_max = std::max(server_max, st.staleness_max);
    for (uint64_t b : st.staleness_histogram) server_chunks += b;
  }
  EXPECT_GT(seen_sum, 0);  // three workers interleaved: some pushes were behind
  EXPECT_EQ(static_cast<uint64_t>(seen_sum), server_sum);
  EXPECT_EQ(static_cast<uint64_t>(seen_max), server_max);
  EXPECT_EQ(static_cast<uint64_t>(seen_chunks), server_chunks);
}

// DC-ASGD against hand-computed values: λ = 0.5. Worker 0's gradient is fresh (w = w0: no
// compensation term); worker 1's is one update behind and is compensated with the weights it
// pulled: g1 + λ g1² (w1 − w0).
TEST_F(ShardFixture, DcAsgdCompensatesAStaleGradientWithTheWeightsThatWorkerPulled) {
  ShardOptions o;
  o.consistency.algorithm = Algorithm::kDcAsgd;
  o.consistency.dc_lambda = 0.5f;
  o.cluster.workers = 3;
  std::unique_ptr<PsClient> c0, c1;
  StartDcAsgd(o, &c0, &c1);
  if (HasFatalFailure()) return;
  const std::vector<float>& w0 = kDcW0;
  const std::vector<float> g0{0.5f, 1.0f, -1.0f, 2.0f}, g1{2.0f, -1.0f, 4.0f, 0.25f};
  ASSERT_TRUE(c0->Wait(c0->Push(g0, 0), 5000ms).ok());
  std::vector<float> w1(4);
  for (size_t i = 0; i < 4; ++i) w1[i] = w0[i] - g0[i];
  EXPECT_EQ(shards_[0]->ChunkWeights(0), w1);
  ASSERT_TRUE(c1->Wait(c1->Push(g1, 0), 5000ms).ok());
  std::vector<float> want(4);
  for (size_t i = 0; i < 4; ++i) want[i] = w1[i] - (g1[i] + 0.5f * g1[i] * g1[i] * (w1[i] - w0[i]));
  // e.g. element 0: w1 = 0.5, g1 = 2: 0.5 - (2 + 0.5·4·(0.5 − 1)) = 0.5 − 1 = −0.5
  EXPECT_FLOAT_EQ(want[0], -0.5f);
  EXPECT_EQ(shards_[0]->ChunkWeights(0), want);
  const ShardStatsWire st = shards_[0]->Stats();
  EXPECT_EQ(st.dc_compensated, 2u);
  EXPECT_EQ(st.dc_uncompensated, 0u);
  // A worker with no pulled copy here (it never pulled from this server, or the server restarted
  // since): its gradient goes as pushed, and is counted.
  auto c2 = Client(2);
  const std::vector<float> before = shards_[0]->ChunkWeights(0);
  ASSERT_TRUE(c2->Wait(c2->Push(g0, 0), 5000ms).ok());
  std::vector<float> plain(4);
  for (size_t i = 0; i < 4; ++i) plain[i] = before[i] - g0[i];
  EXPECT_EQ(shards_[0]->ChunkWeights(0), plain);
  EXPECT_EQ(shards_[0]->Stats().dc_uncompensated, 1u);
  EXPECT_EQ(shards_[0]->Stats().dc_compensated, 2u);
}

// DC-ASGD-a against hand-computed values: as above, with λ = λ0 / sqrt(ms) per element and
// ms ← m·ms + (1 − m)·g² over every pushed gradient (starting at the chunk's first g²): after
// worker 0's fresh g0, ms = g0²; worker 1's stale g1 makes ms = m g0² + (1 − m) g1² and is
// compensated with that λ.
TEST_F(ShardFixture, AdaptiveDcAsgdScalesLambdaByTheRunningMeanSquareOfTheGradient) {
  std::unique_ptr<PsClient> c0, c1;
  StartDcAsgd(AdaptiveDcOptions(), &c0, &c1);
  if (HasFatalFailure()) return;
  const std::vector<float>& w0 = kDcW0;
  const std::vector<float> g0{0.5f, 1.0f, -1.0f, 0.0f}, g1{2.0f, -1.0f, 4.0f, 0.25f};
  ASSERT_TRUE(c0->Wait(c0->Push(g0, 0), 5000ms).ok());
  std::vector<float> w1(4);
  for (size_t i = 0; i < 4; ++i) w1[i] = w0[i] - g0[i];  // fresh: w = w0, no compensation term
  EXPECT_EQ(shards_[0]->ChunkWeights(0), w1);
  ASSERT_TRUE(c1->Wait(c1->Push(g1, 0), 5000ms).ok());
  const std::vector<float> got = shards_[0]->ChunkWeights(0);
  for (size_t i = 0; i < 4; ++i) {
    const double ms = 0.5 * g0[i] * g0[i] + 0.5 * g1[i] * g1[i];
    const double want = w1[i] - (g1[i] + 0.5 / std::sqrt(ms) * g1[i] * g1[i] * (w1[i] - w0[i]));
    EXPECT_NEAR(got[i], want, 1e-5) << i;
  }
  // Element 0 by hand: ms = 0.5·0.25 + 0.5·4 = 2.125, λ = 0.5 / 1.4577 = 0.34300,
  // g' = 2 + 0.343·4·(0.5 − 1) = 1.31401, w = 0.5 − 1.31401 = −0.81401.
  EXPECT_NEAR(got[0], -0.81401f, 1e-4);
  // Element 3: g0 = 0 left ms at 0 until g1 (ms = 0.5 · 0.0625): λ = 0.5 / 0.17678 = 2.8284,
  // and w1 = w0 there, so nothing to compensate: w = 3 − 0.25.
  EXPECT_FLOAT_EQ(got[3], 2.75f);
  EXPECT_EQ(shards_[0]->Stats().dc_compensated, 2u);
}

// DC-ASGD-a's running mean square sets λ for every later push, so a killed server must come back
// with it: the checkpoint holds it (before, a restart began it again from the next gradient's
// g², a λ of another scale), and the log holds each push's raw gradient beside the compensated
// one it applied, so replay rebuilds weights and mean square byte for byte. A checkpoint whose
// mean square has the wrong length is refused naming the tensor, the shard left as it was.
TEST_F(ShardFixture, AdaptiveDcAsgdMeanSquareSurvivesAKillThroughCheckpointAndLog) {
  UsePersistDir();
  const ShardOptions o = AdaptiveDcOptions();
  std::unique_ptr<PsClient> c0, c1;
  StartDcAsgd(o, &c0, &c1);
  if (HasFatalFailure()) return;
  const std::vector<float> g0{0.5f, 1.0f, -1.0f, 0.0f}, g1{2.0f, -1.0f, 4.0f, 0.25f};
  ASSERT_TRUE(c0->Wait(c0->Push(g0, 0), 5000ms).ok());
  ASSERT_TRUE(c1->Wait(c1->Push(g1, 0), 5000ms).ok());
  const std::string path = ForServer(o, 0).checkpoint_path;
  ASSERT_TRUE(shards_[0]->SaveCheckpoint(path).ok());
  const std::vector<float> at_checkpoint = shards_[0]->ChunkRuleState(0);
  EXPECT_EQ(shards_[0]->RuleStateName(), "dc_mean_square");
  ASSERT_EQ(at_checkpoint.size(), 4u);
  EXPECT_FLOAT_EQ(at_checkpoint[0], 2.125f);  // 0.5 · 0.5² + 0.5 · 2²
  // After the checkpoint: in the log only.
  ASSERT_TRUE(c0->Wait(c0->Push(g1, 1), 5000ms).ok());
  RecoverReport rep;
  auto fresh = KillAndRecover(0, o, &rep);
  EXPECT_TRUE(rep.checkpoint_loaded);
  EXPECT_EQ(rep.replayed_pushes, 1u);
  ExpectSameShard(*shards_[0], *fresh, 0);
  const std::vector<float> want = shards_[0]->ChunkRuleState(0), got = fresh->ChunkRuleState(0);
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * 4), 0);
  EXPECT_FLOAT_EQ(want[0], 3.0625f);  // 0.5 · 2.125 + 0.5 · 2²: the replayed push is in it

  TensorFile file;
  ASSERT_TRUE(ReadTensorFile(path, &file).ok());
  for (NamedTensor& t : file.tensors) {
    if (t.name == "chunk0.dc_mean_square") {
      t.data.resize(3);
      t.shape = {3};
    }
  }
  ASSERT_TRUE(WriteTensorFile(path, file).ok());
  std::unique_ptr<ShardServer> other;
  ASSERT_TRUE(ShardServer::Create(layout_, ForServer(o, 0), &other).ok());
  const Status s = other->LoadCheckpoint(path);
  EXPECT_EQ(s.code(), StatusCode::kCorrupt) << s.ToString();
  EXPECT_NE(s.message().find("chunk0.dc_mean_square"), std::string::npos) << s.message();
  EXPECT_TRUE(other->ChunkRuleState(0).empty());
  EXPECT_EQ(other->ChunkVersion(0), 0);
}

// EASGD's center: an elastic exchange adds the worker's α(x − x~) to the weights exactly (no lr,
// momentum or decay), survives a kill through the log, and the two kinds of push never mix: a
// gradient push to an EASGD server and an elastic one to a plain server are refused, weights
// unchanged.
TEST_F(ShardFixture, EasgdCenterAddsTheElasticDifferenceAndRefusesGradients) {
  UsePersistDir();
  ShardOptions o;
  o.solver.base_lr = 0.5f;
  o.solver.momentum = 0.9f;
  o.solver.weight_decay = 0.1f;
  o.consistency.algorithm = Algorithm::kEasgd;
  StartShards({{"a", {4}, 1, 1}}, 1, 4, o);
  auto c = Client(0);
  const std::vector<float> w0{1.0f, -2.0f, 0.5f, 3.0f}, e{0.25f, -0.5f, 0.125f, 1.0f};
  ASSERT_TRUE(c->Wait(c->PushInit(w0), 5000ms).ok());
  std::vector<float> w(4);
  ASSERT_TRUE(c->Wait(c->Pull(w, 0), 5000ms).ok());
  ASSERT_TRUE(c->Wait(c->PushElastic(e, 0), 5000ms).ok());
  const std::vector<float> want{1.25f, -2.5f, 0.625f, 4.0f};
  EXPECT_EQ(shards_[0]->ChunkWeights(0), want);
  EXPECT_EQ(shards_[0]->ChunkVersion(0), 1);
  const Status refused = c->Wait(c->Push(e, 1), 5000ms);
  EXPECT_FALSE(refused.ok());
  EXPECT_NE(refused.message().find("\"easgd\" server"), std::string::npos) << refused.message();
  EXPECT_EQ(shards_[0]->ChunkWeights(0), want);
  RecoverReport report;
  auto fresh = KillAndRecover(0, o, &report);
  EXPECT_EQ(report.replayed_pushes, 2u);  // the init and the exchange
  EXPECT_EQ(fresh->ChunkWeights(0), want);
}

TEST_F(ShardFixture, ElasticExchangeToAPlainServerIsRefused) {
  ShardOptions o;
  o.solver.base_lr = 0.5f;
  StartShards({{"a", {4}, 1, 1}}, 1, 4, o);
  auto c = Client(0);
  ASSERT_TRUE(c->Wait(c->PushInit(std::vector<float>(4, 1.0f)), 5000ms).ok());
  const Status s = c->Wait(c->PushElastic(std::vector<float>(4, 0.5f), 0), 5000ms);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("an elastic exchange, but"), std::string::npos) << s.message();
  EXPECT_EQ(shards_[0]->ChunkWeights(0), std::vector<float>(4, 1.0f));
  EXPECT_EQ(shards_[0]->Stats().rejected_by_reason[static_cast<size_t>(RejectReason::kClock)], 1u);
}

// The evaluator (Role::kEvaluator): its pull of a sync shard is served at once while a worker's
// pull for the next clock waits; it carries each chunk's lr-schedule iteration; it is counted as
// an evaluator pull (not in pulls_served, not a DC-ASGD copy); and the evaluator can neither
// push nor clock: weights unchanged.
TEST_F(ShardFixture, EvaluatorSnapshotIsServedAtOnceAndTheEvaluatorCannotWrite) {
  ShardOptions o = PlainSgd();
  o.consistency.mode = ConsistencyMode::kSync;
  o.cluster.workers = 2;
  StartShards({{"a", {16}, 1, 1}}, 2, 8, o);  // one chunk per server
  auto c0 = Client(0), c1 = Client(1);
  const size_t n = 16;
  ASSERT_TRUE(c0->Wait(c0->PushInit(std::vector<float>(n, 10.0f)), 5000ms).ok());
  std::vector<float> w(n);
  ASSERT_TRUE(c0->Wait(c0->Pull(w, 0), 5000ms).ok());
  ASSERT_TRUE(c1->Wait(c1->Pull(w, 0), 5000ms).ok());
  ASSERT_TRUE(c0->Wait(c0->Push(std::vector<float>(n, 2.0f), 0), 5000ms).ok());
  ASSERT_TRUE(c1->Wait(c1->Push(std::vector<float>(n, 4.0f), 0), 5000ms).ok());  // clock 0: 10 - 3
  ASSERT_TRUE(c0->Wait(c0->Push(std::vector<float>(n, 2.0f), 1), 5000ms).ok());  // clock 1: half in
  const RequestId waiting = c0->Pull(w, 2);  // must wait for worker 1's clock-1 gradient
  EXPECT_EQ(c0->Wait(waiting, 100ms).code(), StatusCode::kTimeout);
  const ShardStatsWire before0 = shards_[0]->Stats();

  PsClientOptions eo;
  eo.server_addresses = addresses_;
  eo.role = Role::kEvaluator;
  eo.reply_timeout = 10000ms;
  std::unique_ptr<PsClient> ev;
  ASSERT_TRUE(PsClient::Create(&transport_, layout_, eo, &ev).ok());
  ASSERT_TRUE(ev->Connect(5000ms).ok());
  std::vector<float> snap(n);
  ASSERT_TRUE(ev->Wait(ev->Pull(snap, 0), 1000ms).ok());  // at once, whatever the clock
  EXPECT_EQ(snap, std::vector<float>(n, 7.0f));
  // Sync: one averaged update of two workers' batches is iteration 2 (docs/config.md#solver).
  EXPECT_EQ(ev->last_iters()[0], 2);
  EXPECT_EQ(ev->last_iters()[1], 2);
  EXPECT_EQ(c0->Wait(waiting, 50ms).code(), StatusCode::kTimeout);  // the worker still waits
  const ShardStatsWire after0 = shards_[0]->Stats();
  EXPECT_EQ(after0.evaluator_pulls, 1u);
  EXPECT_EQ(after0.pulls_served, before0.pulls_served);
  // Not a writer: pushes (init ones too) and clocks from the evaluator's connection are refused.
  const std::vector<float> weights = AllWeights();
  auto raw = std::make_unique<RawPeer>(&transport_, addresses_[0]);
  MessageHeader reg;
  reg.type = MsgType::kRegister;
  reg.role = Role::kEvaluator;
  reg.sender = 0;
  reg.layout_hash = layout_.hash();
  raw->Send(reg);
  ASSERT_EQ(raw->Receive().type, MsgType::kRegisterReply);
  for (uint32_t flags : {0u, kFlagInit}) {
    MessageHeader push = reg;
    push.type = MsgType::kPush;
    push.flags = flags;
    push.clock = 1;
    push.chunk_ids = {0};
    push.versions = {shards_[0]->ChunkVersion(0)};
    push.elem_counts = {8};
    push.byte_lengths = {32};
    Frames payload;
    const std::vector<float> g(8, 100.0f);
    payload.push_back(Frame::Copy(g.data(), 32));
    raw->Send(push, std::move(payload));
    const MessageHeader r = raw->Receive();
    EXPECT_EQ(r.type, MsgType::kError);
    EXPECT_NE(r.error_text.find("not registered"), std::string::npos) << r.error_text;
  }
  MessageHeader clock = reg;
  clock.type = MsgType::kClock;
  clock.clock = 1;
  raw->Send(clock);
  EXPECT_EQ(raw->Receive().type, MsgType::kError);
  EXPECT_EQ(AllWeights(), weights);
  // A pull as the evaluator from a connection that did not register as one is refused.
  auto stranger = std::make_unique<RawPeer>(&transport_, addresses_[0]);
  MessageHeader pull = reg;
  pull.type = MsgType::kPull;
  stranger->Send(pull);
  const MessageHeader refused = stranger->Receive();
  EXPECT_EQ(refused.type, MsgType::kError);
  EXPECT_NE(refused.error_text.find("not registered as the evaluator"), std::string::npos) << refused.error_text;
  // The worker's clock completes as usual.
  ASSERT_TRUE(c1->Wait(c1->Push(std::vector<float>(n, 4.0f), 1), 5000ms).ok());
  ASSERT_TRUE(c0->Wait(waiting, 5000ms).ok());
  EXPECT_EQ(w, std::vector<float>(n, 4.0f));
}

TEST_F(ShardFixture, SspPullWaitsForTheSlowestWorker) {
  ShardOptions o = PlainSgd();
  o.consistency.mode = ConsistencyMode::kSsp;
  o.consistency.staleness_bound = 1;
  o.cluster.workers = 2;
  StartShards({{"a", {8}, 1, 1}}, 1, 8, o);
  auto fast = Client(0), slow = Client(1);
  ASSERT_TRUE(fast->Wait(fast->PushInit(std::vector<float>(8, 0.0f)), 5000ms).ok());
  std::vector<float> w(8), g(8, 1.0f);
  // Fast worker: clocks 0 and 1 are within the bound of a slow worker at clock 0.
  ASSERT_TRUE(fast->Wait(fast->Pull(w, 0), 5000ms).ok());
  ASSERT_TRUE(fast->Wait(fast->Push(g, 0), 5000ms).ok());
  ASSERT_TRUE(fast->Wait(fast->Pull(w, 1), 5000ms).ok());
  ASSERT_TRUE(fast->Wait(fast->Push(g, 1), 5000ms).ok());
  RequestId r = fast->Pull(w, 2);  // needs the slow worker to have finished clock 0
  EXPECT_EQ(fast->Wait(r, 150ms).code(), StatusCode::kTimeout);
  ASSERT_TRUE(slow->Wait(slow->Push(g, 0), 5000ms).ok());
  ASSERT_TRUE(fast->Wait(r, 5000ms).ok());
  EXPECT_EQ(w, std::vector<float>(8, -3.0f));
  // Staleness was measured: the slow push came from version 0 while the chunk was at 2.
  ShardStatsWire st = shards_[0]->Stats();
  EXPECT_EQ(st.staleness_max, 2u);
  EXPECT_EQ(st.staleness_histogram[2], 1u);
}

// --- Checkpoints. ---

TEST_F(ShardFixture, CheckpointRoundTripRestoresWeightsHistoryAndVersions) {
  const std::string dir = ::testing::TempDir() + "/shard_ckpt_test";
  std::filesystem::create_directories(dir);
  ShardOptions o;
  o.solver.base_lr = 0.1f;
  o.solver.momentum = 0.9f;
  o.access.run_dir = dir;  // the checkpoint path below comes from the wire
  StartShards(SmallModel(), 2, 8, o);
  auto c = Client(0);
  const size_t n = static_cast<size_t>(layout_.total_elems());
  ASSERT_TRUE(c->Wait(c->PushInit(Iota(n, 1.0f, 0.5f)), 5000ms).ok());
  for (int step = 0; step < 3; ++step) ASSERT_TRUE(c->Wait(c->Push(Iota(n, 0.25f, 0.125f), step), 5000ms).ok());
  const std::string path = dir + "/shard0.dpt";
  ASSERT_TRUE(c->Checkpoint(0, path, 5000ms).ok());
  EXPECT_EQ(shards_[0]->Stats().checkpoints_written, 1u);

  std::unique_ptr<ShardServer> fresh;
  o.server_id = 0;
  ASSERT_TRUE(ShardServer::Create(layout_, o, &fresh).ok());
  ASSERT_TRUE(fresh->LoadCheckpoint(path).ok());
  for (int32_t id : layout_.ServerChunks(0)) {
    EXPECT_EQ(fresh->ChunkWeights(id), shards_[0]->ChunkWeights(id));
    EXPECT_EQ(fresh->ChunkVersion(id), 3);
  }
  // Another server's checkpoint is refused with both identities named.
  std::unique_ptr<ShardServer> other;
  o.server_id = 1;
  ASSERT_TRUE(ShardServer::Create(layout_, o, &other).ok());
  Status s = other->LoadCheckpoint(path);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("server 0"), std::string::npos) << s.message();
}

TEST_F(ShardFixture, PeriodicCheckpointEveryNUpdates) {
  ShardOptions o = PlainSgd();
  const std::string dir = ::testing::TempDir() + "/shard_periodic_test";
  std::filesystem::create_directories(dir);
  o.checkpoint_path = dir + "/shard.dpt";
  o.checkpoint.every_updates = 2;
  StartShards({{"a", {8}, 1, 1}}, 1, 8, o);
  auto c = Client(0);
  ASSERT_TRUE(c->Wait(c->PushInit(std::vector<float>(8, 0.0f)), 5000ms).ok());
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(c->Wait(c->Push(std::vector<float>(8, 1.0f), i), 5000ms).ok());
  EXPECT_EQ(shards_[0]->Stats().checkpoints_written, 2u);  // after updates 2 and 4
  std::unique_ptr<ShardServer> fresh;
  ASSERT_TRUE(ShardServer::Create(layout_, o, &fresh).ok());
  ASSERT_TRUE(fresh->LoadCheckpoint(o.checkpoint_path).ok());
  EXPECT_EQ(fresh->ChunkVersion(0), 4);
  EXPECT_EQ(fresh->ChunkWeights(0), std::vector<float>(8, -4.0f));
}

// --- Who may do what (server/access.h). ---

// One shard (server 0 of 1) with an access policy, a run directory of its own, a legitimate
// worker that has initialised and trained it, and strangers made with ConnectAs.
class ShardAccess : public ShardFixture {
 protected:
  static constexpr const char* kSecret = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

  void Start(bool keyed) {
    run_dir_ = std::filesystem::path(::testing::TempDir()) /
               ("shard_access_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    std::filesystem::remove_all(run_dir_);
    std::filesystem::create_directories(run_dir_);
    ShardOptions o;
    o.solver.base_lr = 1.0f;
    o.solver.momentum = 0.0f;
    o.access.keyed = keyed;
    o.access.run_secret = keyed ? "" : kSecret;
    o.access.run_dir = run_dir_.string();
    StartShards({{"a", {8}, 1, 1}}, 1, 8, o);  // one chunk
    // The legitimate worker: token (no keys) or the worker key.
    auto legit = keyed ? Peer("worker", "127.0.0.5") : Peer("", "127.0.0.5");
    MessageHeader reg = Header(MsgType::kRegister, keyed ? "" : kSecret);
    legit->Send(reg);
    ASSERT_EQ(legit->Receive().type, MsgType::kRegisterReply);
    MessageHeader init = Push(kFlagInit);
    legit->Send(init, Payload(std::vector<float>(8, 2.0f)));
    ASSERT_EQ(legit->Receive().type, MsgType::kAck);
    legit->Send(Push(0), Payload(std::vector<float>(8, 0.5f)));
    ASSERT_EQ(legit->Receive().type, MsgType::kAck);
    legit_ = std::move(legit);
    before_ = AllWeights();
  }

  std::unique_ptr<RawPeer> Peer(const std::string& role, const std::string& address = "127.0.0.66") {
    return std::make_unique<RawPeer>(&transport_, addresses_[0], PeerInfo{role, address});
  }
  MessageHeader Header(MsgType type, const std::string& token = "") const {
    MessageHeader h;
    h.type = type;
    h.sender = 0;
    h.layout_hash = layout_.hash();
    h.role = Role::kWorker;
    h.token = token;
    return h;
  }
  MessageHeader Push(uint32_t flags) const {
    MessageHeader h = Header(MsgType::kPush);
    h.flags = flags;
    h.chunk_ids = {0};
    h.versions = {shards_[0]->ChunkVersion(0)};
    h.elem_counts = {8};
    h.byte_lengths = {32};
    return h;
  }
  static Frames Payload(const std::vector<float>& v) {
    Frames f;
    f.push_back(Frame::Copy(v.data(), v.size() * 4));
    return f;
  }
  // Sends `h` from `peer` and expects an error reply whose text has `part`.
  static void ExpectRefused(RawPeer* peer, const MessageHeader& h, const std::string& part, Frames payload = {}) {
    peer->Send(h, std::move(payload));
    const MessageHeader r = peer->Receive();
    EXPECT_EQ(r.type, MsgType::kError) << MsgTypeName(h.type);
    EXPECT_NE(r.error_text.find(part), std::string::npos) << r.error_text;
  }
  uint64_t Rejected(RejectReason r) const { return shards_[0]->Stats().rejected_by_reason[static_cast<size_t>(r)]; }
  void ExpectNothingChanged() {
    const std::vector<float> now = AllWeights();
    ASSERT_EQ(now.size(), before_.size());
    EXPECT_EQ(std::memcmp(now.data(), before_.data(), now.size() * 4), 0) << "weights changed";
    EXPECT_EQ(shards_[0]->Stats().checkpoints_written, 0u);
    EXPECT_FALSE(shards_[0]->shutdown_requested());
    EXPECT_TRUE(std::filesystem::is_empty(run_dir_)) << "a checkpoint file was written";
  }

  std::filesystem::path run_dir_;
  std::unique_ptr<RawPeer> legit_;
  std::vector<float> before_;
};

TEST_F(ShardAccess, WithoutKeysAStrangerWithoutTheTokenCanDoNothing) {
  Start(/*keyed=*/false);
  const std::string inside = (run_dir_ / "stolen.dpt").string();
  for (const std::string& token :
       std::vector<std::string>{"", "wrong-token", std::string(kSecret).substr(0, 63) + "0"}) {
    SCOPED_TRACE("token '" + token + "'");
    auto stranger = Peer("");
    const std::string why = token.empty() ? "no token" : "wrong token";
    MessageHeader ckpt = Header(MsgType::kCheckpoint, token);
    ckpt.text = inside;
    ExpectRefused(stranger.get(), ckpt, why);
    ExpectRefused(stranger.get(), Header(MsgType::kShutdown, token), why);
    ExpectRefused(stranger.get(), Header(MsgType::kRegister, token), why);
    // Never registered: its push and pull are refused too, with the token or without.
    MessageHeader push = Push(0);
    push.token = token;
    ExpectRefused(stranger.get(), push, "not registered", Payload(std::vector<float>(8, 100.0f)));
    ExpectRefused(stranger.get(), Header(MsgType::kPull, token), "not registered");
  }
  EXPECT_EQ(Rejected(RejectReason::kUnauthorized), 9u);
  EXPECT_EQ(Rejected(RejectReason::kNotRegistered), 6u);
  // Registering as the evaluator needs the secret too.
  for (const std::string token : {"", "wrong-token"}) {
    auto stranger = Peer("");
    MessageHeader reg = Header(MsgType::kRegister, token);
    reg.role = Role::kEvaluator;
    ExpectRefused(stranger.get(), reg, token.empty() ? "no token" : "wrong token");
  }
  EXPECT_EQ(Rejected(RejectReason::kUnauthorized), 11u);
  ExpectNothingChanged();
  // Stats stay open (they change nothing).
  auto observer = Peer("");
  observer->Send(Header(MsgType::kStats));
  EXPECT_EQ(observer->Receive().type, MsgType::kStatsReply);
  // The run's own processes, with the token, may.
  MessageHeader ckpt = Header(MsgType::kCheckpoint, kSecret);
  ckpt.text = inside;
  legit_->Send(ckpt);
  EXPECT_EQ(legit_->Receive().type, MsgType::kAck);
  EXPECT_TRUE(std::filesystem::exists(inside));
  legit_->Send(Header(MsgType::kShutdown, kSecret));
  EXPECT_EQ(legit_->Receive().type, MsgType::kAck);
  EXPECT_TRUE(shards_[0]->shutdown_requested());
}

TEST_F(ShardAccess, WithKeysEachRoleIsBoundToItsKey) {
  Start(/*keyed=*/true);
  const std::string inside = (run_dir_ / "stolen.dpt").string();
  // A valid token means nothing with keys; the key's role decides.
  for (const std::string role : {"", "worker", "server"}) {
    SCOPED_TRACE("key '" + role + "'");
    auto p = Peer(role);
    MessageHeader ckpt = Header(MsgType::kCheckpoint, kSecret);
    ckpt.text = inside;
    ExpectRefused(p.get(), ckpt, "needs the 'admin' key");
    ExpectRefused(p.get(), Header(MsgType::kShutdown, kSecret), "needs the 'admin' key");
  }
  for (const std::string role : {"", "server", "admin"}) {
    SCOPED_TRACE("key '" + role + "'");
    auto p = Peer(role);
    ExpectRefused(p.get(), Header(MsgType::kRegister, kSecret), "needs the 'worker' key");
    ExpectRefused(p.get(), Push(0), "needs the 'worker' key", Payload(std::vector<float>(8, 100.0f)));
    ExpectRefused(p.get(), Header(MsgType::kPull), "needs the 'worker' key");
    ExpectRefused(p.get(), Header(MsgType::kClock), "needs the 'worker' key");
  }
  EXPECT_EQ(Rejected(RejectReason::kUnauthorized), 6u + 12u);
  // The evaluator registers with the worker key only.
  for (const std::string role : {"", "server", "admin"}) {
    SCOPED_TRACE("evaluator with key '" + role + "'");
    auto p = Peer(role);
    MessageHeader reg = Header(MsgType::kRegister, kSecret);
    reg.role = Role::kEvaluator;
    ExpectRefused(p.get(), reg, "needs the 'worker' key");
  }
  {
    auto evaluator = Peer("worker", "127.0.0.7");
    MessageHeader reg = Header(MsgType::kRegister);
    reg.role = Role::kEvaluator;
    evaluator->Send(reg);
    EXPECT_EQ(evaluator->Receive().type, MsgType::kRegisterReply);
  }
  EXPECT_EQ(Rejected(RejectReason::kUnauthorized), 6u + 12u + 3u);
  // A worker key on a connection that did not register the id: refused as unregistered.
  auto other_worker = Peer("worker");
  ExpectRefused(other_worker.get(), Push(0), "not registered", Payload(std::vector<float>(8, 100.0f)));
  ExpectNothingChanged();
  // The admin key may checkpoint (inside the run directory) and shut down.
  auto admin = Peer("admin", "127.0.0.2");
  MessageHeader ckpt = Header(MsgType::kCheckpoint);
  ckpt.text = inside;
  admin->Send(ckpt);
  EXPECT_EQ(admin->Receive().type, MsgType::kAck);
  EXPECT_TRUE(std::filesystem::exists(inside));
  // The legitimate worker keeps working.
  legit_->Send(Push(0), Payload(std::vector<float>(8, 0.5f)));
  EXPECT_EQ(legit_->Receive().type, MsgType::kAck);
  admin->Send(Header(MsgType::kShutdown));
  EXPECT_EQ(admin->Receive().type, MsgType::kAck);
  EXPECT_TRUE(shards_[0]->shutdown_requested());
}

TEST_F(ShardAccess, CheckpointPathFromTheWireMustStayInsideTheRunDirectory) {
  Start(/*keyed=*/true);
  auto admin = Peer("admin");
  const std::filesystem::path outside = run_dir_.parent_path() / (run_dir_.filename().string() + "_outside");
  std::filesystem::remove_all(outside);
  std::filesystem::create_directories(outside);
  std::filesystem::create_directory_symlink(outside, run_dir_ / "link");
  const std::vector<std::string> escapes = {
      (outside / "abs.dpt").string(),                       // absolute, elsewhere
      "../" + outside.filename().string() + "/dotdot.dpt",  // .. out of the run directory
      "nowhere/../../escape.dpt",                           // .. through a directory that does not exist
      (run_dir_ / ".." / "up.dpt").string(),                // absolute, through ..
      "link/symlink.dpt",                                   // a symlink that leads out
      ".",                                                  // the run directory itself
  };
  for (const std::string& path : escapes) {
    SCOPED_TRACE(path);
    MessageHeader ckpt = Header(MsgType::kCheckpoint);
    ckpt.text = path;
    ExpectRefused(admin.get(), ckpt, "outside the run directory");
  }
  EXPECT_EQ(Rejected(RejectReason::kOutsideRunDir), escapes.size());
  EXPECT_TRUE(std::filesystem::is_empty(outside)) << "a file was written outside the run directory";
  EXPECT_EQ(shards_[0]->Stats().checkpoints_written, 0u);
  // Inside: relative, absolute, and through a symlink that stays inside.
  std::filesystem::create_directories(run_dir_ / "ckpt");
  std::filesystem::create_directory_symlink(run_dir_ / "ckpt", run_dir_ / "inner");
  for (const std::string& path :
       {std::string("ckpt/rel.dpt"), (run_dir_ / "ckpt" / "abs.dpt").string(), std::string("inner/via.dpt")}) {
    SCOPED_TRACE(path);
    MessageHeader ckpt = Header(MsgType::kCheckpoint);
    ckpt.text = path;
    admin->Send(ckpt);
    const MessageHeader r = admin->Receive();
    EXPECT_EQ(r.type, MsgType::kAck) << r.error_text;
  }
  EXPECT_TRUE(std::filesystem::exists(run_dir_ / "ckpt" / "rel.dpt"));
  EXPECT_TRUE(std::filesystem::exists(run_dir_ / "ckpt" / "abs.dpt"));
  EXPECT_TRUE(std::filesystem::exists(run_dir_ / "ckpt" / "via.dpt"));
  EXPECT_EQ(shards_[0]->Stats().checkpoints_written, 3u);
  std::filesystem::remove_all(outside);
}

TEST_F(ShardFixture, WithoutARunDirectoryEveryWirePathIsRefusedButTheServersOwnPathWorks) {
  const std::string dir = ::testing::TempDir() + "/shard_no_run_dir";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  ShardOptions o;
  o.checkpoint_path = dir + "/own.dpt";
  StartShards({{"a", {8}, 1, 1}}, 1, 8, o);
  auto c = Client(0);
  ASSERT_TRUE(c->Wait(c->PushInit(std::vector<float>(8, 1.0f)), 5000ms).ok());
  const Status s = c->Checkpoint(0, dir + "/wire.dpt", 5000ms);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("no run directory"), std::string::npos) << s.message();
  EXPECT_FALSE(std::filesystem::exists(dir + "/wire.dpt"));
  ASSERT_TRUE(c->Checkpoint(0, "", 5000ms).ok());
  EXPECT_TRUE(std::filesystem::exists(o.checkpoint_path));
}

// --- Write-ahead log: recovery, duplicates. ---

// Every worker pushes a different gradient, each step.
std::vector<float> Grad(size_t n, int worker, int step) {
  return Iota(n, 0.01f * static_cast<float>(worker + 1), 0.001f * static_cast<float>(step + 1));
}

TEST_F(ShardFixture, AsyncReplayAfterAKillEqualsTheUninterruptedShardByteForByte) {
  UsePersistDir();
  ShardOptions o;
  o.solver.base_lr = 0.05f;
  o.solver.momentum = 0.9f;
  o.solver.weight_decay = 0.001f;
  o.cluster.workers = 4;
  StartShards(SmallModel(), 2, 8, o);
  const size_t n = static_cast<size_t>(layout_.total_elems());
  std::vector<std::unique_ptr<PsClient>> c;
  for (int w = 0; w < 4; ++w) c.push_back(Client(w));
  ASSERT_TRUE(c[0]->Wait(c[0]->PushInit(Iota(n, -0.5f, 0.01f)), 5000ms).ok());
  std::vector<std::thread> threads;
  for (int w = 0; w < 4; ++w) {
    threads.emplace_back([&, w] {
      std::vector<float> pulled(n);
      for (int step = 0; step < 5; ++step) {
        EXPECT_TRUE(c[static_cast<size_t>(w)]->Wait(c[static_cast<size_t>(w)]->Pull(pulled, step), 5000ms).ok());
        EXPECT_TRUE(c[static_cast<size_t>(w)]->Wait(c[static_cast<size_t>(w)]->Push(Grad(n, w, step), step), 5000ms).ok());
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int s = 0; s < 2; ++s) {
    RecoverReport rep;
    auto fresh = KillAndRecover(s, o, &rep);
    EXPECT_FALSE(rep.checkpoint_loaded);
    EXPECT_FALSE(rep.torn_tail);
    // Each server took 4 workers x 5 steps, in ceil(chunks / 4) messages each, plus the init.
    const uint64_t msgs = (layout_.ServerChunks(s).size() + 3) / 4;
    EXPECT_EQ(rep.replayed_pushes, (20 + 1) * msgs);
    ExpectSameShard(*shards_[static_cast<size_t>(s)], *fresh, s);
    EXPECT_EQ(fresh->Stats().pushes_by_worker, std::vector<uint64_t>(4, 5 * msgs));
    EXPECT_EQ(fresh->Stats().replayed, rep.replayed);
  }
}

TEST_F(ShardFixture, ReplayWithACheckpointMidwayEqualsTheUninterruptedShard) {
  UsePersistDir();
  ShardOptions o;
  o.solver.base_lr = 0.1f;
  o.solver.momentum = 0.9f;
  o.cluster.workers = 2;
  o.checkpoint.every_updates = 3;
  StartShards(SmallModel(), 1, 64, o);
  const size_t n = static_cast<size_t>(layout_.total_elems());
  auto c0 = Client(0), c1 = Client(1);
  ASSERT_TRUE(c0->Wait(c0->PushInit(Iota(n, 1.0f, 0.01f)), 5000ms).ok());
  for (int step = 0; step < 4; ++step) {
    ASSERT_TRUE(c0->Wait(c0->Push(Grad(n, 0, step), step), 5000ms).ok());
    ASSERT_TRUE(c1->Wait(c1->Push(Grad(n, 1, step), step), 5000ms).ok());
  }
  EXPECT_EQ(shards_[0]->Stats().checkpoints_written, 2u);  // after rounds 3 and 6
  RecoverReport rep;
  auto fresh = KillAndRecover(0, o, &rep);
  EXPECT_TRUE(rep.checkpoint_loaded);
  EXPECT_EQ(rep.checkpoint_updates, 6 * static_cast<int64_t>(layout_.ServerChunks(0).size()));
  EXPECT_EQ(rep.replayed_pushes, 2u);  // the two pushes after the second checkpoint
  ExpectSameShard(*shards_[0], *fresh, 0);
  EXPECT_EQ(fresh->Stats().pushes_by_worker, (std::vector<uint64_t>{4, 4}));
}

TEST_F(ShardFixture, SyncReplayRestoresAPartiallyAccumulatedClock) {
  UsePersistDir();
  ShardOptions o = PlainSgd();
  o.consistency.mode = ConsistencyMode::kSync;
  o.cluster.workers = 3;
  StartShards({{"a", {16}, 1, 1}}, 1, 8, o);
  const size_t n = 16;
  auto c0 = Client(0), c1 = Client(1), c2 = Client(2);
  ASSERT_TRUE(c0->Wait(c0->PushInit(std::vector<float>(n, 10.0f)), 5000ms).ok());
  ASSERT_TRUE(c0->Wait(c0->Push(std::vector<float>(n, 1.0f), 0), 5000ms).ok());
  ASSERT_TRUE(c1->Wait(c1->Push(std::vector<float>(n, 2.0f), 0), 5000ms).ok());
  ASSERT_TRUE(c2->Wait(c2->Push(std::vector<float>(n, 3.0f), 0), 5000ms).ok());
  EXPECT_EQ(shards_[0]->ChunkWeights(0), std::vector<float>(8, 8.0f));  // 10 - (1+2+3)/3
  // Clock 1: worker 0's gradient is in the checkpoint's partial sum, worker 1's only in the log.
  ASSERT_TRUE(c0->Wait(c0->Push(std::vector<float>(n, 3.0f), 1), 5000ms).ok());
  ASSERT_TRUE(shards_[0]->SaveCheckpoint(ForServer(o, 0).checkpoint_path).ok());
  ASSERT_TRUE(c1->Wait(c1->Push(std::vector<float>(n, 6.0f), 1), 5000ms).ok());
  EXPECT_EQ(shards_[0]->ChunkWeights(0), std::vector<float>(8, 8.0f));  // clock 1 not complete
  RecoverReport rep;
  auto fresh = KillAndRecover(0, o, &rep);
  EXPECT_TRUE(rep.checkpoint_loaded);
  EXPECT_EQ(rep.replayed_pushes, 1u);
  ExpectSameShard(*shards_[0], *fresh, 0);
  // Worker 2's clock-1 gradient completes the clock on the recovered server: the sum is exact.
  addresses_ = {Serve(std::move(fresh), "recovered")};
  auto r2 = Client(2);
  ASSERT_TRUE(r2->Wait(r2->Push(std::vector<float>(n, 9.0f), 1), 5000ms).ok());
  std::vector<float> w(n);
  ASSERT_TRUE(r2->Wait(r2->Pull(w, 2), 5000ms).ok());
  EXPECT_EQ(w, std::vector<float>(n, 2.0f));  // 8 - (3+6+9)/3
  // A clock-1 push arriving now is late: acknowledged, dropped, counted, not applied.
  auto r0 = Client(0);
  ASSERT_TRUE(r0->Wait(r0->Push(std::vector<float>(n, 3.0f), 1), 5000ms).ok());
  EXPECT_EQ(shards_[1]->Stats().dropped_late, 1u);
  EXPECT_EQ(shards_[1]->ChunkWeights(0), std::vector<float>(8, 2.0f));
}

TEST_F(ShardFixture, SyncElasticWorkerJoinsOnRegisterAndTheJoinSurvivesARestart) {
  UsePersistDir();
  ShardOptions o = PlainSgd();
  o.consistency.mode = ConsistencyMode::kSync;
  o.cluster.workers = 2;
  o.cluster.max_workers = 3;
  StartShards({{"a", {8}, 1, 1}}, 1, 8, o);
  auto c0 = Client(0), c1 = Client(1), c2 = Client(2);  // worker 2 is elastic: it joins on register
  const std::vector<float> g(8, 3.0f);
  ASSERT_TRUE(c0->Wait(c0->PushInit(std::vector<float>(8, 0.0f)), 5000ms).ok());
  ASSERT_TRUE(c0->Wait(c0->Push(g, 0), 5000ms).ok());
  ASSERT_TRUE(c1->Wait(c1->Push(g, 0), 5000ms).ok());
  EXPECT_EQ(shards_[0]->ChunkVersion(0), 0);  // waits for the joiner too
  ASSERT_TRUE(c2->Wait(c2->Push(std::vector<float>(8, 6.0f), 0), 5000ms).ok());
  EXPECT_EQ(shards_[0]->ChunkWeights(0), std::vector<float>(8, -4.0f));  // -(3+3+6)/3
  ASSERT_TRUE(c0->Wait(c0->Push(g, 1), 5000ms).ok());
  RecoverReport rep;
  auto fresh = KillAndRecover(0, o, &rep);
  ExpectSameShard(*shards_[0], *fresh, 0);
  addresses_ = {Serve(std::move(fresh), "elastic")};
  auto r1 = Client(1);
  ASSERT_TRUE(r1->Wait(r1->Push(g, 1), 5000ms).ok());
  EXPECT_EQ(shards_[1]->ChunkVersion(0), 1);  // still 3 live workers after the restart
  shards_[1]->MarkWorkerGone(2, /*finished=*/true);
  std::vector<float> w(8);
  ASSERT_TRUE(r1->Wait(r1->Pull(w, 2), 5000ms).ok());  // the gone joiner no longer counted
  EXPECT_EQ(w, std::vector<float>(8, -7.0f));
}

// (defined below)
void SendPush(RawPeer* p, const ParamLayout& layout, int32_t worker, uint64_t session, uint64_t request_id,
              float value, int64_t version, bool init);

TEST_F(ShardFixture, DeadWorkerRejoinsOnRegisterButAFinishedOneDoesNot) {
  ShardOptions o = PlainSgd();
  o.consistency.mode = ConsistencyMode::kSync;
  o.cluster.workers = 2;
  StartShards({{"a", {8}, 1, 1}}, 1, 8, o);
  auto c0 = Client(0);
  const std::vector<float> g(8, 1.0f);
  std::vector<float> w(8);
  ASSERT_TRUE(c0->Wait(c0->PushInit(std::vector<float>(8, 0.0f)), 5000ms).ok());
  shards_[0]->MarkWorkerGone(1, /*finished=*/false);
  ASSERT_TRUE(c0->Wait(c0->Push(g, 0), 5000ms).ok());
  ASSERT_TRUE(c0->Wait(c0->Pull(w, 1), 5000ms).ok());  // worker 1 dead: clock 0 complete alone
  auto c1 = Client(1);  // a restarted worker 1 registers: waited for again
  ASSERT_TRUE(c0->Wait(c0->Push(g, 1), 5000ms).ok());
  EXPECT_EQ(shards_[0]->ChunkVersion(0), 1);
  ASSERT_TRUE(c1->Wait(c1->Push(g, 1), 5000ms).ok());
  EXPECT_EQ(shards_[0]->ChunkVersion(0), 2);
  // Finished: a later registration of its id (a client reconnecting) does not bring it back.
  shards_[0]->MarkWorkerGone(1, /*finished=*/true);
  ASSERT_TRUE(c0->Wait(c0->Pull(w, 2), 5000ms).ok());  // a served pull: the loop took the report
  auto c1b = Client(1);
  ASSERT_TRUE(c0->Wait(c0->Push(g, 2), 5000ms).ok());
  EXPECT_EQ(shards_[0]->ChunkVersion(0), 3);
}

TEST_F(ShardFixture, StabilityWarningIsLoggedOnceWhenStalenessIsLarge) {
  auto sink = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(1000);
  spdlog::default_logger()->sinks().push_back(sink);
  ShardOptions o;
  o.solver.base_lr = 1e-6f;
  StartShards({{"a", {8}, 1, 1}}, 1, 8, o);
  auto c = Client(0);
  ASSERT_TRUE(c->Wait(c->PushInit(std::vector<float>(8, 0.0f)), 5000ms).ok());
  auto p = Raw(0, 0);
  // Every gradient claims version 0 while the chunk moves on: staleness 0, 1, 2, ...
  for (int i = 0; i < ShardServer::kStalenessWindow + 20; ++i) {
    SendPush(p.get(), layout_, 0, 0, static_cast<uint64_t>(i + 1), 1.0f, 0, false);
    ASSERT_EQ(p->Receive().type, MsgType::kAck);
  }
  spdlog::default_logger()->sinks().pop_back();
  int warnings = 0;
  for (const std::string& line : sink->last_formatted()) {
    if (line.find("consistency.staleness_aware_lr = true") != std::string::npos) ++warnings;
  }
  EXPECT_EQ(warnings, 1);
}

// A push of all of server 0's chunks from a raw peer with a session and request id.
void SendPush(RawPeer* p, const ParamLayout& layout, int32_t worker, uint64_t session, uint64_t request_id,
              float value, int64_t version, bool init) {
  MessageHeader h;
  h.type = MsgType::kPush;
  h.sender = worker;
  h.session = session;
  h.request_id = request_id;
  h.layout_hash = layout.hash();
  h.flags = init ? kFlagInit : 0;
  Frames payload;
  for (int32_t id : layout.ServerChunks(0)) {
    const auto count = static_cast<size_t>(layout.chunk(id).count);
    h.chunk_ids.push_back(static_cast<uint32_t>(id));
    if (!init) h.versions.push_back(version);
    h.elem_counts.push_back(count);
    h.byte_lengths.push_back(count * 4);
    std::vector<float> v(count, value);
    payload.push_back(Frame::Copy(v.data(), count * 4));
  }
  p->Send(h, std::move(payload));
}

TEST_F(ShardFixture, DuplicatePushIsAckedButAppliedOnceAlsoAfterARestart) {
  UsePersistDir();
  ShardOptions o = PlainSgd();
  StartShards({{"a", {8}, 1, 1}}, 1, 8, o);
  auto p = Raw(0, 0);
  const uint64_t session = 0x5E55;
  SendPush(p.get(), layout_, 0, session, 1, 0.0f, 0, /*init=*/true);
  ASSERT_EQ(p->Receive().type, MsgType::kAck);
  SendPush(p.get(), layout_, 0, session, 2, 1.0f, 0, false);
  MessageHeader first = p->Receive();
  ASSERT_EQ(first.type, MsgType::kAck);
  SendPush(p.get(), layout_, 0, session, 2, 1.0f, 0, false);  // the resend of a push whose ack was lost
  MessageHeader again = p->Receive();
  EXPECT_EQ(again.type, MsgType::kAck);
  EXPECT_EQ(again.versions, first.versions);
  EXPECT_EQ(shards_[0]->ChunkWeights(0), std::vector<float>(8, -1.0f));  // applied once
  ShardStatsWire st = shards_[0]->Stats();
  EXPECT_EQ(st.duplicates, 1u);
  EXPECT_EQ(st.pushes_by_worker, std::vector<uint64_t>{1});
  // The same request id in another session is another push.
  SendPush(p.get(), layout_, 0, session + 1, 2, 1.0f, 1, false);
  ASSERT_EQ(p->Receive().type, MsgType::kAck);
  EXPECT_EQ(shards_[0]->ChunkWeights(0), std::vector<float>(8, -2.0f));

  // The server dies and comes back: the window is rebuilt from the log; a resend after the
  // restart is acked and not applied, a new push is.
  RecoverReport rep;
  auto fresh = KillAndRecover(0, o, &rep);
  EXPECT_NE(fresh->incarnation(), shards_[0]->incarnation());
  addresses_ = {Serve(std::move(fresh), "restarted")};
  auto q = Raw(0, 0);
  SendPush(q.get(), layout_, 0, session, 2, 1.0f, 0, false);
  MessageHeader r = q->Receive();
  EXPECT_EQ(r.type, MsgType::kAck);
  EXPECT_EQ(r.incarnation, shards_[1]->incarnation());
  EXPECT_EQ(shards_[1]->ChunkWeights(0), std::vector<float>(8, -2.0f));
  EXPECT_EQ(shards_[1]->Stats().duplicates, 1u);
  // Also when the window comes from a checkpoint rather than the log.
  ASSERT_TRUE(shards_[1]->SaveCheckpoint(ForServer(o, 0).checkpoint_path).ok());
  RecoverReport rep2;
  shards_[1]->Stop();
  ASSERT_TRUE(shards_[1]->Join().ok());
  std::unique_ptr<ShardServer> third;
  ASSERT_TRUE(ShardServer::Create(layout_, ForServer(o, 0), &third).ok());
  ASSERT_TRUE(third->Recover(&rep2).ok());
  EXPECT_TRUE(rep2.checkpoint_loaded);
  EXPECT_EQ(rep2.replayed, 0u);
  addresses_ = {Serve(std::move(third), "third")};
  auto t = Raw(0, 0);
  SendPush(t.get(), layout_, 0, session + 1, 2, 1.0f, 1, false);
  EXPECT_EQ(t->Receive().type, MsgType::kAck);
  EXPECT_EQ(shards_[2]->Stats().duplicates, 1u);
  SendPush(t.get(), layout_, 0, session + 1, 3, 1.0f, 2, false);
  EXPECT_EQ(t->Receive().type, MsgType::kAck);
  EXPECT_EQ(shards_[2]->ChunkWeights(0), std::vector<float>(8, -3.0f));
  EXPECT_EQ(shards_[2]->Stats().pushes_by_worker, std::vector<uint64_t>{3});
}

// The loop's time staging records for the log is measured (the scaling model reads it from the
// load benchmark as a server's cost per logged float): part of its busy time, and zero without a
// log; the log thread's CPU is counted apart.
TEST_F(ShardFixture, TheLoopsTimeInTheLogIsCountedWithinItsBusyTime) {
  UsePersistDir();
  ShardOptions o;
  o.checkpoint.wal_fsync_ms = 0;
  StartShards({{"a", {4096}, 1, 1}}, 1, 4096, o);
  auto c = Client(0);
  ASSERT_TRUE(c->Wait(c->PushInit(std::vector<float>(4096, 1.0f)), 5000ms).ok());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(c->Wait(c->Push(std::vector<float>(4096, 0.5f), i), 5000ms).ok());
  const ShardStatsWire st = shards_[0]->Stats();
  EXPECT_EQ(st.wal_records, 4u);
  EXPECT_GT(st.wal_ns, 0u);
  EXPECT_LE(st.wal_ns, st.busy_ns);
  EXPECT_GT(st.wal_sync_cpu_ns, 0u) << "the log thread writes and fsyncs, beside the loop";
}

TEST_F(ShardFixture, WithoutALogNoLogTimeIsCounted) {
  StartShards({{"a", {64}, 1, 1}}, 1, 64, ShardOptions{});
  auto c = Client(0);
  ASSERT_TRUE(c->Wait(c->PushInit(std::vector<float>(64, 1.0f)), 5000ms).ok());
  ASSERT_TRUE(c->Wait(c->Push(std::vector<float>(64, 0.5f), 0), 5000ms).ok());
  const ShardStatsWire st = shards_[0]->Stats();
  EXPECT_EQ(st.wal_records, 0u);
  EXPECT_EQ(st.wal_ns, 0u);
  EXPECT_EQ(st.wal_sync_cpu_ns, 0u);
  EXPECT_GT(st.busy_ns, 0u);
}

// Every worker offers the initial weights and the first init of a chunk wins: a later init push
// finds the weights set and changes nothing, so its log record keeps no floats (a job of W workers
// would log the model W times). The record is still there: a shard recovered from the log knows
// the request, and a resend of it is a duplicate, as on the live shard; weights and versions are
// the live shard's.
TEST_F(ShardFixture, AnInitPushThatFindsTheWeightsSetIsLoggedWithoutItsFloats) {
  UsePersistDir();
  ShardOptions o = PlainSgd();
  o.cluster.workers = 2;
  StartShards({{"a", {64}, 1, 1}}, 1, 16, o);
  auto c0 = Client(0);
  auto c1 = Client(1);
  ASSERT_TRUE(c0->Wait(c0->PushInit(std::vector<float>(64, 5.0f)), 5000ms).ok());
  const uint64_t one_init = shards_[0]->Stats().wal_bytes;
  ASSERT_TRUE(c1->Wait(c1->PushInit(std::vector<float>(64, 7.0f)), 5000ms).ok());
  const uint64_t second_init = shards_[0]->Stats().wal_bytes - one_init;
  EXPECT_GT(one_init, 64u * 4);
  // A record of 24 + 36 bytes per message, no chunk in it.
  EXPECT_EQ(second_init, shards_[0]->Stats().wal_records / 2 * (kWalHeaderBytes + 36)) << "of " << one_init;
  ASSERT_TRUE(c0->Wait(c0->Push(std::vector<float>(64, 1.0f), 0), 5000ms).ok());
  RecoverReport rep;
  std::unique_ptr<ShardServer> fresh = KillAndRecover(0, o, &rep);
  EXPECT_EQ(rep.replayed_pushes, shards_[0]->Stats().wal_records);
  ExpectSameShard(*shards_[0], *fresh, 0);
  EXPECT_EQ(fresh->ChunkWeights(0), std::vector<float>(16, 4.0f));  // worker 0's 5, one step of lr 1
  // The duplicate windows, which decide whether a resend is applied, are the live shard's: worker
  // 1's init requests are in the recovered one too.
  TensorFile live, back;
  ASSERT_TRUE(shards_[0]->SaveCheckpoint(persist_dir_ + "/live.dpt").ok());
  ASSERT_TRUE(fresh->SaveCheckpoint(persist_dir_ + "/back.dpt").ok());
  ASSERT_TRUE(ReadTensorFile(persist_dir_ + "/live.dpt", &live).ok());
  ASSERT_TRUE(ReadTensorFile(persist_dir_ + "/back.dpt", &back).ok());
  ASSERT_TRUE(live.meta.count("dedup.1")) << "worker 1's requests are not in the live shard's window";
  EXPECT_EQ(back.meta["dedup.1"], live.meta["dedup.1"]);
  EXPECT_EQ(back.meta["dedup.0"], live.meta["dedup.0"]);
}

// The log's size is bounded (checkpoint.wal_max_mb): a log that reaches the bound makes the shard
// checkpoint, which empties it, so the file never holds much more than the bound; the shard
// recovered from that checkpoint and what the log holds since is the live one, byte for byte.
TEST_F(ShardFixture, ALogThatReachesItsBoundIsEmptiedByACheckpoint) {
  UsePersistDir();
  ShardOptions o = PlainSgd();
  o.solver.momentum = 0.9f;
  o.checkpoint.wal_max_mb = 1;  // a push of 65536 floats is 256 KiB
  constexpr int64_t kFloats = 65536;
  StartShards({{"a", {kFloats}, 1, 1}}, 1, kFloats, o);
  auto c = Client(0);
  ASSERT_TRUE(c->Wait(c->PushInit(std::vector<float>(kFloats, 1.0f)), 5000ms).ok());
  uint64_t largest = 0;
  const std::string wal = ForServer(o, 0).wal_path;
  for (int i = 0; i < 20; ++i) {
    ASSERT_TRUE(c->Wait(c->Push(std::vector<float>(kFloats, 0.01f * static_cast<float>(i + 1)), i), 5000ms).ok());
    WalScanInfo info;
    ASSERT_TRUE(ScanWal(wal, nullptr, &info).ok());
    largest = std::max<uint64_t>(largest, info.valid_bytes);
  }
  const ShardStatsWire st = shards_[0]->Stats();
  EXPECT_GE(st.checkpoints_written, 4u) << "21 records of ~256 KiB against a 1 MiB bound";
  EXPECT_LT(largest, WalMaxBytes(o.checkpoint) + (320 << 10)) << "the log outgrew its bound by more than a record";
  RecoverReport rep;
  auto fresh = KillAndRecover(0, o, &rep);
  EXPECT_TRUE(rep.checkpoint_loaded);
  EXPECT_LT(rep.replayed_pushes, 5u);
  ExpectSameShard(*shards_[0], *fresh, 0);
}

// A server whose log's directory has less room than the bounded log and two checkpoints stops
// before it serves, naming the directory, the key and both figures; with room it serves.
TEST_F(ShardFixture, ALogDirectoryWithoutRoomForTheBoundStopsTheServerBeforeItServes) {
  UsePersistDir();
  ASSERT_TRUE(ParamLayout::Build({{"a", {4096}, 1, 1}}, 1, 4096, &layout_).ok());
  ShardOptions o = ForServer(PlainSgd(), 0);
  o.checkpoint.wal_max_mb = 1;
  test::FaultEnv env;
  ScopedEnv scoped(&env);
  env.SetFreeBytes((1 << 20) + 2 * 4096 * 8 - 1);  // a byte short
  std::unique_ptr<ShardServer> shard;
  ASSERT_TRUE(ShardServer::Create(layout_, o, &shard).ok());
  std::unique_ptr<ServerEndpoint> ep;
  ASSERT_TRUE(transport_.Bind("shard-room", &ep).ok());
  Status s = shard->Serve(ep.get());
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  EXPECT_NE(s.message().find(persist_dir_), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("checkpoint.wal_max_mb = 1"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("1.1 MiB"), std::string::npos) << s.message();
  RecoverReport rep;
  EXPECT_EQ(shard->Recover(&rep).code(), StatusCode::kFailedPrecondition) << "--recover checks it too";
  env.SetFreeBytes((1 << 20) + 2 * 4096 * 8);
  std::unique_ptr<ShardServer> roomy;
  ASSERT_TRUE(ShardServer::Create(layout_, o, &roomy).ok());
  EXPECT_TRUE(roomy->OpenLog().ok());
}

// Many workers pushing at once through group commit: every acknowledged push is in the log
// once, and the shard recovered from the log is the live one, byte for byte.
TEST_F(ShardFixture, ConcurrentPushersThroughGroupCommitRecoverToTheLiveShard) {
  UsePersistDir();
  ShardOptions o = PlainSgd();
  o.solver.momentum = 0.9f;
  o.cluster.workers = 4;
  StartShards({{"a", {8192}, 1, 1}}, 1, 1024, o);
  std::vector<std::unique_ptr<PsClient>> clients;
  for (int w = 0; w < 4; ++w) clients.push_back(Client(w));
  ASSERT_TRUE(clients[0]->Wait(clients[0]->PushInit(std::vector<float>(8192, 1.0f)), 5000ms).ok());
  std::vector<std::thread> pushers;
  for (int w = 0; w < 4; ++w) {
    pushers.emplace_back([&, w] {
      for (int i = 0; i < 10; ++i) {
        const std::vector<float> g(8192, static_cast<float>(w + 1) * 0.125f);
        EXPECT_TRUE(clients[static_cast<size_t>(w)]->Wait(clients[static_cast<size_t>(w)]->Push(g, i), 5000ms).ok());
      }
    });
  }
  for (auto& t : pushers) t.join();
  for (int w = 0; w < 4; ++w) EXPECT_EQ(shards_[0]->Stats().pushes_by_worker[static_cast<size_t>(w)], 10u * 2);
  RecoverReport rep;
  auto fresh = KillAndRecover(0, o, &rep);
  EXPECT_EQ(rep.replayed_pushes, shards_[0]->Stats().wal_records);
  ExpectSameShard(*shards_[0], *fresh, 0);
}

// checkpoint.history: a checkpoint moves the log aside (server/shard_log.h KeptSegmentPath)
// instead of emptying it, seq numbers going on, so the kept segments and the live log hold every
// record of the run once; replayed into a fresh shard (Replay) they give the live shard, byte for
// byte. A log that --recover finds all covered by the checkpoint (the process died between the
// two) is kept aside too, not emptied.
TEST_F(ShardFixture, KeptHistoryHoldsEveryRecordOnceAndReplaysToTheLiveShard) {
  UsePersistDir();
  ShardOptions o = PlainSgd();
  o.solver.momentum = 0.9f;
  o.checkpoint.history = true;
  o.checkpoint.every_updates = 2;  // rounds of the shard's two chunks
  o.cluster.workers = 2;
  StartShards({{"a", {64}, 1, 1}}, 1, 32, o);
  std::vector<std::unique_ptr<PsClient>> c;
  for (int w = 0; w < 2; ++w) c.push_back(Client(w));
  ASSERT_TRUE(c[0]->Wait(c[0]->PushInit(Iota(64, 0.0f, 0.5f)), 5000ms).ok());
  for (int k = 0; k < 5; ++k) {
    for (int w = 0; w < 2; ++w) {
      ASSERT_TRUE(c[static_cast<size_t>(w)]->Wait(c[static_cast<size_t>(w)]->Push(Iota(64, 0.25f * (w + 1), 0.01f), k),
                                                 5000ms).ok());
    }
  }
  const std::string wal = ForServer(o, 0).wal_path;
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(persist_dir_)) {
    if (e.path().string().starts_with(wal + ".")) files.push_back(e.path().string());
  }
  std::sort(files.begin(), files.end());
  ASSERT_GE(files.size(), 4u) << "a checkpoint every 2 rounds of 10 pushes";
  files.push_back(wal);
  std::unique_ptr<ShardServer> replay;
  ASSERT_TRUE(ShardServer::Create(layout_, ShardOptions(o), &replay).ok());
  uint64_t next = 1, pushes = 0;
  for (const std::string& f : files) {
    WalScanInfo info;
    ASSERT_TRUE(ScanWal(f, [&](const WalRecord& r) {
      EXPECT_EQ(r.seq, next++) << f;
      if (r.kind == WalKind::kPush) ++pushes;
      return replay->Replay(r, f);
    }, &info).ok()) << f;
  }
  EXPECT_EQ(pushes, 11u);  // the initial weights and ten gradients, each once
  EXPECT_EQ(replay->log_seq(), next - 1);
  ExpectSameShard(*shards_[0], *replay, 0);

  // One more push, then the process dies after a checkpoint covering its whole log but before
  // moving the log aside.
  ASSERT_TRUE(c[0]->Wait(c[0]->Push(Iota(64, 1.0f, 0.01f), 5), 5000ms).ok());
  const std::string aside = persist_dir_ + "/elsewhere.dpt";
  ASSERT_TRUE(shards_[0]->SaveCheckpoint(aside).ok());  // not the shard's own path: the log stays
  WalScanInfo live;
  ASSERT_TRUE(ScanWal(wal, nullptr, &live).ok());
  ASSERT_GT(live.records, 0u);
  shards_[0]->Stop();
  ASSERT_TRUE(shards_[0]->Join().ok());
  std::filesystem::copy_file(aside, ForServer(o, 0).checkpoint_path, std::filesystem::copy_options::overwrite_existing);
  std::unique_ptr<ShardServer> fresh;
  ASSERT_TRUE(ShardServer::Create(layout_, ForServer(o, 0), &fresh).ok());
  RecoverReport rep;
  ASSERT_TRUE(fresh->Recover(&rep).ok());
  EXPECT_EQ(rep.replayed, 0u);
  WalScanInfo kept;
  ASSERT_TRUE(ScanWal(KeptSegmentPath(wal, live.last_seq), nullptr, &kept).ok());
  EXPECT_EQ(kept.records, live.records);
  EXPECT_EQ(kept.last_seq, live.last_seq);
  ExpectSameShard(*shards_[0], *fresh, 0);
}

// AdaGrad on the servers (solver.update = "adagrad"): pushes of a constant gradient move each
// weight as the closed form says, w_k = w0 − lr Σ g / sqrt(a0 + i g² + eps); the accumulator is
// the chunk's state. A shard killed and recovered from its checkpoint and log is the live one,
// byte for byte, and a checkpoint of the momentum rule does not load into it.
TEST_F(ShardFixture, AdaGradOnTheServersFollowsItsClosedFormAndRecoversByteForByte) {
  UsePersistDir();
  ShardOptions o = PlainSgd();
  o.solver.base_lr = 0.1f;
  o.solver.update = UpdateRuleKind::kAdaGrad;
  o.solver.adagrad_initial = 0.1f;
  o.solver.adagrad_epsilon = 1e-10f;
  o.checkpoint.every_updates = 3;
  StartShards({{"a", {64}, 1, 1}}, 1, 16, o);
  auto c = Client(0);
  ASSERT_TRUE(c->Wait(c->PushInit(std::vector<float>(64, 1.0f)), 5000ms).ok());
  const float g = 0.5f;
  for (int k = 0; k < 5; ++k) ASSERT_TRUE(c->Wait(c->Push(std::vector<float>(64, g), k), 5000ms).ok());
  double want = 1.0;
  for (int i = 1; i <= 5; ++i) want -= 0.1 * g / std::sqrt(0.1 + i * g * g + 1e-10);
  for (int32_t id : layout_.ServerChunks(0)) {
    for (float w : shards_[0]->ChunkWeights(id)) EXPECT_NEAR(w, want, 1e-6);
    for (float a : shards_[0]->ChunkHistory(id)) EXPECT_NEAR(a, 0.1 + 5 * g * g, 1e-6);
  }
  RecoverReport rep;
  auto fresh = KillAndRecover(0, o, &rep);
  EXPECT_TRUE(rep.checkpoint_loaded);
  EXPECT_GT(rep.replayed_pushes, 0u);
  ExpectSameShard(*shards_[0], *fresh, 0);
  // The momentum rule's shard cannot take AdaGrad's accumulators as its momentum.
  ShardOptions momentum = ForServer(o, 0);
  momentum.solver.update = UpdateRuleKind::kMomentum;
  std::unique_ptr<ShardServer> other;
  ASSERT_TRUE(ShardServer::Create(layout_, momentum, &other).ok());
  const Status s = other->LoadCheckpoint(momentum.checkpoint_path);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  EXPECT_NE(s.message().find("solver.update = \"adagrad\""), std::string::npos) << s.message();
}

// A rule defined here, in the test alone (sign SGD: w −= lr · sign(g), no state), runs through a
// shard handed it in ShardOptions: the factory, the config and the shard need no change.
class SignSgdRule final : public UpdateRule {
 public:
  std::string_view name() const override { return "sign-sgd"; }
  void Apply(const UpdateParams& p, std::span<const float> grad, std::span<float> w,
             std::span<float>) const override {
    for (size_t i = 0; i < w.size(); ++i) w[i] -= p.lr * static_cast<float>((grad[i] > 0) - (grad[i] < 0));
  }
};

TEST_F(ShardFixture, AnUpdateRuleDefinedInATestRunsThroughAShard) {
  ShardOptions o = PlainSgd();
  o.solver.base_lr = 0.25f;
  o.update_rule = std::make_shared<SignSgdRule>();
  StartShards({{"a", {8}, 1, 1}}, 1, 8, o);
  auto c = Client(0);
  ASSERT_TRUE(c->Wait(c->PushInit(std::vector<float>(8, 1.0f)), 5000ms).ok());
  std::vector<float> g(8);
  for (size_t i = 0; i < g.size(); ++i) g[i] = i % 3 == 0 ? 3.0f : (i % 3 == 1 ? -0.01f : 0.0f);
  ASSERT_TRUE(c->Wait(c->Push(g, 0), 5000ms).ok());
  const std::vector<float> w = shards_[0]->ChunkWeights(0);
  for (size_t i = 0; i < w.size(); ++i) EXPECT_EQ(w[i], i % 3 == 0 ? 0.75f : (i % 3 == 1 ? 1.25f : 1.0f)) << i;
}

// A shard rule defined here alone: gradients clipped to [-1, 1] before they are taken, each
// weight's clipped gradients counted as the rule's state, worker 1's pushes refused. It rewrites
// (so it is logged as clipped), keeps the raw gradients (so replay rebuilds its counts) and keeps
// state in checkpoints, and runs through a shard handed it in ShardOptions: the factory, the
// config and the shard need no change. `events` records the shard's calls, in order.
class ClipRule final : public GradientRule {
 public:
  struct Events {
    std::mutex mu;  // the shard calls on its loop; the test reads on its own thread
    std::vector<std::string> seen;
    void Add(std::string e) {
      std::lock_guard<std::mutex> lock(mu);
      seen.push_back(std::move(e));
    }
    std::vector<std::string> Take() {
      std::lock_guard<std::mutex> lock(mu);
      return std::exchange(seen, {});
    }
  };
  explicit ClipRule(std::shared_ptr<Events> events) : events_(std::move(events)) {}
  std::string_view name() const override { return "clip"; }
  Status Check(RuleShard& shard, const PushContext& ctx, std::span<const PushChunk> chunks) override {
    events_->Add(fmt::format("check {}", ctx.worker));
    if (ctx.worker == 1) return FailedPrecondition("clip: worker 1 may not push");
    return GradientRule::Check(shard, ctx, chunks);
  }
  bool rewrites() const override { return true; }
  bool keeps_raw() const override { return true; }
  void Prepare(RuleShard&, int32_t, std::vector<PushChunk>* chunks) override {
    events_->Add("prepare");
    clipped_.resize(chunks->size());
    staged_.resize(chunks->size());
    for (size_t i = 0; i < chunks->size(); ++i) {
      PushChunk& c = (*chunks)[i];
      clipped_[i].assign(c.grad, c.grad + c.count);
      staged_[i] = Counts(c.local, c.grad, c.count);
      for (float& g : clipped_[i]) g = std::clamp(g, -1.0f, 1.0f);
      c.grad = clipped_[i].data();
    }
  }
  void Commit(std::span<const PushChunk> chunks) override {
    events_->Add("commit");
    for (size_t i = 0; i < chunks.size(); ++i) counts_[chunks[i].local] = staged_[i];
  }
  void Apply(RuleShard& shard, const PushContext& ctx, std::span<const PushChunk> chunks) override {
    events_->Add("apply");
    GradientRule::Apply(shard, ctx, chunks);
  }
  void OnPullServed(RuleShard&, int32_t worker, std::span<const int>) override {
    events_->Add(fmt::format("pull {}", worker));
  }
  void Replay(int local, const float* raw, int64_t count) override {
    events_->Add("replay");
    counts_[local] = Counts(local, raw, count);
  }
  std::string_view state_name() const override { return "clip_count"; }
  std::vector<float> ChunkState(int local) const override {
    auto it = counts_.find(local);
    return it == counts_.end() ? std::vector<float>{} : it->second;
  }
  void SetChunkState(int local, std::vector<float> state) override { counts_[local] = std::move(state); }

 private:
  // Chunk `local`'s counts with the gradient `g` in them.
  std::vector<float> Counts(int local, const float* g, int64_t count) const {
    std::vector<float> n = ChunkState(local);
    n.resize(static_cast<size_t>(count), 0.0f);
    for (int64_t j = 0; j < count; ++j) n[static_cast<size_t>(j)] += std::abs(g[j]) > 1.0f ? 1.0f : 0.0f;
    return n;
  }
  std::shared_ptr<Events> events_;
  std::map<int, std::vector<float>> counts_;          // per local chunk
  std::vector<std::vector<float>> clipped_, staged_;  // the push being prepared
};

TEST_F(ShardFixture, AShardRuleDefinedInATestRunsThroughAShardItsLogAndItsCheckpoint) {
  UsePersistDir();
  ShardOptions o = PlainSgd();  // lr 1, no momentum: an update is w − g
  o.cluster.workers = 2;
  auto events = std::make_shared<ClipRule::Events>();
  o.gradient_rule = [events] { return std::make_unique<ClipRule>(events); };
  StartShards({{"a", {4}, 1, 1}}, 1, 4, o);
  auto c0 = Client(0), c1 = Client(1);
  ASSERT_TRUE(c0->Wait(c0->PushInit(std::vector<float>(4, 0.0f)), 5000ms).ok());
  EXPECT_TRUE(events->Take().empty()) << "an init push is no rule's";
  const std::vector<float> g1{3.0f, -0.5f, -2.0f, 0.25f}, g2{-5.0f, 0.5f, 0.5f, 7.0f};
  ASSERT_TRUE(c0->Wait(c0->Push(g1, 0), 5000ms).ok());
  EXPECT_EQ(events->Take(), (std::vector<std::string>{"check 0", "prepare", "commit", "apply"}));
  EXPECT_EQ(shards_[0]->ChunkWeights(0), (std::vector<float>{-1.0f, 0.5f, 1.0f, -0.25f}));
  // Refused by the rule's Check: nothing prepared, logged or applied.
  const Status refused = c1->Wait(c1->Push(std::vector<float>(4, 100.0f), 0), 5000ms);
  EXPECT_FALSE(refused.ok());
  EXPECT_NE(refused.message().find("clip: worker 1 may not push"), std::string::npos) << refused.message();
  EXPECT_EQ(events->Take(), std::vector<std::string>{"check 1"});
  EXPECT_EQ(shards_[0]->ChunkVersion(0), 1);
  std::vector<float> pulled(4);
  ASSERT_TRUE(c0->Wait(c0->Pull(pulled, 1), 5000ms).ok());
  EXPECT_EQ(events->Take(), std::vector<std::string>{"pull 0"});
  const std::string path = ForServer(o, 0).checkpoint_path;
  ASSERT_TRUE(shards_[0]->SaveCheckpoint(path).ok());
  TensorFile file;
  ASSERT_TRUE(ReadTensorFile(path, &file).ok());
  const auto counts = std::find_if(file.tensors.begin(), file.tensors.end(),
                                   [](const NamedTensor& t) { return t.name == "chunk0.clip_count"; });
  ASSERT_NE(counts, file.tensors.end()) << "the rule's state is in the checkpoint under its name";
  EXPECT_EQ(counts->data, (std::vector<float>{1.0f, 0.0f, 1.0f, 0.0f}));
  // After the checkpoint: in the log only, clipped and raw.
  ASSERT_TRUE(c0->Wait(c0->Push(g2, 1), 5000ms).ok());
  EXPECT_EQ(shards_[0]->ChunkWeights(0), (std::vector<float>{0.0f, 0.0f, 0.5f, -1.25f}));
  EXPECT_EQ(shards_[0]->ChunkRuleState(0), (std::vector<float>{2.0f, 0.0f, 1.0f, 1.0f}));
  EXPECT_EQ(shards_[0]->RuleStateName(), "clip_count");
  events->Take();
  RecoverReport rep;
  auto fresh = KillAndRecover(0, o, &rep);
  EXPECT_TRUE(rep.checkpoint_loaded);
  EXPECT_EQ(rep.replayed_pushes, 1u);
  EXPECT_EQ(events->Take(), (std::vector<std::string>{"replay", "apply"})) << "replay repeats the clipped push";
  ExpectSameShard(*shards_[0], *fresh, 0);
  EXPECT_EQ(fresh->ChunkRuleState(0), (std::vector<float>{2.0f, 0.0f, 1.0f, 1.0f}));
}

// A recovered shard never writes into the file it recovered from: a process that still holds that
// file open (a server replaced while it was cut off, which may take a message before it hears it
// is out) writes only into a file nobody reads any more, and the replacement's log is untouched.
TEST_F(ShardFixture, ARecoveredShardLogsIntoANewFileThatAnOldWriterCannotReach) {
  const ShardOptions o = OneChunkInitAndOnePush();
  const std::string wal = ForServer(o, 0).wal_path;
  const int old_fd = ::open(wal.c_str(), O_WRONLY);  // the old process's descriptor
  ASSERT_GE(old_fd, 0);
  RecoverReport rep;
  auto fresh = KillAndRecover(0, o, &rep);
  EXPECT_EQ(rep.replayed_pushes, 2u);
  const std::string junk(4096, '\0');
  ASSERT_EQ(::pwrite(old_fd, junk.data(), junk.size(), 0), static_cast<ssize_t>(junk.size()));  // too late
  ::close(old_fd);
  const std::string address = Serve(std::move(fresh), "recovered");
  auto d = Client(0, [&](PsClientOptions& po) { po.server_addresses = {address}; });
  ASSERT_TRUE(d->Wait(d->Push(std::vector<float>(8, 1.0f), 1), 5000ms).ok());
  shards_.back()->Stop();
  ASSERT_TRUE(shards_.back()->Join().ok());  // the log written and closed
  WalScanInfo info;
  ASSERT_TRUE(ScanWal(wal, nullptr, &info).ok()) << "the new log was written over";
  EXPECT_EQ(info.records, 1u);
  EXPECT_EQ(info.first_seq, 3u);
}

// The process a replacement took over may still try a checkpoint before it hears it is out (a
// periodic one, or one on its way out after the link came back): it writes nothing, since its
// checkpoint would overwrite the replacement's and moving its log aside would move the
// replacement's log, and it is fenced. With the history kept, as where this was seen.
TEST_F(ShardFixture, AProcessWhoseLogWasTakenOverWritesNoCheckpointAndIsFenced) {
  const ShardOptions mine = ForServer(ServedThenReplaced(), 0);
  std::unique_ptr<ShardServer> replacement = std::move(replacement_);
  const std::string checkpoint = test::ReadFile(mine.checkpoint_path);
  struct stat before {};
  ASSERT_EQ(::stat(mine.wal_path.c_str(), &before), 0);
  const auto kept = std::distance(std::filesystem::directory_iterator(persist_dir_), {});
  EXPECT_FALSE(shards_[0]->fenced());
  const Status s = shards_[0]->SaveCheckpoint(mine.checkpoint_path);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  EXPECT_NE(s.message().find("taken over by another process"), std::string::npos) << s.message();
  EXPECT_TRUE(shards_[0]->fenced());
  EXPECT_EQ(test::ReadFile(mine.checkpoint_path), checkpoint) << "the replacement's checkpoint was overwritten";
  struct stat after {};
  ASSERT_EQ(::stat(mine.wal_path.c_str(), &after), 0) << "the replacement's log was moved";
  EXPECT_EQ(after.st_ino, before.st_ino);
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(persist_dir_), {}), kept);
  // The replacement's own checkpoint goes through.
  EXPECT_TRUE(replacement->SaveCheckpoint(mine.checkpoint_path).ok());
  EXPECT_FALSE(replacement->fenced());
}

// The same process stopped (the run ending, or a signal) before it tried a checkpoint: its loop's
// end finds the log taken over, so it is fenced and sends no held reply; downpour-server then
// exits without a checkpoint.
TEST_F(ShardFixture, AProcessWhoseLogWasTakenOverIsFencedWhenItStops) {
  ServedThenReplaced();
  EXPECT_FALSE(shards_[0]->fenced());
  shards_[0]->Stop();
  EXPECT_TRUE(shards_[0]->Join().ok());
  EXPECT_TRUE(shards_[0]->fenced());
  EXPECT_FALSE(replacement_->fenced());
}

TEST_F(ShardFixture, ServerKilledBeforeItsFirstCheckpointReplaysTheWholeLogAndDropsATornTail) {
  const ShardOptions o = OneChunkInitAndOnePush();
  shards_[0]->Stop();
  ASSERT_TRUE(shards_[0]->Join().ok());
  // The process died while writing a further record: half of it is in the file.
  const std::string wal = ForServer(o, 0).wal_path;
  std::string rec;
  WalRecord extra;
  extra.kind = WalKind::kClock;
  extra.seq = 3;
  EncodeWalRecord(extra, &rec);
  WalScanInfo logged;  // the log as the dead process left it: its records, maybe block padding
  ASSERT_TRUE(ScanWal(wal, nullptr, &logged).ok());
  {
    std::ofstream(wal, std::ios::binary | std::ios::app) << rec.substr(0, 30);
  }
  std::string bytes;  // the log as it was, to damage below
  {
    std::ifstream in(wal, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  std::unique_ptr<ShardServer> fresh;
  ASSERT_TRUE(ShardServer::Create(layout_, ForServer(o, 0), &fresh).ok());
  RecoverReport rep;
  ASSERT_TRUE(fresh->Recover(&rep).ok());
  EXPECT_FALSE(rep.checkpoint_loaded);
  EXPECT_TRUE(rep.torn_tail);
  EXPECT_EQ(rep.replayed_pushes, 2u);  // the init push and the gradient
  EXPECT_EQ(fresh->ChunkWeights(0), std::vector<float>(8, 4.0f));
  EXPECT_EQ(fresh->ChunkVersion(0), 1);
  // What was replayed is in a checkpoint now, and the log goes on in a new, empty file.
  EXPECT_EQ(fresh->Stats().checkpoints_written, 1u);
  EXPECT_EQ(fresh->log_seq(), logged.last_seq);
  EXPECT_EQ(std::filesystem::file_size(wal), 0u);
  // A damaged record in the middle is refused, naming the file and the offset.
  fresh->Stop();
  ASSERT_TRUE(fresh->Join().ok());
  std::filesystem::remove(ForServer(o, 0).checkpoint_path);
  bytes[kWalHeaderBytes + 1] ^= 0x10;  // the first record's payload
  { std::ofstream(wal, std::ios::binary | std::ios::trunc) << bytes; }
  std::unique_ptr<ShardServer> broken;
  ASSERT_TRUE(ShardServer::Create(layout_, ForServer(o, 0), &broken).ok());
  Status s = broken->Recover(&rep);
  EXPECT_EQ(s.code(), StatusCode::kCorrupt);
  EXPECT_NE(s.message().find(wal + ": byte 0"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace downpour

namespace downpour {
namespace {

// A write-ahead log that cannot be opened and synced (here /dev/full, which takes no fsync) stops
// the server before it serves anything, with an error naming the log: a server that could not
// keep its promise never acknowledges a push. (A write that fails later refuses the message
// under kLogWrite: the next test.)
TEST_F(ShardFixture, ALogThatCannotBeOpenedStopsTheServerBeforeItServes) {
  if (!std::filesystem::exists("/dev/full")) GTEST_SKIP() << "no /dev/full on this machine";
  ASSERT_TRUE(ParamLayout::Build(SmallModel(), 1, 8, &layout_).ok());
  ShardOptions o;
  o.wal_path = "/dev/full";
  std::unique_ptr<ShardServer> shard;
  ASSERT_TRUE(ShardServer::Create(layout_, o, &shard).ok());
  std::unique_ptr<ServerEndpoint> ep;
  ASSERT_TRUE(transport_.Bind("shard-full", &ep).ok());
  const Status s = shard->Serve(ep.get());
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("/dev/full"), std::string::npos) << s.ToString();
  EXPECT_EQ(shard->Stats().pushes_applied, 0u);
}

// One shard whose log is fsynced before every ack (a failed fsync is then the push's own), with
// worker 0's initial weights and its push of step 0 taken: where the log failure tests start.
class ShardLogFailure : public ShardFixture {
 protected:
  void StartWithTwoPushes() {
    UsePersistDir();
    o_.solver.base_lr = 0.1f;
    o_.solver.momentum = 0.9f;
    o_.cluster.workers = 1;
    o_.checkpoint.wal_fsync_ms = 0;
    StartShards(SmallModel(), 1, 64, o_);
    n_ = static_cast<size_t>(layout_.total_elems());
    c_ = Client(0);
    ASSERT_TRUE(c_->Wait(c_->PushInit(Iota(n_, 1.0f, 0.01f)), 5000ms).ok());
    ASSERT_TRUE(c_->Wait(c_->Push(Grad(n_, 0, 0), 0), 5000ms).ok());
  }

  void TearDown() override {
    c_.reset();  // as a test's own client would be: gone before its servers stop
    ShardFixture::TearDown();
  }

  // Messages `shard` refused because its log could not take them.
  static uint64_t LogRefusals(const ShardServer& shard) {
    return shard.Stats().rejected_by_reason[static_cast<size_t>(RejectReason::kLogWrite)];
  }

  test::FaultEnv env_;  // installed only inside a test's ScopedEnv; TearDown joins the shards first
  ShardOptions o_;
  size_t n_ = 0;
  std::unique_ptr<PsClient> c_;
};

// A push the log cannot write (the disk full part-way through its record) is not acknowledged: it
// is refused under kLogWrite (the one already staged is applied, the ones after it are not), its
// client sends it again, backing off, and once there is room it is taken, each of its messages
// once. The server restarted from its log is then the live one byte for byte: the stalled record
// was written whole, at its place, once the disk had room.
TEST_F(ShardLogFailure, APushTheLogCannotTakeIsRefusedUnappliedSentAgainAndTakenOnce) {
  ASSERT_NO_FATAL_FAILURE(StartWithTwoPushes());
  const uint64_t msgs = (layout_.ServerChunks(0).size() + 3) / 4;
  const uint64_t applied = shards_[0]->Stats().pushes_applied;
  const auto refusals = [this] { return LogRefusals(*shards_[0]); };
  {
    ScopedEnv scoped(&env_);
    env_.FillDiskAfter(100);
    const std::vector<float> g = Grad(n_, 0, 1);  // the client borrows it until the push ends
    const RequestId id = c_->Push(g, 1);
    for (int i = 0; i < 500 && refusals() < 3; ++i) std::this_thread::sleep_for(10ms);  // bounded: 5 s
    EXPECT_GE(refusals(), 3u) << "the client did not send the refused push again";
    EXPECT_LE(shards_[0]->Stats().pushes_applied, applied + msgs) << "a refused push was applied twice";
    EXPECT_EQ(c_->Wait(id, 1ms).code(), StatusCode::kTimeout) << "the push ended while the log refused it";
    env_.FillDiskAfter(-1);  // room again
    const Status s = c_->Wait(id, 5000ms);
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  EXPECT_GE(env_.failed_writes(), 3);
  EXPECT_EQ(shards_[0]->Stats().pushes_applied, applied + msgs) << "each message of the push taken once";
  EXPECT_GE(c_->resent_parts(0), msgs);
  ASSERT_TRUE(c_->Wait(c_->Push(Grad(n_, 0, 2), 2), 5000ms).ok());
  RecoverReport rep;
  auto fresh = KillAndRecover(0, o_, &rep);
  EXPECT_FALSE(rep.torn_tail);
  EXPECT_EQ(rep.replayed_pushes, 4 * msgs);  // the init and the three pushes taken
  ExpectSameShard(*shards_[0], *fresh, 0);
}

// A log that stays unable to write the push (the disk stays full) fails it after server_wait,
// with the server's error naming the log and how long it refused; nothing of it was acknowledged,
// and the client goes on once the disk has room.
TEST_F(ShardLogFailure, APushTheLogKeepsRefusingFailsAfterServerWaitNamingTheLog) {
  ASSERT_NO_FATAL_FAILURE(StartWithTwoPushes());
  auto c = Client(0, [](PsClientOptions& o) { o.server_wait = 600ms; });
  const uint64_t applied = shards_[0]->Stats().pushes_applied;
  {
    ScopedEnv scoped(&env_);
    env_.FillDiskAfter(0);
    const Status s = c->Wait(c->Push(Grad(n_, 0, 1), 1), 5000ms);
    EXPECT_EQ(s.code(), StatusCode::kIoError) << s.ToString();
    EXPECT_NE(s.message().find("the write-ahead log failed, so the push is not"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("the disk is full"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find(persist_dir_), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("cluster.server_wait_ms = 600"), std::string::npos) << s.message();
    EXPECT_EQ(c->acked_pushes(0), 0u) << "a push the log never wrote was acknowledged";
    EXPECT_LE(shards_[0]->Stats().pushes_applied, applied + 1);
    env_.FillDiskAfter(-1);
  }
  const Status s = c->Wait(c->Push(Grad(n_, 0, 2), 2), 5000ms);
  EXPECT_TRUE(s.ok()) << s.ToString();
}

// A worker the coordinator declared dead is fenced: every message of its process (its client
// session, registered long enough before the notice) is refused as kRemoved and changes nothing,
// whatever it sends on waking. A restarted process (a new session) registers and is taken back.
TEST_F(ShardLogFailure, AWorkerDeclaredDeadIsFencedAndARestartedProcessIsTakenBack) {
  o_.cluster.heartbeat_timeout_ms = 200;
  ASSERT_NO_FATAL_FAILURE(StartWithTwoPushes());
  std::this_thread::sleep_for(150ms);  // the session registered over half the timeout before the notice
  const uint64_t applied = shards_[0]->Stats().pushes_applied;
  shards_[0]->MarkWorkerGone(0, /*finished=*/false);
  const std::vector<float> g = Grad(n_, 0, 1);
  const Status s = c_->Wait(c_->Push(g, 1), 5000ms);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  EXPECT_NE(s.message().find("worker 0 was declared dead by the coordinator"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("this process is out of the run"), std::string::npos) << s.message();
  EXPECT_EQ(shards_[0]->Stats().pushes_applied, applied);
  EXPECT_GE(shards_[0]->Stats().rejected_by_reason[static_cast<size_t>(RejectReason::kRemoved)], 1u);
  std::vector<float> w(n_);
  EXPECT_EQ(c_->Wait(c_->Pull(w, 1), 5000ms).code(), StatusCode::kFailedPrecondition);
  // The same worker id in a new process: taken back, its push applied once.
  auto restarted = Client(0);
  ASSERT_TRUE(restarted->Wait(restarted->Push(g, 1), 5000ms).ok());
  EXPECT_GT(shards_[0]->Stats().pushes_applied, applied);
  EXPECT_EQ(restarted->acked_pushes(0), 1u);
}

// A worker that a restarted server counts as dead rejoins by its register, and the server logs
// its return. With the disk full that register is refused by the log: the client sends it again,
// backing off, and the push waiting behind it waits instead of failing (as a refused push part
// would); once there is room the register and then the push are taken, the push once.
TEST_F(ShardLogFailure, ARejoiningRegisterTheLogCannotTakeIsSentAgainAndThePushBehindItWaits) {
  // The client registered moments before the death notice, so it stands for a restarted process
  // of worker 0, not the one that went silent: the shard does not fence its session.
  o_.cluster.heartbeat_timeout_ms = 3600 * 1000;
  ASSERT_NO_FATAL_FAILURE(StartWithTwoPushes());
  const uint64_t msgs = (layout_.ServerChunks(0).size() + 3) / 4;
  shards_[0]->MarkWorkerGone(0, /*finished=*/false);
  std::vector<float> w(n_);
  ASSERT_TRUE(c_->Wait(c_->Pull(w, 1), 5000ms).ok());  // a served pull: the loop logged worker 0 dead
  RecoverReport rep;
  auto fresh = KillAndRecover(0, o_, &rep);
  const uint64_t applied = fresh->Stats().pushes_applied;
  ShardServer* restarted = fresh.get();
  const std::string address = Serve(std::move(fresh), "shard0-restarted");
  const auto refusals = [restarted] { return LogRefusals(*restarted); };
  {
    ScopedEnv scoped(&env_);
    env_.FillDiskAfter(0);
    ASSERT_TRUE(c_->SetServerAddress(0, address).ok());
    const std::vector<float> g = Grad(n_, 0, 1);  // the client borrows it until the push ends
    const RequestId id = c_->Push(g, 1);
    for (int i = 0; i < 500 && refusals() < 3; ++i) std::this_thread::sleep_for(10ms);  // bounded: 5 s
    EXPECT_GE(refusals(), 3u) << "the client did not send the refused register again";
    EXPECT_EQ(c_->Wait(id, 1ms).code(), StatusCode::kTimeout) << "the push ended while the log refused the register";
    EXPECT_EQ(restarted->Stats().pushes_applied, applied);
    env_.FillDiskAfter(-1);  // room again
    const Status s = c_->Wait(id, 5000ms);
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  EXPECT_EQ(restarted->Stats().pushes_applied, applied + msgs) << "each message of the push taken once";
  ASSERT_TRUE(c_->Wait(c_->Push(Grad(n_, 0, 2), 2), 5000ms).ok());
}

// A failed fsync of the log leaves the shard unable to promise anything: it stops as a crash
// would. The push whose batch found the failure goes unanswered (its client would resend it to the
// restarted server, which finds it a duplicate), the loop ends with an error naming the log, and
// the shard recovered from its log is the live one: the push was applied and written, only never
// acknowledged.
TEST_F(ShardLogFailure, AFailedLogFsyncStopsTheServerLikeACrashAndItsLogStillRecovers) {
  ASSERT_NO_FATAL_FAILURE(StartWithTwoPushes());
  const uint64_t applied = shards_[0]->Stats().pushes_applied;
  const uint64_t acked = c_->acked_pushes(0);
  const std::vector<float> g = Grad(n_, 0, 1);  // borrowed by the client: its push stays open to the end
  {
    ScopedEnv scoped(&env_);
    env_.FailFsync(EIO);
    const RequestId id = c_->Push(g, 1);
    for (int i = 0; i < 500 && !shards_[0]->log_failed(); ++i) std::this_thread::sleep_for(10ms);  // bounded: 5 s
    ASSERT_TRUE(shards_[0]->log_failed());
    const Status joined = shards_[0]->Join();  // its loop ended by itself
    EXPECT_EQ(joined.code(), StatusCode::kIoError);
    EXPECT_NE(joined.message().find("takes nothing more"), std::string::npos) << joined.message();
    EXPECT_NE(joined.message().find(persist_dir_), std::string::npos) << joined.message();
    EXPECT_EQ(c_->Wait(id, 300ms).code(), StatusCode::kTimeout) << "the push was answered";
  }
  const uint64_t msgs = (layout_.ServerChunks(0).size() + 3) / 4;
  EXPECT_EQ(shards_[0]->Stats().pushes_applied, applied + msgs);
  EXPECT_EQ(c_->acked_pushes(0), acked) << "push 1 was acknowledged";
  std::unique_ptr<ShardServer> fresh;
  ASSERT_TRUE(ShardServer::Create(layout_, ForServer(o_, 0), &fresh).ok());
  RecoverReport rep;
  const Status st = fresh->Recover(&rep);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_FALSE(rep.torn_tail);
  EXPECT_EQ(rep.replayed_pushes, 3 * msgs);  // the init, push 0 and the unacknowledged push 1
  ExpectSameShard(*shards_[0], *fresh, 0);
  shards_.clear();  // joined above, with the log's error (TearDown expects clean ends)
  c_.reset();       // before g goes
}

}  // namespace
}  // namespace downpour
