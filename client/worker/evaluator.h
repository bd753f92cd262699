// evaluator.h — the run's evaluator process (downpour-evaluator; docs/operations.md "The
// evaluator"): one per distributed run (eval.evaluator, common/run_config.h RunHasEvaluator),
// started by the launcher. It trains nothing, so every worker trains at the same pace.
//
//   register with the coordinator as the evaluator (Role::kEvaluator: the worker key, or the
//   run's secret) and with every server as a reader (server/shard.h): its pulls are served at
//   once, whatever the consistency mode, and change nothing.
//   every eval.every_updates worker batches the servers applied (0: every_steps × workers) and/or
//   every eval.every_seconds: pull a snapshot of every chunk and evaluate it on the test set.
//     Progress is probed every `probe_ms` with a pull of the smallest chunk, whose reply carries
//     the lr-schedule iteration (scheduleIters). The evaluation due is always the newest point
//     passed: one that outlasts its interval does not queue the points it missed (the record
//     counts them as skipped), so an evaluated snapshot is never more than one interval past
//     its point (lag_updates < every_updates, lag_s < every_seconds, up to the pushes applied
//     between the probe and the pull).
//   Update points at or past the run's planned batches (worker.steps × workers, or the epochs'
//   worth) are left to the final evaluation, which comes right after.
//   once every worker 0..W-1 (and every joiner) has finished or died: pull the final weights,
//   evaluate them, save <run_dir>/model_final.dpt, say done to the coordinator (which ends the
//   run only then) and exit.
//
// Records, <run_dir>/metrics/evaluator.jsonl (role "evaluator"): start; eval {final, due
// ("start" | "updates" | "seconds" | "final"), iter / iter_min (the snapshot's lr-schedule
// iteration, worker batches applied: its newest chunk's and its oldest's — they differ by the
// pushes applied while it was read), train_images (iter × batch_size: images all workers had
// processed), epoch (train_images / training-set size, null when unknown),
// due_iter / lag_updates or due_s / lag_s (where the evaluation was due and how far past it the
// snapshot is), skipped, eval_s, test_loss, top1, top5, test_images, server_versions}; done.
// Every record carries "t" (wall clock), the time axis tools put it on.
//
// Thread-safety: RunEvaluator is reentrant (no globals); it owns everything it builds.
#pragma once

#include <string>
#include <vector>

#include "client/worker/trainer.h"
#include "common/process_net.h"
#include "common/status.h"

namespace downpour::worker {

struct EvaluatorArgs {
  std::string config_path;        // run config; default <run_dir>/config.toml
  std::vector<std::string> sets;  // --set section.key=value overrides of it
  std::string run_dir = ".";      // metrics, model_final.dpt; the run's secret and keys
  bool quiet = false;             // no progress notes on stderr
  NetFlags net;                   // --bind, --coordinator; "" = from the run config
  int probe_ms = 50;              // how often the servers' progress is probed (> 0)
};

struct EvaluatorResult {
  int evaluations = 0;   // records written, the final one included
  int skipped = 0;       // update / time points passed over while evaluating
  bool has_final = false;
  EvalRecord final_eval;
};

// `started` (may be null) is set once the config, model, data and network setup were accepted:
// an error before that is bad input (exit 2), after it a failure of the run (exit 1).
Status RunEvaluator(const EvaluatorArgs& args, EvaluatorResult* result, bool* started = nullptr);

}  // namespace downpour::worker
