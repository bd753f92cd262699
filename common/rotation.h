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
//   * K < W: workers i, i + K, i + 2K, ... (i mod K, a fixed class) hold the same model in a
//     stage, a group of ceil/floor(W/K). With rotation.groups = "data_parallel" (the default)
//     the group trains it together through the servers, every holder on its own partition, per
//     step in the run's consistency mode: async applies each holder's gradient on arrival; sync
//     averages one gradient of each holder per round (the servers know a round's holders from
//     the model's version: round v belongs to stage v / stage_steps, HoldsModel). With
//     "average" each holder trains its own copy with local SGD and pushes its change divided by
//     the group size, so the model moves on as the average of the copies (one averaging per
//     stage: fewer bytes, a different algorithm).
// Either way, over the T stages every (model, partition) pair is visited exactly `passes`
// times, so every model sees passes epochs of the training set and every partition trains
// every model equally. A model's holders in stage t wait, before they pull it, until it has
// taken every update of the stages before t (VersionsBefore): the model really moves from one
// holder to the next, never trained twice from the same weights.
//
// Sequential (baseline a): K stages; in stage k every worker trains model k data-parallel through
// the servers (the run's consistency mode), passes units each (a group of W).
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
  int group = 1;              // pipeline: holders of the model this stage
  // Pipeline / independent: holder-stages of the model before this one (each a move push of a
  // local stage, or stage_steps gradient pushes of a data-parallel one).
  int64_t moves_before = 0;
  int64_t stages_before = 0;  // pipeline: earlier stages in which the model was trained
  bool data_parallel = false; // per-step push and pull through the servers (sequential; K < W pipeline groups)
  bool pull = true;           // local stages: start from the servers' copy (false: keep the local one)
  bool operator==(const StageTask&) const = default;
};

// Model trained by worker `worker` in pipeline stage `stage` of K models.
inline int PipelineModel(int worker, int stage, int models) { return (worker + stage) % models; }

// Worker `worker`'s stages, in order, for K = `models` models on W = `workers` workers.
// `groups` matters only to a pipeline with K < W (data-parallel stages or local averaging).
std::vector<StageTask> WorkerStages(RotationScheme scheme, int models, int workers, int passes, int worker,
                                    RotationGroups groups = RotationGroups::kDataParallel);

// Move pushes each model takes over the whole run (pipeline with local stages: W × passes;
// independent: W × passes from its one job; sequential and data-parallel pipeline groups: none).
int64_t MovesPerModel(RotationScheme scheme, int models, int workers, int passes,
                      RotationGroups groups = RotationGroups::kDataParallel);

// Whether every stage of every worker has one holder, who moves the model on with one move push
// (a pipeline with K >= W; the independent baseline): then a restarted worker can tell from a
// model's version whether its own stage's move is in, and a run can be resumed.
bool EveryStageHasOneHolder(RotationScheme scheme, int models, int workers);

// The model's chunk version at which stage `t` starts (every update of the earlier stages
// taken), `steps` per holder per stage: a local stage's earlier stages each added one move
// push; a data-parallel pipeline stage's one version per step and holder (async) or per step
// (sync: a round averages the holders); a sequential stage starts the model at 0.
int64_t VersionsBefore(const StageTask& t, ConsistencyMode mode, int64_t steps);
// ... and at which it ends (this stage's updates, every holder's, taken).
int64_t VersionsAfter(const StageTask& t, ConsistencyMode mode, int64_t steps);

// Sync pipeline groups: whether `worker` holds `model` in the stage that round `version` of
// the model belongs to (stage = version / stage_steps; nobody past the last stage). The
// servers' sync rounds wait for exactly these workers (server/consistency.h).
bool HoldsModel(int worker, int model, int64_t version, int64_t stage_steps, int models, int workers, int passes);

}  // namespace downpour
