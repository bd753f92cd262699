// worker_algorithm.cc — see worker_algorithm.h.
#include "client/worker/worker_algorithm.h"

#include <algorithm>
#include <chrono>

#include "client/worker/trainer.h"

namespace downpour::worker {

// Each algorithm's file.
std::unique_ptr<WorkerAlgorithm> MakeDownpourAlgorithm(const AlgorithmEnv& env);
std::unique_ptr<WorkerAlgorithm> MakeEasgdAlgorithm(const AlgorithmEnv& env);
std::unique_ptr<WorkerAlgorithm> MakeLocalAlgorithm(const AlgorithmEnv& env);
std::unique_ptr<WorkerAlgorithm> MakeLocalSgdAlgorithm(const AlgorithmEnv& env);

std::unique_ptr<WorkerAlgorithm> MakeWorkerAlgorithm(const AlgorithmEnv& env) {
  DP_CHECK(env.options != nullptr && env.net != nullptr && env.layout != nullptr);
  if (env.channel == nullptr) return MakeLocalAlgorithm(env);  // no servers: nothing to exchange with
  switch (env.options->consistency.algorithm) {
    case Algorithm::kEasgd:
      return MakeEasgdAlgorithm(env);
    case Algorithm::kLocalSgd:
      return MakeLocalSgdAlgorithm(env);
    case Algorithm::kSgd:
    case Algorithm::kDcAsgd:
    case Algorithm::kDcAsgdAdaptive:
      break;  // the servers' rules: the worker pushes its gradient
  }
  return MakeDownpourAlgorithm(env);
}

WorkerAlgorithm::WorkerAlgorithm(const AlgorithmEnv& env) : env_(env), local_(env.options->solver) {
  if (options().worker.push_every > 1) accum_.assign(env_.net->params().size(), 0.0f);
}

void WorkerAlgorithm::Start(int64_t clock, int64_t first_step) {
  clock_ = clock;
  local_updates_ = clock;
  first_step_ = first_step;
}

double NowS() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }

void WorkerAlgorithm::AddToAccumulator() {
  const auto g = env_.net->grads();
  for (size_t i = 0; i < g.size(); ++i) accum_[i] += g[i];
}

void WorkerAlgorithm::LocalUpdate(int concurrent) {
  auto grads = env_.net->grads();
  if (!accum_.empty()) {
    const float inv = 1.0f / static_cast<float>(options().worker.push_every);
    for (size_t i = 0; i < grads.size(); ++i) grads[i] = (accum_[i] + grads[i]) * inv;
    std::fill(accum_.begin(), accum_.end(), 0.0f);
  }
  // An update averages push_every batches, and `concurrent` workers process as many at once.
  local_.Step(env_.net, LocalIteration(local_updates_, options().worker.push_every, concurrent));
  ++local_updates_;
}

ModelExchangeAlgorithm::ModelExchangeAlgorithm(const AlgorithmEnv& env, int every)
    : WorkerAlgorithm(env), every_(every) {
  local_.Reset(env.net->params().size());
}

Status ModelExchangeAlgorithm::PullModel() {
  TraceSpan span(env_.trace, env_.trace_track, "worker", "pull");
  return env_.channel->Pull(clock_, env_.net->params(), &pull_info_);
}

// The worker keeps its own weights: it pulls the model once, to start from it.
Status ModelExchangeAlgorithm::BeforeStep(const StepPlan& plan, StepWaits* waits) {
  if (plan.step != first_step_) return Status::Ok();
  const double t0 = NowS();
  DP_RETURN_IF_ERROR(PullModel());
  waits->pull_ms = 1e3 * (NowS() - t0);
  return Status::Ok();
}

Status ModelExchangeAlgorithm::Finish(const StepPlan& plan, StepWaits* waits) {
  if (!plan.update) {
    AddToAccumulator();
    return Status::Ok();
  }
  LocalUpdate(options().workers);
  if ((plan.step + 1) % every_ == 0 || plan.last) {
    const double t0 = NowS();
    DP_RETURN_IF_ERROR(Exchange());
    waits->push_wait_ms = 1e3 * (NowS() - t0);
  }
  return Status::Ok();
}

}  // namespace downpour::worker
