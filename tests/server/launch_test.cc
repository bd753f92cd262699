// Tests for downpour-launch with /bin/sh stand-ins for the coordinator, servers and workers:
// the run directory (config.toml with the overrides, logs, launch.jsonl), the arguments each
// role receives, prefixed output, failure exit codes, and that SIGKILL of the launcher
// takes its children with it. Supervision: a dead server restarted with --recover, a dead
// coordinator with --rejoin, a dead worker reported and gone on without (or restarted with
// --resume under --restart-workers), worker 0's restart, the died/restart records. Cluster mode (--slurm, --mpi, --role) with fake environments:
// each task's one role and its arguments, its own part of the run directory, and bad input
// (task count, node list, key files, advertise host) refused before anything starts.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include "common/metrics.h"
#include "common/run_config.h"
#include "common/security.h"
#include "server/run_dir.h"
#include "tests/testing/harness.h"

namespace downpour {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;
using namespace std::chrono_literals;

std::string Launcher() { return test::Binary("downpour-launch"); }

class LaunchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = test::ScratchDir("launch_test");
    // A server/coordinator stand-in: says what it got (and leaves a file serving.<pid> once it
    // has), exits 0 on SIGTERM.
    Write("serve.sh", fmt::format("trap 'echo stopping; exit 0' TERM\necho \"serving $*\"\ntouch '{}/serving.'$$\n"
                                  "while :; do sleep 0.05; done\n",
                                  dir_.string()));
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
  example.eval.evaluator = false;  // stand-in workers train nothing an evaluator could read
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

// The records of one kind in a launch.jsonl.
std::vector<MetricRecord> Records(const std::string& path, const std::string& event) {
  std::vector<MetricRecord> all, out;
  EXPECT_TRUE(ReadMetrics(path, &all).ok()) << path;
  for (const MetricRecord& r : all) {
    if (r.Get("event").AsString() == event) out.push_back(r);
  }
  return out;
}

// A worker that dies is reported and the job goes on without it (cluster.restart_workers = 0):
// the others finish and the job exits 0.
TEST_F(LaunchTest, DeadWorkerIsReportedAndTheJobGoesOnWithoutIt) {
  Write("worker.sh", "if [ \"$2\" = 1 ]; then echo boom; exit 7; fi\nsleep 0.6\necho finished\n");
  std::string out;
  EXPECT_EQ(Run(Command("worker.sh"), &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("[worker 1] boom"));
  EXPECT_THAT(out, ::testing::ContainsRegex(
                       R"(\[launch\] worker 1 exited with code 7 after [0-9.]+ s; the job goes on without it )"
                       R"(\(cluster.restart_workers = 0\))"));
  EXPECT_THAT(out, HasSubstr("[worker 0] finished"));
  EXPECT_THAT(out, HasSubstr("all primaries done: 1 exited 0, 1 given up (worker 1)"));
  const std::string jsonl = Path("run/launch.jsonl");
  const auto died = Records(jsonl, "died");
  ASSERT_EQ(died.size(), 1u);
  EXPECT_EQ(died[0].Get("child").AsString(), "worker 1");
  EXPECT_EQ(died[0].Get("code").AsInt(), 7);
  EXPECT_EQ(died[0].Get("signal").AsInt(), 0);
  EXPECT_EQ(died[0].Get("action").AsString(), "continue");
  EXPECT_TRUE(died[0].Get("seconds").is_number());
  ASSERT_EQ(Records(jsonl, "given_up").size(), 1u);
  EXPECT_EQ(Records(jsonl, "given_up")[0].Get("child").AsString(), "worker 1");
  EXPECT_TRUE(Records(jsonl, "restart").empty());
  for (const MetricRecord& r : Records(jsonl, "exit")) {
    EXPECT_EQ(r.Get("given_up").AsBool(), r.Get("child").AsString() == "worker 1") << r.Get("child").AsString();
  }
}

// Worker 0 makes the final evaluation: restarted once with --resume even with
// cluster.restart_workers = 0, and its next death fails the job with its exit code.
TEST_F(LaunchTest, Worker0IsRestartedOnceThenItsDeathFailsTheJob) {
  Write("worker.sh", fmt::format("echo \"$*\" >> {}/worker-$2.args\nif [ \"$2\" = 0 ]; then exit 7; fi\nexec sleep 60\n",
                                 dir_.string()));
  std::string out;
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(Run(Command("worker.sh"), &out), 7) << out;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 20s);
  EXPECT_THAT(out, ::testing::ContainsRegex(R"(\[launch\] worker 0 exited with code 7 after [0-9.]+ s; restarting it )"
                                            R"(with --resume, as worker 0 makes the final evaluation \(restart 1 of 1\))"));
  EXPECT_THAT(out, ::testing::ContainsRegex(
                       R"(\[launch\] worker 0 exited with code 7 after [0-9.]+ s; it died a 2nd time \(limit 1 for )"
                       R"(worker 0, which makes the final evaluation; cluster.restart_workers = 0\); stopping all)"));
  const std::string run = Path("run");
  EXPECT_EQ(test::ReadFile(Path("worker-0.args")),
            fmt::format("--id 0 --config {0}/config.toml --run-dir {0}\n--id 0 --config {0}/config.toml --run-dir {0} "
                        "--resume\n",
                        run));
  const auto end = Records(run + "/launch.jsonl", "end");
  ASSERT_EQ(end.size(), 1u);
  EXPECT_EQ(end[0].Get("code").AsInt(), 7);
}

// A server that is SIGKILLed is restarted with --recover, a coordinator that dies with --rejoin;
// the job then finishes with 0, and launch.jsonl tells when each died and came back.
TEST_F(LaunchTest, DeadServerAndCoordinatorAreRestartedWithRecoverAndRejoin) {
  const std::string d = dir_.string();
  Write("server.sh", fmt::format("echo \"$*\" >> {}/server-$2.args\n"
                                 "case \"$*\" in *--recover*) ;; *) if [ \"$2\" = 1 ]; then kill -KILL $$; fi ;; esac\n"
                                 "trap 'exit 0' TERM\nwhile :; do sleep 0.05; done\n",
                                 d));
  Write("coordinator.sh", fmt::format("echo \"$*\" >> {}/coordinator.args\n"
                                      "case \"$*\" in *--rejoin*) ;; *) sleep 0.3; exit 4 ;; esac\n"
                                      "trap 'exit 0' TERM\nwhile :; do sleep 0.05; done\n",
                                      d));
  // The workers finish once both came back (bounded: 10 s).
  Write("worker.sh", fmt::format("i=0; while [ $i -lt 200 ]; do\n"
                                 "  [ \"$(cat {0}/server-1.args {0}/coordinator.args 2>/dev/null | wc -l)\" -ge 4 ] && break\n"
                                 "  sleep 0.05; i=$((i+1)); done\n",
                                 d));
  std::string out;
  const std::string run = Path("run");
  ASSERT_EQ(Run(fmt::format("'{}' --config '{}/configs/runs/default.toml' --run-dir '{}' --grace-ms 2000 --timeout-s 60 "
                            "--coordinator-cmd '/bin/sh {}' --server-cmd '/bin/sh {}' --worker-cmd '/bin/sh {}' "
                            "--model alexnet-shapes",
                            Launcher(), test::SourcePath(""), run, Path("coordinator.sh"), Path("server.sh"),
                            Path("worker.sh")),
                &out),
            0)
      << out;
  const std::string server_args = fmt::format("--id 1 --config {0}/config.toml --run-dir {0} --model alexnet-shapes", run);
  EXPECT_EQ(test::ReadFile(Path("server-1.args")), server_args + "\n" + server_args + " --recover\n");
  EXPECT_EQ(test::ReadFile(Path("server-0.args")), fmt::format("--id 0 --config {0}/config.toml --run-dir {0} --model "
                                                               "alexnet-shapes\n",
                                                               run));
  const std::string coordinator_args = fmt::format("--config {0}/config.toml --run-dir {0} --model alexnet-shapes", run);
  EXPECT_EQ(test::ReadFile(Path("coordinator.args")), coordinator_args + "\n" + coordinator_args + " --rejoin\n");
  EXPECT_THAT(out, ::testing::ContainsRegex(R"(\[launch\] server 1 was killed by signal 9 \(Killed\) after [0-9.]+ s; )"
                                            R"(restarting it with --recover \(restart 1 of 3\))"));
  EXPECT_THAT(out, ::testing::ContainsRegex(R"(\[launch\] coordinator exited with code 4 after [0-9.]+ s; restarting )"
                                            R"(it with --rejoin \(restart 1 of 3\))"));
  EXPECT_THAT(out, ::testing::ContainsRegex(R"(\[launch\] server 1 restarted \(restart 1 of 3, pid [0-9]+\))"));
  const std::string jsonl = run + "/launch.jsonl";
  const auto died = Records(jsonl, "died");
  const auto restarts = Records(jsonl, "restart");
  ASSERT_EQ(died.size(), 2u);
  ASSERT_EQ(restarts.size(), 2u);
  for (const MetricRecord& r : died) {
    const bool server = r.Get("child").AsString() == "server 1";
    EXPECT_TRUE(server || r.Get("child").AsString() == "coordinator");
    EXPECT_EQ(r.Get("code").AsInt(), server ? 128 + SIGKILL : 4);
    EXPECT_EQ(r.Get("signal").AsInt(), server ? SIGKILL : 0);
    EXPECT_EQ(r.Get("action").AsString(), "restart");
  }
  for (const MetricRecord& r : restarts) {
    const bool server = r.Get("child").AsString() == "server 1";
    EXPECT_EQ(r.Get("attempt").AsInt(), 1);
    EXPECT_THAT(r.Get("argv").AsString(), ::testing::EndsWith(server ? " --recover" : " --rejoin"));
    EXPECT_GE(r.Get("down_s").AsDouble(), 0.19);
  }
  for (const MetricRecord& r : Records(jsonl, "exit")) {
    const std::string child = r.Get("child").AsString();
    EXPECT_EQ(r.Get("restarts").AsInt(), child == "server 1" || child == "coordinator" ? 1 : 0) << child;
  }
}

// --restart-workers 1 restarts a dead worker once with --resume; --dry-run shows every role's
// restart command and limit.
TEST_F(LaunchTest, RestartWorkersRestartsADeadWorkerWithResume) {
  Write("worker.sh", fmt::format("echo \"$*\" >> {}/worker-$2.args\n"
                                 "case \"$*\" in *--resume*) echo resumed ;; *) if [ \"$2\" = 1 ]; then exit 5; fi ;; esac\n",
                                 dir_.string()));
  std::string out;
  const std::string run = Path("run");
  ASSERT_EQ(Run(Command("worker.sh", "--restart-workers 1"), &out), 0) << out;
  const std::string args = fmt::format("--id 1 --config {0}/config.toml --run-dir {0}", run);
  EXPECT_EQ(test::ReadFile(Path("worker-1.args")), args + "\n" + args + " --resume\n");
  EXPECT_THAT(out, ::testing::ContainsRegex(R"(\[launch\] worker 1 exited with code 5 after [0-9.]+ s; restarting it )"
                                            R"(with --resume \(restart 1 of 1\))"));
  EXPECT_THAT(out, HasSubstr("[worker 1] resumed"));
  EXPECT_THAT(out, HasSubstr("all primaries exited 0"));
  const auto restarts = Records(run + "/launch.jsonl", "restart");
  ASSERT_EQ(restarts.size(), 1u);
  EXPECT_EQ(restarts[0].Get("child").AsString(), "worker 1");
  EXPECT_THAT(restarts[0].Get("argv").AsString(), ::testing::EndsWith(args + " --resume"));
  // What each role would be restarted as, without starting anything.
  ASSERT_EQ(Run(Command("worker.sh", "--dry-run --restart-workers 2 --set cluster.server_restarts=5", "dry"), &out), 0)
      << out;
  const std::string dry = Path("dry");
  EXPECT_THAT(out, HasSubstr(fmt::format("[launch] server 0 restarts: 5 (cluster.server_restarts = 5), then the job "
                                         "fails: /bin/sh -c exec /bin/sh {0} \"$@\" downpour-server --id 0 --config "
                                         "{1}/config.toml --run-dir {1} --recover\n",
                                         Path("serve.sh"), dry)));
  EXPECT_THAT(out, HasSubstr("[launch] coordinator restarts: 3 (cluster.coordinator_restarts = 3), then the job fails: "));
  EXPECT_THAT(out, HasSubstr("[launch] worker 1 restarts: 2 (--restart-workers 2), then the job goes on without it: "));
  EXPECT_THAT(out, HasSubstr("[launch] worker 0 restarts: 2 (--restart-workers 2), then the job fails: "));
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
  EXPECT_THAT(out, HasSubstr(fmt::format("--set: data.train = \"{}\": no such LMDB directory", Path("no_such_lmdb"))))
      << "a key given by --set is blamed on --set, not on the config file";
  EXPECT_FALSE(fs::exists(Path("run"))) << "the launcher created the run before checking its inputs";
  // The ImageNet-shaped set is made by the same script with --alexnet: the hint says so.
  EXPECT_EQ(Run(fmt::format("'{}' --config '{}' --run-dir '{}' --set data.train=data-sets/fashion-256/train_lmdb",
                            Launcher(), Path("inputs.toml"), Path("run")),
                &out),
            2);
  EXPECT_THAT(out, HasSubstr("no such LMDB directory (make one with scripts/get_fashion_mnist --alexnet"));
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

// --resume restarts servers with --recover (their checkpoints and write-ahead logs) and workers
// from their saved progress (--resume), with the run's own config; what cannot be resumed is
// refused.
TEST_F(LaunchTest, ResumeRecoversServersAndWorkersAndRefusesWhatItCannot) {
  // A run that failed half-way (worker 0 exits 3, and again after its restart). Worker 0 fails
  // only once worker 1 has printed its line (bounded wait): under a loaded parallel ctest the
  // launcher could otherwise stop worker 1 before its line, and the log count below missed it.
  Write("worker.sh", fmt::format("echo \"worker args: $*\"\nif [ \"$2\" = 1 ]; then touch '{0}'; fi\n"
                                 "if [ \"$2\" = 0 ]; then i=0; while [ ! -f '{0}' ] && [ $i -lt 100 ]; do "
                                 "sleep 0.05; i=$((i+1)); done; exit 3; fi\nsleep 0.4\n",
                                 Path("worker-1.started")));
  std::string out;
  const std::string run = Path("run");
  ASSERT_EQ(Run(Command("worker.sh", "--model alexnet-shapes"), &out), 3) << out;
  // Before any checkpoint or log: refused, naming the missing files.
  EXPECT_EQ(Run(fmt::format("'{}' --resume '{}'", Launcher(), run), &out), 2);
  EXPECT_THAT(out, HasSubstr(fmt::format("server 0 saved nothing to recover from ({0}/checkpoints/server-0.dpt is "
                                         "missing, and so is its write-ahead log {0}/checkpoints/server-0.wal",
                                         run)));
  // A checkpoint or, before the first one, only a write-ahead log is enough.
  fs::create_directories(run + "/checkpoints");
  Write("run/checkpoints/server-0.dpt", "x");
  Write("run/checkpoints/server-1.wal", "x");
  // Changing the run while resuming it is refused.
  EXPECT_EQ(Run(fmt::format("'{}' --resume '{}' --set worker.steps=5", Launcher(), run), &out), 2);
  EXPECT_THAT(out, HasSubstr("cannot be combined"));
  // The first launch's last record torn (its disk full half-way through the line): the run still
  // resumes, the torn line is named, and the resumed launcher's first record starts a line of its own.
  {
    std::ofstream launch_log(run + "/launch.jsonl", std::ios::app);
    launch_log << R"({"t":1764000000.5,"role":"launcher","id":0,"event":"en)";
  }
  // Resumed with stand-ins: the same roles, with --restore and --resume, logs appended. The
  // workers end only once the coordinator and both servers have said what they got (bounded
  // wait): under a loaded parallel ctest a server could otherwise be stopped before its line.
  for (const auto& e : fs::directory_iterator(dir_)) {
    if (e.path().filename().string().rfind("serving.", 0) == 0) fs::remove(e.path());
  }
  Write("worker.sh", fmt::format("echo \"worker args: $*\"\ni=0; while [ $(ls '{}' | grep -c '^serving\\.') -lt 3 ] "
                                 "&& [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done\n",
                                 dir_.string()));
  ASSERT_EQ(Run(fmt::format("'{}' --resume '{}' --grace-ms 2000 --timeout-s 60 --coordinator-cmd '/bin/sh {}' "
                            "--server-cmd '/bin/sh {}' --worker-cmd '/bin/sh {}' --model alexnet-shapes",
                            Launcher(), run, Path("serve.sh"), Path("serve.sh"), Path("worker.sh")),
                &out),
            0)
      << out;
  EXPECT_THAT(out, HasSubstr("[launch] resuming run"));
  EXPECT_THAT(out, HasSubstr(run + "/launch.jsonl: skipped 1 torn line(s)"));
  EXPECT_THAT(out, HasSubstr(fmt::format("[server 1] serving --id 1 --config {0}/config.toml --run-dir {0} --model "
                                         "alexnet-shapes --recover\n",
                                         run)));
  EXPECT_THAT(out, HasSubstr(fmt::format(
                       "[worker 0] worker args: --id 0 --config {0}/config.toml --run-dir {0} --resume", run)));
  const std::string log = test::ReadFile(run + "/logs/worker-1.log");
  EXPECT_EQ(std::count(log.begin(), log.end(), '\n'), 2) << "the first launch's line and the resumed one:\n" << log;
  std::vector<MetricRecord> records;
  std::vector<int> torn;
  ASSERT_TRUE(ReadMetrics(run + "/launch.jsonl", &records, &torn).ok());
  EXPECT_EQ(torn.size(), 1u);
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

// A port the job needs that something else holds is one error naming the key and the port,
// before anything starts, and the run directory is not left behind.
TEST_F(LaunchTest, APortInUseIsNamedBeforeAnythingStarts) {
  WriteInputs();
  const int coordinator_port = test::FreePort();
  const int base_port = test::FreePort();
  auto launch = [&](std::string* out) {
    return Run(fmt::format("'{}' --config '{}' --run-dir '{}' --set cluster.coordinator=127.0.0.1:{} "
                           "--set cluster.base_port={}",
                           Launcher(), Path("inputs.toml"), Path("run"), coordinator_port, base_port),
               out);
  };
  for (const int held : {coordinator_port, base_port}) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(held));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0) << "port " << held;
    ASSERT_EQ(::listen(fd, 1), 0);
    std::string out;
    EXPECT_EQ(launch(&out), 2) << out;
    const std::string key = held == coordinator_port
                                ? fmt::format("cluster.coordinator = \"127.0.0.1:{}\"", coordinator_port)
                                : fmt::format("cluster.base_port = {} (server 0)", base_port);
    EXPECT_THAT(out, HasSubstr(fmt::format("{}: port {} on 127.0.0.1 is in use", key, held)));
    EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << "one line:\n" << out;
    EXPECT_FALSE(fs::exists(Path("run"))) << "a refused launch left its run directory";
    ::close(fd);
  }
}

