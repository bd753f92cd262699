// fault_test.cc — issue 13's faults in real Fashion-MNIST jobs started by downpour-launch
// (coordinator, 2 servers, 2 workers as processes over loopback ZeroMQ):
//   * a server SIGKILLed mid-run, in async, sync and ssp: the launcher restarts it with
//     --recover (checkpoint + write-ahead log), the workers ride through, the job exits 0, the
//     final accuracy is within the mode's run-to-run spread of the same job undisturbed (sync
//     0.5 points, ssp:2 1.5, async 1.7: measured, see the test), and for every (server,
//     worker) the pushes the server took equal the pushes the worker saw acknowledged: no
//     acknowledged update lost, none applied twice;
//   * a server SIGKILLed in a compressed job (factors + fp16 pushes) comes back from a log of
//     coded pushes alone;
//   * a server whose write-ahead log fails to fsync (EIO, dealt by libdownpour_fail_io): it
//     stops as a crash would and exits 1, and the same holds as for a killed server;
//   * the disk under a server's log full for a while: the pushes it refuses are sent again and
//     taken once when there is room, and nothing dies;
//   * a worker SIGKILLed in sync: the job goes on without it and finishes; the other worker
//     stalls at most about the heartbeat timeout;
//   * the coordinator SIGKILLed: training goes on, the launcher restarts it with --rejoin, it
//     rebuilds membership from heartbeats and the job finishes;
//   * a worker started by hand joins the running job (cluster.max_workers > workers): it gets
//     an id of its own, the servers apply its pushes, each exactly once, and worker 0's final
//     evaluation waits for it;
//   * a process stopped (SIGSTOP) for twice the heartbeat timeout and continued, in async and
//     sync: the coordinator declares nobody dead for its own pause; a worker declared dead is out
//     everywhere when it wakes and stops; a run that ended under a stopped worker does not wait
//     for it; each with every acknowledged push taken once;
//   * a job whose every worker fails at its start ends at once, saying it cannot finish.
// Every job keeps its history (checkpoint.history), and wherever the pushes are counted,
// downpour-history checks it too: each acknowledged push logged once, the servers' last
// checkpoints equal to the replay of their logs.
// Every wait is bounded; every process is reaped (harness.h).
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <sstream>
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

// Every fault below is dealt to one job: the default job's net (fmnist_fast) for 200 steps, which
// ends at 78% (sync) and 82% (async) top-1 in seconds. The server-kill tests compare the final
// accuracy with an undisturbed run's; this job's run-to-run spread was measured for that
// (ServerKillTest), and is no wider than fmnist_small's at 300 steps, which takes longer.
constexpr const char* kModel = "fmnist_fast";
constexpr int kSteps = 200;

// "[3,4,5]" -> {3, 4, 5}.
std::vector<int64_t> ParseList(const std::string& text) {
  std::vector<int64_t> out;
  std::string t = text;
  for (char& c : t) {
    if (c == '[' || c == ']' || c == ',') c = ' ';
  }
  std::istringstream in(t);
  int64_t v;
  while (in >> v) out.push_back(v);
  return out;
}

class FaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!test::HaveFashionMnist()) GTEST_SKIP() << "dataset-fashion-mnist missing";
    ASSERT_NO_FATAL_FAILURE(test::RequireJobBinaries());
    dir_ = test::ScratchDir("fault");
  }
  // A 2 x 2 job of kModel for kSteps in `mode` that checkpoints every 40 updates, heartbeats every
  // 200 ms and declares silence after 2 s (test::FashionJob), at batch 64 with the lr schedule below.
  test::JobConfig Job(const std::string& mode) {
    return test::FashionJob(kModel, kSteps)
        .Set("cluster.server_wait_ms", 60000)
        .Set("solver.lr_policy", "step")
        .Set("solver.gamma", 0.1)
        .Set("solver.stepsize", StepSize(mode))
        .Set("consistency.mode", mode)
        .Set("worker.batch_size", 64)
        .Set("checkpoint.every_updates", 40)
        .Set("checkpoint.history", true);  // every run's history is checked (ExpectHistoryValid)
  }
  std::string Config(const std::string& name, const std::string& mode) { return Config(name, Job(mode)); }
  std::string Config(const std::string& name, const test::JobConfig& job) { return job.Write(dir_ / (name + ".toml")); }

  // The lr drops tenfold for the last 30% of the steps, so the final weights (and the accuracy
  // two runs are compared by) carry little of async's run-to-run noise. The schedule counts
  // chunk versions: one per clock in sync, one per push of any worker (2 per step) otherwise.
  static int StepSize(const std::string& mode) { return (mode == "sync" ? 1 : 2) * kSteps * 7 / 10; }

  std::unique_ptr<test::Child> StartJob(const std::string& cfg, const fs::path& run, const std::string& log,
                                        const std::vector<std::string>& extra = {}) {
    std::vector<std::string> argv = {test::Binary("downpour-launch"), "--config", cfg, "--run-dir", run.string()};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return std::make_unique<test::Child>(argv, dir_ / log);
  }

  // StartJob with libdownpour_fail_io (tests/testing/fail_io.cc) preloaded into the launcher and
  // every process it starts, and `env` (its DOWNPOUR_FAIL_* / DOWNPOUR_FULL_* settings) set.
  std::unique_ptr<test::Child> StartJobFailingIo(const std::string& cfg, const fs::path& run, const std::string& log,
                                                 const std::vector<std::pair<std::string, std::string>>& env) {
    const std::string shim = test::BuildDir() + "/tests/testing/libdownpour_fail_io.so";
    EXPECT_TRUE(fs::exists(shim)) << shim << " not built";
    ::setenv("LD_PRELOAD", shim.c_str(), 1);  // the launcher and its children inherit these
    for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
    auto launcher = StartJob(cfg, run, log);
    ::unsetenv("LD_PRELOAD");
    for (const auto& [k, v] : env) ::unsetenv(k.c_str());
    return launcher;
  }

  // The launcher's "died" and "restart" records, as "died <child> code <c> <action>" and
  // "restart <child>".
  std::vector<std::string> Supervision(const fs::path& run) {
    std::vector<MetricRecord> launch;
    EXPECT_TRUE(ReadMetrics((run / "launch.jsonl").string(), &launch).ok());
    std::vector<std::string> out;
    for (const MetricRecord& r : launch) {
      const std::string event = r.Get("event").AsString();
      if (event == "died") {
        out.push_back(fmt::format("died {} code {} {}", r.Get("child").AsString(), r.Get("code").AsInt(),
                                  r.Get("action").AsString()));
      } else if (event == "restart") {
        out.push_back(fmt::format("restart {}", r.Get("child").AsString()));
      }
    }
    return out;
  }

  int RunJob(const std::string& cfg, const fs::path& run, const std::string& log) {
    return StartJob(cfg, run, log)->WaitExit(300s);
  }

  std::vector<MetricRecord> Worker(const fs::path& run, int w, const std::string& event) {
    return test::Metrics(run, fmt::format("worker-{}.jsonl", w), event);
  }

  // Waits (bounded) until worker `w` has logged `steps` steps (its metrics file may not exist
  // yet, or hold a line being written: read without asserting).
  // The run's evaluator process makes the evaluations (eval.evaluator, the default): it goes
  // through every fault below as the workers do.
  double FinalTop1(const fs::path& run) {
    const auto evals = test::Metrics(run, "evaluator.jsonl", "eval");
    if (evals.empty() || !evals.back().Get("final").AsBool()) return -1;
    return evals.back().Get("top1").AsDouble();
  }

  // For every server and worker: the gradient pushes the server took from that worker (its
  // last server_end line, which a restarted server writes with the totals it recovered) equal
  // the pushes the worker saw acknowledged by that server. A worker in `removed` (stopped as out
  // of the run) may have had pushes taken whose acknowledgements it never read before it
  // stopped: for it, taken is at least acked and at most two steps' pushes more (worker 0's
  // pushes per step, worker 0 having run every step).
  void ExpectEveryAckedPushTakenOnce(const fs::path& run, const std::vector<int>& workers,
                                     const std::vector<int>& removed = {}) {
    for (int s = 0; s < 2; ++s) {
      const auto ends = test::Metrics(run, fmt::format("server-{}.jsonl", s), "server_end");
      ASSERT_FALSE(ends.empty()) << "server " << s << " wrote no server_end";
      const std::vector<int64_t> taken = ParseList(ends.back().Get("pushes_by_worker").AsString());
      for (int w : workers) {
        int64_t acked = -1;
        for (const auto& r : Worker(run, w, "ps_acks")) {
          if (r.Get("server").AsInt() == s) acked = r.Get("pushes_acked").AsInt();
        }
        ASSERT_GE(acked, 0) << "worker " << w << " logged no ps_acks for server " << s;
        ASSERT_LT(static_cast<size_t>(w), taken.size()) << "server " << s << " pushes_by_worker too short";
        EXPECT_GT(acked, 0);
        const int64_t took = taken[static_cast<size_t>(w)];
        const std::string what = fmt::format("server {} took {} pushes of worker {}, which saw {} acknowledged", s,
                                             took, w, acked);
        if (std::find(removed.begin(), removed.end(), w) != removed.end()) {
          EXPECT_GE(took, acked) << what;
          EXPECT_LE(took - acked, 2 * taken[0] / kSteps) << what;
        } else {
          EXPECT_EQ(took, acked) << what;
        }
      }
    }
    ExpectHistoryValid(run);
  }

  // downpour-history on the run's kept history: every acknowledged push in its server's log
  // exactly once, none logged twice, each server's last checkpoint equal, bit for bit, to a
  // replay of its log (server/history_check.h).
  void ExpectHistoryValid(const fs::path& run) {
    std::string out;
    const int code = test::RunCommand({test::Binary("downpour-history"), run.string()}, &out, 300s);
    EXPECT_EQ(code, 0) << out;
    EXPECT_NE(out.find("history: valid: 0 acknowledged pushes lost, 0 applied twice, the replay equals the last "
                       "checkpoint on 2 of 2 servers"),
              std::string::npos)
        << out;
  }

  // The pushes a restarted server replayed, from its line "recovered: ... N pushes replayed from
  // the log"; -1 when it has none.
  static int64_t ReplayedPushes(const std::string& server_log) {
    const size_t recovered = server_log.find("recovered: ");
    const size_t replayed = server_log.find(" pushes replayed from the log", recovered);
    if (recovered == std::string::npos || replayed == std::string::npos) return -1;
    const size_t number = server_log.rfind(' ', replayed - 1) + 1;
    return std::stoll(server_log.substr(number, replayed - number));
  }

  // Both workers ran all kSteps, and every push each saw acknowledged was taken once.
  void ExpectBothWorkersFinishedAndEveryAckedPushTakenOnce(const fs::path& run) {
    for (int w = 0; w < 2; ++w) {
      const auto done = Worker(run, w, "done");
      ASSERT_FALSE(done.empty()) << "worker " << w;
      EXPECT_EQ(done.back().Get("steps").AsInt(), kSteps) << "worker " << w;
    }
    ExpectEveryAckedPushTakenOnce(run, {0, 1});
  }

  fs::path dir_;
};

