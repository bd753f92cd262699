// lr_policy.cc — Caffe's learning-rate policies.
#include "common/solver/lr_policy.h"

#include <algorithm>
#include <cmath>

namespace downpour {

namespace {

// The schedule without warm-up.
double ScheduledRate(const SolverConfig& s, int64_t iter) {
  const double base = s.base_lr;
  const double gamma = s.gamma;
  const double power = s.power;
  const double it = static_cast<double>(iter);
  switch (s.lr_policy) {
    case LrPolicy::kFixed:
      return base;
    case LrPolicy::kStep:
      return base * std::pow(gamma, static_cast<double>(iter / s.stepsize));
    case LrPolicy::kMultistep: {
      const auto k = std::upper_bound(s.stepvalues.begin(), s.stepvalues.end(), iter) -
                     s.stepvalues.begin();
      return base * std::pow(gamma, static_cast<double>(k));
    }
    case LrPolicy::kPoly: {
      // max_iter 0 means "the run's length" and is resolved by RunSolver before use; unresolved,
      // the rate stays at base_lr rather than dividing by zero.
      if (s.max_iter <= 0) return base;
      const double frac = 1.0 - it / static_cast<double>(s.max_iter);
      return base * std::pow(std::max(frac, 0.0), power);
    }
    case LrPolicy::kInv:
      return base * std::pow(1.0 + gamma * it, -power);
    case LrPolicy::kExp:
      return base * std::pow(gamma, it);
  }
  return base;
}

}  // namespace

float LearningRateAt(const SolverConfig& s, int64_t iter) {
  double rate = ScheduledRate(s, iter);
  // solver.warmup_iters = n (Goyal et al. 2017's gradual warm-up): the first n iterations ramp
  // linearly up to the schedule, which a run of many workers needs when its summed batch is large.
  if (iter >= 0 && iter < s.warmup_iters) {
    rate *= static_cast<double>(iter + 1) / static_cast<double>(s.warmup_iters);
  }
  return static_cast<float>(rate);
}

float StalenessAwareLr(float lr, int64_t staleness) {
  return staleness > 1 ? lr / static_cast<float>(staleness) : lr;
}

}  // namespace downpour
