// trainer.h — the worker's training loop (docs/architecture.md "One training step in a worker"):
//
//   the step's pulls, if any                                        (WorkerAlgorithm::BeforeStep)
//   next prefetched batch                                           (TrainSource; as bytes on a
//                                                                    GPU, the next one staged too)
//   forward + backward, the algorithm's callbacks inside it
//   the step's update or accumulation                               (WorkerAlgorithm::Finish)
//   metrics → JSONL, progress line; evaluation on a schedule (the evaluating worker).
//
// What a step does with its gradient is the worker's algorithm (worker_algorithm.h: Downpour's
// pushes and pulls; EASGD's and local SGD's local steps and exchanges; the local reference run),
// chosen once.
// Every algorithm averages the gradients of worker.push_every steps into one update.
//
// A step's progress is saved once its pushes are acknowledged, so a resume never skips an
// unacknowledged step.
//
// Step-time breakdown (metrics "step" record, docs/operations.md): compute_ms (forward +
// backward without the waits inside them), pull_wait_ms (blocked on pulls: the whole pull, or
// the per-layer waits), push_wait_ms (acknowledgements waited before a layer's backward, the
// last pushes' start and the clock report, an EASGD exchange), loader_wait_ms (blocked on the
// prefetch queue), step_ms, comm_ms (wire time of the requests this step waited for: the union
// of their [issued, completed] spans).
//
// Clocks: clock = number of updates this worker has sent the servers (in a saved progress:
// acknowledged); pulls and pushes carry it.
//
// Ownership: the Trainer borrows everything it is given; all must outlive Run().
// Thread-safety: one thread; the net's callbacks run on it inside ForwardBackward.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "client/engine/net.h"
#include "client/worker/param_channel.h"
#include "client/worker/progress.h"
#include "client/worker/sources.h"
#include "client/worker/worker_algorithm.h"
#include "client/worker/worker_state.h"
#include "common/layout.h"
#include "common/metrics.h"
#include "common/run_config.h"
#include "common/trace.h"
#include "common/transport.h"

