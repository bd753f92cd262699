// worker_algorithm.h — what a worker does with each step's gradient: its algorithm, chosen once
// per run by MakeWorkerAlgorithm (docs/algorithms.md "Worker algorithms").
//
//   downpour  push it to the servers during backward, pull the weights back (Dean et al. 2012;
//             also BSP and SSP, whose rules are the servers'): downpour_algorithm.cc
//   easgd     apply it locally, and every easgd_tau steps exchange the elastic difference with
//             the servers' center (Zhang, Choromanska, LeCun 2015): easgd_algorithm.cc
//   local-sgd apply it locally, and every local_steps steps add the progress / W to the servers'
//             model and pull it back (Zhou & Cong 2018; Stich 2019): local_sgd_algorithm.cc
//   local     without servers, the single-process reference run: apply it locally, which is
//             what a distributed sync run must agree with: local_algorithm.cc
//
// The Trainer (trainer.h) owns the loop, the data, evaluations, metrics and progress; each step
// it calls, in order:
//   BeforeStep  the pulls the step starts with (into the net's weights)
//   BeginPass   arm the net's callbacks for this step's forward + backward
//   (the net's forward + backward)
//   AfterPass   errors raised inside the pass, the waits inside it
//   Finish      the step's end: update (push, local step, exchange) or accumulate
// Every algorithm averages the gradients of worker.push_every steps into one update.
//
// Adding an algorithm: its own file with a class derived from WorkerAlgorithm and a Make
// function, one line in MakeWorkerAlgorithm, and its config key (consistency.algorithm).
//
// Clocks: clock() = the number of updates this worker has sent the servers (pushes, exchanges);
// pulls and pushes carry it. A saved progress holds it.
//
// Ownership: an algorithm borrows what AlgorithmEnv names; all must outlive it. It sets the net's
// callbacks it needs and clears them when destroyed. Thread-safety: one thread (the training
// thread; the net's callbacks run on it inside ForwardBackward).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "client/engine/net.h"
#include "client/worker/local_solver.h"
#include "client/worker/param_channel.h"
#include "common/layout.h"
#include "common/status.h"
#include "common/trace.h"

namespace downpour::worker {

struct TrainerOptions;

// What the trainer lends its algorithm (borrowed; all outlive the algorithm).
struct AlgorithmEnv {
  const TrainerOptions* options = nullptr;
  engine::Net* net = nullptr;
  const ParamLayout* layout = nullptr;  // built from net->param_specs()
  ParamChannel* channel = nullptr;      // null: no servers (the local reference run)
  TraceLog* trace = nullptr;            // null or off: no timeline
  int trace_track = -1;                 // the trainer's "train" track
};

// One step as the trainer runs it.
struct StepPlan {
  int64_t step = 0;    // 0-based, counted over the whole run (a resumed one too)
  bool update = true;  // ends in an update; otherwise its gradient only accumulates (push_every)
  bool last = false;   // the run's last step
};

// Where a step's time went besides compute, in milliseconds (the step record, trainer.h).
struct StepWaits {
  double pull_ms = 0;       // blocked on pulls: the step's first pull, waits inside forward
  double push_wait_ms = 0;  // blocked on pushes: acknowledgement waits, the push's end, an exchange
  double in_pass_ms = 0;    // the part of both spent inside forward + backward
};

class WorkerAlgorithm {
 public:
  virtual ~WorkerAlgorithm() = default;
  WorkerAlgorithm(const WorkerAlgorithm&) = delete;
  WorkerAlgorithm& operator=(const WorkerAlgorithm&) = delete;

  // The run starts (or resumes) at `clock` with step `first_step`.
  void Start(int64_t clock, int64_t first_step);

  virtual Status BeforeStep(const StepPlan& plan, StepWaits* waits) = 0;
  virtual void BeginPass(const StepPlan& plan) { (void)plan; }
  virtual Status AfterPass(StepWaits* waits) {
    (void)waits;
    return Status::Ok();
  }
  virtual Status Finish(const StepPlan& plan, StepWaits* waits) = 0;

  // Nothing of its own is pulling: before an evaluation pulls through the same channel (the
  // client's versions are per chunk, so no two pulls of a chunk may be in flight).
  virtual Status Quiesce() { return Status::Ok(); }
  // Whether some update it sent is not yet acknowledged; waits for those of steps <= `step`.
  virtual bool Unacked() const { return false; }
  virtual Status WaitAcked(int64_t step) {
    (void)step;
    return Status::Ok();
  }
  // Everything it started has completed: before the run's end.
  virtual Status Drain() { return Status::Ok(); }
  // Whether the next step's weights are pulled during this step (the "start" record says so).
  virtual bool overlaps_pulls() const { return false; }

  int64_t clock() const { return clock_; }
  // Local updates applied to the net's own weights (their version when no server holds them).
  int64_t local_updates() const { return local_updates_; }
  const PushInfo& push_info() const { return push_info_; }  // cumulative, over acknowledged pushes
  const PullInfo& pull_info() const { return pull_info_; }  // the newest pull's versions
  const LocalSolver& solver() const { return local_; }      // clipping's norm and count

 protected:
  explicit WorkerAlgorithm(const AlgorithmEnv& env);
  const TrainerOptions& options() const { return *env_.options; }

  // A step that does not update: its gradient into the accumulator.
  void AddToAccumulator();
  // One local update of the net's weights from its gradient, averaged with the accumulator's
  // steps; `concurrent` workers train at once (LocalIteration).
  void LocalUpdate(int concurrent);

  AlgorithmEnv env_;
  LocalSolver local_;
  std::vector<float> accum_;  // sum of the gradients since the last update (push_every > 1; else empty)
  int64_t clock_ = 0;
  int64_t first_step_ = 0;
  int64_t local_updates_ = 0;
  PushInfo push_info_;
  PullInfo pull_info_;
};

// The algorithms whose workers train their own copy and exchange with the servers' model
// (ExchangesModels: EASGD, local SGD): the model is pulled into the net at the first step, every
// update is applied locally (the schedule counting cluster.workers' batches, the run's), and
// Exchange runs after every `every`-th step's update and after the last step's.
class ModelExchangeAlgorithm : public WorkerAlgorithm {
 public:
  Status BeforeStep(const StepPlan& plan, StepWaits* waits) override;
  Status Finish(const StepPlan& plan, StepWaits* waits) override;

 protected:
  ModelExchangeAlgorithm(const AlgorithmEnv& env, int every);
  // The servers' model into the net (the first step's pull); an algorithm that measures from it
  // notes it here too.
  virtual Status PullModel();
  // One exchange with the servers; it advances the clock and reports it.
  virtual Status Exchange() = 0;

 private:
  const int every_;
};

// Seconds on the system clock: the trainer's step and wait times, and its wall times, which a
// resumed run continues (so not the steady clock).
double NowS();

// The run's algorithm: local without a channel, else by consistency.algorithm (TrainerOptions).
std::unique_ptr<WorkerAlgorithm> MakeWorkerAlgorithm(const AlgorithmEnv& env);

}  // namespace downpour::worker
