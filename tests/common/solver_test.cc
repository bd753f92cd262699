// Tests for common/solver: learning-rate policies against Caffe's closed forms, the update
// pipeline against hand-computed multi-step values (as Caffe's test_gradient_based_solver
// does), and the fused SgdUpdate against the pipeline, bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "common/solver/lr_policy.h"
#include "common/solver/adagrad.h"
#include "common/solver/sgd.h"
#include "common/solver/update_rule.h"

namespace downpour {
namespace {

SolverConfig Solver(LrPolicy policy) {
  SolverConfig s;
  s.base_lr = 0.01f;
  s.lr_policy = policy;
  return s;
}

// The float that the closed form, evaluated in double, rounds to. Our implementation is
// double-then-round as well, so we allow only a couple of ulps for pow's last bit.
void ExpectRate(const SolverConfig& s, int64_t iter, double expected) {
  EXPECT_FLOAT_EQ(LearningRateAt(s, iter), static_cast<float>(expected))
      << LrPolicyName(s.lr_policy) << " at iter " << iter;
}

TEST(LrPolicyTest, Fixed) {
  SolverConfig s = Solver(LrPolicy::kFixed);
  for (int64_t it : {0, 1, 999, 123456}) ExpectRate(s, it, 0.01);
}

TEST(LrPolicyTest, Step) {
  SolverConfig s = Solver(LrPolicy::kStep);
  s.gamma = 0.1f;
  s.stepsize = 10;
  ExpectRate(s, 0, 0.01);
  ExpectRate(s, 9, 0.01);
  ExpectRate(s, 10, 0.01 * double(0.1f));
  ExpectRate(s, 19, 0.01 * double(0.1f));
  ExpectRate(s, 25, 0.01 * double(0.1f) * double(0.1f));
}

TEST(LrPolicyTest, MultistepMatchesCaffesStatefulCounter) {
  SolverConfig s = Solver(LrPolicy::kMultistep);
  s.gamma = 0.5f;
  s.stepvalues = {5, 12, 20};
  ExpectRate(s, 4, 0.01);
  ExpectRate(s, 5, 0.005);
  ExpectRate(s, 11, 0.005);
  ExpectRate(s, 12, 0.0025);
  ExpectRate(s, 20, 0.00125);
  ExpectRate(s, 1000, 0.00125);
  // Caffe: current_step_ advances by one when iter >= stepvalue(current_step_), checked each
  // iteration from 0.
  size_t current_step = 0;
  for (int64_t it = 0; it < 40; ++it) {
    if (current_step < s.stepvalues.size() && it >= s.stepvalues[current_step]) ++current_step;
    ExpectRate(s, it, 0.01 * std::pow(0.5, double(current_step)));
  }
}

TEST(LrPolicyTest, Poly) {
  SolverConfig s = Solver(LrPolicy::kPoly);
  s.base_lr = 0.1f;
  s.power = 2.0f;
  s.max_iter = 100;
  ExpectRate(s, 0, double(0.1f));
  ExpectRate(s, 30, double(0.1f) * 0.7 * 0.7);
  ExpectRate(s, 99, double(0.1f) * 0.01 * 0.01);
  EXPECT_EQ(LearningRateAt(s, 100), 0.0f);
  EXPECT_EQ(LearningRateAt(s, 150), 0.0f);  // past the horizon: 0, never NaN from pow(<0)
}

TEST(LrPolicyTest, Inv) {
  SolverConfig s = Solver(LrPolicy::kInv);
  s.gamma = 1e-4f;
  s.power = 0.75f;
  ExpectRate(s, 0, 0.01);
  ExpectRate(s, 1000, 0.01 * std::pow(1.0 + double(1e-4f) * 1000.0, -0.75));
  ExpectRate(s, 10000, 0.01 * std::pow(1.0 + double(1e-4f) * 10000.0, -0.75));
}

TEST(LrPolicyTest, Exp) {
  SolverConfig s = Solver(LrPolicy::kExp);
  s.gamma = 0.99f;
  ExpectRate(s, 0, 0.01);
  ExpectRate(s, 1, 0.01 * double(0.99f));
  ExpectRate(s, 50, 0.01 * std::pow(double(0.99f), 50.0));
}

// solver.warmup_iters = n: the first n iterations are the schedule times (iter + 1) / n, then the
// schedule itself; with "step" the ramp multiplies the schedule's own decay.
TEST(LrPolicyTest, WarmupRampsLinearlyUpToTheSchedule) {
  SolverConfig s = Solver(LrPolicy::kStep);
  s.base_lr = 0.1f;
  s.gamma = 0.5f;
  s.stepsize = 3;
  s.warmup_iters = 4;
  ExpectRate(s, 0, double(0.1f) * 0.25);
  ExpectRate(s, 1, double(0.1f) * 0.5);
  ExpectRate(s, 2, double(0.1f) * 0.75);
  ExpectRate(s, 3, double(0.1f) * 0.5 * 1.0);  // the step at 3, ramp done (4/4)
  ExpectRate(s, 4, double(0.1f) * 0.5);
  s.warmup_iters = 0;
  ExpectRate(s, 0, double(0.1f));  // off
  SolverConfig fixed = Solver(LrPolicy::kFixed);
  fixed.warmup_iters = 1;
  ExpectRate(fixed, 0, 0.01);  // a ramp of one iteration is the schedule
}

TEST(LrPolicyTest, StalenessAware) {
  EXPECT_EQ(StalenessAwareLr(0.1f, 0), 0.1f);
  EXPECT_EQ(StalenessAwareLr(0.1f, 1), 0.1f);
  EXPECT_FLOAT_EQ(StalenessAwareLr(0.1f, 4), 0.025f);
}

TEST(SgdTest, ClipScale) {
  EXPECT_EQ(ClipScale(100.0, -1.0f), 1.0f);  // off
  EXPECT_EQ(ClipScale(100.0, 0.0f), 1.0f);   // off
  EXPECT_EQ(ClipScale(4.0, 5.0f), 1.0f);     // ||g|| = 2 <= 5
  EXPECT_FLOAT_EQ(ClipScale(100.0, 5.0f), 0.5f);  // ||g|| = 10 -> 5/10
  // After scaling, the norm equals the threshold.
  std::vector<float> g = {3.0f, 4.0f, 12.0f};  // ||g|| = 13
  Scale(g, ClipScale(SquaredNorm(g), 6.5f));
  EXPECT_NEAR(std::sqrt(SquaredNorm(g)), 6.5, 1e-6);
}

TEST(SgdTest, SquaredNormAccumulatesInDouble) {
  std::vector<float> g(1001);
  double expected = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    g[i] = 0.001f * static_cast<float>(i) - 0.3f;
    expected += double(g[i]) * double(g[i]);
  }
  EXPECT_NEAR(SquaredNorm(g), expected, 1e-12 * expected);
  EXPECT_EQ(SquaredNorm({}), 0.0);
}

TEST(SgdTest, SingleStepsAreTheirFormulas) {
  std::vector<float> g = {1.0f, -2.0f, 0.5f};
  const std::vector<float> w = {10.0f, 20.0f, -4.0f};
  Scale(g, 2.0f);
  EXPECT_EQ(g, (std::vector<float>{2.0f, -4.0f, 1.0f}));
  Regularize(g, w, 0.5f);
  EXPECT_EQ(g, (std::vector<float>{7.0f, 6.0f, -1.0f}));
  std::vector<float> h = {1.0f, 1.0f, 1.0f};
  MomentumStep(h, g, 0.5f, 0.25f);
  EXPECT_EQ(h, (std::vector<float>{0.5f + 1.75f, 0.5f + 1.5f, 0.5f - 0.25f}));
  std::vector<float> w2 = w;
  ApplyStep(w2, h);
  EXPECT_EQ(w2, (std::vector<float>{10.0f - 2.25f, 20.0f - 2.0f, -4.0f - 0.25f}));
}

// Three updates of a 3-element tensor with momentum, decay, multipliers and a gradient scale,
// against the recurrence worked out in double (Caffe's solver tests do the same).
TEST(SgdTest, ThreeStepsWithMomentumAndDecayMatchHandComputed) {
  SolverConfig solver;
  solver.base_lr = 0.1f;
  solver.lr_policy = LrPolicy::kStep;
  solver.gamma = 0.5f;
  solver.stepsize = 2;  // lr: 0.1, 0.1, 0.05
  solver.momentum = 0.9f;
  solver.weight_decay = 0.01f;
  const float lr_mult = 2.0f, decay_mult = 0.5f, grad_scale = 0.5f;
  const double grads[3][3] = {{1.0, -2.0, 0.5}, {0.5, 0.5, -1.0}, {-1.0, 2.0, 3.0}};

  std::vector<float> w = {1.0f, -2.0f, 0.5f}, h(3, 0.0f);
  double wd[3] = {1.0, -2.0, 0.5}, hd[3] = {0, 0, 0};
  const double lrs[3] = {0.1, 0.1, 0.05};
  for (int t = 0; t < 3; ++t) {
    std::vector<float> g(grads[t], grads[t] + 3);
    SgdUpdate(MakeUpdateParams(solver, t, lr_mult, decay_mult, grad_scale), g, w, h);
    for (int i = 0; i < 3; ++i) {
      const double gi = grads[t][i] * 0.5 + 0.01 * 0.5 * wd[i];
      hd[i] = 0.9 * hd[i] + lrs[t] * 2.0 * gi;
      wd[i] -= hd[i];
    }
  }
  // Step 1 by hand for element 0: g = 0.5 + 0.005 = 0.505, h = 0.2 * 0.505 = 0.101, w = 0.899.
  for (int i = 0; i < 3; ++i) {
    EXPECT_NEAR(w[i], wd[i], 1e-6) << "w[" << i << "]";
    EXPECT_NEAR(h[i], hd[i], 1e-6) << "history[" << i << "]";
  }
  // And one closed value, so the recurrence above cannot silently agree with a wrong rule.
  EXPECT_NEAR(wd[0], 1.0 - 0.101 - (0.9 * 0.101 + 0.2 * (0.25 + 0.005 * 0.899)) -
                         (0.9 * (0.9 * 0.101 + 0.2 * (0.25 + 0.005 * 0.899)) +
                          0.1 * (-0.5 + 0.005 * (0.899 - (0.9 * 0.101 + 0.2 * (0.25 + 0.005 * 0.899))))),
              1e-12);
}

// A constant gradient with momentum and no decay has the geometric closed form
//   h_t = lr g (1 - m^t) / (1 - m),   w_T = w_0 - lr g Σ_{t=1..T} (1 - m^t) / (1 - m).
TEST(SgdTest, ConstantGradientMomentumClosedForm) {
  const double lr = 0.05, m = 0.8, g0 = 1.5, w0 = 3.0;
  UpdateParams p;
  p.lr = float(lr);
  p.momentum = float(m);
  std::vector<float> w = {float(w0)}, h = {0.0f};
  const std::vector<float> g = {float(g0)};
  double sum = 0;
  for (int t = 1; t <= 20; ++t) {
    SgdUpdate(p, g, w, h);
    sum += (1.0 - std::pow(double(p.momentum), t)) / (1.0 - double(p.momentum));
    EXPECT_NEAR(h[0], double(p.lr) * g0 * (1.0 - std::pow(double(p.momentum), t)) /
                          (1.0 - double(p.momentum)), 1e-5);
    EXPECT_NEAR(w[0], w0 - double(p.lr) * g0 * sum, 1e-4) << "step " << t;
  }
}

// A zero-decay tensor (a Caffe bias) ignores weight_decay; lr_mult scales the step.
TEST(SgdTest, MultipliersBiasStyle) {
  UpdateParams p;
  p.lr = 0.1f;
  p.weight_decay = 1.0f;
  p.decay_mult = 0.0f;
  p.lr_mult = 2.0f;
  std::vector<float> w = {5.0f}, h = {0.0f};
  const std::vector<float> g = {1.0f};
  SgdUpdate(p, g, w, h);
  EXPECT_FLOAT_EQ(w[0], 5.0f - 0.2f);
}

// The fused pass must equal the pipeline bit for bit, for lengths with a vector tail.
TEST(SgdTest, FusedIsBitIdenticalToPipeline) {
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (size_t n : {size_t{1}, size_t{7}, size_t{64}, size_t{1003}, size_t{65537}}) {
    std::vector<float> w(n), h(n), g(n);
    for (size_t i = 0; i < n; ++i) {
      w[i] = dist(rng);
      h[i] = 0.1f * dist(rng);
      g[i] = 3.0f * dist(rng);
    }
    const float clip = ClipScale(SquaredNorm(g), 0.5f * static_cast<float>(std::sqrt(n)));
    const UpdateParams p{0.037f, 0.9f, 0.0005f, 2.0f, 0.5f, clip * 0.25f};
    std::vector<float> w_fused = w, h_fused = h, w_pipe = w, h_pipe = h, g_pipe = g;
    for (int step = 0; step < 3; ++step) {
      SgdUpdate(p, g, w_fused, h_fused);
      g_pipe = g;
      Scale(g_pipe, p.grad_scale);
      Regularize(g_pipe, w_pipe, p.weight_decay * p.decay_mult);
      MomentumStep(h_pipe, g_pipe, p.momentum, p.lr * p.lr_mult);
      ApplyStep(w_pipe, h_pipe);
    }
    EXPECT_EQ(std::memcmp(w_fused.data(), w_pipe.data(), n * sizeof(float)), 0) << "n=" << n;
    EXPECT_EQ(std::memcmp(h_fused.data(), h_pipe.data(), n * sizeof(float)), 0) << "n=" << n;
    EXPECT_NE(w_fused, w) << "the update changed nothing";
  }
}

TEST(SgdDeathTest, MismatchedLengthsAreABrokenInvariant) {
  std::vector<float> w(3), h(3), g(4);
  EXPECT_DEATH(SgdUpdate(UpdateParams{}, g, w, h), "CHECK failed: grad.size\\(\\) == w.size\\(\\)");
}

// The schedule's iteration counts worker batches: n gradients of p batches each move it n × p;
// nonsense counts (0, negative) move it as one.
// AdaGrad with a constant gradient g and no decay: after k updates acc_k = a0 + k g² and
// w_k = w0 − lr Σ_{i=1..k} g / sqrt(a0 + i g² + eps), element by element.
TEST(AdaGradTest, ConstantGradientClosedForm) {
  const float lr = 0.1f, eps = 1e-10f, a0 = 0.1f;
  const std::vector<float> g = {0.5f, -2.0f, 0.0f, 1e-3f};
  std::vector<float> w = {1.0f, 1.0f, 1.0f, 1.0f}, acc(4, a0);
  UpdateParams p;
  p.lr = lr;
  p.momentum = 0.9f;  // not used by AdaGrad
  for (int k = 1; k <= 50; ++k) AdaGradUpdate(p, eps, g, w, acc);
  for (size_t j = 0; j < g.size(); ++j) {
    double want = 1.0;
    for (int i = 1; i <= 50; ++i) want -= lr * g[j] / std::sqrt(a0 + i * double(g[j]) * g[j] + eps);
    EXPECT_NEAR(w[j], want, 1e-5 * (1 + std::abs(want))) << "element " << j;
    EXPECT_NEAR(acc[j], a0 + 50.0 * g[j] * g[j], 1e-4 * (1 + acc[j])) << "element " << j;
  }
  EXPECT_EQ(w[2], 1.0f) << "a zero gradient moves nothing";
}

// Each step is its formula: decay added to the scaled gradient, the square accumulated, the
// multipliers applied; and a rule is element-wise, so blocks give the floats of one call.
TEST(AdaGradTest, OneStepWithDecayScaleAndMultipliersAndBlocking) {
  UpdateParams p;
  p.lr = 0.05f;
  p.lr_mult = 2.0f;
  p.weight_decay = 0.01f;
  p.decay_mult = 0.5f;
  p.grad_scale = 0.25f;
  const float eps = 1e-8f;
  std::vector<float> grad(1000), w(1000), acc(1000);
  std::mt19937 rng(7);
  std::normal_distribution<float> d;
  for (size_t i = 0; i < w.size(); ++i) {
    grad[i] = d(rng);
    w[i] = d(rng);
    acc[i] = std::abs(d(rng));
  }
  std::vector<float> w1 = w, a1 = acc;
  AdaGradUpdate(p, eps, grad, w1, a1);
  for (size_t i = 0; i < w.size(); ++i) {
    const float g = grad[i] * 0.25f + 0.005f * w[i];
    const float a = acc[i] + g * g;
    EXPECT_EQ(a1[i], a);
    EXPECT_EQ(w1[i], w[i] - 0.1f * g / std::sqrt(a + eps));
  }
  std::vector<float> w2 = w, a2 = acc;
  const AdaGradRule rule(eps, 0.1f);
  for (size_t b = 0; b < w.size(); b += 333) {
    const size_t n = std::min<size_t>(333, w.size() - b);
    rule.Apply(p, std::span<const float>(grad).subspan(b, n), std::span<float>(w2).subspan(b, n),
               std::span<float>(a2).subspan(b, n));
  }
  EXPECT_EQ(std::memcmp(w1.data(), w2.data(), w1.size() * 4), 0);
  EXPECT_EQ(std::memcmp(a1.data(), a2.data(), a1.size() * 4), 0);
}

// solver.update picks the rule, with its keys; momentum's rule is SgdUpdate bit for bit.
TEST(UpdateRuleTest, TheSolverPicksTheRule) {
  SolverConfig s;
  EXPECT_EQ(MakeUpdateRule(s)->name(), "momentum");
  EXPECT_EQ(MakeUpdateRule(s)->initial_state(), 0.0f);
  s.update = UpdateRuleKind::kAdaGrad;
  s.adagrad_initial = 0.25f;
  const auto rule = MakeUpdateRule(s);
  EXPECT_EQ(rule->name(), "adagrad");
  EXPECT_EQ(rule->initial_state(), 0.25f);
  UpdateParams p;
  p.lr = 0.1f;
  p.momentum = 0.9f;
  const std::vector<float> g = {1.0f, -1.0f};
  std::vector<float> w = {0.0f, 0.0f}, h = {0.0f, 0.0f}, w2 = w, h2 = h;
  MomentumRule().Apply(p, g, w, h);
  SgdUpdate(p, g, w2, h2);
  EXPECT_EQ(w, w2);
  EXPECT_EQ(h, h2);
}

TEST(ScheduleIterations, CountsWorkerBatches) {
  EXPECT_EQ(ScheduleIterations(1, 1), 1);
  EXPECT_EQ(ScheduleIterations(4, 1), 4);   // sync: an update averaging four workers
  EXPECT_EQ(ScheduleIterations(1, 3), 3);   // async, push_every = 3
  EXPECT_EQ(ScheduleIterations(2, 3), 6);
  EXPECT_EQ(ScheduleIterations(0, 0), 1);
  EXPECT_EQ(ScheduleIterations(-2, 5), 5);
}

}  // namespace
}  // namespace downpour
