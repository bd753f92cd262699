// multi_model.h — a worker of a multi-model run ([[models]] in the run config; docs/multi_model.md):
// K models on one set of servers, shared among the W workers by a rotation scheme
// (common/rotation.h). downpour-worker runs it instead of the one-model loop when the config
// lists models.
//
// What one worker does, stage by stage (its WorkerStages):
//   * a local stage (pipeline, independent): pull the model from the servers (waiting until the
//     model has taken the move pushes of every earlier stage, so a model is never trained twice
//     from the same weights), train it with the model's own solver on one partition, one batch
//     per SGD update (the servers' rule, common/solver; momentum restarts at each move, and an
//     independent job keeps its own through its stages), then hand it back: a move push of
//     (w_end − w_pulled) / group with the stage's batches (kFlagMove). The lr schedule's
//     iteration is the model's, carried by the servers: the pull says where it stands, and a
//     stage of g holders advances it by g batches per step.
//   * a data-parallel stage (sequential; a pipeline's groups when K < W and rotation.groups =
//     "data_parallel"): the one-model Trainer through the servers, in the run's consistency
//     mode, on this worker's own partition; a pipeline group's holders first wait until the
//     model has taken every update of the earlier stages, and in sync start their clocks at
//     the model's version (the servers' rounds wait for the stage's holders).
// A restarted worker (--resume, which the launcher gives a dead worker it restarts) goes on at
// its first stage whose move the servers have not taken, from the servers' copy of the model;
// runs whose stages are shared (data-parallel, or groups averaging) refuse it.
// Partitions: worker j's own LMDB (data.sharding = "own"); a stage on another worker's
// partition (independent jobs) reads that worker's LMDB, which counts as data moved.
//
// Metrics (<run-dir>/metrics/worker-<id>.jsonl): "mm_start" (K, W, scheme, stages), one "stage"
// record per stage (stage, model, name, partition, own, group, steps, images, loss = the stage's
// mean training loss, seconds, wait_s = waiting for the model's earlier stages, model_bytes =
// model payload pulled and pushed (f32; a data-parallel stage: a whole model per pull and per
// push, shared memory or not), data_bytes_moved = pixel bytes read from a partition not
// this worker's own, tx_bytes / rx_bytes on the wire during the stage), and "done" (totals).
// With eval.every_steps > 0, a model is also evaluated on eval.test_batches test batches as it
// moves on ("model_curve": model, name, stage, train_images = the model's schedule iteration ×
// batch, epoch, top1, top5, loss, run_s): by its holder after a local stage (not when a group
// averages copies: no one holds the average), by the first holder (worker 0 in sequential,
// worker i < K in a pipeline group) after a data-parallel stage, once every holder's updates
// of the stage are in.
// Worker 0 then waits for every worker to finish, evaluates every model's final weights on
// data.test ("model_eval" records), saves them as <run-dir>/models/<name>.dpt and writes the
// leaderboard, best top-1 first, to <run-dir>/leaderboard.json and stdout.
//
// Not handled (said in docs/multi_model.md): workers joining (the rotation is planned for
// cluster.workers); a dead holder that is not restarted stops its models' later stages.
//
// Thread-safety: RunMultiModelWorker is reentrant; it owns everything it builds.
#pragma once

#include "client/worker/worker_app.h"
#include "common/run_config.h"
#include "common/status.h"

namespace downpour::worker {

// Runs worker `args.id` of the multi-model run `config` (config.models non-empty) to its end.
// `*result` gets the worker's steps, images and images/s over all its stages; `*started` as for
// RunWorker.
Status RunMultiModelWorker(const RunConfig& config, const WorkerArgs& args, TrainResult* result, bool* started);

// One leaderboard row (worker 0's final evaluation of a model).
struct LeaderboardRow {
  int model = 0;
  std::string name;
  double top1 = 0, top5 = 0, loss = 0;
  int64_t images = 0;  // training images the model saw (its lr-schedule iteration × batch)
};
// Rows sorted best first (top-1 descending, then loss ascending, then model id), as JSON text:
// {"models": [{"rank": 1, "model": 2, "name": "...", "top1": ..., ...}, ...]}.
std::string LeaderboardJson(std::vector<LeaderboardRow> rows);

}  // namespace downpour::worker