class ServerKillTest : public FaultTest, public ::testing::WithParamInterface<const char*> {};

TEST_P(ServerKillTest, KilledServerIsRestartedAndNoAcknowledgedUpdateIsLostOrAppliedTwice) {
  const std::string mode = GetParam();
  const fs::path whole = dir_ / "whole";
  ASSERT_EQ(RunJob(Config("whole", mode), whole, "whole.log"), 0) << test::ReadFile(dir_ / "whole.log");
  const double whole_top1 = FinalTop1(whole);
  ASSERT_GT(whole_top1, 0.7);

  const fs::path run = dir_ / "killed";
  auto launcher = StartJob(Config("killed", mode), run, "killed.log");
  ASSERT_TRUE(test::WaitWorkerSteps(run, 0, kSteps * 2 / 5, 120s)) << test::ReadFile(dir_ / "killed.log");
  const pid_t server1 = test::ChildWith(launcher->pid(), {"downpour-server", "--id 1 "});
  ASSERT_GT(server1, 0) << "server 1 not found among the launcher's children";
  const auto killed_at = std::chrono::steady_clock::now();
  ASSERT_EQ(::kill(server1, SIGKILL), 0);
  ASSERT_EQ(launcher->WaitExit(300s), 0) << test::ReadFile(dir_ / "killed.log");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count();
  const std::string out = test::ReadFile(dir_ / "killed.log");
  EXPECT_NE(out.find("--recover"), std::string::npos) << out;
  EXPECT_NE(test::ReadFile(run / "logs" / "server-1.log").find("recovered"), std::string::npos);
  ExpectBothWorkersFinishedAndEveryAckedPushTakenOnce(run);
  const double top1 = FinalTop1(run);
  // A killed run is one more sample of the mode's run-to-run spread, which is what bounds the
  // difference. Four repeats of this test (2026-11-29, 2-core VM), undisturbed and killed runs:
  // sync 0.7807 all eight (deterministic); async 0.8175-0.8230 (sd 0.0016) and ssp:2 0.8167-0.8237
  // (sd 0.0023), eight each, so three sd of the difference of two runs is 0.007 and 0.010. The
  // tolerances are above that, as eight runs give a rough sd. (The fmnist_small job at 300 steps
  // this test ran before spread wider: ssp:2 0.8308-0.8463, sd 0.0051.) Async's eight were too few:
  // 19 repeats on 2026-12-01 (8 of them with the build of 2026-11-29, the same spread) gave
  // 0.8147-0.8301, sd 0.0039, and 3 of the 19 pairs differed by more than the 0.01 allowed then
  // (one failed a fresh clone's run); three sd of the difference is 0.017. ssp:2 the same day, 8
  // repeats: 0.8171-0.8248, sd 0.0021. A lost or doubled update is caught exactly by
  // ExpectEveryAckedPushTakenOnce, not by this.
  const double tolerance = mode == "sync" ? 0.005 : mode == "async" ? 0.017 : 0.015;
  EXPECT_NEAR(top1, whole_top1, tolerance) << mode << ": undisturbed " << whole_top1 << ", server killed " << top1;
  std::printf("[%s] undisturbed %.4f, server 1 killed at step %d: %.4f; %.1f s from the kill to the end\n",
              mode.c_str(), whole_top1, kSteps * 2 / 5, top1, seconds);
}

