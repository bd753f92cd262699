// ipc_transport_test.cc — a job on one host over Unix domain sockets (cluster.transport = "ipc",
// given as `--set` on top of a tcp config, as users switch it): it trains, the servers listened
// on ipc://<run dir>/server-<i>.sock and told the workers so, a server SIGKILLed mid-run (its
// socket file left behind) is restarted on the same path and the job finishes, and no socket file
// is left at the end. And what the launcher refuses or warns about before starting anything:
// a run directory too deep for a socket path (naming cluster.ipc_dir), ipc with an off-host
// bind or a by-hand task whose coordinator is on another host (naming cluster.transport), and
// a chunk size that makes frames of 32 MiB or more (a warning, the job still runs).
// Every wait is bounded; every process is reaped (tests/testing/harness.h).
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "common/metrics.h"
#include "tests/testing/harness.h"
#include "tests/testing/job_config.h"

namespace downpour {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using ::testing::HasSubstr;

constexpr int kSteps = 150;

class IpcJobTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!test::HaveFashionMnist()) GTEST_SKIP() << "dataset-fashion-mnist missing";
    ASSERT_NO_FATAL_FAILURE(test::RequireJobBinaries());
    // Short: the run directory holds the socket files, whose paths must fit in 107 bytes.
    char tmpl[] = "/tmp/dp-ipcjob-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    if (!HasFailure() && !dir_.empty()) fs::remove_all(dir_);
  }

  // A plain tcp config (as every other test writes one); ipc comes from --set.
  std::string Config() {
    return test::FashionJob("fmnist_small", kSteps).Set("eval.test_batches", 20).Write(dir_ / "job.toml");
  }

  std::vector<std::string> LaunchArgv(const std::string& run, const std::vector<std::string>& extra) {
    std::vector<std::string> argv = {test::Binary("downpour-launch"), "--config", Config(), "--run-dir", run};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return argv;
  }

  fs::path dir_;
};

TEST_F(IpcJobTest, JobOverIpcTrainsSurvivesAServerKillAndLeavesNoSocketFile) {
  const fs::path run = dir_ / "run";
  test::Child launcher(LaunchArgv(run.string(), {"--set", "cluster.transport=ipc"}), dir_ / "launch.log");
  ASSERT_TRUE(test::WaitWorkerSteps(run, 0, kSteps / 3, 120s)) << test::ReadFile(dir_ / "launch.log");
  // The servers listen on their socket files and told the coordinator so.
  for (int s = 0; s < 2; ++s) {
    EXPECT_EQ(test::ReadFile(run / fmt::format("server-{}.addr", s)),
              fmt::format("ipc://{}/server-{}.sock\n", run.string(), s));
  }
  // SIGKILL leaves server 1's socket file behind; its restart (--recover) binds the same path.
  const pid_t server1 = test::ChildWith(launcher.pid(), {"downpour-server", "--id 1 "});
  ASSERT_GT(server1, 0) << "server 1 not found among the launcher's children";
  ASSERT_EQ(::kill(server1, SIGKILL), 0);
  ASSERT_EQ(launcher.WaitExit(150s), 0) << test::ReadFile(dir_ / "launch.log");

  const std::string server1_log = test::ReadFile(run / "logs" / "server-1.log");
  EXPECT_THAT(server1_log, HasSubstr("recovered"));
  EXPECT_THAT(server1_log, HasSubstr(fmt::format("listening on ipc://{}/server-1.sock", run.string())));
  for (int w = 0; w < 2; ++w) {
    const auto done = test::Metrics(run, fmt::format("worker-{}.jsonl", w), "done");
    ASSERT_EQ(done.size(), 1u) << "worker " << w;
    EXPECT_EQ(done[0].Get("steps").AsInt(), kSteps) << "worker " << w;
  }
  // The evaluator read the servers over ipc too.
  const auto evals = test::Metrics(run, "evaluator.jsonl", "eval");
  ASSERT_FALSE(evals.empty());
  ASSERT_TRUE(evals.back().Get("final").AsBool());
  // 2 × 150 × 32 = 9,600 images: well past chance (10%).
  EXPECT_GT(evals.back().Get("top1").AsDouble(), 0.6);
  // The stored config says ipc; the servers removed their socket files when they stopped.
  EXPECT_THAT(test::ReadFile(run / "config.toml"), HasSubstr("transport = \"ipc\""));
  for (int s = 0; s < 2; ++s) EXPECT_FALSE(fs::exists(run / fmt::format("server-{}.sock", s))) << "server " << s;
}

