// The oneDNN backend against the reference backend (naive loops in double): same spec, same
// seed, same input → loss, class scores and every parameter gradient agree to 1e-4 relative
// (max-norm per tensor; NaN or Inf anywhere fails, client/engine/tensor_compare.h). Covers conv
// with groups/pad/stride, LRN, overlapping ceil pooling with pad, inner product from a blocked
// 4-D input, dropout, softmax loss; and average pooling (Caffe's AVE) in every way oneDNN runs
// it — no padding with the ceil overhang, padding without overhang, padding with overhang (an
// explicitly padded copy), Caffe's dropped last window — from a blocked layout (after a
// convolution) and from plain NCHW, comparing the pooled blob itself as well.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "client/engine/net.h"
#include "client/engine/tensor_compare.h"
#include "downpour_config.h"
#include "tests/client/test_nets.h"

namespace downpour::engine {
namespace {

using testing::kMixedNet;  // tests/client/test_nets.h

// got = oneDNN, want = reference.
void ExpectClose(const std::string& what, std::span<const float> got, std::span<const float> want, double rel = 1e-4) {
  const TensorComparison c = CompareTensors(what, got, want, rel);
  EXPECT_TRUE(c.ok) << c.message;
}

// Loss, scores and every gradient over `steps` training steps, and the blobs named in `blobs`.
void CompareBackends(const NetSpec& spec, int batch, int steps, const std::vector<std::string>& blobs = {}) {
  NetOptions ref_opt, dnn_opt;
  ref_opt.batch = dnn_opt.batch = batch;
  ref_opt.reference = true;
  dnn_opt.worker.threads = 2;
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
      ExpectClose(ref->param_specs()[t].name, dnn->grad(t), ref->grad(t));
    for (const std::string& name : blobs) {
      std::vector<float> got, want;
      ASSERT_TRUE(dnn->ReadBlob(name, &got).ok());
      ASSERT_TRUE(ref->ReadBlob(name, &want).ok());
      ExpectClose("blob " + name, got, want);
    }
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

// The every-layer net with its ReLU a PReLU (a slope per channel of conv1's 8, Caffe's 0.25):
// loss, scores and every gradient, the slopes' too, agree over two training steps.
TEST(EngineAgreement, MixedNetWithPrelu) {
  std::string text = kMixedNet;
  const std::string relu = "type = \"ReLU\"";
  ASSERT_NE(text.find(relu), std::string::npos);
  text.replace(text.find(relu), relu.size(), "type = \"PReLU\"");
  NetSpec spec;
  const Status s = ParseNetSpecString(text, "mixed_prelu", &spec);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_EQ(spec.layers[1].type, LayerType::kPReLU);
  CompareBackends(spec, 3, 2, {"relu1"});
}

TEST(EngineAgreement, FashionMnistSmallNet) {
  NetSpec spec;
  ASSERT_TRUE(ParseNetSpecFile(std::string(DOWNPOUR_SOURCE_DIR) + "/configs/models/fmnist_small.toml", &spec).ok());
  CompareBackends(spec, 4, 1);
}

// A diverged net (NaN weights) scores 0 on both backends, top-1 and top-k: a NaN ranks above
// the label (once, every comparison being false, it ranked the label first).
TEST(EngineAgreement, NaNWeightsScoreZero) {
  NetSpec spec;
  ASSERT_TRUE(ParseNetSpecFile(std::string(DOWNPOUR_SOURCE_DIR) + "/configs/models/fmnist_fast.toml", &spec).ok());
  for (const bool reference : {true, false}) {
    NetOptions opt;
    opt.batch = 4;
    opt.reference = reference;
    std::unique_ptr<Net> net;
    const Status s = Net::Create(spec, opt, &net);
    ASSERT_TRUE(s.ok()) << s.ToString();
    net->InitParams(3);
    std::fill(net->params().begin(), net->params().end(), std::numeric_limits<float>::quiet_NaN());
    std::vector<float> images(net->input_count(), 0.5f);
    std::vector<int> labels = {0, 3, 7, 9};
    const EvalResult r = net->Forward(images.data(), labels.data());
    EXPECT_FALSE(std::isfinite(r.loss)) << net->backend().name();
    EXPECT_EQ(r.top1, 0.0f) << net->backend().name();
    EXPECT_EQ(r.topk, 0.0f) << net->backend().name();
  }
}

TEST(EngineAgreement, Cifar10SmallNet) {
  NetSpec spec;
  ASSERT_TRUE(ParseNetSpecFile(std::string(DOWNPOUR_SOURCE_DIR) + "/configs/models/cifar10_small.toml", &spec).ok());
  CompareBackends(spec, 2, 1);
}

// A one-channel input (a grayscale first layer, whose weight gradient oneDNN's backend forms by
// im2col and sgemm, client/engine/onednn_backend.cc) with a rectangular kernel, stride and pad,
// with and without bias, feeding a second convolution that does take a data gradient.
TEST(EngineAgreement, OneChannelInputConvolutionWithPadAndStride) {
  for (const char* bias : {"bias_filler = { type = \"constant\", value = 0.1 }\n", "bias_term = false\n"}) {
    const std::string toml = fmt::format(
        "name = \"one_channel\"\n[input]\nchannels = 1\nheight = 13\nwidth = 11\n"
        "[[layer]]\nname = \"conv1\"\ntype = \"Convolution\"\nbottom = \"data\"\ntop = \"conv1\"\n"
        "num_output = 6\nkernel_h = 4\nkernel_w = 3\nstride = 2\npad = 1\n"
        "weight_filler = {{ type = \"gaussian\", std = 0.3 }}\n{}"
        "[[layer]]\nname = \"conv2\"\ntype = \"Convolution\"\nbottom = \"conv1\"\ntop = \"conv2\"\n"
        "num_output = 8\nkernel_size = 3\nweight_filler = {{ type = \"xavier\" }}\n"
        "[[layer]]\nname = \"fc\"\ntype = \"InnerProduct\"\nbottom = \"conv2\"\ntop = \"fc\"\nnum_output = 5\n"
        "weight_filler = {{ type = \"xavier\" }}\n"
        "[[layer]]\nname = \"loss\"\ntype = \"SoftmaxWithLoss\"\nbottom = [\"fc\", \"label\"]\ntop = \"loss\"\n",
        bias);
    SCOPED_TRACE(bias);
    NetSpec spec;
    const Status s = ParseNetSpecString(toml, "one_channel", &spec);
    ASSERT_TRUE(s.ok()) << s.ToString() << "\n" << toml;
    CompareBackends(spec, 3, 2);
  }
}

// A net around one pooling layer: after a 16-channel convolution (oneDNN keeps that output
// blocked, nChw16c / nChw8c) or straight on the (plain NCHW) input, then fc → loss.
NetSpec PoolNet(int height, int width, const std::string& pool, bool after_conv) {
  std::string toml =
      fmt::format("name = \"pool_net\"\n[input]\nchannels = 3\nheight = {}\nwidth = {}\n", height, width);
  if (after_conv)
    toml +=
        "[[layer]]\nname = \"conv\"\ntype = \"Convolution\"\nbottom = \"data\"\ntop = \"conv\"\n"
        "num_output = 16\nkernel_size = 3\npad = 1\nweight_filler = { type = \"xavier\" }\n";
  toml += "[[layer]]\nname = \"pool\"\ntype = \"Pooling\"\nbottom = \"" + std::string(after_conv ? "conv" : "data") +
          "\"\ntop = \"pool\"\n" + pool +
          "[[layer]]\nname = \"fc\"\ntype = \"InnerProduct\"\nbottom = \"pool\"\ntop = \"fc\"\nnum_output = 5\n"
          "weight_filler = { type = \"xavier\" }\n"
          "[[layer]]\nname = \"loss\"\ntype = \"SoftmaxWithLoss\"\nbottom = [\"fc\", \"label\"]\ntop = \"loss\"\n";
  NetSpec spec;
  const Status s = ParseNetSpecString(toml, "pool_net", &spec);
  EXPECT_TRUE(s.ok()) << s.ToString() << "\n" << toml;
  return spec;
}

struct PoolGeometry {
  const char* name;
  int height, width;
  const char* pool;         // the pooling layer's fields
  std::vector<int> pooled;  // expected (Ho, Wo)
};

void PrintTo(const PoolGeometry& g, std::ostream* os) { *os << g.name; }

// After a convolution: forward and backward through a blocked layout. On the input: forward on
// plain NCHW only (no gradient flows into the net's input; the backward on plain input is
// checked by engine_layer_gradcheck_test).
class EnginePoolAgreement : public ::testing::TestWithParam<std::tuple<PoolGeometry, bool>> {};

TEST_P(EnginePoolAgreement, PooledBlobLossScoresAndGradients) {
  const auto& [g, after_conv] = GetParam();
  const NetSpec spec = PoolNet(g.height, g.width, g.pool, after_conv);
  NetShapes shapes;
  ASSERT_TRUE(InferShapes(spec, 3, &shapes).ok());
  const std::vector<int> pooled(shapes.blobs.at("pool").begin() + 2, shapes.blobs.at("pool").end());
  ASSERT_EQ(pooled, g.pooled) << "the geometry no longer exercises what its name says";
  CompareBackends(spec, 3, 1, {"pool"});
}

INSTANTIATE_TEST_SUITE_P(
    Geometries, EnginePoolAgreement,
    ::testing::Combine(
        ::testing::Values(
            // AVE, no padding, ceil overhang: 8 → 4 (floor 3); oneDNN avg_exclude_padding.
            PoolGeometry{"AveCeilOverhang", 8, 8, "pool = \"ave\"\nkernel_size = 3\nstride = 2\n", {4, 4}},
            // CIFAR-10 quick's pool2 / pool3: AVE 3/2 on 16×16 → 8 (floor 7) and 8×8 → 4.
            PoolGeometry{"AveCifar10QuickPool2", 16, 16, "pool = \"ave\"\nkernel_size = 3\nstride = 2\n", {8, 8}},
            // AVE, padding, no window past in+pad: 7 → 4 with pad 1; avg_include_padding.
            PoolGeometry{"AvePadNoOverhang", 7, 7, "pool = \"ave\"\nkernel_size = 3\nstride = 2\npad = 1\n", {4, 4}},
            // AVE, padding and overhang: 6 → 4 with pad 1 (ext 2 > pad); the explicitly padded copy.
            PoolGeometry{"AvePadAndOverhang", 6, 6, "pool = \"ave\"\nkernel_size = 3\nstride = 2\npad = 1\n", {4, 4}},
            // AVE, rectangular: pad and overhang in h, overhang without pad in w.
            PoolGeometry{"AveRectangularMixed",
                         6,
                         7,
                         "pool = \"ave\"\nkernel_h = 3\nkernel_w = 2\nstride_h = 2\nstride_w = 3\npad_h = 1\n",
                         {4, 3}},
            // Caffe drops the last window (it would start in the padding): 5 → 2 with kernel 2,
            // stride 3, pad 1; oneDNN's right padding would be −1.
            PoolGeometry{
                "AveClippedLastWindow", 5, 5, "pool = \"ave\"\nkernel_size = 2\nstride = 3\npad = 1\n", {2, 2}},
            PoolGeometry{
                "MaxClippedLastWindow", 5, 5, "pool = \"max\"\nkernel_size = 2\nstride = 3\npad = 1\n", {2, 2}},
            PoolGeometry{"MaxPadAndOverhang", 6, 6, "kernel_size = 3\nstride = 2\npad = 1\n", {4, 4}}),
        ::testing::Bool()),
    [](const auto& info) {
      return std::string(std::get<0>(info.param).name) + (std::get<1>(info.param) ? "_AfterConv" : "_OnInput");
    });

}  // namespace
}  // namespace downpour::engine
