// Gradient checks: every reference kernel's backward against central finite differences in
// double precision, on random shapes (groups, pad, stride, overlapping pooling, LRN), and a
// whole-net check of the small Fashion-MNIST net on the reference backend.
#include <gtest/gtest.h>

#include <cmath>
#include <algorithm>
#include <functional>
#include <numeric>
#include <random>
#include <vector>

#include "client/engine/fillers.h"
#include "client/engine/net.h"
#include "client/engine/ref_kernels.h"
#include "client/engine/reference_backend.h"
#include "downpour_config.h"

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
    SCOPED_TRACE(testing::Message() << "trial " << trial << " group " << group << " stride "
                                    << g.sh << "x" << g.sw << " pad " << g.ph << "x" << g.pw);
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
    SCOPED_TRACE(testing::Message() << "C=" << g.c << " size=" << g.size);
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

// Whole-net check: the small Fashion-MNIST net (with dropout, fixed step) on the reference
// backend, loss vs. every parameter tensor, sampled elements, central differences in float.
TEST(EngineGradCheck, WholeSmallNet) {
  NetSpec spec;
  ASSERT_TRUE(ParseNetSpecFile(std::string(DOWNPOUR_SOURCE_DIR) + "/configs/models/fmnist_small.toml",
                               &spec).ok());
  NetOptions opt;
  opt.batch = 2;
  std::unique_ptr<Net> net;
  Status s = Net::CreateWithBackend(spec, opt, MakeReferenceBackend(), &net);
  ASSERT_TRUE(s.ok()) << s.ToString();
  net->InitParams(3);
  std::mt19937 rng(14);
  std::vector<float> images(net->input_count());
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  for (auto& v : images) v = u(rng);
  std::vector<int> labels = {3, 7};
  net->set_step(5);
  std::vector<int> ready;
  net->SetGradReadyCallback([&](int i) { ready.push_back(i); });
  net->ForwardBackward(images.data(), labels.data());
  // Every tensor reported exactly once, later layers first.
  ASSERT_EQ(ready.size(), net->param_specs().size());
  for (size_t i = 0; i < ready.size(); ++i)
    EXPECT_EQ(ready[i], static_cast<int>(ready.size() - 1 - i));
  const std::vector<float> analytic(net->grads().begin(), net->grads().end());
  net->SetGradReadyCallback(nullptr);
  auto loss_at = [&] {
    net->set_step(5);  // same dropout mask
    return static_cast<double>(net->ForwardBackward(images.data(), labels.data()));
  };
  const float eps = 1e-3f;
  int checked = 0, bad = 0;
  for (size_t t = 0; t < net->param_specs().size(); ++t) {
    auto p = net->param(t);
    const int64_t offset = net->param_offset(t);
    for (int sample = 0; sample < 12; ++sample) {
      const size_t i = std::uniform_int_distribution<size_t>(0, p.size() - 1)(rng);
      const float saved = p[i];
      p[i] = saved + eps;
      const double up = loss_at();
      p[i] = saved - eps;
      const double down = loss_at();
      p[i] = saved;
      const double numeric = (up - down) / (2 * eps);
      const double a = analytic[offset + i];
      const double scale = std::max({1e-2, std::abs(numeric), std::abs(a)});
      ++checked;
      // A finite step can cross a ReLU / max-pool kink somewhere in the net (a bias moves
      // hundreds of activations); such samples are counted and a few are allowed. A wrong
      // backward fails most samples of its tensor.
      if (std::abs(numeric - a) > 2e-2 * scale + 3e-4) {
        ++bad;
        std::printf("kink or mismatch: %s[%zu] numeric %.6g analytic %.6g\n",
                    net->param_specs()[t].name.c_str(), i, numeric, a);
      }
    }
  }
  EXPECT_LE(bad, checked / 10) << "of " << checked;
}

}  // namespace
}  // namespace downpour::engine