// Ctrl-C while the launcher sets up (here: while downpour-worker writes the tensor list) exits
// 128 + SIGINT and leaves no run directory, so the same --run-dir launches again.
TEST_F(LaunchTest, CtrlCDuringSetupExits130AndLeavesNoRunDirectory) {
  // IDX inputs: checked for existence only (no LMDB records to fit to the model).
  fs::create_directories(Path("idx"));
  Write("idx/x-images-idx3-ubyte", "");
  Write("idx/x-labels-idx1-ubyte", "");
  Write("idx.toml", fmt::format("[model]\nconfig = \"{}\"\n[data]\ntrain = \"{}\"\ntest = \"\"\n",
                                test::SourcePath("configs/models/fmnist_small.toml"),
                                Path("idx/x-images-idx3-ubyte")));
  fs::create_directories(Path("bin"));
  for (const char* program : {"downpour-coordinator", "downpour-server"}) Write(fmt::format("bin/{}", program), "");
  Write("bin/downpour-worker", fmt::format("#!/bin/sh\ntouch '{}'\nexec sleep 30\n", Path("tensors.started")));
  ::chmod(Path("bin/downpour-worker").c_str(), 0755);
  const int port = test::FreePortRange(3);
  test::Child launcher({Launcher(), "--config", Path("idx.toml"), "--run-dir", Path("run"), "--bin-dir", Path("bin"),
                        "--set", fmt::format("cluster.coordinator=127.0.0.1:{}", port), "--set",
                        fmt::format("cluster.base_port={}", port + 1)},
                       Path("launcher.log"));
  bool started = false;
  for (int i = 0; i < 500 && !started; ++i) {
    started = fs::exists(Path("tensors.started"));
    if (!started) std::this_thread::sleep_for(20ms);
  }
  ASSERT_TRUE(started) << test::ReadFile(Path("launcher.log"));
  launcher.Signal(SIGINT);
  EXPECT_EQ(launcher.WaitExit(20s), 128 + SIGINT) << test::ReadFile(Path("launcher.log"));
  EXPECT_THAT(test::ReadFile(Path("launcher.log")), HasSubstr("stopped by signal 2 before the job started"));
  EXPECT_FALSE(fs::exists(Path("run"))) << test::ReadFile(Path("launcher.log"));
}

