// tensor_spec.h — one learnable tensor of a model, as the parameter layout sees it.
//
// A model's parameters are an ordered list of TensorSpecs (the engine's Net produces it, in
// layer order, weights before biases). Shapes are canonical Caffe layouts: convolution
// weights OIHW (out, in/groups, kh, kw), inner-product weights (out, in), biases (out).
// The parameter layout (common/layout.h) is a pure function of this list and the server
// count, so every process that builds the same net computes the same layout.
//
// Thread-safety: plain value type.
#pragma once

#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

namespace downpour {

struct TensorSpec {
  std::string name;             // unique within a model, e.g. "conv1.weight", "fc8.bias"
  std::vector<int64_t> shape;   // canonical layout, see above
  float lr_mult = 1.0f;         // per-tensor learning-rate multiplier (Caffe: biases 2)
  float decay_mult = 1.0f;      // per-tensor weight-decay multiplier (Caffe: biases 0)

  int64_t numel() const {
    return std::accumulate(shape.begin(), shape.end(), int64_t{1},
                           [](int64_t a, int64_t b) { return a * b; });
  }
};

inline int64_t TotalElements(const std::vector<TensorSpec>& specs) {
  int64_t n = 0;
  for (const auto& s : specs) n += s.numel();
  return n;
}

}  // namespace downpour
