// local_solver.h — the update a worker applies to its own copy of the weights: a --local
// reference run, EASGD's local steps, a multi-model stage's local SGD. One rule for all three,
// the servers' rule on the worker (common/solver/sgd.h): clip the whole gradient to
// solver.clip_gradients (Caffe's ClipGradients), take the schedule's rate at the iteration, and
// apply solver.update (momentum or AdaGrad) with its state. A pushing worker clips with the same
// Clip and applies nothing.
//
// The iteration is worker batches processed by the run (common/solver/lr_policy.h), whoever
// counts them: LocalIteration says how a worker that trains beside others counts.
//
// Thread-safety: one thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "client/engine/net.h"
#include "common/config/solver.h"
#include "common/solver/lr_policy.h"
#include "common/solver/update_rule.h"

namespace downpour::worker {

// The schedule's iteration after `updates` local updates of `batches_per_update` batches each
// (worker.push_every), while `concurrent` workers train at once and so process as many batches
// (EASGD's workers; a pipeline stage's holders of one model).
inline int64_t LocalIteration(int64_t updates, int batches_per_update, int concurrent) {
  return updates * ScheduleIterations(concurrent, batches_per_update);
}

class LocalSolver {
 public:
  explicit LocalSolver(const SolverConfig& solver);

  // (Re)starts the rule's state for `params` floats: momentum 0, AdaGrad's initial accumulator.
  void Reset(size_t params);
  // Whether the state is sized for `params` floats (Reset was called for them).
  bool ready(size_t params) const { return state_.size() == params; }

  // Scales `grad` (the whole gradient) down to solver.clip_gradients when its L2 norm exceeds it;
  // a no-op with clipping off. Records the norm and whether it clipped.
  void Clip(std::span<float> grad);
  bool clipping() const { return solver_.clip_gradients > 0; }

  // One update of `net`'s weights from its gradient, at schedule iteration `iter`: Clip, then
  // the rule at LearningRateAt(solver, iter). The state must be ready for the net's parameters.
  void Step(engine::Net* net, int64_t iter);

  double grad_norm() const { return grad_norm_; }         // the last Clip's norm (0 before)
  int64_t clipped_steps() const { return clipped_steps_; }  // Clips that scaled the gradient
  const SolverConfig& solver() const { return solver_; }

 private:
  SolverConfig solver_;
  std::unique_ptr<UpdateRule> rule_;
  std::vector<float> state_;  // the rule's per-parameter state (momentum, AdaGrad's sums)
  double grad_norm_ = 0;
  int64_t clipped_steps_ = 0;
};

}  // namespace downpour::worker