// A --dry-run's directory is a run that never started: --resume starts it from the beginning.
// A new run stopped by Ctrl-C before any server or worker saved anything is removed; one that
// can be resumed says how.
TEST_F(LaunchTest, ADryRunResumesFromTheStartAndAStopBeforeAnySaveRemovesTheRun) {
  Write("worker.sh", "exit 0\n");
  std::string out;
  ASSERT_EQ(Run(Command("worker.sh", "--dry-run --model alexnet-shapes"), &out), 0) << out;
  ASSERT_TRUE(fs::exists(Path("run/config.toml")));
  ASSERT_EQ(Run(fmt::format("'{}' --resume '{}' --grace-ms 2000 --timeout-s 60 --coordinator-cmd '/bin/sh {}' "
                            "--server-cmd '/bin/sh {}' --worker-cmd '/bin/sh {}' --model alexnet-shapes",
                            Launcher(), Path("run"), Path("serve.sh"), Path("serve.sh"), Path("worker.sh")),
                &out),
            0)
      << out;
  EXPECT_THAT(out, HasSubstr("never started a process (a --dry-run made it): starting it from the beginning"));
  EXPECT_THAT(out, Not(HasSubstr("--recover")));
  const std::vector<MetricRecord> starts = Records(Path("run/launch.jsonl"), "start");
  ASSERT_EQ(starts.size(), 1u);
  EXPECT_FALSE(starts[0].Get("resumed").AsBool());

  // Stopped while the job runs, before anything was saved: nothing to resume, so removed.
  Write("sleeper.sh", fmt::format("touch '{}'\nexec sleep 30\n", Path("worker.started")));
  auto stop_after_start = [&](const std::string& run) {
    fs::remove(Path("worker.started"));
    test::Child launcher({"/bin/sh", "-c", "exec " + Command("sleeper.sh", "--model alexnet-shapes", run)},
                         Path(run + ".log"));
    bool started = false;
    for (int i = 0; i < 500 && !started; ++i) {
      started = fs::exists(Path("worker.started"));
      if (!started) std::this_thread::sleep_for(20ms);
    }
    EXPECT_TRUE(started) << test::ReadFile(Path(run + ".log"));
    launcher.Signal(SIGINT);
    EXPECT_EQ(launcher.WaitExit(20s), 128 + SIGINT);
    return test::ReadFile(Path(run + ".log"));
  };
  out = stop_after_start("run2");
  EXPECT_THAT(out, HasSubstr("[launch] stopped after"));
  EXPECT_THAT(out, HasSubstr("stopped before any server or worker saved anything: removed " + Path("run2")));
  EXPECT_FALSE(fs::exists(Path("run2")));

  // A server's checkpoint is there when the stop comes (a stand-in writes one): kept, and the
  // way on is named.
  Write("serve.sh", "trap 'exit 0' TERM\nif [ \"$1\" = --id ]; then mkdir -p \"$6/checkpoints\"; "
                    "touch \"$6/checkpoints/server-$2.dpt\"; fi\nwhile :; do sleep 0.05; done\n");
  // Both servers' files: the launcher checks every server's, and under load server 0's stand-in
  // may write its file after server 1's.
  Write("sleeper.sh", fmt::format("i=0; while {{ [ ! -f \"$6/checkpoints/server-0.dpt\" ] || "
                                  "[ ! -f \"$6/checkpoints/server-1.dpt\" ]; }} && [ $i -lt 200 ]; do "
                                  "sleep 0.05; i=$((i+1)); done\ntouch '{}'\nexec sleep 30\n",
                                  Path("worker.started")));
  out = stop_after_start("run3");
  EXPECT_THAT(out, HasSubstr("[launch] continue it with: downpour-launch --resume " + Path("run3"))) << out;
  EXPECT_TRUE(fs::exists(Path("run3/config.toml")));
}

