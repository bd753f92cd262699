// factor_product.h — the dense gradient a sufficient-factor span stands for, computed the slow
// way, for the tests that check factors against dense gradients (engine on CPU and CUDA, shards).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace downpour::engine::testing {

// dW (out×in) = δᵀ (out×B) · a (B×in) from a factored span [δ (B×out) | a (B×in)], summed in
// double and rounded once.
inline std::vector<float> DenseFromFactors(std::span<const float> span, int64_t b, int64_t out, int64_t in) {
  std::vector<float> g(static_cast<size_t>(out * in));
  const float* delta = span.data();
  const float* a = delta + b * out;
  for (int64_t r = 0; r < out; ++r)
    for (int64_t c = 0; c < in; ++c) {
      double s = 0;
      for (int64_t k = 0; k < b; ++k) s += static_cast<double>(delta[k * out + r]) * a[k * in + c];
      g[static_cast<size_t>(r * in + c)] = static_cast<float>(s);
    }
  return g;
}

}  // namespace downpour::engine::testing
