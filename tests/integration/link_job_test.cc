// link_job_test.cc — a real job (launcher, coordinator, 2 servers, 2 workers, Fashion-MNIST on
// the small net) on an emulated link (cluster.link_gbps, docs/emulated_links.md), given as
// `--set` as users would: the launcher, every server and every worker say the link is on and
// shared memory off; each worker step moves about one model of gradients out and one of weights
// in (tx_bytes / rx_bytes in the step records), and takes at least the time a model's bytes
// need on the link; the done and server_end records carry totals that agree with each other.
// With cluster.reply_order = "step" the same job finishes with every push applied once.
// Every wait is bounded; every process is reaped (tests/testing/harness.h).
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "common/metrics.h"
#include "tests/testing/harness.h"
#include "tests/testing/job_config.h"

namespace downpour {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using ::testing::HasSubstr;

const char* kFmnist = test::kFashionMnistDir;
constexpr int kSteps = 30;
constexpr double kLinkGbps = 0.2;  // slow enough that the link, not this machine, bounds a step

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Runs the small job on the emulated link with `more` settings; its scratch dir in *dir.
void RunLinkJob(const std::string& name, const std::vector<std::string>& more, fs::path* dir, std::string* out) {
  ASSERT_NO_FATAL_FAILURE(test::RequireJobBinaries());
  *dir = test::ScratchDir(name);
  test::FashionJob("fmnist_small", kSteps).Set("eval.test_batches", 10).Write(*dir / "job.toml");
  std::vector<std::string> cmd{test::Binary("downpour-launch"),
                               "--config",
                               (*dir / "job.toml").string(),
                               "--run-dir",
                               (*dir / "run").string(),
                               "--set",
                               fmt::format("cluster.link_gbps={}", kLinkGbps)};
  for (const std::string& s : more) cmd.insert(cmd.end(), {"--set", s});
  ASSERT_EQ(test::RunCommand(cmd, out, 240s), 0) << *out;
}

TEST(LinkJob, EveryProcessIsPacedAndStepsCountTheirWireBytes) {
  if (!fs::exists(fs::path(kFmnist) / "train-images-idx3-ubyte.gz")) GTEST_SKIP() << "dataset-fashion-mnist missing";
  fs::path dir;
  std::string out;
  ASSERT_NO_FATAL_FAILURE(RunLinkJob("link-job", {}, &dir, &out));
  const fs::path run = dir / "run";
  const std::string line = fmt::format("emulated link: cluster.link_gbps = {:g} Gbit/s", kLinkGbps);
  EXPECT_THAT(out, HasSubstr("[launch] " + line));
  for (const char* log : {"server-0.log", "server-1.log", "worker-0.log", "worker-1.log"}) {
    EXPECT_THAT(test::ReadFile(run / "logs" / log), HasSubstr(line + " of egress per process (experiments only); "
                                                              "shared memory off"))
        << log;
  }

  double workers_tx = 0, workers_rx = 0;
  for (int w = 0; w < 2; ++w) {
    const std::string file = fmt::format("worker-{}.jsonl", w);
    const auto start = test::Metrics(run, file, "start");
    ASSERT_EQ(start.size(), 1u);
    const double model_bytes = 4.0 * static_cast<double>(start[0].Get("params").AsInt());
    const auto steps = test::Metrics(run, file, "step");
    ASSERT_EQ(steps.size(), static_cast<size_t>(kSteps)) << file;
    std::vector<double> tx, rx, step_ms;
    double step_tx_sum = 0;
    for (size_t i = 0; i < steps.size(); ++i) {
      step_tx_sum += static_cast<double>(steps[i].Get("tx_bytes").AsInt());
      if (i == 0) continue;  // the first step's whole pull is no overlapped one
      tx.push_back(static_cast<double>(steps[i].Get("tx_bytes").AsInt()));
      rx.push_back(static_cast<double>(steps[i].Get("rx_bytes").AsInt()));
      step_ms.push_back(steps[i].Get("step_ms").AsDouble());
    }
    // One model of gradients out and one of weights in per step, plus headers, acks, clocks.
    EXPECT_GE(Median(tx), model_bytes) << file;
    EXPECT_LE(Median(tx), 1.05 * model_bytes) << file;
    EXPECT_GE(Median(rx), 0.95 * model_bytes) << file;
    EXPECT_LE(Median(rx), 1.05 * model_bytes) << file;
    // The push alone needs model_bytes on a link of kLinkGbps.
    const double link_ms = model_bytes * 8 / (kLinkGbps * 1e9) * 1e3;
    EXPECT_GE(Median(step_ms), 0.95 * link_ms) << file << ": the worker's link did not pace its pushes";
    const auto done = test::Metrics(run, file, "done");
    ASSERT_EQ(done.size(), 1u);
    const double done_tx = static_cast<double>(done[0].Get("tx_bytes").AsInt());
    EXPECT_GE(done_tx, step_tx_sum) << file << ": the total is less than its steps";
    // Beyond its steps: the init push, and the last step's pushes, which may still be in the
    // pacer when its record is written (no step waits for its own acknowledgements); register,
    // clocks and evaluation are small.
    EXPECT_LE(done_tx, step_tx_sum + 3 * model_bytes) << file << ": more than the init push and the last step's";
    workers_tx += done_tx;
    workers_rx += static_cast<double>(done[0].Get("rx_bytes").AsInt());
  }
  // What the workers sent the servers received (the coordinator's share is heartbeats), and back.
  double servers_tx = 0, servers_rx = 0;
  for (int s = 0; s < 2; ++s) {
    const auto end = test::Metrics(run, fmt::format("server-{}.jsonl", s), "server_end");
    ASSERT_EQ(end.size(), 1u);
    servers_tx += static_cast<double>(end[0].Get("tx_bytes").AsInt());
    servers_rx += static_cast<double>(end[0].Get("rx_bytes").AsInt());
  }
  EXPECT_NEAR(servers_rx, workers_tx, 0.02 * workers_tx);
  EXPECT_NEAR(servers_tx, workers_rx, 0.02 * workers_rx);
  fs::remove_all(dir);
}

// Replies ordered by step: the job finishes, and each server applied every push it took exactly
// once (nothing refused, no duplicate), the same number from both workers.
TEST(LinkJob, StepReplyOrderFinishesWithEveryPushAppliedOnce) {
  if (!fs::exists(fs::path(kFmnist) / "train-images-idx3-ubyte.gz")) GTEST_SKIP() << "dataset-fashion-mnist missing";
  fs::path dir;
  std::string out;
  ASSERT_NO_FATAL_FAILURE(RunLinkJob("link-job-step", {"cluster.reply_order=\"step\""}, &dir, &out));
  const fs::path run = dir / "run";
  for (int w = 0; w < 2; ++w) {
    EXPECT_EQ(test::Metrics(run, fmt::format("worker-{}.jsonl", w), "step").size(), static_cast<size_t>(kSteps));
  }
  for (int s = 0; s < 2; ++s) {
    const auto end = test::Metrics(run, fmt::format("server-{}.jsonl", s), "server_end");
    ASSERT_EQ(end.size(), 1u);
    const int64_t received = end[0].Get("pushes_received").AsInt();
    EXPECT_GT(received, 0);
    EXPECT_EQ(end[0].Get("pushes_applied").AsInt(), received) << "server " << s;
    EXPECT_EQ(end[0].Get("pushes_rejected").AsInt(), 0) << "server " << s;
    EXPECT_EQ(end[0].Get("duplicates").AsInt(), 0) << "server " << s;
    const std::string by_worker = end[0].Get("pushes_by_worker").AsString();
    const auto comma = by_worker.find(',');
    ASSERT_NE(comma, std::string::npos) << by_worker;
    EXPECT_EQ(std::stoll(by_worker.substr(1, comma - 1)), std::stoll(by_worker.substr(comma + 1))) << by_worker;
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace downpour
