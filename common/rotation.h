// rotation.h — who trains which model on which data, stage by stage, in a multi-model run
// ([[models]], docs/multi_model.md). A pure function of (scheme, K models, W workers, passes):
// every worker computes its own stages, and tests check the whole table.
//
// Pipeline ("models move, data stays"; Cerebro's model hopper parallelism, Nakandala et al.,
// VLDB 2020): worker i reads only its own partition i. The run has T = K × passes stages; in
// stage t worker i trains model
//     m(i, t) = (i + t) mod K
// for one unit (one pass over its partition, or rotation.stage_steps steps), with local SGD,
// then hands the model back to the servers (a move push: the change of its weights). The next
// stage's holder pulls it from there. The rule covers every K and W:
//   * K >= W: a model has at most one holder per stage; K − W models rest in each stage (no
//     worker is idle). Over t = 0..K−1 worker i visits every model once.
//   * K < W: workers i, i + K, i + 2K, ... hold the same model in a stage (a group of
//     ceil/floor(W/K)); each trains its own copy on its own partition and pushes its change
//     divided by the group size, so the model moves on as the average of the group's copies
//     (local SGD with one averaging per stage).
// Either way, over the T stages every (model, partition) pair is visited exactly `passes`
// times, so every model sees passes epochs of the training set and every partition trains
// every model equally. A model's holders in stage t wait, before they pull it, until it has
// taken every move push of the stages before t (StageTask::moves_before): the model really
// moves from one holder to the next, never trained twice from the same weights.
//
// Sequential (baseline a): K stages; in stage k every worker trains model k data-parallel through
// the servers (the run's consistency mode), passes units each.
// Independent (baseline b): model k is a one-worker job on worker k mod W (a worker with
// several jobs runs them one after another; with K < W some workers have none). A job reads
// the whole training set: W × passes stages, partition (i + j) mod W in its stage j (its own
// first; the others' partitions are data moved to it), local SGD with the worker's own
// momentum throughout, a move push after each stage (so the servers follow its progress).
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <vector>

#include "common/run_config.h"

namespace downpour {

struct StageTask {
  int model = 0;              // model id trained in this stage
  int partition = 0;          // whose partition is read (this worker's own = no data moved)
  int units = 1;              // passes over the partition (or rotation.stage_steps steps each)
  int group = 1;              // pipeline: holders of the model this stage (changes are averaged)
  int64_t moves_before = 0;   // pipeline / independent: move pushes the model took before this stage
  bool data_parallel = false; // sequential: per-step push and pull through the servers
  bool pull = true;           // local stages: start from the servers' copy (false: keep the local one)
  bool operator==(const StageTask&) const = default;
};

// Model trained by worker `worker` in pipeline stage `stage` of K models.
inline int PipelineModel(int worker, int stage, int models) { return (worker + stage) % models; }

// Worker `worker`'s stages, in order, for K = `models` models on W = `workers` workers.
std::vector<StageTask> WorkerStages(RotationScheme scheme, int models, int workers, int passes, int worker);

// Move pushes model `model` takes over the whole run (pipeline: W × passes; independent:
// W × passes from its one job; sequential: none).
int64_t MovesPerModel(RotationScheme scheme, int models, int workers, int passes);

}  // namespace downpour
