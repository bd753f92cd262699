// sgd.cc — element-wise SGD steps. Simple counted loops over __restrict pointers so that
// GCC vectorises them at -O3; no FMA contraction (see CMakeLists.txt) so the fused and the
// step-by-step paths round identically.
#include "common/solver/sgd.h"

#include <cmath>
#include <cstdint>

#include "common/solver/lr_policy.h"
#include "common/status.h"

namespace downpour {

UpdateParams MakeUpdateParams(const SolverConfig& solver, int64_t iter, float lr_mult,
                              float decay_mult, float grad_scale) {
  UpdateParams p;
  p.lr = LearningRateAt(solver, iter);
  p.momentum = solver.momentum;
  p.weight_decay = solver.weight_decay;
  p.lr_mult = lr_mult;
  p.decay_mult = decay_mult;
  p.grad_scale = grad_scale;
  return p;
}

double SquaredNorm(std::span<const float> g) {
  const float* __restrict x = g.data();
  const size_t n = g.size();
  // Four independent double accumulators: vectorisable without -ffast-math reassociation.
  double acc[4] = {0, 0, 0, 0};
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    for (size_t k = 0; k < 4; ++k) acc[k] += static_cast<double>(x[i + k]) * x[i + k];
  }
  for (; i < n; ++i) acc[0] += static_cast<double>(x[i]) * x[i];
  return (acc[0] + acc[1]) + (acc[2] + acc[3]);
}

float ClipScale(double grad_sq_norm, float clip_threshold) {
  if (clip_threshold <= 0.0f) return 1.0f;
  const double l2 = std::sqrt(grad_sq_norm);
  if (l2 > clip_threshold) return static_cast<float>(clip_threshold / l2);
  return 1.0f;
}

void Scale(std::span<float> g, float s) {
  float* __restrict x = g.data();
  const size_t n = g.size();
  for (size_t i = 0; i < n; ++i) x[i] = x[i] * s;
}

void Regularize(std::span<float> g, std::span<const float> w, float decay) {
  DP_CHECK_EQ(g.size(), w.size());
  float* __restrict gp = g.data();
  const float* __restrict wp = w.data();
  const size_t n = g.size();
  for (size_t i = 0; i < n; ++i) gp[i] = gp[i] + decay * wp[i];
}

void MomentumStep(std::span<float> history, std::span<const float> g, float momentum, float lr) {
  DP_CHECK_EQ(history.size(), g.size());
  float* __restrict h = history.data();
  const float* __restrict gp = g.data();
  const size_t n = g.size();
  for (size_t i = 0; i < n; ++i) h[i] = momentum * h[i] + lr * gp[i];
}

void ApplyStep(std::span<float> w, std::span<const float> history) {
  DP_CHECK_EQ(w.size(), history.size());
  float* __restrict wp = w.data();
  const float* __restrict h = history.data();
  const size_t n = w.size();
  for (size_t i = 0; i < n; ++i) wp[i] = wp[i] - h[i];
}

void SgdUpdate(const UpdateParams& p, std::span<const float> grad, std::span<float> w,
               std::span<float> history) {
  DP_CHECK_EQ(grad.size(), w.size());
  DP_CHECK_EQ(history.size(), w.size());
  const auto [lr, decay, scale] = Effective(p);
  const float momentum = p.momentum;
  const float* __restrict gp = grad.data();
  float* __restrict wp = w.data();
  float* __restrict h = history.data();
  const size_t n = w.size();
  for (size_t i = 0; i < n; ++i) {
    float g = gp[i] * scale;
    g = g + decay * wp[i];
    const float hi = momentum * h[i] + lr * g;
    h[i] = hi;
    wp[i] = wp[i] - hi;
  }
}

}  // namespace downpour
