// A cluster job as separate hosts would run it, on one machine: the coordinator, two servers and
// two workers each bound to an address of its own in 127.0.0.0/8 (the whole range is local), each
// started by hand (`downpour-launch --role ... --coordinator ... --bind ... --advertise ...`) with
// a run directory of its own (no shared file system: the run's secret is copied from the
// coordinator's "host" to the others, as docs/cluster.md says). The job must train, end by itself
// once the workers are done, and the coordinator's and servers' logs must show each peer at the
// address it was given. The same by-hand job over IPv6 (::1, bracketed addresses) must run too.
// Fashion-MNIST IDX files from Debian's dataset-fashion-mnist.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "common/metrics.h"
#include "common/net_address.h"
#include "tests/testing/harness.h"
#include "tests/testing/job_config.h"

namespace downpour {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

// The addresses of the five "hosts".
const char* kCoordinatorHost = "127.0.0.2";
const char* kServerHosts[] = {"127.0.0.3", "127.0.0.4"};
const char* kWorkerHosts[] = {"127.0.0.5", "127.0.0.6"};

class MultiAddressTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!test::HaveFashionMnist()) GTEST_SKIP() << "dataset-fashion-mnist missing";
    ASSERT_NO_FATAL_FAILURE(test::RequireJobBinaries());
    dir_ = test::ScratchDir("multi_address");
  }
  // One config for every host, as a cluster job has; only the ports are this test's own. The
  // default job's net (fmnist_fast): 250 steps end at 81.9% top-1 (2026-11-28), past the 75%
  // asked below.
  std::string WriteConfig(const std::string& coordinator_host = kCoordinatorHost, int servers = 2, int workers = 2,
                          int steps = 250, int test_batches = 0) {
    test::JobConfig job = test::FashionJob("fmnist_fast", steps, servers, workers);
    coordinator_port_ = static_cast<int>(job.Int("cluster.base_port")) - 1;
    coordinator_ = FormatHostPort(coordinator_host, coordinator_port_);
    return job.Set("run.name", "multi-address")
        .Set("run.seed", 1)
        .Set("cluster.coordinator", coordinator_)
        .Set("cluster.heartbeat_timeout_ms", 3000)
        .Set("solver.lr_policy", "inv")
        .Set("solver.gamma", 0.0001)
        .Set("solver.power", 0.75)
        .Set("solver.momentum", 0.9)
        .Set("solver.weight_decay", 0.0005)
        .Set("worker.batch_size", 64)
        .Set("eval.test_batches", test_batches)
        .Write(dir_ / "job.toml");
  }

  // `downpour-launch --role ROLE [--id I]` on "host" `host` with its own run directory.
  std::unique_ptr<test::Child> Start(const std::string& config, const std::string& role, int id,
                                     const std::string& host) {
    const std::string name = id < 0 ? role : fmt::format("{}-{}", role, id);
    std::vector<std::string> argv = {test::Binary("downpour-launch"),
                                     "--config",
                                     config,
                                     "--run-dir",
                                     RunDir(name).string(),
                                     "--role",
                                     role,
                                     "--coordinator",
                                     coordinator_,
                                     "--bind",
                                     host,
                                     "--grace-ms",
                                     "2000",
                                     "--timeout-s",
                                     "240"};
    if (id >= 0) argv.insert(argv.end(), {"--id", std::to_string(id)});
    if (role != "worker") argv.insert(argv.end(), {"--advertise", host});
    return std::make_unique<test::Child>(argv, dir_ / (name + ".out"));
  }

  // Each "host"'s run directory, or one for all (a shared file system).
  fs::path RunDir(const std::string& host_name) const {
    return dir_ / (shared_run_dir_ ? "shared" : host_name) / "run";
  }
  std::string Out(const std::string& name) const { return test::ReadFile(dir_ / (name + ".out")); }
  std::string Log(const std::string& name) const { return test::ReadFile(RunDir(name) / "logs" / (name + ".log")); }

  fs::path dir_;
  int coordinator_port_ = 0;
  std::string coordinator_;  // host:port
  bool shared_run_dir_ = false;
};

