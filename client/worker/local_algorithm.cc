// local_algorithm.cc — the single-process reference run (worker_algorithm.h): every update is
// the solver's step on the net's own weights, as a distributed sync run's servers would apply it.
#include "client/worker/factor_choice.h"
#include "client/worker/trainer.h"
#include "client/worker/worker_algorithm.h"

namespace downpour::worker {
namespace {

class LocalAlgorithm final : public WorkerAlgorithm {
 public:
  explicit LocalAlgorithm(const AlgorithmEnv& env) : WorkerAlgorithm(env) {
    local_.Reset(env.net->params().size());
    // Says so when compression.factors is on: there is nothing to push factors to.
    const TrainerOptions& o = options();
    (void)ChooseFactoredTensors(*env.net, *env.layout,
                                FactorChoiceInput{o.compression.factors, o.worker.push_every, o.solver.clip_gradients,
                                                  /*has_servers=*/false, o.worker_id});
  }

  Status BeforeStep(const StepPlan&, StepWaits*) override { return Status::Ok(); }

  Status Finish(const StepPlan& plan, StepWaits*) override {
    if (plan.update) {
      LocalUpdate(/*concurrent=*/1);
    } else {
      AddToAccumulator();
    }
    return Status::Ok();
  }
};

}  // namespace

std::unique_ptr<WorkerAlgorithm> MakeLocalAlgorithm(const AlgorithmEnv& env) {
  return std::make_unique<LocalAlgorithm>(env);
}

}  // namespace downpour::worker