// A run named after its mode whose mode --set changes is named after the mode it runs.
TEST_F(LaunchTest, ARunSwitchedToSyncBySetIsNamedSync) {
  Write("worker.sh", "exit 0\n");
  std::string out;
  ASSERT_EQ(Run(Command("worker.sh", "--set consistency.mode=sync --model alexnet-shapes --dry-run"), &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("this run is named \"fmnist-sync\""));
  RunConfig stored;
  ASSERT_TRUE(LoadRunConfig(Path("run/config.toml"), &stored).ok());
  EXPECT_EQ(stored.run.name, "fmnist-sync");
  // A name given with --set is kept.
  ASSERT_EQ(Run(Command("worker.sh", "--set consistency.mode=sync --set run.name=mine --model alexnet-shapes --dry-run",
                        "run2"),
                &out),
            0)
      << out;
  ASSERT_TRUE(LoadRunConfig(Path("run2/config.toml"), &stored).ok());
  EXPECT_EQ(stored.run.name, "mine");
}

// Two launches in the same second with the default run directory get one each.
TEST_F(LaunchTest, LaunchesInTheSameSecondGetTheirOwnRunDirectories) {
  Write("out.toml", fmt::format("[run]\nname = \"twin\"\nout_dir = \"{}\"\n", Path("runs")));
  const std::string one = fmt::format("'{}' --config '{}' --dry-run --model alexnet-shapes --worker-cmd true "
                                      "--coordinator-cmd true --server-cmd true",
                                      Launcher(), Path("out.toml"));
  std::string out;
  ASSERT_EQ(Run(fmt::format("{0} > '{1}.a' 2>&1 & {0} > '{1}.b' 2>&1 & {0} > '{1}.c' 2>&1 & wait", one,
                            Path("twins")),
                &out),
            0)
      << out;
  std::set<std::string> dirs;
  for (const auto& e : fs::directory_iterator(Path("runs"))) dirs.insert(e.path().filename().string());
  EXPECT_EQ(dirs.size(), 3u);
  for (const std::string& d : dirs) {
    EXPECT_TRUE(fs::exists(Path("runs/" + d + "/config.toml"))) << d;
    EXPECT_EQ(d.rfind("twin-", 0), 0u) << d;
  }
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

// Two workers, each reading its own LMDB under <dir>/train, no test set.
RunConfig OwnShardingConfig(const fs::path& dir) {
  RunConfig c;
  c.model.config = test::SourcePath("configs/models/fmnist_small.toml");
  c.cluster.workers = 2;
  c.data.sharding = DataSharding::kOwn;
  c.data.train = (dir / "train").string();
  c.data.test = "";
  return c;
}

// An (empty) LMDB directory at <dir>/train/<name>.
void MakeShard(const fs::path& dir, const std::string& name) {
  fs::create_directories(dir / "train" / name);
  test::WriteFile(dir / "train" / name / "data.mdb", "");
}

// data.sharding = "own": each worker's LMDB is <train>/shard_<j>_of_<W> as downpour-data
// --shards W writes them, or <train>/<j>; a missing one is named before anything starts.
TEST(RunInputs, OwnShardingFindsTheConvertersShardsOrNumberedFolders) {
  const fs::path dir = test::ScratchDir("run_inputs");
  RunConfig c = OwnShardingConfig(dir);
  for (const char* shard : {"shard_0_of_2", "shard_1_of_2"}) MakeShard(dir, shard);
  EXPECT_TRUE(CheckRunInputs(c, "run.toml").ok());
  EXPECT_EQ(OwnShardPath(c.data, 1, 2), (dir / "train" / "shard_1_of_2").string());
  fs::remove_all(dir / "train" / "shard_1_of_2");
  MakeShard(dir, "1");
  EXPECT_TRUE(CheckRunInputs(c, "run.toml").ok());
  EXPECT_EQ(OwnShardPath(c.data, 1, 2), (dir / "train" / "1").string());
  c.cluster.workers = 3;  // shard_0_of_2 is not worker 0's of 3, and there is no train/0
  const Status s = CheckRunInputs(c, "run.toml");
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("run.toml: data.train (sharding \"own\", worker 0)"));
  EXPECT_THAT(s.message(), HasSubstr((dir / "train" / "0").string() + "\": no such LMDB directory"));
  fs::remove_all(dir);
}

// A worker task of a cluster job needs only its own partition on its host (the coordinator and
// the servers none); a multi-model run's independent jobs read every partition, so there a worker
// task needs them all.
TEST(RunInputs, AWorkerTaskNeedsOnlyItsOwnPartition) {
  const fs::path dir = test::ScratchDir("task_inputs");
  RunConfig c = OwnShardingConfig(dir);
  MakeShard(dir, "shard_1_of_2");
  EXPECT_TRUE(CheckTaskInputs(c, "run.toml", /*worker=*/true, 1).ok());
  const Status s = CheckTaskInputs(c, "run.toml", /*worker=*/true, 0);
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("data.train (sharding \"own\", worker 0)"));
  EXPECT_TRUE(CheckTaskInputs(c, "run.toml", /*worker=*/false, 0).ok());
  EXPECT_FALSE(CheckRunInputs(c, "run.toml").ok());  // the local launcher starts every worker
  c.models.push_back(ModelEntry{"a", c.model.config, c.solver});
  c.rotation.scheme = RotationScheme::kIndependent;
  EXPECT_FALSE(CheckTaskInputs(c, "run.toml", /*worker=*/true, 1).ok());
  fs::remove_all(dir);
}

}  // namespace
}  // namespace downpour

