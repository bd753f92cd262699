// ps_multiprocess_test.cc — the parameter service as real processes over real sockets:
// the downpour-coordinator and downpour-server binaries (fork/exec), worker processes (fork)
// with their own ZeroMQ clients. Exact-result async test, and SIGKILL + --restore.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "client/ps/ps_client.h"
#include "common/rendezvous.h"
#include "common/run_secret.h"
#include "common/zmq_transport.h"
#include "tests/testing/harness.h"
#include "tests/testing/job_config.h"

namespace downpour {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

using test::Child;

std::string ReadAddress(const fs::path& path, std::chrono::milliseconds timeout) {
  return test::WaitForWord(path, timeout);
}

class PsMultiProcess : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = test::ScratchDir("ps_mp");
    std::ofstream(dir_ / "tensors.txt") << "w 40x25 1 1\nb 40 2 0\nv 333\n";
    specs_ = {{"w", {40, 25}, 1, 1}, {"b", {40}, 2, 0}, {"v", {333}, 1, 1}};
    // The run's secret, which the coordinator and servers started with --run-dir require on
    // register messages (server/access.h); made before any of them starts, as the launcher does.
    ASSERT_TRUE(EnsureRunSecret(dir_.string(), &secret_).ok());
  }
  void WriteConfig(int servers, int workers, const std::string& mode = "async") {
    test::ExactUpdateJob(servers, workers).Set("consistency.mode", mode).Write(dir_ / "run.toml");
    ASSERT_TRUE(ParamLayout::Build(specs_, servers, 128, &layout_).ok());
  }
  // The run's coordinator on a free port (it writes the address to dir_/coordinator.addr).
  std::unique_ptr<Child> StartCoordinator() {
    return std::make_unique<Child>(
        std::vector<std::string>{test::Binary("downpour-coordinator"), "--config", (dir_ / "run.toml").string(),
                                 "--run-dir", dir_.string(), "--tensors", (dir_ / "tensors.txt").string(), "--port",
                                 "0"},
        dir_ / "coordinator.log");
  }
  std::unique_ptr<Child> StartServer(int id, const std::string& coordinator, const std::string& restore = "") {
    std::vector<std::string> argv = {test::Binary("downpour-server"), "--config", (dir_ / "run.toml").string(), "--id",
                                     std::to_string(id), "--run-dir", dir_.string(), "--tensors",
                                     (dir_ / "tensors.txt").string(), "--port", "0"};
    if (coordinator.empty()) {
      argv.push_back("--standalone");
    } else {
      argv.push_back("--coordinator");
      argv.push_back(coordinator);
    }
    if (!restore.empty()) {
      argv.push_back("--restore");
      argv.push_back(restore);
    }
    return std::make_unique<Child>(argv, dir_ / fmt::format("server-{}.log", id));
  }
  std::string Log(const std::string& name) { return test::ReadFile(dir_ / name); }
  // 2 servers, 4 worker processes, 25 async steps each: the servers end with exactly the
  // initial weights minus every gradient, each chunk at version 100, each push counted once.
  void RunExactWeights(bool pipelined);

  fs::path dir_;
  std::string secret_;
  std::vector<TensorSpec> specs_;
  ParamLayout layout_;
};

// The gradient worker w pushes at step s: small integers, so every order of float additions
// gives the same result and the final weights are exact.
float Grad(int w, int step, size_t i) { return static_cast<float>(((w + 1) * (step + 1) + static_cast<int>(i)) % 5 - 2); }

// Body of a forked worker process. Returns the exit code (0 = all good). `pipelined`: one chunk
// per message, payloads through shared memory, and each step's push and the next pull in flight
// together, so the four workers' chunks reach the servers interleaved.
// A worker process's registration with the coordinator (heartbeats every 100 ms from then on),
// and its client's options from what the coordinator said. False if it was refused.
bool RegisterWorker(ZmqTransport* transport, const std::string& coordinator, const std::string& token,
                    uint64_t layout_hash, std::unique_ptr<RendezvousClient>* link, PsClientOptions* o) {
  RendezvousOptions ro;
  ro.coordinator = coordinator;
  ro.token = token;
  ro.role = Role::kWorker;
  ro.layout_hash = layout_hash;
  ro.heartbeat_interval = 100ms;
  RendezvousInfo info;
  if (!RendezvousClient::Register(transport, ro, 20s, link, &info).ok()) return false;
  (*link)->StartHeartbeats(nullptr);
  o->server_addresses = info.server_addresses;
  o->worker_id = info.id;
  o->token = token;
  return true;
}

