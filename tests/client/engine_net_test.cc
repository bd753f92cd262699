// Net's checks of its inputs and its blob read-back:
//  * CheckLabels: a label outside [0, num_classes) is bad input from a data file, an error that
//    names the position in the batch, the label, the number of classes, the loss layer and its
//    bottoms, and the net — while ForwardBackward / Forward still CHECK the range (an invariant
//    once the caller has run CheckLabels).
//  * ReadBlob: any blob by name in canonical layout (the same values on the reference and the
//    oneDNN backend, whose blob may be blocked); an unknown name is NotFound naming it.
//  * SgdUpdate: the servers' rule (common/solver), bit for bit, with each tensor's multipliers.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <random>

#include "client/engine/net.h"
#include "client/engine/reference_backend.h"
#include "client/engine/tensor_compare.h"
#include "common/solver/sgd.h"
#include "downpour_config.h"

namespace downpour::engine {
namespace {

std::unique_ptr<Net> SmallNet(bool reference, int batch) {
  NetSpec spec;
  Status s = ParseNetSpecFile(std::string(DOWNPOUR_SOURCE_DIR) + "/configs/models/fmnist_small.toml", &spec);
  EXPECT_TRUE(s.ok()) << s.ToString();
  NetOptions opt;
  opt.batch = batch;
  opt.reference = reference;
  opt.worker.threads = 1;
  std::unique_ptr<Net> net;
  s = Net::Create(spec, opt, &net);
  EXPECT_TRUE(s.ok()) << s.ToString();
  if (net) net->InitParams(7);
  return net;
}

// One solver: the engine's local update is common/solver's SgdUpdate per tensor (lr_mult,
// decay_mult from the model), bit for bit, over several steps with momentum and weight decay.
TEST(EngineNet, SgdUpdateIsTheServersRuleBitForBit) {
  auto net = SmallNet(true, 4);
  ASSERT_NE(net, nullptr);
  const size_t n = net->params().size();
  std::vector<float> w(net->params().begin(), net->params().end()), h(n, 0.0f), hist(n, 0.0f);
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0.0f, 0.1f);
  for (int step = 0; step < 3; ++step) {
    for (float& g : net->grads()) g = dist(rng);
    std::vector<float> g(net->grads().begin(), net->grads().end());
    const float lr = 0.05f / static_cast<float>(step + 1);
    net->SgdUpdate(lr, 0.9f, 5e-4f, hist);
    for (size_t t = 0; t < net->param_specs().size(); ++t) {
      const TensorSpec& spec = net->param_specs()[t];
      UpdateParams p;
      p.lr = lr;
      p.momentum = 0.9f;
      p.weight_decay = 5e-4f;
      p.lr_mult = spec.lr_mult;
      p.decay_mult = spec.decay_mult;
      const auto off = static_cast<size_t>(net->param_offset(static_cast<int>(t)));
      const auto len = static_cast<size_t>(spec.numel());
      downpour::SgdUpdate(p, std::span<const float>(g).subspan(off, len), std::span<float>(w).subspan(off, len),
                          std::span<float>(h).subspan(off, len));
    }
    ASSERT_EQ(std::memcmp(w.data(), net->params().data(), n * sizeof(float)), 0) << "weights after step " << step;
    ASSERT_EQ(std::memcmp(h.data(), hist.data(), n * sizeof(float)), 0) << "history after step " << step;
  }
}

// worker.emulate_ms: a training step runs no kernel but sleeps each layer's time, with the
// before-layer callbacks in forward order and the grad-ready callbacks in a real step's order
// (the same tensors, the same sequence), and leaves weights and gradients as they were.
TEST(EngineNet, EmulatedComputeSleepsTheLayersWithARealStepsCallbacks) {
  auto real = SmallNet(true, 4), emulated = SmallNet(true, 4);
  ASSERT_NE(real, nullptr);
  ASSERT_NE(emulated, nullptr);
  const int layers = emulated->num_layers();
  std::vector<int> real_before, real_ready, before, ready;
  real->SetBeforeLayerCallback([&](int l) { real_before.push_back(l); });
  real->SetGradReadyCallback([&](int t) { real_ready.push_back(t); });
  emulated->SetBeforeLayerCallback([&](int l) { before.push_back(l); });
  emulated->SetGradReadyCallback([&](int t) { ready.push_back(t); });
  std::vector<float> images(real->input_count(), 0.5f);
  std::vector<int> labels(4, 1);
  real->ForwardBackward(images.data(), labels.data());

  // Forward 2 ms and backward 3 ms a layer: 5 ms × layers a step.
  std::vector<float> ms;
  for (int l = 0; l < layers; ++l) ms.insert(ms.end(), {2.0f, 3.0f});
  ASSERT_TRUE(emulated->SetEmulatedCompute(ms).ok());
  EXPECT_TRUE(emulated->emulated());
  std::fill(emulated->grads().begin(), emulated->grads().end(), 0.0f);
  const std::vector<float> weights(emulated->params().begin(), emulated->params().end());
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(emulated->ForwardBackward(images.data(), labels.data()), 0.0f);
  const double took = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(took, 5.0 * layers);  // every layer's sleep, at least
  EXPECT_EQ(before, real_before);
  EXPECT_EQ(ready, real_ready);
  EXPECT_TRUE(std::all_of(emulated->grads().begin(), emulated->grads().end(), [](float g) { return g == 0.0f; }));
  EXPECT_TRUE(std::equal(weights.begin(), weights.end(), emulated->params().begin()));

  // The count must be two per layer; an empty list turns it off.
  ms.pop_back();
  const Status bad = emulated->SetEmulatedCompute(ms);
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(bad.ToString().find("worker.emulate_ms has " + std::to_string(2 * layers - 1) + " values"),
            std::string::npos)
      << bad.ToString();
  EXPECT_NE(bad.ToString().find("expected " + std::to_string(2 * layers)), std::string::npos) << bad.ToString();
  EXPECT_FALSE(emulated->SetEmulatedCompute(std::vector<float>(2 * layers, -1.0f)).ok());
  ASSERT_TRUE(emulated->SetEmulatedCompute({}).ok());
  EXPECT_FALSE(emulated->emulated());
  EXPECT_GT(emulated->ForwardBackward(images.data(), labels.data()), 0.0f);  // it computes again: a loss
  EXPECT_TRUE(std::any_of(emulated->grads().begin(), emulated->grads().end(), [](float g) { return g != 0.0f; }));
}

TEST(EngineNet, CheckLabelsAcceptsEveryClass) {
  auto net = SmallNet(false, 4);
  ASSERT_EQ(net->num_classes(), 10);
  const std::vector<int> labels = {0, 9, 5, 3};
  EXPECT_TRUE(net->CheckLabels(labels.data(), 4).ok());
  EXPECT_TRUE(net->CheckLabels(labels.data(), 0).ok());
}

TEST(EngineNet, LabelOutsideTheClassesIsAnErrorNamingPositionLabelClassesAndLossLayer) {
  auto net = SmallNet(false, 4);
  for (int bad : {10, -1, 255}) {
    const std::vector<int> labels = {1, 2, bad, 3};
    const Status s = net->CheckLabels(labels.data(), 4);
    ASSERT_EQ(s.code(), StatusCode::kInvalidArgument) << bad;
    const std::string& m = s.message();
    EXPECT_NE(m.find("label " + std::to_string(bad)), std::string::npos) << m;
    EXPECT_NE(m.find("position 2"), std::string::npos) << m;
    EXPECT_NE(m.find("[0, 10)"), std::string::npos) << m;
    EXPECT_NE(m.find("'loss'"), std::string::npos) << m;
    EXPECT_NE(m.find("'fc2'"), std::string::npos) << m;  // the loss layer's scores bottom
    EXPECT_NE(m.find("'label'"), std::string::npos) << m;
    EXPECT_NE(m.find("'fmnist_small'"), std::string::npos) << m;
    EXPECT_NE(m.find("fmnist_small.toml"), std::string::npos) << m;
  }
  // The first bad position is the one named.
  const std::vector<int> two_bad = {1, 11, 12, 3};
  EXPECT_NE(net->CheckLabels(two_bad.data(), 4).message().find("position 1"), std::string::npos);
}

// The worker checks labels first; a label that still reaches SetInputs is a broken invariant.
TEST(EngineNetDeathTest, ForwardBackwardStillChecksTheLabelRange) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto net = SmallNet(false, 2);
  const std::vector<float> images(net->input_count(), 0.5f);
  const std::vector<int> labels = {4, 10};
  EXPECT_DEATH(net->ForwardBackward(images.data(), labels.data()), "CHECK failed: labels\\[i\\] < shapes_.num_classes");
  const std::vector<int> negative = {-3, 1};
  EXPECT_DEATH(net->Forward(images.data(), negative.data()), "CHECK failed: labels\\[i\\] >= 0");
}