namespace downpour {
namespace {

// Cluster mode: one task of a job, its role from a fake Slurm / MPI environment or --role.
class ClusterLaunchTest : public LaunchTest {
 protected:
  // The launcher as Slurm task `procid` of `ntasks` on node `node`, with stand-ins.
  std::string Slurm(int procid, int ntasks, const std::string& extra, const std::string& nodelist = "n[1-2]",
                    const std::string& node = "localhost") const {
    return fmt::format(
        "env SLURM_PROCID={} SLURM_NTASKS={} SLURM_STEP_NODELIST='{}' SLURMD_NODENAME={} SLURM_JOB_ID=42 "
        "SLURM_STEP_ID=0 {} --slurm --model alexnet-shapes {}",
        procid, ntasks, nodelist, node, Command("serve.sh", "", "run"), extra);
  }
  void SetUp() override {
    LaunchTest::SetUp();
    Write("serve.sh", "echo \"serving $*\"\n");  // every role: says what it got, exits 0
  }
  // Nothing was made: no run directory at all.
  void ExpectNothingStarted(const std::string& out) const {
    EXPECT_FALSE(fs::exists(Path("run"))) << "a run directory was made before the checks:\n" << out;
    EXPECT_THAT(out, ::testing::Not(HasSubstr("serving")));
  }
};

TEST_F(ClusterLaunchTest, SlurmTasksEachRunTheirOneRoleWithTheCoordinatorAddress) {
  std::string out;
  const std::string run = Path("run");
  ASSERT_EQ(Run(Slurm(2, 5, ""), &out), 0) << out;
  // The role's origin first, then exactly one child: server 1 with the coordinator on n1.
  EXPECT_EQ(out.find("[launch] slurm task 2/5 (SLURM_PROCID=2 of SLURM_NTASKS=5) on localhost: server 1\n"), 0u) << out;
  EXPECT_THAT(out, HasSubstr(fmt::format("[server 1] serving --id 1 --config {0}/config.toml --run-dir {0} --model "
                                         "alexnet-shapes --coordinator n1:5555 --advertise localhost\n",
                                         run)));
  EXPECT_THAT(out, ::testing::Not(HasSubstr("[server 0]")));
  ASSERT_EQ(Run(Slurm(4, 5, "--bind 127.0.0.9"), &out), 0) << out;
  EXPECT_THAT(out, HasSubstr(fmt::format(
                       "[worker 1] serving --id 1 --config {0}/config.toml --run-dir {0} --coordinator n1:5555 --bind "
                       "127.0.0.9\n",
                       run)));
  // Each task's own part of the run directory; config.toml shared, the run secret made once.
  EXPECT_TRUE(fs::exists(run + "/logs/server-1.log"));
  EXPECT_TRUE(fs::exists(run + "/logs/worker-1.log"));
  EXPECT_FALSE(fs::exists(run + "/launch.jsonl"));
  EXPECT_TRUE(fs::exists(run + "/secret"));
  std::vector<MetricRecord> records;
  ASSERT_TRUE(ReadMetrics(run + "/launch-server-1.jsonl", &records).ok());
  ASSERT_EQ(records.size(), 3u);
  EXPECT_EQ(records[0].Get("task").AsString(), "server 1");
  EXPECT_EQ(records[0].Get("rank").AsInt(), 2);
  EXPECT_EQ(records[0].Get("origin").AsString(), "slurm task 2/5 (SLURM_PROCID=2 of SLURM_NTASKS=5) on localhost");
  EXPECT_EQ(records[2].Get("code").AsInt(), 0);
  // The same task again into the same directory: its own files are there, refused.
  EXPECT_EQ(Run(Slurm(2, 5, ""), &out), 2);
  EXPECT_THAT(out, HasSubstr("already holds server-1 of an earlier run of this task"));
  // Another task with other settings: refused (it would be another job).
  EXPECT_EQ(Run(Slurm(3, 5, "--set worker.steps=7"), &out), 2);
  EXPECT_THAT(out, HasSubstr("config.toml was written by another task of this job with different settings"));
  // Without --run-dir the directory is named after the job: <out_dir>/<name>-<job>.<step>.
  std::string cmd = Slurm(0, 5, "");
  cmd.replace(cmd.find("--run-dir"), std::string("--run-dir '" + run + "'").size(), "");
  ASSERT_EQ(Run(cmd, &out, dir_), 0) << out;
  EXPECT_TRUE(fs::exists(Path("runs/fmnist-async-42.0/launch-coordinator.jsonl"))) << out;
}

TEST_F(ClusterLaunchTest, MpiAndByHandTasks) {
  std::string out;
  ASSERT_EQ(Run(fmt::format("env OMPI_COMM_WORLD_RANK=3 OMPI_COMM_WORLD_SIZE=5 {} --mpi --model alexnet-shapes "
                            "--coordinator 127.0.0.1:7000",
                            Command("serve.sh")),
                &out),
            0)
      << out;
  EXPECT_THAT(out, HasSubstr("[launch] mpi rank 3/5 (OMPI_COMM_WORLD_RANK=3 of OMPI_COMM_WORLD_SIZE=5): worker 0"));
  EXPECT_THAT(out, HasSubstr("--coordinator 127.0.0.1:7000\n"));
  ASSERT_EQ(Run(fmt::format("{} --role server --id 0 --coordinator 127.0.0.2:5555 --bind 127.0.0.3 --advertise "
                            "127.0.0.3 --model alexnet-shapes",
                            Command("serve.sh")),
                &out),
            0)
      << out;
  EXPECT_THAT(out, HasSubstr("[launch] started by hand (--role server --id 0): server 0"));
  EXPECT_THAT(out, HasSubstr("--coordinator 127.0.0.2:5555 --bind 127.0.0.3 --advertise 127.0.0.3\n"));
  // By hand the run directory must be given; cluster flags without cluster mode are refused.
  EXPECT_EQ(Run(fmt::format("'{}' --config '{}/configs/runs/default.toml' --role worker --id 0 --coordinator h:1",
                            Launcher(), test::SourcePath("")),
                &out),
            2);
  EXPECT_THAT(out, HasSubstr("give --run-dir D, the same on every task of the job"));
  EXPECT_EQ(
      Run(fmt::format("'{}' --config '{}/configs/runs/default.toml' --bind 0.0.0.0", Launcher(), test::SourcePath("")),
          &out),
      2);
  EXPECT_THAT(out, HasSubstr("belong to cluster mode"));
}

// A task's one child is supervised as its role is on one machine: a server task restarts its
// server with --recover, a coordinator task with --rejoin, worker 0's task with --resume; a
// worker task whose worker the job goes on without exits 0 (so Slurm does not stop the job).
TEST_F(ClusterLaunchTest, EachTaskSupervisesItsChildByRole) {
  // Every role: records its arguments, fails (exit 3) unless restarted.
  Write("serve.sh", fmt::format("echo \"$*\" >> {}/task.args\n"
                                "case \"$*\" in *--recover*|*--rejoin*|*--resume*) echo back ;; *) exit 3 ;; esac\n",
                                dir_.string()));
  const std::string run = Path("run");
  struct Case {
    int procid;
    std::string task, flag;
  };
  for (const Case& c : {Case{0, "coordinator", "--rejoin"}, Case{1, "server 0", "--recover"},
                        Case{3, "worker 0", "--resume"}}) {
    fs::remove(Path("task.args"));
    std::string out;
    ASSERT_EQ(Run(Slurm(c.procid, 5, ""), &out), 0) << out;
    const std::string args = test::ReadFile(Path("task.args"));
    EXPECT_EQ(std::count(args.begin(), args.end(), '\n'), 2) << args;
    EXPECT_THAT(args, ::testing::EndsWith(" " + c.flag + "\n")) << args;
    EXPECT_THAT(out, HasSubstr(fmt::format("[launch] {} exited with code 3 after", c.task)));
    EXPECT_THAT(out, HasSubstr(fmt::format("; restarting it with {}", c.flag)));
    EXPECT_THAT(out, HasSubstr(fmt::format("[{}] back", c.task)));
    std::string stem = c.task;
    std::replace(stem.begin(), stem.end(), ' ', '-');
    const auto restarts = Records(fmt::format("{}/launch-{}.jsonl", run, stem), "restart");
    ASSERT_EQ(restarts.size(), 1u) << stem;
    EXPECT_THAT(restarts[0].Get("argv").AsString(), ::testing::EndsWith(" " + c.flag));
  }
  // Worker 1 (restart_workers = 0): reported, not restarted, and its task exits 0.
  fs::remove(Path("task.args"));
  std::string out;
  ASSERT_EQ(Run(Slurm(4, 5, ""), &out), 0) << out;
  EXPECT_THAT(out, ::testing::ContainsRegex(R"(\[launch\] worker 1 exited with code 3 after [0-9.]+ s; the job goes )"
                                            R"(on without it \(cluster.restart_workers = 0\))"));
  EXPECT_EQ(test::ReadFile(Path("task.args")).find("--resume"), std::string::npos);
  const auto given_up = Records(run + "/launch-worker-1.jsonl", "given_up");
  ASSERT_EQ(given_up.size(), 1u);
  EXPECT_EQ(given_up[0].Get("code").AsInt(), 3);
  EXPECT_EQ(Records(run + "/launch-worker-1.jsonl", "end")[0].Get("code").AsInt(), 0);
}

TEST_F(ClusterLaunchTest, TooFewTasksOrABadNodeListStartNothing) {
  std::string out;
  EXPECT_EQ(Run(Slurm(0, 4, ""), &out), 2);
  EXPECT_THAT(out, HasSubstr("SLURM_NTASKS=4 but this job needs 5 tasks"));
  EXPECT_THAT(out, HasSubstr("#SBATCH --ntasks=5"));
  ExpectNothingStarted(out);
  EXPECT_EQ(Run(fmt::format("env OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_SIZE=3 {} --mpi", Command("serve.sh")), &out),
            2);
  EXPECT_THAT(out, HasSubstr("OMPI_COMM_WORLD_SIZE=3 but this job needs 5 tasks"));
  ExpectNothingStarted(out);
  EXPECT_EQ(Run(Slurm(1, 5, "", "n[1-2"), &out), 2);
  EXPECT_THAT(out, HasSubstr("SLURM_STEP_NODELIST: node list 'n[1-2': '[' without a closing ']' at position 1"));
  ExpectNothingStarted(out);
  EXPECT_EQ(Run(fmt::format("{} --slurm", Command("serve.sh")), &out), 2);
  EXPECT_THAT(out, HasSubstr("SLURM_PROCID is not set"));
  ExpectNothingStarted(out);
}

TEST_F(ClusterLaunchTest, KeyProblemsAndAnUnresolvableAdvertiseStartNothing) {
  std::string out;
  // Off-host without keys: refused, saying how to make keys.
  EXPECT_EQ(Run(Slurm(1, 5, "--set cluster.bind=0.0.0.0"), &out), 2);
  EXPECT_THAT(out, HasSubstr("downpour-keys --out"));
  ExpectNothingStarted(out);
  // Keys named but not there.
  fs::create_directories(Path("nokeys"));
  ::chmod(Path("nokeys").c_str(), 0700);
  EXPECT_EQ(Run(Slurm(3, 5, fmt::format("--set security.keys={}", Path("nokeys"))), &out), 2);
  EXPECT_THAT(out, HasSubstr(Path("nokeys")));
  ExpectNothingStarted(out);
  // A worker key others may read: refused as ssh refuses it.
  const Status made = MakeClusterKeys(Path("keys"));
  if (made.code() == StatusCode::kFailedPrecondition) GTEST_SKIP() << made.ToString();
  ASSERT_TRUE(made.ok()) << made.ToString();
  ASSERT_EQ(::chmod(Path("keys/worker.key").c_str(), 0644), 0);
  EXPECT_EQ(Run(Slurm(3, 5, fmt::format("--set security.keys={}", Path("keys"))), &out), 2);
  EXPECT_THAT(out, HasSubstr("worker.key"));
  EXPECT_THAT(out, HasSubstr("chmod 600"));
  ExpectNothingStarted(out);
  // With good keys the same task starts.
  ASSERT_EQ(::chmod(Path("keys/worker.key").c_str(), 0600), 0);
  EXPECT_EQ(Run(Slurm(3, 5, fmt::format("--set security.keys={} --set cluster.bind=0.0.0.0", Path("keys"))), &out), 0)
      << out;
  EXPECT_FALSE(fs::exists(Path("run/secret"))) << "a keyed run needs no run secret";
  fs::remove_all(Path("run"));
  // An advertise host that does not resolve.
  EXPECT_EQ(Run(Slurm(1, 5, "--advertise no-such-host.invalid"), &out), 2);
  EXPECT_THAT(out, HasSubstr("--advertise = 'no-such-host.invalid': this address does not resolve"));
  ExpectNothingStarted(out);
}

}  // namespace
}  // namespace downpour
