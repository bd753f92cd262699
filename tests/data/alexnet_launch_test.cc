// alexnet_launch_test.cc — the distributed AlexNet path end to end, small: configs/runs/alexnet.toml
// (2 servers × 2 workers, async, crop 227 + mirror + mean) launched for 3 steps of batch 4 on a
// 200-image Fashion-256 subset made here as scripts/get_fashion_mnist --alexnet makes the full
// one (convert-idx --resize 256 --channels 3 --encoded jpg, then the mean). It shows the
// converter's records, the shape check, the loader's crop/mirror/mean and the 57M-parameter
// push/pull path agree; convergence is bench/train/alexnet_fashion256.py's job. Label heavy.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include <fmt/format.h>

#include "data/convert.h"
#include "data/mean_file.h"
#include "downpour_config.h"
#include "tests/testing/harness.h"

namespace downpour::data {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

constexpr char kFashion[] = DOWNPOUR_FASHION_MNIST_DIR;

Status Subset(const std::string& images, const std::string& labels, int64_t n, const std::string& out) {
  IdxOptions idx;
  idx.resize = 256;
  idx.channels = 3;
  idx.encoded = "jpg";
  idx.limit = n;
  ConvertOptions o;
  o.out = out;
  ConvertReport r;
  return ConvertIdx(fs::path(kFashion) / images, fs::path(kFashion) / labels, idx, o, &r);
}

TEST(AlexNetLaunch, TwoServersTwoWorkersAsyncTakeThreeStepsAndEvaluate) {
  if (!fs::exists(fs::path(kFashion) / "train-images-idx3-ubyte.gz")) GTEST_SKIP() << "dataset-fashion-mnist missing";
  const fs::path dir = test::ScratchDir("alexnet_launch");
  const std::string train = (dir / "train_lmdb").string(), test_db = (dir / "test_lmdb").string();
  ASSERT_TRUE(Subset("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", 200, train).ok());
  ASSERT_TRUE(Subset("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz", 100, test_db).ok());
  MeanImage mean;
  ASSERT_TRUE(ComputeMean(train, &mean).ok());
  ASSERT_TRUE(WriteMeanFile(mean, (dir / "mean.tensor").string()).ok());

  const int port = test::FreePortRange(3);
  const fs::path run = dir / "run";
  std::vector<std::string> argv = {test::Binary("downpour-launch"), "--config",
                                   test::SourcePath("configs/runs/alexnet.toml"), "--run-dir", run.string()};
  for (const std::string& set :
       {fmt::format("model.config={}", test::SourcePath("configs/models/alexnet_fashion.toml")),
        fmt::format("cluster.coordinator=127.0.0.1:{}", port), fmt::format("cluster.base_port={}", port + 1),
        std::string("worker.batch_size=4"), std::string("worker.steps=3"), "data.train=" + train,
        "data.test=" + test_db, "data.mean_file=" + (dir / "mean.tensor").string(), std::string("eval.test_batches=1"),
        std::string("checkpoint.every_updates=0")}) {
    argv.push_back("--set");
    argv.push_back(set);
  }
  test::Child launcher(argv, dir / "launch.log");
  ASSERT_EQ(launcher.WaitExit(150s), 0) << test::ReadFile(dir / "launch.log");

  for (int w = 0; w < 2; ++w) {
    const auto steps = test::Metrics(run, fmt::format("worker-{}.jsonl", w), "step");
    ASSERT_EQ(steps.size(), 3u) << "worker " << w;
    for (const auto& s : steps) {
      const double loss = s.Get("loss").AsDouble();
      EXPECT_TRUE(std::isfinite(loss) && loss > 0 && loss < 10) << "worker " << w << " loss " << loss;
      EXPECT_EQ(s.Get("images").AsInt(), 4 * s.Get("step").AsInt());
    }
  }
  // The run's evaluator process made the evaluations (no worker does).
  const auto evals = test::Metrics(run, "evaluator.jsonl", "eval");
  ASSERT_FALSE(evals.empty());
  EXPECT_TRUE(evals.back().Get("final").AsBool());
  EXPECT_EQ(evals.back().Get("test_images").AsInt(), 100);
  EXPECT_TRUE(std::isfinite(evals.back().Get("test_loss").AsDouble()));
  // Both servers took every push they got, and the final weights were saved.
  for (int i = 0; i < 2; ++i) {
    const std::string log = test::ReadFile(run / "logs" / fmt::format("server-{}.log", i));
    EXPECT_NE(log.find(" rejected 0 "), std::string::npos) << log;
  }
  EXPECT_TRUE(fs::exists(run / "model_final.dpt"));
  if (!HasFailure()) fs::remove_all(dir);
}

}  // namespace
}  // namespace downpour::data