int WorkerProcess(const std::string& coordinator, const std::string& token, uint64_t layout_hash,
                  const ParamLayout& layout, int steps, bool pipelined = false) {
  ZmqTransport transport;
  std::unique_ptr<RendezvousClient> link;
  PsClientOptions o;
  if (!RegisterWorker(&transport, coordinator, token, layout_hash, &link, &o)) return 2;
  o.reply_timeout = 20s;
  if (pipelined) {
    o.max_chunks_per_message = 1;
    o.shared_memory = true;
  }
  std::unique_ptr<PsClient> c;
  if (!PsClient::Create(&transport, layout, o, &c).ok()) return 3;
  if (!c->Connect(20s).ok()) return 4;
  const size_t n = static_cast<size_t>(layout.total_elems());
  if (o.worker_id == 0 && !c->Wait(c->PushInit(std::vector<float>(n, 100.0f)), 20s).ok()) return 5;
  if (pipelined) {
    std::vector<float> w(n), g(n);
    if (!c->Wait(c->Pull(w, 0), 20s).ok()) return 6;  // waits for worker 0's init
    for (int step = 0; step < steps; ++step) {
      for (size_t i = 0; i < n; ++i) g[i] = Grad(o.worker_id, step, i);
      const RequestId push = c->Push(g, step);
      const RequestId pull = c->Pull(w, step + 1);
      if (!c->Wait(push, 20s).ok()) return 7;
      if (!c->Wait(pull, 20s).ok()) return 8;
    }
    return 0;
  }
  std::vector<float> w(n), g(n);
  for (int step = 0; step < steps; ++step) {
    if (!c->Wait(c->Pull(w, step), 20s).ok()) return 6;  // waits for worker 0's init
    for (size_t i = 0; i < n; ++i) g[i] = Grad(o.worker_id, step, i);
    if (!c->Wait(c->Push(g, step), 20s).ok()) return 7;
  }
  return 0;
}

