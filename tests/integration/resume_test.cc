// resume_test.cc — a real job (coordinator, 2 servers, 2 workers on Fashion-MNIST) killed with
// SIGKILL, every process at once, 40% of the way through, and resumed with downpour-launch --resume:
// it reaches the same final step count as an uninterrupted run, its curve continues (no
// restart at step 0), and its final accuracy is within noise of the uninterrupted run's. Then a
// fine-tune from the uninterrupted run's saved model starts at that model's accuracy, and
// downpour-test measures the same accuracy on the saved model.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cmath>
#include <cstdio>
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

// The fault tests' job (fault_test.cc): the default job's net for 200 steps, the lr dropping
// tenfold for the last 30% so that two async runs end close together; killed at 40%.
constexpr int kSteps = 200;
constexpr int kKillAt = kSteps * 2 / 5;
// The schedule counts chunk versions, one per push of either worker: 2 per step.
constexpr int kStepSize = 2 * kSteps * 7 / 10;

class ResumeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(fs::path(test::kFashionMnistDir) / "train-images-idx3-ubyte.gz"))
      GTEST_SKIP() << "dataset-fashion-mnist missing";
    dir_ = test::ScratchDir("resume");
  }
  // A small async job that checkpoints often; ports free now.
  std::string Config(const std::string& name) {
    return test::FashionJob("fmnist_fast", kSteps)
        .Set("run.seed", 3)
        .Set("solver.lr_policy", "step")
        .Set("solver.gamma", 0.1)
        .Set("solver.stepsize", kStepSize)
        .Set("consistency.mode", "async")
        .Set("worker.batch_size", 64)
        .Set("eval.every_steps", 100)
        .Set("checkpoint.every_updates", 20)
        .Write(dir_ / (name + ".toml"));
  }

  int Launch(const std::vector<std::string>& args, const std::string& log) {
    std::vector<std::string> argv = {test::Binary("downpour-launch")};
    argv.insert(argv.end(), args.begin(), args.end());
    test::Child launcher(argv, dir_ / log);
    return launcher.WaitExit(240s);
  }

  std::vector<MetricRecord> Worker(const fs::path& run, int w, const std::string& event) {
    return test::Metrics(run, fmt::format("worker-{}.jsonl", w), event);
  }

  // The run's evaluator process makes the evaluations (eval.evaluator, the default).
  double FinalTop1(const fs::path& run) {
    const auto evals = test::Metrics(run, "evaluator.jsonl", "eval");
    if (evals.empty() || !evals.back().Get("final").AsBool()) return -1;
    return evals.back().Get("top1").AsDouble();
  }

  fs::path dir_;
};

