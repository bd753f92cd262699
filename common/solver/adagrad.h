// adagrad.h — AdaGrad (Duchi, Hazan, Singer, JMLR 2011), the rule DistBelief's Downpour SGD ran on
// its parameter servers (Dean et al., NIPS 2012): each weight's learning rate shrinks with the
// squares of its own gradients. Per element, with lr_eff = p.lr × p.lr_mult and the decay of
// SgdUpdate:
//
//   g   = grad × grad_scale + weight_decay × decay_mult × w
//   acc = acc + g²                          (the state; starts at solver.adagrad_initial)
//   w   = w − lr_eff × g / sqrt(acc + epsilon)
//
// p.momentum is not used.
#pragma once

#include <span>

#include "common/solver/update_rule.h"

namespace downpour {

// One AdaGrad update of `w` and its accumulator `acc`, as above.
void AdaGradUpdate(const UpdateParams& p, float epsilon, std::span<const float> grad, std::span<float> w,
                   std::span<float> acc);

class AdaGradRule final : public UpdateRule {
 public:
  AdaGradRule(float epsilon, float initial) : epsilon_(epsilon), initial_(initial) {}
  std::string_view name() const override { return "adagrad"; }
  float initial_state() const override { return initial_; }
  void Apply(const UpdateParams& p, std::span<const float> grad, std::span<float> w,
             std::span<float> state) const override {
    AdaGradUpdate(p, epsilon_, grad, w, state);
  }

 private:
  float epsilon_;
  float initial_;
};

}  // namespace downpour
