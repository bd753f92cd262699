// gradient_cases.h — the layer gradient suite every backend runs through the gradient checker
// (gradient_checker.h): every layer type at geometries that exercise its edge cases (for example
// convolution with groups, padding, stride and rectangular kernels; activations across their
// kink; MAX and AVE pooling with padding, Caffe's ceil overhang and its dropped last window;
// dropout in the train phase), with the values and checker options each needs (gradient_cases.cc
// lists them).
// tests/client/engine_layer_gradcheck_test.cc runs it on the reference and oneDNN backends,
// tests/client/gpu_gradcheck_test.cc on CUDA, so a new backend gets the same suite.
//
// Thread-safety: plain values and pure functions.
#pragma once

#include <cstdint>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "client/engine/gradient_checker.h"
#include "common/status.h"

namespace downpour::engine {

// Every backend keeps blobs and parameters in float32: Caffe's GradientChecker(1e-2, 1e-3),
// step 1e-2 and |analytic − numeric| ≤ 1e-3 · max(|analytic|, |numeric|, 1). Float rounding of the
// objective then adds ≈1e-5 to a numeric derivative and central differences of a smooth layer
// (LRN, softmax) err by O(step²): both well inside 1e-3.
GradientCheckOptions Float32GradientOptions();

struct GradientCase {
  std::string name;   // a test-name suffix, e.g. "AvePoolPadAndOverhang"
  std::string input;  // the body of the net's [input] table
  std::string layer;  // one [[layer]] reading "data" (a loss: "scores" and "label"), top "t"
  int batch = 2;
  GradientCheckOptions options = Float32GradientOptions();
  std::function<void(LayerCase*)> prepare = nullptr;  // values the layer needs; null: MakeLayerCase's seeded ones
};

// The suite. Non-differentiable points: ReLU's inputs within one step of 0 are skipped (Caffe's
// kink 0, kink_range = step; the case puts three there); max pooling's ties are avoided by
// inputs that are distinct multiples of 0.05, more than twice the step apart.
std::vector<GradientCase> LayerGradientCases();

// The case's layer with shapes from InferShapes and seeded values (MakeLayerCase), then `prepare`.
Status MakeGradientCase(const GradientCase& c, uint32_t seed, LayerCase* out);

// Its name, for test frameworks' parameter printing (gtest finds it by argument-dependent lookup).
inline void PrintTo(const GradientCase& c, std::ostream* os) { *os << c.name; }

}  // namespace downpour::engine
