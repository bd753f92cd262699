// downpour_algorithm.cc — Downpour SGD on the worker (Dean et al. 2012; worker_algorithm.h): the
// gradient is pushed to the servers and the weights pulled back; the servers' rule (sgd, dc-asgd)
// and consistency mode (async, sync, ssp) decide what they apply.
//
// As each tensor's gradient is final in backward, its chunks go to the PushPlanner, and released
// groups are pushed at once, so the wire overlaps the rest of backward (later layers first). With
// push_every > 1 the pushed gradient is the mean of the last push_every steps' gradients.
//
// No acknowledgement barrier: a push reads the gradient buffer until acknowledged, so the next
// step waits for the previous step's pushes of a layer only right before that layer's backward
// overwrites them (PushWindow). With clipping on, pushes wait for the end of backward (the global
// norm needs every tensor).
//
// Overlapped pulls (TrainerOptions::overlap_pull, pull_every = push_every = 1): each pushed chunk's
// pull is started right after its push on the same link, so its server serves it after applying
// that push, and forward takes each chunk in before the first layer that reads it (PullAhead).
#include <algorithm>

#include "client/worker/factor_choice.h"
#include "client/worker/pull_ahead.h"
#include "client/worker/push_planner.h"
#include "client/worker/push_window.h"
#include "client/worker/trainer.h"
#include "client/worker/worker_algorithm.h"
#include "common/grad_codec.h"
#include "common/layout.h"

namespace downpour::worker {
namespace {

class DownpourAlgorithm final : public WorkerAlgorithm {
 public:
  explicit DownpourAlgorithm(const AlgorithmEnv& env);
  ~DownpourAlgorithm() override;

  Status BeforeStep(const StepPlan& plan, StepWaits* waits) override;
  void BeginPass(const StepPlan& plan) override;
  Status AfterPass(StepWaits* waits) override;
  Status Finish(const StepPlan& plan, StepWaits* waits) override;

  Status Quiesce() override { return pull_ahead_ != nullptr ? pull_ahead_->WaitInFlight() : Status::Ok(); }
  bool Unacked() const override { return !pushes_.empty(); }
  Status WaitAcked(int64_t step) override { return pushes_.WaitThrough(step, &push_info_); }
  Status Drain() override {
    DP_RETURN_IF_ERROR(Quiesce());
    return pushes_.WaitAll(&push_info_);
  }
  bool overlaps_pulls() const override { return overlap_; }

 private:
  void OnGradReady(int tensor);
  void OnLayerForward(int layer);
  void OnLayerBackward(int layer);
  Status PushGroupAndPull(const PushGroup& group, std::span<const float> source);
  Status ReadyAccumulator();
  bool clipping() const { return local_.clipping(); }

