// Tests for downpour-launch with /bin/sh stand-ins for the coordinator, servers and workers:
// the run directory (config.toml with the overrides, logs, launch.jsonl), the arguments each
// role receives, prefixed output, failure exit codes, and that SIGKILL of the launcher
// takes its children with it.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "common/metrics.h"
#include "common/run_config.h"
#include "server/run_dir.h"
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
  std::string Command(const std::string& worker_script, const std::string& extra = "",
                      const std::string& run = "run") const {
    return fmt::format(
        "'{}' --config '{}/configs/runs/default.toml' --run-dir '{}' --grace-ms 2000 "
        "--timeout-s 60 --coordinator-cmd '/bin/sh {}' --server-cmd '/bin/sh {}' "
        "--worker-cmd '/bin/sh {}' {}",
        Launcher(), test::SourcePath(""), Path(run), Path("serve.sh"), Path("serve.sh"), Path(worker_script), extra);
  }
  // Runs a shell command (in `cwd` when given); returns its exit code and its stdout+stderr.
  static int Run(const std::string& cmd, std::string* output, const fs::path& cwd = {}) {
    return test::RunShell(cwd.empty() ? cmd : fmt::format("cd '{}' && {}", cwd.string(), cmd), output);
  }
  // inputs.toml: the default run with every input present (a stand-in LMDB is a directory with a
  // data.mdb; the launcher only checks that inputs exist before it starts anything).
  void WriteInputs() const {
    fs::create_directories(Path("lmdb"));
    Write("lmdb/data.mdb", "");
    Write("inputs.toml", fmt::format("[model]\nconfig = \"{}\"\n[data]\ntrain = \"{}\"\ntest = \"{}\"\n",
                                     test::SourcePath("configs/models/fmnist_small.toml"), Path("lmdb"), Path("lmdb")));
  }

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
  // Missing binary (no override, empty --bin-dir): names the program and the way out.
  WriteInputs();
  EXPECT_EQ(Run(fmt::format("'{}' --config '{}' --run-dir '{}' --bin-dir '{}'", Launcher(), Path("inputs.toml"),
                            Path("run"), Path("empty")),
                &out),
            2);
  EXPECT_THAT(out, HasSubstr("downpour-coordinator not found"));
  EXPECT_THAT(out, HasSubstr("--coordinator-cmd"));
  // An integer flag out of range names its bound (not a 300-digit limit).
  EXPECT_EQ(Run(fmt::format("'{}' --config '{}' --workers 0", Launcher(), Path("inputs.toml")), &out), 2);
  EXPECT_THAT(out, HasSubstr("--workers: 0 is out of range: must be >= 1"));
  EXPECT_LT(out.size(), 200u) << out;
  // --version and the exit-code scheme in --help.
  EXPECT_EQ(Run(fmt::format("'{}' --version", Launcher()), &out), 0);
  EXPECT_THAT(out, HasSubstr("downpour-launch "));
  EXPECT_THAT(out, HasSubstr("(commit "));
  EXPECT_EQ(Run(fmt::format("'{}' --help", Launcher()), &out), 0);
  EXPECT_THAT(out, HasSubstr("Exit codes: 0 ok, 1 runtime failure, 2 usage or config error."));
}

// Inputs are checked before any process starts: a missing train LMDB is one error naming the
// config key and the path, and nothing was started (no logs, no metrics).
TEST_F(LaunchTest, MissingTrainLmdbIsNamedBeforeAnythingStarts) {
  WriteInputs();
  std::string out;
  EXPECT_EQ(Run(fmt::format("'{}' --config '{}' --run-dir '{}' --set data.train={}", Launcher(), Path("inputs.toml"),
                            Path("run"), Path("no_such_lmdb")),
                &out),
            2);
  EXPECT_THAT(out, HasSubstr(fmt::format("data.train = \"{}\": no such LMDB directory", Path("no_such_lmdb"))));
  EXPECT_FALSE(fs::exists(Path("run"))) << "the launcher created the run before checking its inputs";
  // A directory that is not an LMDB, a missing mean file, missing initial weights.
  fs::create_directories(Path("not_lmdb"));
  EXPECT_EQ(Run(fmt::format("'{}' --config '{}' --run-dir '{}' --set data.test={}", Launcher(), Path("inputs.toml"),
                            Path("run"), Path("not_lmdb")),
                &out),
            2);
  EXPECT_THAT(out, HasSubstr("data.test = "));
  EXPECT_THAT(out, HasSubstr("holds no data.mdb"));
  EXPECT_EQ(Run(fmt::format("'{}' --config '{}' --run-dir '{}' --set data.mean_file=/nope/mean.binaryproto", Launcher(),
                            Path("inputs.toml"), Path("run")),
                &out),
            2);
  EXPECT_THAT(out, HasSubstr("data.mean_file = \"/nope/mean.binaryproto\": no such mean file"));
  EXPECT_EQ(Run(fmt::format("'{}' --config '{}' --run-dir '{}' --weights /nope/w.caffemodel", Launcher(),
                            Path("inputs.toml"), Path("run")),
                &out),
            2);
  EXPECT_THAT(out, HasSubstr("model.weights = \"/nope/w.caffemodel\": no such weights file"));
  EXPECT_FALSE(fs::exists(Path("run")));
}