INSTANTIATE_TEST_SUITE_P(Modes, ServerKillTest, ::testing::Values("async", "sync", "ssp:2"),
                         [](const auto& info) {
                           std::string n = info.param;
                           return n == "ssp:2" ? std::string("ssp2") : n;
                         });

// A compressed job (sufficient factors for the fc layers, fp16 for the rest of every push) with
// no checkpoint but the write-ahead log: server 1 logs the pushes as the wire carried them
// (server/wal.h kCodedPush), is SIGKILLed mid-run, and the launcher's --recover rebuilds it from
// those records alone, forming the factors and decoding the fp16 again. The job exits 0, every
// acknowledged push was taken once, and it trains as well as the other jobs here.
TEST_F(FaultTest, AServerKilledInACompressedJobComesBackFromItsLogOfCodedPushes) {
  const fs::path run = dir_ / "run";
  const std::string cfg = Config("run", Job("async")
                                            .Set("checkpoint.every_updates", 0)
                                            .Set("compression.factors", true)
                                            .Set("compression.push", "fp16"));
  auto launcher = StartJob(cfg, run, "run.log");
  ASSERT_TRUE(test::WaitWorkerSteps(run, 0, kSteps * 2 / 5, 120s)) << test::ReadFile(dir_ / "run.log");
  const pid_t server1 = test::ChildWith(launcher->pid(), {"downpour-server", "--id 1 "});
  ASSERT_GT(server1, 0) << "server 1 not found among the launcher's children";
  ASSERT_EQ(::kill(server1, SIGKILL), 0);
  ASSERT_EQ(launcher->WaitExit(300s), 0) << test::ReadFile(dir_ / "run.log");
  const std::string server_log = test::ReadFile(run / "logs" / "server-1.log");
  EXPECT_GT(ReplayedPushes(server_log), kSteps / 2) << server_log;
  // The restarted server logged the workers' gradient pushes coded, so its log took about the
  // bytes its socket did. Logged as f32, as before kCodedPush, a server's share of a worker step
  // is ~1.2 MB against ~0.6 MB on the wire (fc1's factors, the rest in fp16): ~2x.
  const auto ends = test::Metrics(run, "server-1.jsonl", "server_end");
  ASSERT_FALSE(ends.empty());
  const MetricRecord& end = ends.back();
  EXPECT_GT(end.Get("wal_coded_records").AsInt(), kSteps) << "the restarted server logged few coded pushes";
  EXPECT_GT(end.Get("wal_bytes").AsInt(), 0);
  EXPECT_LT(static_cast<double>(end.Get("wal_bytes").AsInt()), 1.1 * static_cast<double>(end.Get("rx_bytes").AsInt()))
      << "log bytes against received bytes";
  ExpectBothWorkersFinishedAndEveryAckedPushTakenOnce(run);
  EXPECT_GT(FinalTop1(run), 0.7);
}