namespace downpour::worker {

struct TrainerOptions {
  int worker_id = 0;            // this worker's id (0-based)
  WorkerConfig worker;          // batch_size, steps/epochs, pull_every, push_every
  EvalConfig eval;              // schedule of evaluations (used when `evaluate`)
  SolverConfig solver;          // the update rule of the reference run (no channel); its
                                // clip_gradients applies to pushed gradients too (Caffe's
                                // global-norm clipping, per worker, before the push — so with
                                // clipping on, pushes wait for the end of backward)
  bool evaluate = false;        // this worker runs the test-set evaluations (worker 0)
  std::string model_out;        // final weights file (evaluating worker); "" = not saved
  int64_t min_push_elems = int64_t{1} << 18;  // PushPlanner release threshold (floats)
  // Overlap the next step's pull with this step's backward and the next forward, layer by
  // layer (see above). Used only with a channel and pull_every = push_every = 1; the worker
  // sets it for async and ssp runs (off: downpour-worker --no-overlap). Default off.
  bool overlap_pull = false;
  // With overlap_pull: how many of this worker's latest steps' pushes a step's weights may lack
  // (pull_ahead.h). 0 = none (sync, ssp, multi-model stages); worker.outstanding_steps − 1 in async.
  int weights_lag = 0;
  // The run's [compression]: its factors (push inner-product weights as sufficient factors where
  // that is fewer floats; client/worker/factor_choice.h says when; docs/factors.md) and its push
  // codec (fp16 / bf16 pushes are cast on a device backend). The PS client encodes the rest.
  CompressionConfig compression;
  // Sleep after every step (straggler emulation for consistency experiments and tests); the
  // sleep counts as step time, as a slow machine's would.
  std::chrono::milliseconds step_delay{0};
  // The servers' algorithm and its settings: consistency.algorithm chooses the worker's
  // (worker_algorithm.h; EASGD reads easgd_tau and easgd_alpha, local SGD local_steps).
  ConsistencyConfig consistency;
  // Workers training at once (cluster.workers): EASGD's default α, local SGD's share 1/W, and
  // the schedule's count of both.
  int workers = 1;
  // Runs once after the last step (its pushes acknowledged), before the final evaluation. A
  // distributed worker announces it has finished there, and the evaluating worker waits for
  // every other worker to finish, so the final evaluation and the saved model see every update.
  std::function<Status()> on_training_done;
  // A resumed worker continues from here (its saved progress; in sync mode with step and clock
  // set to the servers' clock): the loop starts at resume.step, the data stream and dropout
  // masks are positioned for that step, clock / images / wall time continue, and the metrics'
  // "start" record says so (resumed, resume_step, wall_offset_s). Unset = a fresh start.
  std::optional<WorkerProgress> resume;
  // A fresh start's first clock (pushes and pulls carry it): a multi-model pipeline stage starts
  // at the model's version, so a sync group's rounds line up with the servers' (the servers'
  // sync rounds are chunk versions). Ignored when resuming.
  int64_t clock_base = 0;
  // Called after every step and once more when training is done (finished = true): the worker
  // saves it, which is what a later resume reads. May be empty.
  std::function<void(const WorkerProgress&)> on_progress;
  // The process's wire traffic so far (its transport's counters, common/transport.h): step
  // records carry the bytes sent / received during the step (tx_bytes ~ pushes, rx_bytes ~
  // pulled weights, both with their headers, requests, acks and heartbeats; not evaluation
  // pulls), the done record the process's totals. Empty = not measured (reference run: nulls).
  std::function<TrafficCounts()> traffic;
  // Payload bytes that went through same-host shared memory instead (PsClient::
  // shared_memory_traffic): step records carry them as shm_tx_bytes / shm_rx_bytes, the done
  // record the totals. Empty = none (null fields).
  std::function<TrafficCounts()> shm_traffic;
  // Timeline (cluster.trace_events; not owned; null = none): the training thread's steps, their
  // compute, pull waits and push waits, on a track "train" (docs/operations.md "Timelines").
  TraceLog* trace = nullptr;
};

struct EvalRecord {
  double loss = 0;          // mean test loss
  double top1 = 0;          // fraction correct
  double top5 = 0;          // fraction with the label in the 5 best scores
  int64_t images = 0;       // test images evaluated
  int64_t versions = 0;     // sum of the pulled chunks' server versions
  int64_t step = 0;         // this worker's steps done
  double epoch = 0;         // this worker's passes over its shard
  double wall_s = 0;        // since training started
  bool byte_input = false;  // the test set went to the net as bytes (EvaluateNet)
};

struct TrainResult {
  int64_t steps = 0;
  int64_t images = 0;
  double wall_s = 0;         // whole loop, evaluations included
  double train_s = 0;        // wall_s minus evaluation time
  double images_per_s = 0;   // images / train_s
  bool has_eval = false;
  EvalRecord final_eval;
  int64_t staleness_chunks = 0;
  int64_t staleness_sum = 0;
  int64_t staleness_max = 0;
};

class Trainer {
 public:
  // `eval_net` (same spec as `net`; may be null when not evaluating) runs evaluations so
  // the training net keeps its batch shape. `layout` must be built from net->param_specs().
  // `metrics` and `progress` may be null.
  Trainer(TrainerOptions options, engine::Net* net, engine::Net* eval_net, const ParamLayout* layout,
          ParamChannel* channel, TrainSource* train, TestSource* test, MetricsWriter* metrics,
          ProgressReporter* progress);
  // Clears the callbacks it set on the net (the net may outlive it).
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  Status Run(TrainResult* result);
  // One evaluation on freshly pulled weights (or the net's own in the reference run);
  // `starting_weights`: on the weights the run starts from (eval.at_start), not pulled ones.
  Status Evaluate(bool final_eval, EvalRecord* out, bool starting_weights = false);

