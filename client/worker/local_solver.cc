// local_solver.cc — see local_solver.h.
#include "client/worker/local_solver.h"

#include <cmath>

#include "common/solver/sgd.h"

namespace downpour::worker {

LocalSolver::LocalSolver(const SolverConfig& solver) : solver_(solver), rule_(MakeUpdateRule(solver)) {}

void LocalSolver::Reset(size_t params) { state_.assign(params, rule_->initial_state()); }

void LocalSolver::Clip(std::span<float> grad) {
  if (!clipping()) return;
  const double sq = SquaredNorm(grad);
  grad_norm_ = std::sqrt(sq);
  const float scale = ClipScale(sq, solver_.clip_gradients);
  if (scale != 1.0f) {
    Scale(grad, scale);
    ++clipped_steps_;
  }
}

void LocalSolver::Step(engine::Net* net, int64_t iter) {
  DP_CHECK(ready(net->params().size()));
  Clip(net->grads());
  net->Update(*rule_, LearningRateAt(solver_, iter), solver_.momentum, solver_.weight_decay, state_);
}

}  // namespace downpour::worker
