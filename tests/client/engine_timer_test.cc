// NetTimer (the library behind `downpour-time`): one row per layer in net order with
// non-negative times, totals that are the sums of the rows, and images/s = batch / step time.
// Also: a timing run leaves the parameters finite (its SGD steps are tiny).
#include <gtest/gtest.h>

#include <cmath>

#include "client/engine/net.h"
#include "client/engine/net_timer.h"
#include "downpour_config.h"

namespace downpour::engine {
namespace {

TEST(EngineTimer, PerLayerRowsSumToTotalsAndImagesPerSecondFollowsStepTime) {
  NetSpec spec;
  Status s = ParseNetSpecFile(DOWNPOUR_SOURCE_DIR "/configs/models/fmnist_small.toml", &spec);
  ASSERT_TRUE(s.ok()) << s.ToString();
  NetOptions opt;
  opt.batch = 8;
  opt.worker.threads = 1;
  std::unique_ptr<Net> net;
  s = Net::Create(spec, opt, &net);
  ASSERT_TRUE(s.ok()) << s.ToString();
  net->InitParams(5);

  const NetTiming t = TimeNet(*net, 2, 1);
  ASSERT_EQ(t.layers.size(), spec.layers.size());
  double fwd = 0.0, bwd = 0.0;
  for (size_t i = 0; i < t.layers.size(); ++i) {
    EXPECT_EQ(t.layers[i].name, spec.layers[i].name);
    EXPECT_GE(t.layers[i].forward_ms, 0.0);
    EXPECT_GE(t.layers[i].backward_ms, 0.0);
    fwd += t.layers[i].forward_ms;
    bwd += t.layers[i].backward_ms;
  }
  EXPECT_DOUBLE_EQ(t.forward_ms, fwd);
  EXPECT_DOUBLE_EQ(t.backward_ms, bwd);
  EXPECT_GT(t.forward_ms, 0.0);
  EXPECT_GT(t.step_ms, 0.0);
  EXPECT_GT(t.step_cpu_ms, 0.0);  // one thread's step is CPU work: never free
  EXPECT_EQ(t.batch, 8);
  EXPECT_NEAR(t.images_per_s, 1000.0 * 8 / t.step_ms, 1e-9 * t.images_per_s);
  EXPECT_GT(t.worker_step_ms, 0.0);  // the worker's step: forward + backward, no SGD
  // Accuracy has no backward.
  EXPECT_EQ(t.layers.back().type, "Accuracy");
  EXPECT_EQ(t.layers.back().backward_ms, 0.0);

  const std::string table = FormatTiming(t);
  EXPECT_NE(table.find("conv1"), std::string::npos);
  EXPECT_NE(table.find("images/s"), std::string::npos);
  EXPECT_NE(table.find("Worker step"), std::string::npos);

  EXPECT_GT(TimeTrainingStepMs(*net, 1, 0), 0.0);
  for (float v : net->params()) ASSERT_TRUE(std::isfinite(v));
}

}  // namespace
}  // namespace downpour::engine