TEST_F(ResumeTest, KilledRunResumesToTheSameEndAndFineTuneStartsAtTheSavedAccuracy) {
  // The uninterrupted run.
  const fs::path whole = dir_ / "whole";
  ASSERT_EQ(Launch({"--config", Config("whole"), "--run-dir", whole.string()}, "whole.log"), 0)
      << test::ReadFile(dir_ / "whole.log");
  const double whole_top1 = FinalTop1(whole);
  ASSERT_GT(whole_top1, 0.7);

  // The same job, every process SIGKILLed at once once worker 0 has taken kKillAt steps.
  const fs::path run = dir_ / "killed";
  const std::string cfg = Config("killed");
  int64_t steps_before_kill = 0;
  {
    test::Child launcher({test::Binary("downpour-launch"), "--config", cfg, "--run-dir", run.string()},
                         dir_ / "killed.log");
    const fs::path worker0 = run / "metrics" / "worker-0.jsonl";
    for (int i = 0; i < 1200 && steps_before_kill < kKillAt; ++i) {  // bounded: 120 s
      std::vector<MetricRecord> recs;
      if (fs::exists(worker0) && ReadMetrics(worker0.string(), &recs).ok()) {
        steps_before_kill = 0;
        for (const auto& r : recs) steps_before_kill += r.Get("event").AsString() == "step";
      }
      if (steps_before_kill < kKillAt) std::this_thread::sleep_for(100ms);
    }
    ASSERT_GE(steps_before_kill, kKillAt) << test::ReadFile(dir_ / "killed.log");
    test::KillJob(launcher, 6, "coordinator, 2 servers, 2 workers, the evaluator");
  }
  ASSERT_TRUE(Worker(run, 0, "done").empty()) << "the run finished before it was killed";

  // Resume: same steps, curve continues, accuracy within noise.
  ASSERT_EQ(Launch({"--resume", run.string()}, "resumed.log"), 0) << test::ReadFile(dir_ / "resumed.log");
  for (int w = 0; w < 2; ++w) {
    const auto done = Worker(run, w, "done");
    ASSERT_FALSE(done.empty()) << "worker " << w;
    EXPECT_EQ(done.back().Get("steps").AsInt(), kSteps) << "worker " << w;
    const auto starts = Worker(run, w, "start");
    ASSERT_EQ(starts.size(), 2u) << "worker " << w;
    EXPECT_FALSE(starts[0].Get("resumed").AsBool());
    EXPECT_TRUE(starts[1].Get("resumed").AsBool());
  }
  const auto starts = Worker(run, 0, "start");
  const int64_t resume_step = starts[1].Get("resume_step").AsInt();
  const double wall_offset = starts[1].Get("wall_offset_s").AsDouble();
  EXPECT_GE(resume_step, steps_before_kill - 1) << "the worker saved its progress every step";
  EXPECT_GT(wall_offset, 0.0);
  // The records written after the resume continue the curve: steps resume_step+1 .. kSteps in
  // order, wall time from where it stopped.
  std::vector<MetricRecord> all;
  ASSERT_TRUE(ReadMetrics((run / "metrics" / "worker-0.jsonl").string(), &all).ok());
  bool after = false;
  int64_t expect_step = resume_step + 1;
  for (const auto& r : all) {
    const std::string event = r.Get("event").AsString();
    if (event == "start" && r.Get("resumed").AsBool()) after = true;
    if (!after || event != "step") continue;
    EXPECT_EQ(r.Get("step").AsInt(), expect_step);
    EXPECT_GE(r.Get("wall_s").AsDouble(), wall_offset);
    ++expect_step;
  }
  EXPECT_EQ(expect_step, kSteps + 1);
  // The servers continued from their checkpoints (not from fresh weights).
  for (int s = 0; s < 2; ++s) {
    EXPECT_NE(test::ReadFile(run / "logs" / fmt::format("server-{}.log", s)).find("restored from"), std::string::npos)
        << "server " << s;
  }
  const double resumed_top1 = FinalTop1(run);
  // Two async runs differ by their update order alone; with the lr at a tenth for the last 30%
  // of the steps they end close together: six repeats of this test (2026-11-29, 2-core VM) gave
  // 0.8228-0.8270 for the uninterrupted and the resumed runs alike (sd 0.0013), no pair over
  // 0.0042 apart.
  // (With the inv schedule this test had before, nearly flat, pairs ended up to 4 points apart
  // and the check had to allow 3.) What a broken resume does — progress lost, weights or the lr
  // schedule restarted — makes the resumed run worse, so the check is one-sided: not more than
  // 1 point below. A run that restarted from fresh weights is also caught above ("restored from"
  // in every server's log, the curve continuing at resume_step).
  EXPECT_GE(resumed_top1, whole_top1 - 0.01)
      << "uninterrupted " << whole_top1 << ", killed and resumed " << resumed_top1;
  std::printf("[resume] uninterrupted %.4f, killed at step %lld and resumed at %lld: %.4f\n", whole_top1,
              static_cast<long long>(steps_before_kill), static_cast<long long>(resume_step), resumed_top1);
  // The summary counts the run as one: two segments, every step once.
  std::string out;
  EXPECT_EQ(test::RunCommand({"/usr/bin/python3", test::SourcePath("tools/downpour-summarize"), run.string()}, &out), 0)
      << out;
  EXPECT_EQ(test::RunShell(fmt::format("/usr/bin/python3 -c \"import json; s = json.load(open('{}')); "
                                       "assert s['segments'] == 2 and s['steps'] == {}, s\"",
                                       (run / "summary.json").string(), 2 * kSteps),
                           &out),
            0)
      << out;
  // A finished run is not resumed again.
  EXPECT_EQ(Launch({"--resume", run.string()}, "again.log"), 2);
  EXPECT_NE(test::ReadFile(dir_ / "again.log").find("already finished"), std::string::npos);

  // downpour-test on the uninterrupted run's saved model measures its final accuracy.
  EXPECT_EQ(test::RunCommand({test::Binary("downpour-test"), "--run-dir", whole.string(), "--json"}, &out), 0) << out;
  MetricRecord tested;
  ASSERT_TRUE(ParseMetricLine(out.substr(0, out.find('\n')), "downpour-test --json", &tested).ok()) << out;
  EXPECT_NEAR(tested.Get("top1").AsDouble(), whole_top1, 1e-6);
  EXPECT_EQ(tested.Get("images").AsInt(), 10000);

  // A fine-tune from that model: its first evaluation (before any step) is the model's accuracy.
  const fs::path tune = dir_ / "tune";
  ASSERT_EQ(Launch({"--config", Config("tune"), "--run-dir", tune.string(), "--weights",
                    (whole / "model_final.dpt").string(), "--set", "worker.steps=10", "--set", "solver.base_lr=0.001"},
                   "tune.log"),
            0)
      << test::ReadFile(dir_ / "tune.log");
  const auto evals = test::Metrics(tune, "evaluator.jsonl", "eval");
  ASSERT_GE(evals.size(), 2u);
  EXPECT_EQ(evals.front().Get("due").AsString(), "start");
  EXPECT_EQ(evals.front().Get("iter").AsInt(), 0);
  EXPECT_DOUBLE_EQ(evals.front().Get("top1").AsDouble(), whole_top1);
}

}  // namespace
}  // namespace downpour
