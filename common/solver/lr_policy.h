// lr_policy.h — the learning rate at an iteration, for each LrPolicy, exactly as Caffe's
// SGDSolver::GetLearningRate defines it (src/caffe/solvers/sgd_solver.cpp).
//
// "iter", the schedule's iteration, is defined once for every mode: the number of worker
// batches whose gradients have been applied so far, i.e. global images processed / batch size
// (ScheduleIterations). With one worker that is Caffe's iter_ (updates applied). In async each
// gradient applied advances it by 1 (by push_every when a push averages several batches); in
// sync an update averaging n workers' gradients advances it by n. So a sync run and an async
// run that have processed the same number of images see the same lr, and stepsize, stepvalues
// and max_iter count worker batches in every mode. A shard server keeps it per chunk
// (ChunkStore::Apply, server/chunk_store.cc); the worker's --local run counts its own batches.
// Rates are computed in double and rounded to float once.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>

#include "common/config/solver.h"

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

// How far an update moves the schedule: `gradients` worker gradients combined (1 in async, n
// averaged in sync), each the average of `batches_per_push` batches (worker.push_every).
// Values below 1 count as 1.
inline int64_t ScheduleIterations(int64_t gradients, int64_t batches_per_push) {
  return (gradients < 1 ? 1 : gradients) * (batches_per_push < 1 ? 1 : batches_per_push);
}

// Staleness-aware step (Zhang et al. 2016): lr / staleness, staleness counted in updates
// applied since the gradient's base version; a staleness of 0 or 1 leaves lr unchanged.
float StalenessAwareLr(float lr, int64_t staleness);

}  // namespace downpour