void PsMultiProcess::RunExactWeights(bool pipelined) {
  constexpr int kServers = 2, kWorkers = 4, kSteps = 25;
  WriteConfig(kServers, kWorkers);
  std::unique_ptr<Child> coordinator = StartCoordinator();
  const std::string co = ReadAddress(dir_ / "coordinator.addr", 10s);
  ASSERT_FALSE(co.empty()) << Log("coordinator.log");
  std::vector<std::unique_ptr<Child>> servers;
  for (int s = 0; s < kServers; ++s) servers.push_back(StartServer(s, co));

  std::vector<std::unique_ptr<Child>> workers;
  for (int w = 0; w < kWorkers; ++w) {
    workers.push_back(
        std::make_unique<Child>([&] { return WorkerProcess(co, secret_, layout_.hash(), layout_, kSteps, pipelined); }));
  }
  for (auto& w : workers) {
    EXPECT_EQ(w->WaitExit(60s), 0) << Log("server-0.log") << Log("coordinator.log");
  }

  // Read back through a fresh client (the test process registers as observer worker id 0).
  ZmqTransport transport;
  PsClientOptions o;
  o.token = secret_;
  for (int s = 0; s < kServers; ++s) o.server_addresses.push_back(ReadAddress(dir_ / fmt::format("server-{}.addr", s), 5s));
  std::unique_ptr<PsClient> c;
  ASSERT_TRUE(PsClient::Create(&transport, layout_, o, &c).ok());
  ASSERT_TRUE(c->Connect(10s).ok());
  const size_t n = static_cast<size_t>(layout_.total_elems());
  std::vector<float> got(n), expect(n, 100.0f);
  // Worker ids are 0..W-1 in some order; the sum over all of them is order-free.
  for (int w = 0; w < kWorkers; ++w)
    for (int step = 0; step < kSteps; ++step)
      for (size_t i = 0; i < n; ++i) expect[i] -= Grad(w, step, i);
  ASSERT_TRUE(c->Wait(c->Pull(got), 10s).ok());
  EXPECT_EQ(got, expect);
  for (const Chunk& ch : layout_.chunks()) {
    EXPECT_EQ(c->last_versions()[static_cast<size_t>(ch.id)], kWorkers * kSteps) << "chunk " << ch.id;
  }
  for (int s = 0; s < kServers; ++s) {
    ShardStatsWire st;
    ASSERT_TRUE(c->Stats(s, &st, 5s).ok());
    // Each push to a server is ceil(chunks / max_chunks_per_message) messages, each counted once.
    const uint64_t per = pipelined ? 1 : static_cast<uint64_t>(PsClientOptions{}.max_chunks_per_message);
    const uint64_t parts = (layout_.ServerChunks(s).size() + per - 1) / per;
    EXPECT_EQ(st.pushes_received, parts * (kWorkers * kSteps + 1)) << "server " << s;
    EXPECT_EQ(st.pushes_applied, st.pushes_received) << "server " << s;
    EXPECT_EQ(st.pushes_rejected, 0u);
    if (pipelined) {  // every gradient push and every pull after the first went through the region
      EXPECT_GE(st.region_parts, 2 * parts * kWorkers * kSteps) << "server " << s;
    } else {
      EXPECT_EQ(st.region_parts, 0u) << "server " << s;
    }
    EXPECT_EQ(st.chunk_updates, static_cast<uint64_t>(kWorkers * kSteps) * layout_.ServerChunks(s).size());
  }
  // Orderly end: shutdown message to each server, then the coordinator.
  for (int s = 0; s < kServers; ++s) ASSERT_TRUE(c->Shutdown(s, 5s).ok());
  for (auto& s : servers) EXPECT_EQ(s->WaitExit(10s), 0);
  coordinator->Signal(SIGTERM);
  EXPECT_EQ(coordinator->WaitExit(10s), 0);
}

TEST_F(PsMultiProcess, TwoServersFourWorkerProcessesAsyncExactWeights) { RunExactWeights(false); }

// The same updates, exactly, with per-chunk pipelining: one chunk per message through shared
// memory, push and pull in flight together, the four workers' chunks interleaved at the servers.
TEST_F(PsMultiProcess, PipelinedPerChunkThroughSharedMemoryAppliesExactlyTheSameUpdates) { RunExactWeights(true); }

// Body of a forked sync worker: `steps` iterations of pull(clock t) -> push(g, t), gradient
// `grad` everywhere; then it exits (its heartbeats stop, as if it had crashed).
int SyncWorkerProcess(const std::string& coordinator, const std::string& token, const ParamLayout& layout, int steps,
                      float grad) {
  ZmqTransport transport;
  std::unique_ptr<RendezvousClient> link;
  PsClientOptions o;
  if (!RegisterWorker(&transport, coordinator, token, layout.hash(), &link, &o)) return 2;
  o.reply_timeout = 30s;
  std::unique_ptr<PsClient> c;
  if (!PsClient::Create(&transport, layout, o, &c).ok()) return 3;
  if (!c->Connect(20s).ok()) return 4;
  const size_t n = static_cast<size_t>(layout.total_elems());
  if (!c->Wait(c->PushInit(std::vector<float>(n, 0.0f)), 20s).ok()) return 5;  // first init wins
  std::vector<float> w(n), g(n, grad);
  for (int step = 0; step < steps; ++step) {
    if (!c->Wait(c->Pull(w, step), 30s).ok()) return 6;
    if (!c->Wait(c->Push(g, step), 30s).ok()) return 7;
  }
  return 0;
}

