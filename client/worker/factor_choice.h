// factor_choice.h — which inner-product weights a worker pushes as sufficient factors
// (compression.factors; docs/factors.md): those whose factors are fewer floats on the wire than
// dW (out×in) at the run's batch B: δ (B×out) plus a (B×in) once per server holding rows of the
// weight (FactorWireFloats, common/layout.h), so with many servers a layer whose single copy
// would pay can stay dense. Factors replace the gradient of ONE step, so a run
// that accumulates several local steps (push_every > 1), clips the global gradient norm
// (solver.clip_gradients) or has no parameter servers sends dense gradients instead.
//
// Thread-safety: pure function; logs (spdlog) each choice and each fallback once per call.
#pragma once

#include <vector>

#include "client/engine/net.h"
#include "common/layout.h"

namespace downpour::worker {

struct FactorChoiceInput {
  bool factors = false;          // compression.factors
  int push_every = 1;            // worker.push_every
  double clip_gradients = -1;    // solver.clip_gradients (> 0 = on)
  bool has_servers = true;       // false: the single-process reference run
  int worker_id = 0;             // for the log lines
};

// Tensor indices (into net.param_specs(), ascending) to pass to Net::SetFactoredParams; empty
// when factors are off or none pays at net.batch_size() over `layout` (the net's tensors).
std::vector<int> ChooseFactoredTensors(const engine::Net& net, const ParamLayout& layout, const FactorChoiceInput& in);

}  // namespace downpour::worker
