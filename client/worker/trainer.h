// trainer.h — the worker's training loop (docs/architecture.md "One training step in a worker"):
//
//   every pull_every steps: pull all weights into the net          (ParamChannel::Pull)
//   next prefetched batch                                           (TrainSource)
//   forward + backward; during backward, as each tensor's gradient is final, its chunks
//   are handed to the PushPlanner, and released groups are pushed at once, so the wire
//   overlaps the rest of backward (later layers first)
//   every push_every steps: the pushed gradient is the MEAN of the last push_every steps'
//   gradients (local accumulation — a push then stands for a batch of push_every × B); the
//   worker reports its clock and goes on without waiting for the acknowledgements
//   metrics → JSONL, progress line; evaluation on a schedule (the evaluating worker).
//
// No acknowledgement barrier: a push reads the gradient buffer until acknowledged, so the next
// step waits for the previous step's pushes of a layer only right before that layer's backward
// overwrites them (PushWindow; usually long acknowledged by then). A step's progress is saved
// once its pushes are acknowledged, so a resume never skips an unacknowledged step.
//
// Overlapped pulls (TrainerOptions::overlap_pull; async/ssp with pull_every = push_every = 1):
// the next step's weights are not one blocking pull at its start. Each pushed chunk's pull is
// started right after its push on the same link, so its server serves it after applying that
// push, and forward takes each chunk in before the first layer that reads it (PullAhead, which
// says how). With weights_lag = 0 forward waits for those pulls (conv1 first); with L >= 1
// (async: worker.outstanding_steps − 1) a step computes on the newest weights that have arrived,
// lacking at most its own pushes of its last L steps, so compute and the wire overlap whole. The
// last step pulls nothing ahead; sync mode keeps the blocking pull (its servers hold it until
// the clock is complete).
//
// Step-time breakdown (metrics "step" record, docs/operations.md): compute_ms (forward +
// backward without the waits inside them), pull_wait_ms (blocked on pulls: the whole pull, or
// the per-layer waits), push_wait_ms (acknowledgements waited before a layer's backward, the
// last pushes' start and the clock report), loader_wait_ms (blocked on the prefetch queue),
// step_ms, comm_ms (wire time of the requests this step waited for: the union of their
// [issued, completed] spans).
//
// What a step does with its gradient is the worker's algorithm, chosen once (StepKind):
//   downpour  push it (above);
//   easgd     apply it locally (LocalSolver), and every easgd_tau steps exchange the elastic
//             difference with the servers' center (ElasticExchange);
//   local     without a channel (nullptr), the single-process reference run: apply it locally,
//             which is what a distributed sync run must agree with.
// Every kind accumulates the gradients of the push_every - 1 steps before an update.
//
// Clocks: clock = number of push steps this worker has sent (in a saved progress: acknowledged);
// pulls and pushes carry it.
//
// Ownership: the Trainer borrows everything it is given; all must outlive Run().
// Thread-safety: one thread; the grad-ready callback runs on it inside ForwardBackward.
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
#include "client/worker/pull_ahead.h"
#include "client/worker/push_planner.h"
#include "client/worker/push_window.h"
#include "client/worker/sources.h"
#include "client/worker/worker_state.h"
#include "common/layout.h"
#include "common/metrics.h"
#include "common/run_config.h"
#include "client/worker/local_solver.h"
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
  // compression.factors: push inner-product weights as sufficient factors where that is fewer
  // floats (client/worker/factor_choice.h says when; docs/factors.md). Default off.
  bool factors = false;
  // Sleep after every step (straggler emulation for consistency experiments and tests); the
  // sleep counts as step time, as a slow machine's would.
  std::chrono::milliseconds step_delay{0};
  // EASGD (consistency.algorithm = "easgd"; docs/algorithms.md): the worker trains its own copy
  // with the solver (the servers' rule, its own momentum) and every easgd_tau steps pulls the
  // center x~, sends e = easgd_alpha × (x − x~) (the servers add it to x~) and sets x -= e. Its
  // lr schedule counts its batches × easgd_workers (the run's images / batch, as in other modes).
  bool easgd = false;
  int easgd_tau = 1;
  float easgd_alpha = 0.0f;
  int easgd_workers = 1;
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
  Status Step(int64_t step, const BatchView& batch, bool push_step, bool last_step);
  void OnGradReady(int tensor);
  Status PushGroupAndPull(const PushGroup& group, std::span<const float> source);
  void OnLayerForward(int layer);
  void OnLayerBackward(int layer);
  Status ReadyAccumulator();
  // Saves the progress of steps whose pushes are all acknowledged (a resume starts after them).
  Status SaveAckedProgress(bool finished);
  void ApplyLocalUpdate();
  bool EvalDue(int64_t steps_done) const;
  void LogStep(int64_t steps_done, const BatchView& batch, double step_s);
  void LogEval(const EvalRecord& r, bool final_eval);
  double Elapsed() const;

  TrainerOptions o_;
  engine::Net* net_;
  engine::Net* eval_net_;
  const ParamLayout* layout_;
  ParamChannel* channel_;
  TrainSource* train_;
  TestSource* test_;
  MetricsWriter* metrics_;
  ProgressReporter* progress_;
  PushPlanner planner_;

  std::vector<float> accum_;     // sum of gradients since the last push (push_every > 1)
  bool accum_pushed_ = false;    // accum_ holds the last push's mean, which its pushes may still read
  bool factors_on_ = false;                 // some tensor is factored (Net::SetFactoredParams)
  std::vector<PushFactor> step_factors_;    // this step's tensors whose grad span holds factors
  LocalSolver local_;            // clipping, and the local steps of a reference run and EASGD workers
  enum class StepKind { kDownpour, kEasgd, kLocal };
  StepKind kind_ = StepKind::kDownpour;  // chosen once, from the channel and TrainerOptions::easgd
  // The step's end by kind, with its gradient final in the net: push it (downpour), or update
  // locally and exchange when due (easgd, local). `t1` is when backward ended.
  Status FinishPush(double t1);
  Status FinishLocal(int64_t step, bool last_step);
  Status Accumulate();  // a step that does not update: its gradient into accum_
  std::vector<float> center_;    // EASGD: the center as last pulled; then the elastic difference
  Status ElasticExchange();
  bool clipping() const { return local_.clipping(); }
  // The process's total of `field` so far from `counts` (o_.traffic, o_.shm_traffic); null without one.
  static MetricValue TotalBytes(const std::function<TrafficCounts()>& counts, uint64_t TrafficCounts::*field) {
    return counts ? MetricValue(static_cast<int64_t>(counts().*field)) : MetricValue();
  }
  // Bytes sent / received since the last call (or MarkTraffic) per `counts`; nulls without one.
  static void TrafficSince(const std::function<TrafficCounts()>& counts, TrafficCounts* last, MetricValue* tx,
                           MetricValue* rx);
  void MarkTraffic();  // what the next step record counts starts now
  bool pushing_ = false;         // the current backward pushes
  Status callback_status_;       // first error raised inside the grad-ready callback
  int64_t clock_ = 0;
  int64_t local_updates_ = 0;    // reference run and EASGD: local updates applied
  int64_t images_ = 0;
  int64_t steps_done_ = 0;
  int epoch_ = 0;
  double start_ = 0;
  double eval_s_ = 0;            // time spent evaluating
  double last_eval_time_ = 0;
  WorkerProgress Progress(bool finished) const;
  PullInfo pull_info_;
  PushInfo push_info_;           // cumulative
  int64_t last_push_chunks_ = 0, last_push_sum_ = 0;
  TrafficCounts traffic_last_;   // o_.traffic() when the last step (or evaluation) ended
  TrafficCounts shm_last_;       // o_.shm_traffic() likewise
  std::vector<std::vector<int32_t>> layer_chunks_; // per layer: chunks of its tensors (with a channel)
  // Overlapped pulls (null without): the next step's weights pulled during backward.
  bool overlap_ = false;                           // options asked for it and the run allows it
  std::unique_ptr<PullAhead> pull_ahead_;          // borrows layer_chunks_
  bool pull_next_ = false;                         // this step starts the next step's pulls
  // Pushes not yet acknowledged (null without a channel), and the progress of the last step
  // while its pushes are.
  std::unique_ptr<PushWindow> pushes_;
  std::optional<WorkerProgress> unacked_progress_;
  // Step-time breakdown of the last step (milliseconds).
  double pull_ms_ = 0, push_wait_ms_ = 0, compute_ms_ = 0, loader_ms_ = 0, comm_ms_ = 0;
  double forward_pull_wait_ms_ = 0;                // pull waits inside ForwardBackward
  double backward_push_wait_ms_ = 0;               // acknowledgement waits inside it
  int64_t current_step_ = 0;
  int trace_track_ = -1;                           // the timeline's "train" track (o_.trace on)
  double loss_last_ = 0;
  double loss_ema_ = -1;
  double rate_ema_ = 0;
};

// One evaluation pass: `test` from the start, at most `max_batches` batches (0 = all), the
// mean loss, top-1 and top-5 of `net` into `out` (images, loss, top1, top5; the other fields
// are the caller's). Used by the trainer and by downpour-test.
Status EvaluateNet(engine::Net* net, TestSource* test, int max_batches, EvalRecord* out);

// `net`'s weights as a tensor file (common/tensor_file.h), one tensor per parameter, named as
// param_specs() names them (what Net::LoadWeights reads); written atomically. The run's
// model_final.dpt (the evaluator, or the evaluating worker).
Status SaveModel(engine::Net& net, const std::string& path);

}  // namespace downpour::worker