TEST_F(IpcJobTest, RunDirTooDeepForASocketPathIsRefusedNamingIpcDir) {
  const fs::path run = dir_ / std::string(100, 'd');
  std::string out;
  EXPECT_EQ(test::RunCommand(LaunchArgv(run.string(), {"--set", "cluster.transport=ipc"}), &out), 2) << out;
  EXPECT_THAT(out, HasSubstr("cluster.ipc_dir = \"\" (the run directory)"));
  EXPECT_THAT(out, HasSubstr("longer than the 107 a Unix socket path can hold"));
  EXPECT_FALSE(fs::exists(run / "config.toml")) << "refused, yet the run directory was made";
  // A short cluster.ipc_dir makes the same run directory work (checked without starting: --dry-run).
  const fs::path sockets = dir_ / "s";
  fs::create_directories(sockets);
  EXPECT_EQ(test::RunCommand(LaunchArgv(run.string(), {"--set", "cluster.transport=ipc", "--set",
                                                       "cluster.ipc_dir=" + sockets.string(), "--dry-run"}),
                             &out),
            0)
      << out;
}

TEST_F(IpcJobTest, IpcAcrossHostsIsRefusedNamingTransport) {
  std::string out;
  // An off-host bind (allowed for tcp with security.insecure) is a job across hosts.
  EXPECT_EQ(test::RunCommand(LaunchArgv((dir_ / "r1").string(), {"--set", "cluster.transport=ipc", "--set",
                                                                 "cluster.bind=0.0.0.0", "--set",
                                                                 "security.insecure=true", "--dry-run"}),
                             &out),
            2)
      << out;
  EXPECT_THAT(out, HasSubstr("--set cluster.transport=ipc: cluster.transport = \"ipc\""));
  // A by-hand task whose coordinator is another host.
  EXPECT_EQ(test::RunCommand(LaunchArgv((dir_ / "r2").string(), {"--set", "cluster.transport=ipc", "--role", "server",
                                                                 "--id", "0", "--coordinator", "10.9.8.7:5555",
                                                                 "--dry-run"}),
                             &out),
            2)
      << out;
  EXPECT_THAT(out, HasSubstr("cluster.transport = \"ipc\" needs every process of the job on one host"));
  EXPECT_THAT(out, HasSubstr("--coordinator 10.9.8.7:5555 is not a loopback address"));
}

TEST_F(IpcJobTest, ChunksOf32MiBAreWarnedNotRefused) {
  std::string out;
  EXPECT_EQ(test::RunCommand(LaunchArgv((dir_ / "big").string(), {"--set", "cluster.chunk_elems=8388608", "--dry-run"}),
                             &out),
            0)
      << out;
  EXPECT_THAT(out, HasSubstr("[launch] warning: cluster.chunk_elems = 8388608 makes payload frames of 32.0 MiB"));
  EXPECT_THAT(out, HasSubstr("mmap threshold"));
  std::string quiet;
  EXPECT_EQ(test::RunCommand(LaunchArgv((dir_ / "small").string(), {"--dry-run"}), &quiet), 0) << quiet;
  EXPECT_THAT(quiet, ::testing::Not(HasSubstr("warning: cluster.chunk_elems")));
}

}  // namespace
}  // namespace downpour
