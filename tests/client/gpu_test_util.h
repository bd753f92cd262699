// gpu_test_util.h — shared helpers of the GPU backend tests: skipping without a device, and
// tensor comparison with a max-norm relative tolerance (the engine's agreement metric:
// |got − want| ≤ rel · max |want| per element, client/engine/tensor_compare.h), which fails on
// a NaN or Inf in either tensor and names the first failing element.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <span>
#include <string>

#include "client/engine/gpu/cuda_backend.h"
#include "client/engine/tensor_compare.h"

namespace downpour::engine::testing {

// Evaluates to true (and marks the test skipped with the reason) when no CUDA device is usable.
#define DP_SKIP_WITHOUT_GPU()                                                 \
  do {                                                                        \
    std::string dp_why_;                                                      \
    if (::downpour::engine::CudaDeviceCount(&dp_why_) == 0)                   \
      GTEST_SKIP() << "no CUDA device: " << dp_why_;                          \
  } while (0)

// max |v|; NaN when v holds a NaN (so EXPECT_GT(MaxAbs(v), 0) fails on it).
inline double MaxAbs(std::span<const float> v) {
  double m = 0;
  for (float x : v) {
    if (std::isnan(x)) return x;
    m = std::max(m, static_cast<double>(std::abs(x)));
  }
  return m;
}

// `got` is the GPU's tensor, `want` the CPU's (or the GPU's own, for determinism checks).
inline void ExpectClose(const std::string& what, std::span<const float> got, std::span<const float> want,
                        double rel) {
  const TensorComparison c = CompareTensors(what, got, want, rel);
  EXPECT_TRUE(c.ok) << c.message;
}

}  // namespace downpour::engine::testing