TEST_F(PsMultiProcess, SyncRunFinishesAfterAWorkerDiesByHeartbeatTimeout) {
  WriteConfig(2, 2, "sync");
  {  // a short heartbeat timeout keeps the test quick
    std::string text;
    {
      std::ifstream f(dir_ / "run.toml");
      text.assign(std::istreambuf_iterator<char>(f), {});
    }
    text.replace(text.find("heartbeat_timeout_ms = 2000"), 27, "heartbeat_timeout_ms = 600");
    std::ofstream(dir_ / "run.toml") << text;
  }
  std::unique_ptr<Child> coordinator = StartCoordinator();
  const std::string co = ReadAddress(dir_ / "coordinator.addr", 10s);
  ASSERT_FALSE(co.empty()) << Log("coordinator.log");
  std::vector<std::unique_ptr<Child>> servers;
  for (int s = 0; s < 2; ++s) servers.push_back(StartServer(s, co));
  // Both workers push the same gradient at a clock, so which id each gets does not matter:
  // the long-lived one pushes 2.0 for 10 clocks, the short-lived one 2.0 for 2 clocks and exits.
  constexpr int kLong = 10, kShort = 2;
  Child long_lived([&] { return SyncWorkerProcess(co, secret_, layout_, kLong, 2.0f); });
  Child short_lived([&] { return SyncWorkerProcess(co, secret_, layout_, kShort, 2.0f); });
  for (Child* w : {&short_lived, &long_lived}) {
    EXPECT_EQ(w->WaitExit(60s), 0) << Log("server-0.log") << Log("coordinator.log");
  }
  // Every clock applied once, as the average of the live workers' gradients (2.0): 10 steps.
  ZmqTransport transport;
  PsClientOptions o;
  o.token = secret_;
  for (int s = 0; s < 2; ++s) o.server_addresses.push_back(ReadAddress(dir_ / fmt::format("server-{}.addr", s), 5s));
  std::unique_ptr<PsClient> c;
  ASSERT_TRUE(PsClient::Create(&transport, layout_, o, &c).ok());
  ASSERT_TRUE(c->Connect(10s).ok());
  const size_t n = static_cast<size_t>(layout_.total_elems());
  std::vector<float> got(n);
  ASSERT_TRUE(c->Wait(c->Pull(got, kLong), 10s).ok());
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(got[i], -2.0f * kLong * (i >= 1000 && i < 1040 ? 2.0f : 1.0f)) << i;
  for (const Chunk& ch : layout_.chunks()) EXPECT_EQ(c->last_versions()[static_cast<size_t>(ch.id)], kLong);
  EXPECT_NE(Log("coordinator.log").find("declared dead"), std::string::npos);
  EXPECT_NE(Log("server-0.log").find("dropped from consistency accounting"), std::string::npos);
  for (int s = 0; s < 2; ++s) ASSERT_TRUE(c->Shutdown(s, 5s).ok());
  for (auto& s : servers) EXPECT_EQ(s->WaitExit(10s), 0);
}

