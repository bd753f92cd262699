// gradient_checker.h — Caffe's GradientChecker (include/caffe/test/test_gradient_check_util.hpp)
// over the engine's Layer interface: one layer of ANY backend, built through
// Backend::CreateLayer from a LayerContext exactly as the Net builds it, has its Backward
// compared with central finite differences of an objective over its top.
//
// The objective E is a fixed random linear functional of the top, E = Σ_i r_i · top_i with r
// uniform in [-1, 1] (seeded), computed on the host in double from Backend::ReadBlob; the top
// gradient handed to Backward is r (Backend::WriteBlobGrad). A loss layer ignores its top
// gradient (layer.h: its implicit top gradient is 1), so for SoftmaxWithLoss r = 1 and E is the
// loss itself.
//
// Every element v of bottom 0 (the bottom that receives a gradient; a loss layer's labels do
// not) and of every parameter tensor is checked:
//   numeric  = (E(v⁺) − E(v⁻)) / (v⁺ − v⁻),  v± = float(v ± stepsize) (the values the layer saw)
//   analytic = the layer's Backward at the unperturbed point
//   passes  ⇔ |analytic − numeric| ≤ threshold · max(|analytic|, |numeric|, 1)   (Caffe's rule;
//              written `diff <= tol`, so a NaN fails)
// No fraction may fail: ok() is false as soon as one checked element does.
//
// Kinks, as Caffe: an element whose own value v has kink − kink_range ≤ |v| ≤ kink + kink_range
// is not checked (counted in skipped_at_kink). For ReLU (kink 0, kink_range ≥ stepsize) the two
// evaluations would straddle x = 0, where the derivative jumps. Non-differentiable points that
// are not a function of the element's own value (max pooling's ties between two inputs of a
// window) are the caller's to keep at least a step away, by the input values it chooses.
//
// Ownership: the checker allocates the layer's parameter / gradient buffers and bottom 0's
// gradient through the backend, keeps their host mirrors alive while they exist (the CUDA backend
// page-locks a buffer's first host partner), and frees everything before it returns.
// Thread-safety: drives the backend from the calling thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "client/engine/layer.h"
#include "client/engine/net_spec.h"
#include "common/status.h"
#include "common/tensor_spec.h"

namespace downpour::engine {

// One layer and the values to check it at, canonical layouts throughout.
struct LayerCase {
  LayerSpec spec;                               // the layer under test
  std::vector<std::vector<int>> bottom_shapes;  // one per spec.bottoms
  std::vector<int> top_shape;
  std::vector<TensorSpec> param_specs;      // weight, bias (0..2)
  std::vector<std::vector<float>> bottoms;  // values per bottom (labels as float class ids)
  std::vector<std::vector<float>> params;   // values per parameter tensor
};

// The case for layer `layer` of `net` at batch `batch`, shapes and parameter specs from
// InferShapes (as the Net gets them), seeded values: bottoms uniform in [-1, 1], a loss or
// accuracy layer's labels (bottom 1) uniform class ids in [0, K), parameters gaussian with
// std 0.5. Callers overwrite values where a layer needs particular ones.
Status MakeLayerCase(const NetSpec& net, int layer, int batch, uint32_t seed, LayerCase* out);

struct GradientCheckOptions {
  double stepsize = 1e-2;   // central-difference step (Caffe's default in its layer tests)
  double threshold = 1e-3;  // relative tolerance, floored at 1 (Caffe's rule, above)
  double kink = 0.0;        // Caffe's kink: |v| near `kink` is not differentiable ...
  double kink_range = -1;   // ... within this distance; < 0 (default): no kink region
  Phase phase = Phase::kTrain;
  int64_t train_step = 5;          // Layer::SetStep before every Forward: dropout's mask stays fixed
  uint64_t layer_seed = 77;        // LayerContext::seed
  uint32_t objective_seed = 1701;  // seed of r (Caffe's default seed)
  int max_reported = 10;           // failing elements listed in the result
};

struct GradientMismatch {
  std::string tensor;  // "bottom 'data'" or a parameter's name, e.g. "conv.weight"
  int64_t index = 0;   // element, canonical layout
  double value = 0, analytic = 0, numeric = 0, tolerance = 0;
};

struct GradientCheckResult {
  std::string layer;    // "layer 'pool' (Pooling) on onednn"
  int64_t checked = 0;  // elements compared
  int64_t skipped_at_kink = 0;
  int64_t failed = 0;
  std::vector<GradientMismatch> mismatches;  // the first max_reported failures, in check order
  bool ok() const { return failed == 0 && checked > 0; }
  // One line: counts, then each listed mismatch (tensor, index, value, analytic, numeric, tolerance).
  std::string Summary() const;
};

// Errors (Status) are for a case that cannot be run: value sizes that do not match the shapes,
// a layer the backend cannot build or reshape, a layer without backward. Gradient mismatches are
// reported in `result`.
Status CheckLayerGradients(Backend& backend, const LayerCase& layer_case, const GradientCheckOptions& options,
                           GradientCheckResult* result);

}  // namespace downpour::engine