// The disk under a server's write-ahead log fails an fsync (EIO) mid-run. The server cannot
// promise anything that log held, so it stops as a crash would: it leaves the push that found the
// failure unanswered, writes no checkpoint and exits 1. The launcher restarts it with --recover
// from its checkpoint and log, the workers resend what was not acknowledged, the job exits 0 and
// every acknowledged push was taken once. The failure comes from libdownpour_fail_io
// (tests/testing/fail_io.cc), preloaded into every process of the job: the first fsync of
// server-1.wal after the trigger file appears fails, once.
TEST_F(FaultTest, AServerWhoseLogFailsToSyncStopsIsRestartedAndNoAcknowledgedUpdateIsLost) {
  const fs::path run = dir_ / "run";
  const fs::path trigger = dir_ / "fail-sync-now";
  // No checkpoint but the write-ahead log: the restarted server is the log's replay, every push.
  const std::string cfg = Config("run", Job("async").Set("checkpoint.every_updates", 0));
  auto launcher = StartJobFailingIo(cfg, run, "run.log",
                                    {{"DOWNPOUR_FAIL_SYNC_OF", "server-1.wal"}, {"DOWNPOUR_FAIL_SYNC_WHEN", trigger}});
  ASSERT_TRUE(test::WaitWorkerSteps(run, 0, kSteps * 2 / 5, 120s)) << test::ReadFile(dir_ / "run.log");
  test::WriteFile(trigger, "");
  ASSERT_EQ(launcher->WaitExit(300s), 0) << test::ReadFile(dir_ / "run.log");
  EXPECT_FALSE(fs::exists(trigger)) << "no fsync of server-1.wal came after the trigger";
  const std::string server_log = test::ReadFile(run / "logs" / "server-1.log");
  EXPECT_NE(server_log.find("takes nothing more"), std::string::npos) << server_log;
  EXPECT_NE(server_log.find("Input/output error"), std::string::npos) << server_log;
  EXPECT_GT(ReplayedPushes(server_log), kSteps / 2) << server_log;
  EXPECT_EQ(Supervision(run), (std::vector<std::string>{"died server 1 code 1 restart", "restart server 1"}));
  ExpectBothWorkersFinishedAndEveryAckedPushTakenOnce(run);
  EXPECT_GT(FinalTop1(run), 0.7);
}

// The disk under server 1's write-ahead log is full for 1.5 s mid-run (every write to the log fails
// with ENOSPC, from libdownpour_fail_io). The log stalls: the server refuses every push it cannot
// log and the acks of those it had staged, and stays up; the workers send those pushes again,
// backing off, and once there is room the log writes what it held and takes the rest. Nothing
// dies, the job exits 0, and every acknowledged push was taken once: the refused ones were not
// applied, and the resends of staged ones were duplicates, not applied twice.
TEST_F(FaultTest, PushesAFullDiskRefusedAreSentAgainAndTakenOnceWhenThereIsRoom) {
  const fs::path run = dir_ / "run";
  const fs::path full = dir_ / "disk-full";
  // Periodic checkpoints off: a checkpoint's log restart that meets the full disk takes the write
  // failure itself (the checkpoint it just wrote covers what the log held), and with one every
  // ~0.5 s the whole window once passed with no push refused (fresh clone, 2026-12-07).
  auto launcher = StartJobFailingIo(Config("run", Job("async").Set("checkpoint.every_updates", 0)), run, "run.log",
                                    {{"DOWNPOUR_FULL_DISK_OF", "server-1.wal"}, {"DOWNPOUR_FULL_DISK_WHILE", full}});
  ASSERT_TRUE(test::WaitWorkerSteps(run, 0, kSteps * 2 / 5, 120s)) << test::ReadFile(dir_ / "run.log");
  test::WriteFile(full, "");
  std::this_thread::sleep_for(1500ms);
  fs::remove(full);
  ASSERT_EQ(launcher->WaitExit(300s), 0) << test::ReadFile(dir_ / "run.log");
  EXPECT_EQ(Supervision(run), std::vector<std::string>{}) << "a process died";
  const auto ends = test::Metrics(run, "server-1.jsonl", "server_end");
  ASSERT_FALSE(ends.empty());
  EXPECT_NE(ends.back().Get("rejected_by_reason").AsString().find("log_write:"), std::string::npos)
      << "server 1 refused no push for its log: " << ends.back().Get("rejected_by_reason").AsString();
  std::string workers;
  for (int w = 0; w < 2; ++w) workers += test::ReadFile(run / "logs" / fmt::format("worker-{}.log", w));
  EXPECT_NE(workers.find("server 1's log refused"), std::string::npos) << workers;
  EXPECT_NE(workers.find("server 1's log takes"), std::string::npos) << workers;
  ExpectBothWorkersFinishedAndEveryAckedPushTakenOnce(run);
  EXPECT_GT(FinalTop1(run), 0.7);
}

