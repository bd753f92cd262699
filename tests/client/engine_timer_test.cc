// NetTimer (the library behind `downpour-time`): one row per layer in net order with
// non-negative times, totals that are the sums of the rows, and images/s = batch / step time.
// Also: a timing run leaves the parameters finite (its SGD steps are tiny).
#include <gtest/gtest.h>

#include <cmath>

#include "client/engine/emulated_copy_backend.h"
#include "client/engine/net.h"
#include "client/engine/net_timer.h"
#include "downpour_config.h"

namespace downpour::engine {
namespace {

// fmnist_small at `batch` on one CPU thread; `emulated`: behind the device stand-in.
void SmallNet(int batch, bool emulated, NetSpec* spec, std::unique_ptr<Net>* net) {
  Status s = ParseNetSpecFile(DOWNPOUR_SOURCE_DIR "/configs/models/fmnist_small.toml", spec);
  ASSERT_TRUE(s.ok()) << s.ToString();
  NetOptions opt;
  opt.batch = batch;
  opt.worker.threads = 1;
  std::unique_ptr<Backend> backend;
  ASSERT_TRUE(CreateBackend(opt, &backend).ok());
  if (emulated) backend = std::make_unique<EmulatedCopyBackend>(std::move(backend), std::chrono::microseconds(100));
  s = Net::CreateWithBackend(*spec, opt, std::move(backend), net);
  ASSERT_TRUE(s.ok()) << s.ToString();
  (*net)->InitParams(5);
}

TEST(EngineTimer, PerLayerRowsSumToTotalsAndImagesPerSecondFollowsStepTime) {
  NetSpec spec;
  std::unique_ptr<Net> net;
  ASSERT_NO_FATAL_FAILURE(SmallNet(8, false, &spec, &net));

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
  EXPECT_EQ(t.worker_bytes_step_ms, 0.0) << "a host backend takes no byte input";
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

// A backend that normalises its input (here the device stand-in) is also timed on byte input, as
// a GPU worker feeds it; the table and the net's state say so.
TEST(EngineTimer, ADeviceIsAlsoTimedOnByteInput) {
  NetSpec spec;
  std::unique_ptr<Net> net;
  ASSERT_NO_FATAL_FAILURE(SmallNet(4, true, &spec, &net));
  const NetTiming t = TimeNet(*net, 1, 1);
  EXPECT_GT(t.worker_bytes_step_ms, 0.0);
  EXPECT_TRUE(net->has_input_normalization());
  EXPECT_NE(FormatTiming(t).find("Worker step with byte input"), std::string::npos);
}

}  // namespace
}  // namespace downpour::engine
