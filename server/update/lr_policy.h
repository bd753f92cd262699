// lr_policy.h — the learning rate at an iteration, for each LrPolicy, exactly as Caffe's
// SGDSolver::GetLearningRate defines it (src/caffe/solvers/sgd_solver.cpp).
//
// "iter" is the number of updates applied so far (Caffe's iter_), starting at 0. On a shard
// server that is the version of the chunk being updated (server/shard.cc ApplyGradient), so in a
// sync run every chunk of every shard sees the same iter at a clock.
// Rates are computed in double and rounded to float once.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>

#include "common/run_config.h"

namespace downpour {

//   fixed:     base_lr
//   step:      base_lr * gamma ^ floor(iter / stepsize)
//   multistep: base_lr * gamma ^ k, k = number of stepvalues <= iter
//              (Caffe advances k one value per iteration; for increasing stepvalues and an
//              iteration counter that visits every value this is the same k)
//   poly:      base_lr * (1 - iter / max_iter) ^ power   (0 once iter >= max_iter)
//   inv:       base_lr * (1 + gamma * iter) ^ (-power)
//   exp:       base_lr * gamma ^ iter
float LearningRateAt(const SolverConfig& solver, int64_t iter);

// Staleness-aware step (Zhang et al. 2016): lr / staleness, staleness counted in updates
// applied since the gradient's base version; a staleness of 0 or 1 leaves lr unchanged.
float StalenessAwareLr(float lr, int64_t staleness);

}  // namespace downpour
