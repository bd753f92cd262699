// The oneDNN backend against the reference backend (naive loops in double): same spec, same
// seed, same input → loss, class scores and every parameter gradient agree to 1e-4 relative
// (max-norm per tensor). Covers conv with groups/pad/stride, LRN, overlapping ceil pooling
// with pad, inner product from a blocked 4-D input, dropout, softmax loss.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "client/engine/net.h"
#include "downpour_config.h"

namespace downpour::engine {
namespace {

// Everything at once, small: groups 2, stride 2, pad, LRN, pooling with pad + ceil, dropout.
constexpr char kMixedNet[] = R"(
name = "mixed"
[input]
channels = 4
height = 13
width = 11
[[layer]]
name = "conv1"
type = "Convolution"
bottom = "data"
top = "conv1"
num_output = 8
kernel_h = 3
kernel_w = 2
stride = 2
pad = 1
group = 2
weight_filler = { type = "gaussian", std = 0.3 }
bias_filler = { type = "constant", value = 0.1 }
[[layer]]
name = "relu1"
type = "ReLU"
bottom = "conv1"
top = "relu1"
[[layer]]
name = "norm1"
type = "LRN"
bottom = "relu1"
top = "norm1"
local_size = 3
alpha = 0.5
beta = 0.75
k = 2.0
[[layer]]
name = "pool1"
type = "Pooling"
bottom = "norm1"
top = "pool1"
kernel_size = 3
stride = 2
pad = 1
[[layer]]
name = "conv2"
type = "Convolution"
bottom = "pool1"
top = "conv2"
num_output = 6
kernel_size = 2
weight_filler = { type = "xavier" }
[[layer]]
name = "fc1"
type = "InnerProduct"
bottom = "conv2"
top = "fc1"
num_output = 12
weight_filler = { type = "msra" }
bias_filler = { type = "uniform", scale = 0.2 }
[[layer]]
name = "drop1"
type = "Dropout"
bottom = "fc1"
top = "drop1"
dropout_ratio = 0.25
[[layer]]
name = "fc2"
type = "InnerProduct"
bottom = "drop1"
top = "fc2"
num_output = 5
weight_filler = { type = "xavier" }
[[layer]]
name = "loss"
type = "SoftmaxWithLoss"
bottom = ["fc2", "label"]
top = "loss"
)";

double MaxAbs(std::span<const float> v) {
  double m = 0;
  for (float x : v) m = std::max(m, static_cast<double>(std::abs(x)));
  return m;
}

void ExpectClose(const char* what, std::span<const float> got, std::span<const float> want,
                 double rel = 1e-4) {
  ASSERT_EQ(got.size(), want.size()) << what;
  const double scale = std::max(MaxAbs(want), 1e-6);
  double worst = 0;
  size_t worst_i = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = std::abs(double(got[i]) - double(want[i]));
    if (d > worst) { worst = d; worst_i = i; }
  }
  EXPECT_LE(worst / scale, rel) << what << ": element " << worst_i << " onednn " << got[worst_i]
                                << " reference " << want[worst_i] << " (max |ref| " << scale << ")";
}

void CompareBackends(const NetSpec& spec, int batch, int steps) {
  NetOptions ref_opt, dnn_opt;
  ref_opt.batch = dnn_opt.batch = batch;
  ref_opt.reference = true;
  dnn_opt.threads = 2;
  std::unique_ptr<Net> ref, dnn;
  Status s = Net::Create(spec, ref_opt, &ref);
  ASSERT_TRUE(s.ok()) << s.ToString();
  s = Net::Create(spec, dnn_opt, &dnn);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(ref->backend().name(), "reference");
  EXPECT_EQ(dnn->backend().name(), "onednn");
  ref->InitParams(11);
  dnn->InitParams(11);
  ExpectClose("initial params", dnn->params(), ref->params(), 0.0);
  std::mt19937 rng(5);
  std::normal_distribution<float> g(0.0f, 1.0f);
  for (int step = 0; step < steps; ++step) {
    std::vector<float> images(ref->input_count());
    for (auto& v : images) v = g(rng);
    std::vector<int> labels(batch);
    for (auto& l : labels) l = std::uniform_int_distribution<int>(0, ref->num_classes() - 1)(rng);
    const float lr = ref->ForwardBackward(images.data(), labels.data());
    const float ld = dnn->ForwardBackward(images.data(), labels.data());
    EXPECT_NEAR(ld, lr, 1e-4 * std::max(1.0f, std::abs(lr))) << "loss, step " << step;
    ExpectClose("scores", dnn->ReadScores(), ref->ReadScores());
    for (size_t t = 0; t < ref->param_specs().size(); ++t)
      ExpectClose(ref->param_specs()[t].name.c_str(), dnn->grad(t), ref->grad(t));
    const EvalResult er = ref->Forward(images.data(), labels.data());
    const EvalResult ed = dnn->Forward(images.data(), labels.data());
    EXPECT_NEAR(ed.loss, er.loss, 1e-4 * std::max(1.0f, er.loss));
    EXPECT_EQ(ed.top1, er.top1);
  }
}

TEST(EngineAgreement, MixedLayersGroupsLrnPadStride) {
  NetSpec spec;
  Status s = ParseNetSpecString(kMixedNet, "mixed", &spec);
  ASSERT_TRUE(s.ok()) << s.ToString();
  CompareBackends(spec, 3, 2);
}

TEST(EngineAgreement, FashionMnistSmallNet) {
  NetSpec spec;
  ASSERT_TRUE(ParseNetSpecFile(std::string(DOWNPOUR_SOURCE_DIR) + "/configs/models/fmnist_small.toml", &spec).ok());
  CompareBackends(spec, 4, 1);
}

TEST(EngineAgreement, Cifar10SmallNet) {
  NetSpec spec;
  ASSERT_TRUE(ParseNetSpecFile(std::string(DOWNPOUR_SOURCE_DIR) + "/configs/models/cifar10_small.toml", &spec).ok());
  CompareBackends(spec, 2, 1);
}

}  // namespace
}  // namespace downpour::engine