TEST(EngineNet, ReadBlobGivesCanonicalLayoutOnEveryBackend) {
  auto ref = SmallNet(true, 2);
  auto dnn = SmallNet(false, 2);
  std::mt19937 rng(1);
  std::normal_distribution<float> g;
  std::vector<float> images(ref->input_count());
  for (float& v : images) v = g(rng);
  const std::vector<int> labels = {1, 8};
  ref->Forward(images.data(), labels.data());
  dnn->Forward(images.data(), labels.data());
  // conv1 and pool1 are blocked in oneDNN (nChw16c / nChw8c); fc2 is plain.
  for (const char* name : {"data", "conv1", "pool1", "relu2", "fc2"}) {
    std::vector<float> want, got;
    ASSERT_TRUE(ref->ReadBlob(name, &want).ok()) << name;
    ASSERT_TRUE(dnn->ReadBlob(name, &got).ok()) << name;
    EXPECT_EQ(static_cast<int64_t>(want.size()), ShapeCount(ref->shapes().blobs.at(name))) << name;
    const TensorComparison c = CompareTensors(name, got, want, 1e-4);
    EXPECT_TRUE(c.ok) << c.message;
  }
  std::vector<float> data;
  ASSERT_TRUE(ref->ReadBlob("data", &data).ok());
  EXPECT_EQ(data, images);
  const Status s = dnn->ReadBlob("conv9", &data);
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_NE(s.message().find("'conv9'"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("'fmnist_small'"), std::string::npos) << s.message();
}

// Every convolution of every shipped model runs oneDNN's vectorised kernels, forward and both
// backward passes: on an AVX2-only CPU oneDNN v2 offered only its naive reference kernel for a
// one-channel first layer's weight gradient in the forward's layouts (far slower, bench/RESULTS.md
// §2 "On an AVX2-only VM": the training tests timed out). The layer then asks for other
// layouts; this checks it found a kernel that is not "ref:...".
TEST(EngineNet, NoConvolutionOfAShippedModelRunsOneDnnsReferenceKernel) {
  const std::string dir = std::string(DOWNPOUR_SOURCE_DIR) + "/configs/models/";
  int convolutions = 0;
  for (const char* model : {"fmnist_small", "cifar10_small", "alexnet", "alexnet_fashion"}) {
    NetSpec spec;
    Status s = ParseNetSpecFile(dir + model + ".toml", &spec);
    ASSERT_TRUE(s.ok()) << s.ToString();
    NetOptions opt;
    opt.batch = 2;
    opt.worker.threads = 1;
    std::unique_ptr<Net> net;
    s = Net::Create(spec, opt, &net);
    ASSERT_TRUE(s.ok()) << s.ToString();
    for (int i = 0; i < net->num_layers(); ++i) {
      const std::string kernels = net->LayerKernelNames(i);
      if (kernels.empty()) continue;
      ++convolutions;
      EXPECT_EQ(kernels.find("fwd ref"), std::string::npos) << model << " layer " << i << ": " << kernels;
      EXPECT_EQ(kernels.find("bwd_weights ref"), std::string::npos) << model << " layer " << i << ": " << kernels;
      // The first layer's data gradient is never computed (its bottom is the input).
      if (i > 0) {
        EXPECT_EQ(kernels.find("bwd_data ref"), std::string::npos) << model << " layer " << i << ": " << kernels;
      }
    }
  }
  EXPECT_EQ(convolutions, 2 + 2 + 5 + 5) << "every convolution reports its kernels";
}

}  // namespace
}  // namespace downpour::engine