TEST_F(FaultTest, KilledWorkerInSyncIsDroppedAndTheJobFinishes) {
  const fs::path run = dir_ / "run";
  auto launcher = StartJob(Config("run", "sync"), run, "run.log");
  ASSERT_TRUE(test::WaitWorkerSteps(run, 0, kSteps * 2 / 5, 120s)) << test::ReadFile(dir_ / "run.log");
  const pid_t worker1 = test::ChildWith(launcher->pid(), {"downpour-worker", "--id 1 "});
  ASSERT_GT(worker1, 0);
  const size_t steps_at_kill = Worker(run, 0, "step").size();
  ASSERT_EQ(::kill(worker1, SIGKILL), 0);
  ASSERT_EQ(launcher->WaitExit(300s), 0) << test::ReadFile(dir_ / "run.log");
  const std::string out = test::ReadFile(dir_ / "run.log");
  EXPECT_NE(out.find("goes on without it"), std::string::npos) << out;
  const auto steps = Worker(run, 0, "step");
  ASSERT_EQ(static_cast<int>(steps.size()), kSteps);
  // Sync stalls at most the heartbeat timeout (2 s) while the servers still wait for the dead
  // worker, plus scheduling slack on a loaded 2-core machine.
  double longest = 0;
  for (size_t i = steps_at_kill; i < steps.size(); ++i) {
    longest = std::max(longest, steps[i].Get("wall_s").AsDouble() - steps[i - 1].Get("wall_s").AsDouble());
  }
  EXPECT_LT(longest, 2.0 + 2.0) << "worker 0 waited " << longest << " s for one step";
  EXPECT_GT(FinalTop1(run), 0.7);
}

TEST_F(FaultTest, KilledCoordinatorIsRestartedAndTrainingGoesOn) {
  const fs::path run = dir_ / "run";
  auto launcher = StartJob(Config("run", "async"), run, "run.log");
  ASSERT_TRUE(test::WaitWorkerSteps(run, 0, kSteps * 3 / 10, 120s)) << test::ReadFile(dir_ / "run.log");
  const pid_t coordinator = test::ChildWith(launcher->pid(), {"downpour-coordinator"});
  ASSERT_GT(coordinator, 0);
  ASSERT_EQ(::kill(coordinator, SIGKILL), 0);
  ASSERT_EQ(launcher->WaitExit(300s), 0) << test::ReadFile(dir_ / "run.log");
  const std::string out = test::ReadFile(dir_ / "run.log");
  EXPECT_NE(out.find("--rejoin"), std::string::npos) << out;
  ExpectBothWorkersFinishedAndEveryAckedPushTakenOnce(run);
  EXPECT_GT(FinalTop1(run), 0.7);
}

// A process stopped (SIGSTOP) for twice the heartbeat timeout (2 s), then continued: what a
// loaded VM, a swap storm or a stopped container does. Worker 0 sleeps 50 ms a step unless told
// otherwise, so the job is still training when the process wakes.
struct FrozenRun {
  int code = -1;
  double after_wake_s = 0;  // from the SIGCONT to the launcher's exit
};