// A run directory is never reused silently: a second launch into it is refused (and points at
// --resume), and the first run's files are untouched.
TEST_F(LaunchTest, ExistingRunDirectoryIsRefused) {
  Write("worker.sh", "exit 0\n");
  std::string out;
  ASSERT_EQ(Run(Command("worker.sh"), &out), 0) << out;
  const std::string before = test::ReadFile(Path("run/launch.jsonl"));
  EXPECT_EQ(Run(Command("worker.sh"), &out), 2);
  EXPECT_THAT(out, HasSubstr(fmt::format("run directory {} already holds a run", Path("run"))));
  EXPECT_THAT(out, HasSubstr("--resume"));
  EXPECT_EQ(test::ReadFile(Path("run/launch.jsonl")), before);
  // An empty directory is fine; a non-empty one without a run is refused too.
  fs::create_directories(Path("empty_dir"));
  fs::create_directories(Path("busy_dir"));
  Write("busy_dir/notes.txt", "mine\n");
  EXPECT_EQ(Run(Command("worker.sh", "", "empty_dir"), &out), 0) << out;
  EXPECT_EQ(Run(Command("worker.sh", "", "busy_dir"), &out), 2);
  EXPECT_THAT(out, HasSubstr("is not empty"));
}

// --resume restarts servers from their checkpoints (--restore) and workers from their saved
// progress (--resume), with the run's own config; what cannot be resumed is refused.
TEST_F(LaunchTest, ResumeRestoresServersAndWorkersAndRefusesWhatItCannot) {
  // A run that failed half-way (worker 1 exits 3) after its servers checkpointed.
  Write("worker.sh", "echo \"worker args: $*\"\nif [ \"$2\" = 1 ]; then exit 3; fi\nsleep 0.2\n");
  std::string out;
  const std::string run = Path("run");
  ASSERT_EQ(Run(Command("worker.sh", "--model alexnet-shapes"), &out), 3) << out;
  // Before any checkpoint: refused, naming the missing file.
  EXPECT_EQ(Run(fmt::format("'{}' --resume '{}'", Launcher(), run), &out), 2);
  EXPECT_THAT(out, HasSubstr("server 0 has no checkpoint"));
  fs::create_directories(run + "/checkpoints");
  Write("run/checkpoints/server-0.dpt", "x");
  Write("run/checkpoints/server-1.dpt", "x");
  // Changing the run while resuming it is refused.
  EXPECT_EQ(Run(fmt::format("'{}' --resume '{}' --set worker.steps=5", Launcher(), run), &out), 2);
  EXPECT_THAT(out, HasSubstr("cannot be combined"));
  // Resumed with stand-ins: the same roles, with --restore and --resume, logs appended.
  Write("worker.sh", "echo \"worker args: $*\"\n");
  ASSERT_EQ(Run(fmt::format("'{}' --resume '{}' --grace-ms 2000 --timeout-s 60 --coordinator-cmd '/bin/sh {}' "
                            "--server-cmd '/bin/sh {}' --worker-cmd '/bin/sh {}' --model alexnet-shapes",
                            Launcher(), run, Path("serve.sh"), Path("serve.sh"), Path("worker.sh")),
                &out),
            0)
      << out;
  EXPECT_THAT(out, HasSubstr("[launch] resuming run"));
  EXPECT_THAT(out, HasSubstr(fmt::format("[server 1] serving --id 1 --config {0}/config.toml --run-dir {0} --model "
                                         "alexnet-shapes --restore {0}/checkpoints/server-1.dpt",
                                         run)));
  EXPECT_THAT(out, HasSubstr(fmt::format(
                       "[worker 0] worker args: --id 0 --config {0}/config.toml --run-dir {0} --resume", run)));
  const std::string log = test::ReadFile(run + "/logs/worker-1.log");
  EXPECT_EQ(std::count(log.begin(), log.end(), '\n'), 2) << "the first launch's line and the resumed one:\n" << log;
  std::vector<MetricRecord> records;
  ASSERT_TRUE(ReadMetrics(run + "/launch.jsonl", &records).ok());
  int starts = 0;
  for (const auto& r : records) starts += r.Get("event").AsString() == "start";
  EXPECT_EQ(starts, 2);
  EXPECT_TRUE(records.back().Get("event").AsString() == "end" && records.back().Get("code").AsInt() == 0);
  // Finished now: refused. Not a run directory: refused.
  EXPECT_EQ(Run(fmt::format("'{}' --resume '{}'", Launcher(), run), &out), 2);
  EXPECT_THAT(out, HasSubstr("already finished"));
  EXPECT_EQ(Run(fmt::format("'{}' --resume '{}'", Launcher(), Path("empty")), &out), 2);
  EXPECT_THAT(out, HasSubstr("not a run directory"));
}