 private:
  // Byte input (sources.h TrainSource::UseBytes) when the net's backend normalises its input.
  Status UseByteInput();
  // This step's batch; with byte input also the next step's (next_batch_), staged by this step.
  Status NextBatch(const StepPlan& plan, BatchView* batch);
  Status Step(const StepPlan& plan, const BatchView& batch);
  // Saves the progress of steps whose pushes are all acknowledged (a resume starts after them).
  Status SaveAckedProgress(bool finished);
  bool EvalDue(int64_t steps_done) const;
  void LogStep(int64_t steps_done, const BatchView& batch, double step_s);
  void LogEval(const EvalRecord& r, bool final_eval);
  double Elapsed() const;
  WorkerProgress Progress(bool finished) const;
  // The process's total of `field` so far from `counts` (o_.traffic, o_.shm_traffic); null without one.
  static MetricValue TotalBytes(const std::function<TrafficCounts()>& counts, uint64_t TrafficCounts::*field) {
    return counts ? MetricValue(static_cast<int64_t>(counts().*field)) : MetricValue();
  }
  // Bytes sent / received since the last call (or MarkTraffic) per `counts`; nulls without one.
  static void TrafficSince(const std::function<TrafficCounts()>& counts, TrafficCounts* last, MetricValue* tx,
                           MetricValue* rx);
  void MarkTraffic();  // what the next step record counts starts now

  TrainerOptions o_;
  engine::Net* net_;
  engine::Net* eval_net_;
  ParamChannel* channel_;
  TrainSource* train_;
  TestSource* test_;
  MetricsWriter* metrics_;
  ProgressReporter* progress_;
  int trace_track_ = -1;                        // the timeline's "train" track (o_.trace on)
  std::unique_ptr<WorkerAlgorithm> algorithm_;  // chosen once (MakeWorkerAlgorithm)
  bool byte_input_ = false;                     // the batches are bytes, normalised by the net's backend
  std::optional<BatchView> next_batch_;         // byte input: the next step's batch, fetched by this one

  int64_t images_ = 0;
  int64_t steps_done_ = 0;
  int epoch_ = 0;
  double start_ = 0;
  double eval_s_ = 0;            // time spent evaluating
  double last_eval_time_ = 0;
  int64_t last_push_chunks_ = 0, last_push_sum_ = 0;
  TrafficCounts traffic_last_;   // o_.traffic() when the last step (or evaluation) ended
  TrafficCounts shm_last_;       // o_.shm_traffic() likewise
  // The progress of the last step while its pushes are not acknowledged.
  std::optional<WorkerProgress> unacked_progress_;
  // Step-time breakdown of the last step (milliseconds).
  StepWaits waits_;
  double compute_ms_ = 0, loader_ms_ = 0, comm_ms_ = 0;
  double loss_last_ = 0;
  double loss_ema_ = -1;
  double rate_ema_ = 0;
};

// One evaluation pass: `test` from the start, at most `max_batches` batches (0 = all), the
// mean loss, top-1 and top-5 of `net` into `out` (images, loss, top1, top5; the other fields
// are the caller's). Used by the trainer, the evaluator and downpour-test. A net whose backend
// normalises its input (a GPU) takes the test set as bytes where the source has them
// (TestSource::UseBytes), each next batch staged while the one before runs.
Status EvaluateNet(engine::Net* net, TestSource* test, int max_batches, EvalRecord* out);

// `net`'s weights as a tensor file (common/tensor_file.h), one tensor per parameter, named as
// param_specs() names them (what Net::LoadWeights reads); written atomically. The run's
// model_final.dpt (the evaluator, or the evaluating worker).
Status SaveModel(engine::Net& net, const std::string& path);

}  // namespace downpour::worker
