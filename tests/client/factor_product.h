// factor_product.h — the dense gradient a sufficient-factor span stands for, computed the slow
// way, for the tests that check factors against dense gradients (engine on CPU and CUDA, shards).
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "common/layout.h"

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

// What a push's buffer holds for a factored tensor (ps_client.h FactorTensor) from the plain
// span [δ (B×out) | a (B×in)]: δ packed in `layout`'s per-chunk row blocks (FactorRowBlocks), then
// a; the floats after them as `span` has them.
inline std::vector<float> PackedForPush(const ParamLayout& layout, int tensor, std::span<const float> span, int64_t b) {
  const TensorSpec& t = layout.tensors()[static_cast<size_t>(tensor)];
  const int64_t out = t.shape[0], in = t.numel() / out;
  const std::vector<RowSpan> blocks = FactorRowBlocks(layout, tensor);
  std::vector<float> packed(span.begin(), span.end());
  PackRowBlocks(span.data(), b, out, blocks, packed.data());
  const int64_t rows = PackedRows(blocks);
  std::copy(span.begin() + b * out, span.begin() + b * (out + in), packed.begin() + b * rows);
  return packed;
}

}  // namespace downpour::engine::testing
