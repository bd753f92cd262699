// Unit tests of the worker's pieces: the push planner (every chunk released exactly once,
// groups per server, overlap with backward), the progress line, the JSONL writer.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>

#include <limits>

#include <gtest/gtest.h>

#include "client/worker/progress.h"
#include "client/worker/push_planner.h"
#include "client/worker/trainer.h"
#include "common/layout.h"

namespace downpour::worker {
namespace {

// The small Fashion-MNIST net's tensors (conv1 32×1×5×5, conv2 64×32×5×5, fc1 256×2304,
// fc2 10×256, each with a bias).
std::vector<TensorSpec> SmallNetSpecs() {
  return {{"conv1.weight", {32, 1, 5, 5}},  {"conv1.bias", {32}, 2, 0},  {"conv2.weight", {64, 32, 5, 5}},
          {"conv2.bias", {64}, 2, 0},       {"fc1.weight", {256, 2304}}, {"fc1.bias", {256}, 2, 0},
          {"fc2.weight", {10, 256}},        {"fc2.bias", {10}, 2, 0}};
}

// Backward order: later layers first, bias before weight.
std::vector<int> BackwardOrder(int tensors) {
  std::vector<int> order;
  for (int layer = tensors / 2 - 1; layer >= 0; --layer) {
    order.push_back(2 * layer + 1);
    order.push_back(2 * layer);
  }
  return order;
}

TEST(PushPlanner, ReleasesEveryChunkOnceToItsOwner) {
  for (int servers : {1, 2, 3}) {
    for (int64_t chunk : {int64_t{1} << 20, int64_t{50000}, int64_t{4096}}) {
      ParamLayout layout;
      ASSERT_TRUE(ParamLayout::Build(SmallNetSpecs(), servers, chunk, &layout).ok());
      PushPlanner planner(layout);
      std::multiset<int32_t> seen;
      for (int t : BackwardOrder(8)) {
        for (const PushGroup& g : planner.OnTensorReady(t)) {
          int64_t elems = 0;
          EXPECT_TRUE(std::is_sorted(g.chunk_ids.begin(), g.chunk_ids.end()));
          for (int32_t id : g.chunk_ids) {
            EXPECT_EQ(layout.chunk(id).server, g.server);
            // Only chunks of tensors already final may be released.
            EXPECT_TRUE(std::find(BackwardOrder(8).begin(), BackwardOrder(8).end(), layout.chunk(id).tensor) !=
                        BackwardOrder(8).end());
            elems += layout.chunk(id).count;
            seen.insert(id);
          }
          EXPECT_EQ(elems, g.elems);
        }
      }
      EXPECT_TRUE(planner.Flush().empty());
      EXPECT_TRUE(planner.AllReleased());
      ASSERT_EQ(static_cast<int>(seen.size()), layout.num_chunks()) << servers << " servers, chunk " << chunk;
      for (int id = 0; id < layout.num_chunks(); ++id) EXPECT_EQ(seen.count(id), 1u);
    }
  }
}

TEST(PushPlanner, OverlapsBackwardAcrossServers) {
  // 2 servers: server 1 holds the tail of the flat space (fc1's end, fc2), which backward
  // finishes first, so server 1's gradients must leave before conv1 (server 0) is final.
  ParamLayout layout;
  ASSERT_TRUE(ParamLayout::Build(SmallNetSpecs(), 2, int64_t{1} << 20, &layout).ok());
  // No size threshold: a server is released exactly when its last tensor is final.
  PushPlanner planner(layout, std::numeric_limits<int64_t>::max());
  std::vector<int> release_step(2, -1);
  const auto order = BackwardOrder(8);
  for (size_t i = 0; i < order.size(); ++i)
    for (const PushGroup& g : planner.OnTensorReady(order[i]))
      if (release_step[static_cast<size_t>(g.server)] < 0) release_step[static_cast<size_t>(g.server)] = static_cast<int>(i);
  ASSERT_GE(release_step[1], 0);
  EXPECT_EQ(release_step[1], 3) << "server 1's last tensor is fc1.weight (4th in backward)";
  EXPECT_EQ(release_step[0], static_cast<int>(order.size()) - 1) << "server 0 completes with conv1.weight";
}

TEST(PushPlanner, ThresholdSplitsBigServers) {
  // One server, threshold 1000 floats: fc1.weight (589,824 floats) is released as soon as it
  // is final, long before conv1 is.
  ParamLayout layout;
  ASSERT_TRUE(ParamLayout::Build(SmallNetSpecs(), 1, int64_t{1} << 20, &layout).ok());
  PushPlanner planner(layout, 1000);
  planner.OnTensorReady(7);
  planner.OnTensorReady(6);  // fc2: 2,570 floats ≥ 1000 → released with fc2.weight
  planner.Reset();
  EXPECT_TRUE(planner.OnTensorReady(7).empty());  // 10 floats < 1000
  const auto groups = planner.OnTensorReady(6);
  ASSERT_EQ(groups.size(), 1u);
  EXPECT_EQ(groups[0].elems, 2570);
  EXPECT_EQ(groups[0].chunk_ids.size(), 2u);
  EXPECT_FALSE(planner.AllReleased());
}

TEST(Progress, FormatsStepRateLossAndEta) {
  ProgressState p;
  p.worker_id = 1;
  p.epoch = 2;
  p.step = 100;
  p.total_steps = 400;
  p.images_per_s = 812.4;
  p.loss = 0.43219;
  p.elapsed_s = 20;  // 0.2 s/step → 300 steps left = 60 s
  EXPECT_EQ(FormatProgress(p), "w1 epoch 2 step 100/400 (25%) 812 img/s loss 0.4322 eta 1m00s");
  EXPECT_EQ(FormatDuration(3723), "1h02m03s");
  EXPECT_EQ(FormatDuration(7.4), "7s");
  EXPECT_EQ(FormatDuration(-1), "?");
}

TEST(Progress, QuietPrintsNothing) {
  const auto path = std::filesystem::temp_directory_path() / "train_progress_quiet.txt";
  std::FILE* f = std::fopen(path.c_str(), "w");
  ASSERT_NE(f, nullptr);
  ProgressReporter quiet(f, ProgressReporter::Mode::kQuiet);
  ProgressState p;
  quiet.Update(p, true);
  quiet.Note("eval");
  quiet.Finish();
  ProgressReporter plain(f, ProgressReporter::Mode::kAuto, 0.0, 0.0);
  plain.Update(p, true);
  std::fclose(f);
  std::ifstream in(path);
  std::string all((std::istreambuf_iterator<char>(in)), {});
  EXPECT_EQ(all, "w0 epoch 0 step 0 0 img/s loss 0.0000\n");  // only the non-quiet line
  std::filesystem::remove(path);
}

TEST(LearningRate, MatchesCaffePolicies) {
  SolverConfig s;
  s.base_lr = 0.01f;
  s.lr_policy = LrPolicy::kInv;
  s.gamma = 0.0001f;
  s.power = 0.75f;
  EXPECT_NEAR(LearningRate(s, 1000), 0.01 * std::pow(1.1, -0.75), 1e-9);
  s.lr_policy = LrPolicy::kStep;
  s.gamma = 0.1f;
  s.stepsize = 100;
  EXPECT_NEAR(LearningRate(s, 250), 0.01 * 0.01, 1e-9);
  s.lr_policy = LrPolicy::kMultistep;
  s.stepvalues = {10, 20};
  EXPECT_NEAR(LearningRate(s, 20), 0.01 * 0.01, 1e-9);
  EXPECT_NEAR(LearningRate(s, 9), 0.01, 1e-9);
}

}  // namespace
}  // namespace downpour::worker
