// tensor_compare.h — the comparison every engine check uses (backend agreement, GPU vs CPU):
// a computed tensor against the expected one, in the shape of llm.c's check_tensor
// (`ok = ok && diff <= tol`): every element must be finite in BOTH tensors and within
// tolerance, so a NaN or Inf anywhere fails, and the verdict names the first failing element.
//
// Metric (the engine's agreement metric, max-norm relative): element i passes iff
//   |got[i] − want[i]| ≤ rel · scale,   scale = max(max_j |want[j]| over finite want, 1e-6).
// rel = 0 demands bit-equal values (up to the sign of zero).
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace downpour::engine {

struct TensorComparison {
  bool ok = true;
  int64_t failures = 0;      // elements that failed (non-finite in either tensor, or over tolerance)
  int64_t first_bad = -1;    // index of the first failing element; -1 when none
  double got = 0, want = 0;  // the first failing element's values
  double scale = 0;          // max |want| over finite elements, at least 1e-6
  double tolerance = 0;      // rel · scale: the absolute bound every element had to meet
  double worst = 0;          // max |got − want| / scale over the elements where both are finite
  std::string message;       // empty when ok; else names `what`, the first failing element, its
                             // values, the tolerance, the failure count and the worst error
};

// Sizes that differ fail too (message says so; first_bad = -1).
TensorComparison CompareTensors(std::string_view what, std::span<const float> got, std::span<const float> want,
                                double rel);

}  // namespace downpour::engine
