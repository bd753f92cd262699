// easgd_algorithm.cc — asynchronous EASGD on the worker (Zhang, Choromanska, LeCun 2015;
// docs/algorithms.md): the worker trains its own copy with the solver (the servers' rule, its own
// momentum) and every consistency.easgd_tau steps pulls the center x~, sends e = α(x − x~) (the
// servers add it to x~) and sets x -= e. Its schedule counts its batches × cluster.workers, the
// run's batches, as in the other algorithms.
#include "client/worker/trainer.h"
#include "client/worker/worker_algorithm.h"

namespace downpour::worker {
namespace {

class EasgdAlgorithm final : public ModelExchangeAlgorithm {
 public:
  explicit EasgdAlgorithm(const AlgorithmEnv& env)
      : ModelExchangeAlgorithm(env, env.options->consistency.easgd_tau),
        alpha_(EasgdAlpha(options().consistency, options().workers)),
        center_(env.net->params().size(), 0.0f) {}

 private:
  // Read the center x~, e = α(x − x~); the servers add e to x~ and this worker subtracts it from x.
  Status Exchange() override {
    PullInfo info;
    DP_RETURN_IF_ERROR(env_.channel->Pull(clock_, center_, &info));
    const auto x = env_.net->params();
    for (size_t i = 0; i < center_.size(); ++i) center_[i] = alpha_ * (x[i] - center_[i]);
    DP_RETURN_IF_ERROR(env_.channel->PushElastic(clock_, center_, &push_info_));
    for (size_t i = 0; i < center_.size(); ++i) x[i] -= center_[i];
    ++clock_;
    return env_.channel->Clock(clock_);
  }

  const float alpha_;
  std::vector<float> center_;  // the center as last pulled; then the elastic difference
};

}  // namespace

std::unique_ptr<WorkerAlgorithm> MakeEasgdAlgorithm(const AlgorithmEnv& env) {
  return std::make_unique<EasgdAlgorithm>(env);
}

}  // namespace downpour::worker
