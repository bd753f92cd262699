// factor_choice.cc — see factor_choice.h.
#include "client/worker/factor_choice.h"

#include <spdlog/spdlog.h>

namespace downpour::worker {

std::vector<int> ChooseFactoredTensors(const engine::Net& net, const ParamLayout& layout, const FactorChoiceInput& in) {
  std::vector<int> chosen;
  if (!in.factors) return chosen;
  const char* why_not = !in.has_servers          ? "there are no parameter servers (local run)"
                        : in.push_every != 1     ? "worker.push_every > 1 accumulates several steps, which factors cannot"
                        : in.clip_gradients > 0  ? "solver.clip_gradients needs the dense gradient's global norm"
                                                 : nullptr;
  if (why_not != nullptr) {
    spdlog::info("worker {}: compression.factors is on but every gradient goes dense: {}", in.worker_id, why_not);
    return chosen;
  }
  DP_CHECK_EQ(layout.tensors().size(), net.param_specs().size());
  const int64_t b = net.batch_size();
  for (int t = 0; t < static_cast<int>(net.param_specs().size()); ++t) {
    int64_t out = 0, inputs = 0;
    if (!net.InnerProductDims(t, &out, &inputs)) continue;
    const std::string& name = net.param_specs()[static_cast<size_t>(t)].name;
    int holders = 0;
    const int64_t dense = out * inputs, factored = FactorWireFloats(layout, t, b, &holders);
    if (factored < dense) {
      spdlog::info("worker {}: '{}' ({}×{}) pushed as sufficient factors: δ {}×{} and a {}×{} to each of the {} "
                   "server(s) holding it, {} floats instead of {} ({:.1f}× fewer)", in.worker_id, name, out, inputs, b,
                   out, b, inputs, holders, factored, dense, static_cast<double>(dense) / static_cast<double>(factored));
      chosen.push_back(t);
    } else if (b * (out + inputs) < dense) {
      spdlog::info("worker {}: '{}' ({}×{}) pushed dense: {} servers hold it, and its factors at batch {} with a to "
                   "each of them would be {} floats, dW is {} (with fewer servers or a smaller batch factors would "
                   "pay)", in.worker_id, name, out, inputs, holders, b, factored, dense);
    } else {
      spdlog::info("worker {}: '{}' ({}×{}) pushed dense: its factors at batch {} would be {} floats, dW is {}",
                   in.worker_id, name, out, inputs, b, b * (out + inputs), dense);
    }
  }
  return chosen;
}

}  // namespace downpour::worker
