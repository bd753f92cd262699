// Gradient checks: every reference kernel's backward against central finite differences in
// double precision, on random shapes (groups, pad, stride, overlapping pooling, LRN), and a
// whole-net check of the small Fashion-MNIST net on the reference backend.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "client/engine/fillers.h"
#include "client/engine/net.h"
#include "client/engine/ref_kernels.h"
#include "client/engine/reference_backend.h"
#include "downpour_config.h"
#include "tests/client/test_nets.h"

namespace downpour::engine {
namespace {

using Vec = std::vector<double>;

Vec Random(size_t n, std::mt19937& rng, double lo = -1.0, double hi = 1.0) {
  std::uniform_real_distribution<double> u(lo, hi);
  Vec v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

double Dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Checks d(objective)/d(var) == analytic for every element of var, where objective() reads var.
void CheckGradient(const char* what, Vec& var, const Vec& analytic,
                   const std::function<double()>& objective, double eps = 1e-5,
                   double tol = 1e-6) {
  ASSERT_EQ(var.size(), analytic.size()) << what;
  for (size_t i = 0; i < var.size(); ++i) {
    const double saved = var[i];
    var[i] = saved + eps;
    const double up = objective();
    var[i] = saved - eps;
    const double down = objective();
    var[i] = saved;
    const double numeric = (up - down) / (2 * eps);
    const double scale = std::max({1.0, std::abs(numeric), std::abs(analytic[i])});
    ASSERT_NEAR(numeric, analytic[i], tol * scale) << what << " element " << i;
  }
}

TEST(EngineGradCheck, ConvolutionRandomShapesWithGroupsPadStride) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 6; ++trial) {
    std::uniform_int_distribution<int> d(1, 3);
    const int group = d(rng) == 1 ? 1 : 2;
    ref::ConvGeom g{};
    g.n = d(rng);
    g.c = group * d(rng);
    g.h = 4 + d(rng) * 2;
    g.w = 4 + d(rng);
    g.o = group * d(rng);
    g.kh = d(rng);
    g.kw = d(rng) + 1;
    g.sh = d(rng);
    g.sw = d(rng);
    g.ph = d(rng) - 1;
    g.pw = d(rng) - 1;
    g.group = group;
    g.ho = ConvOutputSize(g.h, g.kh, g.sh, g.ph);
    g.wo = ConvOutputSize(g.w, g.kw, g.sw, g.pw);
    SCOPED_TRACE(::testing::Message() << "trial " << trial << " group " << group << " stride " << g.sh << "x" << g.sw
                                      << " pad " << g.ph << "x" << g.pw);
    Vec x = Random(size_t(g.n) * g.c * g.h * g.w, rng);
    Vec w = Random(size_t(g.o) * (g.c / group) * g.kh * g.kw, rng);
    Vec b = Random(g.o, rng);
    const size_t ny = size_t(g.n) * g.o * g.ho * g.wo;
    Vec r = Random(ny, rng);  // objective = sum(y * r), so dy = r
    Vec y(ny);
    auto objective = [&] {
      ref::ConvForward(g, x.data(), w.data(), b.data(), y.data());
      return Dot(y, r);
    };
    Vec dx(x.size()), dw(w.size()), db(b.size());
    ref::ConvBackward(g, x.data(), w.data(), r.data(), dx.data(), dw.data(), db.data());
    CheckGradient("conv dx", x, dx, objective);
    CheckGradient("conv dw", w, dw, objective);
    CheckGradient("conv db", b, db, objective);
  }
}

TEST(EngineGradCheck, ReluAwayFromKink) {
  std::mt19937 rng(8);
  Vec x = Random(50, rng);
  for (auto& v : x) v += v > 0 ? 0.1 : -0.1;  // keep finite differences off the kink
  Vec r = Random(x.size(), rng), y(x.size()), dx(x.size());
  auto objective = [&] {
    ref::ReluForward<double>(x.size(), x.data(), y.data());
    return Dot(y, r);
  };
  ref::ReluBackward<double>(x.size(), x.data(), r.data(), dx.data());
  CheckGradient("relu dx", x, dx, objective);
}

TEST(EngineGradCheck, LrnAcrossChannelsRandomShapes) {
  std::mt19937 rng(9);
  for (int trial = 0; trial < 4; ++trial) {
    std::uniform_int_distribution<int> d(1, 4);
    // Large alpha so the normalisation term matters in the check.
    ref::LrnGeom g{d(rng), 2 + 2 * d(rng), d(rng), d(rng), 2 * d(rng) - 1 + 2, 0.8, 0.75, 1.5};
    SCOPED_TRACE(::testing::Message() << "C=" << g.c << " size=" << g.size);
    Vec x = Random(size_t(g.n) * g.c * g.h * g.w, rng, -2.0, 2.0);
    Vec r = Random(x.size(), rng), y(x.size()), scale(x.size()), dx(x.size());
    auto objective = [&] {
      ref::LrnForward(g, x.data(), y.data(), scale.data());
      return Dot(y, r);
    };
    objective();
    ref::LrnBackward(g, x.data(), y.data(), scale.data(), r.data(), dx.data());
    CheckGradient("lrn dx", x, dx, objective);
  }
}

TEST(EngineGradCheck, OverlappingMaxPoolWithCeilAndPad) {
  std::mt19937 rng(10);
  for (int trial = 0; trial < 4; ++trial) {
    std::uniform_int_distribution<int> d(0, 2);
    ref::PoolGeom g{};
    g.n = 1 + d(rng);
    g.c = 1 + d(rng);
    g.h = 5 + d(rng) * 3;
    g.w = 6 + d(rng);
    g.kh = g.kw = 3;
    g.sh = g.sw = 2;  // overlapping windows
    g.ph = g.pw = trial % 2;
    g.ho = PoolOutputSize(g.h, g.kh, g.sh, g.ph);
    g.wo = PoolOutputSize(g.w, g.kw, g.sw, g.pw);
    // Distinct values spaced well above eps, so the arg-max is stable under perturbation.
    const size_t n = size_t(g.n) * g.c * g.h * g.w;
    Vec x(n);
    std::vector<int> perm(n);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (size_t i = 0; i < n; ++i) x[i] = 0.01 * perm[i];
    const size_t ny = size_t(g.n) * g.c * g.ho * g.wo;
    Vec r = Random(ny, rng), y(ny), dx(n);
    std::vector<int64_t> argmax(ny);
    auto objective = [&] {
      ref::MaxPoolForward(g, x.data(), y.data(), argmax.data());
      return Dot(y, r);
    };
    objective();
    ref::MaxPoolBackward(g, argmax.data(), r.data(), dx.data());
    CheckGradient("maxpool dx", x, dx, objective);
  }
}

// Caffe's AVE on random geometries: padding, stride, overlapping and gapped windows, the ceil
// overhang and Caffe's dropped last window.
TEST(EngineGradCheck, AvePoolRandomGeometries) {
  std::mt19937 rng(15);
  for (int trial = 0; trial < 8; ++trial) {
    std::uniform_int_distribution<int> d(1, 3);
    ref::PoolGeom g{};
    do {  // geometries InferShapes accepts: no empty last window (stride > kernel without pad)
      g.n = d(rng);
      g.c = d(rng);
      g.h = 3 + 2 * d(rng);
      g.w = 2 + 2 * d(rng);
      g.kh = 1 + d(rng);
      g.kw = 1 + d(rng);
      g.sh = d(rng);
      g.sw = d(rng);
      g.ph = (d(rng) - 1) % g.kh;
      g.pw = (d(rng) - 1) % g.kw;
      g.ho = PoolOutputSize(g.h, g.kh, g.sh, g.ph);
      g.wo = PoolOutputSize(g.w, g.kw, g.sw, g.pw);
    } while ((g.ho - 1) * g.sh >= g.h + g.ph || (g.wo - 1) * g.sw >= g.w + g.pw);
    SCOPED_TRACE(::testing::Message() << "trial " << trial << ": " << g.h << "x" << g.w << " kernel " << g.kh << "x"
                                      << g.kw << " stride " << g.sh << "x" << g.sw << " pad " << g.ph << "x" << g.pw);
    Vec x = Random(size_t(g.n) * g.c * g.h * g.w, rng);
    const size_t ny = size_t(g.n) * g.c * g.ho * g.wo;
    Vec r = Random(ny, rng), y(ny), dx(x.size());
    auto objective = [&] {
      ref::AvePoolForward(g, x.data(), y.data());
      return Dot(y, r);
    };
    ref::AvePoolBackward(g, r.data(), dx.data());
    CheckGradient("avepool dx", x, dx, objective);
  }
}

// The divisor, in closed form: on an all-ones 6×6 input, kernel 3, stride 2, pad 1 gives 4 outputs
// per dimension; their windows are [-1,2), [1,4), [3,6), [5,8) clipped to [-1,7) for the divisor
// (pad counts, the overhang past 6+1 does not) and to [0,6) for the sum: 2/3, 1, 1, 1/2 per
// dimension, the product in 2-D (Caffe's pooling_layer.cpp).
TEST(EngineGradCheck, AvePoolDivisorCountsPaddingNotTheCeilOverhang) {
  const ref::PoolGeom g{1, 1, 6, 6, 3, 3, 2, 2, 1, 1, 4, 4};
  ASSERT_EQ(PoolOutputSize(6, 3, 2, 1), 4);
  const Vec x(36, 1.0);
  Vec y(16);
  ref::AvePoolForward(g, x.data(), y.data());
  const double f[4] = {2.0 / 3, 1.0, 1.0, 1.0 / 2};
  for (int oh = 0; oh < 4; ++oh)
    for (int ow = 0; ow < 4; ++ow) EXPECT_DOUBLE_EQ(y[oh * 4 + ow], f[oh] * f[ow]) << oh << "," << ow;
  // Backward: the bottom-right input (5,5) is only in the last window, pool_size 2·2 = 4.
  Vec dy(16, 0.0), dx(36);
  dy[15] = 1.0;
  ref::AvePoolBackward(g, dy.data(), dx.data());
  EXPECT_DOUBLE_EQ(dx[35], 0.25);
  EXPECT_DOUBLE_EQ(dx[34], 0.0);  // (5,4): outside the last window's columns [5,6)
}

TEST(EngineGradCheck, InnerProduct) {
  std::mt19937 rng(11);
  const int n = 3, k = 7, o = 5;
  Vec x = Random(n * k, rng), w = Random(o * k, rng), b = Random(o, rng);
  Vec r = Random(n * o, rng), y(n * o), dx(x.size()), dw(w.size()), db(b.size());
  auto objective = [&] {
    ref::InnerProductForward(n, k, o, x.data(), w.data(), b.data(), y.data());
    return Dot(y, r);
  };
  ref::InnerProductBackward(n, k, o, x.data(), w.data(), r.data(), dx.data(), dw.data(), db.data());
  CheckGradient("ip dx", x, dx, objective);
  CheckGradient("ip dw", w, dw, objective);
  CheckGradient("ip db", b, db, objective);
}

TEST(EngineGradCheck, DropoutIsInvertedAndSeeded) {
  std::mt19937 rng(12);
  const int64_t n = 20000;
  std::vector<float> mask(n), mask2(n), mask3(n);
  DropoutMask(42, 3, 0.5f, mask);
  DropoutMask(42, 3, 0.5f, mask2);
  DropoutMask(42, 4, 0.5f, mask3);
  EXPECT_EQ(mask, mask2);  // same (seed, step) → same mask
  EXPECT_NE(mask, mask3);  // next step → new mask
  int64_t kept = 0;
  for (float m : mask) {
    ASSERT_TRUE(m == 0.0f || m == 2.0f) << m;
    kept += m != 0.0f;
  }
  EXPECT_NEAR(double(kept) / n, 0.5, 0.02);
  Vec x = Random(200, rng), r = Random(200, rng), y(200), dx(200);
  std::span<float> m200(mask.data(), 200);
  auto objective = [&] {
    ref::DropoutForward<double>(200, m200.data(), x.data(), y.data());
    return Dot(y, r);
  };
  ref::DropoutBackward<double>(200, m200.data(), r.data(), dx.data());
  CheckGradient("dropout dx", x, dx, objective);
}

TEST(EngineGradCheck, SoftmaxCrossEntropy) {
  std::mt19937 rng(13);
  const int n = 4, k = 6;
  Vec x = Random(n * k, rng, -3, 3), prob(n * k), dx(n * k);
  std::vector<float> labels = {0, 5, 2, 3};
  auto objective = [&] { return ref::SoftmaxLossForward(n, k, x.data(), labels.data(), prob.data()); };
  const double loss = objective();
  EXPECT_GT(loss, 0.0);
  ref::SoftmaxLossBackward(n, k, prob.data(), labels.data(), 1.0, dx.data());
  CheckGradient("softmax loss dx", x, dx, objective);
}

TEST(EngineGradCheck, AccuracyTopK) {
  // Row 0: label 2 ranks first; row 1: label 2 ranks fourth; row 2: label 2 ranks second.
  std::vector<float> x = {0.1f, 0.2f, 0.9f, 0.1f, 0.5f, 0.9f, 0.3f, 0.4f, 0.2f, 0.5f, 0.4f, 0.1f};
  std::vector<float> labels = {2, 2, 2};
  EXPECT_FLOAT_EQ(ref::Accuracy(3, 4, x.data(), labels.data(), 1), 1.0f / 3);
  EXPECT_FLOAT_EQ(ref::Accuracy(3, 4, x.data(), labels.data(), 2), 2.0f / 3);
  EXPECT_FLOAT_EQ(ref::Accuracy(3, 4, x.data(), labels.data(), 3), 2.0f / 3);
  EXPECT_FLOAT_EQ(ref::Accuracy(3, 4, x.data(), labels.data(), 4), 1.0f);
}

TEST(EngineGradCheck, AccuracyOfNonFiniteScoresIsZero) {
  // A diverged net: every comparison with a NaN is false, which once ranked the label first.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> x = {nan, nan, nan, 0.1f, nan, 0.3f, 0.9f, 0.2f, 0.1f};
  std::vector<float> labels = {1, 0, 0};  // row 0 all NaN; row 1 the label's own score NaN;
                                          // row 2 finite, label first
  EXPECT_FLOAT_EQ(ref::Accuracy(3, 3, x.data(), labels.data(), 1), 1.0f / 3);
  EXPECT_FLOAT_EQ(ref::Accuracy(3, 3, x.data(), labels.data(), 3), 2.0f / 3);  // row 1: 2 above
  x[7] = nan;  // row 2: another class NaN ranks above the label
  EXPECT_FLOAT_EQ(ref::Accuracy(3, 3, x.data(), labels.data(), 1), 0.0f);
  EXPECT_FLOAT_EQ(ref::Accuracy(3, 3, x.data(), labels.data(), 2), 1.0f / 3);
}

// Whole-net checks: a Net on the reference backend, dropout on with its mask fixed by the step,
// d(loss)/d(param) from ForwardBackward against central differences for a deterministic subset
// of EVERY parameter tensor, all of which must pass.
//
//  * Objective: the mean cross-entropy computed in double on the host from the net's float
//    scores (Net::ReadScores) after a train-phase forward of every layer (Net::ForwardLayer
//    keeps the dropout mask of the last ForwardBackward).
//  * Subset: per tensor, `per_tensor` elements at evenly spaced positions
//    i_k = floor((k + 1/2) · numel / per_tensor) (every element of a smaller tensor).
//  * Kinks: a step in one weight moves many ReLU inputs and max-pooling windows downstream, and
//    the loss is not differentiable where one of them changes sign or arg-max. An element whose
//    ±step evaluations change the net's activation pattern (the sign of every ReLU input, the
//    arg-max of every max-pooling window, read with Net::ReadBlob) is within a step of a kink:
//    it is skipped and the next unused element (i + 1, i + 2, ...) is taken instead, so exactly
//    `per_tensor` elements of every tensor are checked, and all of them must pass.
//  * Step and tolerance: |analytic − numeric| ≤ kRel · max(|analytic|, |numeric|) + kAbs. The
//    reference backend rounds every layer's output to float, so the loss carries ≈1e-7 of
//    rounding noise that the two evaluations of a step do not share: the numeric derivative is
//    off by up to ≈1.2e-7 / kStep (measured on fmnist_small: 9e-5 at step 1e-3, 3.9e-4 at 3e-4,
//    7.8e-4 at 1e-4). A bias moves every activation of its channel, so at step 1e-3 conv1's
//    biases sit at a kink 85% of the time (too few are left to check); at 3e-4 a few percent.
//    Hence kStep = 3e-4 and kAbs = 6e-4 (1.5 × the measured noise). Between kinks the loss is
//    smooth (softmax, LRN), so kRel covers central-difference curvature, O(kStep²), with room.
constexpr float kStep = 3e-4f;
constexpr double kRel = 1e-2, kAbs = 6e-4;

// Mean cross-entropy of scores (N,K) in double.
double CrossEntropy(const std::vector<float>& scores, const std::vector<int>& labels, int k) {
  double loss = 0.0;
  for (size_t n = 0; n < labels.size(); ++n) {
    const float* row = scores.data() + n * k;
    const double mx = *std::max_element(row, row + k);
    double sum = 0.0;
    for (int j = 0; j < k; ++j) sum += std::exp(row[j] - mx);
    loss += std::log(sum) - (row[labels[n]] - mx);
  }
  return loss / labels.size();
}

// The net's activation pattern: the sign of every ReLU input, the arg-max of every max-pooling window.
std::vector<int64_t> ActivationPattern(Net& net) {
  std::vector<int64_t> pattern;
  std::vector<float> x;
  for (const LayerSpec& l : net.spec().layers) {
    const bool relu = l.type == LayerType::kActivation && l.activation == ActivationKind::kReLU;
    if (!relu && !(l.type == LayerType::kPooling && l.pool == PoolMethod::kMax)) continue;
    EXPECT_TRUE(net.ReadBlob(l.bottoms[0], &x).ok());
    if (relu) {
      for (float v : x) pattern.push_back(v > 0.0f);
      continue;
    }
    const auto& in = net.shapes().blobs.at(l.bottoms[0]);
    const auto& out = net.shapes().blobs.at(l.tops[0]);
    const ref::PoolGeom g{in[0],      in[1],      in[2],   in[3],   l.kernel_h, l.kernel_w,
                          l.stride_h, l.stride_w, l.pad_h, l.pad_w, out[2],     out[3]};
    std::vector<float> y(ShapeCount(out));
    std::vector<int64_t> argmax(y.size());
    ref::MaxPoolForward(g, x.data(), y.data(), argmax.data());
    pattern.insert(pattern.end(), argmax.begin(), argmax.end());
  }
  return pattern;
}

// Runs the check above on `spec` (reference backend, inputs uniform in [0, 1)); `labels` sets
// the batch size.
void CheckWholeNet(const NetSpec& spec, const std::vector<int>& labels, int per_tensor) {
  NetOptions opt;
  opt.batch = static_cast<int>(labels.size());
  std::unique_ptr<Net> net;
  Status s = Net::CreateWithBackend(spec, opt, MakeReferenceBackend(), &net);
  ASSERT_TRUE(s.ok()) << s.ToString();
  net->InitParams(3);
  std::mt19937 rng(14);
  std::vector<float> images(net->input_count());
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  for (auto& v : images) v = u(rng);
  net->set_step(5);
  std::vector<int> ready;
  net->SetGradReadyCallback([&](int i) { ready.push_back(i); });
  net->ForwardBackward(images.data(), labels.data());
  // Every tensor reported exactly once, later layers first.
  ASSERT_EQ(ready.size(), net->param_specs().size());
  for (size_t i = 0; i < ready.size(); ++i) EXPECT_EQ(ready[i], static_cast<int>(ready.size() - 1 - i));
  const std::vector<float> analytic(net->grads().begin(), net->grads().end());
  net->SetGradReadyCallback(nullptr);

  // A train-phase forward with the same dropout mask: the loss in double, and the pattern.
  std::vector<int64_t> pattern;
  auto evaluate = [&] {
    for (int li = 0; li < net->num_layers(); ++li) net->ForwardLayer(li, Phase::kTrain);
    pattern = ActivationPattern(*net);
    return CrossEntropy(net->ReadScores(), labels, net->num_classes());
  };
  evaluate();
  const std::vector<int64_t> base = pattern;

  int skipped = 0, checked_total = 0;
  double worst_abs = 0.0;
  for (size_t t = 0; t < net->param_specs().size(); ++t) {
    const std::string& name = net->param_specs()[t].name;
    auto p = net->param(t);
    const int64_t n = static_cast<int64_t>(p.size());
    const int want = static_cast<int>(std::min<int64_t>(per_tensor, n));
    int checked = 0;
    int64_t next_free = 0;  // positions below it are used up (the k-th scan starts at max(i_k, next_free))
    for (int k = 0; k < want; ++k) {
      for (int64_t i = std::max<int64_t>((2 * k + 1) * n / (2 * want), next_free); i < n; ++i) {
        next_free = i + 1;
        const float saved = p[i];
        const float up = saved + kStep, down = saved - kStep;
        p[i] = up;
        const double loss_up = evaluate();
        bool at_kink = pattern != base;
        double loss_down = 0.0;
        if (!at_kink) {
          p[i] = down;
          loss_down = evaluate();
          at_kink = pattern != base;
        }
        p[i] = saved;
        if (at_kink) {
          ++skipped;
          continue;
        }
        const double numeric = (loss_up - loss_down) / (double(up) - double(down));
        const double a = analytic[net->param_offset(t) + i];
        const double tolerance = kRel * std::max(std::abs(a), std::abs(numeric)) + kAbs;
        EXPECT_LE(std::abs(a - numeric), tolerance)  // NaN fails
            << name << "[" << i << "]: analytic " << a << ", numeric " << numeric;
        if (std::abs(a - numeric) > worst_abs) worst_abs = std::abs(a - numeric);
        ++checked;
        break;
      }
    }
    EXPECT_EQ(checked, want) << name << ": not enough elements away from kinks";
    checked_total += checked;
  }
  std::printf("%s: %d elements checked (largest |analytic - numeric| %.3g), %d skipped at a kink\n", spec.name.c_str(),
              checked_total, worst_abs, skipped);
}

// The project's small net (conv-relu-maxpool ×2, fc-relu-dropout, fc, loss), 8 per tensor.
TEST(EngineGradCheck, WholeFashionMnistSmallNet) {
  NetSpec spec;
  Status s = ParseNetSpecFile(DOWNPOUR_SOURCE_DIR "/configs/models/fmnist_small.toml", &spec);
  ASSERT_TRUE(s.ok()) << s.ToString();
  CheckWholeNet(spec, {3}, 8);
}

// Every layer type in one small net (tests/client/test_nets.h kMixedNet: conv with groups, stride
// and pad, ReLU, LRN, max pooling with pad, average pooling with the ceil overhang, inner product,
// dropout, loss), 24 per tensor.
TEST(EngineGradCheck, WholeNetWithEveryLayerType) {
  NetSpec spec;
  Status s = ParseNetSpecString(testing::kMixedNet, "mixed", &spec);
  ASSERT_TRUE(s.ok()) << s.ToString();
  NetShapes shapes;
  ASSERT_TRUE(InferShapes(spec, 3, &shapes).ok());
  // conv1 7×6 → pool1 4×4 (pad 1) → conv2 3×3 → pool2 2×2: the AVE windows overhang by one.
  ASSERT_EQ(shapes.blobs.at("conv2"), (std::vector<int>{3, 6, 3, 3}));
  ASSERT_EQ(shapes.blobs.at("pool2"), (std::vector<int>{3, 6, 2, 2}));
  CheckWholeNet(spec, {0, 3, 4}, 24);
}

}  // namespace
}  // namespace downpour::engine
