// Tests for downpour-launch with /bin/sh stand-ins for the coordinator, servers and workers:
// the run directory (config.toml with the overrides, logs, launch.jsonl), the arguments each
// role receives, prefixed output, failure exit codes, and that SIGKILL of the launcher
// takes its children with it.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/metrics.h"
#include "common/run_config.h"
#include "tests/testing/harness.h"

namespace downpour {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

std::string Launcher() { return test::Binary("downpour-launch"); }

class LaunchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = test::ScratchDir("launch_test");
    // A server/coordinator stand-in: says what it got, exits 0 on SIGTERM.
    Write("serve.sh", "trap 'echo stopping; exit 0' TERM\necho \"serving $*\"\n"
                      "while :; do sleep 0.05; done\n");
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string Path(const std::string& name) const { return (dir_ / name).string(); }
  void Write(const std::string& name, const std::string& text) const { test::WriteFile(Path(name), text); }
  std::string Command(const std::string& worker_script, const std::string& extra = "") const {
    return fmt::format(
        "'{}' --config '{}/configs/runs/default.toml' --run-dir '{}' --grace-ms 2000 "
        "--timeout-s 60 --coordinator-cmd '/bin/sh {}' --server-cmd '/bin/sh {}' "
        "--worker-cmd '/bin/sh {}' {}",
        Launcher(), test::SourcePath(""), Path("run"), Path("serve.sh"), Path("serve.sh"),
        Path(worker_script), extra);
  }
  // Runs a shell command; returns its exit code and its stdout+stderr.
  static int Run(const std::string& cmd, std::string* output) { return test::RunShell(cmd, output); }

  fs::path dir_;
};

TEST_F(LaunchTest, RunsAJobAndFillsTheRunDirectory) {
  Write("worker.sh", "echo \"worker args: $*\"\nsleep 0.2\necho finished\n");
  std::string out;
  ASSERT_EQ(Run(Command("worker.sh", "--servers 3 --workers 2 --model alexnet-shapes"), &out), 0)
      << out;
  const std::string run = Path("run");
  // Prefixed forwarding of every role.
  EXPECT_THAT(out, HasSubstr(fmt::format("[worker 1] worker args: --id 1 --config {0}/config.toml "
                                         "--run-dir {0}\n", run)));
  EXPECT_THAT(out, HasSubstr(fmt::format("[server 2] serving --id 2 --config {0}/config.toml "
                                         "--run-dir {0} --model alexnet-shapes\n", run)));
  EXPECT_THAT(out, HasSubstr(fmt::format("[coordinator] serving --config {0}/config.toml "
                                         "--run-dir {0} --model alexnet-shapes\n", run)));
  EXPECT_THAT(out, HasSubstr("[server 0] stopping"));  // stopped gracefully after the workers
  EXPECT_THAT(out, HasSubstr("all primaries exited 0"));
  // The stored config is the example plus the overrides, and loads.
  RunConfig stored, example;
  ASSERT_TRUE(LoadRunConfig(run + "/config.toml", &stored).ok());
  ASSERT_TRUE(LoadRunConfig(test::SourcePath("configs/runs/default.toml"), &example).ok());
  example.cluster.servers = 3;
  example.cluster.workers = 2;
  EXPECT_EQ(stored, example);
  // One raw log per child.
  EXPECT_EQ(test::ReadFile(run + "/logs/worker-0.log"),
            fmt::format("worker args: --id 0 --config {0}/config.toml --run-dir {0}\nfinished\n", run));
  for (const char* log : {"coordinator.log", "server-0.log", "server-1.log", "server-2.log", "worker-1.log"}) {
    EXPECT_TRUE(fs::exists(run + "/logs/" + log)) << log;
  }
  // Launcher metrics: start, one exit per child, end.
  std::vector<MetricRecord> records;
  ASSERT_TRUE(ReadMetrics(run + "/launch.jsonl", &records).ok());
  ASSERT_EQ(records.size(), 1u + 6u + 1u);
  EXPECT_EQ(records.front().Get("event").AsString(), "start");
  EXPECT_EQ(records.back().Get("event").AsString(), "end");
  EXPECT_EQ(records.back().Get("code").AsInt(), 0);
}

TEST_F(LaunchTest, FailingWorkerStopsEverythingAndSetsTheExitCode) {
  // Worker 1 fails; worker 0 would run for a minute.
  Write("worker.sh", "if [ \"$2\" = 1 ]; then sleep 0.2; echo boom; exit 7; fi\nexec sleep 60\n");
  std::string out;
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(Run(Command("worker.sh"), &out), 7) << out;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 20s);
  EXPECT_THAT(out, HasSubstr("[worker 1] boom"));
  EXPECT_THAT(out, HasSubstr("[launch] worker 1 exited with code 7; stopping all"));
}

TEST_F(LaunchTest, BadInputGivesOneClearError) {
  std::string out;
  EXPECT_EQ(Run(fmt::format("'{}' --config /nonexistent/run.toml", Launcher()), &out), 2);
  EXPECT_THAT(out, HasSubstr("/nonexistent/run.toml"));
  out.clear();
  // Missing binary (no override, empty --bin-dir): names the program and the way out.
  EXPECT_EQ(Run(fmt::format("'{}' --config '{}/configs/runs/default.toml' --run-dir '{}' --bin-dir '{}'",
                            Launcher(), test::SourcePath(""), Path("run"), Path("empty")),
                &out),
            2);
  EXPECT_THAT(out, HasSubstr("downpour-coordinator not found"));
  EXPECT_THAT(out, HasSubstr("--coordinator-cmd"));
}

// SIGKILL of the launcher cannot be caught: the children's PR_SET_PDEATHSIG stops them.
TEST_F(LaunchTest, KillingTheLauncherLeavesNoChildren) {
  Write("worker.sh", fmt::format("echo $$ > {}/worker-$2.pid\nexec sleep 60\n", dir_.string()));
  const pid_t launcher = ::fork();
  ASSERT_GE(launcher, 0);
  if (launcher == 0) {
    ::execl("/bin/sh", "sh", "-c", ("exec " + Command("worker.sh") + " >/dev/null 2>&1").c_str(),
            static_cast<char*>(nullptr));
    ::_exit(127);
  }
  std::vector<pid_t> workers;
  for (int j = 0; j < 2; ++j) {
    pid_t pid = -1;
    for (int i = 0; i < 250 && pid <= 0; ++i) {
      std::ifstream(Path(fmt::format("worker-{}.pid", j))) >> pid;
      if (pid <= 0) std::this_thread::sleep_for(20ms);
    }
    ASSERT_GT(pid, 0) << "worker " << j << " never started";
    workers.push_back(pid);
  }
  ::kill(launcher, SIGKILL);
  int status = 0;
  ::waitpid(launcher, &status, 0);
  for (pid_t pid : workers) {
    bool gone = false;
    for (int i = 0; i < 250 && !gone; ++i) {
      std::ifstream stat(fmt::format("/proc/{}/stat", pid));
      std::string p, comm, state;
      gone = !(stat >> p >> comm >> state) || state == "Z";
      if (!gone) std::this_thread::sleep_for(20ms);
    }
    EXPECT_TRUE(gone) << "worker pid " << pid << " outlived the launcher";
    if (!gone) ::kill(pid, SIGKILL);
  }
}

}  // namespace
}  // namespace downpour
