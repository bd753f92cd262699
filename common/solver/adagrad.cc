// adagrad.cc — see adagrad.h.
#include "common/solver/adagrad.h"

#include <cmath>

#include "common/status.h"

namespace downpour {

void AdaGradUpdate(const UpdateParams& p, float epsilon, std::span<const float> grad, std::span<float> w,
                   std::span<float> acc) {
  DP_CHECK_EQ(grad.size(), w.size());
  DP_CHECK_EQ(acc.size(), w.size());
  const auto [lr, decay, scale] = Effective(p);
  const size_t n = w.size();
  float* wp = w.data();
  float* ap = acc.data();
  const float* gp = grad.data();
  for (size_t i = 0; i < n; ++i) {
    const float g = gp[i] * scale + decay * wp[i];
    ap[i] += g * g;
    wp[i] -= lr * g / std::sqrt(ap[i] + epsilon);
  }
}

}  // namespace downpour