class FreezeTest : public FaultTest, public ::testing::WithParamInterface<const char*> {
 protected:
  // Freezes the launcher's child whose command line has `who` once worker `watch` has taken a
  // tenth of its steps.
  FrozenRun RunFreezing(const fs::path& run, const std::vector<std::string>& who, int watch, int worker0_delay_ms = 50,
                        std::chrono::seconds frozen = 4s) {
    const test::JobConfig job =
        Job(GetParam()).Set("worker.straggler", 0).Set("worker.straggler_delay_ms", worker0_delay_ms);
    auto launcher = StartJob(Config("run", job), run, "run.log");
    EXPECT_TRUE(test::WaitWorkerSteps(run, watch, kSteps / 10, 120s)) << test::ReadFile(dir_ / "run.log");
    const pid_t victim = test::ChildWith(launcher->pid(), who);
    EXPECT_GT(victim, 0);
    FrozenRun r;
    if (victim <= 0) return r;
    EXPECT_EQ(::kill(victim, SIGSTOP), 0);
    std::this_thread::sleep_for(frozen);
    EXPECT_EQ(::kill(victim, SIGCONT), 0);
    const auto woke = std::chrono::steady_clock::now();
    r.code = launcher->WaitExit(300s);
    r.after_wake_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - woke).count();
    return r;
  }
};

// The coordinator stopped for 4 s: on waking it must not take its own silence for everyone's.
// Nobody is declared dead; the job finishes as if nothing happened.
TEST_P(FreezeTest, AFrozenCoordinatorDeclaresNobodyDead) {
  const fs::path run = dir_ / "run";
  const FrozenRun r = RunFreezing(run, {"downpour-coordinator"}, /*watch=*/0);
  const std::string out = test::ReadFile(dir_ / "run.log");
  ASSERT_EQ(r.code, 0) << out;
  EXPECT_NE(out.find("that time is not counted as anyone's silence"), std::string::npos) << out;
  EXPECT_EQ(out.find("declared dead"), std::string::npos) << out;
  ExpectBothWorkersFinishedAndEveryAckedPushTakenOnce(run);
  EXPECT_GT(FinalTop1(run), 0.7);
}

// A worker stopped for 4 s is declared dead; when it wakes it is out everywhere: the servers
// refuse its session and the coordinator tells it, so it stops at once instead of training half
// in. The job ends with the other worker, exit 0, nothing left waiting, and every push either
// worker saw acknowledged was taken exactly once.
TEST_P(FreezeTest, AFrozenWorkerDeclaredDeadIsOutEverywhereAndTheJobEnds) {
  const fs::path run = dir_ / "run";
  const FrozenRun r = RunFreezing(run, {"downpour-worker", "--id 1 "}, /*watch=*/1);
  const std::string out = test::ReadFile(dir_ / "run.log");
  ASSERT_EQ(r.code, 0) << out;
  EXPECT_LT(r.after_wake_s, 30) << "the job waited on a run that was over:\n" << out;
  EXPECT_NE(out.find("coordinator: worker 1 silent for more than 2000 ms: declared dead"), std::string::npos) << out;
  EXPECT_NE(out.find("[worker 1]"), std::string::npos);
  EXPECT_NE(out.find("out of the run"), std::string::npos) << out;
  EXPECT_NE(out.find("worker 1 exited with code 1"), std::string::npos) << out;
  const auto done = Worker(run, 0, "done");
  ASSERT_FALSE(done.empty());
  EXPECT_EQ(done.back().Get("steps").AsInt(), kSteps);
  EXPECT_TRUE(Worker(run, 1, "done").empty()) << "worker 1 went on training after it was declared dead";
  ExpectEveryAckedPushTakenOnce(run, {0, 1}, /*removed=*/{1});
}