  PushPlanner planner_;
  PushWindow pushes_;                               // pushes not yet acknowledged
  std::vector<std::vector<int32_t>> layer_chunks_;  // per layer: chunks of its tensors
  bool factors_on_ = false;                         // some tensor is factored (Net::SetFactoredParams)
  std::vector<PushFactor> step_factors_;            // this step's tensors whose grad span holds factors
  bool accum_pushed_ = false;              // accum_ holds the last push's mean, which its pushes may still read
  bool overlap_ = false;                   // options asked for it and the run allows it
  bool cast_on_device_ = false;            // pushes send the net's grads16(), cast by its device
  bool widen_on_device_ = false;           // pulls fill the net's params16(), widened by its device
  std::unique_ptr<PullAhead> pull_ahead_;  // null without overlap; borrows layer_chunks_
  bool pull_next_ = false;                 // this step starts the next step's pulls
  bool pushing_ = false;                   // the current backward pushes
  int64_t current_step_ = 0;
  Status callback_status_;            // first error raised inside the net's callbacks
  Status init_status_;                // the device's 16-bit buffers could not be had: the first step says so
  double forward_pull_wait_ms_ = 0;   // pull waits inside ForwardBackward
  double backward_push_wait_ms_ = 0;  // acknowledgement waits inside it
};

DownpourAlgorithm::DownpourAlgorithm(const AlgorithmEnv& env)
    : WorkerAlgorithm(env),
      planner_(*env.layout, env.options->min_push_elems),
      pushes_(env.channel, env.layout->num_chunks()),
      layer_chunks_(ChunksByLayer(*env.net, *env.layout)) {
  const TrainerOptions& o = options();
  engine::Net* net = env_.net;
  const std::vector<int> factored =
      ChooseFactoredTensors(*net, *env_.layout,
                            FactorChoiceInput{o.compression.factors, o.worker.push_every, o.solver.clip_gradients,
                                              /*has_servers=*/true, o.worker_id});
  // δ packed by the wire's per-chunk blocks on the device: the client sends them as they land.
  std::vector<std::vector<RowSpan>> blocks;
  for (int t : factored) blocks.push_back(FactorRowBlocks(*env_.layout, t));
  DP_CHECK(net->SetFactoredParams(factored, blocks).ok());  // inner-product weights, the layout's chunks
  factors_on_ = !factored.empty();
  // fp16 / bf16 pushes cast by the device (docs/compression.md): the bus carries the wire's bytes
  // and nobody converts on the host. Only where the host never reads the gradient: no
  // accumulation over steps, no clipping. A channel that cannot send them keeps the host's cast.
  const DType dtype = CodecDType(o.compression.push);
  if (net->backend().casts_on_device() && dtype != DType::kF32 &&
      CodecEncoding(o.compression.push) == Encoding::kDense && o.worker.push_every == 1 && !clipping()) {
    init_status_ = net->SetGradDType(dtype);  // a device backend: fails only out of memory
    cast_on_device_ = init_status_.ok() && env_.channel->SetPushCast(net->grads16()).ok();
    if (!cast_on_device_) DP_CHECK(net->SetGradDType(DType::kF32).ok());
  }
  // fp16 / bf16 pulls widened by the device likewise: the pulls keep the wire's 16 bits in the
  // net's params16(). Not with a lag (its staging copy is f32).
  const DType pull_dtype = CodecDType(o.compression.pull);
  widen_on_device_ =
      net->backend().casts_on_device() && pull_dtype != DType::kF32 && env_.channel->pulls16() && o.weights_lag == 0;
  if (widen_on_device_ && init_status_.ok()) {
    init_status_ = net->SetWeightDType(pull_dtype);  // a device backend: fails only out of memory
    widen_on_device_ = init_status_.ok();
  }
  net->SetGradReadyCallback([this](int tensor) { OnGradReady(tensor); });
  net->SetBeforeBackwardCallback([this](int layer) { OnLayerBackward(layer); });
  overlap_ = o.overlap_pull && o.worker.pull_every == 1 && o.worker.push_every == 1;
  if (overlap_) {
    pull_ahead_ = std::make_unique<PullAhead>(env_.channel, *env_.layout, layer_chunks_, net->params(), o.weights_lag,
                                              widen_on_device_ ? net->params16() : std::span<uint16_t>{});
    // Pushes carry the versions of the weights the net computed on: with a lag (or after an
    // evaluation's pull) the last pulled are newer.
    env_.channel->SetPushVersions(pull_ahead_->held_versions());
    net->SetBeforeLayerCallback([this](int layer) { OnLayerForward(layer); });
  }
}

DownpourAlgorithm::~DownpourAlgorithm() {
  env_.net->SetGradReadyCallback({});
  env_.net->SetBeforeBackwardCallback({});
  if (factors_on_) (void)env_.net->SetFactoredParams({});
  if (cast_on_device_) {
    (void)env_.channel->SetPushCast({});
    (void)env_.net->SetGradDType(DType::kF32);
  }
  if (widen_on_device_) (void)env_.net->SetWeightDType(DType::kF32);
  if (overlap_) {
    env_.net->SetBeforeLayerCallback({});
    env_.channel->SetPushVersions({});
  }
}

// The first step of a run (a resumed one too) always pulls: the net holds no server weights yet.
// A step whose pulls the previous step started waits for them layer by layer instead.
Status DownpourAlgorithm::BeforeStep(const StepPlan& plan, StepWaits* waits) {
  DP_RETURN_IF_ERROR(init_status_);
  const bool pulled_ahead = pull_ahead_ != nullptr && pull_ahead_->active();
  const bool due = plan.step % options().worker.pull_every == 0 || plan.step == first_step_;
  if (pulled_ahead || !due) return Status::Ok();
  const double t0 = NowS();
  TraceSpan span(env_.trace, env_.trace_track, "worker", "pull");
  if (widen_on_device_) {
    DP_RETURN_IF_ERROR(env_.channel->Pull16(clock_, env_.net->params16(), &pull_info_));
  } else {
    DP_RETURN_IF_ERROR(env_.channel->Pull(clock_, env_.net->params(), &pull_info_));
  }
  if (pull_ahead_ != nullptr) pull_ahead_->Reset(plan.step);
  waits->pull_ms = 1e3 * (NowS() - t0);
  return Status::Ok();
}

void DownpourAlgorithm::BeginPass(const StepPlan& plan) {
  current_step_ = plan.step;
  pushing_ = plan.update;
  planner_.Reset();
  step_factors_.clear();
  callback_status_ = Status::Ok();
  pull_next_ = overlap_ && pushing_ && !plan.last;
  if (pull_ahead_ != nullptr) pull_ahead_->BeginStep(plan.step, clock_ + 1, pull_next_);
  forward_pull_wait_ms_ = 0;
  backward_push_wait_ms_ = 0;
}

Status DownpourAlgorithm::AfterPass(StepWaits* waits) {
  if (PullInfo info; pull_ahead_ != nullptr && pull_ahead_->TakeInfo(&info)) pull_info_ = info;
  waits->pull_ms += forward_pull_wait_ms_;
  waits->push_wait_ms += backward_push_wait_ms_;
  waits->in_pass_ms += forward_pull_wait_ms_ + backward_push_wait_ms_;
  if (!callback_status_.ok()) pushing_ = false;
  return callback_status_;
}

Status DownpourAlgorithm::Finish(const StepPlan& plan, StepWaits* waits) {
  pushing_ = false;
  if (!plan.update) {
    DP_RETURN_IF_ERROR(ReadyAccumulator());
    AddToAccumulator();
    return Status::Ok();
  }
  const double t0 = NowS();
  TraceSpan wait_span(env_.trace, env_.trace_track, "worker", "push wait");
  const std::span<float> source = accum_.empty() ? env_.net->grads() : std::span<float>(accum_);
  if (clipping()) {
    // Every tensor's gradient is final now: clip the whole, then push it all.
    local_.Clip(source);
    for (int t = 0; t < static_cast<int>(env_.layout->tensors().size()); ++t) {
      for (const PushGroup& group : planner_.OnTensorReady(t)) DP_RETURN_IF_ERROR(PushGroupAndPull(group, source));
    }
  }
  // Groups held back below the push-size threshold go out now.
  for (const PushGroup& group : planner_.Flush()) DP_RETURN_IF_ERROR(PushGroupAndPull(group, source));
  DP_CHECK(planner_.AllReleased());
  // Backward is over: every tensor is final, so every pushed chunk may be pulled now.
  if (pull_next_) DP_RETURN_IF_ERROR(pull_ahead_->EndBackward());
  // No wait for the acknowledgements: the next step waits for a layer's only before
  // overwriting its gradients.
  accum_pushed_ = !accum_.empty();
  ++clock_;
  DP_RETURN_IF_ERROR(env_.channel->Clock(clock_));
  waits->push_wait_ms += 1e3 * (NowS() - t0);
  return Status::Ok();
}

// Pushes `group`, then (when this step pulls ahead) starts the next step's pulls of its chunks,
// after the push on the same links, so each server serves them after applying this push.
Status DownpourAlgorithm::PushGroupAndPull(const PushGroup& group, std::span<const float> source) {
  if (factors_on_) DP_RETURN_IF_ERROR(env_.channel->SetPushFactors(step_factors_));
  PushHandle handle = 0;
  DP_RETURN_IF_ERROR(env_.channel->StartPush(clock_, group, source, &handle));
  pushes_.Started(handle, current_step_, group.chunk_ids);
  if (!pull_next_) return Status::Ok();
  return pull_ahead_->Pushed(group.chunk_ids);
}

// Forward is about to run `layer`: its weights are taken in from the pulls, waiting where due.
void DownpourAlgorithm::OnLayerForward(int layer) {
  if (!callback_status_.ok()) return;
  const double t0 = NowS();
  TraceSpan span(env_.trace, env_.trace_track, "worker", "pull wait");
  span.Arg("layer", layer);
  callback_status_ = pull_ahead_->BeforeForward(layer);
  forward_pull_wait_ms_ += 1e3 * (NowS() - t0);
}

// Backward is about to overwrite `layer`'s gradients: the previous step's pushes reading them
// must be acknowledged first.
void DownpourAlgorithm::OnLayerBackward(int layer) {
  const std::vector<int32_t>& chunks = layer_chunks_[static_cast<size_t>(layer)];
  if (!callback_status_.ok() || !pushes_.Pending(chunks)) return;
  const double t0 = NowS();
  TraceSpan span(env_.trace, env_.trace_track, "worker", "ack wait");
  span.Arg("layer", layer);
  callback_status_ = pushes_.WaitFor(chunks, &push_info_);
  backward_push_wait_ms_ += 1e3 * (NowS() - t0);
}

// The accumulator (push_every > 1) is what the last push step's pushes read: wait for them before
// it changes, then start it again from zero.
Status DownpourAlgorithm::ReadyAccumulator() {
  if (!accum_pushed_) return Status::Ok();
  const double t0 = NowS();
  DP_RETURN_IF_ERROR(pushes_.WaitAll(&push_info_));
  backward_push_wait_ms_ += 1e3 * (NowS() - t0);
  std::fill(accum_.begin(), accum_.end(), 0.0f);
  accum_pushed_ = false;
  return Status::Ok();
}

// Runs inside backward on the training thread. Tensor `tensor`'s gradient is final: fold it
// into the accumulator when pushes stand for several steps, then push what became ready.
void DownpourAlgorithm::OnGradReady(int tensor) {
  if (!pushing_ || !callback_status_.ok()) return;
  engine::Net* net = env_.net;
  if (pull_next_) pull_ahead_->TensorFinal(tensor);  // its layer's backward is complete
  if (net->grad_is_factored(tensor)) step_factors_.push_back(PushFactor{tensor, net->batch_size()});
  std::span<const float> source = net->grads();
  if (!accum_.empty()) {
    callback_status_ = ReadyAccumulator();
    if (!callback_status_.ok()) return;
    const int64_t off = net->param_offset(tensor);
    const auto g = net->grad(tensor);
    const float inv = 1.0f / static_cast<float>(options().worker.push_every);
    float* acc = accum_.data() + off;
    for (size_t i = 0; i < g.size(); ++i) acc[i] = (acc[i] + g[i]) * inv;
    source = accum_;
  }
  // Clipping by the global norm needs every tensor's gradient first: pushes wait for Finish.
  if (clipping()) return;
  for (const PushGroup& group : planner_.OnTensorReady(tensor)) {
    Status s = PushGroupAndPull(group, source);
    if (!s.ok()) {
      callback_status_ = s;
      return;
    }
  }
}

}  // namespace

std::unique_ptr<WorkerAlgorithm> MakeDownpourAlgorithm(const AlgorithmEnv& env) {
  return std::make_unique<DownpourAlgorithm>(env);
}

}  // namespace downpour::worker