// --weights stores an absolute model.weights and eval.at_start in the run's config.
TEST_F(LaunchTest, WeightsFlagStartsFromSavedWeightsAndEvaluatesThemFirst) {
  Write("w.dpt", "stand-in weights");
  Write("worker.sh", "exit 0\n");
  std::string out;
  ASSERT_EQ(Run(Command("worker.sh", "--weights w.dpt"), &out, dir_), 0) << out;
  RunConfig stored;
  ASSERT_TRUE(LoadRunConfig(Path("run/config.toml"), &stored).ok());
  EXPECT_EQ(stored.model.weights, Path("w.dpt"));
  EXPECT_TRUE(stored.eval.at_start);
}

// SIGKILL of the launcher cannot be caught: the children's PR_SET_PDEATHSIG stops them.
TEST_F(LaunchTest, KillingTheLauncherLeavesNoChildren) {
  Write("worker.sh", fmt::format("echo $$ > {}/worker-$2.pid\nexec sleep 60\n", dir_.string()));
  test::Child launcher({"/bin/sh", "-c", "exec " + Command("worker.sh")}, Path("launcher.log"));
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
  launcher.Signal(SIGKILL);
  EXPECT_EQ(launcher.WaitExit(10s), 128 + SIGKILL);
  for (pid_t pid : workers) {
    bool gone = false;
    for (int i = 0; i < 250 && !gone; ++i) {
      gone = !test::Alive(pid);
      if (!gone) std::this_thread::sleep_for(20ms);
    }
    EXPECT_TRUE(gone) << "worker pid " << pid << " outlived the launcher";
    if (!gone) ::kill(pid, SIGKILL);
  }
}

}  // namespace
}  // namespace downpour

namespace downpour {
namespace {

// data.sharding = "own": each worker's LMDB is <train>/shard_<j>_of_<W> as downpour-data
// --shards W writes them, or <train>/<j>; a missing one is named before anything starts.
TEST(RunInputs, OwnShardingFindsTheConvertersShardsOrNumberedFolders) {
  const fs::path dir = test::ScratchDir("run_inputs");
  RunConfig c;
  c.model.config = test::SourcePath("configs/models/fmnist_small.toml");
  c.cluster.workers = 2;
  c.data.sharding = DataSharding::kOwn;
  c.data.train = (dir / "train").string();
  c.data.test = "";
  for (const char* shard : {"shard_0_of_2", "shard_1_of_2"}) {
    fs::create_directories(dir / "train" / shard);
    test::WriteFile(dir / "train" / shard / "data.mdb", "");
  }
  EXPECT_TRUE(CheckRunInputs(c, "run.toml").ok());
  EXPECT_EQ(OwnShardPath(c.data, 1, 2), (dir / "train" / "shard_1_of_2").string());
  fs::remove_all(dir / "train" / "shard_1_of_2");
  fs::create_directories(dir / "train" / "1");
  test::WriteFile(dir / "train" / "1" / "data.mdb", "");
  EXPECT_TRUE(CheckRunInputs(c, "run.toml").ok());
  EXPECT_EQ(OwnShardPath(c.data, 1, 2), (dir / "train" / "1").string());
  c.cluster.workers = 3;  // shard_0_of_2 is not worker 0's of 3, and there is no train/0
  const Status s = CheckRunInputs(c, "run.toml");
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("run.toml: data.train (sharding \"own\", worker 0)"));
  EXPECT_THAT(s.message(), HasSubstr((dir / "train" / "0").string() + "\": no such LMDB directory"));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace downpour
