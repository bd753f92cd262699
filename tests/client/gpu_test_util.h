// gpu_test_util.h — shared helpers of the GPU backend tests: skipping without a device, and
// tensor comparison with a max-norm relative tolerance (the engine's agreement metric:
// max |got - want| / max |want| per tensor).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <span>
#include <string>

#include "client/engine/gpu/cuda_backend.h"

namespace downpour::engine::testing {

// Evaluates to true (and marks the test skipped with the reason) when no CUDA device is usable.
#define DP_SKIP_WITHOUT_GPU()                                                 \
  do {                                                                        \
    std::string dp_why_;                                                      \
    if (::downpour::engine::CudaDeviceCount(&dp_why_) == 0)                   \
      GTEST_SKIP() << "no CUDA device: " << dp_why_;                          \
  } while (0)

inline double MaxAbs(std::span<const float> v) {
  double m = 0;
  for (float x : v) m = std::max(m, static_cast<double>(std::abs(x)));
  return m;
}

inline void ExpectClose(const std::string& what, std::span<const float> got, std::span<const float> want,
                        double rel) {
  ASSERT_EQ(got.size(), want.size()) << what;
  const double scale = std::max(MaxAbs(want), 1e-6);
  double worst = 0;
  size_t worst_i = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = std::abs(double(got[i]) - double(want[i]));
    if (!(d <= worst)) {  // also catches NaN
      worst = std::isnan(d) ? INFINITY : d;
      worst_i = i;
    }
  }
  EXPECT_LE(worst / scale, rel) << what << ": element " << worst_i << " gpu " << got[worst_i] << " cpu "
                                << want[worst_i] << " (max |cpu| " << scale << ", " << got.size()
                                << " elements)";
}

}  // namespace downpour::engine::testing
