// trainer.cc — see trainer.h.
#include "client/worker/trainer.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <optional>
#include <thread>

#include "common/tensor_file.h"

namespace downpour::worker {
namespace {

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
  bool bytes = false;
  if (net->backend().normalizes_input()) {
    InputNormalization norm;
    DP_RETURN_IF_ERROR(test->UseBytes(&bytes, &norm));
    if (bytes && !net->has_input_normalization())
      DP_RETURN_IF_ERROR(net->SetInputNormalization(std::move(norm), "the test data"));
  }
  DP_RETURN_IF_ERROR(test->Rewind());
  double loss_sum = 0, top1_sum = 0, top5_sum = 0;
  int64_t images = 0;
  // Bytes: batch b + 1 is fetched before batch b runs, so the net uploads it meanwhile (a byte
  // view stays valid until the second Next after it); floats: after (one view at a time).
  std::optional<BatchView> next;
  auto fetch = [&](int b, std::optional<BatchView>* view) {
    view->reset();
    if (max_batches > 0 && b >= max_batches) return Status::Ok();
    bool has = false;
    DP_RETURN_IF_ERROR(test->Next(&view->emplace(), &has));
    if (!has) view->reset();
    return Status::Ok();
  };
  DP_RETURN_IF_ERROR(fetch(0, &next));
  for (int b = 0; next.has_value(); ++b) {
    const BatchView batch = *next;
    if (bytes) DP_RETURN_IF_ERROR(fetch(b + 1, &next));
    DP_RETURN_IF_ERROR(net->CheckLabels(batch.labels, batch.n));
    if (batch.n != net->batch_size()) DP_RETURN_IF_ERROR(net->Reshape(batch.n));
    engine::EvalResult r;
    if (bytes) {
      const ByteBatch later = next ? next->byte_batch() : ByteBatch{};
      r = net->Forward(batch.byte_batch(), batch.labels, next ? &later : nullptr);
    } else {
      r = net->Forward(batch.data, batch.labels);
    }
    loss_sum += static_cast<double>(r.loss) * batch.n;
    top1_sum += static_cast<double>(r.top1) * batch.n;
    top5_sum += static_cast<double>(r.topk) * batch.n;
    images += batch.n;
    if (!bytes) DP_RETURN_IF_ERROR(fetch(b + 1, &next));
  }
  if (images == 0) return NotFound("evaluation: the test set gave no batches (data.test is empty?)");
  const double n = static_cast<double>(images);
  out->images = images;
  out->byte_input = bytes;
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
      channel_(channel),
      train_(train),
      test_(test),
      metrics_(metrics),
      progress_(progress),
      trace_track_(o_.trace != nullptr && o_.trace->on() ? o_.trace->Thread("train") : -1) {
  DP_CHECK_EQ(layout->total_elems(), static_cast<int64_t>(net_->params().size()));
  DP_CHECK_EQ(layout->tensors().size(), net_->param_specs().size());
  algorithm_ = MakeWorkerAlgorithm(AlgorithmEnv{&o_, net_, layout, channel_, o_.trace, trace_track_});
}

Trainer::~Trainer() = default;

Status Trainer::SaveAckedProgress(bool finished) {
  if (!o_.on_progress) return Status::Ok();
  if (unacked_progress_) {
    // The previous step's pushes: normally acknowledged already (each layer's backward waited).
    DP_RETURN_IF_ERROR(algorithm_->WaitAcked(unacked_progress_->step - 1));
    o_.on_progress(*unacked_progress_);
    unacked_progress_.reset();
  }
  if (finished || !algorithm_->Unacked()) {
    o_.on_progress(Progress(finished));
  } else {
    unacked_progress_ = Progress(false);
  }
  return Status::Ok();
}

double Trainer::Elapsed() const { return NowS() - start_; }

Status Trainer::UseByteInput() {
  byte_input_ = false;
  if (!net_->backend().normalizes_input()) return Status::Ok();
  InputNormalization norm;
  DP_RETURN_IF_ERROR(train_->UseBytes(&byte_input_, &norm));
  if (!byte_input_) return Status::Ok();
  return net_->SetInputNormalization(std::move(norm), fmt::format("worker {}: the training data", o_.worker_id));
}

Status Trainer::NextBatch(const StepPlan& plan, BatchView* batch) {
  if (!byte_input_) return train_->Next(batch);
  // Byte input: this step's batch was fetched by the step before (or is fetched now, the first
  // time), and the next step's is fetched now, so the net uploads it during this step.
  if (!next_batch_) DP_RETURN_IF_ERROR(train_->Next(&next_batch_.emplace()));
  *batch = *next_batch_;
  next_batch_.reset();
  if (!plan.last) DP_RETURN_IF_ERROR(train_->Next(&next_batch_.emplace()));
  return Status::Ok();
}

Status Trainer::Step(const StepPlan& plan, const BatchView& batch) {
  algorithm_->BeginPass(plan);
  const double t0 = NowS();
  TraceSpan compute_span(o_.trace, trace_track_, "worker", "forward+backward");
  float loss = 0;
  if (byte_input_) {
    const ByteBatch next = next_batch_ ? next_batch_->byte_batch() : ByteBatch{};
    loss = net_->ForwardBackward(batch.byte_batch(), batch.labels, next_batch_ ? &next : nullptr);
  } else {
    loss = net_->ForwardBackward(batch.data, batch.labels);
  }
  compute_span.End();
  const double t1 = NowS();
  DP_RETURN_IF_ERROR(algorithm_->AfterPass(&waits_));
  compute_ms_ = 1e3 * (t1 - t0) - waits_.in_pass_ms;
  if (!std::isfinite(loss))
    return Internal(
        "worker {}: training loss is {} at step {} (diverged; "
        "lower solver.base_lr)",
        o_.worker_id, loss, plan.step);
  loss_last_ = loss;
  loss_ema_ = loss_ema_ < 0 ? loss : 0.95 * loss_ema_ + 0.05 * loss;
  return algorithm_->Finish(plan, &waits_);
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
    DP_RETURN_IF_ERROR(algorithm_->Quiesce());
    PullInfo info;
    DP_RETURN_IF_ERROR(channel_->Pull(algorithm_->clock(), eval_net_->params(), &info));
    out->versions = info.version_sum;
    channel_->TakeWireSpans();  // evaluation traffic is not a step's
    MarkTraffic();
  } else {
    std::copy(net_->params().begin(), net_->params().end(), eval_net_->params().begin());
    out->versions = algorithm_->local_updates();
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
  const PushInfo& pushes = algorithm_->push_info();
  const int64_t chunks = pushes.chunks - last_push_chunks_;
  const double staleness =
      pushes.staleness_known && chunks > 0
          ? static_cast<double>(pushes.staleness_sum - last_push_sum_) / static_cast<double>(chunks)
          : std::numeric_limits<double>::quiet_NaN();  // null: no ack this step reported one
  last_push_chunks_ = pushes.chunks;
  last_push_sum_ = pushes.staleness_sum;
  const LocalSolver& solver = algorithm_->solver();
  MetricValue tx_bytes, rx_bytes, shm_tx_bytes, shm_rx_bytes;  // null without a transport / shared memory
  TrafficSince(o_.traffic, &traffic_last_, &tx_bytes, &rx_bytes);
  TrafficSince(o_.shm_traffic, &shm_last_, &shm_tx_bytes, &shm_rx_bytes);
  // Metrics are best effort: a full disk must not stop training.
  (void)metrics_->Write("step", {{"wall_s", Elapsed()},
                                 {"step", steps_done},
                                 {"clock", algorithm_->clock()},
                                 {"epoch", epoch},
                                 {"loss", loss_last_},
                                 {"loss_ema", loss_ema_},
                                 {"batch_acc", net_->last_accuracy()},
                                 {"images", images_},
                                 {"images_per_s", rate},
                                 {"step_ms", 1e3 * step_s},
                                 {"compute_ms", compute_ms_},
                                 {"pull_wait_ms", waits_.pull_ms},
                                 {"push_wait_ms", waits_.push_wait_ms},
                                 {"loader_wait_ms", loader_ms_},
                                 {"comm_ms", channel_ != nullptr ? MetricValue(comm_ms_) : MetricValue()},
                                 {"version_min", algorithm_->pull_info().version_min},
                                 {"version_max", algorithm_->pull_info().version_max},
                                 {"staleness_mean", staleness},
                                 {"grad_norm", solver.clipping() ? MetricValue(solver.grad_norm()) : MetricValue()},
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
                                 {"byte_input", r.byte_input},
                                 {"server_versions", r.versions}});
}

WorkerProgress Trainer::Progress(bool finished) const {
  WorkerProgress p;
  p.step = steps_done_;
  p.clock = algorithm_->clock();
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
  DP_RETURN_IF_ERROR(UseByteInput());
  steps_done_ = from.step;
  algorithm_->Start(o_.resume ? from.clock : o_.clock_base, from.step);
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
                                    {"overlap_pull", algorithm_->overlaps_pulls()},
                                    {"byte_input", byte_input_},
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
    const StepPlan plan{step, /*update=*/(step + 1) % w.push_every == 0 || step + 1 == planned,
                        /*last=*/step + 1 == planned};
    waits_ = StepWaits{};
    DP_RETURN_IF_ERROR(algorithm_->BeforeStep(plan, &waits_));
    BatchView batch;
    const double loader_t0 = NowS();
    DP_RETURN_IF_ERROR(NextBatch(plan, &batch));
    loader_ms_ = 1e3 * (NowS() - loader_t0);
    DP_RETURN_IF_ERROR(net_->CheckLabels(batch.labels, batch.n));
    if (batch.n != net_->batch_size() || batch.c != net_->input_channels() || batch.h != net_->input_height() ||
        batch.w != net_->input_width())
      return InvalidArgument("worker {}: batch {}x{}x{}x{} does not match the net's input {}x{}x{}x{}", o_.worker_id,
                             batch.n, batch.c, batch.h, batch.w, net_->batch_size(), net_->input_channels(),
                             net_->input_height(), net_->input_width());
    DP_RETURN_IF_ERROR(Step(plan, batch));
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
  DP_RETURN_IF_ERROR(algorithm_->Drain());
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
  const PushInfo& pushes = algorithm_->push_info();
  result->staleness_chunks = pushes.chunks;
  result->staleness_sum = pushes.staleness_sum;
  result->staleness_max = pushes.staleness_max;
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
                                   {"clipped_steps", algorithm_->solver().clipped_steps()},
                                   {"tx_bytes", TotalBytes(o_.traffic, &TrafficCounts::sent_bytes)},
                                   {"rx_bytes", TotalBytes(o_.traffic, &TrafficCounts::received_bytes)},
                                   {"shm_tx_bytes", TotalBytes(o_.shm_traffic, &TrafficCounts::sent_bytes)},
                                   {"shm_rx_bytes", TotalBytes(o_.shm_traffic, &TrafficCounts::received_bytes)}});
  }
  return Status::Ok();
}

}  // namespace downpour::worker
