// The learning test: the default job's Fashion-MNIST net (configs/models/fmnist_fast.toml:
// fmnist_small with a 3×3 conv2, about half its arithmetic) trained on the oneDNN engine alone (no servers) with the servers' own update rule
// (common/solver: SgdUpdate, LearningRateAt) reaches >= 89% top-1 accuracy on the 10,000
// test images of Debian's dataset-fashion-mnist, in a bounded run (a fixed number of epochs,
// a few minutes on 2 busy cores). Prints per-epoch accuracy, images/s and wall time.
//
// Inputs: train 60000×1×28×28 and t10k 10000×1×28×28 uint8 → float (x/255 − mean)/std with
// mean/std measured on the training images.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <numeric>
#include <random>

#include "client/engine/net.h"
#include "common/run_config.h"
#include "data/idx.h"
#include "downpour_config.h"
#include "common/solver/lr_policy.h"
#include "common/solver/sgd.h"

namespace downpour::engine {
namespace {

struct Split {
  int64_t count = 0;
  std::vector<float> images;  // count × 1 × 28 × 28, normalised
  std::vector<int> labels;    // count
};

Status LoadSplit(const std::string& dir, const std::string& prefix, Split* out) {
  data::IdxImages images;
  std::vector<uint8_t> labels;
  DP_RETURN_IF_ERROR(data::ReadIdxImages(dir + "/" + prefix + "-images-idx3-ubyte.gz", &images));
  DP_RETURN_IF_ERROR(data::ReadIdxLabels(dir + "/" + prefix + "-labels-idx1-ubyte.gz", &labels));
  if (static_cast<int64_t>(labels.size()) != images.count)
    return InvalidArgument("{}/{}: {} images but {} labels", dir, prefix, images.count, labels.size());
  out->count = images.count;
  out->images.resize(images.pixels.size());
  for (size_t i = 0; i < images.pixels.size(); ++i) out->images[i] = images.pixels[i] / 255.0f;
  out->labels.assign(labels.begin(), labels.end());
  return Status::Ok();
}

void Normalise(float mean, float stddev, Split* s) {
  for (float& v : s->images) v = (v - mean) / stddev;
}

double Seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Top-1 accuracy over a whole split, in batches of the net's batch size (the tail that does
// not fill a batch is evaluated by reshaping to its size).
float TestAccuracy(Net& net, const Split& s) {
  const int batch = net.batch_size();
  const int64_t image_size = net.input_count() / batch;
  int64_t correct = 0;
  for (int64_t first = 0; first < s.count; first += batch) {
    const int n = static_cast<int>(std::min<int64_t>(batch, s.count - first));
    if (n != net.batch_size()) {
      EXPECT_TRUE(net.Reshape(n).ok());
    }
    const EvalResult r = net.Forward(s.images.data() + first * image_size, s.labels.data() + first);
    correct += std::lround(r.top1 * n);
  }
  EXPECT_TRUE(net.Reshape(batch).ok());
  return static_cast<float>(correct) / static_cast<float>(s.count);
}

TEST(EngineLearning, FashionMnistNetReaches89Percent) {
  const std::string dir = DOWNPOUR_FASHION_MNIST_DIR;
  if (!std::filesystem::exists(dir + "/train-images-idx3-ubyte.gz"))
    GTEST_SKIP() << "Fashion-MNIST not found in " << dir << " (Debian package dataset-fashion-mnist)";
  const auto t_start = std::chrono::steady_clock::now();
  Split train, test;
  Status s = LoadSplit(dir, "train", &train);
  ASSERT_TRUE(s.ok()) << s.ToString();
  s = LoadSplit(dir, "t10k", &test);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_EQ(train.count, 60000);
  ASSERT_EQ(test.count, 10000);
  double sum = 0.0, sum_sq = 0.0;
  for (float v : train.images) {
    sum += v;
    sum_sq += double(v) * v;
  }
  const double mean = sum / train.images.size();
  const double stddev = std::sqrt(sum_sq / train.images.size() - mean * mean);
  Normalise(static_cast<float>(mean), static_cast<float>(stddev), &train);
  Normalise(static_cast<float>(mean), static_cast<float>(stddev), &test);

  NetSpec spec;
  s = ParseNetSpecFile(std::string(DOWNPOUR_SOURCE_DIR) + "/configs/models/fmnist_fast.toml", &spec);
  ASSERT_TRUE(s.ok()) << s.ToString();
  NetOptions opt;
  opt.batch = 64;
  // One compute thread: on a 2-core machine shared with a parallel build or other tests, a
  // second OpenMP thread waits a scheduler slice at every layer's barrier, which makes every
  // step slower under load; one thread is also what CI's 2 cores give each test anyway.
  opt.worker.threads = 1;
  std::unique_ptr<Net> net;
  s = Net::Create(spec, opt, &net);
  ASSERT_TRUE(s.ok()) << s.ToString();
  net->InitParams(2024);

  // The servers' solver: Caffe-style SGD, momentum 0.9, L2 5e-4 (biases: lr×2, no decay per
  // param_specs()), poly decay to 0 over the run. Two epochs reach 89.7% (one thread and fixed
  // seeds make the run repeat exactly on one CPU); three reached 90.2% in half as long again, CI
  // time the margin did not need.
  constexpr int kEpochs = 2;
  const int batch = net->batch_size();
  const int64_t steps_per_epoch = train.count / batch;
  SolverConfig solver;
  solver.base_lr = 0.02f;
  solver.lr_policy = LrPolicy::kPoly;
  solver.power = 1.0f;
  solver.max_iter = kEpochs * steps_per_epoch;
  solver.momentum = 0.9f;
  solver.weight_decay = 5e-4f;
  std::vector<float> history(net->params().size(), 0.0f);
  const auto& specs = net->param_specs();

  // The grad-ready callback reports every tensor exactly once per step, later layers first.
  std::vector<int> ready_order;
  net->SetGradReadyCallback([&](int i) { ready_order.push_back(i); });

  const int64_t image_size = net->input_count() / batch;
  std::vector<int64_t> order(train.count);
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 rng(7);
  std::vector<float> images(net->input_count());
  std::vector<int> labels(batch);
  int64_t iter = 0;
  float accuracy = 0.0f;
  for (int epoch = 0; epoch < kEpochs; ++epoch) {
    const auto t_epoch = std::chrono::steady_clock::now();
    std::shuffle(order.begin(), order.end(), rng);
    double loss_sum = 0.0;
    for (int64_t b = 0; b < steps_per_epoch; ++b, ++iter) {
      for (int i = 0; i < batch; ++i) {
        const int64_t k = order[b * batch + i];
        std::copy_n(train.images.data() + k * image_size, image_size, images.data() + i * image_size);
        labels[i] = train.labels[k];
      }
      ready_order.clear();
      const float loss = net->ForwardBackward(images.data(), labels.data());
      ASSERT_TRUE(std::isfinite(loss)) << "step " << iter;
      loss_sum += loss;
      if (iter == 0) {
        ASSERT_EQ(ready_order.size(), specs.size());
        for (size_t j = 0; j < ready_order.size(); ++j)
          EXPECT_EQ(ready_order[j], static_cast<int>(specs.size() - 1 - j));
      }
      for (size_t t = 0; t < specs.size(); ++t) {
        const UpdateParams p = MakeUpdateParams(solver, iter, specs[t].lr_mult, specs[t].decay_mult, 1.0f);
        const int64_t off = net->param_offset(static_cast<int>(t));
        const size_t n = static_cast<size_t>(specs[t].numel());
        SgdUpdate(p, net->grad(static_cast<int>(t)), net->param(static_cast<int>(t)),
                  std::span<float>(history.data() + off, n));
      }
    }
    const double train_s = Seconds(t_epoch);
    accuracy = TestAccuracy(*net, test);
    std::printf("epoch %d: mean train loss %.4f, test top-1 %.4f, %.0f images/s training, "
                "epoch %.1f s, total %.1f s\n",
                epoch + 1, loss_sum / steps_per_epoch, accuracy,
                steps_per_epoch * batch / train_s, Seconds(t_epoch), Seconds(t_start));
    std::fflush(stdout);
  }
  std::printf("final test accuracy %.4f after %d epochs, wall time %.1f s\n", accuracy, kEpochs,
              Seconds(t_start));
  EXPECT_GE(accuracy, 0.89f);
}

}  // namespace
}  // namespace downpour::engine
