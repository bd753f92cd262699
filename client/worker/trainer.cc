// trainer.cc — see trainer.h.
#include "client/worker/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <thread>

#include <fmt/format.h>

#include "client/worker/factor_choice.h"
#include "common/solver/lr_policy.h"
#include "common/solver/sgd.h"
#include "common/tensor_file.h"

namespace downpour::worker {
namespace {

double NowS() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Milliseconds covered by the union of the spans (the wire was busy with at least one of them).
double UnionMs(std::vector<WireSpan> spans) {
  std::sort(spans.begin(), spans.end(), [](const WireSpan& a, const WireSpan& b) { return a.issued_s < b.issued_s; });
  double total = 0, begin = 0, end = 0;
  bool open = false;
  for (const WireSpan& w : spans) {
    if (open && w.issued_s <= end) {
      end = std::max(end, w.done_s);
      continue;
    }
    if (open) total += end - begin;
    begin = w.issued_s;
    end = w.done_s;
    open = true;
  }
  if (open) total += end - begin;
  return 1e3 * total;
}

// Steps this worker runs: `steps`, or enough whole batches for `epochs` passes of its shard.
int64_t PlannedSteps(const WorkerConfig& w, int64_t shard_size) {
  if (w.epochs > 0 && shard_size > 0)
    return (static_cast<int64_t>(w.epochs) * shard_size + w.batch_size - 1) / w.batch_size;
  return w.steps;
}


}  // namespace

Status SaveModel(engine::Net& net, const std::string& path) {
  TensorFile file;
  file.meta["model"] = net.spec().name;
  for (int i = 0; i < static_cast<int>(net.param_specs().size()); ++i) {
    const TensorSpec& spec = net.param_specs()[static_cast<size_t>(i)];
    const auto p = net.param(i);
    file.tensors.push_back(NamedTensor{spec.name, spec.shape, std::vector<float>(p.begin(), p.end())});
  }
  return WriteTensorFile(path, file);
}

Status EvaluateNet(engine::Net* net, TestSource* test, int max_batches, EvalRecord* out) {
  DP_RETURN_IF_ERROR(test->Rewind());
  double loss_sum = 0, top1_sum = 0, top5_sum = 0;
  int64_t images = 0;
  for (int b = 0; max_batches == 0 || b < max_batches; ++b) {
    BatchView batch;
    bool has = false;
    DP_RETURN_IF_ERROR(test->Next(&batch, &has));
    if (!has) break;
    DP_RETURN_IF_ERROR(net->CheckLabels(batch.labels, batch.n));
    if (batch.n != net->batch_size()) DP_RETURN_IF_ERROR(net->Reshape(batch.n));
    const engine::EvalResult r = net->Forward(batch.data, batch.labels);
    loss_sum += static_cast<double>(r.loss) * batch.n;
    top1_sum += static_cast<double>(r.top1) * batch.n;
    top5_sum += static_cast<double>(r.topk) * batch.n;
    images += batch.n;
  }
  if (images == 0) return NotFound("evaluation: the test set gave no batches (data.test is empty?)");
  const double n = static_cast<double>(images);
  out->images = images;
  out->loss = loss_sum / n;
  out->top1 = top1_sum / n;
  out->top5 = top5_sum / n;
  return Status::Ok();
}

Trainer::Trainer(TrainerOptions options, engine::Net* net, engine::Net* eval_net, const ParamLayout* layout,
                 ParamChannel* channel, TrainSource* train, TestSource* test, MetricsWriter* metrics,
                 ProgressReporter* progress)
    : o_(std::move(options)),
      net_(net),
      eval_net_(eval_net),
      layout_(layout),
      channel_(channel),
      train_(train),
      test_(test),
      metrics_(metrics),
      progress_(progress),
      planner_(*layout, o_.min_push_elems),
      local_(o_.solver),
      trace_track_(o_.trace != nullptr && o_.trace->on() ? o_.trace->Thread("train") : -1) {
  DP_CHECK_EQ(layout_->total_elems(), static_cast<int64_t>(net_->params().size()));
  DP_CHECK_EQ(layout_->tensors().size(), net_->param_specs().size());
  if (o_.worker.push_every > 1) accum_.assign(net_->params().size(), 0.0f);
  if (o_.easgd && channel_ == nullptr) o_.easgd = false;  // a local run has no center
  kind_ = channel_ == nullptr ? StepKind::kLocal : o_.easgd ? StepKind::kEasgd : StepKind::kDownpour;
  const bool downpour = kind_ == StepKind::kDownpour;
  if (!downpour) local_.Reset(net_->params().size());
  if (kind_ == StepKind::kEasgd) center_.assign(net_->params().size(), 0.0f);
  const std::vector<int> factored = ChooseFactoredTensors(
      *net_, *layout_, FactorChoiceInput{o_.factors && !o_.easgd, o_.worker.push_every, o_.solver.clip_gradients,
                               downpour, o_.worker_id});
  DP_CHECK(net_->SetFactoredParams(factored).ok());  // inner-product weights by construction
  factors_on_ = !factored.empty();
  net_->SetGradReadyCallback([this](int tensor) { OnGradReady(tensor); });
  overlap_ = o_.overlap_pull && downpour && o_.worker.pull_every == 1 &&
             o_.worker.push_every == 1;
  if (downpour) {
    layer_chunks_ = ChunksByLayer(*net_, *layout_);
    pushes_ = std::make_unique<PushWindow>(channel_, layout_->num_chunks());
    net_->SetBeforeBackwardCallback([this](int layer) { OnLayerBackward(layer); });
  }
  if (overlap_) {
    pull_ahead_ = std::make_unique<PullAhead>(channel_, *layout_, layer_chunks_, net_->params(), o_.weights_lag);
    // Pushes carry the versions of the weights the net computed on: with a lag (or after an
    // evaluation's pull) the last pulled are newer.
    channel_->SetPushVersions(pull_ahead_->held_versions());
    net_->SetBeforeLayerCallback([this](int layer) { OnLayerForward(layer); });
  }
}

Trainer::~Trainer() {
  net_->SetGradReadyCallback({});
  if (factors_on_) (void)net_->SetFactoredParams({});
  if (overlap_) {
    net_->SetBeforeLayerCallback({});
    channel_->SetPushVersions({});
  }
  if (pushes_ != nullptr) net_->SetBeforeBackwardCallback({});
}

// Pushes `group`, then (when this step pulls ahead) starts the next step's pulls of its chunks,
// after the push on the same links, so each server serves them after applying this push.
Status Trainer::PushGroupAndPull(const PushGroup& group, std::span<const float> source) {
  if (factors_on_) DP_RETURN_IF_ERROR(channel_->SetPushFactors(step_factors_));
  PushHandle handle = 0;
  DP_RETURN_IF_ERROR(channel_->StartPush(clock_, group, source, &handle));
  pushes_->Started(handle, current_step_, group.chunk_ids);
  if (!pull_next_) return Status::Ok();
  return pull_ahead_->Pushed(group.chunk_ids);
}

// Forward is about to run `layer`: its weights are taken in from the pulls, waiting where due.
void Trainer::OnLayerForward(int layer) {
  if (!callback_status_.ok()) return;
  const double t0 = NowS();
  TraceSpan span(o_.trace, trace_track_, "worker", "pull wait");
  span.Arg("layer", layer);
  callback_status_ = pull_ahead_->BeforeForward(layer);
  forward_pull_wait_ms_ += 1e3 * (NowS() - t0);
}

// Backward is about to overwrite `layer`'s gradients: the previous step's pushes reading them
// must be acknowledged first.
void Trainer::OnLayerBackward(int layer) {
  const std::vector<int32_t>& chunks = layer_chunks_[static_cast<size_t>(layer)];
  if (!callback_status_.ok() || !pushes_->Pending(chunks)) return;
  const double t0 = NowS();
  TraceSpan span(o_.trace, trace_track_, "worker", "ack wait");
  span.Arg("layer", layer);
  callback_status_ = pushes_->WaitFor(chunks, &push_info_);
  backward_push_wait_ms_ += 1e3 * (NowS() - t0);
}

// The accumulator (push_every > 1) is what the last push step's pushes read: wait for them before
// it changes, then start it again from zero.
Status Trainer::ReadyAccumulator() {
  if (!accum_pushed_) return Status::Ok();
  const double t0 = NowS();
  DP_RETURN_IF_ERROR(pushes_->WaitAll(&push_info_));
  backward_push_wait_ms_ += 1e3 * (NowS() - t0);
  std::fill(accum_.begin(), accum_.end(), 0.0f);
  accum_pushed_ = false;
  return Status::Ok();
}

Status Trainer::SaveAckedProgress(bool finished) {
  if (!o_.on_progress) return Status::Ok();
  if (unacked_progress_) {
    // The previous step's pushes: normally acknowledged already (each layer's backward waited).
    DP_RETURN_IF_ERROR(pushes_->WaitThrough(unacked_progress_->step - 1, &push_info_));
    o_.on_progress(*unacked_progress_);
    unacked_progress_.reset();
  }
  if (finished || pushes_ == nullptr || pushes_->empty()) {
    o_.on_progress(Progress(finished));
  } else {
    unacked_progress_ = Progress(false);
  }
  return Status::Ok();
}

double Trainer::Elapsed() const { return NowS() - start_; }

// Runs inside backward on the training thread. Tensor `tensor`'s gradient is final: fold it
// into the accumulator when pushes stand for several steps, then push what became ready.
void Trainer::OnGradReady(int tensor) {
  if (!pushing_ || !callback_status_.ok()) return;
  if (pull_next_) pull_ahead_->TensorFinal(tensor);  // its layer's backward is complete
  if (net_->grad_is_factored(tensor)) step_factors_.push_back(PushFactor{tensor, net_->batch_size()});
  std::span<const float> source = net_->grads();
  if (!accum_.empty()) {
    callback_status_ = ReadyAccumulator();
    if (!callback_status_.ok()) return;
    const int64_t off = net_->param_offset(tensor);
    const auto g = net_->grad(tensor);
    const float inv = 1.0f / static_cast<float>(o_.worker.push_every);
    float* acc = accum_.data() + off;
    for (size_t i = 0; i < g.size(); ++i) acc[i] = (acc[i] + g[i]) * inv;
    source = accum_;
  }
  // Clipping by the global norm needs every tensor's gradient first: pushes wait for Flush.
  if (clipping()) return;
  for (const PushGroup& group : planner_.OnTensorReady(tensor)) {
    Status s = PushGroupAndPull(group, source);
    if (!s.ok()) {
      callback_status_ = s;
      return;
    }
  }
}

void Trainer::ApplyLocalUpdate() {
  auto grads = net_->grads();
  if (!accum_.empty()) {
    const float inv = 1.0f / static_cast<float>(o_.worker.push_every);
    for (size_t i = 0; i < grads.size(); ++i) grads[i] = (accum_[i] + grads[i]) * inv;
    std::fill(accum_.begin(), accum_.end(), 0.0f);
  }
  // An update here averages push_every batches; an EASGD worker is one of easgd_workers training
  // at once, so the run has processed that many times its batches.
  local_.Step(net_, LocalIteration(local_updates_, o_.worker.push_every,
                                   kind_ == StepKind::kEasgd ? o_.easgd_workers : 1));
  ++local_updates_;
}

// EASGD's exchange (Zhang, Choromanska, LeCun 2015, asynchronous EASGD): read the center x~,
// e = α(x − x~); the servers add e to x~ and this worker subtracts it from x.
Status Trainer::ElasticExchange() {
  PullInfo info;
  DP_RETURN_IF_ERROR(channel_->Pull(clock_, center_, &info));
  const auto x = net_->params();
  const float alpha = o_.easgd_alpha;
  for (size_t i = 0; i < center_.size(); ++i) center_[i] = alpha * (x[i] - center_[i]);
  DP_RETURN_IF_ERROR(channel_->PushElastic(clock_, center_, &push_info_));
  for (size_t i = 0; i < center_.size(); ++i) x[i] -= center_[i];
  ++clock_;
  return channel_->Clock(clock_);
}

Status Trainer::Step(int64_t step, const BatchView& batch, bool push_step, bool last_step) {
  current_step_ = step;
  pushing_ = kind_ == StepKind::kDownpour && push_step;
  planner_.Reset();
  step_factors_.clear();
  callback_status_ = Status::Ok();
  pull_next_ = overlap_ && pushing_ && !last_step;
  if (pull_ahead_ != nullptr) pull_ahead_->BeginStep(step, clock_ + 1, pull_next_);
  forward_pull_wait_ms_ = 0;
  backward_push_wait_ms_ = 0;
  const double t0 = NowS();
  TraceSpan compute_span(o_.trace, trace_track_, "worker", "forward+backward");
  const float loss = net_->ForwardBackward(batch.data, batch.labels);
  compute_span.End();
  const double t1 = NowS();
  DP_RETURN_IF_ERROR(callback_status_);
  if (PullInfo info; pull_ahead_ != nullptr && pull_ahead_->TakeInfo(&info)) pull_info_ = info;
  compute_ms_ = 1e3 * (t1 - t0) - forward_pull_wait_ms_ - backward_push_wait_ms_;
  pull_ms_ += forward_pull_wait_ms_;
  push_wait_ms_ = backward_push_wait_ms_;
  if (!std::isfinite(loss))
    return Internal(
        "worker {}: training loss is {} at step {} (diverged; "
        "lower solver.base_lr)",
        o_.worker_id, loss, step);
  loss_last_ = loss;
  loss_ema_ = loss_ema_ < 0 ? loss : 0.95 * loss_ema_ + 0.05 * loss;

  Status s;
  if (!push_step) {
    s = Accumulate();
  } else if (pushing_) {
    s = FinishPush(t1);
  } else {
    s = FinishLocal(step, last_step);
  }
  pushing_ = false;
  return s;
}

Status Trainer::FinishPush(double t1) {
  TraceSpan wait_span(o_.trace, trace_track_, "worker", "push wait");
  const std::span<float> source = accum_.empty() ? net_->grads() : std::span<float>(accum_);
  if (clipping()) {
    // Every tensor's gradient is final now: clip the whole, then push it all.
    local_.Clip(source);
    for (int t = 0; t < static_cast<int>(layout_->tensors().size()); ++t) {
      for (const PushGroup& group : planner_.OnTensorReady(t)) {
        DP_RETURN_IF_ERROR(PushGroupAndPull(group, source));
      }
    }
  }
  // Groups held back below the push-size threshold go out now.
  for (const PushGroup& group : planner_.Flush()) {
    DP_RETURN_IF_ERROR(PushGroupAndPull(group, source));
  }
  DP_CHECK(planner_.AllReleased());
  // Backward is over: every tensor is final, so every pushed chunk may be pulled now.
  if (pull_next_) DP_RETURN_IF_ERROR(pull_ahead_->EndBackward());
  // No wait for the acknowledgements (trainer.h): the next step waits for a layer's only
  // before overwriting its gradients.
  accum_pushed_ = !accum_.empty();
  ++clock_;
  DP_RETURN_IF_ERROR(channel_->Clock(clock_));
  push_wait_ms_ += 1e3 * (NowS() - t1);
  return Status::Ok();
}

Status Trainer::FinishLocal(int64_t step, bool last_step) {
  ApplyLocalUpdate();
  if (kind_ == StepKind::kEasgd && ((step + 1) % o_.easgd_tau == 0 || last_step)) {
    const double te = NowS();
    DP_RETURN_IF_ERROR(ElasticExchange());
    push_wait_ms_ = 1e3 * (NowS() - te);
  }
  return Status::Ok();
}

Status Trainer::Accumulate() {
  if (pushes_ != nullptr) DP_RETURN_IF_ERROR(ReadyAccumulator());
  const auto g = net_->grads();
  for (size_t i = 0; i < g.size(); ++i) accum_[i] += g[i];
  return Status::Ok();
}

bool Trainer::EvalDue(int64_t steps_done) const {
  if (!o_.evaluate || test_ == nullptr) return false;
  if (o_.eval.every_steps > 0 && steps_done % o_.eval.every_steps == 0) return true;
  return o_.eval.every_seconds > 0 && Elapsed() - last_eval_time_ >= o_.eval.every_seconds;
}

Status Trainer::Evaluate(bool final_eval, EvalRecord* out, bool starting_weights) {
  DP_CHECK(eval_net_ != nullptr && test_ != nullptr);
  TraceSpan span(o_.trace, trace_track_, "worker", "evaluate");
  const double t0 = NowS();
  *out = EvalRecord{};
  if (starting_weights) {
    // This worker's own initial weights are the run's (every worker offers the same seeded or
    // loaded weights); pulling instead could see other workers' first updates already.
    std::copy(net_->params().begin(), net_->params().end(), eval_net_->params().begin());
  } else if (channel_ != nullptr) {
    // The next step's pulls may be in flight: let them land first, so no two pulls of one
    // chunk are in flight at once (the client's versions are per chunk).
    if (pull_ahead_ != nullptr) DP_RETURN_IF_ERROR(pull_ahead_->WaitInFlight());
    PullInfo info;
    DP_RETURN_IF_ERROR(channel_->Pull(clock_, eval_net_->params(), &info));
    out->versions = info.version_sum;
    channel_->TakeWireSpans();  // evaluation traffic is not a step's
    MarkTraffic();
  } else {
    std::copy(net_->params().begin(), net_->params().end(), eval_net_->params().begin());
    out->versions = local_updates_;
  }
  DP_RETURN_IF_ERROR(EvaluateNet(eval_net_, test_, o_.eval.test_batches, out));
  out->step = steps_done_;
  const int64_t shard = train_->shard_size();
  out->epoch = shard > 0 ? static_cast<double>(images_) / static_cast<double>(shard) : 0.0;
  out->wall_s = Elapsed();
  eval_s_ += NowS() - t0;
  last_eval_time_ = Elapsed();
  LogEval(*out, final_eval);
  if (progress_ != nullptr)
    progress_->Note(fmt::format("w{} {}eval step {} epoch {:.2f}: test loss {:.4f} top-1 {:.2f}% top-5 {:.2f}% ({} images)",
                                o_.worker_id, final_eval ? "final " : "", out->step, out->epoch, out->loss,
                                100 * out->top1, 100 * out->top5, out->images));
  return Status::Ok();
}

void Trainer::LogStep(int64_t steps_done, const BatchView& batch, double step_s) {
  const int64_t shard = train_->shard_size();
  const double rate = step_s > 0 ? batch.n / step_s : 0.0;
  rate_ema_ = rate_ema_ == 0 ? rate : 0.9 * rate_ema_ + 0.1 * rate;
  if (metrics_ == nullptr) return;
  const double epoch = shard > 0 ? static_cast<double>(images_) / static_cast<double>(shard) : 0.0;
  const int64_t chunks = push_info_.chunks - last_push_chunks_;
  const double staleness =
      push_info_.staleness_known && chunks > 0
          ? static_cast<double>(push_info_.staleness_sum - last_push_sum_) / static_cast<double>(chunks)
          : std::numeric_limits<double>::quiet_NaN();  // null: no ack this step reported one
  last_push_chunks_ = push_info_.chunks;
  last_push_sum_ = push_info_.staleness_sum;
  MetricValue tx_bytes, rx_bytes, shm_tx_bytes, shm_rx_bytes;  // null without a transport / shared memory
  TrafficSince(o_.traffic, &traffic_last_, &tx_bytes, &rx_bytes);
  TrafficSince(o_.shm_traffic, &shm_last_, &shm_tx_bytes, &shm_rx_bytes);
  // Metrics are best effort: a full disk must not stop training.
  (void)metrics_->Write("step", {{"wall_s", Elapsed()},
                                 {"step", steps_done},
                                 {"clock", clock_},
                                 {"epoch", epoch},
                                 {"loss", loss_last_},
                                 {"loss_ema", loss_ema_},
                                 {"batch_acc", net_->last_accuracy()},
                                 {"images", images_},
                                 {"images_per_s", rate},
                                 {"step_ms", 1e3 * step_s},
                                 {"compute_ms", compute_ms_},
                                 {"pull_wait_ms", pull_ms_},
                                 {"push_wait_ms", push_wait_ms_},
                                 {"loader_wait_ms", loader_ms_},
                                 {"comm_ms", channel_ != nullptr ? MetricValue(comm_ms_) : MetricValue()},
                                 {"version_min", pull_info_.version_min},
                                 {"version_max", pull_info_.version_max},
                                 {"staleness_mean", staleness},
                                 {"grad_norm", clipping() ? MetricValue(local_.grad_norm()) : MetricValue()},
                                 {"tx_bytes", tx_bytes},
                                 {"rx_bytes", rx_bytes},
                                 {"shm_tx_bytes", shm_tx_bytes},
                                 {"shm_rx_bytes", shm_rx_bytes}});
}

void Trainer::TrafficSince(const std::function<TrafficCounts()>& counts, TrafficCounts* last, MetricValue* tx,
                           MetricValue* rx) {
  if (!counts) return;
  const TrafficCounts t = counts();
  *tx = static_cast<int64_t>(t.sent_bytes - last->sent_bytes);
  *rx = static_cast<int64_t>(t.received_bytes - last->received_bytes);
  *last = t;
}

void Trainer::MarkTraffic() {
  if (o_.traffic) traffic_last_ = o_.traffic();
  if (o_.shm_traffic) shm_last_ = o_.shm_traffic();
}

void Trainer::LogEval(const EvalRecord& r, bool final_eval) {
  if (metrics_ == nullptr) return;
  (void)metrics_->Write("eval", {{"wall_s", r.wall_s},
                                 {"final", final_eval},
                                 {"step", r.step},
                                 {"epoch", r.epoch},
                                 {"test_loss", r.loss},
                                 {"top1", r.top1},
                                 {"top5", r.top5},
                                 {"test_images", r.images},
                                 {"server_versions", r.versions}});
}

WorkerProgress Trainer::Progress(bool finished) const {
  WorkerProgress p;
  p.step = steps_done_;
  p.clock = clock_;
  p.images = images_;
  p.epoch = epoch_;
  p.wall_s = Elapsed();
  p.eval_s = eval_s_;
  p.finished = finished;
  return p;
}

Status Trainer::Run(TrainResult* result) {
  *result = TrainResult{};
  const WorkerConfig& w = o_.worker;
  const int64_t planned = PlannedSteps(w, train_->shard_size());
  const WorkerProgress from = o_.resume.value_or(WorkerProgress{});
  if (o_.resume) {
    if (from.step > planned)
      return InvalidArgument("worker {}: resume at step {} is past the run's {} planned steps", o_.worker_id, from.step,
                             planned);
    DP_RETURN_IF_ERROR(train_->SeekToStep(from.step));
    net_->set_step(from.step);  // dropout masks continue as if never stopped
  }
  steps_done_ = from.step;
  clock_ = o_.resume ? from.clock : o_.clock_base;
  local_updates_ = clock_;
  images_ = from.images;
  epoch_ = from.epoch;
  eval_s_ = from.eval_s;
  start_ = NowS() - from.wall_s;  // wall_s continues across a resume (the downtime is not counted)
  last_eval_time_ = from.wall_s;
  if (metrics_ != nullptr) {
    (void)metrics_->Write("start", {{"planned_steps", planned},
                                    {"batch_size", w.batch_size},
                                    {"pull_every", w.pull_every},
                                    {"push_every", w.push_every},
                                    {"shard_size", train_->shard_size()},
                                    {"params", static_cast<int64_t>(net_->params().size())},
                                    {"distributed", channel_ != nullptr},
                                    {"overlap_pull", overlap_},
                                    {"resumed", o_.resume.has_value()},
                                    {"resume_step", from.step},
                                    {"wall_offset_s", from.wall_s}});
  }
  if (o_.eval.at_start && !o_.resume && o_.evaluate && test_ != nullptr) {
    EvalRecord r;
    DP_RETURN_IF_ERROR(Evaluate(false, &r, /*starting_weights=*/true));
  }
  MarkTraffic();  // register and the first evaluation are no step's
  for (int64_t step = from.step; step < planned; ++step) {
    const double t0 = NowS();
    TraceSpan step_span(o_.trace, trace_track_, "worker", "step");
    step_span.Arg("step", static_cast<double>(step + 1));
    pull_ms_ = 0;
    // The first step of a run (a resumed one too) always pulls: the net holds no server weights
    // yet. A step whose pulls the previous step started waits for them layer by layer instead.
    const bool pulled_ahead = pull_ahead_ != nullptr && pull_ahead_->active();
    // An EASGD worker keeps its own weights: it pulls the center once, to start from it.
    const bool pull_due =
        kind_ == StepKind::kEasgd ? step == from.step : (step % w.pull_every == 0 || step == from.step);
    if (channel_ != nullptr && !pulled_ahead && pull_due) {
      TraceSpan span(o_.trace, trace_track_, "worker", "pull");
      DP_RETURN_IF_ERROR(channel_->Pull(clock_, net_->params(), &pull_info_));
      if (pull_ahead_ != nullptr) pull_ahead_->Reset(step);
      pull_ms_ = 1e3 * (NowS() - t0);
    }
    BatchView batch;
    const double loader_t0 = NowS();
    DP_RETURN_IF_ERROR(train_->Next(&batch));
    loader_ms_ = 1e3 * (NowS() - loader_t0);
    DP_RETURN_IF_ERROR(net_->CheckLabels(batch.labels, batch.n));
    if (batch.n != net_->batch_size() || batch.c != net_->input_channels() || batch.h != net_->input_height() ||
        batch.w != net_->input_width())
      return InvalidArgument("worker {}: batch {}x{}x{}x{} does not match the net's input {}x{}x{}x{}", o_.worker_id,
                             batch.n, batch.c, batch.h, batch.w, net_->batch_size(), net_->input_channels(),
                             net_->input_height(), net_->input_width());
    const bool push_step = (step + 1) % w.push_every == 0 || step + 1 == planned;
    DP_RETURN_IF_ERROR(Step(step, batch, push_step, step + 1 == planned));
    if (channel_ != nullptr) comm_ms_ = UnionMs(channel_->TakeWireSpans());
    if (o_.step_delay.count() > 0) std::this_thread::sleep_for(o_.step_delay);
    images_ += batch.n;
    steps_done_ = step + 1;
    epoch_ = batch.epoch;
    LogStep(steps_done_, batch, NowS() - t0);
    if (progress_ != nullptr) {
      ProgressState p;
      p.worker_id = o_.worker_id;
      p.epoch = epoch_;
      p.step = steps_done_;
      p.total_steps = planned;
      p.images_per_s = rate_ema_;
      p.loss = loss_ema_;
      p.elapsed_s = Elapsed() - eval_s_;
      progress_->Update(p, steps_done_ == planned);
    }
    if (steps_done_ < planned && EvalDue(steps_done_)) {
      EvalRecord r;
      DP_RETURN_IF_ERROR(Evaluate(false, &r));
    }
    DP_RETURN_IF_ERROR(SaveAckedProgress(false));
  }
  if (progress_ != nullptr) progress_->Finish();
  if (pull_ahead_ != nullptr) DP_RETURN_IF_ERROR(pull_ahead_->WaitInFlight());
  if (pushes_ != nullptr) DP_RETURN_IF_ERROR(pushes_->WaitAll(&push_info_));
  DP_RETURN_IF_ERROR(SaveAckedProgress(true));
  result->steps = steps_done_;
  result->images = images_;
  const double train_end = Elapsed();
  result->train_s = train_end - eval_s_;
  result->images_per_s = result->train_s > 0 ? static_cast<double>(images_) / result->train_s : 0;
  if (o_.on_training_done) DP_RETURN_IF_ERROR(o_.on_training_done());
  if (o_.evaluate && test_ != nullptr) {
    DP_RETURN_IF_ERROR(Evaluate(true, &result->final_eval));
    result->has_eval = true;
    if (!o_.model_out.empty()) DP_RETURN_IF_ERROR(SaveModel(*eval_net_, o_.model_out));
  }
  result->wall_s = Elapsed();
  result->staleness_chunks = push_info_.chunks;
  result->staleness_sum = push_info_.staleness_sum;
  result->staleness_max = push_info_.staleness_max;
  if (metrics_ != nullptr) {
    const double nan = std::numeric_limits<double>::quiet_NaN();
    (void)metrics_->Write("done", {{"steps", result->steps},
                                   {"images", result->images},
                                   {"wall_s", result->wall_s},
                                   {"train_s", result->train_s},
                                   {"images_per_s", result->images_per_s},
                                   {"final_top1", result->has_eval ? result->final_eval.top1 : nan},
                                   {"final_top5", result->has_eval ? result->final_eval.top5 : nan},
                                   {"final_test_loss", result->has_eval ? result->final_eval.loss : nan},
                                   {"clipped_steps", local_.clipped_steps()},
                                   {"tx_bytes", TotalBytes(o_.traffic, &TrafficCounts::sent_bytes)},
                                   {"rx_bytes", TotalBytes(o_.traffic, &TrafficCounts::received_bytes)},
                                   {"shm_tx_bytes", TotalBytes(o_.shm_traffic, &TrafficCounts::sent_bytes)},
                                   {"shm_rx_bytes", TotalBytes(o_.shm_traffic, &TrafficCounts::received_bytes)}});
  }
  return Status::Ok();
}

}  // namespace downpour::worker