TEST_F(MultiAddressTest, EveryProcessOnItsOwnAddressTrainsAndIsSeenThere) {
  const std::string config = WriteConfig();
  auto coordinator = Start(config, "coordinator", -1, kCoordinatorHost);
  // No shared file system: the other "hosts" get a copy of the run's secret (mode 0600), made
  // by the coordinator's launcher before it started anything.
  const fs::path secret = RunDir("coordinator") / "secret";
  ASSERT_FALSE(test::WaitForWord(secret, 30s).empty()) << Out("coordinator");
  for (const std::string name : {"server-0", "server-1", "worker-0", "worker-1"}) {
    fs::create_directories(RunDir(name));
    fs::copy_file(secret, RunDir(name) / "secret");
    fs::permissions(RunDir(name) / "secret", fs::perms::owner_read | fs::perms::owner_write);
  }
  std::vector<std::unique_ptr<test::Child>> servers, workers;
  for (int i = 0; i < 2; ++i) servers.push_back(Start(config, "server", i, kServerHosts[i]));
  for (int j = 0; j < 2; ++j) workers.push_back(Start(config, "worker", j, kWorkerHosts[j]));

  for (int j = 0; j < 2; ++j) {
    EXPECT_EQ(workers[j]->WaitExit(240s), 0) << "worker " << j << ":\n" << Out(fmt::format("worker-{}", j));
  }
  // The run ends by itself: the coordinator sees every worker done and tells the servers.
  EXPECT_EQ(coordinator->WaitExit(60s), 0) << Out("coordinator");
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(servers[i]->WaitExit(60s), 0) << "server " << i << ":\n" << Out(fmt::format("server-{}", i));
  }

  // Each task said where its role came from and ran exactly that one process.
  EXPECT_THAT(Out("server-1"), HasSubstr("[launch] started by hand (--role server --id 1): server 1"));
  // Trained: the evaluator's final evaluation on the whole test set. The coordinator's task ran
  // the evaluator as its second child, from the coordinator's address.
  const std::vector<MetricRecord> evals = test::Metrics(RunDir("coordinator"), "evaluator.jsonl", "eval");
  ASSERT_FALSE(evals.empty()) << Out("coordinator");
  EXPECT_TRUE(evals.back().Get("final").AsBool());
  EXPECT_GT(evals.back().Get("top1").AsDouble(), 0.75) << "final test accuracy";
  std::printf("final test accuracy %.4f\n", evals.back().Get("top1").AsDouble());
  EXPECT_TRUE(test::Metrics(RunDir("worker-0"), "worker-0.jsonl", "eval").empty()) << "a worker evaluated";
  // Each process is seen at its own address: servers and workers by the coordinator, workers by
  // the servers; the servers advertise, and the workers were given, the servers' addresses.
  const std::string coordinator_log = Log("coordinator");
  for (int i = 0; i < 2; ++i) {
    EXPECT_THAT(coordinator_log, HasSubstr(fmt::format("server {} at tcp://{}:{} registered from {}", i,
                                                       kServerHosts[i], coordinator_port_ + 1 + i, kServerHosts[i])));
  }
  for (int j = 0; j < 2; ++j) {
    EXPECT_THAT(coordinator_log, HasSubstr(fmt::format("worker {} registered from {}", j, kWorkerHosts[j])));
    for (int i = 0; i < 2; ++i) {
      EXPECT_THAT(Log(fmt::format("server-{}", i)),
                  HasSubstr(fmt::format("worker {} registered from {}", j, kWorkerHosts[j])));
    }
  }
  EXPECT_THAT(Log("server-0"), HasSubstr(fmt::format("listening on tcp://{0}:{1}, advertised as tcp://{0}:{1}",
                                                     kServerHosts[0], coordinator_port_ + 1)));
  // Every host holds its own part of the run directory, and nothing else.
  EXPECT_TRUE(fs::exists(RunDir("server-1") / "launch-server-1.jsonl"));
  EXPECT_TRUE(fs::exists(RunDir("server-1") / "metrics" / "server-1.jsonl"));
  EXPECT_FALSE(fs::exists(RunDir("server-1") / "metrics" / "worker-0.jsonl"));
  EXPECT_TRUE(fs::exists(RunDir("coordinator") / "model_final.dpt"));
  EXPECT_THAT(Log("coordinator"), HasSubstr(fmt::format("the evaluator registered from {}", kCoordinatorHost)));
}

// The same over IPv6: everything on ::1, the coordinator given as [::1]:PORT, servers
// advertised (and workers handed) tcp://[::1]:PORT. One run directory (a shared file system).
TEST_F(MultiAddressTest, IPv6ByHandJobRuns) {
  shared_run_dir_ = true;
  const std::string config = WriteConfig("::1", 1, 1, 30, 5);
  auto coordinator = Start(config, "coordinator", -1, "::1");
  auto server = Start(config, "server", 0, "::1");
  auto worker = Start(config, "worker", 0, "::1");
  EXPECT_EQ(worker->WaitExit(180s), 0) << Out("worker-0") << Log("worker-0");
  EXPECT_EQ(coordinator->WaitExit(60s), 0) << Out("coordinator");
  EXPECT_EQ(server->WaitExit(60s), 0) << Out("server-0");
  EXPECT_THAT(Log("coordinator"),
              HasSubstr(fmt::format("server 0 at tcp://[::1]:{} registered from ::1", coordinator_port_ + 1)));
  EXPECT_THAT(Log("server-0"), HasSubstr("worker 0 registered from ::1"));
  const std::vector<MetricRecord> evals = test::Metrics(RunDir("coordinator"), "evaluator.jsonl", "eval");
  ASSERT_FALSE(evals.empty()) << Out("coordinator");
  EXPECT_TRUE(evals.back().Get("final").AsBool());
}

}  // namespace
}  // namespace downpour