TEST_F(PsMultiProcess, SigkilledServerRestoresExactlyTheCheckpoint) {
  WriteConfig(1, 1);
  auto server = StartServer(0, "");
  const std::string addr_file = (dir_ / "server-0.addr").string();
  ZmqTransport transport;
  PsClientOptions o;
  o.server_addresses = {ReadAddress(addr_file, 10s)};
  o.reply_timeout = 10s;
  ASSERT_FALSE(o.server_addresses[0].empty()) << Log("server-0.log");
  std::unique_ptr<PsClient> c;
  ASSERT_TRUE(PsClient::Create(&transport, layout_, o, &c).ok());
  ASSERT_TRUE(c->Connect(10s).ok());
  const size_t n = static_cast<size_t>(layout_.total_elems());
  std::vector<float> w0(n);
  for (size_t i = 0; i < n; ++i) w0[i] = 0.5f * static_cast<float>(i % 97);
  ASSERT_TRUE(c->Wait(c->PushInit(w0), 10s).ok());
  std::vector<float> g(n, 0.25f);
  for (int step = 0; step < 3; ++step) ASSERT_TRUE(c->Wait(c->Push(g, step), 10s).ok());
  const std::string ckpt = (dir_ / "ckpt" / "manual.dpt").string();
  ASSERT_TRUE(c->Checkpoint(0, ckpt, 10s).ok());
  std::vector<float> at_checkpoint(n);
  ASSERT_TRUE(c->Wait(c->Pull(at_checkpoint), 10s).ok());
  const std::vector<int64_t> versions_at_checkpoint(c->last_versions().begin(), c->last_versions().end());
  // More updates after the checkpoint: they must be lost by the kill.
  for (int step = 3; step < 5; ++step) ASSERT_TRUE(c->Wait(c->Push(g, step), 10s).ok());
  c.reset();

  server->Signal(SIGKILL);
  EXPECT_EQ(server->WaitExit(10s), 128 + SIGKILL);
  fs::remove(addr_file);
  server = StartServer(0, "", ckpt);
  o.server_addresses = {ReadAddress(addr_file, 10s)};
  ASSERT_FALSE(o.server_addresses[0].empty()) << Log("server-0.log");
  ASSERT_TRUE(PsClient::Create(&transport, layout_, o, &c).ok());
  ASSERT_TRUE(c->Connect(10s).ok());
  std::vector<float> restored(n);
  ASSERT_TRUE(c->Wait(c->Pull(restored), 10s).ok());
  EXPECT_EQ(restored, at_checkpoint);
  EXPECT_EQ(std::vector<int64_t>(c->last_versions().begin(), c->last_versions().end()), versions_at_checkpoint);
  // An init push after restore is ignored (the checkpoint's weights stay).
  ASSERT_TRUE(c->Wait(c->PushInit(std::vector<float>(n, -1.0f)), 10s).ok());
  ASSERT_TRUE(c->Wait(c->Pull(restored), 10s).ok());
  EXPECT_EQ(restored, at_checkpoint);
  ASSERT_TRUE(c->Shutdown(0, 5s).ok());
  EXPECT_EQ(server->WaitExit(10s), 0);
}

TEST_F(PsMultiProcess, CoordinatorRefusesAMismatchedLayoutNamingBothHashes) {
  WriteConfig(1, 1);
  std::unique_ptr<Child> coordinator = StartCoordinator();
  const std::string co = ReadAddress(dir_ / "coordinator.addr", 10s);
  ASSERT_FALSE(co.empty());
  ZmqTransport transport;
  RendezvousOptions ro;
  ro.coordinator = co;
  ro.token = secret_;
  ro.role = Role::kWorker;
  ro.layout_hash = layout_.hash() ^ 0xff;
  std::unique_ptr<RendezvousClient> link;
  RendezvousInfo info;
  Status s = RendezvousClient::Register(&transport, ro, 10s, &link, &info);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find(fmt::format("{:#018x}", layout_.hash())), std::string::npos) << s.message();
  EXPECT_NE(s.message().find(fmt::format("{:#018x}", layout_.hash() ^ 0xff)), std::string::npos) << s.message();
}

// A server waiting for a coordinator that is not there (yet) blocks SIGTERM to handle it, and
// must still stop on it: the launcher stops such servers when the job fails to start.
TEST_F(PsMultiProcess, AServerWaitingForTheCoordinatorStopsOnSigterm) {
  WriteConfig(1, 1);
  auto server = StartServer(0, fmt::format("127.0.0.1:{}", test::FreePort()));
  ASSERT_FALSE(ReadAddress(dir_ / "server-0.addr", 10s).empty());  // bound: now it waits to register
  server->Signal(SIGTERM);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_NE(server->WaitExit(5s), -1) << "the server ignored SIGTERM while it waited for the coordinator";
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s);
  EXPECT_NE(test::ReadFile(dir_ / "server-0.log").find("stopped while waiting for the coordinator"), std::string::npos)
      << test::ReadFile(dir_ / "server-0.log");
}

}  // namespace
}  // namespace downpour
