// local_sgd_algorithm.cc — local SGD with its progress averaged through the servers
// (consistency.algorithm = "local-sgd"; docs/algorithms.md "Local SGD, in detail"): periodic
// model averaging (Zhou & Cong 2018, K-step averaging; Stich 2019; Lin et al. 2020, "Don't use
// large mini-batches, use local SGD"), with the average kept by the parameter servers.
//
// A worker starts from the servers' model x0, takes consistency.local_steps steps of the solver on
// its own copy (its own momentum), then sends its progress divided by the number of workers,
// e = (x − x0) / W, as an elastic exchange (the servers add it to the model), pulls the model back
// and goes on from it (x0 = x = the pull). When the W workers exchange in step, the model moves
// each round by the mean of their progress, which is synchronous local SGD; when they do not,
// each worker's progress is applied on arrival (asynchronous, as Downpour's gradients are). With
// one worker the model follows the worker exactly, which is what a --local run computes.
//
// Its schedule counts its batches × cluster.workers, the run's batches, as in the other modes.
#include "client/worker/trainer.h"
#include "client/worker/worker_algorithm.h"

namespace downpour::worker {
namespace {

class LocalSgdAlgorithm final : public ModelExchangeAlgorithm {
 public:
  explicit LocalSgdAlgorithm(const AlgorithmEnv& env)
      : ModelExchangeAlgorithm(env, env.options->consistency.local_steps),
        share_(1.0f / static_cast<float>(std::max(1, options().workers))),
        start_(env.net->params().size(), 0.0f) {}

 private:
  // The servers' model into the net; the next exchange's progress is measured from it.
  Status PullModel() override {
    DP_RETURN_IF_ERROR(ModelExchangeAlgorithm::PullModel());
    const auto x = env_.net->params();
    std::copy(x.begin(), x.end(), start_.begin());
    return Status::Ok();
  }

  // e = (x − x0) / W to the servers, which add it to the model (acknowledged before the pull
  // that follows it on the same links is served), then the model back.
  Status Exchange() override {
    const auto x = env_.net->params();
    for (size_t i = 0; i < start_.size(); ++i) start_[i] = share_ * (x[i] - start_[i]);
    DP_RETURN_IF_ERROR(env_.channel->PushElastic(clock_, start_, &push_info_));
    ++clock_;
    DP_RETURN_IF_ERROR(env_.channel->Clock(clock_));
    return PullModel();
  }

  const float share_;         // 1 / W: a worker's progress is one W-th of a round's
  std::vector<float> start_;  // x0, the model as last pulled; then the progress sent
};

}  // namespace

std::unique_ptr<WorkerAlgorithm> MakeLocalSgdAlgorithm(const AlgorithmEnv& env) {
  return std::make_unique<LocalSgdAlgorithm>(env);
}

}  // namespace downpour::worker
