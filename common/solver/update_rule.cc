// update_rule.cc — see update_rule.h.
#include "common/solver/update_rule.h"

#include "common/solver/adagrad.h"

namespace downpour {

std::unique_ptr<UpdateRule> MakeUpdateRule(const SolverConfig& solver) {
  switch (solver.update) {
    case UpdateRuleKind::kMomentum: return std::make_unique<MomentumRule>();
    case UpdateRuleKind::kAdaGrad: return std::make_unique<AdaGradRule>(solver.adagrad_epsilon, solver.adagrad_initial);
  }
  return std::make_unique<MomentumRule>();
}

}  // namespace downpour
