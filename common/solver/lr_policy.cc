// lr_policy.cc — Caffe's learning-rate policies.
#include "common/solver/lr_policy.h"

#include <algorithm>
#include <cmath>

namespace downpour {

float LearningRateAt(const SolverConfig& s, int64_t iter) {
  const double base = s.base_lr;
  const double gamma = s.gamma;
  const double power = s.power;
  const double it = static_cast<double>(iter);
  switch (s.lr_policy) {
    case LrPolicy::kFixed:
      return static_cast<float>(base);
    case LrPolicy::kStep:
      return static_cast<float>(base * std::pow(gamma, static_cast<double>(iter / s.stepsize)));
    case LrPolicy::kMultistep: {
      const auto k = std::upper_bound(s.stepvalues.begin(), s.stepvalues.end(), iter) -
                     s.stepvalues.begin();
      return static_cast<float>(base * std::pow(gamma, static_cast<double>(k)));
    }
    case LrPolicy::kPoly: {
      // max_iter 0 means "the run's length" and is resolved by RunSolver before use; unresolved,
      // the rate stays at base_lr rather than dividing by zero.
      if (s.max_iter <= 0) return static_cast<float>(base);
      const double frac = 1.0 - it / static_cast<double>(s.max_iter);
      return static_cast<float>(base * std::pow(std::max(frac, 0.0), power));
    }
    case LrPolicy::kInv:
      return static_cast<float>(base * std::pow(1.0 + gamma * it, -power));
    case LrPolicy::kExp:
      return static_cast<float>(base * std::pow(gamma, it));
  }
  return static_cast<float>(base);
}

float StalenessAwareLr(float lr, int64_t staleness) {
  return staleness > 1 ? lr / static_cast<float>(staleness) : lr;
}

}  // namespace downpour