// The run ends (worker 0 finishes, the evaluator evaluates) while worker 1 is stopped: when it
// wakes nobody is left to answer it, so the launcher stops it instead of waiting for it to give up
// on the servers (cluster.server_wait_ms, a minute here). On a loaded machine the coordinator may
// still be winding down when the worker wakes: then it tells the worker it is out of the run,
// and the worker stops at once all the same.
TEST_P(FreezeTest, ARunThatEndedUnderAFrozenWorkerDoesNotWaitForIt) {
  const fs::path run = dir_ / "run";
  const FrozenRun r = RunFreezing(run, {"downpour-worker", "--id 1 "}, /*watch=*/1, /*worker0_delay_ms=*/0, 8s);
  const std::string out = test::ReadFile(dir_ / "run.log");
  ASSERT_EQ(r.code, 0) << out;
  EXPECT_LT(r.after_wake_s, 15) << out;
  EXPECT_TRUE(out.find("coordinator ended the run") != std::string::npos ||
              out.find("worker 1, declared dead, is heard from again: told it is out of the run") != std::string::npos)
      << out;
  EXPECT_GT(FinalTop1(run), 0.7);
}

INSTANTIATE_TEST_SUITE_P(Modes, FreezeTest, ::testing::Values("async", "sync"));

// Every worker fails at its start (weights of another shape): the job cannot finish, so it ends at
// once with the workers' exit code and a line saying why, instead of an evaluator waiting forever.
TEST_F(FaultTest, AJobWhoseEveryWorkerIsGivenUpEndsAtOnce) {
  const fs::path run = dir_ / "run";
  // fmnist_small's weights for an fmnist_fast job: tensors of the same names, other shapes.
  const std::string other = test::SourcePath("configs/models/fmnist_small.toml");
  const std::string weights = (dir_ / "small.dpt").string();
  std::string out;
  ASSERT_EQ(test::RunCommand({test::Binary("downpour-worker"), "--local", "--config", Config("small", Job("async")),
                              "--set", "model.config=" + other, "--set", "worker.steps=1", "--run-dir",
                              (dir_ / "small").string(), "--quiet"},
                             &out),
            0)
      << out;
  fs::copy_file(dir_ / "small" / "model_final.dpt", weights);
  const auto t0 = std::chrono::steady_clock::now();
  const int code = StartJob(Config("run", "async"), run, "run.log", {"--weights", weights})->WaitExit(120s);
  out = test::ReadFile(dir_ / "run.log");
  EXPECT_EQ(code, 2) << out;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 60s) << out;
  EXPECT_NE(out.find("worker 0, worker 1 given up and none finished: the job cannot finish"), std::string::npos)
      << out;
}

TEST_F(FaultTest, WorkerStartedByHandJoinsTheRunningJob) {
  const fs::path run = dir_ / "run";
  const test::JobConfig job = Job("async").Set("cluster.max_workers", 3);
  auto launcher = StartJob(Config("run", job), run, "run.log");
  ASSERT_TRUE(test::WaitWorkerSteps(run, 0, kSteps / 5, 120s)) << test::ReadFile(dir_ / "run.log");
  // It runs past the others' last step: the evaluator's final evaluation waits for it.
  const int joiner_steps = kSteps;
  test::Child joiner({test::Binary("downpour-worker"), "--run-dir", run.string(), "--coordinator",
                      job.String("cluster.coordinator"), "--steps", std::to_string(joiner_steps), "--quiet"},
                     dir_ / "joiner.log");
  ASSERT_EQ(joiner.WaitExit(200s), 0) << test::ReadFile(dir_ / "joiner.log");
  ASSERT_EQ(launcher->WaitExit(300s), 0) << test::ReadFile(dir_ / "run.log");
  // The coordinator gave it id 2 (the first id past cluster.workers).
  const auto done = Worker(run, 2, "done");
  ASSERT_FALSE(done.empty()) << test::ReadFile(dir_ / "joiner.log");
  EXPECT_EQ(done.back().Get("steps").AsInt(), joiner_steps);
  ExpectEveryAckedPushTakenOnce(run, {0, 1, 2});
  EXPECT_NE(test::ReadFile(dir_ / "run.log").find("that joined the job to finish before the final evaluation"),
            std::string::npos);
  // The final evaluation came after the joiner's last step (its snapshot was pulled at t − eval_s).
  const auto evals = test::Metrics(run, "evaluator.jsonl", "eval");
  ASSERT_FALSE(evals.empty());
  ASSERT_TRUE(evals.back().Get("final").AsBool());
  EXPECT_GT(evals.back().Get("t").AsDouble() - evals.back().Get("eval_s").AsDouble(),
            Worker(run, 2, "step").back().Get("t").AsDouble());
}

}  // namespace
}  // namespace downpour
